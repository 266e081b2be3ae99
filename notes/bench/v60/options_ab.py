"""A/B of build options (v60): each shape built with the defaults and with OPTIONS (a JSON of
``tvmrnn.BuildOptions`` fields) in one process; both builds' gradients on the same inputs compared
(v57's ``rules_ab.gradients``), build times printed, passes timed in turn
(``pass_tuning.compare``, 11 interleaved pairs).

    python notes/bench/v60/options_ab.py '{"chunk_steps": [256, 128, 64, 32, 4, 1]}' lstm:128:128:128:200
"""
import importlib.util
import json
import os
import sys
import warnings

import tvmrnn

spec = importlib.util.spec_from_file_location("rules_ab", os.path.join(os.path.dirname(__file__), "..", "v57", "rules_ab.py"))
rules_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rules_ab)


def main(options, shapes):
    warnings.simplefilter("ignore")
    for shape in shapes:
        rules_ab.ab(shape, lambda cell, sizes: tvmrnn.build(cell, **sizes),
                    lambda cell, sizes: tvmrnn.build(cell, options=tvmrnn.BuildOptions(**options), **sizes),
                    "default -> options")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2:])
