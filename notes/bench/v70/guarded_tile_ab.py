"""v70: A/B of cpu.CPU_GUARDED_TILES (False: v69's tile, a divisor of the columns up to one
vector; True: one whole vector, the last tile guarded and peeled by TIR's LoopPartition) on this
host's CPU (or TGT, a target dict), one process: both builds' forward outputs and gradients
compared, then inference and a training step (forward_train + backward) timed in turn, medians,
two rounds (ROUNDS). AB=NAME A/Bs another of the module's switches, False -> True.

    python notes/bench/v70/guarded_tile_ab.py lstm 50 13 129 129        # cell T N I H
"""
import os, sys, time, warnings, numpy as np, torch
warnings.simplefilter("ignore")
import tvmrnn, tvmrnn.schedules.cpu as c
cell, T, N, I, H = sys.argv[1], *map(int, sys.argv[2:6])
torch.set_num_threads(2)
threads = int(os.environ.get("THREADS", 0)) or None  # tvmrnn's threads (default: its own, all cores)
x = np.random.default_rng(0).standard_normal((T, N, I)).astype(np.float32)
target = eval(os.environ["TGT"]) if "TGT" in os.environ else None
switch = os.environ.get("AB", "CPU_GUARDED_TILES")  # another of cpu's switches, False -> True
default = getattr(c, switch)
rnns = []
for v in (False, True):
    setattr(c, switch, v)
    r = tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, target=target, tuning_logs=False, cache=False,
                     options=tvmrnn.BuildOptions(threads=threads))
    G = {"lstm": 4, "gru": 3}.get(cell, 1)
    rng = np.random.default_rng(1)
    w = r.pack_weights({"weight_ih_l0": rng.uniform(-.1, .1, (G*H, I)).astype(np.float32),
                        "weight_hh_l0": rng.uniform(-.1, .1, (G*H, H)).astype(np.float32),
                        "bias_ih_l0": rng.uniform(-.1, .1, G*H).astype(np.float32),
                        "bias_hh_l0": rng.uniform(-.1, .1, G*H).astype(np.float32)})
    rnns.append((r, w))
setattr(c, switch, default)
def t(f, n=15):
    ts = []
    for _ in range(n):
        a = time.perf_counter(); f(); ts.append(time.perf_counter() - a)
    return np.median(ts) * 1e3
outs = [np.asarray(r.forward(w, x)[0]) for r, w in rnns]
print("forward max diff", float(np.abs(outs[0] - outs[1]).max()))
dy = np.random.default_rng(2).standard_normal((T, N, H)).astype(np.float32)
grads = []
for r, w in rnns:
    _, *_, ws = r.forward_train(w, x)
    grads.append({k: np.asarray(v) for k, v in r.backward(w, ws, dy=dy).items()})
print("gradient max diff", {k: float(np.abs(grads[0][k] - grads[1][k]).max()) for k in grads[0]})
dy = np.ones((T, N, H), np.float32)
def train(r, w):
    _, *_, ws = r.forward_train(w, x); r.backward(w, ws, dy=dy)
for rep in range(int(os.environ.get("ROUNDS", 2))):
    print("inference %.3f -> %.3f ms; training %.3f -> %.3f ms" % (
        t(lambda: rnns[0][0].forward(rnns[0][1], x)), t(lambda: rnns[1][0].forward(rnns[1][1], x)),
        t(lambda: train(*rnns[0]), 5), t(lambda: train(*rnns[1]), 5)), flush=True)
