#!/usr/bin/env python3
"""CPU GEMMs blocked for L1, and the weight gradient's output layout.

    python scripts/l1_study.py --threads 1 16

``default_schedule.cpu_gemm`` gives each parallel task one register tile and its whole
reduction. A tile reads its slice of both operands once, so when several tiles of a task's
neighbourhood share the streamed operand (the weights of the input projection and input
gradient, the gate gradients of the weight gradient) each tile brings that slice from L2 again.
``row_block`` and ``red_block`` (BLIS's loop order) give a task ``row_block`` tiles and run the
reduction in slices of ``red_block`` outside them: one slice serves every tile from L1.

This times each all-steps GEMM of a DS2 LSTM (16-step chunks, and the input projection of one
step, whose tile is the fused step's) unblocked and over a grid of blocks, and the weight
gradient in PyTorch's ``(g, j, k)`` layout beside the packed ``(k, j, g)`` one
(``kernels.weight_gradient(packed=True)``: the gate gradients streamed along their contiguous
``(j, g)``). Each thread count runs in a fresh process (as ``scripts/cpu_scaling.py``); each
output is checked against NumPy in float64. First run (``wgrad_study.py``, the weight gradient
only): notes/bench/wgrad_study_spr_v12.txt.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

KERNELS = ("weight_gradient", "weight_gradient_packed", "input_projection", "input_gradient", "step_projection")


def make(name, steps, N, H, G, target):
    """The kernel as a default build makes it for ``target`` (weights in its panels, if any)."""
    from tvmrnn import kernels
    from tvmrnn.schedules.cpu import weight_panel
    if name.startswith("weight_gradient"):
        return kernels.weight_gradient(steps, N, H, H, G, packed=name.endswith("packed"))
    if name in ("input_projection", "step_projection"):
        return kernels.input_projection(1 if name == "step_projection" else steps, N, H, H, G,
                                        panel=weight_panel(target, G, H))
    return kernels.input_gradient(steps, N, H, H, G, accumulate=False, panel=weight_panel(target, 1, H))


def reference(name, args):
    import numpy as np
    a = [x.astype(np.float64) for x in args]
    if name == "weight_gradient":
        dg, x, acc, _ = a
        return acc + np.einsum("tnjg,tnk->gjk", dg, x)
    if name == "weight_gradient_packed":
        dg, x, acc, _ = a
        return acc + np.einsum("tnk,tnjg->kjg", x, dg)
    if name in ("input_projection", "step_projection"):  # weights (H/u, K, G, u), b (H/u, G, u)
        x, w, b, _ = a
        if w.ndim == 3:
            return np.einsum("tnk,kjg->tnjg", x, w) + b
        return np.einsum("tnk,pkgu->tnpgu", x, w) + b
    dg, w, _ = a  # the backward's weight copy (G, H, K) or (K/v, H, G, v)
    if w.ndim == 3:
        return np.einsum("tnjg,gjk->tnk", dg, w)
    return np.einsum("tnjg,qjgv->tnqv", dg, w).reshape(dg.shape[0], dg.shape[1], -1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 16])
    p.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=KERNELS)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--row-blocks", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--red-blocks", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--column-vectors", type=int, nargs="+", default=[4], help="cpu_gemm's widest column tile, in "
                   "vectors (narrower tiles: more parallel tasks when whole rows make a block)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is None:
        from bench import fresh_process
        for threads in a.threads:
            args = ["--one", threads, "--kernels", *a.kernels, "--steps", a.steps, "-N", a.batch_size,
                    "--hidden-size", a.hidden_size, "--row-blocks", *a.row_blocks, "--red-blocks", *a.red_blocks,
                    "--column-vectors", *a.column_vectors, "--rounds", a.rounds]
            print(fresh_process(__file__, threads, args), end="", flush=True)
        return
    import statistics

    import numpy as np
    import tvm
    from tvmrnn import schedules as ds
    from tvmrnn.runtime.profile import kernel_timer
    from tvmrnn.device import host_target

    N, H, G = a.batch_size, a.hidden_size, 4
    target = host_target()
    runs = []  # (label, flop, timer, args, name, times)
    for name in a.kernels:
        steps = 1 if name == "step_projection" else a.steps
        flop = 2 * steps * N * H * H * G
        blocks = [(1, 0)] + [(rb, kb) for rb in a.row_blocks for kb in a.red_blocks]
        for (row_block, red_block), vectors in ((b, v) for v in a.column_vectors for b in blocks):
            kernel = make(name, steps, N, H, G, target)
            sch = tvm.s_tir.Schedule(kernel.func)
            ds.cpu_gemm(sch, kernel, target, row_block=row_block, red_block=red_block, column_vectors=vectors)
            timer, args = kernel_timer(sch.mod["main"], target, number=50 if steps == 1 else 10, repeat=1)
            label = ("unblocked" if red_block == 0 else f"{row_block} tiles x {red_block} reduction rows") + f", {vectors} vec"
            runs.append((f"{name:24s} {label:30s}", flop, timer, args, name, []))
    # every variant once a round, round after round (this VM's speed moves within minutes)
    for _ in range(a.rounds):
        for _, _, timer, args, _, times in runs:
            times.append(1e6 * timer(*args).mean)
    for label, flop, timer, args, name, times in runs:
        us = statistics.median(times)
        results = [x.numpy() for x in args]
        want = reference(name, results)
        err = float(np.abs(results[-1] - want).max() / np.abs(want).max())
        print(f"threads {a.one:3d}  {label} {us:9.1f} us (rounds {min(times):.1f}-{max(times):.1f})  "
              f"{flop / us / 1e3:7.1f} GFLOP/s  max rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
