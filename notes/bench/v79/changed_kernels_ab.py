"""v79: every kernel whose schedule CPU_GUARDED_TILE_VECTORS 1 -> 2 changes, timed alone, interleaved: python changed_kernels_ab.py cell N I H"""
import sys, statistics, tvmrnn
from tvmrnn.schedules import cpu
from tvmrnn.runtime import profile
cell,N,I,H = sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4])
scripts, timers = {}, {}
for v in (1, 2):
    cpu.CPU_GUARDED_TILE_VECTORS = v
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, cache=False, tuning_logs=False)
    for p in ("forward", "backward"):
        prog = rnn.programs[p]
        for name, calls in prog.calls(100).items():
            if calls:
                f = prog.scheduled(name)
                scripts.setdefault(name, {})[v] = (f, calls, rnn.target)
changed = {n: d for n, d in scripts.items() if len(d) == 2 and d[1][0].script() != d[2][0].script()}
for n, d in changed.items():
    for v in (1, 2):
        timers[(n, v)] = profile.kernel_timer(d[v][0], d[v][2], 10, 1)
res = {k: [] for k in timers}
for r in range(7):
    for k, (t, a) in timers.items():
        res[k].append(1e6 * statistics.median(t(*a).results))
for n, d in changed.items():
    a, b = statistics.median(res[(n, 1)]), statistics.median(res[(n, 2)])
    print(f"{n:48s} x{d[1][1]:3d} V1 {a:8.1f} V2 {b:8.1f} {'+' if b > a * 1.03 else ''}", flush=True)
