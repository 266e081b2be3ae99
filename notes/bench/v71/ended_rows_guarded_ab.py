"""v71: the ended-row skip (tvmrnn.schedules.ended_rows) on steps with guarded tiles, which v70's
skip declined (a predicate): a variable-lengths build with and without the skip, one process,
rows sorted longest first with lengths over [T/2, T] (a PackedSequence's order), the two builds'
inference and training in turn, medians; outputs and gradients compared (the same bits).

    python notes/bench/v71/ended_rows_guarded_ab.py cell T N I H
"""
import sys, time, warnings, numpy as np
warnings.simplefilter("ignore")
import tvmrnn
from tvmrnn.schedules import ended_rows
cell, T, N, I, H = sys.argv[1], *map(int, sys.argv[2:6])
G = {"lstm": 4, "gru": 3}.get(cell, 1)
rng = np.random.default_rng(0)
params = {"weight_ih_l0": rng.uniform(-.1, .1, (G * H, I)).astype(np.float32),
          "weight_hh_l0": rng.uniform(-.1, .1, (G * H, H)).astype(np.float32),
          "bias_ih_l0": rng.uniform(-.1, .1, G * H).astype(np.float32),
          "bias_hh_l0": rng.uniform(-.1, .1, G * H).astype(np.float32)}
real = ended_rows.skip_ended_rows
builds = []
for skip in (False, True):
    ended_rows.skip_ended_rows = real if skip else (lambda func, gemm, mask="mask": func)
    r = tvmrnn.build(cell, I, H, batch_size=N, options=tvmrnn.BuildOptions(variable_lengths=True, threads=2),
                     cache=False, tuning_logs=False)
    builds.append((r, r.pack_weights(params)))
ended_rows.skip_ended_rows = real
x = rng.standard_normal((T, N, I)).astype(np.float32)
lengths = np.sort(rng.integers(T // 2, T + 1, N))[::-1].copy()
dy = np.ones((T, N, H), np.float32)
res = []
for r, w in builds:
    y, hy, cy, ws = r.forward_train(w, x, lengths=lengths)
    g = r.backward(w, ws, dy)
    res.append([y, hy] + [g[k] for k in sorted(g)])
print("same bits:", all(np.array_equal(a, b) for a, b in zip(*res)))


def t(f, n):
    f()
    ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return 1e3 * np.median(ts)


def train(r, w):
    _, _, _, ws = r.forward_train(w, x, lengths=lengths)
    r.backward(w, ws, dy)


for rep in range(3):
    print("%s T=%d N=%d H=%d: inference %.3f -> %.3f ms, training %.3f -> %.3f ms (skip off -> on)" % (
        cell, T, N, H, t(lambda: builds[0][0].forward(builds[0][1], x, lengths=lengths), 11),
        t(lambda: builds[1][0].forward(builds[1][1], x, lengths=lengths), 11),
        t(lambda: train(*builds[0]), 5), t(lambda: train(*builds[1]), 5)), flush=True)
