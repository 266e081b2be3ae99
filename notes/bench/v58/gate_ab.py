"""A/B of gate threads in persistent steps (``gpu_row_tiles``, v58), each shape built both ways in
one process; gradients compared, passes timed in turn (11 pairs). Reuses
notes/bench/v57/rules_ab.py's harness.

- default: v58's default (a forward step's persistent tile of independent blocks, one row a
  block, with gate threads and its weights in registers where they fit) against the plain tile
  (``gate_threads=False``, v57's default).
- ``--backward``: gate threads in the backward's persistent step (a thread a (unit, gate), each
  gate's share of the reduction with its weights in registers where they fit, the partial sums
  added by the pointwise's threads; not a default) against the default. Which backward steps
  took them is printed.

    python notes/bench/v58/gate_ab.py lstm:128:96:96:100 gru:128:128:128:200
    python notes/bench/v58/gate_ab.py --backward lstm:128:96:96:100 gru:128:128:128:100
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


def plain(sch, kernel, **tiles):
    DEFAULT(sch, kernel, **{"gate_threads": False, **tiles})


def backward_gate_threads(sch, kernel, **tiles):
    if kernel.name.startswith("backward_step") and tiles.get("max_blocks"):
        try:  # (raises before changing sch where it does not apply)
            DEFAULT(sch, kernel, gate_threads=True, **tiles)
            rules_ab.GATE_THREADS.append(kernel.name)
            return
        except tvm.s_tir.ScheduleError:
            pass
    DEFAULT(sch, kernel, **tiles)


def main(args):
    backward = args[:1] == ["--backward"]
    old, new = (DEFAULT, backward_gate_threads) if backward else (plain, DEFAULT)

    def old_rule(rule):
        schedules.gpu_row_tiles = old

    def new_rule(rule):
        schedules.gpu_row_tiles = new
        return DEFAULT if backward else None  # (the harness restores it and prints the steps)
    rules_ab.old_rule, rules_ab.new_rule = old_rule, new_rule
    rules_ab.main("backward_gate" if backward else "gate_default", args[1:] if backward else args)


if __name__ == "__main__":
    main(sys.argv[1:])
