#!/usr/bin/env python3
"""Persistent GPU time loops against per-step launches, and the persistent kernel's split-K shape.

    python scripts/persistent_study.py lstm gru rnn_tanh --reps 10

For each cell, at Deep Speech 2 sizes (T=300, N=20, I=H=800) by default: builds the forward with
per-step launches (the default) and with persistent loops (``TVMRNN_PERSISTENT=1``) for each shape in SHAPES
(``default_schedule.PERSISTENT_TILES``), checks each agrees with the first, and prints the median
inference and training-pass times. Needs a CUDA GPU.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SHAPES = ({"accumulators": 96}, {"accumulators": 48}, {"accumulators": 24}, {"accumulators": 48, "threads": 128})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cells", nargs="*", default=["lstm"])
    p.add_argument("-T", type=int, default=300)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    import torch
    import tvmrnn
    from tvmrnn import default_schedule

    def median_ms(fn):
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    H = a.hidden_size
    for cell in a.cells:
        torch.manual_seed(0)
        x = torch.randn(a.T, a.N, H, device="cuda")
        dy = torch.randn(a.T, a.N, H, device="cuda")
        module = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU if cell == "gru" else torch.nn.RNN)(H, H).cuda()
        params = tvmrnn.params_from_torch(module)  # the same weights for every build
        ref = None
        for shape in [None, *SHAPES]:
            os.environ["TVMRNN_PERSISTENT"] = "0" if shape is None else "1"  # read by build
            if shape is not None:
                default_schedule.PERSISTENT_TILES = dict(shape)
            rnn = tvmrnn.build(cell, input_size=H, hidden_size=H, batch_size=a.N, target="cuda", tuning_logs=False)
            w = rnn.pack_weights(params)
            y = rnn.forward(w, x)[0]
            ref = y if ref is None else ref
            err = float((y - ref).abs().max() / ref.abs().max())
            infer = median_ms(lambda: rnn.forward(w, x))
            train = median_ms(lambda: rnn.backward(w, rnn.forward_train(w, x)[3], dy))
            name = "per-step launches" if shape is None else f"persistent {shape}"
            print(f"{cell:9s} {name:48s} inference {infer:7.2f} ms ({a.N / infer * 1e3:7.1f}/s)  "
                  f"training {train:7.2f} ms ({a.N / train * 1e3:7.1f}/s)  max rel diff {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
