"""The bf16 projection on AMX alone: one DS2 chunk (16 steps x 20 rows, K = H = 800, LSTM), its
schedule's knobs and thread counts. Usage: amx_projection.py THREADS [tasks_per_core,panel_blocks ...]
(TVM's own pool: TVMRNN_THREAD_POOL=tvm TVM_NUM_THREADS=THREADS)."""
import sys, time, statistics, warnings
warnings.simplefilter("ignore")
import tvm
from tvm import s_tir
from tvmrnn import kernels, schedules
from tvmrnn.program.sequence import compile_module
from tvmrnn.runtime.profile import random_tensors
from tvmrnn.schedules import bf16
bf16.request_amx()
threads = int(sys.argv[1])
steps, batch, K, H = 16, 20, 800, 800
target = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16})
k = kernels.input_projection(steps, batch, K, H, 4, panel=16, bf16=True)
settings = [tuple(map(int, s.split(","))) for s in sys.argv[2:]] or [(2, 0)]
args = None
for tpc, pb in settings:
    sch = s_tir.Schedule(s_tir.renew_defs(k.func))
    schedules.apply(sch, k, target, tasks_per_core=tpc, panel_blocks=pb)
    func = sch.mod["main"]
    lib = compile_module(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    f = lib["main"]
    if args is None:
        args = random_tensors([[int(s) for s in p.shape] for p in func.params], tvm.cpu(0))
    for _ in range(20):
        f(*args)
    ts = []
    for _ in range(200):
        t = time.perf_counter(); f(*args); ts.append(time.perf_counter() - t)
    us = 1e6 * statistics.median(ts)
    print(f"threads {threads:2d} tasks_per_core {tpc} panel_blocks {pb:2d}: {us:8.1f} us  "
          f"{steps * batch * K * 4 * H / us / 1e6:.2f} TMAC/s", flush=True)
