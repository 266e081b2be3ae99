"""The chunked rows' chunk size (v55): one shape built with row_tiles.MAX_ROW_CHUNK_BYTES at each
given value, the first against each other in turn (pass_tuning.compare, training and inference).

    python notes/bench/v55/row_chunk_sizes.py lstm:160:384:256:80 32768 8192 16384
"""
from __future__ import annotations

import sys
import warnings

import tvmrnn
from tvmrnn.runtime import pass_tuning
from tvmrnn.schedules import row_tiles


def main(shape, sizes):
    warnings.simplefilter("ignore")
    cell, n, h, i, T = shape.split(":")
    built = {}
    for size in sizes:
        row_tiles.MAX_ROW_CHUNK_BYTES = int(size)
        built[size] = tvmrnn.build(cell, input_size=int(i), hidden_size=int(h), batch_size=int(n), target="cuda",
                                   tuning_logs=False, cache=False)
    timer = pass_tuning.PassTimer(int(T))
    for size in sizes[1:]:
        result = pass_tuning.compare(built[sizes[0]], built[size], timer, pairs=11)
        print(f"{shape} chunk bytes {sizes[0]} -> {size}: {result.line()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
