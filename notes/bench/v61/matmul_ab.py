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
import warnings

import tvmrnn
from tvmrnn.schedules import cuda

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)


def main(knobs, shapes):
    warnings.simplefilter("ignore")
    default = dict(cuda.GPU_MATMUL)

    def with_knobs(cell, sizes):
        cuda.GPU_MATMUL.update(knobs)
        try:
            return tvmrnn.build(cell, **sizes)
        finally:
            cuda.GPU_MATMUL.clear(); cuda.GPU_MATMUL.update(default)
    for shape in shapes:
        rules_ab.ab(shape, lambda cell, sizes: tvmrnn.build(cell, **sizes), with_knobs, "default -> knobs")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2:])
