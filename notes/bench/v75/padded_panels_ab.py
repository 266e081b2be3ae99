"""v75: A/B of cpu.CPU_PADDED_PANELS: builds with it off and on in one
process (the panels differ, so do the kernels' names), calls interleaved, medians (ms), the max
difference of their gradients.

    TVMRNN_CACHE=off python notes/bench/v75/padded_panels_ab.py lstm T N I H LAYERS [reps]
"""
import statistics, sys, time, warnings
import numpy as np, torch
import tvmrnn
from tvmrnn.schedules import cpu

warnings.simplefilter("ignore")
cell = sys.argv[1]; T, N, I, H, L = map(int, sys.argv[2:7]); reps = int(sys.argv[7]) if len(sys.argv) > 7 else 7
torch.manual_seed(0)
module = getattr(torch.nn, cell.upper())(I, H, L)
params = tvmrnn.params_from_torch(module)
rng = np.random.default_rng(0)
x = rng.standard_normal((T, N, I)).astype(np.float32); dy = rng.standard_normal((T, N, H)).astype(np.float32)
runs = {}
for name, v in (("off", False), ("pad", True)):
    cpu.CPU_PADDED_PANELS = v
    rnn = tvmrnn.build(cell, I, H, num_layers=L, batch_size=N, cache=False)
    w = rnn.pack_weights(params); st = {}
    def fwd(rnn=rnn, w=w, st=st): st["y"] = np.asarray(rnn.forward(w, x)[0])
    def train(rnn=rnn, w=w, st=st):
        ws = rnn.forward_train(w, x)[-1]; st["g"] = rnn.backward(w, ws, dy)
    runs[name] = ([fwd, train], st, rnn)
cpu.CPU_PADDED_PANELS = True
times = {k: [[], []] for k in runs}
for _ in range(reps):
    for k, (fs, _, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter(); f(); times[k][i].append(time.perf_counter() - t0)
with torch.no_grad(): ref = module(torch.from_numpy(x))[0].numpy()
for k, (fs, st, rnn) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    print(f"{cell} T={T} N={N} I={I} H={H} L={L} {k:5s} inference {m[0]:8.2f} training {m[1]:8.2f} ms  err {np.abs(st['y']-ref).max():.1e}", flush=True)
a, b = runs["off"][1]["g"], runs["pad"][1]["g"]
print("  max grad diff off vs wide", max(float(np.abs(np.asarray(a[n]) - np.asarray(b[n])).max()) for n in a))
