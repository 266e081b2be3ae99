"""v51: the masked CPU backward steps' skip of ended rows (gemm_mask) on and off, the forward's
skip on in both; drop-ins on a PackedSequence, bidirectional, I=H=256, T=100, lengths in
[T/2, T], 12 interleaved rounds, medians (ms). python3 ab_backward_skip.py lstm|gru N

Ran at commit 5bdc5e4 (the dev VM, 2 cores; the skip was reverted after it, see notes v51):
  lstm N=64: skip inf 57.34, train 182.08; noskip inf 58.83, train 183.56 (outputs, gradients equal)
  gru  N=64: skip inf 48.05, train 168.14; noskip inf 47.94, train 168.34
  lstm N=20: skip inf 20.67, train 60.72;  noskip inf 20.47, train 61.00
"""
import time, statistics, sys, torch, tvmrnn
from tvmrnn.schedules import ended_rows
import tvmrnn.torch as tt
from torch.nn.utils.rnn import pack_padded_sequence
torch.manual_seed(0)
cell = sys.argv[1]; T, N, I, H = 100, int(sys.argv[2]), 256, 256
x = torch.randn(T, N, I)
g = torch.Generator().manual_seed(0)
lengths = torch.randint(T // 2, T + 1, (N,), generator=g)
mods = {}
orig = ended_rows.skip_ended_rows
for name in ("skip", "noskip"):
    # "noskip": the forward steps' skip as before, the backward steps' (gemm_mask, v51) off
    ended_rows.skip_ended_rows = orig if name == "skip" else (
        lambda f, gemm, mask="mask": f if mask == "gemm_mask" else orig(f, gemm, mask))
    m = {"lstm": tt.LSTM, "gru": tt.GRU}[cell](I, H, bidirectional=True)
    torch.manual_seed(1); [p.data.uniform_(-0.06, 0.06) for p in m.parameters()]
    p = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.no_grad(): m(p)
    m(p)[0].data.sum().backward()
    mods[name] = m
ended_rows.skip_ended_rows = orig
def inf(m): 
    with torch.no_grad(): return m(pack_padded_sequence(x, lengths, enforce_sorted=False))[0].data
def train(m):
    out = m(pack_padded_sequence(x, lengths, enforce_sorted=False))[0]; out.data.sum().backward(); return out.data
a, b = inf(mods["skip"]), inf(mods["noskip"])
print("inference outputs equal:", torch.equal(a, b))
for m in mods.values():
    m.zero_grad(); train(m)
print("gradients equal:", all(torch.equal(p.grad, q.grad) for p, q in zip(mods["skip"].parameters(),
                                                                        mods["noskip"].parameters())))
ts = {(k, f.__name__): [] for k in mods for f in (inf, train)}
for _ in range(12):
    for k, m in mods.items():
        for f in (inf, train):
            t0 = time.perf_counter(); f(m); ts[(k, f.__name__)].append(time.perf_counter() - t0)
print({f"{k} {f}": round(1e3 * statistics.median(v), 2) for (k, f), v in ts.items()})
