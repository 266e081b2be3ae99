"""v79: backward GEMM kernels alone under cpu.CPU_GUARDED_TILE_VECTORS values, interleaved (vm_guarded_wide_tiles.txt).
    [TARGET=json] python guarded_vectors_ab.py cell N I H 1,2[,3] [kernel prefixes, comma-separated]
"""
import sys, statistics, numpy as np, tvmrnn
from tvmrnn.schedules import cpu, default_schedule
from tvmrnn.runtime import profile
from tvmrnn import kernels
cell,N,I,H = sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4])
vs = [int(x) for x in sys.argv[5].split(",")]
prefixes = tuple(sys.argv[6].split(",")) if len(sys.argv) > 6 else ("weight_gradient", "input_gradient")
timers = {}
ref = {}
for v in vs:
    cpu.CPU_GUARDED_TILE_VECTORS = v
    import os, json; tgt = json.loads(os.environ["TARGET"]) if "TARGET" in os.environ else None
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, cache=False, target=tgt)
    prog = rnn.programs["backward"]
    for name, calls in prog.calls(100).items():
        if name.startswith(prefixes) and calls:
            timer, args = profile.kernel_timer(prog.scheduled(name), rnn.target, 10, 1)
            timers[(name, v)] = (timer, args, calls)
names = sorted({n for n, _ in timers})
res = {k: [] for k in timers}
for r in range(7):
    for n in names:
        for v in vs:
            timer, args, _ = timers[(n, v)]
            res[(n, v)].append(1e6 * statistics.median(timer(*args).results))
for n in names:
    print(f"{n:48s} x{timers[(n, vs[0])][2]:3d}", "  ".join(f"V{v} {statistics.median(res[(n, v)]):7.0f}" for v in vs), flush=True)
