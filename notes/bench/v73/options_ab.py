"""A/B of BuildOptions at one shape: builds with each variant, then forward, forward_train and
backward of each, calls interleaved, the same inputs, medians (ms); checks every variant against
the first.

    TVMRNN_CACHE=off python notes/bench/v73/options_ab.py lstm -T 100 -N 17 -H 160 \
        --variants '{}' '{"time_loop_regions": true}'
"""
import argparse
import json
import statistics
import time
import warnings

import numpy as np
import torch

import tvmrnn

warnings.simplefilter("ignore")
p = argparse.ArgumentParser()
p.add_argument("cell", default="lstm")
p.add_argument("-T", type=int, default=100)
p.add_argument("-N", type=int, default=20)
p.add_argument("-H", type=int, default=256)
p.add_argument("-I", type=int, default=0)
p.add_argument("--layers", type=int, default=1)
p.add_argument("--bidirectional", action="store_true")
p.add_argument("--reps", type=int, default=15)
p.add_argument("--variants", nargs="+", default=["{}"])
a = p.parse_args()
T, N, H, I = a.T, a.N, a.H, a.I or a.H
rng = np.random.default_rng(0)
kw = dict(num_layers=a.layers, bidirectional=a.bidirectional, batch_size=N)
torch.manual_seed(0)
module = getattr(torch.nn, a.cell.upper())(I, H, a.layers, bidirectional=a.bidirectional)
params = tvmrnn.params_from_torch(module)
x = rng.standard_normal((T, N, I)).astype(np.float32)
dy = rng.standard_normal((T, N, (2 if a.bidirectional else 1) * H)).astype(np.float32)
runs = {}
for v in a.variants:
    t0 = time.perf_counter()
    rnn = tvmrnn.build(a.cell, I, H, options=tvmrnn.BuildOptions(**json.loads(v)), **kw)
    w = rnn.pack_weights(params)
    st = {}

    def fwd(rnn=rnn, w=w, st=st):
        st["y"] = rnn.forward(w, x)[0]

    def ftr(rnn=rnn, w=w, st=st):
        st["r"] = rnn.forward_train(w, x)

    def bwd(rnn=rnn, w=w, st=st):
        st["g"] = rnn.backward(w, st["r"][-1], dy)
    runs[v] = ([fwd, ftr, bwd], st)
    print(f"built {v} in {time.perf_counter() - t0:.1f} s", flush=True)
times = {k: [[], [], []] for k in runs}
for _ in range(a.reps):
    for k, (fs, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter()
            f()
            times[k][i].append(time.perf_counter() - t0)
first = next(iter(runs.values()))[1]
print(f"{a.cell} T={T} N={N} I={I} H={H} layers={a.layers}{' bidirectional' if a.bidirectional else ''}, "
      f"{torch.get_num_threads()} threads, medians of {a.reps} (ms): forward, forward_train, backward, training")
for k, (fs, st) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    dy_ = max(float(np.abs(np.asarray(st["y"]) - np.asarray(first["y"])).max()), 0.0)
    dg = max(float(np.abs(np.asarray(st["g"][n]) - np.asarray(first["g"][n])).max()) for n in first["g"])
    print(f"  {k:50s} {m[0]:8.3f} {m[1]:8.3f} {m[2]:8.3f} {m[1] + m[2]:8.3f}   |dy| {dy_:.1e} |dgrad| {dg:.1e}")
