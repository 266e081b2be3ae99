"""A/B of cpu.CPU_GUARDED_ROWS_UNBLOCKED (guarded row tiles without L1 blocks) on this machine with an
AVX2 target (mcpu znver3): both builds in one process, the same inputs, calls interleaved, medians
(ms) of inference and training (forward_train + backward), and the largest difference of outputs
and gradients between the two builds.

    TVMRNN_CACHE=off python notes/bench/v82/avx2_unblocked_ab.py cell T N I H layers [reps]
"""
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn
from tvmrnn.schedules import cpu

warnings.simplefilter("ignore")
cell, T, N, I, H, L = sys.argv[1], *map(int, sys.argv[2:7])
reps = int(sys.argv[7]) if len(sys.argv) > 7 else 9
target = {"kind": "llvm", "mcpu": "znver3", "num-cores": torch.get_num_threads()}
rng = np.random.default_rng(0)
torch.manual_seed(0)
params = tvmrnn.params_from_torch(getattr(torch.nn, cell.upper())(I, H, L))
x = rng.standard_normal((T, N, I)).astype(np.float32)
dy = rng.standard_normal((T, N, H)).astype(np.float32)
runs = {}
for name, on in (("blocked", False), ("unblocked", True)):
    cpu.CPU_GUARDED_ROWS_UNBLOCKED = on
    rnn = tvmrnn.build(cell, I, H, num_layers=L, batch_size=N, target=target, cache=False, tuning_logs=False)
    w = rnn.pack_weights(params)
    out = {"y": np.asarray(rnn.forward(w, x)[0])}
    out.update({k: np.asarray(v) for k, v in rnn.backward(w, rnn.forward_train(w, x)[-1], dy).items()})

    def inf(rnn=rnn, w=w):
        rnn.forward(w, x)

    def train(rnn=rnn, w=w):
        rnn.backward(w, rnn.forward_train(w, x)[-1], dy)
    runs[name] = ([inf, train], out, rnn.config.packed_units)
times = {k: [[], []] for k in runs}
for _ in range(reps):
    for k, (fs, _, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter()
            f()
            times[k][i].append(time.perf_counter() - t0)
(_, a, _), (_, b, _) = runs.values()
diff = max(float(np.abs(a[k] - b[k]).max() / max(1e-30, np.abs(a[k]).max())) for k in a)
print(f"{cell} T={T} N={N} I={I} H={H} L={L}, AVX2 (znver3), {torch.get_num_threads()} threads, medians of {reps} (ms): "
      f"inference, training; largest relative difference between the builds {diff:.1e}")
for k, (fs, _, units) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    print(f"  {k:18s} units {units:5d} {m[0]:9.3f} {m[1]:9.3f}", flush=True)
