"""Which builds v64's constants change: for each shape, the scheduled module of a CUDA build
(sm_90, no records, before NVCC) with today's constants and with v63's (forward steps never split
by default, so that no large step below 160 rows launches). Compiles nothing, runs nothing.

    python notes/bench/v64/which_change.py lstm:128:1024 gru:144:768 ...   (cell:N:H)
"""
import importlib.util
import os
import sys

from tvmrnn.schedules import cuda

spec = importlib.util.spec_from_file_location("which", os.path.join(os.path.dirname(__file__), "..", "v63", "which_change.py"))
which = importlib.util.module_from_spec(spec)
spec.loader.exec_module(which)

SETTINGS = {
    "v63 (no forward split)": [(cuda, "GPU_FORWARD_STEP_FILL", 1 << 30)],
}

if __name__ == "__main__":
    which.report(SETTINGS, sys.argv[1:])
