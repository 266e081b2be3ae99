"""Can the tiled GEMM run a chunk whose step count is known only at launch? (v60 study)

One launch per all-steps GEMM for whatever steps are left (instead of the chunk ladder's static
sizes) needs a kernel whose rows (projection, input gradient) or reduction (weight gradient) are a
variable. This compiles the three with ``steps`` a ``tirx.Var`` and prints the guards and loop
bounds that depend on it. Builds do not use it yet (notes/performance.md v60).

    python notes/bench/v60/symbolic_steps_study.py
"""
import tvm
from tvm import s_tir, tirx

from tvmrnn import kernels
from tvmrnn.schedules.cuda import GPU_MATMUL_SHAPES, gpu_matmul

target = tvm.target.Target("nvidia/nvidia-h100")
steps = tirx.Var("steps", "int32")
for kernel, shape in ((kernels.input_projection(steps, 20, 800, 800, 4), 0),
                      (kernels.input_gradient(steps, 20, 800, 800, 4, accumulate=True), 0),
                      (kernels.weight_gradient(steps, 20, 800, 800, 4), 1)):
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    rows, cols = GPU_MATMUL_SHAPES[shape]
    gpu_matmul(sch, kernel, rows=rows, cols=cols, k_slices=1)
    source = tvm.compile(tvm.IRModule({"main": sch.mod["main"].with_attr("target", target)}),
                         target=target).mod.imports[0].inspect_source()
    uses = [line.strip() for line in source.splitlines() if "steps" in line and "__global__" not in line]
    print(f"{kernel.name}: {len(uses)} lines use steps, e.g.")
    for line in uses[:3]:
        print("   ", line[:160])
