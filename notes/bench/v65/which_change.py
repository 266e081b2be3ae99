"""Which builds v65's constants change: for each shape, the scheduled module of a CUDA build
(sm_90, no records, before NVCC) with today's constants and with v64's (no forward step split in
GPU_FORWARD_STEP_LONG_SLICE-long slices). Compiles nothing, runs nothing.

    python notes/bench/v65/which_change.py lstm:128:1024 gru:144:768 ...   (cell:N:H)
"""
import importlib.util
import os
import sys
import warnings

from tvmrnn.schedules import cuda

spec = importlib.util.spec_from_file_location("which", os.path.join(os.path.dirname(__file__), "..", "v63", "which_change.py"))
which = importlib.util.module_from_spec(spec)
spec.loader.exec_module(which)

SETTINGS = {
    "v64 (no long forward slices)": [(cuda, "GPU_FORWARD_STEP_LONG_FILL", 1 << 30)],
}

if __name__ == "__main__":
    warnings.simplefilter("ignore")
    for shape in sys.argv[1:]:
        cell, n, h = shape.split(":")
        base = which.digest(cell, int(n), int(h), [])
        changed = [name for name, ch in SETTINGS.items() if which.digest(cell, int(n), int(h), ch) != base]
        print(f"{shape:16s} changed by: {', '.join(changed) or '-'}", flush=True)
