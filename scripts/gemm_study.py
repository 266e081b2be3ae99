#!/usr/bin/env python3
"""How the GPU's all-steps GEMM schedule and its shape change their speed (and how far from cuBLAS).

    python scripts/gemm_study.py                       # DS2 LSTM, 256-step chunks, default configs
    python scripts/gemm_study.py --configs dlight "k_tile=16" "rows=2x8x4,pipeline=0"

For the input projection, weight gradient and input gradient GEMMs of one 256-step chunk
(T=256, N=20, I=H=800, G gates: 5120 x 800 x 3200 for the LSTM), builds each ``--configs`` entry,
checks its output against the first entry's on the same inputs, and prints the median time and
TFLOP/s, beside PyTorch's (cuBLAS, TF32 off) GEMM of the same shape. An entry is either
``dlight[:key=value,...]`` (dlight's ``Matmul`` with scalar accesses, the default before v8; keys
of its config: block_size_x/y, micro_size_x/y/k, vector_size, vthread_x/y, unroll) or overrides of
:data:`tvmrnn.schedules.GPU_MATMUL` for :func:`tvmrnn.schedules.gpu_matmul`
(``rows=2x16x4``, ``cols=...``, ``k_tile=16``, ``pipeline=0``, ``tf32=1``: TF32 tensor cores,
:func:`tvmrnn.schedules.cuda.gpu_matmul_tf32`, its tile set by ``tf32_warps=2x4``,
``tf32_fragments=4x2``, ``tf32_k_tile=32``, ``tf32_pipeline=1``; empty: the default). A TF32 entry's difference
from the first entry is TF32's rounding (~1e-3), not an error.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_CONFIGS = [
    "dlight",  # the default before v8: dlight's Matmul, 8 x 16 threads, 4 x 4 micro-tiles, k 16
    "",  # gpu_matmul's default (GPU_MATMUL, the block shape of matmul_shape)
    "rows=2x16x4,cols=2x16x4",  # GPU_MATMUL_SHAPES: 128 x 128
    "rows=2x8x4,cols=2x16x4",  # 64 x 128
    "rows=2x16x4,cols=2x8x4",  # 128 x 64
    "rows=2x32x4,cols=2x8x4",  # 256 x 64
    "rows=2x8x4,cols=2x8x4",  # 64 x 64
    "rows=1x8x4,cols=1x16x4",  # 32 x 64
    "k_tile=8",
    "pipeline=1",
    "tf32=1",  # TF32 tensor cores (build(..., allow_tf32=True)); compared with cuBLAS's TF32 too
]


def parse_config(text: str) -> tuple[str, dict]:
    """``("dlight", overrides)`` or ``("gpu_matmul", overrides)``."""
    kind = "gpu_matmul"
    if text.startswith("dlight"):
        kind, text = "dlight", text[len("dlight"):].lstrip(":")

    def value(v):
        return tuple(int(x) for x in v.split("x")) if "x" in v else int(v)
    config = {k: value(v) for k, v in (item.split("=") for item in text.split(",") if item)}
    tile = {k[5:]: config.pop(k) for k in list(config) if k.startswith("tf32_")}  # tf32_warps=2x4, ...
    if tile:
        config["tf32"] = tile
    return kind, config


def schedule(kernel, target, text):
    """The kernel's function scheduled as the ``--configs`` entry says."""
    from tvm import s_tir
    from tvm.s_tir import dlight
    from tvmrnn import schedules as ds
    kind, config = parse_config(text)
    if kind == "dlight":
        rule = dlight.gpu.Matmul()
        base = rule.get_configs(target)
        for key, v in {"vector_size": 1, **config}.items():
            setattr(base, key, v)
        rule.get_configs = lambda _target: base
        with target:
            return rule.apply(s_tir.renew_defs(kernel.func), target, False).mod["main"]
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    ds.apply(sch, kernel, target, matmul=config)
    return sch.mod["main"]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--gates", type=int, default=4)
    p.add_argument("--in-size", type=int, default=None, help="the layer input's size (default: the hidden size)")
    p.add_argument("--kernels", nargs="+", default=["input_projection", "weight_gradient", "input_gradient"])
    a = p.parse_args()
    import numpy as np
    import torch
    import tvm
    from tvmrnn import schedules as ds
    from tvmrnn import kernels
    from tvmrnn.program.sequence import compile_module
    T, N, H, G = a.steps, a.N, a.hidden_size, a.gates
    K = a.in_size or H
    makers = {
        "input_projection": lambda: kernels.input_projection(T, N, K, H, G),
        "weight_gradient": lambda: kernels.weight_gradient(T, N, K, H, G),
        "input_gradient": lambda: kernels.input_gradient(T, N, K, H, G, accumulate=False),
    }
    target = tvm.target.Target("nvidia/nvidia-h100") if "H100" in torch.cuda.get_device_name() else tvm.target.Target("cuda")
    dev = tvm.cuda()
    flops = 2 * T * N * K * H * G
    torch.backends.cuda.matmul.allow_tf32 = False
    ta, tb = torch.randn(T * N, K, device="cuda"), torch.randn(K, H * G, device="cuda")
    print(f"{torch.cuda.get_device_name()}  {T * N} x {K} x {H * G} GEMMs ({flops / 1e9:.1f} GFLOP)")
    cublas_us = _torch_us(lambda: torch.mm(ta, tb))
    print(f"cuBLAS (torch.mm, TF32 off): {cublas_us:9.1f} us  {flops / cublas_us / 1e6:5.1f} TFLOP/s")
    torch.backends.cuda.matmul.allow_tf32 = True
    tf32_us = _torch_us(lambda: torch.mm(ta, tb))
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"cuBLAS (torch.mm, TF32 on):  {tf32_us:9.1f} us  {flops / tf32_us / 1e6:5.1f} TFLOP/s")
    for name in a.kernels:
        kernel = makers[name]()
        shapes = [[int(s) for s in param.shape] for param in kernel.func.params]
        rng = np.random.default_rng(0)
        host = [rng.uniform(-0.5, 0.5, s).astype("float32") for s in shapes]
        reference = None
        (vi, ti, mi), (vj, tj, mj) = ds.default_matmul_shape(kernel)
        print(f"{kernel.name}: default block {vi * ti * mi} x {vj * tj * mj}")
        for text in a.configs:
            try:
                func = schedule(kernel, target, text)
                lib = compile_module(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target).jit()
                args = [tvm.runtime.tensor(h, device=dev) for h in host]
                lib["main"](*args)
                out = args[-1].numpy()
                if reference is None:
                    reference = out
                err = float(np.abs(out - reference).max() / (np.abs(reference).max() + 1e-30))
                timer = lib.time_evaluator("main", dev, number=20, repeat=5)
                us = 1e6 * statistics.median(timer(*args).results)
                result = f"{us:9.1f} us {flops / us / 1e6:5.1f} TFLOP/s  max rel diff {err:.1e}"
            except Exception as e:  # a config that does not fit (shared memory, registers) is reported
                result = f"failed: {str(e).strip().splitlines()[-1][:90]}"
            print(f"{kernel.name:45s} {text or 'default'}: {result}", flush=True)


def _torch_us(fn, reps: int = 20) -> float:
    import torch
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


if __name__ == "__main__":
    main()
