import sys
from tvmrnn import kernels
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
S, N, K, H, G = [int(v) for v in sys.argv[1:6]]
flops = 2 * S * N * K * H * G
for rep in range(2):
    for panel, kw in ((16, {}), (16, dict(column_vectors=2)), (8, dict(column_vectors=2)), (4, dict(column_vectors=1)), (8, dict(column_vectors=2, accumulators=20))):
        k = kernels.input_projection(S, N, K, H, G, panel=panel)
        us = time_kernel(default_schedule(k, target, **kw), target)
        print(S, N, K, H, G, "panel", panel, kw, f"{us:.0f} us {flops / us / 1e3:.0f} GFLOP/s", flush=True)
