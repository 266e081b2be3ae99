# v67: LSTM T=100 I=H=512, a batch of N rows (argv 1) on a build of N and of M rows (argv 2), padded_batch bypassed; medians of 7 interleaved
import sys, time, warnings; warnings.simplefilter("ignore")
import numpy as np, tvmrnn, torch
from tvmrnn.schedules import cpu
T, H = 100, 512
n, m = int(sys.argv[1]), int(sys.argv[2])
cpu.padded_batch = lambda b, *a: b   # build exactly what is asked
import tvmrnn.runtime.build as B; B.padded_batch = cpu.padded_batch
bn = tvmrnn.build("lstm", H, H, batch_size=n, cache=False)
bm = tvmrnn.build("lstm", H, H, batch_size=m, cache=False)
print("rows", bn.config.rows, bm.config.rows)
rng = np.random.default_rng(0)
params = {k: rng.standard_normal(v.shape).astype(np.float32) * 0.05 for k, v in tvmrnn.params_from_torch(torch.nn.LSTM(H, H)).items()}
wn, wm = bn.pack_weights(params), bm.pack_weights(params)
x = rng.standard_normal((T, n, H)).astype(np.float32)
ts = {n: [], m: []}; tt = {n: [], m: []}
for _ in range(7):
    for k, (b, w) in ((n, (bn, wn)), (m, (bm, wm))):
        t = time.perf_counter(); b.forward(w, x); ts[k].append(time.perf_counter() - t)
        t = time.perf_counter(); y, hy, cy, ws = b.forward_train(w, x); b.backward(w, ws, np.ones_like(y)); tt[k].append(time.perf_counter() - t)
for k in (n, m):
    print(f"build {k}, {n} rows: inference {np.median(ts[k])*1e3:.2f} ms, training {np.median(tt[k])*1e3:.2f} ms")
