#!/usr/bin/env python3
"""Per-step time of each pass against the sequence length: does a long sequence cost more per step?

    python scripts/seq_scaling.py lstm --threads 16 -T 16 64 300

On the GPU machine's Xeon a DS2 LSTM pass took 11-33 ms more than its kernels timed alone
(``bench.py --profile``: 37 us a step in inference, ~105 in training), while on the dev machine
the two agree. Kernels timed alone see their data in cache; a pass walks a workspace that grows
with T (training: ~110 MB at T = 300). If the extra time is the memory the pass walks, the cost
per step grows with T; if it is per launch (thread pool, code), it does not. Each pass is timed
(median of ``--reps``) on random inputs at each T, in one process, tvmrnn only.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cell", nargs="?", default="lstm")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("-T", "--seq-lens", type=int, nargs="+", default=[16, 64, 300])
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(a.threads)
    import tvmrnn
    from tvmrnn.runtime.profile import _device, _random_tensors
    rnn = tvmrnn.build(a.cell, input_size=a.hidden_size, hidden_size=a.hidden_size, num_layers=1,
                       bidirectional=False, batch_size=a.batch_size)
    dev = _device(rnn.target)
    for name in ("forward", "forward_train", "backward"):
        for T in a.seq_lens:
            args = _random_tensors(rnn.shapes(name, T).values(), dev)
            rnn.module[name](*args)
            times = []
            for _ in range(a.reps):
                t0 = time.perf_counter()
                rnn.module[name](*args)
                dev.sync()
                times.append(time.perf_counter() - t0)
            ms = statistics.median(times) * 1e3
            print(f"{a.cell} {name:14s} T={T:4d}  {ms:9.2f} ms  {ms * 1e3 / T:8.1f} us per step", flush=True)


if __name__ == "__main__":
    main()
