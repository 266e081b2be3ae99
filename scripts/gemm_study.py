#!/usr/bin/env python3
"""How dlight's Matmul config changes the GPU's all-steps GEMMs (and how far they are from cuBLAS).

    python scripts/gemm_study.py                       # DS2 LSTM, 256-step chunks, default configs
    python scripts/gemm_study.py --configs "block_size_x=16,block_size_y=16,micro_size_x=8,micro_size_y=8"

For the input projection, weight gradient and input gradient GEMMs of one 256-step chunk
(T=256, N=20, I=H=800, G gates: 5120 x 800 x 3200 for the LSTM), builds each ``--configs`` entry
(overrides of :data:`tvmrnn.default_schedule.GPU_MATMUL` on dlight's CUDA config: block_size_x/y,
micro_size_x/y/k, vector_size, vthread_x/y, unroll), checks its output against the first entry's
on the same inputs, and prints the median time and TFLOP/s, beside PyTorch's (cuBLAS, TF32 off)
GEMM of the same shape. The buffers here are whole (aligned); vector sizes above 1 are only
safe in a build if every view the driver hands the kernel is aligned too.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_CONFIGS = [
    "",  # the default (GPU_MATMUL on dlight's config: 8 x 16 threads, 4 x 4 micro-tile, k 16)
    "vector_size=2",
    "vector_size=4",
    "block_size_x=16,block_size_y=16,micro_size_x=4,micro_size_y=4",
    "block_size_x=16,block_size_y=16,micro_size_x=8,micro_size_y=8,micro_size_k=8",
    "block_size_x=16,block_size_y=16,micro_size_x=8,micro_size_y=8,micro_size_k=8,vector_size=4",
    "block_size_x=16,block_size_y=8,micro_size_x=8,micro_size_y=8,micro_size_k=8",
    "block_size_x=8,block_size_y=16,micro_size_x=8,micro_size_y=4",
    "block_size_x=8,block_size_y=16,micro_size_x=4,micro_size_y=8",
    "block_size_x=16,block_size_y=16,micro_size_x=8,micro_size_y=4,micro_size_k=16",
]


def parse_config(text: str) -> dict:
    return {k: int(v) for k, v in (item.split("=") for item in text.split(",") if item)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--gates", type=int, default=4)
    p.add_argument("--kernels", nargs="+", default=["input_projection", "weight_gradient", "input_gradient"])
    a = p.parse_args()
    import numpy as np
    import torch
    import tvm
    from tvm import s_tir
    from tvmrnn import default_schedule as ds
    from tvmrnn import kernels
    T, N, H, G = a.steps, a.N, a.hidden_size, a.gates
    makers = {
        "input_projection": lambda: kernels.input_projection(T, N, H, H, G),
        "weight_gradient": lambda: kernels.weight_gradient(T, N, H, H, G),
        "input_gradient": lambda: kernels.input_gradient(T, N, H, H, G, accumulate=False),
    }
    target = tvm.target.Target("nvidia/nvidia-h100") if "H100" in torch.cuda.get_device_name() else tvm.target.Target("cuda")
    dev = tvm.cuda()
    flops = 2 * T * N * H * H * G
    torch.backends.cuda.matmul.allow_tf32 = False
    ta, tb = torch.randn(T * N, H, device="cuda"), torch.randn(H, H * G, device="cuda")
    print(f"{torch.cuda.get_device_name()}  {T * N} x {H} x {H * G} GEMMs ({flops / 1e9:.1f} GFLOP)")
    cublas_us = _torch_us(lambda: torch.mm(ta, tb))
    print(f"cuBLAS (torch.mm, TF32 off): {cublas_us:9.1f} us  {flops / cublas_us / 1e6:5.1f} TFLOP/s")
    for name in a.kernels:
        kernel = makers[name]()
        shapes = [[int(s) for s in param.shape] for param in kernel.func.params]
        rng = np.random.default_rng(0)
        host = [rng.uniform(-0.5, 0.5, s).astype("float32") for s in shapes]
        reference = None
        for text in a.configs:
            config = parse_config(text)
            try:
                sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
                ds.apply(sch, kernel, target, matmul=config)
                lib = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                                  target=target).jit()
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
