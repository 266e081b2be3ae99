#!/usr/bin/env python3
"""One CPU kernel alone, by register tile, weight layout and page size, interleaved in one process.

    python scripts/step_study.py --threads 1 16               # the DS2 LSTM's inference step
    python scripts/step_study.py --kernels step train projection backward --threads 16

For each thread count (a fresh process each, as ``scripts/cpu_scaling.py``), each kernel and each
variant (``--tiles``: ``ROWSxVECTORS`` register tiles, ``default`` for the default schedule's;
``--panels``: the forward weights K-major (0) or in panels of the default tile's units), the
kernel is compiled once and timed with its arguments in 4 KB pages and in 2 MB pages
(``arrays.huge_empty``); every round times every combination once (``--number`` calls, after a
warm-up), and the report gives the median over ``--rounds`` rounds with their range, in
microseconds and GFLOP/s. The kernel's own arguments stay the same from call to call, as the
weights do in a pass; what a pass adds (the input projection's output arriving from other cores,
h_prev written by all cores) is not here: ``scripts/cpu_pass_study.py`` times whole passes.
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def small_pages(shape):
    """A float32 array in 4 KB pages: its own mapping, advised ``MADV_NOHUGEPAGE`` (NumPy itself
    advises huge pages for large arrays)."""
    import numpy as np
    nbytes = 4 * int(np.prod(shape))
    mm = mmap.mmap(-1, nbytes + 64, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        mm.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(mm, np.uint8)[:nbytes].view(np.float32).reshape(shape)


def kernel_of(name, cell, N, H, panel):
    from tvmrnn import kernels
    G = cell.num_gates
    if name == "step":
        return kernels.recurrent_step(cell, N, H, False, panel=panel)
    if name == "train":
        return kernels.recurrent_step(cell, N, H, True, panel=panel)
    if name == "projection":
        return kernels.input_projection(16, N, H, H, G, panel=panel)
    if name == "backward":
        return kernels.backward_step(cell, N, H, panel=panel)
    raise ValueError(name)


def tile_arguments(tile: str, lanes: int) -> dict:
    if tile == "default":
        return {}
    rows, vectors = (int(v) for v in tile.split("x"))
    return dict(column_vectors=vectors, accumulators=rows * vectors)


def one(a):
    import numpy as np
    import tvm
    import tvm_ffi
    from tvmrnn import schedules as ds
    from tvmrnn.schedules import fast_math
    from tvmrnn.runtime.arrays import huge_empty
    from tvmrnn.cells.definition import get_cell
    from tvmrnn.program.sequence import compile_module
    from tvmrnn.device import host_target
    target = host_target()
    lanes = ds.vector_lanes(target)
    cell = get_cell(a.cell)
    N, H, G = a.batch_size, a.hidden_size, cell.num_gates
    rng = np.random.default_rng(0)
    runs = []
    for name in a.kernels:
        for panel in a.panels:
            # a panel is the default tile's units (the backward's weight copy: its tile along K)
            unit = ds.cpu_column_tile(lanes, H, 1 if name == "backward" else G) if panel else 0
            k = kernel_of(name, cell, N, H, unit)
            for tile in a.tiles:
                # as builds compile CPU kernels: exp, sigmoid and tanh as vector arithmetic
                func = fast_math.vectorisable(ds.default_schedule(k, target, **tile_arguments(tile, lanes)))
                lib = compile_module(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target).jit()
                shapes = [[int(s) for s in p.shape] for p in func.params]
                flop = 2 * N * H * H * G * (16 if name == "projection" else 1)
                for pages, alloc in (("4K", small_pages), ("2M", huge_empty)):
                    arrays = []
                    for shape in shapes:
                        x = alloc(shape)
                        x[...] = rng.uniform(-0.1, 0.1, shape).astype(np.float32)
                        arrays.append(x)
                    args = [tvm_ffi.from_dlpack(x) for x in arrays]
                    timer = lib.time_evaluator("main", tvm.cpu(), number=a.number, repeat=1)
                    label = f"{name:10s} {'panels' if panel else 'K-major':7s} tile {tile:7s} {pages}"
                    runs.append((label, flop, lambda timer=timer, args=args: timer(*args).mean, []))
    for _ in range(a.rounds):
        for label, flop, run, times in runs:
            times.append(1e6 * run())
    for label, flop, run, times in runs:
        us = statistics.median(times)
        print(f"threads {a.one:3d}  {label}  {us:9.1f} us (rounds {min(times):.1f}-{max(times):.1f})  "
              f"{flop / us / 1e3:7.1f} GFLOP/s", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", default="lstm")
    p.add_argument("--kernels", nargs="+", default=["step"], choices=["step", "train", "projection", "backward"])
    p.add_argument("--threads", type=int, nargs="+", default=[16])
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--tiles", nargs="+", default=["default", "10x2", "20x1"])
    p.add_argument("--panels", type=int, nargs="+", default=[0, 1])
    p.add_argument("--number", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one is not None:
        return one(a)
    from bench import fresh_process
    for threads in a.threads:  # the same arguments, one thread count a process
        print(fresh_process(__file__, threads, [*sys.argv[1:], "--one", threads]), end="", flush=True)


if __name__ == "__main__":
    main()
