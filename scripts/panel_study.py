#!/usr/bin/env python3
"""CPU GEMMs with the weights K-major (today's layout) against column panels (BLIS-style).

    python scripts/panel_study.py --threads 1 16
    python scripts/panel_study.py --passes lstm gru --threads 2   # whole passes, both layouts

The kernels' weights are ``w[k, j, g]``: a register tile of 16 units x 4 gates reads 256 bytes
of row ``k`` and then jumps 12.8 KB (H * G floats) to row ``k + 1``, so its reduction touches a new
4 KB page at every step: 800 pages per tile, more than a core's TLB holds for its slice of the
weights, and a stride hardware prefetchers do not follow across pages. Packed in panels,
``w[j // u, k, g, j % u]`` (gate-blocked since v24) with ``u`` the tile's units, a tile's reduction walks one contiguous
block (200 KB), and a core's slice of the weights is contiguous too. This times the same GEMM
(``gx[t, n, j, g] = sum_k x[t, n, k] w[k, j, g] + b[j, g]``, the input projection, whose
schedule is the fused step's) in both layouts, as one step (20 rows) and as a 16-step chunk
(320 rows), with the default CPU schedule (``default_schedule.cpu_gemm``), at each thread count
in a fresh process (as ``scripts/cpu_scaling.py``). Each output is checked against NumPy in float64.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def kernel(steps, batch, in_size, hidden, gates, panel: int):
    """The input projection with the weights K-major (``panel`` 0: tvmrnn's own kernel) or in
    panels of ``panel`` units (the same computation, the weights indexed through the panels)."""
    from tvm import te
    from tvmrnn.kernels import F32, _make, input_projection
    if not panel:
        return input_projection(steps, batch, in_size, hidden, gates)
    x = te.placeholder((steps, batch, in_size), F32, "x")
    w = te.placeholder((hidden // panel, in_size, panel, gates), F32, "w")
    b = te.placeholder((hidden, gates), F32, "b")
    k = te.reduce_axis((0, in_size), "k")
    mm = te.compute((steps, batch, hidden, gates),
                    lambda t, n, j, g: te.sum(x[t, n, k] * w[j // panel, k, j % panel, g], axis=k), name="matmul")
    gx = te.compute(mm.shape, lambda t, n, j, g: mm[t, n, j, g] + b[j, g], name="gx")
    return _make(f"gemm_t{steps}_panel{panel}", {"x": x, "w": w, "b": b}, {"gx": gx}, gemm="matmul",
                 columns=("j", "g"))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 16])
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--panels", type=int, nargs="+", default=[0, 16, 8])
    p.add_argument("--accumulators", type=int, nargs="+", default=[24])
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    p.add_argument("--passes", nargs="*", metavar="CELL",
                   help="instead: whole DS2 passes of these cells built with K-major weights and with panels "
                        "(TVMRNN_WEIGHT_PANELS=0 / 1), timed in turn (bench.compare_builds), at the first --threads")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    if a.passes is not None:
        threads = str(a.threads[0])
        os.environ["TVM_NUM_THREADS"] = threads
        import torch
        torch.set_num_threads(int(threads))
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench import compare_builds

        def layout(value):
            return lambda: os.environ.__setitem__("TVMRNN_WEIGHT_PANELS", value)
        compare_builds(a.passes or ["lstm"], [("K-major weights", layout("0")), ("column panels", layout("1"))],
                       device="cpu", N=a.batch_size, hidden_size=a.hidden_size, reps=a.reps, rounds=a.rounds)
        return
    if a.one is None:
        from bench import fresh_process
        for threads in a.threads:
            args = ["--one", threads, "-N", a.batch_size, "--hidden-size", a.hidden_size, "--panels", *a.panels,
                    "--accumulators", *a.accumulators]
            print(fresh_process(__file__, threads, args), end="", flush=True)
        return
    import numpy as np
    import tvm
    from tvmrnn import schedules as ds
    from tvmrnn.runtime.profile import time_kernel
    from tvmrnn.device import host_target

    N, H, G = a.batch_size, a.hidden_size, 4
    target = host_target()
    for steps in (1, 16):
        for panel in a.panels:
            for acc in a.accumulators:
                k = kernel(steps, N, H, H, G, panel)
                sch = tvm.s_tir.Schedule(k.func)
                ds.cpu_gemm(sch, k, target, accumulators=acc)
                results = []
                us = time_kernel(sch.mod["main"], target, number=50 if steps == 1 else 10, repeat=5, results=results)
                x, w, b, gx = results
                if panel:  # the same weights in the K-major layout, to compare
                    w = w.transpose(1, 0, 2, 3).reshape(H, H, G)
                want = np.einsum("tnk,kjg->tnjg", x.astype(np.float64), w.astype(np.float64)) + b
                err = float(np.abs(gx - want).max() / np.abs(want).max())
                flop = 2 * steps * N * H * H * G
                label = f"panels of {panel} units" if panel else "K-major (today)"
                print(f"threads {a.one:3d}  rows {steps * N:4d}  {label:20s} acc {acc:2d}  {us:9.1f} us  "
                      f"{flop / us / 1e3:7.1f} GFLOP/s  max rel err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
