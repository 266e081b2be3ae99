"""The schedule a kernel gets when no tuning record matches: simple, correct, never tuned.

One rule serves every kernel in :mod:`tvmrnn.kernels`, because each has the same shape: one
output loop nest (pointwise, possibly several outputs sharing it) fed by at most one
reduction. The output nest is fused and spread over threads (GPU: one thread per output
element; CPU: a parallel loop over contiguous ranges, vectorised innermost where the
target's vector width divides the row); the reduction is computed per output element, in
registers. Tuning (MetaSchedule) replaces this with much better schedules.
"""
from __future__ import annotations

import tvm
from tvm import s_tir

from .kernels import Kernel

GPU_THREADS = 128
CPU_MIN_PARALLEL = 256  # elements below which a parallel region costs more than it saves


def is_gpu(target: tvm.target.Target) -> bool:
    return target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl", "webgpu")


def _writes_param(sch, block, params) -> bool:
    return any(any(r.source.same_as(p) for p in params) for r in sch.get(block).writes)


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def default_schedule(kernel: Kernel, target: tvm.target.Target) -> tvm.tirx.PrimFunc:
    func = s_tir.renew_defs(kernel.func)  # a copy: Schedule edits its input in place
    sch = s_tir.Schedule(func)
    params = func.params
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    outputs = [b for b in blocks if _writes_param(sch, b, params)]
    intermediates = [b for b in blocks if not _writes_param(sch, b, params)]
    loops = sch.get_loops(outputs[0])
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = _extent(sch, fused)
    if is_gpu(target):
        threads = min(GPU_THREADS, total)
        block_loop, thread_loop = sch.split(fused, [None, threads])
        sch.bind(block_loop, "blockIdx.x")
        sch.bind(thread_loop, "threadIdx.x")
        anchor = thread_loop
    else:
        anchor = fused
        if total >= CPU_MIN_PARALLEL:
            workers = max(1, int(target.attrs.get("num-cores", 0) or 0)) * 4 or 64
            outer, anchor = sch.split(fused, [min(workers, total), None])
            sch.parallel(outer)
    for block in reversed(intermediates):
        sch.compute_at(block, anchor)
        if is_gpu(target):
            sch.set_scope(block, 0, "local")
    return sch.mod["main"]
