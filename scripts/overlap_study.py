#!/usr/bin/env python3
"""Can the all-steps GEMMs hide behind the per-step kernels? Two streams, measured.

    python scripts/overlap_study.py --reps 10

The backward's weight-gradient GEMMs (25 of the 5-layer LSTM's 69 ms backward on the H100, v13)
do not depend on the next steps, so they could run on a second stream beside the time loop. The
time loop is latency-bound (a step's kernels fill the SMs for a few microseconds each), so
whether a GEMM beside it fills idle cycles or delays every step is a question for the GPU.

This times, on the same inputs, a tvmrnn inference forward (its time loop dominates) alone, a
batch of GEMMs of the weight gradients' shapes alone (cuBLAS through ``torch.addmm``, in chunks of
``--chunk`` steps), and both launched together on two streams with each stream priority (the
loop's stream high, the GEMMs' low, and both equal). ``overlap`` is how much of the shorter side
disappeared: (alone_a + alone_b - together) / min(alone_a, alone_b).

Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def timed(torch, fn, reps):
    """Median milliseconds of ``fn`` between CUDA events on the current stream (``fn`` joins its
    side streams back to it)."""
    from launch_study import timed_call
    return timed_call(torch, fn, reps)[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", default="lstm")
    p.add_argument("-T", type=int, default=300)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--in-size", type=int, default=1600, help="the GEMMs' input size (an inner layer's 2H)")
    p.add_argument("--chunk", type=int, nargs="+", default=[32, 64, 256])
    p.add_argument("--unidirectional", action="store_true")
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    import torch

    import tvmrnn
    if not torch.cuda.is_available():
        sys.exit("overlap_study.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    T, N, H = a.T, a.N, a.hidden_size
    bidir = not a.unidirectional
    D = 2 if bidir else 1
    torch.manual_seed(0)
    from bench import torch_rnn
    ref = torch_rnn(a.cell, H, H, 1, bidir).to(dev)
    rnn = tvmrnn.build(a.cell, input_size=H, hidden_size=H, bidirectional=bidir, batch_size=N, target="cuda")
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = torch.randn(T, N, H, device=dev)
    G = rnn.config.cell.num_gates
    lo, hi = torch.cuda.Stream.priority_range() if hasattr(torch.cuda.Stream, "priority_range") else (0, -1)
    print(f"{a.cell} {'bidir' if bidir else 'uni'} T={T} N={N} H={H}; stream priorities low {lo} high {hi}",
          flush=True)
    with torch.no_grad():
        y_ref = rnn.forward(w, x)[0].clone()
    for chunk in a.chunk:
        # one layer's weight gradients for every direction: dW_ih (GH x in) and dW_hh (GH x H),
        # each the sum over chunks of dG[chunk]^T @ a[chunk]
        rows = chunk * N
        dg = torch.randn(rows, G * H, device=dev)
        xa = torch.randn(rows, a.in_size, device=dev)
        ha = torch.randn(rows, H, device=dev)
        dwi = [torch.zeros(G * H, a.in_size, device=dev) for _ in range(D)]
        dwh = [torch.zeros(G * H, H, device=dev) for _ in range(D)]
        n_chunks = -(-T // chunk)

        def gemms():
            for _ in range(n_chunks):
                for d in range(D):
                    dwi[d].addmm_(dg.t(), xa)
                    dwh[d].addmm_(dg.t(), ha)

        def loop():
            rnn.forward(w, x)

        flops = 2.0 * n_chunks * D * rows * G * H * (a.in_size + H)
        t_loop = timed(torch, loop, a.reps)
        t_gemm = timed(torch, gemms, a.reps)
        print(f"chunk {chunk:3d}: loop alone {t_loop:7.3f} ms, GEMMs alone {t_gemm:7.3f} ms "
              f"({flops / t_gemm / 1e9:5.1f} TFLOP/s, {n_chunks * D * 2} GEMMs)", flush=True)
        for name, (p_loop, p_gemm) in {"loop high, GEMMs low": (hi, lo), "equal": (lo, lo),
                                       "loop low, GEMMs high": (lo, hi)}.items():
            s_loop, s_gemm = torch.cuda.Stream(priority=p_loop), torch.cuda.Stream(priority=p_gemm)

            def both():
                main = torch.cuda.current_stream()
                s_loop.wait_stream(main)
                s_gemm.wait_stream(main)
                with torch.cuda.stream(s_loop):
                    loop()
                with torch.cuda.stream(s_gemm):
                    gemms()
                main.wait_stream(s_loop)
                main.wait_stream(s_gemm)

            t_both = timed(torch, both, a.reps)
            hidden = (t_loop + t_gemm - t_both) / min(t_loop, t_gemm)
            print(f"    {name:22s} together {t_both:7.3f} ms (sum {t_loop + t_gemm:7.3f}, max "
                  f"{max(t_loop, t_gemm):7.3f}): overlap {100 * hidden:5.1f}% of the shorter side", flush=True)
        with torch.no_grad():
            y = rnn.forward(w, x)[0]
        err = float((y - y_ref).abs().max())
        print(f"    forward still equal after the concurrent runs: max abs diff {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
