"""Experiment: the packed weight gradient with `a` in row panels (K/R, steps, batch, R)."""
from tvm import te
from tvmrnn import kernels
from tvmrnn.kernels import _make, F32
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
S, B, K, H, G = 16, 64, 1024, 1024, 3
flops = 2 * S * B * K * H * G

def apanel_kernel(R):
    a = te.placeholder((K // R, S, B, R), F32, "a")
    dg = te.placeholder((S, B, H, G), F32, "dg")
    t = te.reduce_axis((0, S), "t"); n = te.reduce_axis((0, B), "n")
    acc = te.placeholder((K, H, G), F32, "acc")
    mm = te.compute(acc.shape, lambda k, j, g: te.sum(a[k // R, t, n, k % R] * dg[t, n, j, g], axis=[t, n]), name="matmul")
    out = te.compute(acc.shape, lambda k, j, g: acc[k, j, g] + mm[k, j, g], name="dw")
    return _make(f"wgrad_apanel{R}", {"dg": dg, "a": a, "acc": acc}, {"dw": out}, gemm="matmul", columns=("j", "g"))

base = kernels.weight_gradient(S, B, K, H, G, packed=True)
print("rows    ", f"{flops / time_kernel(default_schedule(base, target), target) / 1e3:.0f} GFLOP/s")
for R in (8, 16, 64):
    k = apanel_kernel(R)
    try:
        print(f"apanel{R}", f"{flops / time_kernel(default_schedule(k, target), target) / 1e3:.0f} GFLOP/s")
    except Exception as e:
        print(R, type(e).__name__, str(e)[:200])
