"""A/B of the tiled GEMM's default (v61): each shape built with ``cuda.GPU_MATMUL`` as it is and
with KNOBS (a JSON of ``gpu_matmul`` arguments, e.g. ``{"async_stages": 3}``) merged into it, in one
process; both builds' gradients on the same inputs compared (v57's ``rules_ab.gradients``), build
times printed, passes timed in turn (``pass_tuning.compare``, 11 interleaved pairs).

    python notes/bench/v61/matmul_ab.py '{"async_stages": 3}' lstm:256:1024:1024:50
"""
import importlib.util
import json
import os
import sys
import time
import warnings

import numpy as np

import tvmrnn
from tvmrnn.runtime import pass_tuning
from tvmrnn.schedules import cuda

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)


def main(knobs, shapes):
    warnings.simplefilter("ignore")
    default = dict(cuda.GPU_MATMUL)
    for shape in shapes:
        cell, n, h, i, T = shape.split(":")
        n, h, T = int(n), int(h), int(T)
        sizes = dict(input_size=int(i), hidden_size=h, batch_size=n, target=os.environ.get("TARGET", "cuda"),
                     tuning_logs=False, cache=False)
        t0 = time.perf_counter()
        cuda.GPU_MATMUL.clear(); cuda.GPU_MATMUL.update(default)
        before = tvmrnn.build(cell, **sizes)
        t1 = time.perf_counter()
        cuda.GPU_MATMUL.update(knobs)
        after = tvmrnn.build(cell, **sizes)
        t2 = time.perf_counter()
        cuda.GPU_MATMUL.clear(); cuda.GPU_MATMUL.update(default)
        a, b = rules_ab.gradients(before, cell, n, h, T), rules_ab.gradients(after, cell, n, h, T)
        err = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a)
        result = pass_tuning.compare(before, after, pass_tuning.PassTimer(T), pairs=11)
        print(f"{shape} build {t1 - t0:.0f} -> {t2 - t1:.0f} s; gradients agree to {err:.1e}; default -> knobs, "
              f"{result.line()}", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2:])
