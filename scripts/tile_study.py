#!/usr/bin/env python3
"""How the default schedule's tile parameters change each Deep Speech 2 kernel's time on this machine.

    python scripts/tile_study.py --threads 16            # CPU: the GEMM's register tile
    python scripts/tile_study.py --device cuda           # GPU: the split-K schedule's shape

CPU: for each kernel (the fused steps and the recurrent backward of every cell, the input
projection chunk) and each tile shape (``--column-vectors`` output vectors wide, rows filling
``--accumulators`` registers), times the default schedule alone (median, microseconds).

GPU: for each per-step kernel (the fused forward and backward steps of every cell) and each
shape of :func:`tvmrnn.schedules.gpu_split_k` (``--block-threads`` threads per block, at
least ``--min-blocks`` blocks, ``--thread-columns`` output columns per thread, the reduction
over ``--block-slices`` blocks, ``--gpu-accumulators`` partial sums per thread), the same. The
first shape listed first is the default's.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="CPU threads")
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--column-vectors", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--accumulators", type=int, nargs="*", default=[20, 24])
    p.add_argument("--block-threads", type=int, nargs="*", default=[256, 128, 64])
    p.add_argument("--min-blocks", type=int, nargs="*", default=[200, 132, 400])
    p.add_argument("--thread-columns", type=int, nargs="*", default=[4, 2, 8])
    p.add_argument("--unroll", type=int, nargs="*", default=[8])
    p.add_argument("--block-slices", type=int, nargs="*", default=[1],
                   help="GPU: blocks the reduction is split over (the epilogue a second kernel); 0: the default")
    p.add_argument("--max-shared-kb", type=int, nargs="*", default=[48],
                   help="GPU: shared memory for a block's partial sums, KB (past 48: dynamic shared memory)")
    p.add_argument("--gpu-accumulators", type=int, nargs="*", default=[96], help="GPU: registers of "
                                                                                 "partial sums per thread")
    p.add_argument("--only", nargs="*", default=[], help="kernels whose name contains one of these")
    p.add_argument("--directions", type=int, nargs="*", default=[1], help="per-step kernels for 1 and/or 2 "
                                                                         "directions at once (bidirectional layers)")
    a = p.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(a.threads)
    import tvm
    from tvmrnn.schedules import fast_math
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import default_schedule
    from tvmrnn.runtime.profile import time_kernel
    from tvmrnn.device import host_target
    N, H = a.batch_size, a.hidden_size
    todo = [kernels.recurrent_step(CELLS[c], N, H, train=False, directions=d)
            for c in ("lstm", "gru", "rnn_tanh") for d in a.directions]
    if a.device == "cpu":
        target = host_target()
        todo += [kernels.recurrent_backward(N, H, 4, False), kernels.input_projection(16, N, H, H, 4)]
        print(f"{target} threads={a.threads}")
        shapes = [dict(accumulators=acc, column_vectors=cv) for cv in a.column_vectors for acc in a.accumulators]
    else:
        target = tvm.target.Target("nvidia/nvidia-h100") if "H100" in _gpu_name() else tvm.target.Target("cuda")
        todo += [kernels.backward_step(CELLS[c], N, H, directions=d) for c in ("lstm", "gru", "rnn_tanh")
                 for d in a.directions]
        print(f"{target.attrs.get('arch')} {_gpu_name()}")
        shapes = [dict(threads=t, min_blocks=b, thread_columns=c, unroll=u, block_slices=s or None, accumulators=acc,
                       max_shared_bytes=kb * 1024)
                  for t, b, c, u, s, acc, kb in itertools.product(a.block_threads, a.min_blocks, a.thread_columns,
                                                                  a.unroll, a.block_slices, a.gpu_accumulators,
                                                                  a.max_shared_kb)]
    todo = [k for k in todo if not a.only or any(s in k.name for s in a.only)]
    import numpy as np
    for kernel in todo:
        first = None  # the first shape's results: every other shape must agree
        for shape in shapes:
            func = default_schedule(kernel, target, **shape)
            if a.device == "cpu":
                func = fast_math.vectorisable(func)
            results = []
            try:
                us = f"{time_kernel(func, target, number=50, repeat=5, results=results):9.1f} us"
                first = first or results
                err = max(float(np.max(np.abs(x - y)) / max(1e-30, float(np.max(np.abs(y)))))
                          for x, y in zip(results, first))
                us += f"  max rel diff {err:.1e}" + ("  DISAGREES" if err > 1e-4 else "")
            except Exception as e:  # a shape that does not fit (shared memory, registers) is reported
                us = f"failed: {str(e).strip().splitlines()[-1][:80]}"
            knobs = " ".join(f"{k}={v}" for k, v in shape.items())
            print(f"{kernel.name:45s} {knobs}: {us}", flush=True)


def _gpu_name() -> str:
    import torch
    return torch.cuda.get_device_name() if torch.cuda.is_available() else ""


if __name__ == "__main__":
    main()
