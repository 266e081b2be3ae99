#!/usr/bin/env python3
"""Where a GPU pass's time goes between kernels: launches, gaps, and CUDA graphs, both sides.

    python scripts/launch_study.py lstm gru --reps 20
    python scripts/launch_study.py lstm --num-layers 5 --bidirectional --reps 5

For each cell at Deep Speech 2 sizes (T=300, N=20, I=H=800) by default, with the same weights and
input on both sides, tvmrnn and cuDNN (PyTorch, TF32 off), inference and training (forward +
backward with the same output gradient):

- ``call``: the public call timed as the bench does (``perf_counter`` around the call and a sync);
- ``events``: CUDA events around the same call (GPU time from the first launch to the last kernel);
- ``trace``: one call under ``torch.profiler`` (CUPTI sees TVM's launches too): kernels, the sum
  of their durations, the GPU's idle time between them (median and total), and the host's time per
  launch call;
- ``graph``: the call captured once into a CUDA graph (``torch.cuda.graph``) and replayed, checked
  against the plain call's results.

Needs a CUDA GPU.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def timed_call(torch, fn, reps):
    fn()
    torch.cuda.synchronize()
    wall, gpu = [], []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        wall.append(1e3 * (time.perf_counter() - t0))
        gpu.append(a.elapsed_time(b))
    return med(wall), med(gpu)


def trace(torch, fn):
    """Kernels of one call: count, busy ms, idle gaps (us), host us per launch API call."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels, launches = [], []
    for e in prof.events():
        dev = str(getattr(e, "device_type", ""))
        if dev.endswith("CUDA") and "memcpy" not in e.name.lower() and "memset" not in e.name.lower():
            kernels.append((e.time_range.start, e.time_range.end, e.name))
        elif "LaunchKernel" in e.name:
            launches.append(e.time_range.end - e.time_range.start)
    kernels.sort()
    gaps = [max(0.0, b[0] - a[1]) for a, b in zip(kernels, kernels[1:])]
    busy = sum(e - s for s, e, _ in kernels)
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    return dict(kernels=len(kernels), busy_ms=busy / 1e3, span_ms=span / 1e3, gap_med_us=med(gaps),
                gap_total_ms=sum(gaps) / 1e3, launch_calls=len(launches), launch_host_us=med(launches))


def graphed(torch, fn, outputs_of):
    """Capture ``fn`` into a CUDA graph; returns (replay, outputs of the captured call)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = outputs_of(fn())
    torch.cuda.synchronize()
    return g.replay, out


def flat(out):
    import torch
    if isinstance(out, dict):
        return [v for k, v in sorted(out.items()) if isinstance(v, torch.Tensor)]
    if isinstance(out, (tuple, list)):
        return [v for v in out if isinstance(v, torch.Tensor)]
    return [out]


def rel(torch, a, b):
    num = sum(float((x.double() - y.double()).norm() ** 2) for x, y in zip(a, b)) ** 0.5
    den = sum(float(y.double().norm() ** 2) for y in b) ** 0.5
    return num / max(den, 1e-30)


def study(a, cell, torch, tvmrnn):
    from bench import torch_rnn
    T, N, H = a.T, a.N, a.hidden_size
    L, bidir = a.num_layers, a.bidirectional
    dev = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    ref = torch_rnn(cell, H, H, L, bidir).to(dev)
    t0 = time.perf_counter()
    rnn = tvmrnn.build(cell, input_size=H, hidden_size=H, num_layers=L, bidirectional=bidir, batch_size=N,
                       target="cuda")
    print(f"{cell} L={L} {'bidir' if bidir else 'uni'}: built in {time.perf_counter() - t0:.0f} s", flush=True)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = torch.randn(T, N, H, device=dev)
    dy = torch.randn(T, N, H * (2 if bidir else 1), device=dev)
    xr = x.clone().requires_grad_(True)
    params = list(ref.parameters())

    def ours_train():
        ws = rnn.forward_train(w, x)[3]
        return rnn.backward(w, ws, dy)

    def theirs_train():
        y = ref(xr)[0]
        return torch.autograd.grad(y, [xr] + params, dy)

    sides = {
        ("tvmrnn", "inference"): (lambda: rnn.forward(w, x), lambda o: flat(o)[:1]),
        ("cuDNN", "inference"): (lambda: ref(x), lambda o: flat(o)[:1]),
        ("tvmrnn", "training"): (ours_train, lambda o: [o["x"]]),
        ("cuDNN", "training"): (theirs_train, lambda o: [o[0]]),
    }
    # the bare module with TVM arrays on TVM's own stream, as tvmrnn.runtime.profile times a pass
    import tvm
    from tvmrnn.runtime.profile import _random_tensors
    for program in ("forward", "forward_train"):
        args = _random_tensors(rnn.shapes(program, T).values(), tvm.cuda(0))
        f = rnn.module[program]
        wall, gpu = timed_call(torch, lambda: f(*args), a.reps)
        print(f"  tvmrnn {program:13s} bare module call {wall:8.3f} ms (events {gpu:8.3f})", flush=True)
    rows = []
    for (side, pass_), (fn, pick) in sides.items():
        ctx = torch.no_grad() if pass_ == "inference" else torch.enable_grad()
        with ctx:
            plain = [t.clone() for t in pick(fn())]
            wall, gpu = timed_call(torch, fn, a.reps)
            tr = trace(torch, fn)
            try:
                replay, out = graphed(torch, fn, pick)
                g_wall, g_gpu = timed_call(torch, replay, a.reps)
                g_err = rel(torch, out, plain)
                graph = f"graph {g_wall:8.3f} ms (events {g_gpu:8.3f}), rel diff {g_err:.1e}"
            except Exception as e:  # noqa: BLE001 - report, keep going
                g_wall = g_gpu = g_err = None
                graph = f"graph failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                torch.cuda.synchronize()
        row = dict(cell=cell, L=L, bidir=bidir, side=side, pass_=pass_, call_ms=wall, events_ms=gpu,
                   graph_ms=g_wall, graph_events_ms=g_gpu, graph_rel_diff=g_err, **tr)
        rows.append(row)
        print(f"  {side:6s} {pass_:9s} call {wall:8.3f} ms (events {gpu:8.3f}); {tr['kernels']:5d} kernels, "
              f"busy {tr['busy_ms']:7.3f} ms of span {tr['span_ms']:7.3f}, gap median {tr['gap_med_us']:5.2f} us "
              f"total {tr['gap_total_ms']:6.3f} ms; {tr['launch_calls']} launch calls, "
              f"{tr['launch_host_us']:5.2f} us host each; {graph}", flush=True)
    return rows


def main():
    from bench import study_parser
    p = study_parser(__doc__, reps=20, layers=True)
    p.add_argument("--json", help="write the rows here")
    a = p.parse_args()
    import torch

    import tvmrnn
    if not torch.cuda.is_available():
        sys.exit("launch_study.py needs a CUDA GPU")
    rows = [r for cell in a.cells for r in study(a, cell, torch, tvmrnn)]
    if a.json:
        import json
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
