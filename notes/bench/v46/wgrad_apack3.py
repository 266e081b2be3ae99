import sys
from tvm import te
from tvmrnn import kernels
from tvmrnn.kernels import _make, F32
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
S, B, K, H, G = [int(v) for v in sys.argv[1:6]] if len(sys.argv) > 5 else (16, 64, 1024, 1024, 3)
flops = 2 * S * B * K * H * G

def apack_rows(R):
    a = te.placeholder((K // R, S, B, R), F32, "a")
    dg = te.placeholder((S, B, H, G), F32, "dg")
    t = te.reduce_axis((0, S), "t"); n = te.reduce_axis((0, B), "n")
    acc = te.placeholder((K, H, G), F32, "acc")
    mm = te.compute(acc.shape, lambda k, j, g: te.sum(a[k // R, t, n, k % R] * dg[t, n, j, g], axis=[t, n]), name="matmul")
    out = te.compute(acc.shape, lambda k, j, g: acc[k, j, g] + mm[k, j, g], name="dw")
    return _make(f"weight_gradient_apack{R}_t{S}", {"dg": dg, "a": a, "acc": acc}, {"dw": out}, gemm="matmul", columns=("j", "g"))

base = kernels.weight_gradient(S, B, K, H, G, packed=True)
from tvmrnn.tune.records import default_schedule as ds2
for rep in range(2):
    print("rows        ", f"{flops / time_kernel(default_schedule(base, target), target) / 1e3:.0f} GFLOP/s", flush=True)
    for R, regs in ((4, 16), (4, 24), (8, 24), (2, 12)):
        if K % R: continue
        k = apack_rows(R)
        print(f"apack R={R} acc={regs}", f"{flops / time_kernel(default_schedule(k, target, accumulators=regs), target) / 1e3:.0f} GFLOP/s", flush=True)
