#!/usr/bin/env python3
"""What a public call costs beyond its pass: ``rnn.forward`` against the bare module call.

    python scripts/call_overhead.py lstm --reps 50
    python scripts/call_overhead.py lstm gru --device cpu --threads 2

For each cell at Deep Speech 2 sizes by default, on the same weights and input:

- ``module``: ``rnn.module["forward"]`` called with arguments made once (no checks, no
  allocation, no DLPack), timed with a sync after each call;
- ``forward``: the public ``rnn.forward(w, x)`` timed the same way (what ``bench.py`` times);
- ``host``: the time until ``rnn.forward`` returns, the device idle before the call (on a GPU
  the launches are asynchronous, so this is the Python and launch cost that delays the pass);
- the top of a ``cProfile`` of the host side of the public call.
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def med_ms(fn, sync, reps):
    fn()
    sync()
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out)


def host_ms(fn, sync, reps):
    out = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        out.append(1e3 * (time.perf_counter() - t0))
        sync()
    return statistics.median(out)


def main():
    from bench import study_parser, torch_rnn
    p = study_parser(__doc__, reps=50, layers=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda if there is one")
    p.add_argument("--threads", type=int, default=None, help="CPU threads, both sides")
    a = p.parse_args()
    if a.threads:
        os.environ["TVM_NUM_THREADS"] = str(a.threads)
    import torch

    import tvmrnn
    from tvmrnn.runtime.rnn import to_tvm
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.threads:
        torch.set_num_threads(a.threads)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    T, N, I, H, L = a.T, a.N, a.hidden_size, a.hidden_size, a.num_layers
    for cell in a.cells:
        rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=L, bidirectional=a.bidirectional,
                           batch_size=N, target="cuda" if dev.type == "cuda" else None)
        ref = torch_rnn(cell, I, H, L, a.bidirectional)
        w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
        x = torch.randn(T, N, I, device=dev)
        with torch.no_grad():
            arrays = {}
            public = lambda: rnn.forward(w, x)  # noqa: E731
            y = public()[0]
            # the bare call: the same arrays the public call hands over, made once
            shapes = rnn.shapes("forward", T)
            given = {"x": x, "w": w.flat}
            args = []
            for name, shape in shapes.items():
                arrays[name] = given.get(name)
                if arrays[name] is None:
                    arrays[name] = torch.zeros(shape, device=dev)
                args.append(to_tvm(arrays[name]))
            fn = rnn.module["forward"]
            bare = lambda: fn(*args)  # noqa: E731
            bare()
            sync()
            agree = float((arrays["y"] - y).norm() / y.norm())
            rounds = []
            for _ in range(3):
                rounds.append((med_ms(bare, sync, a.reps), med_ms(public, sync, a.reps), host_ms(public, sync, a.reps),
                               host_ms(bare, sync, a.reps)))
            m = [statistics.median(r[i] for r in rounds) for i in range(4)]
            print(f"{cell:9s} module {m[0]:7.3f} ms  forward {m[1]:7.3f} ms  (+{m[1] - m[0]:.3f})  "
                  f"host: forward returns after {m[2]:.3f} ms, the bare call after {m[3]:.3f} ms  "
                  f"(rel diff {agree:.1e})", flush=True)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                public()
                sync()
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
            print("\n".join(s.getvalue().splitlines()[4:]), flush=True)


if __name__ == "__main__":
    main()
