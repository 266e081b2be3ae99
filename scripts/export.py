#!/usr/bin/env python3
"""Build a tvmrnn configuration for a target and export it as one shared library.

    python scripts/export.py lstm --input-size 800 --hidden-size 800 --batch-size 20 \
        --num-layers 5 --bidirectional --target nvidia/nvidia-h100 -o lstm_h100.so
    python scripts/export.py peephole_lstm --input-size 80 --hidden-size 256 --batch-size 8 -o peephole.so
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's tvmrnn

import tvmrnn  # noqa: E402
from tvmrnn.cells import find_cell  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cell", help=f"{', '.join(sorted(tvmrnn.CELLS))}, an example custom cell "
                                "(tvmrnn.cells.examples) or module:attribute naming a tvmrnn.define_cell cell")
    p.add_argument("--input-size", type=int, required=True)
    p.add_argument("--hidden-size", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--batch-first", action="store_true")
    p.add_argument("--target", default=None,
                   help='a TVM tag ("nvidia/nvidia-h100"), "cuda" (this GPU), a JSON dict '
                        '(\'{"kind": "llvm", "mcpu": "sapphirerapids"}\'); default: this CPU')
    p.add_argument("--tuning-logs", default=None,
                   help="folder of per-target MetaSchedule logs (default: the repository's tuning_logs/)")
    p.add_argument("-o", "--output", required=True, help="the .so to write")
    a = p.parse_args()
    target = json.loads(a.target) if a.target and a.target.startswith("{") else a.target
    try:
        cell = find_cell(a.cell)
    except ValueError as err:
        p.error(str(err))
    rnn = tvmrnn.build(cell, input_size=a.input_size, hidden_size=a.hidden_size, num_layers=a.num_layers,
                       bidirectional=a.bidirectional, batch_size=a.batch_size, batch_first=a.batch_first,
                       target=target, tuning_logs=a.tuning_logs)
    print(f"wrote {rnn.export(a.output)}: {rnn}")


if __name__ == "__main__":
    main()
