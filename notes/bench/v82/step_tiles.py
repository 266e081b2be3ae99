"""v82: CPU step kernels (the fused forward and backward steps) alone under register-tile settings
(cpu_gemm's ``accumulators`` x ``column_vectors``), to see what a many-core CPU wants of a step
that the default tile leaves few parallel tasks (the Xeon's LSTM N=24 H=423 backward step: 28 tasks
for 16 cores; tuning found accumulators 12, 4 vectors, 83.6 -> 55.9 us).

    [TARGET=json] [JOBS=8] [ROUNDS=5] python step_tiles.py cell:N:I:H ...

Schedules here, compiles in a process pool (exported .so files), then times serially: each kernel's
settings interleaved, ROUNDS rounds of 10 calls, medians in us; ``tasks`` is the parallel loop's extent.
"""
import concurrent.futures as cf
import json
import os
import re
import statistics
import sys
import tempfile

import tvm
import tvmrnn
from tvmrnn.program.sequence import compile_module
from tvmrnn.runtime import profile
from tvmrnn.schedules import default_schedule

ACCUMULATORS = (6, 8, 12, 16, 24)
COLUMN_VECTORS = (None, 1, 2, 4)


def parallel_extent(func):
    found = re.findall(r"in T\.parallel\((?:0, )?(\d+)", func.script())
    return "+".join(found) or "-"


def _plain(value):  # a target's export, as JSON
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__len__"):
        return [_plain(v) for v in value]
    return str(value)


def compile_one(job):
    text, target, path = job
    mod = tvm.ir.load_json(text)
    compile_module(mod, tvm.target.Target(target)).export_library(path)
    return path


def main():
    target = json.loads(os.environ["TARGET"]) if "TARGET" in os.environ else None
    out = tempfile.mkdtemp()
    jobs, entries = [], []
    for spec in sys.argv[1:]:
        cell, n, i, h = spec.split(":")
        rnn = tvmrnn.build(cell, input_size=int(i), hidden_size=int(h), batch_size=int(n), cache=False,
                           tuning_logs=False, target=target)
        seen = set()
        for prog in rnn.programs.values():
            for name, calls in prog.calls(100).items():
                if "step" not in name or name.startswith("copy") or not calls or name in seen or name not in prog.kernels:
                    continue
                seen.add(name)
                kernel = prog.kernels[name]
                settings = [("default", {})] + [(f"a{a}c{c or 'A'}", dict(accumulators=a, column_vectors=c))
                                                 for a in ACCUMULATORS for c in COLUMN_VECTORS]
                for label, tiles in settings:
                    try:
                        func = default_schedule(kernel, rnn.target, **tiles)
                    except Exception as e:  # a setting this kernel cannot take
                        print(f"{spec} {name} {label}: {type(e).__name__}", flush=True)
                        continue
                    path = os.path.join(out, f"{len(jobs)}.so")
                    mod = tvm.IRModule({"main": func.with_attr("global_symbol", "main")})
                    jobs.append((tvm.ir.save_json(mod), _plain(rnn.target.export()), path))
                    entries.append((spec, name, label, parallel_extent(func), func, path))
    print(f"{len(jobs)} kernels to compile", flush=True)
    with cf.ProcessPoolExecutor(int(os.environ.get("JOBS", 8))) as pool:
        list(pool.map(compile_one, jobs))
    dev = tvm.cpu(0)
    timers, args = {}, {}
    for spec, name, label, tasks, func, path in entries:
        lib = tvm.runtime.load_module(path)
        if (spec, name) not in args:
            args[(spec, name)] = profile.random_tensors([[int(s) for s in p.shape] for p in func.params], dev,
                                                        [p.name for p in func.params])
        timers[(spec, name, label)] = (lib.time_evaluator("main", dev, number=10, repeat=1), tasks)
    times = {k: [] for k in timers}
    for _ in range(int(os.environ.get("ROUNDS", 5))):
        for (spec, name, label), (timer, _) in timers.items():
            timer(*args[(spec, name)])  # (warm: the kernel timed before used other arrays)
            times[(spec, name, label)].append(1e6 * statistics.median(timer(*args[(spec, name)]).results))
    for spec, name in args:
        rows = sorted(((statistics.median(times[(s, n, l)]), l, timers[(s, n, l)][1]) for s, n, l in timers
                       if (s, n) == (spec, name)))
        default = next(r for r in rows if r[1] == "default")
        print(f"{spec} {name}: default {default[0]:.1f} us ({default[2]} tasks); best "
              + ", ".join(f"{l} {t:.1f} ({k})" for t, l, k in rows[:6]), flush=True)


if __name__ == "__main__":
    main()
