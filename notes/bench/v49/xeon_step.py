"""The bf16 and fp32 DS2 LSTM step kernels alone, and the forward pass, at several thread counts."""
import os, sys, time, statistics, json
import numpy as np, tvm, tvmrnn
from tvmrnn.runtime.profile import time_kernel
T = 100
out = {}
for dtype in ("bfloat16", "float32"):
    for threads in [int(t) for t in sys.argv[1:]]:
        t0 = time.time()
        rnn = tvmrnn.build("lstm", 800, 800, batch_size=20, dtype=dtype, options=tvmrnn.BuildOptions(threads=threads))
        prog = rnn.programs["forward"]
        name = next(n for n in prog.calls(T) if "recurrent_step" in n)
        us = time_kernel(prog.scheduled(name), rnn.target, number=200)
        x = np.random.default_rng(0).standard_normal((T, 20, 800)).astype(np.float32)
        import torch
        params = tvmrnn.params_from_torch(torch.nn.LSTM(800, 800))
        w = rnn.pack_weights(params)
        xt = torch.from_numpy(x).to(torch.bfloat16) if dtype == "bfloat16" else torch.from_numpy(x)
        for _ in range(3): rnn.forward(w, xt)
        ts = []
        for _ in range(7):
            t1 = time.perf_counter(); rnn.forward(w, xt); ts.append(time.perf_counter() - t1)
        ms = 1e3 * statistics.median(ts)
        print(f"{dtype} threads={threads}: step alone {us:.1f} us; forward T={T} {ms:.2f} ms ({1e3*ms/T:.1f} us a step); build {time.time()-t0:.0f} s", flush=True)
