"""Every kernel of one build, as the build scheduled it, against the same kernel unscheduled.

Each distinct kernel of ``tvmrnn.build(cell, size, size, batch_size=N, target=...)`` (the
persistent steps excepted: they need their time loop) is compiled twice: with the schedule the
build gave it (default or tuned) for the target, and without any schedule for the CPU. Both run
on the same random inputs (outputs start equal too, for kernels that accumulate), and every
argument is compared. A schedule that computes something else shows up as ``BAD`` with the
argument it got wrong: this is how the H100's unit-reduction weight gradient was found (v28).

    python scripts/check_kernels.py lstm 800 1            # CUDA (needs a GPU)
    python scripts/check_kernels.py gru 37 3 --target llvm # this CPU
"""
from __future__ import annotations

import argparse
import os
import warnings

import numpy as np
import tvm

os.environ.setdefault("TVMRNN_CACHE", "off")  # the build must run to see its kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cell")
    p.add_argument("size", type=int, help="input and hidden size")
    p.add_argument("batch", type=int)
    p.add_argument("--target", default="cuda")
    p.add_argument("--tol", type=float, default=1e-4, help="largest error relative to the output's largest value")
    p.add_argument("--proj-size", type=int, default=0,
                   help="an LSTM with projections")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    import tvmrnn
    import tvmrnn.runtime.build as build_module

    seen = {}
    original = build_module.scheduler

    def scheduler(target, *args, **kwargs):
        schedule, *rest = original(target, *args, **kwargs)

        def recorded(kernel):
            func = schedule(kernel)
            seen.setdefault(kernel.name, (kernel, func))
            return func
        return (recorded, *rest)

    build_module.scheduler = scheduler
    tvmrnn.build(a.cell, a.size, a.size, batch_size=a.batch, target=a.target, proj_size=a.proj_size)
    gpu = a.target != "llvm" and "llvm" not in str(a.target)
    dev = tvm.cuda(0) if gpu else tvm.cpu()
    rng = np.random.default_rng(0)
    bad = 0
    for name, (kernel, func) in sorted(seen.items()):
        if "persistent" in name:
            continue
        target = tvmrnn.device.resolve(a.target)
        ours = tvm.compile(tvm.IRModule({"main": func}), target=target)
        reference = tvm.compile(tvm.IRModule({"main": kernel.func}), target="llvm")
        inputs = [rng.standard_normal([int(d) for d in param.shape]).astype(np.float32) for param in func.params]
        got = [tvm.runtime.tensor(x, device=dev) for x in inputs]
        want = [tvm.runtime.tensor(x.copy()) for x in inputs]
        ours["main"](*got)
        reference["main"](*want)
        errors = {}
        for role, g, w in zip(kernel.roles, got, want):
            g, w = g.numpy(), w.numpy()
            errors[role] = float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30))
        wrong = [r for r, e in errors.items() if not e <= a.tol]
        bad += bool(wrong)
        print(("BAD " if wrong else "ok  ") + name, " ".join(f"{r}:{e:.1e}" for r, e in errors.items()), flush=True)
    print(f"{bad} of {len(seen)} kernels wrong")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
