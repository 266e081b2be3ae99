# simulate an AVX2-only host (a Zen 3): /proc/cpuinfo's flags without AVX-512
import tvmrnn.device as _d
_orig = _d._cpu_flags
_d._cpu_flags = lambda: {f for f in _orig() if not f.startswith("avx512")}
