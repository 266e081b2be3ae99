"""A/B of v58's default (a forward step's persistent tile of independent blocks with gate threads
and its weights in registers, where they fit) against the plain tile (``gate_threads=False``,
v57's default), each shape built both ways in one process; gradients compared, passes timed in
turn (11 pairs). Reuses notes/bench/v57/rules_ab.py's harness.

    python notes/bench/v58/gate_ab.py lstm:128:96:96:100 gru:128:128:128:200
"""
import importlib.util
import os
import sys

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)

import tvmrnn.schedules as schedules  # noqa: E402

DEFAULT = schedules.gpu_row_tiles


def old_rule(rule):
    schedules.gpu_row_tiles = lambda sch, kernel, **tiles: DEFAULT(sch, kernel, **{"gate_threads": False, **tiles})


def new_rule(rule):
    schedules.gpu_row_tiles = DEFAULT
    return None


rules_ab.old_rule, rules_ab.new_rule = old_rule, new_rule

if __name__ == "__main__":
    rules_ab.main("gate_default", sys.argv[1:])
