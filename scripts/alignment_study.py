#!/usr/bin/env python3
"""CPU: the same passes with tvmrnn's own arrays (packed weights, outputs, workspaces, scratch)
64-byte aligned, as they are now, against NumPy's default placement (16 bytes past a page for
large arrays), which they had before v18. Both builds run on the same inputs, in turn, for
``--rounds`` rounds; prints median milliseconds a call and checks the outputs agree.

    python scripts/alignment_study.py lstm gru --threads 2
"""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    from bench import study_parser, torch_rnn
    p = study_parser(__doc__, reps=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-train", action="store_true")
    a = p.parse_args()
    if a.threads:
        os.environ["TVM_NUM_THREADS"] = str(a.threads)
    import numpy as np
    import torch

    import tvmrnn
    from tvmrnn.runtime import arrays
    if a.threads:
        torch.set_num_threads(a.threads)
    N, H, T = a.N, a.hidden_size, a.T

    def numpy_default(shape, dtype=np.float32):
        return np.empty(shape, dtype)

    for cell in a.cells:
        torch.manual_seed(0)
        params = tvmrnn.params_from_torch(torch_rnn(cell, H, H, 1, False))
        x = np.random.default_rng(0).standard_normal((T, N, H)).astype(np.float32)
        dy = np.random.default_rng(1).standard_normal((T, N, H)).astype(np.float32)
        sides = {}
        for label, patch in (("numpy default (before)", True), ("64-byte aligned (now)", False)):
            with mock.patch.object(arrays, "aligned_empty", numpy_default) if patch else contextlib.nullcontext():
                rnn = tvmrnn.build(cell, input_size=H, hidden_size=H, batch_size=N)
                w = rnn.pack_weights(params)
            sides[label] = (rnn, w, patch)
        results = {}
        times = {(label, p): [] for label in sides for p in (["inference"] + ([] if a.no_train else ["training"]))}
        for _ in range(a.rounds):
            for (label, pass_), out in times.items():
                rnn, w, patch = sides[label]
                with mock.patch.object(arrays, "aligned_empty", numpy_default) if patch else contextlib.nullcontext():
                    fn = (lambda: rnn.forward(w, x)) if pass_ == "inference" else (
                        lambda: rnn.backward(w, rnn.forward_train(w, x)[3], dy))
                    results[label, pass_] = fn()
                    for _ in range(a.reps):
                        t0 = time.perf_counter()
                        fn()
                        out.append(1e3 * (time.perf_counter() - t0))
        for (label, pass_), out in times.items():
            r = results[label, pass_]
            first = results[next(iter(sides)), pass_]
            a_, b_ = (r[0], first[0]) if pass_ == "inference" else (r["x"], first["x"])
            diff = float(np.abs(a_ - b_).max())
            print(f"{cell:9s} {pass_:10s} {label:24s} {statistics.median(out):9.1f} ms  "
                  f"({N / statistics.median(out) * 1e3:6.1f} samples/s; calls {min(out):.0f}-{max(out):.0f})  "
                  f"max diff {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
