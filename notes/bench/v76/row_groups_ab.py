"""A/B of persistent steps of row groups (v76, ``common.GPU_ROW_GROUP_STEPS``): each shape
``cell:N:H:I:T[:bi]`` built with it (the default) and without, in one process; both builds'
inference outputs and training gradients on the same inputs compared (largest difference relative
to the largest value), then the passes timed in turn (``pass_tuning.compare``, 11 pairs).

    python notes/bench/v76/row_groups_ab.py lstm:13:90:90:100 gru:32:128:128:100
"""
import importlib.util
import os
import sys
import time
import warnings

import numpy as np

import tvmrnn
from tvmrnn.runtime import pass_tuning
from tvmrnn.schedules import common

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)


def outputs(rnn, cell, n, h, T):
    rng = np.random.default_rng(1)
    G = {"lstm": 4, "gru": 3}.get(cell, 1)
    D = 2 if rnn.config.bidirectional else 1
    i = rnn.config.input_size
    params = {}
    for suffix in ("", "_reverse")[:D]:
        params.update({f"weight_ih_l0{suffix}": rng.uniform(-0.3, 0.3, (G * h, i)),
                       f"weight_hh_l0{suffix}": rng.uniform(-0.3, 0.3, (G * h, h)),
                       f"bias_ih_l0{suffix}": rng.uniform(-0.3, 0.3, G * h),
                       f"bias_hh_l0{suffix}": rng.uniform(-0.3, 0.3, G * h)})
    w = rnn.pack_weights({k: v.astype(np.float32) for k, v in params.items()})
    x = rng.standard_normal((T, n, i)).astype(np.float32)
    if rnn.target.kind.name == "cuda":
        import torch
        x = torch.from_numpy(x).cuda()
    y = rnn.forward(w, x)[0]
    return y.cpu().numpy() if hasattr(y, "cpu") else np.asarray(y)


def main(shapes):
    warnings.simplefilter("ignore")
    for shape in shapes:
        cell, n, h, i, T, *bi = shape.split(":")
        n, h, T = int(n), int(h), int(T)
        sizes = dict(input_size=int(i), hidden_size=h, batch_size=n, target=os.environ.get("TARGET", "cuda"),
                     tuning_logs=False, cache=False, bidirectional=bi == ["bi"])
        t0 = time.perf_counter()
        new = tvmrnn.build(cell, **sizes)
        common.GPU_ROW_GROUP_STEPS = False
        try:
            old = tvmrnn.build(cell, **sizes)
        finally:
            common.GPU_ROW_GROUP_STEPS = True
        steps = [k for k in new.schedules if "_persistent" in k]
        ya, yb = outputs(old, cell, n, h, T), outputs(new, cell, n, h, T)
        y_err = float(np.abs(ya - yb).max() / max(np.abs(ya).max(), 1e-30))
        a, b = rules_ab.gradients(old, cell, n, h, T), rules_ab.gradients(new, cell, n, h, T)
        g_err = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a)
        result = pass_tuning.compare(old, new, pass_tuning.PassTimer(T), pairs=11)
        print(f"{shape} builds {time.perf_counter() - t0:.0f} s; blocks {old.persistent_blocks} -> {new.persistent_blocks}; "
              f"steps {steps}; outputs agree to {y_err:.1e}, gradients to {g_err:.1e}; old -> row groups, {result.line()}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
