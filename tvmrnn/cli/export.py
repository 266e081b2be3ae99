"""tvmrnn-export: build a tvmrnn configuration for a target and export it as one shared library.

    tvmrnn-export lstm --input-size 800 --hidden-size 800 --batch-size 20 \
        --num-layers 5 --bidirectional --target nvidia/nvidia-h100 -o lstm_h100.so
    tvmrnn-export peephole_lstm --input-size 80 --hidden-size 256 --batch-size 8 -o peephole.so
"""
from __future__ import annotations

import argparse
import json
import os

import tvmrnn
from tvmrnn.cells import find_cell
from tvmrnn.cli import positive_int, usage_errors


@usage_errors("tvmrnn-export")
def main(argv=None):
    p = argparse.ArgumentParser(prog="tvmrnn-export", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("cell", help=f"{', '.join(sorted(tvmrnn.CELLS))}, an example custom cell "
                                "(tvmrnn.cells.examples) or module:attribute naming a tvmrnn.define_cell cell")
    p.add_argument("--input-size", type=positive_int, required=True)
    p.add_argument("--hidden-size", type=positive_int, required=True)
    p.add_argument("--batch-size", type=positive_int, required=True)
    p.add_argument("--proj-size", type=positive_int, default=0, help="the LSTM's projections (torch.nn's proj_size)")
    p.add_argument("--num-layers", type=positive_int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--batch-first", action="store_true")
    p.add_argument("--target", default=None,
                   help='a TVM tag ("nvidia/nvidia-h100"), "cuda" (this GPU), a JSON dict '
                        '(\'{"kind": "llvm", "mcpu": "sapphirerapids"}\'); default: this CPU')
    p.add_argument("--tuning-logs", default=None,
                   help="folder of per-target raw MetaSchedule logs (default: TVMRNN_TUNING_LOGS or the default "
                        "logs folder; the shipped records are read too)")
    p.add_argument("--options", default=None, help='build options as JSON, e.g. \'{"persistent": "off"}\' '
                                                   "(tvmrnn.BuildOptions' fields)")
    p.add_argument("-o", "--output", required=True, help="the .so to write")
    a = p.parse_args(argv)
    if not os.path.isdir(os.path.dirname(os.path.abspath(a.output))):
        p.error(f"-o {a.output}: no such folder {os.path.dirname(os.path.abspath(a.output))!r}")
    try:
        target = json.loads(a.target) if a.target and a.target.startswith("{") else a.target
        cell = find_cell(a.cell)
        options = tvmrnn.BuildOptions.from_dict(json.loads(a.options)) if a.options else None
    except (ValueError, TypeError) as err:
        p.error(str(err))
    rnn = tvmrnn.build(cell, input_size=a.input_size, hidden_size=a.hidden_size, num_layers=a.num_layers,
                       bidirectional=a.bidirectional, batch_size=a.batch_size, batch_first=a.batch_first,
                       target=target, tuning_logs=a.tuning_logs, options=options, proj_size=a.proj_size)
    print(f"wrote {rnn.export(a.output)}: {rnn}")


if __name__ == "__main__":
    main()
