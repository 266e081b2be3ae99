import time, statistics, torch, tvmrnn.torch as tt
from torch.nn.utils.rnn import pack_padded_sequence
torch.manual_seed(0)
T, N, I, H = 100, 20, 256, 256
cell = __import__("sys").argv[1]
m = {"lstm": tt.LSTM, "gru": tt.GRU}[cell](I, H, bidirectional=True)
x = torch.randn(T, N, I)
g = torch.Generator().manual_seed(0)
lengths = torch.randint(T // 2, T + 1, (N,), generator=g)
def packed():
    p = pack_padded_sequence(x, lengths, enforce_sorted=False)
    out = m(p)[0]; out.data.sum().backward()
def padded():
    m(x)[0].sum().backward()
for _ in range(2): packed(); padded()
from torch.profiler import profile, ProfilerActivity
ts = {"packed": [], "padded": []}
for _ in range(6):
    for name, f in (("packed", packed), ("padded", padded)):
        t0 = time.perf_counter(); f(); ts[name].append(time.perf_counter() - t0)
print({k: round(statistics.median(v) * 1e3, 2) for k, v in ts.items()})
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3): packed()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3): padded()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))
