"""The CPU all-steps GEMMs alone with cpu_gemm's register tile down the fused (steps x rows) axes
against down the batch rows alone (cpu.CPU_FUSED_ROW_TILES), on this host (v66).

    python notes/bench/v66/fused_rows_study.py [N K H G T]   (default: 1 512 512 4 16)
"""
import sys
import warnings

from tvmrnn import kernels
from tvmrnn.device import host_target
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.schedules import cpu, default_schedule

warnings.simplefilter("ignore")
N, K, H, G, T = (int(a) for a in sys.argv[1:6]) if len(sys.argv) > 5 else (1, 512, 512, 4, 16)
target = host_target()
flops = 2 * T * N * K * H * G
print(f"{target}  T={T} N={N} K={K} H={H} G={G}")
for kernel in (kernels.input_projection(T, N, K, H, G, panel=16),
               kernels.input_gradient(T, N, K, H, G, accumulate=False, panel=64)):
    times = {}
    for _ in range(2):  # interleaved rounds
        for fused in (False, True):
            cpu.CPU_FUSED_ROW_TILES = fused
            times.setdefault(fused, []).append(time_kernel(default_schedule(kernel, target), target, number=20, repeat=7))
    for fused, ts in times.items():
        us = min(ts)
        print(f"{kernel.name:45s} {'fused rows' if fused else 'last axis':10s} {us:9.1f} us {flops / us / 1e3:6.1f} GFLOP/s "
              f"(rounds: {', '.join(f'{t:.1f}' for t in ts)})", flush=True)
