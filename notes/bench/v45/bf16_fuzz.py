"""Ad-hoc: random bf16 CPU builds against torch.nn in float64 (bf16-rounded inputs and weights)."""
import random, sys, traceback
import numpy as np, torch
import tvmrnn
sys.path.insert(0, "tests")
from conftest import check_half_build
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
rng = random.Random(seed)
fails = 0
for case in range(int(sys.argv[2]) if len(sys.argv) > 2 else 20):
    cell = rng.choice(["lstm", "gru", "rnn_tanh", "rnn_relu"])
    I = rng.randint(1, 70); H = rng.choice([rng.randint(1, 70), 16 * rng.randint(1, 5)])
    layers = rng.randint(1, 2); bidir = rng.random() < 0.5
    N = rng.randint(1, 9); n = rng.randint(1, N)
    desc = f"{cell} I={I} H={H} L={layers} bi={bidir} N={N} n={n}"
    try:
        check_half_build(cell, I, H, layers, bidir, "bfloat16", target=None, device="cpu",
                         bound=(2e-2, 6e-2), N=N, n=n)
        print("ok  ", desc, flush=True)
    except Exception as e:
        fails += 1
        print("FAIL", desc, type(e).__name__, str(e)[:300], flush=True)
print("fails", fails)
