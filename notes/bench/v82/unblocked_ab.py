"""v82: the backward's GEMMs alone with cpu.CPU_GUARDED_ROWS_UNBLOCKED off / on (those whose
schedule it changes), compiled in a process pool, timed in a random order each round.
    [TARGET=json] [JOBS=2] [ROUNDS=9] python unblocked_ab.py cell:N:I:H ...
"""
import concurrent.futures as cf
import json
import os
import random
import statistics
import sys
import tempfile

import tvm
import tvmrnn
from tvmrnn.runtime import profile
from tvmrnn.schedules import cpu, default_schedule
from step_tiles import _plain, compile_one


def main():
    target = json.loads(os.environ["TARGET"]) if "TARGET" in os.environ else None
    out = tempfile.mkdtemp()
    jobs, entries = [], []
    for spec in sys.argv[1:]:
        cell, n, i, h = spec.split(":")
        rnn = tvmrnn.build(cell, input_size=int(i), hidden_size=int(h), batch_size=int(n), cache=False,
                           tuning_logs=False, target=target)
        prog = rnn.programs["backward"]
        for name, calls in prog.calls(100).items():
            if not calls or name not in prog.kernels:
                continue
            funcs = {}
            for on in (False, True):
                cpu.CPU_GUARDED_ROWS_UNBLOCKED = on
                funcs[on] = default_schedule(prog.kernels[name], rnn.target)
            if funcs[False].script() == funcs[True].script():
                continue
            for on, func in funcs.items():
                path = os.path.join(out, f"{len(jobs)}.so")
                jobs.append((tvm.ir.save_json(tvm.IRModule({"main": func.with_attr("global_symbol", "main")})),
                             _plain(rnn.target.export()), path))
                entries.append((spec, name, on, calls, func, path))
    print(f"{len(jobs)} kernels", flush=True)
    with cf.ProcessPoolExecutor(int(os.environ.get("JOBS", 2))) as pool:
        list(pool.map(compile_one, jobs))
    dev = tvm.cpu(0)
    timers, args = {}, {}
    for spec, name, on, calls, func, path in entries:
        if (spec, name) not in args:
            args[(spec, name)] = profile.random_tensors([[int(s) for s in p.shape] for p in func.params], dev,
                                                        [p.name for p in func.params])
        timers[(spec, name, on)] = (tvm.runtime.load_module(path).time_evaluator("main", dev, number=3, repeat=1), calls)
    times = {k: [] for k in timers}
    keys = list(timers)
    for _ in range(int(os.environ.get("ROUNDS", 9))):
        random.shuffle(keys)
        for key in keys:
            timers[key][0](*args[key[:2]])
            times[key].append(1e6 * statistics.median(timers[key][0](*args[key[:2]]).results))
    for spec, name in args:
        off, on = (statistics.median(times[(spec, name, v)]) for v in (False, True))
        print(f"{spec:18s} {name:48s} x{timers[(spec, name, False)][1]:3d} blocked {off:8.1f} us  unblocked {on:8.1f} us  {off / on:5.2f}x", flush=True)


if __name__ == "__main__":
    main()
