"""v71: a bidirectional LSTMP with both directions in one launch a step (stack_directions=True, the
default on CPUs of 8 cores or more) against one direction at a time, one process, the same
inputs, medians; outputs and every gradient compared bit for bit.

    python notes/bench/v71/lstmp_stacked_ab.py T N I H P L
"""
import sys, time, warnings, numpy as np, torch
warnings.simplefilter("ignore")
import tvmrnn
T, N, I, H, P, L = map(int, sys.argv[1:7])
torch.manual_seed(0)
ref = torch.nn.LSTM(I, H, num_layers=L, bidirectional=True, proj_size=P)
params = tvmrnn.params_from_torch(ref)
rnns = []
for st in (False, True):
    r = tvmrnn.build("lstm", I, H, num_layers=L, bidirectional=True, batch_size=N, proj_size=P, tuning_logs=False, cache=False,
                     options=tvmrnn.BuildOptions(threads=2, stack_directions=st))
    rnns.append((r, r.pack_weights(params)))
x = np.random.default_rng(0).standard_normal((T, N, I)).astype(np.float32)
dy = np.ones((T, N, 2 * P), np.float32)
res = []
for r, w in rnns:
    y, _, _, ws = r.forward_train(w, x); g = r.backward(w, ws, dy); res.append([y] + [g[k] for k in sorted(g)])
print("same bits:", all(np.array_equal(a, b) for a, b in zip(*res)), "max diff", max(float(np.abs(a - b).max()) for a, b in zip(*res)))
def t(f, n):
    f(); ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return 1e3 * np.median(ts)
def train(r, w):
    _, _, _, ws = r.forward_train(w, x); r.backward(w, ws, dy)
for rep in range(3):
    print("LSTMP T=%d N=%d H=%d P=%d L=%d bi: inference %.2f -> %.2f ms, training %.2f -> %.2f ms (unstacked -> stacked)" % (
        T, N, H, P, L, t(lambda: rnns[0][0].forward(rnns[0][1], x), 9), t(lambda: rnns[1][0].forward(rnns[1][1], x), 9),
        t(lambda: train(*rnns[0]), 5), t(lambda: train(*rnns[1]), 5)), flush=True)
