"""v88: the TIR of every function of several builds' modules (no compile), hashed, with the default
schedules applied in place (v88) or each fallible one on a copy replayed (before): the same?

    python notes/bench/v88/sched_same.py old|new OUT.json
"""
import contextvars
import hashlib
import json
import sys
import time

import tvmrnn
import tvmrnn.schedules as S
from tvmrnn.cells import examples
from tvmrnn.runtime import build as B

if sys.argv[1] == "old":
    S._IN_PLACE = contextvars.ContextVar("unused", default=False)  # common._copy_applied never sees it set
H100, A100 = "nvidia/nvidia-h100", "nvidia/nvidia-a100"
AVX2 = {"kind": "llvm", "mcpu": "haswell", "num-cores": 4}
SPR = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16}
cases = [
    ("lstm", 13, 37, 2, True, 3, {}, None),
    ("gru", 800, 800, 1, True, 20, {}, H100),
    ("lstm", 800, 800, 2, True, 20, {}, H100),
    ("lstm", 256, 510, 1, False, 256, {}, H100),
    ("gru", 126, 126, 3, False, 32, {}, H100),
    ("lstm", 1024, 1024, 1, False, 1, {}, A100),
    ("rnn_relu", 33, 65, 2, True, 7, {"variable_lengths": True}, H100),
    ("lstm", 354, 354, 1, False, 13, {}, None),
    ("gru", 161, 247, 2, True, 20, {"variable_lengths": True}, AVX2),
    ("lstm", 800, 800, 1, False, 20, {"dtype": "bfloat16"}, SPR),
    ("peephole_lstm", 13, 37, 2, False, 4, {}, None),
    ("lstm", 161, 423, 1, False, 24, {}, SPR),
]
out = {}
t0 = time.perf_counter()
for cell, I, H, L, bi, N, opts, target in cases:
    c = examples.EXAMPLES.get(cell, cell)
    captured = {}
    orig = B.compile_module

    def fake(module, target, _c=captured):
        _c["m"] = module
        raise KeyboardInterrupt
    B.compile_module = fake
    try:
        tvmrnn.build(c, I, H, num_layers=L, bidirectional=bi, batch_size=N, target=target,
                     options=tvmrnn.BuildOptions(**opts), cache=False, tuning_logs=False)
    except KeyboardInterrupt:
        pass
    B.compile_module = orig
    for gv, f in captured["m"].functions.items():
        out[f"{cell}/{I}/{H}/{L}/{bi}/{N}/{opts}/{target}/{gv.name_hint}"] = hashlib.sha1(f.script().encode()).hexdigest()[:12]
json.dump(out, open(sys.argv[2], "w"), indent=1, sort_keys=True)
print(len(out), "functions", f"{time.perf_counter() - t0:.1f} s")
