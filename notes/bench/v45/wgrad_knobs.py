import itertools
from tvmrnn import kernels
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
k = kernels.weight_gradient(16, 64, 1024, 1024, 3, packed=True)
flops = 2 * 16 * 64 * 1024 * 1024 * 3
print(k.name)
for kw in ({}, dict(accumulators=28), dict(column_vectors=2), dict(column_vectors=3), dict(row_block=16, red_block=64),
           dict(row_block=8, red_block=128), dict(row_block=4, red_block=256), dict(row_block=8, red_block=32),
           dict(accumulators=28, column_vectors=4, row_block=8, red_block=128)):
    us = time_kernel(default_schedule(k, target, **kw), target)
    print(kw, f"{us:.0f} us {flops / us / 1e3:.0f} GFLOP/s")
