"""Which builds v66's constant changes: for each shape, the scheduled module of a CUDA build
(sm_90, no records, before NVCC) with today's constants and with each of v65's (a step of both
directions takes the tiled GEMM only from GPU_ROW_TILE_ROWS rows a direction; its split counts
one direction's tiles). Compiles nothing, runs nothing.

    python notes/bench/v66/which_change.py lstm:64:2048:bi gru:100:1024:bi ...   (cell:N:H[:bi])
"""
import importlib.util
import os
import sys

from tvmrnn.schedules import common, cuda

spec = importlib.util.spec_from_file_location("which", os.path.join(os.path.dirname(__file__), "..", "v63", "which_change.py"))
which = importlib.util.module_from_spec(spec)
spec.loader.exec_module(which)

SETTINGS = {
    "v65 (stacked steps by their own rows)": [(common, "GPU_STACKED_MATMUL_ROWS", 1 << 30)],
    "v65 (a step's slices by one direction)": [(cuda, "GPU_STEP_SLICES_COUNT_DIRECTIONS", False)],
}

if __name__ == "__main__":
    which.report(SETTINGS, sys.argv[1:])
