#!/usr/bin/env python3
"""Where a CPU inference pass loses time between its kernels: the pass, the pass without its input
projection, and the kernels alone, interleaved in one process.

    python scripts/gap_study.py lstm --threads 16

``bench.py --profile`` reports each pass's gap (the measured pass less its kernels timed alone) but
not its cause. Here three things are timed round after round: the inference pass as a user calls
it (``rnn.forward``, tvmrnn's arrays on huge pages), the same pass built without its input projection
calls (the step loop alone: h ping-pongs between two rows as in the pass, gx is a buffer no kernel
wrote in the pass), and the pass's kernels alone (the fused step and each projection chunk, their
arguments on huge pages, the same every call). Reported, medians in ms: the three, 300 steps x the
step alone, and the two differences: ``loop - steps alone`` (what running the steps in the loop
costs: every core reading an h written by all the others the step before, the pool's fork and join
per step) and ``pass - loop - projection alone`` (what the projection's hand-over costs: gx arriving
from other cores and memory, the weights of the step pushed out of cache by the chunk's).
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
    p.add_argument("cells", nargs="*", default=["lstm"])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seq-len", "-T", type=int, default=300)
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    if a.threads:
        os.environ["TVM_NUM_THREADS"] = str(a.threads)
    from unittest import mock

    import numpy as np

    import tvmrnn
    from tvmrnn.program import sequence
    from tvmrnn.runtime.profile import kernel_timer
    T, N, H = a.seq_len, a.batch_size, a.hidden_size
    rng = np.random.default_rng(0)
    print(f"threads {os.environ.get('TVM_NUM_THREADS', 'default')}, T={T} N={N} I=H={H}, "
          f"{a.rounds} rounds x {a.reps} calls", flush=True)
    for cell in a.cells:
        config = dict(input_size=H, hidden_size=H, batch_size=N, tuning_logs=False)
        rnn = tvmrnn.build(cell, **config)  # default schedules: the study times layouts, not records
        call = sequence.Program.call

        def no_projection(self, kernel, **views):
            if self.name == "forward" and kernel.name.startswith("input_projection"):
                return None
            return call(self, kernel, **views)
        with mock.patch.object(sequence.Program, "call", no_projection):
            loop_only = tvmrnn.build(cell, **config)
        G = rnn.config.cell.num_gates
        params = {s.name: rng.uniform(-0.1, 0.1, s.torch_shape).astype(np.float32)
                  for s in rnn.config.layout.slots}
        w = rnn.pack_weights(params)
        x = rng.standard_normal((T, N, H)).astype(np.float32)

        def timed(fn):
            fn()
            t0 = time.perf_counter()
            for _ in range(a.reps):
                fn()
            return 1e3 * (time.perf_counter() - t0) / a.reps
        program = rnn.programs["forward"]
        calls = program.calls(T)
        alone = []  # (name, calls, timer)
        for name, count in calls.items():
            if not name.startswith(("recurrent_step", "input_projection")) or not count:
                continue
            timer, args = kernel_timer(program.scheduled(name), rnn.target, number=20, repeat=1)
            alone.append((name, count, lambda timer=timer, args=args: 1e3 * timer(*args).mean))
        times = {"pass": [], "loop": [], **{name: [] for name, _, _ in alone}}
        for _ in range(a.rounds):
            times["pass"].append(timed(lambda: rnn.forward(w, x)))
            times["loop"].append(timed(lambda: loop_only.forward(w, x)))
            for name, _, run in alone:
                times[name].append(run())
        med = {k: statistics.median(v) for k, v in times.items()}
        steps = sum(med[name] * count for name, count, _ in alone if name.startswith("recurrent_step"))
        projection = sum(med[name] * count for name, count, _ in alone if name.startswith("input_projection"))
        print(f"{cell}: pass {med['pass']:.2f} ms (rounds {min(times['pass']):.2f}-{max(times['pass']):.2f}), "
              f"loop without projection {med['loop']:.2f} ({min(times['loop']):.2f}-{max(times['loop']):.2f}), "
              f"steps alone {steps:.2f}, projection alone {projection:.2f}")
        for name, count, _ in alone:
            print(f"    {name:48s} {count:4d} x {1e3 * med[name]:8.2f} us")
        print(f"  loop - steps alone: {med['loop'] - steps:.2f} ms ({1e3 * (med['loop'] - steps) / T:.1f} us a step); "
              f"pass - loop - projection alone: {med['pass'] - med['loop'] - projection:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
