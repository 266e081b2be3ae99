"""v79 (during the change; the ONEVEC switch it read is gone): one-vector tiles widened, old against new: python one_vector_ab.py cell N I H"""
import sys, os, statistics, tvmrnn
from tvmrnn.runtime import profile
cell,N,I,H = sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),int(sys.argv[4])
timers = {}
for v in ("", "1"):
    if v: os.environ["ONEVEC"] = v
    else: os.environ.pop("ONEVEC", None)
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, cache=False, tuning_logs=False)
    prog = rnn.programs["backward"]
    for name, calls in prog.calls(100).items():
        if name.startswith(("weight_gradient", "input_gradient")) and calls and "_t16" in name:
            timers[(name, v)] = profile.kernel_timer(prog.scheduled(name), rnn.target, 10, 1) + (calls,)
res = {k: [] for k in timers}
for r in range(7):
    for k, (t, a, c) in timers.items():
        res[k].append(1e6 * statistics.median(t(*a).results))
for n in sorted({n for n, _ in timers}):
    print(f"{n:48s} x{timers[(n,'')][2]:3d} old {statistics.median(res[(n,'')]):7.0f} new {statistics.median(res[(n,'1')]):7.0f}", flush=True)
