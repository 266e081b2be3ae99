import time, warnings; warnings.simplefilter("ignore")
import numpy as np, tvmrnn
T, H = 100, 512
b7 = tvmrnn.build("lstm", H, H, batch_size=7, cache=False)
b8 = tvmrnn.build("lstm", H, H, batch_size=8, cache=False)
rng = np.random.default_rng(0)
params = {k: rng.standard_normal(v.shape).astype(np.float32) * 0.05 for k, v in tvmrnn.params_from_torch(__import__("torch").nn.LSTM(H, H)).items()}
w7, w8 = b7.pack_weights(params), b8.pack_weights(params)
x = rng.standard_normal((T, 7, H)).astype(np.float32)
y7 = b7.forward(w7, x)[0]; y8 = b8.forward(w8, x)[0]
print("agree", float(np.abs(y7 - y8).max()))
ts = {7: [], 8: []}; tt = {7: [], 8: []}
for _ in range(7):
    for n, (b, w) in ((7, (b7, w7)), (8, (b8, w8))):
        t = time.perf_counter(); b.forward(w, x); ts[n].append(time.perf_counter() - t)
        t = time.perf_counter(); y, hy, cy, ws = b.forward_train(w, x); b.backward(w, ws, np.ones_like(y)); tt[n].append(time.perf_counter() - t)
for n in (7, 8):
    print(f"build {n}, 7 rows: inference {np.median(ts[n])*1e3:.2f} ms, training {np.median(tt[n])*1e3:.2f} ms")
