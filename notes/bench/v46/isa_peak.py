"""The 16-step input projection (N=256 K=H=512 LSTM) with AVX-512 code and with AVX2 code, and
torch.addmm of the same GEMM, on this machine's threads: is our kernel bound by the vector units?"""
import time, numpy as np, torch, tvm
from tvmrnn import kernels
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
torch.set_num_threads(2)
host = host_target()
avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "x86-64-v3", "num-cores": host.attrs["num-cores"]})
flops = 2 * 16 * 256 * 512 * 2048
a = torch.randn(4096, 512); b = torch.randn(512, 2048); c = torch.randn(4096, 2048)
for rep in range(2):
    for name, t in (("avx512", host), ("avx2", avx2)):
        k = kernels.input_projection(16, 256, 512, 512, 4, panel=16 if name == "avx512" else 4)
        us = time_kernel(default_schedule(k, t), t)
        print(name, f"{flops / us / 1e3:.0f} GFLOP/s", flush=True)
    ts = []
    for _ in range(10):
        t0 = time.perf_counter(); torch.addmm(c, a, b); ts.append(time.perf_counter() - t0)
    print("torch addmm", f"{flops / np.median(ts) / 1e9:.0f} GFLOP/s", flush=True)
