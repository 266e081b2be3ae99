"""v82: the backward steps alone under the step-tile rules, old (6 x 4 tiles: v81), tall
(CPU_TALL_STEP_TILES alone) and new (and CPU_STEP_TILES_BY_CORES): compiled in a process pool,
timed in a random order each round (ROUNDS rounds of 10 calls after a warm call), medians in us.
    [JOBS=8] [ROUNDS=15] python step_rules_ab.py cell:N:I:H ...
"""
import concurrent.futures as cf
import os
import random
import statistics
import sys
import tempfile

import tvm
import tvmrnn
from tvmrnn.runtime import profile
from tvmrnn.schedules import cpu, default_schedule
from step_tiles import _plain, compile_one, parallel_extent

RULES = {"old": dict(CPU_TALL_STEP_TILES=False, CPU_STEP_TILES_BY_CORES=False),
         "tall": dict(CPU_TALL_STEP_TILES=True, CPU_STEP_TILES_BY_CORES=False),
         "new": dict(CPU_TALL_STEP_TILES=True, CPU_STEP_TILES_BY_CORES=True)}


def main():
    out = tempfile.mkdtemp()
    jobs, entries = [], []
    for spec in sys.argv[1:]:
        cell, n, i, h = spec.split(":")
        rnn = tvmrnn.build(cell, input_size=int(i), hidden_size=int(h), batch_size=int(n), cache=False, tuning_logs=False)
        prog = rnn.programs["backward"]
        name = next(k for k in prog.kernels if k.startswith("backward_step"))
        for label, flags in RULES.items():
            saved = {k: getattr(cpu, k) for k in flags}
            for k, v in flags.items():
                setattr(cpu, k, v)
            func = default_schedule(prog.kernels[name], rnn.target)
            for k, v in saved.items():
                setattr(cpu, k, v)
            path = os.path.join(out, f"{len(jobs)}.so")
            mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
            jobs.append((tvm.ir.save_json(mod), _plain(rnn.target.export()), path))
            entries.append((spec, name, label, parallel_extent(func), func, path))
    with cf.ProcessPoolExecutor(int(os.environ.get("JOBS", 8))) as pool:
        list(pool.map(compile_one, jobs))
    dev = tvm.cpu(0)
    timers, args = {}, {}
    for spec, name, label, tasks, func, path in entries:
        if (spec, name) not in args:
            args[(spec, name)] = profile.random_tensors([[int(s) for s in p.shape] for p in func.params], dev,
                                                        [p.name for p in func.params])
        timers[(spec, label)] = (tvm.runtime.load_module(path).time_evaluator("main", dev, number=10, repeat=1), tasks, name)
    times = {k: [] for k in timers}
    keys = list(timers)
    for _ in range(int(os.environ.get("ROUNDS", 15))):
        random.shuffle(keys)
        for spec, label in keys:
            timer, _, name = timers[(spec, label)]
            timer(*args[(spec, name)])
            times[(spec, label)].append(1e6 * statistics.median(timer(*args[(spec, name)]).results))
    for spec in sys.argv[1:]:
        print(f"{spec:18s} {timers[(spec, 'old')][2]:36s}", "  ".join(
            f"{label} {statistics.median(times[(spec, label)]):7.1f} us ({timers[(spec, label)][1]} tasks)" for label in RULES), flush=True)


if __name__ == "__main__":
    main()
