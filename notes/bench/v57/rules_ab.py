"""A/B of two default rules (v57), each shape built the old way and the new way in one process:
both builds' gradients on the same inputs compared (largest difference relative to the largest
gradient), and their passes timed in turn (``pass_tuning.compare``, 11 pairs).

- ``backward``: split-K backward steps persistent below ``common.GPU_BACKWARD_PERSISTENT_WORK``
  multiply-adds a step (old: always one launch a step).
- ``column_sum``: the bias gradient's block of ``cuda.column_sum_tile`` (columns that give half
  the SMs a block) with threads along the input's memory order (old: 32 x 8 threads, along the
  output's order).
- ``gate_threads``: the forwards' persistent row-tile steps of independent blocks with
  ``gpu_row_tiles(gate_threads=True)`` (one thread a gate column, v57; not a default yet) where
  it applies ("new"), against the default ("old"). Which steps took it is printed.
- ``registers``: the same with ``register_weights=True`` too (each thread's weights in registers
  for every step) where that fits, else gate threads alone where they apply.

    python notes/bench/v57/rules_ab.py backward lstm:8:128:128:100 gru:8:128:128:100
    python notes/bench/v57/rules_ab.py gate_threads lstm:128:96:96:100 gru:128:128:128:100
    python notes/bench/v57/rules_ab.py registers lstm:128:96:96:100 gru:128:128:128:100
    TARGET=llvm python notes/bench/v57/rules_ab.py backward gru:4:16:16:20   # this CPU (no change: a dry run)
"""
from __future__ import annotations

import os
import sys
import time
import warnings

import numpy as np

import tvmrnn
from tvmrnn.runtime import pass_tuning
from tvmrnn.schedules import common, cuda


GATE_THREADS = []  # the steps that took gate threads


def new_rule(rule):
    if rule not in ("gate_threads", "registers"):
        return
    import tvm
    import tvmrnn.schedules as schedules
    plain = schedules.gpu_row_tiles

    def gate_threads(sch, kernel, **tiles):
        if kernel.name.startswith("recurrent_step") and tiles.get("max_blocks"):
            for registers in ((True, False) if rule == "registers" else (False,)):
                try:  # (each raises before changing sch where it does not apply)
                    plain(sch, kernel, gate_threads=True, register_weights=registers, **tiles)
                    GATE_THREADS.append(kernel.name + (" (registers)" if registers else ""))
                    return
                except tvm.s_tir.ScheduleError:
                    pass
        plain(sch, kernel, **tiles)
    schedules.gpu_row_tiles = gate_threads
    return plain


def old_rule(rule):
    if rule in ("gate_threads", "registers"):
        return
    if rule == "backward":
        common.GPU_BACKWARD_PERSISTENT_WORK = 0
    else:
        cuda.column_sum_tile = lambda outputs, sms=132: (32, 8)
        cuda._in_input_order = lambda sch, gemm, output: sch.get_loops(output)


def gradients(rnn, cell, n, h, T):
    rng = np.random.default_rng(0)
    G = {"lstm": 4, "gru": 3}.get(cell, 1)
    D = 2 if rnn.config.bidirectional else 1
    i = rnn.config.input_size
    params = {}
    for suffix in ("", "_reverse")[:D]:
        params.update({f"weight_ih_l0{suffix}": rng.uniform(-0.1, 0.1, (G * h, i)),
                       f"weight_hh_l0{suffix}": rng.uniform(-0.1, 0.1, (G * h, h)),
                       f"bias_ih_l0{suffix}": rng.uniform(-0.1, 0.1, G * h),
                       f"bias_hh_l0{suffix}": rng.uniform(-0.1, 0.1, G * h)})
    w = rnn.pack_weights({k: v.astype(np.float32) for k, v in params.items()})
    x = rng.standard_normal((T, n, i)).astype(np.float32)
    dy = rng.standard_normal((T, n, D * h)).astype(np.float32)
    if rnn.target.kind.name == "cuda":
        import torch
        x, dy = torch.from_numpy(x).cuda(), torch.from_numpy(dy).cuda()
    _, *_, ws = rnn.forward_train(w, x)
    grads = rnn.backward(w, ws, dy=dy)
    return {k: v.cpu().numpy() if hasattr(v, "cpu") else np.asarray(v) for k, v in grads.items()}


def ab(shape, build_before, build_after, label):
    """One shape ``cell:N:H:I:T`` (``cell:N:H:I:T:bi``: bidirectional) built two ways, ``build_before(cell, sizes)`` then
    ``build_after(cell, sizes)``, in this process: build times, both builds' gradients on the same
    inputs compared, passes timed in turn (``pass_tuning.compare``, 11 pairs), one line printed
    (``label`` says which way is which). The loop of v60's ``options_ab.py``, v61's
    ``matmul_ab.py`` and v62's ``constants_ab.py``."""
    cell, n, h, i, T, *bi = shape.split(":")
    n, h, T = int(n), int(h), int(T)
    sizes = dict(input_size=int(i), hidden_size=h, batch_size=n, target=os.environ.get("TARGET", "cuda") or None,
                 tuning_logs=False, cache=False, bidirectional=bi == ["bi"])
    t0 = time.perf_counter()
    before = build_before(cell, sizes)
    t1 = time.perf_counter()
    after = build_after(cell, sizes)
    t2 = time.perf_counter()
    a, b = gradients(before, cell, n, h, T), gradients(after, cell, n, h, T)
    err = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a)
    result = pass_tuning.compare(before, after, pass_tuning.PassTimer(T), pairs=11)
    print(f"{shape} build {t1 - t0:.0f} -> {t2 - t1:.0f} s; gradients agree to {err:.1e}; {label}, "
          f"{result.line()}", flush=True)


def main(rule, shapes):
    warnings.simplefilter("ignore")
    for shape in shapes:
        cell, n, h, i, T = shape.split(":")
        n, h, T = int(n), int(h), int(T)
        sizes = dict(input_size=int(i), hidden_size=h, batch_size=n, target=os.environ.get("TARGET", "cuda") or None,
                     tuning_logs=False, cache=False)
        saved = (common.GPU_BACKWARD_PERSISTENT_WORK, cuda.column_sum_tile, cuda._in_input_order)
        old_rule(rule)
        before = tvmrnn.build(cell, **sizes)
        common.GPU_BACKWARD_PERSISTENT_WORK, cuda.column_sum_tile, cuda._in_input_order = saved
        plain = new_rule(rule)
        after = tvmrnn.build(cell, **sizes)
        if plain is not None:
            import tvmrnn.schedules as schedules
            schedules.gpu_row_tiles = plain
            print(f"  gate threads: {GATE_THREADS}", flush=True)
            GATE_THREADS.clear()
        persistent = {name: [p for p in ("forward", "forward_train", "backward") if rnn.programs[p].uses_persistent_loops]
                      for name, rnn in (("old", before), ("new", after))}
        a, b = gradients(before, cell, n, h, T), gradients(after, cell, n, h, T)
        err = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a)
        result = pass_tuning.compare(before, after, pass_tuning.PassTimer(T), pairs=11)
        print(f"{rule} {shape} persistent {persistent}; gradients agree to {err:.1e}; old -> new, {result.line()}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
