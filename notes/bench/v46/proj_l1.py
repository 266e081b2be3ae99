import sys
from tvmrnn import kernels
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
S, N, K, H, G = [int(v) for v in sys.argv[1:6]]
k = kernels.input_projection(S, N, K, H, G, panel=16)
flops = 2 * S * N * K * H * G
for kw in ({}, dict(row_block=4, red_block=128), dict(row_block=8, red_block=128), dict(row_block=16, red_block=64),
           dict(row_block=8, red_block=64), dict(row_block=16, red_block=128), dict(row_block=32, red_block=64), dict(row_block=8, red_block=256), {}):
    us = time_kernel(default_schedule(k, target, **kw), target)
    print(S, N, K, H, G, kw, f"{us:.0f} us {flops / us / 1e3:.0f} GFLOP/s", flush=True)
