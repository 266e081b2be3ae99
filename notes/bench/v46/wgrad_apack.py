"""Experiment: the packed weight gradient (panels) with `a` packed in R-row panels (K/R, S, B, R)."""
import sys
from tvm import te
from tvmrnn import kernels
from tvmrnn.kernels import _make, F32, gradient_panels_shape, weight_gradient_shape
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
S, B, K, H, G, P = [int(v) for v in sys.argv[1:7]] if len(sys.argv) > 6 else (16, 64, 1024, 1024, 4, 16)
flops = 2 * S * B * K * H * G

def apack_kernel(R, acc_regs):
    a = te.placeholder((K // R, S, B, R), F32, "a")
    dg = te.placeholder(gradient_panels_shape(S, B, H, G, P), F32, "dg")
    t = te.reduce_axis((0, S), "t"); n = te.reduce_axis((0, B), "n")
    acc = te.placeholder(weight_gradient_shape(K, H, G, P), F32, "acc")
    mm = te.compute(acc.shape, lambda p, k, u, g: te.sum(a[k // R, t, n, k % R] * dg[p, t, n, u, g], axis=[t, n]), name="matmul")
    out = te.compute(acc.shape, lambda p, k, u, g: acc[p, k, u, g] + mm[p, k, u, g], name="dw")
    return _make(f"wgrad_apack{R}_t{S}", {"dg": dg, "a": a, "acc": acc}, {"dw": out}, gemm="matmul", columns=("u", "g"))

base = kernels.weight_gradient(S, B, K, H, G, packed=True, panel=P)
for rep in range(2):
    print("panels      ", f"{flops / time_kernel(default_schedule(base, target), target) / 1e3:.0f} GFLOP/s", flush=True)
    for R, regs in ((4, 16), (4, 24), (8, 32), (2, 8)):
        if K % R: continue
        k = apack_kernel(R, regs)
        try:
            print(f"apack R={R} acc={regs}", f"{flops / time_kernel(default_schedule(k, target, accumulators=regs), target) / 1e3:.0f} GFLOP/s", flush=True)
        except Exception as e:
            print(R, type(e).__name__, str(e)[:200])
