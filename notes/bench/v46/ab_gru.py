"""A/B in one process: the GRU's backward in rows (B) or with both gradient packs and input panels (A)."""
import sys, time, numpy as np, torch, tvmrnn
from tvmrnn.program import passes
T, N, I, H = [int(v) for v in sys.argv[1:5]]
real = passes.input_panel
rnns = {}
for name, two, fn in (("A panels", True, real), ("B rows", False, real), ("C dg panels only", True, lambda *a: 0)):
    passes.TWO_GRADIENT_PACKS_MIN_UNITS = 1 if two else 10**9; passes.input_panel = fn
    rnns[name] = tvmrnn.build("gru", input_size=I, hidden_size=H, batch_size=N, cache=False)
passes.TWO_GRADIENT_PACKS_MIN_UNITS = 512; passes.input_panel = real
ref = torch.nn.GRU(I, H)
params = {n: p.detach().numpy() for n, p in ref.named_parameters()}
x = np.random.default_rng(0).standard_normal((T, N, I), dtype=np.float32)
dy = np.random.default_rng(1).standard_normal((T, N, H), dtype=np.float32)
ws = {k: r.pack_weights(params) for k, r in rnns.items()}
times = {k: [] for k in rnns}
grads = {}
for rep in range(int(__import__("os").environ.get("REPS", "7"))):
    for k, r in rnns.items():
        out = r.forward_train(ws[k], x)
        t0 = time.perf_counter(); g = r.backward(ws[k], out[-1], dy); times[k].append(time.perf_counter() - t0)
        grads[k] = g
for k in rnns:
    print(f"gru T={T} N={N} I={I} H={H} {k}: backward median {np.median(times[k][1:]) * 1e3:.1f} ms", [k2 for k2 in rnns[k].programs["backward"].kernels if k2.startswith("weight_grad")][:1])
a, b = grads["A panels"], grads["B rows"]
print("max diff", max(float(np.abs(np.asarray(a[n]) - np.asarray(b[n])).max()) for n in params))
