import time, warnings; warnings.simplefilter("ignore")
import numpy as np, torch
import tvmrnn.torch as tt
import tvmrnn.runtime.build as B
torch.manual_seed(0)
x = torch.randn(100, 7, 512)
mods = {}
for pad in (True, False):
    m = tt.LSTM(512, 512)
    if not pad:  # (v67's final code pads in build: tvmrnn.runtime.build.padded_batch)
        B.padded_batch = lambda b, *a: b
    with torch.no_grad(): m(x)
    m(x)[0].sum().backward()
    mods[pad] = m
    B.padded_batch = __import__("tvmrnn.schedules.cpu", fromlist=["x"]).padded_batch
ref = torch.nn.LSTM(512, 512)
ti = {k: [] for k in (True, False, "torch")}; tr = {k: [] for k in ti}
for _ in range(7):
    for k, m in ((True, mods[True]), (False, mods[False]), ("torch", ref)):
        with torch.no_grad():
            t = time.perf_counter(); m(x); ti[k].append(time.perf_counter() - t)
        t = time.perf_counter(); m(x)[0].sum().backward(); tr[k].append(time.perf_counter() - t)
for k in ti:
    print(k, "inference %.2f ms, training %.2f ms" % (np.median(ti[k]) * 1e3, np.median(tr[k]) * 1e3))
print("builds", [list(mods[p]._built) for p in (True, False)])
