"""A/B of the chunk GEMMs' ended-row skip (v72): a variable-lengths build whose input projections and
input gradients skip ended rows (new) against the same build without (old, as v71), and the
padded build, in one process, calls interleaved, the same inputs; checks the two masked builds
give the same bits.

    TVMRNN_CACHE=off python notes/bench/v72/skip_ended_ab.py lstm -T 100 -N 20 -H 256
"""
import argparse
import statistics
import time
import warnings

import numpy as np
import torch

import tvmrnn
import tvmrnn.program.passes as passes

warnings.simplefilter("ignore")
p = argparse.ArgumentParser()
p.add_argument("cell", default="lstm")
p.add_argument("-T", type=int, default=100)
p.add_argument("-N", type=int, default=20)
p.add_argument("-H", type=int, default=256)
p.add_argument("-I", type=int, default=0)
p.add_argument("--layers", type=int, default=1)
p.add_argument("--reps", type=int, default=9)
p.add_argument("--unsorted", action="store_true")
a = p.parse_args()
T, N, H, I = a.T, a.N, a.H, a.I or a.H
rng = np.random.default_rng(0)
lengths = rng.integers(T // 2, T + 1, N)
lengths[0] = T
if not a.unsorted:
    lengths = np.sort(lengths)[::-1].copy()
kw = dict(num_layers=a.layers, bidirectional=True, batch_size=N)
var = tvmrnn.options.BuildOptions(variable_lengths=True)
forward, backward = passes.forward_program, passes.backward_program
passes.forward_program = lambda *x, **k: forward(*x, **{**k, "skip_ended": False})
passes.backward_program = lambda *x, **k: backward(*x, **{**k, "skip_ended": False})
old = tvmrnn.build(a.cell, I, H, options=var, **kw)
passes.forward_program, passes.backward_program = forward, backward
new = tvmrnn.build(a.cell, I, H, options=var, **kw)
pad = tvmrnn.build(a.cell, I, H, **kw)
torch.manual_seed(0)
module = torch.nn.RNN(I, H, a.layers, nonlinearity=a.cell[4:], bidirectional=True) if a.cell.startswith("rnn_") \
    else getattr(torch.nn, a.cell.upper())(I, H, a.layers, bidirectional=True)
params = tvmrnn.params_from_torch(module)
x = rng.standard_normal((T, N, I)).astype(np.float32)
dy = rng.standard_normal((T, N, 2 * H)).astype(np.float32)


def sides(rnn, lens):
    w = rnn.pack_weights(params)
    kwl = dict(lengths=lens) if lens is not None else {}
    st = {}

    def fwd():
        st["y"] = rnn.forward(w, x, **kwl)[0]

    def ftr():
        st["r"] = rnn.forward_train(w, x, **kwl)

    def bwd():
        st["g"] = rnn.backward(w, st["r"][-1], dy)
    return [fwd, ftr, bwd], st


runs = {"padded": sides(pad, None), "packed v71": sides(old, lengths), "packed skip": sides(new, lengths)}
times = {k: [[], [], []] for k in runs}
for _ in range(a.reps):
    for k, (fs, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter()
            f()
            times[k][i].append(time.perf_counter() - t0)
so, sn = runs["packed v71"][1], runs["packed skip"][1]
same = np.array_equal(so["y"], sn["y"]) and all(np.array_equal(np.asarray(so["g"][k]), np.asarray(sn["g"][k]))
                                                 for k in so["g"])
print(f"{a.cell} T={T} N={N} I={I} H={H} layers={a.layers} bidirectional, lengths fill "
      f"{lengths.sum() / (T * N):.2f}{' unsorted' if a.unsorted else ''}; masked builds bit-identical: {same}")
for k, v in times.items():
    med = [statistics.median(t) * 1e3 for t in v]
    print(f"  {k:12s} inference {med[0]:7.2f} ms  training {med[1] + med[2]:7.2f} ms "
          f"(forward_train {med[1]:.2f}, backward {med[2]:.2f})")
