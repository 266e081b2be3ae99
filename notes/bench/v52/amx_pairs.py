"""bf16 builds on AMX with the microkernel's row pairs (``bf16.AMX_ROW_PAIRS``) against without: one
process, the same inputs, calls interleaved; medians of ms a pass (inference; training: forward_train
+ backward), and the largest difference between the two outputs.

python3 notes/bench/v52/amx_pairs.py [threads [cell:T:N:H ...]]"""
import statistics, sys, time
import numpy as np
import torch
import tvmrnn
from tvmrnn.schedules import bf16

threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
shapes = sys.argv[2:] or ["lstm:50:20:512", "lstm:50:20:800", "gru:50:64:256", "lstm:50:8:256", "lstm:30:160:384"]
target = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": threads}
for shape in shapes:
    cell, T, N, H = shape.split(":")
    T, N, H = int(T), int(N), int(H)
    rng = np.random.default_rng(0)
    builds = {}
    for pairs in (False, True):
        bf16.AMX_ROW_PAIRS = pairs
        rnn = tvmrnn.build(cell, H, H, batch_size=N, dtype="bfloat16", target=target, cache=False, tuning_logs=False)
        params = {s.name: torch.from_numpy(rng.uniform(-0.05, 0.05, s.torch_shape).astype(np.float32))
                  for s in rnn.config.layout.slots} \
            if not builds else builds[False][2]
        builds[pairs] = (rnn, rnn.pack_weights(params), params)
    bf16.AMX_ROW_PAIRS = True
    x = torch.from_numpy(rng.standard_normal((T, N, H)).astype(np.float32)).bfloat16()
    dy = torch.from_numpy(rng.standard_normal((T, N, H)).astype(np.float32)).bfloat16()
    ys = {p: b[0].forward(b[1], x)[0] for p, b in builds.items()}
    diff = float((ys[True].float() - ys[False].float()).abs().max())
    row = []
    for mode in ("infer", "train"):
        times = {p: [] for p in builds}
        for _ in range(7):
            for p, (rnn, w, _) in builds.items():
                t0 = time.perf_counter()
                if mode == "infer":
                    rnn.forward(w, x)
                else:
                    y, hy, cy, ws = rnn.forward_train(w, x)
                    rnn.backward(w, ws, dy)
                times[p].append(time.perf_counter() - t0)
        single, pairs_ = (1e3 * statistics.median(times[p]) for p in (False, True))
        row.append(f"{mode} single {single:.2f} ms, pairs {pairs_:.2f} ms ({single / pairs_:.2f}x)")
    print(f"{shape} ({threads} threads): " + "; ".join(row) + f"; max |y diff| {diff:.1e}", flush=True)
