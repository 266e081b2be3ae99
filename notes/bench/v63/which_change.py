"""Which builds a default constant changes (v63): for each shape, the scheduled module of a CUDA
build (sm_90, no records, before NVCC) with the constants as they are and with each setting of
SETTINGS; prints the settings that change it. Compiles nothing, runs nothing.

    python notes/bench/v63/which_change.py lstm:256:1024 gru:20:800 ...   (cell:N:H, or cell:N:H:bi)
"""
import hashlib
import sys
import warnings

import tvmrnn
import tvmrnn.runtime.build as build_module
from tvmrnn.schedules import common, cuda, split_k

SETTINGS = {  # (run first at v63's first commit, against v62's constants; these are today's, reverted)
    "v62 split": [(cuda, "GPU_STEP_MATMUL_K_SLICES", False)],
    "v62 split+outputs": [(cuda, "GPU_STEP_MATMUL_K_SLICES", False), (common, "GPU_BACKWARD_STEP_MATMUL_OUTPUTS", 1 << 18)],
    "forward split": [(cuda, "GPU_FORWARD_STEP_K_SLICES", True)],
    "columns4": [(split_k, "GPU_SPLIT_K_WIDE_UNITS", 1 << 30)],
}
for module, name, _ in (c for changes in SETTINGS.values() for c in changes):
    assert hasattr(module, name), name


class Captured(Exception):
    pass


def digest(cell, n, h, changes, bidirectional=False):
    old = [(m, k, getattr(m, k)) for m, k, _ in changes]
    for m, k, v in changes:
        setattr(m, k, v)
    seen = {}

    def capture(module, target):
        seen["text"] = module.script()
        raise Captured

    saved = build_module.compile_module
    build_module.compile_module = capture
    try:
        tvmrnn.build(cell, input_size=h, hidden_size=h, batch_size=n, bidirectional=bidirectional, target={"kind": "cuda", "arch": "sm_90"},
                     tuning_logs=False, cache=False)
    except Captured:
        pass
    finally:
        build_module.compile_module = saved
        for m, k, v in old:
            setattr(m, k, v)
    return hashlib.sha1(seen["text"].encode()).hexdigest()[:10]


def report(settings: dict, shapes) -> None:
    """For each ``cell:N:H`` (``cell:N:H:bi``: bidirectional) of ``shapes``, the names of
    ``settings`` whose changes change its build."""
    warnings.simplefilter("ignore")
    for shape in shapes:
        cell, n, h, *bi = shape.split(":")
        base = digest(cell, int(n), int(h), [], bi == ["bi"])
        changed = [name for name, ch in settings.items() if digest(cell, int(n), int(h), ch, bi == ["bi"]) != base]
        print(f"{shape:16s} changed by: {', '.join(changed) or '-'}", flush=True)


if __name__ == "__main__":
    report(SETTINGS, sys.argv[1:])
