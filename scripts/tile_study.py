#!/usr/bin/env python3
"""How the CPU GEMM's register tile changes each Deep Speech 2 kernel's time on this machine.

    python scripts/tile_study.py --threads 16

For each kernel (the fused steps and the recurrent backward of every cell, the input projection
chunk) and each tile shape (``--column-vectors`` output vectors wide, rows filling
``--accumulators`` registers), times the default schedule alone (median, microseconds).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--column-vectors", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--accumulators", type=int, nargs="*", default=[20, 24])
    a = p.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(a.threads)
    from tvmrnn import fast_math, kernels
    from tvmrnn.cells import CELLS
    from tvmrnn.default_schedule import default_schedule
    from tvmrnn.profile import time_kernel
    from tvmrnn.target import host_target
    target = host_target()
    N, H = a.batch_size, a.hidden_size
    todo = [kernels.recurrent_step(CELLS[c], N, H, train=False) for c in ("lstm", "gru", "rnn_tanh")]
    todo += [kernels.recurrent_backward(N, H, 4, False), kernels.input_projection(16, N, H, H, 4)]
    print(f"{target} threads={a.threads}")
    for kernel in todo:
        for cv in a.column_vectors:
            for acc in a.accumulators:
                func = fast_math.vectorisable(default_schedule(kernel, target, accumulators=acc, column_vectors=cv))
                us = time_kernel(func, target, number=50, repeat=5)
                print(f"{kernel.name:45s} column_vectors={cv} accumulators={acc:2d}: {us:9.1f} us", flush=True)


if __name__ == "__main__":
    main()
