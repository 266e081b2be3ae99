#!/usr/bin/env python3
"""Persistent GPU time loops against per-step launches, and the persistent kernel's split-K shape.

    python scripts/persistent_study.py lstm gru rnn_tanh --reps 10

For each cell, at Deep Speech 2 sizes (T=300, N=20, I=H=800) by default: builds the forward with
per-step launches (``TVMRNN_PERSISTENT=0``) and with persistent loops (``TVMRNN_PERSISTENT=1``) for each shape in SHAPES
(changes to ``default_schedule.PERSISTENT_TILES``; ``{}`` is the default, ``stationary_bytes: 0``
the weights read from global memory at every step), checks each agrees with the first, and prints the median
inference and training-pass times. Needs a CUDA GPU.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = ({}, {"stationary_bytes": 0}, {"accumulators": 96}, {"accumulators": 24}, {"threads": 512},
          {"threads": 512, "accumulators": 24}, {"threads": 1024, "accumulators": 24}, {"threads": 1024, "accumulators": 12},
          {"threads": 512, "accumulators": 24, "stage_rows": True}, {"threads": 1024, "accumulators": 24, "stage_rows": True},
          {"threads": 512, "accumulators": 12, "stage_rows": True}, {"threads": 512, "accumulators": 48, "stage_rows": True},
          # v15: vector operand loads, staged epilogue inputs, both (neither the default: no gain beyond
          # the ~10% run-to-run spread), and more accumulators or threads with partial sums past 48 KB
          {"vector_k": 1, "stage_epilogue": False}, {"vector_k": 4, "stage_epilogue": False},
          {"vector_k": 1, "stage_epilogue": True}, {"vector_k": 4, "stage_epilogue": True},
          {"vector_k": 4, "accumulators": 80, "max_shared_bytes": 64 * 1024},
          {"vector_k": 4, "accumulators": 40, "threads": 1024, "max_shared_bytes": 72 * 1024})


def main():
    from bench import study_parser
    p = study_parser(__doc__, reps=10)
    p.add_argument("--shapes", type=int, nargs="*", help="indices into SHAPES (default: all)")
    p.add_argument("--shape", type=json.loads, action="append", default=[],
                   help='another shape, as JSON (\'{"unroll": 10}\'); repeatable')
    p.add_argument("--no-train", action="store_true", help="time inference only")
    p.add_argument("--no-per-step", action="store_true", help="leave out the per-step-launch build")
    p.add_argument("--no-barrier", action="store_true",
                   help="leave the grid barrier out (wrong results: times what the barrier costs)")
    a = p.parse_args()
    shapes = [SHAPES[i] for i in a.shapes] if a.shapes is not None else ([] if a.shape else list(SHAPES))
    shapes += a.shape
    from bench import compare_builds
    from tvmrnn import schedules as default_schedule
    DEFAULT = dict(default_schedule.PERSISTENT_TILES)
    if a.no_barrier:
        from tvmrnn.program import sequence
        sequence.GRID_BARRIER = False
        print("--no-barrier: persistent results are wrong (no barrier between steps); timing only")

    def launched():
        os.environ["TVMRNN_PERSISTENT"] = "0"  # read by build

    def persistent(shape):
        def setup():
            os.environ["TVMRNN_PERSISTENT"] = "1"
            default_schedule.PERSISTENT_TILES = {**DEFAULT, **shape}
        return setup

    variants = [] if a.no_per_step else [("per-step launches", launched)]
    compare_builds(a.cells, variants + [(f"persistent {s}", persistent(s)) for s in shapes],
                   device="cuda", T=a.T, N=a.N, hidden_size=a.hidden_size, reps=a.reps, rounds=a.rounds, train=not a.no_train)


if __name__ == "__main__":
    main()
