"""v82: the search's apparent wins on the dev VM, checked: each kernel alone under its default and
under the searched knob values, interleaved in one process (random order each round, a warm call
first), medians in us. The tuner measures each candidate once, in its own time: a default measured
while the VM was slow looked 2x slower than the same schedule measured later (notes v82).
    [TARGET=json] python search_wins_ab.py
"""
import json
import os
import random
import statistics

import tvmrnn
from tvmrnn.runtime import profile
from tvmrnn.schedules import default_schedule

CASES = [  # (cell, N, I, H, kernel name prefix, the searched tiles)
    ("gru", 5, 1024, 867, "input_projection_t64", dict(accumulators=24, column_vectors=1, row_block=16, red_block=32)),
    ("gru", 5, 1024, 867, "weight_gradient_packed_t64_n5_k1024", dict(row_block=1, red_block=64, guarded_vectors=3)),
    ("gru", 5, 1024, 867, "weight_gradient_packed_t64_n5_k867", dict(row_block=1, red_block=16, guarded_vectors=2)),
    ("lstm", 24, 161, 423, "weight_gradient_packed_t16_n24_k161", dict(accumulators=16, red_block=64, guarded_vectors=4)),
]

target = json.loads(os.environ["TARGET"]) if "TARGET" in os.environ else None
timers = {}
for cell, n, i, h, prefix, tiles in CASES:
    rnn = tvmrnn.build(cell, input_size=i, hidden_size=h, batch_size=n, cache=False, tuning_logs=False, target=target)
    kernel = next(k for p in rnn.programs.values() for name, k in p.kernels.items() if name.startswith(prefix))
    for label, t in (("default", {}), ("searched", tiles)):
        timers[(kernel.name, label)] = profile.kernel_timer(default_schedule(kernel, rnn.target, **t), rnn.target, 3, 1)
times = {k: [] for k in timers}
keys = list(timers)
for _ in range(9):
    random.shuffle(keys)
    for k in keys:
        timer, args = timers[k]
        timer(*args)
        times[k].append(1e6 * statistics.median(timer(*args).results))
for name in dict.fromkeys(n for n, _ in timers):
    d, s = (statistics.median(times[(name, l)]) for l in ("default", "searched"))
    print(f"{name:48s} default {d:9.1f} us  searched {s:9.1f} us  {d / s:5.2f}x", flush=True)
