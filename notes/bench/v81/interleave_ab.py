"""A/B of BuildOptions(interleave_projections=...) on the CPU: chunk projections and gradients
between the steps (True) against every step first (False); built in one process, calls
interleaved, the same inputs, medians (ms): inference, backward, training.

    TVMRNN_CACHE=off python notes/bench/v81/interleave_ab.py lstm T N I H layers bidirectional(0/1) [reps]
"""
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn

warnings.simplefilter("ignore")
cell, T, N, I, H, L, bi = sys.argv[1], *map(int, sys.argv[2:7]), sys.argv[7] == "1"
reps = int(sys.argv[8]) if len(sys.argv) > 8 else 9
rng = np.random.default_rng(0)
torch.manual_seed(0)
module = getattr(torch.nn, cell.upper())(I, H, L, bidirectional=bi)
params = tvmrnn.params_from_torch(module)
x = rng.standard_normal((T, N, I)).astype(np.float32)
dy = rng.standard_normal((T, N, (2 if bi else 1) * H)).astype(np.float32)
runs = {}
for name, on in (("interleaved", True), ("steps first", False), ("default", None)):
    rnn = tvmrnn.build(cell, I, H, num_layers=L, bidirectional=bi, batch_size=N, cache=False,
                       tuning_logs=False, options=tvmrnn.BuildOptions(interleave_projections=on))
    w = rnn.pack_weights(params)
    ws = rnn.forward_train(w, x)[-1]
    st = {}

    def inf(rnn=rnn, w=w):
        rnn.forward(w, x)

    def bwd(rnn=rnn, w=w, st=st, ws=ws):
        st["g"] = rnn.backward(w, ws, dy)

    def train(rnn=rnn, w=w):
        rnn.backward(w, rnn.forward_train(w, x)[-1], dy)
    runs[name] = ([inf, bwd, train], st)
times = {k: [[], [], []] for k in runs}
for _ in range(reps):
    for k, (fs, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter()
            f()
            times[k][i].append(time.perf_counter() - t0)
print(f"{cell} T={T} N={N} I={I} H={H} L={L}{' bi' if bi else ''}, {torch.get_num_threads()} threads, medians of {reps} "
      "(ms): inference, backward, training")
for k, (fs, st) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    print(f"  {k:12s} {m[0]:9.3f} {m[1]:9.3f} {m[2]:9.3f}", flush=True)
