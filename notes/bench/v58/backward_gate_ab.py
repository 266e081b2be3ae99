"""A/B of gate threads in the backward's persistent step (``gpu_row_tiles(gate_threads=True)`` on
``backward_step`` kernels: a thread a (unit, gate), each gate's share of the reduction summed with
its weights in registers where they fit, the partial sums added by the pointwise's threads; v58,
not a default) against the default, each shape built both ways in one process; gradients
compared, passes timed in turn (11 pairs). Which backward steps took it is printed.
Reuses notes/bench/v57/rules_ab.py's harness.

    python notes/bench/v58/backward_gate_ab.py lstm:128:96:96:100 gru:128:128:128:200
"""
import importlib.util
import os
import sys

import tvm

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)

import tvmrnn.schedules as schedules  # noqa: E402

DEFAULT = schedules.gpu_row_tiles


def backward_gate_threads(sch, kernel, **tiles):
    if kernel.name.startswith("backward_step") and tiles.get("max_blocks"):
        try:  # (raises before changing sch where it does not apply)
            DEFAULT(sch, kernel, gate_threads=True, **tiles)
            rules_ab.GATE_THREADS.append(kernel.name)
            return
        except tvm.s_tir.ScheduleError:
            pass
    DEFAULT(sch, kernel, **tiles)


def old_rule(rule):
    schedules.gpu_row_tiles = DEFAULT


def new_rule(rule):
    schedules.gpu_row_tiles = backward_gate_threads
    return DEFAULT


rules_ab.old_rule, rules_ab.new_rule = old_rule, new_rule

if __name__ == "__main__":
    rules_ab.main("backward_gate", sys.argv[1:])
