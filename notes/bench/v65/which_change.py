"""Which builds v65's constants change: for each shape, the scheduled module of a CUDA build
(sm_90, no records, before NVCC) with today's constants and with v64's (no forward step split in
GPU_FORWARD_STEP_LONG_SLICE-long slices). Compiles nothing, runs nothing.

    python notes/bench/v65/which_change.py lstm:128:1024 gru:144:768 ...   (cell:N:H)
"""
import importlib.util
import os
import sys

from tvmrnn.schedules import cuda

spec = importlib.util.spec_from_file_location("which", os.path.join(os.path.dirname(__file__), "..", "v63", "which_change.py"))
which = importlib.util.module_from_spec(spec)
spec.loader.exec_module(which)

SETTINGS = {
    "v64 (no long forward slices)": [(cuda, "GPU_FORWARD_STEP_LONG_FILL", 1 << 30)],
}

if __name__ == "__main__":
    which.report(SETTINGS, sys.argv[1:])
