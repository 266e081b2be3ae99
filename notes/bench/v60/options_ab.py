"""A/B of build options (v60): each shape built with the defaults and with OPTIONS (a JSON of
``tvmrnn.BuildOptions`` fields) in one process; both builds' gradients on the same inputs compared
(v57's ``rules_ab.gradients``), build times printed, passes timed in turn
(``pass_tuning.compare``, 11 interleaved pairs).

    python notes/bench/v60/options_ab.py '{"chunk_steps": [256, 128, 64, 32, 4, 1]}' lstm:128:128:128:200
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

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)


def main(options, shapes):
    warnings.simplefilter("ignore")
    for shape in shapes:
        cell, n, h, i, T = shape.split(":")
        n, h, T = int(n), int(h), int(T)
        sizes = dict(input_size=int(i), hidden_size=h, batch_size=n, target=os.environ.get("TARGET", "cuda"),
                     tuning_logs=False, cache=False)
        t0 = time.perf_counter()
        before = tvmrnn.build(cell, **sizes)
        t1 = time.perf_counter()
        after = tvmrnn.build(cell, options=tvmrnn.BuildOptions(**options), **sizes)
        t2 = time.perf_counter()
        a, b = rules_ab.gradients(before, cell, n, h, T), rules_ab.gradients(after, cell, n, h, T)
        err = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a)
        result = pass_tuning.compare(before, after, pass_tuning.PassTimer(T), pairs=11)
        print(f"{shape} build {t1 - t0:.0f} -> {t2 - t1:.0f} s; gradients agree to {err:.1e}; default -> options, "
              f"{result.line()}", flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2:])
