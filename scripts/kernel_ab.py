#!/usr/bin/env python3
"""One CPU kernel of two tvmrnn checkouts (another commit's and this one's), timed alone in one process.

    git worktree add /tmp/old 636f0d5
    TVM_NUM_THREADS=16 python scripts/kernel_ab.py --old /tmp/old/tvmrnn --cells lstm gru

A change of a kernel's layout cannot be timed by variants of one build (the other layout no longer
exists in the code), and on a shared VM two processes timed minutes apart differ by 20-40%
(notes/performance.md v23). Here the other checkout's package is imported under another name
(``tvmrnn_old``: the package imports itself only relatively), each kernel (the fused step for
inference and for training, a 16-step input projection, at the build's default schedule and
weight panels for this CPU, with the builds' vector math) is compiled from both packages, and every
round times each once (``--number`` calls), its arguments on huge pages where tvmrnn's own
arrays get them (``profile.kernel_timer``). Reported: the median over
``--rounds`` rounds with their range, in microseconds. Threads: ``TVM_NUM_THREADS``.
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_as(package_dir: str, alias: str):
    """The tvmrnn package at ``package_dir`` as the module ``alias``."""
    root = tempfile.mkdtemp()
    os.symlink(os.path.abspath(package_dir), os.path.join(root, alias))
    sys.path.insert(0, root)
    return importlib.import_module(alias)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="the other checkout's tvmrnn/ folder")
    p.add_argument("--cells", nargs="+", default=["lstm"])
    p.add_argument("--kernels", nargs="+", default=["step", "train", "projection"],
                   choices=["step", "train", "projection"])
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--number", type=int, default=50)
    p.add_argument("--rounds", type=int, default=10)
    a = p.parse_args()
    import tvmrnn
    from tvmrnn.runtime.profile import kernel_timer
    from tvmrnn.device import host_target
    old = import_as(a.old, "tvmrnn_old")
    sides = {}
    for side, pkg in (("old", old), ("new", tvmrnn)):
        sides[side] = tuple(importlib.import_module(f"{pkg.__name__}.{m}")
                            for m in ("cells", "kernels", "default_schedule", "fast_math"))
    target = host_target()
    N, H = a.batch_size, a.hidden_size
    runs = []
    for cell_name in a.cells:
        for name in a.kernels:
            for side, (cells, kernels, ds, fast_math) in sides.items():
                cell = cells.get_cell(cell_name)
                G = cell.num_gates
                panel = ds.weight_panel(target, G, H)
                if name == "projection":
                    k = kernels.input_projection(16, N, H, H, G, panel=panel)
                else:
                    k = kernels.recurrent_step(cell, N, H, name == "train", panel=panel)
                timer, args = kernel_timer(fast_math.vectorisable(ds.default_schedule(k, target)), target,
                                           number=a.number, repeat=1)
                runs.append((f"{cell_name:8s} {name:10s} {side} (panel {panel})",
                             lambda timer=timer, args=args: timer(*args).mean, []))
    for _ in range(a.rounds):
        for _, run, times in runs:
            times.append(1e6 * run())
    print(f"threads {os.environ.get('TVM_NUM_THREADS', 'default')}, old: {a.old}")
    for label, _, times in runs:
        print(f"{label}  {statistics.median(times):9.1f} us (rounds {min(times):.1f}-{max(times):.1f})", flush=True)


if __name__ == "__main__":
    main()
