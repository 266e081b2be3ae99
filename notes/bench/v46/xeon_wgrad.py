"""The CPU weight gradient against torch.addmm at the same sizes, on this host's threads."""
import os, sys, time, numpy as np, torch
from tvmrnn import kernels
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
threads = int(sys.argv[1]) if len(sys.argv) > 1 else os.cpu_count()
torch.set_num_threads(threads)
target = host_target()
print(target, "threads", threads)
for S, B, K, H, G in ((16, 64, 1024, 1024, 3), (16, 64, 1024, 1024, 4), (16, 20, 800, 800, 4), (32, 20, 800, 800, 4), (16, 256, 512, 512, 4)):
    flops = 2 * S * B * K * H * G
    res = []
    for panel, kw in ((0, {}), (16, {}), (0, dict(row_block=8, red_block=128))):
        k = kernels.weight_gradient(S, B, K, H, G, packed=True, panel=panel)
        try:
            us = time_kernel(default_schedule(k, target, **kw), target)
            res.append(f"panel={panel} {kw or ''} {flops / us / 1e3:.0f}")
        except Exception as e:
            res.append(f"{kw} {type(e).__name__}")
    a = torch.randn(S * B, K); dg = torch.randn(S * B, H * G); acc = torch.randn(K, H * G)
    for _ in range(3): torch.addmm(acc, a.T, dg)
    ts = []
    for _ in range(20):
        t = time.perf_counter(); torch.addmm(acc, a.T, dg); ts.append(time.perf_counter() - t)
    us_t = np.median(ts) * 1e6
    print(f"S={S} B={B} K={K} H={H} G={G}: tvmrnn GFLOP/s {'; '.join(res)} | torch addmm {flops / us_t / 1e3:.0f}", flush=True)
