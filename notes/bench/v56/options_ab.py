"""A/B of build options (v56): each shape built with the default options and with the given ones in
one process; both builds' passes timed in turn (``pass_tuning.compare``, 11 pairs), and which
passes run persistent time loops in each. The lead it was written for: the backward of few rows at
small H runs one launch a step under ``persistent="auto"`` (LSTM N=8 H=128: 99 x 7.7 us), and
``"all"`` makes it persistent.

    python notes/bench/v56/options_ab.py '{"persistent": "all"}' lstm:8:128:128:100 lstm:20:800:800:300
    TARGET=llvm python notes/bench/v56/options_ab.py '{"chunk_steps": [8, 1]}' gru:4:16:16:20   # this CPU
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import tvmrnn
from tvmrnn.runtime import pass_tuning


def main(options, shapes):
    warnings.simplefilter("ignore")
    options = tvmrnn.BuildOptions.from_dict(json.loads(options))
    for shape in shapes:
        cell, n, h, i, T = shape.split(":")
        sizes = dict(input_size=int(i), hidden_size=int(h), batch_size=int(n), target=os.environ.get("TARGET", "cuda"), tuning_logs=False,
                     cache=False)
        before = tvmrnn.build(cell, **sizes)
        after = tvmrnn.build(cell, options=options, **sizes)
        persistent = {name: [p for p in ("forward", "forward_train", "backward") if rnn.programs[p].uses_persistent_loops]
                      for name, rnn in (("default", before), ("given", after))}
        result = pass_tuning.compare(before, after, pass_tuning.PassTimer(int(T)), pairs=11)
        print(f"{shape} persistent {persistent}: default -> given, {result.line()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
