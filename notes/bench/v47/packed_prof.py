"""Kernel-time breakdown of a drop-in training step: packed vs padded (torch.profiler, CUPTI)."""
import os, sys, time, torch
from torch.nn.utils.rnn import pack_padded_sequence
import tvmrnn.torch as tt
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
cell = sys.argv[1] if len(sys.argv) > 1 else "lstm"
T, N, S = 300, 20, 800
dev = torch.device("cuda")
g = torch.Generator().manual_seed(0)
lengths = torch.randint(T // 2, T + 1, (N,), generator=g); lengths[0] = T
torch.manual_seed(0)
ours = getattr(tt, cell.upper())(S, S, bidirectional=True).to(dev)
x = torch.randn(T, N, S, generator=g).to(dev)
packed = lambda: pack_padded_sequence(x, lengths, enforce_sorted=False)
sides = {"packed": lambda: ours(packed())[0].data, "padded": lambda: ours(x)[0]}
for name, run in sides.items():
    for _ in range(3):
        run().sum().backward()
torch.cuda.synchronize()
out = os.environ.get("OUT", "/tmp")
for name, run in sides.items():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            run().sum().backward()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40, max_name_column_width=90)
    print(f"==== {cell} {name}\n{table}", flush=True)
    ts = []
    for _ in range(10):
        torch.cuda.synchronize(); t0 = time.perf_counter(); run().sum().backward(); torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    print(f"{cell} {name}: median {sorted(ts)[5]*1e3:.2f} ms", flush=True)
    fw = []
    with torch.no_grad():
        for _ in range(10):
            torch.cuda.synchronize(); t0 = time.perf_counter(); run(); torch.cuda.synchronize()
            fw.append(time.perf_counter() - t0)
    print(f"{cell} {name} forward no_grad: median {sorted(fw)[5]*1e3:.2f} ms", flush=True)
