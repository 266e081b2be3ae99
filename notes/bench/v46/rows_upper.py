"""How much a 6-row register tile would give: the same kernels at batch 252 (6 divides it) and 256 (4 x 4 tiles)."""
from tvmrnn import kernels
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
for rep in range(2):
    for N in (256, 252, 264):
        for name, k, flops in (("input_projection t16 K=H=512", kernels.input_projection(16, N, 512, 512, 4, panel=16), 2 * 16 * N * 512 * 2048),
                               ("weight_gradient rows t16 K=H=1024 G=3", kernels.weight_gradient(16, N // 4, 1024, 1024, 3, packed=True), 2 * 16 * (N // 4) * 1024 * 3072)):
            us = time_kernel(default_schedule(k, target), target)
            print(f"N={N} {name}: {us:.0f} us {flops / us / 1e3:.0f} GFLOP/s", flush=True)
