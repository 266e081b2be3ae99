from tvmrnn import kernels
from tvmrnn.schedules import default_schedule, cpu
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
import tvm
target = host_target()
k = kernels.input_projection(16, 256, 512, 512, 4, panel=16)
flops = 2 * 16 * 256 * 512 * 2048
real_split = None
orig = cpu._divisor
for rows in (None, 6, 5, 7):
    if rows:
        cpu._divisor = lambda n, at_most, multiple_of=1, _r=rows: _r if at_most in (6, 5, 7) and multiple_of == 1 else orig(n, at_most, multiple_of)
    else:
        cpu._divisor = orig
    try:
        f = default_schedule(k, target)
        us = time_kernel(f, target)
        print(rows, f"{us:.0f} us {flops / us / 1e3:.0f} GFLOP/s", flush=True)
    except Exception as e:
        print(rows, type(e).__name__, str(e)[:300])
cpu._divisor = orig
