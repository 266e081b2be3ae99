"""A/B of CPU time loops: a parallel region a step (default) against one region a loop
(``time_loop_regions=True``, since v73 calling each kernel's tiles from the region); built in one
process, calls interleaved, the same inputs, medians (ms), and whether the bits are the same.
(A first version also built v72's region mode, kernels inlined, through an A/B switch since
removed: its lines in region_ab_zen4.txt.)

    TVMRNN_CACHE=off python notes/bench/v73/region_ab.py lstm T N H layers bidirectional(0/1) [reps]
"""
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn

warnings.simplefilter("ignore")
cell, T, N, H, L, bi = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6] == "1"
reps = int(sys.argv[7]) if len(sys.argv) > 7 else 15
rng = np.random.default_rng(0)
torch.manual_seed(0)
module = getattr(torch.nn, cell.upper())(H, H, L, bidirectional=bi)
params = tvmrnn.params_from_torch(module)
x = rng.standard_normal((T, N, H)).astype(np.float32)
dy = rng.standard_normal((T, N, (2 if bi else 1) * H)).astype(np.float32)
runs = {}
for name, opts in [("per step", {}), ("region tiles", {"time_loop_regions": True})]:
    t0 = time.perf_counter()
    rnn = tvmrnn.build(cell, H, H, num_layers=L, bidirectional=bi, batch_size=N,
                       options=tvmrnn.BuildOptions(**opts), cache=False)
    built = time.perf_counter() - t0
    w = rnn.pack_weights(params)
    st = {}

    def fwd(rnn=rnn, w=w, st=st):
        st["y"] = rnn.forward(w, x)[0]

    def ftr(rnn=rnn, w=w, st=st):
        st["r"] = rnn.forward_train(w, x)

    def bwd(rnn=rnn, w=w, st=st):
        st["g"] = rnn.backward(w, st["r"][-1], dy)
    runs[name] = ([fwd, ftr, bwd], st, built)
times = {k: [[], [], []] for k in runs}
for _ in range(reps):
    for k, (fs, _, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter()
            f()
            times[k][i].append(time.perf_counter() - t0)
first = next(iter(runs.values()))[1]
print(f"{cell} T={T} N={N} I=H={H} L={L}{' bi' if bi else ''}, {torch.get_num_threads()} threads, medians of {reps} "
      "(ms): forward, forward_train, backward, training; build (s)")
for k, (fs, st, built) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    same = np.array_equal(st["y"], first["y"]) and all(np.array_equal(np.asarray(st["g"][n]), np.asarray(first["g"][n]))
                                                      for n in first["g"])
    print(f"  {k:14s} {m[0]:8.3f} {m[1]:8.3f} {m[2]:8.3f} {m[1] + m[2]:8.3f}   build {built:5.1f}  same bits {same}",
          flush=True)
