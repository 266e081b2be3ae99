"""v71's GPU runbook item: CUDA builds with projections (which `build` refuses until
tests/test_cuda.py::test_projection_builds_match_torch_on_cuda passes on a GPU) against cuDNN's LSTMP,
through tvmrnn-bench with the refusal patched out in this process. Arguments as tvmrnn-bench's:

    python notes/bench/v71/gpu_lstmp.py lstm --device cuda -T 100 -N 16 --input-size 512 --hidden-size 1024 --proj-size 256
"""
import sys

import tvmrnn.runtime.build as building
from tvmrnn.cli import bench

building.projections_refused = lambda config, target: None
bench.main(sys.argv[1:])
