import time, statistics, numpy as np, torch, tvmrnn, tvmrnn.torch as tt
torch.manual_seed(0)
m = tt.LSTM(512, 512)
x = torch.randn(50, 20, 512)
m(x)[0].sum().backward()
rnn = next(iter(m._built.values()))
p = {k: v.detach() for k, v in m.named_parameters()}
dy = torch.ones(50, 20, 512)
ts = {"drop-in step": [], "direct step": []}
for _ in range(15):
    for q in m.parameters(): q.grad = None
    t0 = time.perf_counter(); m(x)[0].sum().backward(); ts["drop-in step"].append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    w = rnn.pack_weights(p); y, hy, cy, ws = rnn.forward_train(w, x); g = rnn.backward(w, ws, dy)
    ts["direct step"].append(time.perf_counter() - t0)
print({k: round(statistics.median(v) * 1e3, 2) for k, v in ts.items()})
import cProfile, pstats
pr = cProfile.Profile(); pr.enable()
for _ in range(10):
    for q in m.parameters(): q.grad = None
    m(x)[0].sum().backward()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(10)
