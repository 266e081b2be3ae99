"""Did tuning help the whole passes? One configuration built twice, with a log folder's records and
verdicts and without any record (default schedules), both passes timed in turn in one process
(tvmrnn.runtime.pass_tuning.compare).

    python scripts/ab_tuned.py lstm --input-size 96 --hidden-size 96 --batch-size 1 -T 60 \
        --tuning-logs /tmp/logs --target cuda
"""
from __future__ import annotations

import argparse
import warnings

import tvmrnn
from tvmrnn.runtime import pass_tuning
from tvmrnn.tune.records import UntunedWarning


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cell")
    p.add_argument("--input-size", type=int, required=True)
    p.add_argument("--hidden-size", type=int, required=True)
    p.add_argument("--batch-size", type=int, required=True)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("-T", type=int, default=100, help="sequence length the passes are timed at")
    p.add_argument("--tuning-logs", required=True, help="the folder of per-target log folders (tvmrnn-tune --log-dir)")
    p.add_argument("--target", default=None, help="None: this CPU; cuda: this GPU")
    p.add_argument("--pairs", type=int, default=21)
    a = p.parse_args(argv)
    sizes = dict(input_size=a.input_size, hidden_size=a.hidden_size, num_layers=a.num_layers,
                 bidirectional=a.bidirectional, batch_size=a.batch_size, target=a.target, cache=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UntunedWarning)
        plain = tvmrnn.build(a.cell, tuning_logs=False, **sizes)
        tuned = tvmrnn.build(a.cell, tuning_logs=a.tuning_logs, **sizes)
    print("tuned build's options:", tuned.config.options)
    for kernel, taken in sorted(tuned.records.items()):
        print(f"  {kernel}: {taken['where']}")
    result = pass_tuning.compare(plain, tuned, pass_tuning.PassTimer(a.T), pairs=a.pairs)
    print(f"defaults -> tuned, T={a.T}: {result.line()}")


if __name__ == "__main__":
    main()
