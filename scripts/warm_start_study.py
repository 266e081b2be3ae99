#!/usr/bin/env python3
"""How many trials does a warm start save? Tune a kernel cold and warm-started, compare.

    python scripts/warm_start_study.py --target cpu --seeds 3 --trials 32

Tunes the LSTM inference step at a source shape once, then the step at a new shape several
times cold and several times warm-started from the source's log (same seeds), and prints for
each run the trials it took to come within 10% of the best cold result.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvmrnn.tune import records, tasks, tuner  # noqa: E402
from tvmrnn.cells.definition import CELLS  # noqa: E402
from tvmrnn.program.passes import Config  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tune import detect_target  # noqa: E402


def curve(folder):
    """Best latency (us) after each trial, in the order the records were measured."""
    secs = []
    for path in sorted(os.listdir(folder)):
        if path.endswith("_tuning_record.json"):
            for line in open(os.path.join(folder, path)):
                run = json.loads(line)[1][1]
                secs.append(1e6 * sum(run) / len(run) if run else float("inf"))
    best, out = float("inf"), []
    for s in secs:
        best = min(best, s)
        out.append(best)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="cpu")
    p.add_argument("--cell", default="lstm")
    p.add_argument("--source", default="4,64", help="batch,hidden of the shape tuned first")
    p.add_argument("--dest", default="4,96", help="batch,hidden of the shape tuned cold and warm")
    p.add_argument("--trials", type=int, default=32)
    p.add_argument("--seeds", type=int, default=3)
    a = p.parse_args()
    target = detect_target(a.target)
    (sn, sh), (dn, dh) = (map(int, s.split(",")) for s in (a.source, a.dest))
    cell = CELLS[a.cell]
    kernel = f"recurrent_step_{a.cell}_infer"
    quiet = lambda line: None  # noqa: E731
    root = tempfile.mkdtemp(prefix="tvmrnn-warm-")
    key = records.target_key(target)
    tuner.tune([Config(cell, 16, sh, 1, False, sn, False)], target, os.path.join(root, "source"), a.trials,
                kernels=[kernel], out=quiet, seed_default=False)
    curves = {"cold": [], "warm": []}
    for seed in range(1, a.seeds + 1):
        for mode in curves:
            log = os.path.join(root, f"{mode}{seed}")
            tuner.tune([Config(cell, 16, dh, 1, False, dn, False)], target, log, a.trials, kernels=[kernel],
                        out=quiet, seed=seed, seed_default=False,  # compare searches, not the default
                        warm_start_from=os.path.join(root, "source", key) if mode == "warm" else None)
            curves[mode].append(curve(os.path.join(log, key)))
            print(f"{mode} seed {seed}: best after 8/16/{a.trials} trials: "
                  + " / ".join(f"{curves[mode][-1][min(i, len(curves[mode][-1])) - 1]:.1f}" for i in (8, 16, a.trials))
                  + " us", flush=True)
    goal = 1.1 * min(c[-1] for c in curves["cold"])
    print(f"\ntarget: within 10% of the best cold result ({goal:.1f} us); {kernel} n{dn} h{dh} from n{sn} h{sh}, {key}")
    for mode, cs in curves.items():
        reach = [next((i + 1 for i, v in enumerate(c) if v <= goal), None) for c in cs]
        shown = ", ".join(str(r) if r else f">{a.trials}" for r in reach)
        med = statistics.median(r or a.trials + 1 for r in reach)
        print(f"{mode}: trials to reach it per seed: {shown} (median {med})")


if __name__ == "__main__":
    main()
