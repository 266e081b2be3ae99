"""A CPU GEMM kernel alone under cpu_gemm's knobs (v66): the input gradient against the input
projection of the same multiply-adds, on this host, medians of TVM's time_evaluator.

    python notes/bench/v66/cpu_gemm_study.py [T N K H G PANEL]   (default: 16 64 1024 1024 4 64)
"""
import sys
import warnings

from tvmrnn import kernels
from tvmrnn.device import host_target
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.schedules import default_schedule

warnings.simplefilter("ignore")
T, N, K, H, G, P = (int(a) for a in sys.argv[1:7]) if len(sys.argv) > 6 else (16, 64, 1024, 1024, 4, 64)
target = host_target()


def time_us(kernel, **tiles):
    return time_kernel(default_schedule(kernel, target, **tiles), target, number=5, repeat=7)


flops = 2 * T * N * K * H * G
grad = kernels.input_gradient(T, N, K, H, G, accumulate=False, panel=P)
proj = kernels.input_projection(T, N, K, H, G, panel=16)  # (the LSTM build's panels at these sizes)
print(f"{target}  T={T} N={N} K={K} H={H} G={G} panel={P}")
us = time_us(proj)
print(f"{proj.name:50s} default             {us:9.1f} us {flops / us / 1e3:6.1f} GFLOP/s", flush=True)
for tiles in ({}, dict(row_block=8, red_block=64), dict(row_block=4, red_block=128), dict(row_block=8, red_block=256),
              dict(row_block=16, red_block=128), dict(accumulators=16), dict(column_vectors=2),
              dict(column_vectors=2, row_block=8, red_block=128)):
    us = time_us(grad, **tiles)
    print(f"{grad.name:50s} {str(tiles):20s}{us:9.1f} us {flops / us / 1e3:6.1f} GFLOP/s", flush=True)
