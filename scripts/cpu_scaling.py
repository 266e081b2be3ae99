#!/usr/bin/env python3
"""How the CPU kernels scale with threads: per-step kernels, the input GEMM and PyTorch's GEMMs.

    python scripts/cpu_scaling.py --threads 1 2 4 8 16

For each thread count: the default-scheduled fused step of each cell and the 16-step input
projection (tvmrnn's DS2 kernels, timed alone with TVM's time_evaluator, median), and PyTorch's
own ``h @ W_hh^T`` of one LSTM step and the chunk's input GEMM at the same thread count, as a
yardstick of what the machine gives a GEMM of that shape. Prints microseconds, GFLOP/s and the
speed-up over the first thread count. Each thread count and side runs in a fresh process
(``TVM_NUM_THREADS``, ``torch.set_num_threads``), so that each thread count is the one its runtime
started with and neither runtime's idle workers share the cores with the other's. (On the dev
machine, PyTorch's step GEMM ran 13x slower in a process whose TVM pool had been resized with
``runtime.config_threadpool``; with both at their defaults it ran 10-15% slower right after a
tvmrnn forward than before it.) A step that stops scaling while PyTorch's GEMM keeps scaling points at
our schedule (tile split, weights not staying in each core's cache); both flat points at the
machine (shared cores, memory bandwidth).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--cells", nargs="+", default=["lstm", "gru", "rnn_relu"])
    p.add_argument("--one", nargs=2, metavar=("SIDE", "THREADS"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is None:
        from bench import fresh_process
        base = {}
        for threads in a.threads:
            for side in ("tvm", "torch"):
                out = fresh_process(__file__, threads, ["--one", side, threads, "-N", a.batch_size,
                                                        "--hidden-size", a.hidden_size, "--cells", *a.cells])
                for line in out.splitlines():
                    name, us, flop = line.split("\t")
                    us, flop = float(us), float(flop)
                    base.setdefault(name, us)
                    print(f"threads {threads:3d}  {name:44s} {us:9.1f} us  {flop / us / 1e3:7.1f} GFLOP/s  "
                          f"x{base[name] / us:5.2f} over {a.threads[0]}", flush=True)
        return
    side, threads = a.one[0], int(a.one[1])
    import torch
    torch.set_num_threads(threads)
    if side == "torch":
        from bench import timed
        N, H = a.batch_size, a.hidden_size
        h, w, xs = torch.randn(N, H), torch.randn(4 * H, H), torch.randn(16 * N, H)
        for name, fn, flop in (("torch h @ W_hh^T (LSTM step GEMM)", lambda: h @ w.t(), 2 * N * H * 4 * H),
                               ("torch x @ W_ih^T (LSTM 16-step chunk)", lambda: xs @ w.t(), 2 * 16 * N * H * 4 * H)):
            print(f"{name}\t{1e6 * timed(fn, lambda: None, 250, float('inf'))[0]}\t{flop}")
        return
    from tvmrnn.schedules import fast_math
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import default_schedule
    from tvmrnn.runtime.profile import time_kernel
    from tvmrnn.device import host_target

    N, H = a.batch_size, a.hidden_size
    target = host_target()
    todo = [(kernels.recurrent_step(CELLS[c], N, H, train=False), 2 * N * H * H * CELLS[c].num_gates) for c in a.cells]
    todo.append((kernels.input_projection(16, N, H, H, 4), 2 * 16 * N * H * H * 4))
    funcs = [(k.name, fast_math.vectorisable(default_schedule(k, target)), flop) for k, flop in todo]
    for name, func, flop in funcs:
        print(f"{name}\t{time_kernel(func, target, number=50, repeat=5)}\t{flop}")


if __name__ == "__main__":
    main()
