#!/usr/bin/env python3
"""How many steps the all-steps GEMMs take per launch: speed of each choice of chunk sizes.

    python scripts/chunk_study.py lstm gru --chunks 16,1 64,16,1 128,16,1 --device cuda

For each cell at Deep Speech 2 sizes (T=300, N=20, I=H=800) by default, builds the RNN once per
``--chunks`` choice (``tvmrnn.passes.CHUNK_STEPS``: the input projection, weight and input gradient
GEMMs run over chunks of the first size while it fits, then the next...), checks every build agrees
with the first, and prints the median inference and training-pass times. The chunk size changes no
buffer (the input projections of all steps are one array either way), only the GEMMs' shapes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cells", nargs="*", default=["lstm"])
    p.add_argument("--chunks", nargs="+", default=["16,1", "64,16,1"], help="comma-separated sizes, ending in 1")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("-T", type=int, default=300)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--reps", type=int, default=10)
    a = p.parse_args()
    import torch
    import tvmrnn
    from tvmrnn import passes

    if a.threads:
        torch.set_num_threads(a.threads)
        os.environ["TVM_NUM_THREADS"] = str(a.threads)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)

    def median_ms(fn):
        fn()
        sync()
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return 1e3 * statistics.median(times)

    H = a.hidden_size
    for cell in a.cells:
        torch.manual_seed(0)
        x = torch.randn(a.T, a.N, H, device=a.device)
        dy = torch.randn(a.T, a.N, H, device=a.device)
        module = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU if cell == "gru" else torch.nn.RNN)(H, H)
        params = tvmrnn.params_from_torch(module.to(a.device))
        ref = None
        for chunks in a.chunks:
            passes.CHUNK_STEPS = tuple(int(s) for s in chunks.split(","))
            t0 = time.perf_counter()
            rnn = tvmrnn.build(cell, input_size=H, hidden_size=H, batch_size=a.N,
                               target="cuda" if a.device == "cuda" else None, tuning_logs=False)
            built = time.perf_counter() - t0
            w = rnn.pack_weights(params)
            y = rnn.forward(w, x)[0]
            ref = y if ref is None else ref
            err = float((y - ref).abs().max() / ref.abs().max())
            infer = median_ms(lambda: rnn.forward(w, x))
            train = median_ms(lambda: rnn.backward(w, rnn.forward_train(w, x)[3], dy))
            print(f"{cell:9s} chunks {chunks:12s} inference {infer:7.2f} ms ({a.N / infer * 1e3:7.1f}/s)  "
                  f"training {train:7.2f} ms ({a.N / train * 1e3:7.1f}/s)  max rel diff {err:.1e}  "
                  f"build {built:.0f} s", flush=True)


if __name__ == "__main__":
    main()
