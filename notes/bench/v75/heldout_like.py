"""v75: random shapes over the range issue 37 names for its held-out set (LSTM and GRU, H 64-2048,
N 1-256, T 50-1000, 1 layer or stacked, either direction), written as a `tvmrnn-bench --sweep` file.
Each shape's forward multiply-adds are capped (T shortened, never below 50) so a sweep fits one call.

    python3 notes/bench/v75/heldout_like.py SEED COUNT MAX_GFLOP > sweep.json
"""
import json
import random
import sys

seed, count, cap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
rng = random.Random(seed)
out = []
while len(out) < count:
    H = int(round(2 ** rng.uniform(6, 11)))
    N = rng.choice((1, 2, 3, 5, 8, 13, 16, 20, 24, 32, 48, 57, 64, 96, 100, 128, 129, 160, 192, 200, 256))
    I = rng.choice((H, H, 40, 161, 512, 1024))
    L = rng.choice((1, 1, 2, 3))
    D = rng.random() < 0.3
    T = rng.choice((50, 75, 100, 200, 300, 500, 700, 1000))
    gates = 4
    def gflop(t):
        d = 2 if D else 1
        per = sum(2 * gates * H * ((I if l == 0 else H * d) + H) for l in range(L))
        return per * N * t * d / 1e9
    while T > 50 and gflop(T) > cap:
        T = max(50, T // 2)
    if gflop(T) > cap * 2:
        continue
    out.append(dict(cell=["lstm", "gru"], T=T, batch_size=N, input_size=I, hidden_size=H, num_layers=L,
                    bidirectional=D))
print("[\n" + ",\n".join(" " + json.dumps(s) for s in out) + "\n]")
