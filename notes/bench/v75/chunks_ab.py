"""v75: A/B of CPU chunk sizes (BuildOptions.chunk_steps) at small batches: the default ladder
against others, one process, calls interleaved, medians (ms), the max difference of the gradients.

    TVMRNN_CACHE=off python notes/bench/v75/chunks_ab.py lstm T N I H LAYERS "16,4,1" "64,16,4,1" ...
"""
import statistics, sys, time, warnings
import numpy as np, torch
import tvmrnn
from tvmrnn import BuildOptions
warnings.simplefilter("ignore")
cell = sys.argv[1]; T, N, I, H, L = map(int, sys.argv[2:7]); ladders = [tuple(map(int, a.split(","))) for a in sys.argv[7:]]
torch.manual_seed(0)
module = getattr(torch.nn, cell.upper())(I, H, L)
params = tvmrnn.params_from_torch(module)
rng = np.random.default_rng(0)
x = rng.standard_normal((T, N, I)).astype(np.float32); dy = rng.standard_normal((T, N, H)).astype(np.float32)
runs = {}
for ladder in ladders:
    rnn = tvmrnn.build(cell, I, H, num_layers=L, batch_size=N, cache=False, options=BuildOptions(chunk_steps=ladder))
    w = rnn.pack_weights(params); st = {}
    def fwd(rnn=rnn, w=w, st=st): st["y"] = np.asarray(rnn.forward(w, x)[0])
    def train(rnn=rnn, w=w, st=st):
        ws = rnn.forward_train(w, x)[-1]; st["g"] = rnn.backward(w, ws, dy)
    runs[ladder] = ([fwd, train], st)
times = {k: [[], []] for k in runs}
for _ in range(7):
    for k, (fs, _) in runs.items():
        for i, f in enumerate(fs):
            t0 = time.perf_counter(); f(); times[k][i].append(time.perf_counter() - t0)
first = runs[ladders[0]][1]
for k, (fs, st) in runs.items():
    m = [statistics.median(t) * 1e3 for t in times[k]]
    diff = max(float(np.abs(np.asarray(st["g"][n]) - np.asarray(first["g"][n])).max()) for n in first["g"])
    print(f"{cell} T={T} N={N} I={I} H={H} L={L} chunks {k}: inference {m[0]:8.2f} training {m[1]:8.2f} ms  grad diff {diff:.1e}", flush=True)
