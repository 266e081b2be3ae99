"""v69: A/B of cpu.CPU_PARTIAL_TILE_VECTORS (None: the tile before v69; VALUE, default 1) on this
host's CPU (or TGT, a target dict, e.g. TGT='{"kind":"llvm","mcpu":"haswell","num-cores":2}' for
AVX2 code), one process: both builds' forward outputs compared, then inference and a training
step (forward_train + backward) timed in turn, medians, two rounds.

    python notes/bench/v69/partial_tile_ab.py gru 40 7 300 300        # cell T N I H [VALUE]
"""
import sys, time, warnings, numpy as np, torch
warnings.simplefilter("ignore")
import tvmrnn, tvmrnn.schedules.cpu as c
cell, T, N, I, H = sys.argv[1], *map(int, sys.argv[2:6])
val = eval(sys.argv[6]) if len(sys.argv) > 6 else 1
torch.set_num_threads(2)
x = np.random.default_rng(0).standard_normal((T, N, I)).astype(np.float32)
rnns = []
for v in (None, val):
    c.CPU_PARTIAL_TILE_VECTORS = v
    r = tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, target=(eval(__import__("os").environ["TGT"]) if "TGT" in __import__("os").environ else None), tuning_logs=False, cache=False)
    G = {"lstm": 4, "gru": 3}.get(cell, 1)
    rng = np.random.default_rng(1)
    w = r.pack_weights({"weight_ih_l0": rng.uniform(-.1,.1,(G*H,I)).astype(np.float32), "weight_hh_l0": rng.uniform(-.1,.1,(G*H,H)).astype(np.float32),
                        "bias_ih_l0": rng.uniform(-.1,.1,G*H).astype(np.float32), "bias_hh_l0": rng.uniform(-.1,.1,G*H).astype(np.float32)})
    rnns.append((r, w))
c.CPU_PARTIAL_TILE_VECTORS = None
def t(f, n=15):
    ts=[]
    for _ in range(n):
        a=time.perf_counter(); f(); ts.append(time.perf_counter()-a)
    return np.median(ts)*1e3
outs = [np.asarray(r.forward(w, x)[0]) for r, w in rnns]
print("max diff", float(np.abs(outs[0]-outs[1]).max()))
dy = np.ones((T, N, H), np.float32)
def train(r, w):
    _, *_, ws = r.forward_train(w, x); r.backward(w, ws, dy=dy)
for rep in range(2):
    print("inference %.3f -> %.3f ms; training %.3f -> %.3f ms" % (t(lambda: rnns[0][0].forward(rnns[0][1], x)), t(lambda: rnns[1][0].forward(rnns[1][1], x)),
          t(lambda: train(*rnns[0]), 5), t(lambda: train(*rnns[1]), 5)), flush=True)
