import os, sys, time, statistics, torch, tvmrnn, tvmrnn.torch as tt
from tvmrnn.runtime import threads
cell = sys.argv[1]; T, N, I, H = (int(v) for v in sys.argv[2:6])
Cls = {"lstm": tt.LSTM, "gru": tt.GRU}[cell]
torch.manual_seed(0)
m = Cls(I, H)
x = torch.randn(T, N, I)
for _ in range(2): m(x)[0].sum().backward()
# a PyTorch model around it: a linear head and a loss, as training has
head = torch.nn.Linear(H, 32)
ts = {"train": [], "nograd": []}
for _ in range(12):
    for q in list(m.parameters()) + list(head.parameters()): q.grad = None
    t0 = time.perf_counter(); y = head(m(x)[0]); torch.nn.functional.log_softmax(y, -1).mean().backward(); ts["train"].append(time.perf_counter() - t0)
    with torch.no_grad():
        t0 = time.perf_counter(); head(m(x)[0]); ts["nograd"].append(time.perf_counter() - t0)
print(os.environ.get("TVMRNN_THREAD_POOL"), threads.pool(), cell, T, N, I, H, {k: round(statistics.median(v) * 1e3, 2) for k, v in ts.items()}, flush=True)
