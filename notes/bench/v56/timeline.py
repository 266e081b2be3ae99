"""Where a short pass's wall time goes on the GPU (v56): each call of ``rnn.forward`` (and of a
training step, forward_train + backward) and of cuDNN, waited for, traced with PyTorch's profiler
(CUPTI sees TVM's launches too). Per call: the wall time, the time from the call to its first
kernel (host work before the GPU starts), the kernels' own time, the GPU's idle gaps between them,
and the time from the last kernel's end to the call's return. Medians over the traced calls, and
one call's kernels in order with their gaps.

    python notes/bench/v56/timeline.py lstm 128 96 100 [--train]
"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import warnings

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import tvmrnn


def calls(trace, prefix):
    events = trace["traceEvents"]
    marks = sorted((e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(prefix)),
                   key=lambda e: e["ts"])
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out = []
    for m in marks:
        t0, t1 = m["ts"], m["ts"] + m["dur"]
        ks = [k for k in kernels if t0 <= k["ts"] < t1]
        if not ks:
            continue
        busy = sum(k["dur"] for k in ks)
        span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
        out.append(dict(wall=m["dur"], before=ks[0]["ts"] - t0, kernels=busy, gaps=span - busy,
                        after=t1 - (ks[-1]["ts"] + ks[-1]["dur"]), n=len(ks), list=ks, t0=t0))
    return out


def summary(name, cs):
    med = {k: statistics.median(c[k] for c in cs) for k in ("wall", "before", "kernels", "gaps", "after", "n")}
    print(f"{name:10s} wall {med['wall']:7.1f} us = before first kernel {med['before']:6.1f} + kernels "
          f"{med['kernels']:7.1f} ({med['n']:.0f}) + gaps {med['gaps']:6.1f} + after {med['after']:5.1f}")
    c = cs[len(cs) // 2]
    prev = None
    for k in c["list"]:
        gap = k["ts"] - (prev if prev is not None else c["t0"])
        print(f"    +{gap:6.1f}  {k['dur']:7.1f} us  {k['name'][:90]}")
        prev = k["ts"] + k["dur"]


def main(cell, n, h, T, *flags):
    warnings.simplefilter("ignore")
    n, h, T = int(n), int(h), int(T)
    train = "--train" in flags
    ref = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(h, h).cuda()
    rnn = tvmrnn.build(cell, input_size=h, hidden_size=h, batch_size=n, target="cuda", tuning_logs=False, cache=False)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = torch.randn(T, n, h, device="cuda")
    dy = torch.randn(T, n, h, device="cuda")
    sync = torch.cuda.synchronize
    xr = x.clone().requires_grad_(True)

    def ours():
        if train:
            y, hy, cy, ws = rnn.forward_train(w, x)
            rnn.backward(w, ws, dy)
        else:
            rnn.forward(w, x)

    def theirs():
        if train:
            ref.zero_grad(set_to_none=True)
            xr.grad = None
            ref(xr)[0].backward(dy)
        else:
            ref(x)

    ctx = torch.enable_grad() if train else torch.no_grad()
    with ctx:
        for _ in range(5):
            ours(); sync(); theirs(); sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(15):
                with record_function(f"ours{i}"):
                    ours(); sync()
                with record_function(f"cudnn{i}"):
                    theirs(); sync()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        trace = json.load(open(f.name))
    print(f"== {cell} N={n} H={h} T={T} {'training' if train else 'inference'}")
    summary("tvmrnn", calls(trace, "ours"))
    summary("cuDNN", calls(trace, "cudnn"))


if __name__ == "__main__":
    main(*sys.argv[1:])
