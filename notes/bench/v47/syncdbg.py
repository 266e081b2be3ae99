"""Where PyTorch synchronizes with the GPU in a drop-in's packed training step (DS2 sizes)."""
import os, sys, time, traceback, warnings, torch
from torch.nn.utils.rnn import pack_padded_sequence
import tvmrnn.torch as tt
cell = sys.argv[1]
T, N, S = 300, 20, 800
g = torch.Generator().manual_seed(0)
lengths = torch.randint(T // 2, T + 1, (N,), generator=g); lengths[0] = T
ours = getattr(tt, cell.upper())(S, S, bidirectional=True).cuda()
x = torch.randn(T, N, S, generator=g).cuda()
for _ in range(2):
    ours(pack_padded_sequence(x, lengths, enforce_sorted=False))[0].data.sum().backward()
torch.cuda.synchronize()
seen = []
def show(message, category, filename, lineno, file=None, line=None):
    seen.append(f"--- {message}\n" + "".join(traceback.format_stack()[-12:-2]))
warnings.showwarning = show
p = pack_padded_sequence(x, lengths, enforce_sorted=False)
torch.cuda.synchronize()
torch.cuda.set_sync_debug_mode("warn")
out = ours(p)[0].data.sum()
out.backward()
torch.cuda.set_sync_debug_mode("default")
print(f"{cell}: {len(seen)} syncs"); print("\n".join(seen))
# host-side time of a step's calls (the GPU's queue keeps them from blocking: a deep queue)
torch.cuda.synchronize()
for name, run in (("packed", lambda: ours(pack_padded_sequence(x, lengths, enforce_sorted=False))[0].data),
                  ("padded", lambda: ours(x)[0])):
    t0 = time.perf_counter(); y = run(); t1 = time.perf_counter(); y.sum().backward(); t2 = time.perf_counter()
    torch.cuda.synchronize(); t3 = time.perf_counter()
    print(f"{name}: host forward {1e3*(t1-t0):.2f} ms, host backward {1e3*(t2-t1):.2f} ms, until done {1e3*(t3-t0):.2f} ms")
