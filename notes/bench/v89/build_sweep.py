"""v89: do random held-out-like shapes build? Compile only (no run), for the given targets, a shape
at a time; prints each failure. ``python build_sweep.py SEED COUNT TARGET_JSON...``"""
import json
import random
import sys
import time
import warnings

import tvmrnn

seed, count = int(sys.argv[1]), int(sys.argv[2])
targets = [json.loads(t) if t.startswith("{") else t for t in sys.argv[3:]]
rng = random.Random(seed)
warnings.simplefilter("ignore")
failed = 0
for i in range(count):
    cell = rng.choice(("lstm", "gru"))
    H = int(round(2 ** rng.uniform(6, 11)))
    N = rng.choice((1, 2, 3, 5, 8, 13, 16, 20, 24, 32, 48, 57, 64, 96, 100, 128, 129, 160, 192, 200, 256))
    I = rng.choice((H, H, 40, 161, 512, 1024))
    L = rng.choice((1, 1, 2, 3))
    bi = rng.random() < 0.3
    for target in targets:
        t0 = time.time()
        try:
            tvmrnn.build(cell, I, H, num_layers=L, bidirectional=bi, batch_size=N, target=target, cache=False,
                         tuning_logs=False)
            status = "ok"
        except Exception as e:  # noqa: BLE001
            failed += 1
            status = f"FAILED {type(e).__name__}: {str(e)[-160:]}"
        print(f"{cell} N={N} I={I} H={H} L={L}{' bi' if bi else ''} {json.dumps(target)}: {status} "
              f"({time.time() - t0:.0f} s)", flush=True)
print(f"{failed} failed")
