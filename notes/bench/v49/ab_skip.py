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
    ended_rows.skip_ended_rows = orig if name == "skip" else (lambda f, gemm, mask="mask": f)
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
ts = {(k, f.__name__): [] for k in mods for f in (inf, train)}
for _ in range(12):
    for k, m in mods.items():
        for f in (inf, train):
            t0 = time.perf_counter(); f(m); ts[(k, f.__name__)].append(time.perf_counter() - t0)
print({f"{k} {f}": round(1e3 * statistics.median(v), 2) for (k, f), v in ts.items()})
