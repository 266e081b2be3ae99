#!/usr/bin/env python3
"""The CPU weight gradient by the layout of its gate gradients, beside the input projection and MKL.

    TVM_NUM_THREADS=16 python scripts/wgrad_study.py --rounds 8

The weight gradient of a 16-step chunk (``dw[k, c] += sum_r a[r, k] dg[r, c]``, r over the chunk's
T*N rows, c over the H*G gate columns) is the same GEMM as the input projection (``gx[r, c] =
sum_k x[r, k] w[k, c]``) with the operands' roles swapped, yet it ran at 57% of the projection's
rate in v24's profiles (1.57 against 2.78 TFLOP/s). The projection streams its weights from
column panels, contiguous along its reduction; the weight gradient streams ``dg``'s rows, 12.8 KB
apart. Variants, each timed alone round after round in one process (arguments on huge pages):

- ``rows``: tvmrnn's rows kernel (``kernels.weight_gradient(packed=True)``: the GRU's, and every
  cell's with ``TVMRNN_GRADIENT_PANELS=0``), ``dg`` as ``(R, H*G)``, with its default L1 blocking
  and without (``rows-unblocked``);
- ``panels``: ``dg`` panel-major, ``(P, R, C)`` with C = ``--panel-columns`` (a panel of 16 units'
  4 gates on AVX-512: 64 floats), output ``(K, P, C)``, so that a tile's reduction walks one
  contiguous stream, as the projection's does; with the default L1 blocking and without;
- ``panels-out``: the same with the output panel-major too, ``(P, K, C)`` (the forward weights'
  layout): what tvmrnn builds since v25 for the LSTM and the RNNs (``kernels.weight_gradient(panel=u)``,
  defined here on its own);
- ``at-panels``, ``at-rows``: ``a`` transposed, ``(K, R)``, so that a tile's broadcasts walk
  its rows as the projection's walk ``x``'s (with ``dg`` in panels or rows);
- ``pack``: the copy of ``dg`` from rows into panels, the price of ``panels`` where ``dg`` is
  made in rows;
- ``projection``: tvmrnn's input projection of the same chunk (its weight panels);
- ``torch``: PyTorch's ``dg^T @ a`` (MKL) of the same shape.

Every variant's result is checked against NumPy in float64 first (random inputs of the study's
sizes, the same values permuted into each layout). Prints median microseconds (range) and TFLOP/s.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--gates", type=int, default=4)
    p.add_argument("--panel-columns", type=int, default=64)
    p.add_argument("--number", type=int, default=20)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--variants", nargs="+",
                   default=["rows", "rows-unblocked", "panels", "panels-unblocked", "panels-out",
                            "at-panels", "at-panels-unblocked", "at-rows", "at-rows-unblocked",
                            "pack", "projection", "torch"])
    a = p.parse_args()

    import numpy as np
    import torch
    from tvm import s_tir, te

    import tvmrnn  # noqa: F401  (sets TVM_NUM_THREADS)
    from tvmrnn import schedules as ds
    from tvmrnn import kernels
    from tvmrnn.runtime.profile import kernel_timer
    from tvmrnn.program.sequence import compile_module
    from tvmrnn.device import host_target

    target = host_target()
    T, N, H, G, C = a.steps, a.batch_size, a.hidden_size, a.gates, a.panel_columns
    K, R, W = H, T * N, H * G
    if W % C:
        raise SystemExit(f"--panel-columns {C} does not divide H*G = {W}")
    P = W // C
    flop = 2 * R * K * W
    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS", torch.get_num_threads())))

    def panel_kernel(out_panels: bool, a_t: bool = False, dg_rows: bool = False):
        dg = te.placeholder((R, W) if dg_rows else (P, R, C), "float32", "dg")
        x = te.placeholder((K, R) if a_t else (R, K), "float32", "a")
        r = te.reduce_axis((0, R), "r")
        at = (lambda r, k: x[k, r]) if a_t else (lambda r, k: x[r, k])  # noqa: E731
        dgat = (lambda q, r, c: dg[r, q * C + c]) if dg_rows else (lambda q, r, c: dg[q, r, c])  # noqa: E731
        if a_t or dg_rows:
            acc = te.placeholder((K, P, C), "float32", "acc")
            mm = te.compute(acc.shape, lambda k, q, c: te.sum(at(r, k) * dgat(q, r, c), axis=[r]), name="matmul")
            out = te.compute(acc.shape, lambda k, q, c: acc[k, q, c] + mm[k, q, c], name="dw")
            cols, name = ("q", "c"), "weight_gradient_at" + ("_rows" if dg_rows else "")
        elif out_panels:
            acc = te.placeholder((P, K, C), "float32", "acc")
            mm = te.compute(acc.shape, lambda q, k, c: te.sum(x[r, k] * dg[q, r, c], axis=[r]), name="matmul")
            out = te.compute(acc.shape, lambda q, k, c: acc[q, k, c] + mm[q, k, c], name="dw")
            cols, name = ("c",), "wgrad_panels_out"
        else:
            acc = te.placeholder((K, P, C), "float32", "acc")
            mm = te.compute(acc.shape, lambda k, q, c: te.sum(x[r, k] * dg[q, r, c], axis=[r]), name="matmul")
            out = te.compute(acc.shape, lambda k, q, c: acc[k, q, c] + mm[k, q, c], name="dw")
            cols, name = ("q", "c"), "weight_gradient_panels"  # the family L1_BLOCKS knows
        return kernels._make(f"{name}_t{T}_n{N}_k{K}_c{W}", {"dg": dg, "a": x, "acc": acc}, {"dw": out},
                             gemm="matmul", columns=cols)

    def scheduled(kernel, blocked=True):
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
        if blocked:
            blocks = ds.L1_BLOCKS["weight_gradient"]
            ds.cpu_gemm(sch, kernel, target, row_block=blocks[0], red_block=blocks[1])
        else:
            ds.cpu_gemm(sch, kernel, target, row_block=1, red_block=10 ** 9)
        return sch.mod["main"]

    rows = kernels.weight_gradient(T, N, K, H, G, packed=True)
    funcs = {
        "rows": (ds.default_schedule(rows, target), "rows"),
        "rows-unblocked": (scheduled(rows, blocked=False), "rows"),
        "panels": (scheduled(panel_kernel(False)), "panels"),
        "panels-unblocked": (scheduled(panel_kernel(False), blocked=False), "panels"),
        "panels-out": (scheduled(panel_kernel(True)), "panels-out"),
        "panels-out-unblocked": (scheduled(panel_kernel(True), blocked=False), "panels-out"),
        "at-panels": (scheduled(panel_kernel(False, a_t=True)), "at-panels"),
        "at-panels-unblocked": (scheduled(panel_kernel(False, a_t=True), blocked=False), "at-panels"),
        "at-rows": (scheduled(panel_kernel(False, a_t=True, dg_rows=True)), "at-rows"),
        "at-rows-unblocked": (scheduled(panel_kernel(False, a_t=True, dg_rows=True), blocked=False), "at-rows"),
    }

    # correctness: the same values in each layout against NumPy float64
    rng = np.random.default_rng(1)
    dg_rc = rng.uniform(-1, 1, (R, W)).astype("float32")
    a_rk = rng.uniform(-1, 1, (R, K)).astype("float32")
    acc_kc = rng.uniform(-1, 1, (K, W)).astype("float32")
    want = acc_kc.astype("float64") + a_rk.astype("float64").T @ dg_rc.astype("float64")
    to_panels = lambda m: np.ascontiguousarray(m.reshape(m.shape[0], P, C).transpose(1, 0, 2))  # noqa: E731
    layouts = {
        "rows": ([dg_rc.reshape(T, N, H, G), a_rk.reshape(T, N, K), acc_kc.reshape(K, H, G)],
                 lambda out: out.reshape(K, W)),
        "panels": ([to_panels(dg_rc), a_rk, acc_kc.reshape(K, P, C)], lambda out: out.reshape(K, W)),
        "panels-out": ([to_panels(dg_rc), a_rk, to_panels(acc_kc)],
                       lambda out: out.transpose(1, 0, 2).reshape(K, W)),
        "at-panels": ([to_panels(dg_rc), np.ascontiguousarray(a_rk.T), acc_kc.reshape(K, P, C)],
                      lambda out: out.reshape(K, W)),
        "at-rows": ([dg_rc, np.ascontiguousarray(a_rk.T), acc_kc.reshape(K, P, C)], lambda out: out.reshape(K, W)),
    }
    import tvm
    for name in a.variants:
        if name not in funcs:
            continue
        func, layout = funcs[name]
        ins, back = layouts[layout]
        lib = compile_module(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target).jit()
        args = [tvm.runtime.tensor(v) for v in ins] + [tvm.runtime.tensor(np.zeros(ins[2].shape, "float32"))]
        lib["main"](*args)
        err = np.abs(back(args[-1].numpy()) - want).max() / np.abs(want).max()
        print(f"check {name:18s} max rel err {err:.1e}", flush=True)
        if err > 1e-5:
            raise SystemExit(f"{name}: wrong result")

    runs = []
    for name in a.variants:
        if name in funcs:
            timer, args = kernel_timer(funcs[name][0], target, number=a.number, repeat=1)
            runs.append((name, lambda timer=timer, args=args: timer(*args).mean, []))
        elif name == "pack":
            src = te.placeholder((R, P, C), "float32", "dg")
            dst = te.compute((P, R, C), lambda q, r, c: src[r, q, c], name="panels")
            func = ds.default_schedule(kernels._make(f"pack_r{R}_p{P}_c{C}", {"dg": src}, {"out": dst}), target)
            timer, args = kernel_timer(func, target, number=a.number, repeat=1)
            runs.append(("pack dg into panels", lambda timer=timer, args=args: timer(*args).mean, []))
        elif name == "projection":
            panel = ds.weight_panel(target, G, H)
            func = ds.default_schedule(kernels.input_projection(T, N, K, H, G, panel=panel), target)
            timer, args = kernel_timer(func, target, number=a.number, repeat=1)
            runs.append((f"projection (panel {panel})", lambda timer=timer, args=args: timer(*args).mean, []))
        elif name == "torch":
            dg_t, a_t, acc_t = torch.randn(R, W), torch.randn(R, K), torch.randn(K, W)

            def torch_run(dg_t=dg_t, a_t=a_t, acc_t=acc_t):
                import time
                t0 = time.perf_counter()
                for _ in range(a.number):
                    acc_t.addmm_(a_t.t(), dg_t)
                return (time.perf_counter() - t0) / a.number
            runs.append(("torch acc += a^T @ dg", torch_run, []))
        else:
            raise SystemExit(f"unknown variant {name}")
    for _ in range(a.rounds):
        for _, run, times in runs:
            times.append(1e6 * run())
    print(f"threads {os.environ.get('TVM_NUM_THREADS')}, chunk {T} steps x N {N}: {R} x {K} x {W}, "
          f"{flop / 1e9:.2f} GFLOP, {a.rounds} rounds of {a.number} calls")
    for label, _, times in runs:
        med = statistics.median(times)
        print(f"{label:28s} {med:9.1f} us (rounds {min(times):.1f}-{max(times):.1f})  "
              f"{flop / med / 1e6:6.2f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
