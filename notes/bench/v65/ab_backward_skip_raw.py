"""v65: the raw backward pass (rnn.backward) of a variable-lengths build with the backward steps'
skip of ended rows and without, rows sorted longest first (a PackedSequence's order), lengths
over [T/2, T], bidirectional, I = H = 256, T = 100; interleaved, medians in ms. TVMRNN_CACHE=off.

    python notes/bench/v65/ab_backward_skip_raw.py lstm 20
"""
import statistics
import sys
import time

import numpy as np

import tvmrnn
from tvmrnn.schedules import ended_rows

cell, N = sys.argv[1], int(sys.argv[2])
T, I, H = 100, 256, 256
orig = ended_rows.skip_ended_rows
rnns = {}
for name in ("skip", "forward only"):
    ended_rows.skip_ended_rows = orig if name == "skip" else (
        lambda f, gemm, mask="mask": orig(f, gemm) if mask == "mask" else f)
    rnns[name] = tvmrnn.build(cell, I, H, bidirectional=True, batch_size=N, cache=False,
                              options=tvmrnn.BuildOptions(variable_lengths=True))
ended_rows.skip_ended_rows = orig
rng = np.random.default_rng(0)
params = {k: (rng.standard_normal(v.shape) * 0.06).astype(np.float32)
          for k, v in rnns["skip"].param_shapes().items()} if hasattr(rnns["skip"], "param_shapes") else None
if params is None:
    import torch
    torch.manual_seed(0)
    params = tvmrnn.params_from_torch({"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H, bidirectional=True))
lengths = np.sort(rng.integers(T // 2, T + 1, N))[::-1].copy()
x = rng.standard_normal((T, N, I)).astype(np.float32)
dy = rng.standard_normal((T, N, 2 * H)).astype(np.float32)
state = {}
for name, rnn in rnns.items():
    w = rnn.pack_weights(params)
    ws = rnn.forward_train(w, x, lengths=lengths)[3]
    state[name] = (w, ws)
g = {name: rnn.backward(*state[name], dy) for name, rnn in rnns.items()}
print("same bits:", all(np.array_equal(g["skip"][k], g["forward only"][k]) for k in g["skip"]))
ts = {k: [] for k in rnns}
for _ in range(int(sys.argv[3]) if len(sys.argv) > 3 else 30):
    for name, rnn in rnns.items():
        t0 = time.perf_counter(); rnn.backward(*state[name], dy); ts[name].append(time.perf_counter() - t0)
print(cell, N, "backward ms:", {k: round(1e3 * statistics.median(v), 2) for k, v in ts.items()})
