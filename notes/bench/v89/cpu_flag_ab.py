"""v89: A/B of module constants on a CPU (SWITCHES="mod.NAME=old:new;...", old None: the current
value; default: tvmrnn.schedules.cpu.CPU_PADDED_GRADIENT_PANELS False -> True). Each shape
``cell:N:H:I:T[:L][:bi]`` is built both ways in one process (TARGET: a JSON target, default this
CPU); both builds' outputs and gradients compared on the same inputs (drop-in modules' parameters);
the inference and training passes timed in turn (``pass_tuning.compare``, PAIRS pairs, medians).

    python notes/bench/v89/cpu_flag_ab.py lstm:13:354:354:50 lstm:20:247:161:62
"""
import ast
import importlib
import json
import os
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn
from tvmrnn.runtime import pass_tuning


def _gradients(rnn, params, x, dy):
    w = rnn.pack_weights(params)
    y, hy, cy, ws = rnn.forward_train(w, x)
    return y, rnn.backward(w, ws, dy)


def main(shapes):
    warnings.simplefilter("ignore")
    specs = os.environ.get("SWITCHES", "tvmrnn.schedules.cpu.CPU_PADDED_GRADIENT_PANELS=False:True")
    switches = []
    for spec in specs.split(";"):
        path, values = spec.split("=")
        module, name = path.rsplit(".", 1)
        module = importlib.import_module(module)
        old_s, new_s = values.split(":")
        old_v = getattr(module, name) if old_s == "None" else ast.literal_eval(old_s)
        switches.append((module, name, old_v, ast.literal_eval(new_s), getattr(module, name)))
    target = json.loads(os.environ["TARGET"]) if "TARGET" in os.environ else None

    def setting(i):  # 2: as saved
        for module, attr, *values in switches:
            setattr(module, attr, values[i])
    rng = np.random.default_rng(0)
    for shape in shapes:
        cell, n, h, i, T, *rest = shape.split(":")
        n, h, i, T = int(n), int(h), int(i), int(T)
        L = int(rest[0]) if rest and rest[0].isdigit() else 1
        bi = "bi" in rest
        sizes = dict(input_size=i, hidden_size=h, batch_size=n, num_layers=L, bidirectional=bi, target=target,
                     tuning_logs=False, cache=False)
        t0 = time.perf_counter()
        try:
            rnns = []
            for side in (0, 1):
                setting(side)
                rnns.append(tvmrnn.build(cell, **sizes))
        finally:
            setting(2)
        built_s = time.perf_counter() - t0
        ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](i, h, num_layers=L, bidirectional=bi)
        params = tvmrnn.params_from_torch(ref)
        x = rng.standard_normal((T, n, i)).astype(np.float32)
        dy = rng.standard_normal((T, n, h * (2 if bi else 1))).astype(np.float32)
        (ya, ga), (yb, gb) = (_gradients(r, params, x, dy) for r in rnns)
        y_err = float(np.abs(ya - yb).max() / max(np.abs(ya).max(), 1e-30))
        g_err = max(float(np.abs(ga[k] - gb[k]).max() / max(np.abs(ga[k]).max(), 1e-30)) for k in ga)
        result = pass_tuning.compare(rnns[0], rnns[1], pass_tuning.PassTimer(T), pairs=int(os.environ.get("PAIRS", 11)))
        kernels = sorted({k for k in rnns[1].schedules if k.startswith(("weight_gradient", "gradient_panels"))})
        print(f"{shape} {','.join(s[1] for s in switches)} {[s[2] for s in switches]} -> {[s[3] for s in switches]}: "
              f"builds {built_s:.0f} s; outputs agree to {y_err:.1e}, gradients to {g_err:.1e}; {result.line()}; "
              f"new's {kernels[:4]}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
