"""Drop-in against torch.nn in one process, interleaved, same inputs: a training step of RNN + linear head + loss, and no_grad."""
import os, sys, time, statistics, torch, tvmrnn.torch as tt
from tvmrnn.runtime import threads
cell = sys.argv[1]; T, N, I, H = (int(v) for v in sys.argv[2:6]); reps = int(sys.argv[6]) if len(sys.argv) > 6 else 10
torch.manual_seed(0)
ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H)
ours = {"lstm": tt.LSTM, "gru": tt.GRU}[cell](I, H); ours.load_state_dict(ref.state_dict())
head = torch.nn.Linear(H, 32)
x = torch.randn(T, N, I)
def step(m):
    for q in list(m.parameters()) + list(head.parameters()): q.grad = None
    loss = torch.nn.functional.log_softmax(head(m(x)[0]), -1).mean(); loss.backward(); return loss
for _ in range(2): step(ref), step(ours)
la, lb = step(ref), step(ours)
ga = torch.cat([p.grad.flatten() for p in ref.parameters()]); gb = torch.cat([p.grad.flatten() for p in ours.parameters()])
ts = {k: [] for k in ("torch train", "tvmrnn train", "torch nograd", "tvmrnn nograd")}
for _ in range(reps):
    for name, m in (("torch", ref), ("tvmrnn", ours)):
        t0 = time.perf_counter(); step(m); ts[name + " train"].append(time.perf_counter() - t0)
    for name, m in (("torch", ref), ("tvmrnn", ours)):
        with torch.no_grad():
            t0 = time.perf_counter(); m(x); ts[name + " nograd"].append(time.perf_counter() - t0)
med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
print(f"{threads.pool():6s} {cell} T={T} N={N} I={I} H={H} threads={torch.get_num_threads()} "
      + " ".join(f"{k}={v:.2f}" for k, v in med.items())
      + f" | train {med['torch train'] / med['tvmrnn train']:.2f}x nograd {med['torch nograd'] / med['tvmrnn nograd']:.2f}x"
      + f" | loss diff {abs(la.item() - lb.item()):.1e} grad rel {((ga - gb).norm() / ga.norm()).item():.1e}", flush=True)
