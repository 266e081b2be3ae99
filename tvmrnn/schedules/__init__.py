"""Schedule templates: the schedule a kernel gets when no tuning record matches, per target family.

- :mod:`.cpu`: the register-blocked GEMM micro-kernel and the weight panels it reads;
- :mod:`.cuda`: the tiled SIMT GEMM, its TF32 tensor-core form, the column sum;
- :mod:`.row_tiles`: the per-step GEMMs of many rows, blocks owning rows x units, the epilogue on registers
  (persistent too: each block's units' weights kept in shared memory across steps);
- :mod:`.split_k`: split-K inside a thread block for the per-step GEMMs, and its persistent form
  (each block's slice of the weights kept in shared memory across steps);
- :mod:`.tensor_cores`: the TF32 ``mma`` intrinsics; :mod:`.fast_math`: vectorisable activations;
- :mod:`.variants`: the listed alternatives that tuning seeds its search with.

The schedule a kernel gets when no tuning record matches: correct everywhere, fast on CPUs.

On CPUs every GEMM kernel (a kernel that names its reduction block, :class:`tvmrnn.kernels.Kernel`)
gets a register-blocked GEMM schedule, :func:`cpu_gemm`: the classic micro-kernel of BLIS and
of TVM's "How to optimize GEMM on CPU" tutorial. An ``MR x NR`` tile of the output stays in
vector registers while the reduction runs over it, ``NR`` along the kernel's contiguous
``columns`` (one or a few vectors, the streamed operand read contiguously), ``MR`` rows
unrolled, each input element broadcast once per row; the epilogue (bias, accumulation, the
fused step's gate math) runs on the tile before it leaves registers. The tiles are spread over
cores by one parallel loop, columns outermost, so that with TVM's static partition of parallel
loops a core owns the same slice of the weights at every time step (the weights stay in its own
L2 across steps: the CPU trick of the fused-RNN papers).

On GPUs the GEMM kernels split by how many output rows they have. The per-step GEMMs (rows: the
batch) get split-K inside a thread block with the epilogue fused, :func:`gpu_split_k`: at N = 20
one thread per output element leaves most of an H100 idle, so each block's threads share the
reduction and meet in shared memory. The GEMMs over chunks of steps or over weights get a tiled
SIMT GEMM, :func:`gpu_matmul` (shared-memory tiles read with 128-bit loads, scalar global
accesses); the bias gradient (a sum into one row) a cross-thread reduction, :func:`gpu_column_sum`.

Everything else (pointwise kernels, copies) gets one rule: the output nest
fused and spread over threads (GPU: one thread per output element; CPU: a parallel loop), the
reduction per output element. Tuning (MetaSchedule) measures the default first and replaces it
where it finds better.
"""
from __future__ import annotations

import tvm
from tvm import s_tir
from ..device import device_model
from ..kernels import Kernel

from . import bf16
from .common import (CPU_MIN_PARALLEL, GPU_THREADS, _IN_PLACE, _Unfit, _copy_applied, _extent, _gpu_kind, _writes_param,
                     is_gpu, uses_tf32)
from .cpu import cpu_column_tile, cpu_copy, cpu_gemm, cpu_transpose, gradient_panel, l1_blocks, weight_panel
from .cuda import (GPU_MATMUL, GPU_MATMUL_SHAPES, GPU_SMS, default_matmul_shape, gpu_column_sum, gpu_matmul, gpu_matmul_tf32,
                   matmul_defaults, matmul_k_slices, matmul_shape, slice_variants, tf32_applies, tf32_k_slices, tf32_tile)
from .row_tiles import default_row_tiles, gpu_row_tiles
from .split_k import (GPU_MAX_SHARED_BYTES, PERSISTENT_TILES, default_block_slices, gpu_split_k, keeps_weights_on_chip,
                      persistent_blocks)
from .variants import GPU_MATMUL_VARIANTS, GPU_SPLIT_K_VARIANTS, PERSISTENT_VARIANTS, variants


__all__ = ["apply", "default_schedule", "gpu_gemm", "is_gpu", "cpu_column_tile", "cpu_gemm", "gradient_panel", "l1_blocks",
           "weight_panel", "GPU_MATMUL", "GPU_MATMUL_SHAPES", "default_matmul_shape", "gpu_column_sum", "gpu_matmul",
           "gpu_matmul_tf32", "matmul_k_slices", "matmul_shape", "slice_variants", "tf32_applies", "tf32_k_slices",
           "tf32_tile", "GPU_MAX_SHARED_BYTES", "PERSISTENT_TILES", "default_block_slices", "gpu_split_k", "gpu_row_tiles", "default_row_tiles",
           "keeps_weights_on_chip", "persistent_blocks", "GPU_MATMUL_VARIANTS", "GPU_SPLIT_K_VARIANTS",
           "PERSISTENT_VARIANTS", "variants"]


def gpu_gemm(sch, kernel: Kernel, target, **tiles) -> bool:
    """A GPU GEMM schedule for the kernel, if one applies (else the caller's fallback).

    Few output rows (the per-step GEMMs: the batch, ``N = 20`` at Deep Speech 2 sizes) leave too
    few output elements to fill the GPU with one thread per output tile, so these get split-K
    (:func:`gpu_split_k`); the GEMMs over chunks of steps or over weights (hundreds of rows or
    more) get :func:`gpu_matmul` (shared-memory tiles, a register micro-tile per thread).
    """
    kind = _gpu_kind(sch, kernel)
    if kind == "column sum":
        gpu_column_sum(sch, kernel, sms=device_model(target).multiprocessors or GPU_SMS,
                       **{k: v for k, v in tiles.items() if k in ("columns", "slices", "unroll")})
    elif kind == "split-K":
        gpu_split_k(sch, kernel, **tiles)
    elif kind == "row tiles":
        model = device_model(target)
        gpu_row_tiles(sch, kernel, sms=model.multiprocessors or GPU_SMS, registers=model.registers_per_block, **tiles)
    elif kind == "matmul":
        model = device_model(target)
        sms = model.multiprocessors or GPU_SMS
        if not model.async_copies and tiles.get("matmul", {}).get("async_stages", 0) > 1:
            raise s_tir.ScheduleError(f"{kernel.name}: asynchronous copies need sm_80 or later, not {model.arch}")
        config = {**matmul_defaults(model.async_copies), "tf32": uses_tf32(sch.mod["main"]), "sms": sms,
                  **tiles.get("matmul", {})}
        if "matmul" in tiles:  # a setting asked for (a tuning candidate, a variant): it applies or
            # raises, never falls back to the pointwise rule (which would be measured as it)
            gpu_matmul(sch, kernel, **config)
            return True
        return _copy_applied(sch, lambda copy: gpu_matmul(copy, kernel, **config))
    return kind is not None


def default_schedule(kernel: Kernel, target: tvm.target.Target, **tiles) -> tvm.tirx.PrimFunc:
    """The default schedule; ``tiles`` (``accumulators``, ``column_vectors``) override the CPU
    GEMM's register tile (the ``tile_study`` (a study script, at 34424c0) compares them)."""
    in_place = _IN_PLACE.set(True)  # (schedules that may not fit tried on sch itself: no replays)
    try:
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))  # a copy: Schedule edits its input in place
        apply(sch, kernel, target, **tiles)
        return sch.mod["main"]
    except _Unfit:  # one did not fit, half applied: again, each on a copy first
        pass
    finally:
        _IN_PLACE.reset(in_place)
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    apply(sch, kernel, target, **tiles)
    return sch.mod["main"]


def _transposed(sch, kernel: Kernel, target, row_tile: int, column_tile: int) -> None:
    if not cpu_transpose(sch, kernel, target, row_tile, column_tile):
        raise s_tir.ScheduleError(f"{kernel.name}: not a transposition")


def _vector_copy(sch, kernel: Kernel, target, tasks_per_core: int) -> None:
    if not cpu_copy(sch, kernel, target, tasks_per_core):
        raise s_tir.ScheduleError(f"{kernel.name}: not a copy along its innermost axis")


def apply(sch, kernel: Kernel, target: tvm.target.Target, **tiles) -> None:
    """Schedule the kernel held by ``sch`` (its ``main``) the default way. Everything goes through
    ``sch``'s primitives, so its trace replays the default schedule: tuning measures it as a
    candidate like any other (:func:`tvmrnn.tune.tuner.tune`)."""
    if kernel.gemm is not None and not is_gpu(target):
        if bf16.is_bf16_step(sch) and tiles.get("amx", 1) and bf16.step_amx_applies(sch, kernel, target):
            bf16.cpu_step_amx(sch, kernel, target)
        elif bf16.is_bf16_step(sch):
            bf16.cpu_step_bf16(sch, kernel, target, **{k: v for k, v in tiles.items() if k == "accumulators"})
        elif bf16.is_bf16_gemm(sch) and tiles.get("amx", 1) and bf16.projection_amx_applies(sch, kernel, target):
            bf16.cpu_gemm_amx(sch, kernel, target, **{k: v for k, v in tiles.items()
                                                      if k in ("tasks_per_core", "panel_blocks")})
        elif bf16.is_bf16_gemm(sch):
            bf16.cpu_gemm_bf16(sch, kernel, target, **{k: v for k, v in tiles.items()
                                                       if k in ("accumulators", "tasks_per_core")})
        else:
            cpu_gemm(sch, kernel, target, **tiles)
        return
    blocks = persistent_blocks(sch.mod["main"])
    if blocks:  # a block keeps its slice of the weights in as much shared memory as the device gives
        budget = device_model(target).shared_bytes_per_block
        if kernel.gemm is not None and _gpu_kind(sch, kernel) == "row tiles":
            tiles = {"stationary_bytes": budget, "max_blocks": blocks, **tiles}
        else:
            tiles = {**PERSISTENT_TILES, "stationary_bytes": budget, "max_blocks": blocks, **tiles}
    if kernel.gemm is not None and gpu_gemm(sch, kernel, target, **tiles):
        return
    if kernel.gemm is None and not is_gpu(target) and bf16.is_state_rounding(sch):
        bf16.cpu_round_state(sch, kernel, target, **{k: v for k, v in tiles.items() if k == "tasks_per_core"})
        return
    if kernel.gemm is None and not is_gpu(target) and tiles.get("transpose", 1) and _copy_applied(
            sch, lambda s: _transposed(s, kernel, target, tiles.get("row_tile", 32), tiles.get("column_tile", 16))):
        return
    if kernel.gemm is None and not is_gpu(target) and _copy_applied(
            sch, lambda s: _vector_copy(s, kernel, target, tiles.get("tasks_per_core", 4))):
        return
    params = sch.mod["main"].params
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    outputs = [b for b in blocks if _writes_param(sch, b, params)]
    intermediates = [b for b in blocks if not _writes_param(sch, b, params)]
    loops = sch.get_loops(outputs[0])
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = _extent(sch, fused)
    if is_gpu(target):
        threads = min(tiles.get("threads", GPU_THREADS), total)
        block_loop, thread_loop = sch.split(fused, [None, threads])
        sch.bind(block_loop, "blockIdx.x")
        sch.bind(thread_loop, "threadIdx.x")
        anchor = thread_loop
    else:
        anchor = fused
        if total >= CPU_MIN_PARALLEL:
            workers = max(1, int(target.attrs.get("num-cores", 0) or 0)) * tiles.get("tasks_per_core", 4) or 64
            outer, anchor = sch.split(fused, [min(workers, total), None])
            sch.parallel(outer)
    for block in reversed(intermediates):
        sch.compute_at(block, anchor)
        if is_gpu(target):
            sch.set_scope(block, 0, "local")

