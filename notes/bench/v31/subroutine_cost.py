"""CPU kernels called as functions (``BuildOptions.shared_kernels``, each kernel compiled once)
against kernels embedded at each call site (the build before v31): build time and pass speed.
Each configuration is built both ways in one process (the host CPU's records), then timed
alternately on the same inputs; the two must agree. python subroutine_cost.py [T N I H [CONFIGS]]
(default DS2: 300 20 800 800; CONFIGS comma-separated cell[:layers[:bidir]], default
"lstm,gru,rnn_relu,lstm:2:bidir"; REPS: timed rounds, default 7; CALLED_FIRST=1 builds and times the
called build first)."""
import os
import statistics
import sys
import time

import numpy as np
import torch

import tvmrnn

T, N, I, H = (int(v) for v in sys.argv[1:5]) if len(sys.argv) > 4 else (300, 20, 800, 800)
CONFIGS = sys.argv[5].split(",") if len(sys.argv) > 5 else ["lstm", "gru", "rnn_relu", "lstm:2:bidir"]
MODULES = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU,
           "rnn_relu": lambda i, h, **kw: torch.nn.RNN(i, h, nonlinearity="relu", **kw),
           "rnn_tanh": torch.nn.RNN}


def main():
    print(f"T={T} N={N} I={I} H={H}; torch threads {torch.get_num_threads()}", flush=True)
    for config in CONFIGS:
        cell, layers, bidir = (config.split(":") + ["1", ""])[:3]
        layers, bidir = int(layers), bidir == "bidir"
        rnns, build_s = {}, {}
        order = (("inline", False), ("called", True))
        for name, shared in (order[::-1] if os.environ.get("CALLED_FIRST") else order):
            t0 = time.perf_counter()
            rnns[name] = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=layers, bidirectional=bidir,
                                      batch_size=N, cache=False, options=tvmrnn.BuildOptions(shared_kernels=shared))
            build_s[name] = time.perf_counter() - t0
        torch.manual_seed(0)
        params = tvmrnn.params_from_torch(MODULES[cell](I, H, num_layers=layers, bidirectional=bidir))
        rng = np.random.default_rng(0)
        D = 2 if bidir else 1
        x = rng.standard_normal((T, N, I)).astype(np.float32)
        dy = rng.standard_normal((T, N, D * H)).astype(np.float32)
        ws = {k: r.pack_weights(params) for k, r in rnns.items()}
        results = {}
        times = {(k, p): [] for k in rnns for p in ("inference", "training")}
        for _ in range(int(os.environ.get("REPS", "7"))):
            for k, r in rnns.items():
                t0 = time.perf_counter()
                y = r.forward(ws[k], x)[0]
                t1 = time.perf_counter()
                yt, _, _, w = r.forward_train(ws[k], x)
                g = r.backward(ws[k], w, dy)
                t2 = time.perf_counter()
                times[(k, "inference")].append(t1 - t0)
                times[(k, "training")].append(t2 - t1)
                results[k] = [np.asarray(y)] + [np.asarray(v) for v in g.values()]
        agree = max(float(np.abs(a - b).max()) for a, b in zip(results["inline"], results["called"]))
        print(f"{config:14s} build s: inline {build_s['inline']:6.1f}  called {build_s['called']:6.1f}"
              f"   (max |diff| {agree:.1e})", flush=True)
        for p in ("inference", "training"):
            med = {k: statistics.median(times[(k, p)]) for k in rnns}
            print(f"{config:14s} {p:9s} samples/s: inline {N / med['inline']:8.1f}  called {N / med['called']:8.1f}"
                  f"  called/inline {med['inline'] / med['called']:.3f}", flush=True)


main()
