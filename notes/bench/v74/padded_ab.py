"""A/B of the rows a CPU build runs a batch on (tvmrnn.schedules.cpu.padded_batch): v67's rule
(pad only where the steps' register tiles would be one or two rows) against v74's (pad, up to an
eighth more, where that raises the tiles' share of the FMA rate: fewer accumulators than the
device model's busy_accumulators). One process, the same inputs (N rows), calls interleaved,
medians (ms), whether the bits are the same.

    TVMRNN_CACHE=off python notes/bench/v74/padded_ab.py lstm T N H [layers] [reps]
"""
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn
from tvmrnn.runtime import build as build_module
from tvmrnn.schedules import cpu

warnings.simplefilter("ignore")
cell, T, N, H = sys.argv[1], *map(int, sys.argv[2:5])
L = int(sys.argv[5]) if len(sys.argv) > 5 else 1
reps = int(sys.argv[6]) if len(sys.argv) > 6 else 11
new_rule = cpu.padded_batch


def v67_rule(batch, gates, hidden, target):
    lanes = cpu.vector_lanes(target)
    lead_tile = cpu.cpu_column_tile(lanes, hidden, gates)
    guarded = cpu.CPU_GUARDED_STEP_TILES and cpu.guarded_tile(lanes, hidden, gates, lead_tile)
    width = lanes if guarded else lead_tile * gates

    def short(rows):
        return cpu.tile_rows(rows, width, lanes) <= 2 < rows
    if not short(batch):
        return batch
    return next((n for n in range(batch + 1, batch + max(2, batch // 8) + 1) if not short(n)), batch)


torch.manual_seed(0)
module = getattr(torch.nn, cell.upper())(H, H, L)
params = tvmrnn.params_from_torch(module)
rng = np.random.default_rng(0)
x = rng.standard_normal((T, N, H)).astype(np.float32)
dy = rng.standard_normal((T, N, H)).astype(np.float32)
runs = {}
for name, rule in (("v67", v67_rule), ("v74", new_rule)):
    build_module.padded_batch = rule
    rnn = tvmrnn.build(cell, H, H, num_layers=L, batch_size=N, cache=False)
    w = rnn.pack_weights(params)
    st = {}

    def fwd(rnn=rnn, w=w, st=st):
        st["y"] = rnn.forward(w, x)[0]

    def train(rnn=rnn, w=w, st=st):
        ws = rnn.forward_train(w, x)[-1]
        st["g"] = rnn.backward(w, ws, dy)
    runs[name] = (rnn.config.compiled_rows or N, [fwd, train], st)
build_module.padded_batch = new_rule
times = {k: [[], []] for k in runs}
for _ in range(reps):
    for k, (_, fs, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter()
            f()
            times[k][i].append(time.perf_counter() - t0)
first = runs["v67"][2]
print(f"{cell} T={T} N={N} I=H={H} L={L}, {torch.get_num_threads()} threads, medians of {reps} (ms): inference, training")
for k, (rows, _, st) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    same = np.array_equal(st["y"], first["y"]) and all(np.array_equal(np.asarray(st["g"][n]), np.asarray(first["g"][n]))
                                                      for n in first["g"])
    print(f"  {k} rule, {rows:4d} rows  {m[0]:9.3f} {m[1]:9.3f}   same bits {same}", flush=True)
