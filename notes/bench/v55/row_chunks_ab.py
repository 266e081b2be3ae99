"""A/B of the persistent row tiles' chunked rows (v55): each shape built twice in one process, with
the rows of a block staged whole only (the v54 rule: where they do not fit beside the weights, the
time loop runs one launch a step) and with chunks of the reduction as they fit (the v55 default);
both passes timed in turn (pass_tuning.compare). Correctness is tests/test_cuda.py's.

    python notes/bench/v55/row_chunks_ab.py lstm:160:384:256:80 gru:256:512:512:100
"""
from __future__ import annotations

import sys
import warnings

import tvmrnn
from tvmrnn.runtime import pass_tuning
from tvmrnn.schedules import row_tiles

whole_only = row_tiles.persistent_row_tiles


def _whole(*args, **kwargs):
    return whole_only(*args, **{**kwargs, "row_chunk": 0})


def main(shapes):
    warnings.simplefilter("ignore")
    for shape in shapes:
        cell, n, h, i, T = shape.split(":")
        sizes = dict(input_size=int(i), hidden_size=int(h), batch_size=int(n), target="cuda", tuning_logs=False,
                     cache=False)
        row_tiles.persistent_row_tiles = _whole
        try:
            before = tvmrnn.build(cell, **sizes)
        finally:
            row_tiles.persistent_row_tiles = whole_only
        after = tvmrnn.build(cell, **sizes)
        persistent = {name: [p for p in ("forward", "forward_train", "backward") if rnn.programs[p].uses_persistent_loops]
                      for name, rnn in (("whole", before), ("chunked", after))}
        result = pass_tuning.compare(before, after, pass_tuning.PassTimer(int(T)), pairs=11)
        print(f"{shape} persistent {persistent}: whole -> chunked, {result.line()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
