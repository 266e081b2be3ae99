#!/usr/bin/env python3
"""Tune tvmrnn's kernels for this machine (or a remote one) with MetaSchedule.

    python scripts/tune.py lstm gru --input-size 800 --hidden-size 800 --batch-size 20 --trials 64
    python scripts/tune.py --config scripts/configs/ds2.json --trials 32 --max-tasks 8
    python scripts/tune.py --config scripts/configs/ds2.json --target cpu --kernels recurrent_step

Without --target it tunes for this machine's GPU if the driver reports one (its compute
capability), else for this CPU (LLVM's host detection, AVX-512 where the CPU has it). Records
go to <log-dir>/<target>/, one new pair of files per run; re-running resumes, counting the
trials already logged, and a killed run keeps everything measured before it died. Ends with
each task's best latency and how much of a training step it accounts for.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvmrnn  # noqa: E402
from tvmrnn.tune import records, tasks, tuner  # noqa: E402
from tvmrnn import device as targets  # noqa: E402
from tvmrnn.cells import find_cell  # noqa: E402
from tvmrnn.program.passes import Config  # noqa: E402

SIZE_KEYS = ("input_size", "hidden_size", "num_layers", "bidirectional", "batch_size")


def detect_target(name: str | None):
    if name in (None, "auto"):
        import tvm
        return targets.cuda_target() if tvm.cuda(0).exist else targets.host_target()
    if name == "cpu":
        return targets.host_target()
    return targets.resolve(json.loads(name) if name.startswith("{") else name)


def configs_from(args) -> list[Config]:
    entries = []
    if args.config:
        with open(args.config) as f:
            entries = json.load(f)
        if not isinstance(entries, list):
            raise SystemExit(f"{args.config}: expected a JSON list of configurations")
    if args.cells:
        entries.append({"cell": args.cells, "input_size": args.input_size, "hidden_size": args.hidden_size,
                        "num_layers": args.num_layers, "bidirectional": args.bidirectional,
                        "batch_size": args.batch_size})
    if not entries:
        raise SystemExit("give cells and sizes, or --config FILE")
    configs = []
    for i, e in enumerate(entries):
        missing = [k for k in ("cell", "input_size", "hidden_size", "batch_size") if e.get(k) is None]
        if missing:
            raise SystemExit(f"configuration {i + 1}: missing {', '.join(missing)}")
        for cell in e["cell"] if isinstance(e["cell"], list) else [e["cell"]]:
            configs.append(Config(find_cell(cell), int(e["input_size"]), int(e["hidden_size"]),
                                  int(e.get("num_layers", 1)), bool(e.get("bidirectional", False)),
                                  int(e["batch_size"]), False))
    return configs


def table(results, out=print):
    rows = [(t.kernel.name, t.calls, trials, best) for t, best, trials in results]
    total = sum(calls * best for _, calls, _, best in rows if best)
    out(f"\n{'task':48s} {'runs/step':>9s} {'trials':>6s} {'best (us)':>10s} {'share':>6s}")
    for name, calls, trials, best in rows:
        share = f"{100 * calls * best / total:5.1f}%" if best and total else "     -"
        out(f"{name:48s} {calls:9d} {trials:6d} {best if best else float('nan'):10.1f} {share}")
    if total:
        out(f"tuned kernels' time per training step + inference pass at T={tasks.REFERENCE_LENGTH}: "
            f"{total / 1e3:.2f} ms (kernel time only: no launch gaps)")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("cells", nargs="*", help=f"cells to tune: {', '.join(sorted(tvmrnn.CELLS))}, an example "
                                            f"custom cell (tvmrnn.cells.examples) or module:attribute")
    p.add_argument("--input-size", type=int)
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--config", help="a JSON list of {cell (name or list), input_size, hidden_size, batch_size, "
                                    "num_layers, bidirectional}")
    p.add_argument("--target", help='"cpu", "cuda", a tag ("nvidia/nvidia-h100") or a JSON target dict; '
                                    "default: this machine's GPU, else its CPU")
    p.add_argument("--trials", type=int, default=64, help="trials per task, counting those already logged")
    p.add_argument("--log-dir", default=records.DEFAULT_LOGS, help="default: the repository's tuning_logs/")
    p.add_argument("--kernels", nargs="*", help="only tasks whose name contains one of these")
    p.add_argument("--max-tasks", type=int, help="only the N tasks with the largest share of a training step (measured where the log has them, else estimated from FLOPs)")
    p.add_argument("--warm-start-from", help="another log folder (other target or shapes) to seed new tasks from")
    p.add_argument("--no-default-seed", action="store_true",
                   help="do not measure each new task's default schedule first (it becomes a record, so a "
                        "tuned schedule is never slower than the default)")
    p.add_argument("--reseed-defaults", action="store_true",
                   help="measure the default schedule (and its other shapes) again on every selected task, "
                        "also those with records: after the default schedule changed (nothing is removed)")
    p.add_argument("--rpc-tracker", help="HOST:PORT of a TVM RPC tracker (python -m tvm.exec.rpc_tracker)")
    p.add_argument("--rpc-key", help="the device key the RPC servers registered with")
    p.add_argument("--trials-per-iter", type=int, default=16)
    p.add_argument("--seed", type=int, default=1, help="the search's random seed")
    p.add_argument("--list", action="store_true", help="list the tasks and what the log holds; tune nothing")
    a = p.parse_args(argv)
    if bool(a.rpc_tracker) != bool(a.rpc_key):
        raise SystemExit("--rpc-tracker and --rpc-key go together")
    configs = configs_from(a)
    target = detect_target(a.target)
    folder = os.path.join(a.log_dir, records.target_key(target))
    print(f"target {target.export()} -> {folder}")
    if a.list:
        db = records.load_records(folder) if os.path.isdir(folder) else None
        tasks = tasks.select_tasks(configs, target, a.kernels or None, a.max_tasks, db)
        table([(t, db and records.best_latency_us(db, t.kernel), len(records.records_of(db, t.kernel)) if db else 0)
               for t in tasks])
        return
    start = time.time()
    try:
        results = tuner.tune(configs, target, log_dir=a.log_dir, trials_per_task=a.trials, kernels=a.kernels,
                              max_tasks=a.max_tasks, rpc_tracker=a.rpc_tracker, rpc_key=a.rpc_key,
                              num_trials_per_iter=a.trials_per_iter, warm_start_from=a.warm_start_from, seed=a.seed,
                              seed_default=not a.no_default_seed, reseed_defaults=a.reseed_defaults,
                              out=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print(f"\ninterrupted: every record measured so far is in {folder}; run again to resume")
        raise SystemExit(130)
    table(results)
    print(f"done in {time.time() - start:.0f} s; logs in {folder}")


if __name__ == "__main__":
    main()
