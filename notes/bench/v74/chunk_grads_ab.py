"""A/B of the CPU backward: every step first, then the gradients chunk by chunk (before v74)
against each chunk's gradients right after its steps (passes.BACKWARD_CHUNK_GRADIENTS); built in
one process, calls interleaved, the same inputs, medians (ms), and whether the bits are the same.

    TVMRNN_CACHE=off python notes/bench/v74/chunk_grads_ab.py lstm T N H layers bidirectional(0/1) [reps] [options JSON]
"""
import json
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn
from tvmrnn.program import passes

warnings.simplefilter("ignore")
cell, T, N, H, L, bi = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6] == "1"
reps = int(sys.argv[7]) if len(sys.argv) > 7 else 11
options = tvmrnn.BuildOptions(**json.loads(sys.argv[8])) if len(sys.argv) > 8 else None
rng = np.random.default_rng(0)
torch.manual_seed(0)
module = getattr(torch.nn, cell.upper())(H, H, L, bidirectional=bi)
params = tvmrnn.params_from_torch(module)
x = rng.standard_normal((T, N, H)).astype(np.float32)
dy = rng.standard_normal((T, N, (2 if bi else 1) * H)).astype(np.float32)
runs = {}
for name, on in (("steps first", False), ("chunk grads", True)):
    passes.BACKWARD_CHUNK_GRADIENTS = on
    rnn = tvmrnn.build(cell, H, H, num_layers=L, bidirectional=bi, batch_size=N, cache=False, options=options)
    w = rnn.pack_weights(params)
    ws = rnn.forward_train(w, x)[-1]
    st = {}

    def bwd(rnn=rnn, w=w, st=st, ws=ws):
        st["g"] = rnn.backward(w, ws, dy)

    def train(rnn=rnn, w=w, st=st):
        rnn.backward(w, rnn.forward_train(w, x)[-1], dy)
    runs[name] = ([bwd, train], st)
times = {k: [[], []] for k in runs}
for _ in range(reps):
    for k, (fs, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter()
            f()
            times[k][i].append(time.perf_counter() - t0)
first = next(iter(runs.values()))[1]
print(f"{cell} T={T} N={N} I=H={H} L={L}{' bi' if bi else ''} {options or ''}, {torch.get_num_threads()} threads, medians of {reps} "
      "(ms): backward, training (forward_train + backward)")
for k, (fs, st) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    same = all(np.array_equal(np.asarray(st["g"][n]), np.asarray(first["g"][n])) for n in first["g"])
    print(f"  {k:12s} {m[0]:9.3f} {m[1]:9.3f}   same bits {same}", flush=True)
