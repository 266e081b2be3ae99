#!/usr/bin/env python3
"""How many steps the all-steps GEMMs take per launch: speed of each choice of chunk sizes.

    python scripts/chunk_study.py lstm gru --chunks 16,1 64,16,1 128,16,1 --device cuda

For each cell at Deep Speech 2 sizes (T=300, N=20, I=H=800) by default, builds the RNN once per
``--chunks`` choice (``tvmrnn.program.passes.CHUNK_STEPS``: the input projection, weight and input gradient
GEMMs run over chunks of the first size while it fits, then the next...), checks every build agrees
with the first, and prints the median inference and training-pass times. The chunk size changes no
buffer (the input projections of all steps are one array either way), only the GEMMs' shapes.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    from bench import study_parser
    p = study_parser(__doc__, reps=10)
    p.add_argument("--chunks", nargs="+", default=["16,1", "64,16,1"], help="comma-separated sizes, ending in 1")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-train", action="store_true", help="time inference only")
    a = p.parse_args()
    if a.threads:
        os.environ["TVM_NUM_THREADS"] = str(a.threads)  # before TVM starts its thread pool
        import torch
        torch.set_num_threads(a.threads)
    from bench import compare_builds
    from tvmrnn.program import passes

    def chunked(sizes):
        def setup():  # build reads them through passes.chunk_steps, for the CPU or the GPU
            passes.CHUNK_STEPS = passes.GPU_CHUNK_STEPS = tuple(int(s) for s in sizes.split(","))
        return setup

    compare_builds(a.cells, [(f"chunks {c}", chunked(c)) for c in a.chunks], device=a.device, T=a.T, N=a.N,
                   hidden_size=a.hidden_size, reps=a.reps, rounds=a.rounds, train=not a.no_train)


if __name__ == "__main__":
    main()
