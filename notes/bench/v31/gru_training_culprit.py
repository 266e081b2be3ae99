"""Which kernels make the GRU's training slower when called (v31): builds with every kernel
called except one group embedded, timed alternately against all-embedded and all-called builds
(DS2 sizes, host CPU records). python gru_training_culprit.py [CELL]"""
import statistics
import sys
import time

import numpy as np
import torch

import tvmrnn
from tvmrnn.program import sequence

CELL = sys.argv[1] if len(sys.argv) > 1 else "gru"
T, N, I, H = 300, 20, 800, 800
GROUPS = ["input_projection", "input_gradient", "weight_gradient", "bias_gradient", "pointwise_backward",
          "backward_step", "recurrent_backward", "recurrent_step", "gate_untranspose", "copy", "fill_zero"]
callable_ = sequence.Subroutines.callable


def build(inline_prefix=None, shared=True):
    def pick(func):
        name = str(func.attrs.get("global_symbol", "")) if func.attrs else ""
        if inline_prefix and name.startswith(inline_prefix):
            return False
        return callable_(func)
    sequence.Subroutines.callable = staticmethod(pick)
    try:
        return tvmrnn.build(CELL, input_size=I, hidden_size=H, batch_size=N, cache=False,
                            options=tvmrnn.BuildOptions(shared_kernels=shared))
    finally:
        sequence.Subroutines.callable = staticmethod(callable_)


rnns = {"inline": build(shared=False), "called": build()}
for g in GROUPS:
    rnns["called-but-" + g] = build(g)
torch.manual_seed(0)
params = tvmrnn.params_from_torch({"gru": torch.nn.GRU, "lstm": torch.nn.LSTM}[CELL](I, H))
rng = np.random.default_rng(0)
x = rng.standard_normal((T, N, I)).astype(np.float32)
dy = rng.standard_normal((T, N, H)).astype(np.float32)
ws = {k: r.pack_weights(params) for k, r in rnns.items()}
times = {k: [] for k in rnns}
for _ in range(9):
    for k, r in rnns.items():
        t0 = time.perf_counter()
        y, _, _, w = r.forward_train(ws[k], x)
        r.backward(ws[k], w, dy)
        times[k].append(time.perf_counter() - t0)
base = statistics.median(times["inline"])
for k in rnns:
    print(f"{CELL} training {k:32s} {N / statistics.median(times[k]):7.1f} samples/s  vs inline {base / statistics.median(times[k]):.3f}")
