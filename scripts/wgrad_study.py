#!/usr/bin/env python3
"""The CPU weight gradient: its output layout and its reduction blocked for L1.

    python scripts/wgrad_study.py --threads 1 16

The weight gradient of a 16-step chunk, ``dW += dG^T A`` (DS2 LSTM: 3200 x 800 outputs, a
reduction over the chunk's 320 rows), is half the dev machine's LSTM backward and 63% of the
Xeon's (v6, v11 in notes/performance.md), at half the input gradient's GFLOP/s on the same shape.
Two things may be in its way, and this times both, alone and together:

- **Layout.** tvmrnn's kernel writes ``dw[g, j, k]`` (PyTorch's layout): its register tile runs
  along ``k`` and broadcasts ``dg[t, n, j, g]`` for 10 rows ``j`` of one gate, scalars 16 bytes
  apart, so each reduction step touches 3 cache lines for 40 bytes it uses. Writing
  ``dw[k, j, g]`` instead (the packed layout of the forward's weights; one transpose per weight
  at the end of a layer) makes ``dg`` the streamed operand, read in whole lines along ``(j, g)``,
  and broadcasts ``a[t, n, k:k + 5]``, contiguous.
- **L1 blocking.** A tile's reduction reads ~90 KB (its 320 rows of both operands), more than an
  L1 holds, from L2 for every tile. Blocking the reduction (``red_block`` rows) outside a row block
  of several tiles (``row_block``) lets one slice of the streamed operand serve every tile of
  the row block from L1, the partial sums kept in the tile's output buffer between blocks
  (BLIS's loop order).

Each thread count runs in a fresh process (as ``scripts/cpu_scaling.py``); each output is checked
against NumPy in float64, and PyTorch's own ``dg^T @ a`` of the same shape is timed beside.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def transposed_kernel(steps, batch, in_size, hidden, gates):
    """The weight gradient with its output in the packed ``(k, j, g)`` layout."""
    from tvm import te
    from tvmrnn.kernels import F32, _make
    dg = te.placeholder((steps, batch, hidden, gates), F32, "dg")
    a = te.placeholder((steps, batch, in_size), F32, "a")
    acc = te.placeholder((in_size, hidden, gates), F32, "acc")
    t = te.reduce_axis((0, steps), "t")
    n = te.reduce_axis((0, batch), "n")
    mm = te.compute(acc.shape, lambda k, j, g: te.sum(a[t, n, k] * dg[t, n, j, g], axis=[t, n]), name="matmul")
    out = te.compute(acc.shape, lambda k, j, g: acc[k, j, g] + mm[k, j, g], name="dw")
    return _make(f"weight_gradient_kjg_t{steps}", {"dg": dg, "a": a, "acc": acc}, {"dw": out}, gemm="matmul",
                 columns=("j", "g"))


def blocked(sch, kernel, target, lead_tile, rows, row_block, red_block):
    """``cpu_gemm``'s tile (``lead_tile`` columns of the leading column axis, ``rows`` rows) with
    the reduction fused, split by ``red_block`` and moved outside a block of ``row_block`` tiles."""
    from tvmrnn import default_schedule as ds
    lanes = ds.vector_lanes(target)
    gemm = sch.get_sblock(kernel.gemm)
    epilogues = sch.get_consumers(gemm)
    spatial, reduction = ds._gemm_axes(sch, gemm)
    ncols = len(kernel.columns)
    row_loops, col_loops = spatial[:-ncols], spatial[-ncols:]
    inner = 1
    for loop in col_loops[1:]:
        inner *= ds._extent(sch, loop)
    col_outer, col_inner = sch.split(col_loops[0], [None, lead_tile])
    row_outer, row_mid, row_inner = sch.split(row_loops[-1], [None, row_block, rows])
    red_outer, red_inner = sch.split(sch.fuse(*reduction), [None, red_block])
    outer = [*row_loops[:-1], row_outer]
    sch.reorder(col_outer, *outer, red_outer, row_mid, red_inner, row_inner, col_inner, *col_loops[1:])
    tile = sch.fuse(col_outer, *outer)
    sch.parallel(tile)
    sch.unroll(row_inner)
    ds._vectorize(sch, sch.fuse(col_inner, *col_loops[1:]), lanes)
    sch.decompose_reduction(gemm, red_outer)
    for consumer in epilogues:
        sch.reverse_compute_at(consumer, tile, preserve_unit_loops=True)
        ds._vectorize_trailing(sch, sch.get_loops(consumer)[1:], lead_tile * inner, lanes)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 16])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--row-blocks", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--red-blocks", type=int, nargs="+", default=[64, 320])
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is None:
        import subprocess
        for threads in a.threads:
            env = dict(os.environ, TVM_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
            args = [sys.executable, __file__, "--one", str(threads), "--steps", str(a.steps), "-N", str(a.batch_size), "--hidden-size", str(a.hidden_size),
                "--row-blocks", *map(str, a.row_blocks), "--red-blocks", *map(str, a.red_blocks)]
            out = subprocess.run(args, env=env, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr)
            print(out.stdout, end="", flush=True)
        return
    import numpy as np
    import torch
    import tvm
    from tvmrnn import default_schedule as ds
    from tvmrnn.kernels import weight_gradient
    from tvmrnn.profile import time_kernel
    from tvmrnn.target import host_target
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench import timed

    torch.set_num_threads(a.one)
    S, N, H, G = a.steps, a.batch_size, a.hidden_size, 4
    K = H
    flop = 2 * S * N * K * H * G
    target = host_target()
    dg_t, a_t = torch.randn(S * N, G * H), torch.randn(S * N, K)
    us = 1e6 * timed(lambda: torch.mm(dg_t.t(), a_t), lambda: None, reps=20, max_seconds=5)[0]
    print(f"threads {a.one:3d}  {'PyTorch dg^T @ a':44s} {us:9.1f} us  {flop / us / 1e3:7.1f} GFLOP/s", flush=True)
    cases = [("today (g, j, k)", weight_gradient, None), ("(k, j, g)", transposed_kernel, None)]
    for rb in a.row_blocks:
        for kb in a.red_blocks:
            cases.append(("today (g, j, k)", weight_gradient, (32, 10, rb, kb)))
            cases.append(("(k, j, g)", transposed_kernel, (16, 5, rb, kb)))
    for name, make, cfg in cases:
        kernel = make(S, N, K, H, G)
        sch = tvm.s_tir.Schedule(kernel.func)
        if cfg is None:
            ds.cpu_gemm(sch, kernel, target)
        else:
            blocked(sch, kernel, target, *cfg)
        results = []
        us = time_kernel(sch.mod["main"], target, number=10, repeat=5, results=results)
        dg, x, acc, dw = (r.astype(np.float64) for r in results[:4])
        if make is weight_gradient:
            want = acc + np.einsum("tnjg,tnk->gjk", dg, x)
        else:
            want = acc + np.einsum("tnk,tnjg->kjg", x, dg)
        err = float(np.abs(dw - want).max() / np.abs(want).max())
        label = f"{name} " + ("default" if cfg is None else "tile %dx%d, rows %d, red %d" % (cfg[1], cfg[0], *cfg[2:]))
        print(f"threads {a.one:3d}  {label:44s} {us:9.1f} us  {flop / us / 1e3:7.1f} GFLOP/s  max rel err {err:.1e}",
              flush=True)


if __name__ == "__main__":
    main()
