"""A/B in one process: the CPU backward with the weight gradients' inputs in row panels (A) or not (B)."""
import sys, time, numpy as np, torch, tvmrnn
from tvmrnn.program import passes
cell, T, N, I, H = sys.argv[1], *[int(v) for v in sys.argv[2:6]]
real = passes.input_panel
rnns = {}
for name, fn in (("A panels", real), ("B rows", lambda *a: 0)):
    passes.input_panel = fn
    rnns[name] = tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, cache=False)
passes.input_panel = real
ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H)
params = {n: p.detach().numpy() for n, p in ref.named_parameters()}
x = np.random.default_rng(0).standard_normal((T, N, I), dtype=np.float32)
dy = np.random.default_rng(1).standard_normal((T, N, H), dtype=np.float32)
ws = {k: r.pack_weights(params) for k, r in rnns.items()}
times = {k: [] for k in rnns}
grads = {}
for rep in range(7):
    for k, r in rnns.items():
        out = r.forward_train(ws[k], x)
        t0 = time.perf_counter(); g = r.backward(ws[k], out[-1], dy); times[k].append(time.perf_counter() - t0)
        grads[k] = g
for k in rnns:
    print(f"{cell} T={T} N={N} I={I} H={H} {k}: backward median {np.median(times[k][1:]) * 1e3:.1f} ms")
a, b = grads["A panels"], grads["B rows"]
print("max diff", max(float(np.abs(np.asarray(a[n]) - np.asarray(b[n])).max()) for n in params))
