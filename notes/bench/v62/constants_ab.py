"""A/B of default constants (v62): each shape built as it is and with ASSIGNMENTS (``module.NAME=JSON``,
semicolon-separated, e.g. ``tvmrnn.schedules.common.GPU_PERSISTENT_SPLIT_K_ROWS=128``) set for the
second build, in one process; both builds' gradients on the same inputs compared (v57's
``rules_ab.gradients``), build times printed, passes timed in turn (``pass_tuning.compare``, 11
interleaved pairs). Only a constant read from its own module at build time takes effect (not one
imported by name elsewhere).

    python notes/bench/v62/constants_ab.py tvmrnn.schedules.common.GPU_PERSISTENT_SPLIT_K_ROWS=128 lstm:128:1024:1024:50
"""
import importlib
import importlib.util
import json
import os
import sys
import warnings

import tvmrnn

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)


def parse(assignments):
    out = []
    for item in assignments.split(";"):
        path, value = item.split("=", 1)
        module, name = path.rsplit(".", 1)
        module = importlib.import_module(module)
        if not hasattr(module, name):
            raise SystemExit(f"{module.__name__} has no {name}")
        out.append((module, name, json.loads(value)))
    return out


def main(assignments, shapes):
    warnings.simplefilter("ignore")
    changes = parse(assignments)
    old = [(m, n, getattr(m, n)) for m, n, _ in changes]

    def changed(cell, sizes):
        for m, name, value in changes:
            setattr(m, name, value)
        try:
            return tvmrnn.build(cell, **sizes)
        finally:
            for m, name, value in old:
                setattr(m, name, value)
    for shape in shapes:
        rules_ab.ab(shape, lambda cell, sizes: tvmrnn.build(cell, **sizes), changed, "as is -> changed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
