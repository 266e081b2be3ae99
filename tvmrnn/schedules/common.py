"""What every schedule template shares: target family, loop extents, vectorising, the GEMM's axes
and which GPU GEMM template a kernel takes.
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import sys
import threading

import tvm
import tvm_ffi
from tvm import s_tir
from ..device import device_model
from ..kernels import Kernel, row_groups


GPU_THREADS = 128


# All-steps GEMMs with at most this many output rows get split-K on GPUs (per-thread scalar loads:
# at 48 rows, H = 2048, the GRU's projection took 227 us where streaming its weights takes ~12);
# more rows take the tiled GEMM. 64 until v69: 32 took the GRU at N = 12, H = 2048, T = 60 from
# 9.19 to 8.56 ms training on the H200, LSTM N = 16 H = 1024 1% (notes/performance.md v69).
GPU_SPLIT_K_ROWS = 32


# A per-step GEMM with a fused epilogue takes row tiles instead of split-K
# (:func:`tvmrnn.schedules.row_tiles.gpu_row_tiles`) from this many output rows (the batch) and
# this many multiply-adds (rows x columns x reduction). Split-K gives every block all the rows, so
# each block reads the whole hidden state: at N = 256, H = 256 the LSTM's 256 blocks read 64 MB
# of L2 a step, and row tiles took its forward step from 13.6 us (+ 11 us of grid barrier) to 12.0,
# its backward step from 43.4 to 27.3 us; at N = 128, H = 128 (6.3 M multiply-adds) the GRU's
# split-K steps stayed faster (persistent forward 4.0 us against 5.5), and so did the steps of
# H = 1024 at N = 128 (LSTM training 0.79x cuDNN with split-K, 0.60x with row tiles: the default
# register tile is too small for a GEMM that long; notes/performance.md v33). So: at least this
# many rows, multiply-adds, and at most this many units (hidden size) a problem. A persistent
# step (v34) takes row tiles from this many rows a problem and up to this many units at any work:
# each block keeps its units' weights on chip and stages only its own rows, which took the small
# steps (N = H = 128: split-K's persistent GRU step 4.0 us) to ~2.5 us in their loop.
GPU_ROW_TILE_ROWS = 128
GPU_ROW_TILE_WORK = 1 << 24
GPU_ROW_TILE_UNITS = 512
# A persistent step of a cell of 4 gates or more (the LSTM) also takes row tiles from
# GPU_FEW_ROW_TILE_ROWS rows a problem at up to GPU_FEW_ROW_TILE_UNITS units, in place of
# split-K, where a direction's weights do not fit one block (ROW_GROUP_MAX_WEIGHT_BYTES, below: else
# row groups, or split-K where those are turned off): its blocks split the units and meet at a
# grid barrier a step, each block reading only its own rows (a forward step of at most
# row_tiles.UNIT_GATE_ROWS rows a block: a thread a gate column, its weights in registers). On the
# H100 (notes/performance.md v83, training / inference): N = 96, H = 128 4.42 -> 1.71 / 1.14 ->
# 0.62 ms; N = 48, H = 160 2.58 -> 1.99 / 0.85 -> 0.78; N = 32, H = 126,
# 3 layers 6.28 -> 4.64 / 1.80 -> 1.62. Not past it: the LSTM at N = 32, H = 200 (inference 19%
# slower), N = 100, H = 384 (23% slower; N = 64, H = 256 5% faster); nor the GRU (6-30% slower
# at N = 32-64, H = 170-300). One direction's steps only: both directions stacked in one launch
# (twice the blocks) were not measured and keep split-K.
GPU_FEW_ROW_TILE_ROWS = 32
GPU_FEW_ROW_TILE_UNITS = 160
GPU_FEW_ROW_TILE_GATES = 4


# Past row tiles' units (more than GPU_ROW_TILE_UNITS), a per-step GEMM of GPU_ROW_TILE_ROWS rows
# or more is a large GEMM (N = 256, H = 2048: 256 x 6144 x 2048 a GRU step), and neither fused
# template's register tile reads its operands as sparingly as the tiled SIMT GEMM's 8 x 8: split-K
# ran the GRU's T = 50 N = 256 H = 2048 forward at 0.39x cuDNN on the H200 (notes/performance.md
# v42). Such a step (not persistent: its weights do not fit on chip) takes the tiled GEMM into a
# buffer in global memory (L2 holds it) and its epilogue as a second kernel, one thread per output
# element (:func:`tvmrnn.schedules.cuda.gpu_matmul`): a launch and a round trip of the GEMM's result
# through L2 a step, against a GEMM of tens of microseconds. From GPU_STEP_MATMUL_OUTPUTS outputs
# (a forward step: its reduction no longer than its columns), GPU_BACKWARD_STEP_MATMUL_OUTPUTS (a
# backward step: G x H gate gradients reduced into H columns). Until v63 both were 2^18: without a
# split of the reduction (which the tiled GEMM then lacked for a fused epilogue) fewer outputs left
# SMs idle (H200, T = 50: the LSTM's backward step at N = 128, H = 1024, 128 x 1024 outputs,
# training 13.1 ms with split-K, 17.2 with the tiled GEMM; at N = 256, 256 x 1024, 36.8 ms with
# split-K, 26.3 with the tiled GEMM; the GRU's forward at N = 128, H = 2048, 128 x 6144, 20.8 ->
# 11.0 ms inference). With the backward steps' split (cuda.GPU_STEP_MATMUL_K_SLICES) 2^16 for
# them: the LSTM at N = 128, H = 1024 trained in 12.2 ms with split-K, 10.3 with the split tiled
# GEMM; N = 192, H = 768 13.7 -> 10.7; the GRU at N = 128, H = 1024 10.1 -> 8.8 (v63; their forward
# steps have 2^18 outputs or more, on the tiled GEMM either way). Forward steps below 2^18 were not
# measured on it with a split (a forward step splits only where it fills few threads: cuda.GPU_FORWARD_STEP_FILL).
GPU_STEP_MATMUL_OUTPUTS = 1 << 18
GPU_BACKWARD_STEP_MATMUL_OUTPUTS = 1 << 16
# A step of both directions (stacked: a batch axis of two problems) takes the tiled GEMM from
# GPU_ROW_TILE_ROWS rows in all and GPU_STACKED_MATMUL_ROWS (a tile's rows) a direction: its
# launch has the blocks of a one-direction step of twice the rows, which the tiled GEMM wins from
# 128 (above). Until v66 a direction's own rows decided, and split-K ran the LSTM's bidirectional
# step at N = 64, H = 2048 in 269 us (H200, T = 50: 0.56x cuDNN's inference, 0.63x training),
# where the one-direction step of 128 rows, the same multiply-adds, takes about 160 on the tiled
# GEMM. Measured on the H200 against the old rule (v67, notes/bench/v67/h200/stacked_ab*.txt, T = 50
# bidirectional passes, inference + training): 1.12-1.55x faster at N = 64-100, H = 768-2048, all four
# cells; bidirectional LSTM N = 64, H = 2048 now 0.89x / 0.86x cuDNN.
GPU_STACKED_MATMUL_ROWS = 64
# A backward step launched a step (not persistent: from GPU_BACKWARD_PERSISTENT_WORK) of
# GPU_BACKWARD_MATMUL_ROWS to GPU_ROW_TILE_ROWS rows a direction takes the tiled GEMM, its
# reduction (G x H gate gradients) split over blocks, from GPU_BACKWARD_MATMUL_WORK multiply-adds a
# step; split-K before (v78): on the H100 the LSTM's backward step at N = 57, H = 645 (95 M a step)
# ran 32.9 us on split-K (5.8 TFLOP/s) where the forward's persistent step of the same work took 9.95.
GPU_BACKWARD_MATMUL_ROWS = 32
GPU_BACKWARD_MATMUL_WORK = 1 << 24


# Such a large step's loop may still run persistent, split-K's form (each block all the rows, its
# slice of the weights on chip), below this many rows a direction, unless its launched GEMM is split
# over blocks (launches_beat_persistence): on the H200 at T = 50, the
# GRU at N = 128, H = 1024 took 0.79x cuDNN's inference time persistent, 0.46x as launches of
# the tiled GEMM; the LSTM at N = 192, H = 768 0.64x persistent, 0.88x as launches; at N = 256,
# H = 1024 58.7 ms persistent, 7.8 as launches (notes/performance.md v42). Since then the tiled GEMM
# fills its shared tiles by cp.async (v61), and a forward step's GEMM that fills few of the GPU's
# threads is split over blocks (cuda.GPU_FORWARD_STEP_FILL): such launches beat the persistent loop
# from 128 rows (H200, T = 50, whole passes, inference / training ms, persistent -> launched and
# split, notes/performance.md v64): the GRU at N = 128, H = 1024 3.50 / 8.85 -> 2.86 / 8.24 (4.10 /
# 9.48 launched unsplit), H = 768 2.72 / 6.36 -> 1.91 / 5.47, N = 144, H = 768 4.61 / 8.82 -> 2.63 /
# 6.74; the LSTM at N = 128, H = 1024 3.74 / 10.30 -> 3.33 / 9.87; one loss, the LSTM at N = 128,
# H = 768 2.43 / 6.76 -> 2.62 / 6.88. Unsplit, the LSTM at N = 144, H = 768 (240 blocks of 32 x 64)
# 3.00 / 8.40 -> 2.84 / 8.23 (kept persistent: one measurement). Backward steps this large launch
# anyway (backward_launches_beat_persistence).
GPU_PERSISTENT_SPLIT_K_ROWS = 160


# A backward step that split-K runs (few rows: a reduction of G x H gate gradients into H columns
# a row) runs persistent, its slice of the weights on chip, below this many multiply-adds a step
# (all its directions); from it, as one launch a step. On the H200 (notes/performance.md v57; LSTM,
# training, persistent against launches): N = 8, H = 128 0.80 -> 0.57 ms (T = 100); N = 4, H = 512
# 2.15 -> 1.94 ms (T = 200); N = 32, H = 256 1.44 -> 1.37 ms; at DS2's N = 20, H = 800 (51 M a step)
# 9.04 -> 10.76 ms (T = 300), as on the H100 in v10. Launches read the weights from L2 a step but
# take as many blocks as the step fills; the persistent form saves the launch and the reload,
# which matter less the longer the step.
GPU_BACKWARD_PERSISTENT_WORK = 1 << 24
# ... with at most this many a block: a persistent backward loop takes the next, larger block count
# (``Program.persistent_caps``) where its step would leave a block more. The caps that few rows get
# for the forward (one block where one holds the weights: device.small_step_blocks) gave the GRU
# at N = 8, H = 128 one block of 393 K a step: 0.84 -> 1.10 ms training against launches, where
# the LSTM's 8 blocks of 65 K (0.95 -> 0.60) and the GRU's 16 of 98 K at H = 256 (1.09 -> 0.75)
# were faster (H200, notes/performance.md v57). (The GRU's 4 blocks of 98 K at N = 8, H = 128
# that this gives were not measured.)
GPU_BACKWARD_BLOCK_WORK = 1 << 17


# A build with TF32 steps (``BuildOptions.tensor_core_steps``: half builds) runs a step of at
# least GPU_TF32_STEP_ROWS rows and GPU_TF32_STEP_WORK multiply-adds a direction, whose reduction
# is no longer than its columns (a forward step: H against G x H; :func:`tf32_step`), as the TF32
# tiles into a buffer and its epilogue as a kernel of its own, one launch each a step, instead of
# fp32 split-K, row tiles or the SIMT tiled GEMM. On the H200, fp16, T = 100 (notes/performance.md
# v50): LSTM N = 128, H = 1024 inference 7.21 -> 4.20 ms, N = 256, H = 512 3.60 -> 2.46 ms; with
# fewer rows the tiles lost (N = 64, H = 1024: 3.18 -> 3.35 ms, the GRU 2.87 -> 3.26; DS2's
# N = 20: 2.92 -> 6.20), and so, mostly, did the backward's steps (a reduction of G x H into H
# columns: N = 64, H = 1024 training 9.8 -> 16.5 ms with every step on the tiles).
GPU_TF32_STEP_ROWS = 128
GPU_TF32_STEP_WORK = 1 << 27
# Which backward steps (a reduction of G x H gate gradients into H columns) such a build runs on
# the TF32 tiles: "rows", those that launches run on the SIMT tiled GEMM anyway (:func:`_gpu_kind`)
# and those of GPU_TF32_BACKWARD_ROWS rows a direction and the forward rule's work; "matmul",
# the first kind only; "all", those of the forward rule; "off" (v51). On the H200, fp16, training
# (notes/performance.md v52): GRU T = 50, N = 256, H = 2048 48.3 -> 33.5 ms and LSTM N = 256,
# H = 1024 17.7 -> 15.2 (on the SIMT tiled GEMM before), LSTM T = 100, N = 256, H = 512 14.5 ->
# 13.0 (split over its rows before); at N = 128, H = 1024 the tiles lost (15.8 -> 19.1).
GPU_TF32_BACKWARD_STEPS = "rows"
# ... "rows": from this many rows a direction (v52 measured it with GPU_PERSISTENT_SPLIT_K_ROWS's
# 160; at N = 128, H = 1024 the tiles lost, as above)
GPU_TF32_BACKWARD_ROWS = 160
# "Those that launches run on the SIMT tiled GEMM anyway" above: from 2^18 outputs, where the SIMT
# GEMM began when v52 measured them. Since v63 it begins at 2^16 (GPU_BACKWARD_STEP_MATMUL_OUTPUTS, split
# over blocks), and the backward steps in between keep the "rows" rule (at N = 128, H = 1024,
# 131,072 outputs, the tiles lost in v52).
GPU_TF32_BACKWARD_OUTPUTS = 1 << 18


CPU_MIN_PARALLEL = 256  # elements below which a parallel region costs more than it saves


def is_gpu(target: tvm.target.Target) -> bool:
    return target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl", "webgpu")


def _writes_param(sch, block, params) -> bool:
    return any(any(r.source.same_as(p) for p in params) for r in sch.get(block).writes)


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def _loops_after(sch, block, loop) -> list:
    """The loops of ``block`` inside ``loop`` (one of its loops)."""
    loops = sch.get_loops(block)
    at = next(i for i, l in enumerate(loops) if sch.get(l).same_as(sch.get(loop)))
    return loops[at + 1:]


def vector_lanes(target: tvm.target.Target) -> int:
    """float32 lanes of the CPU target's widest vectors (:func:`tvmrnn.device.device_model`)."""
    return device_model(target).vector_lanes


def _divisor(n: int, at_most: int, multiple_of: int = 1) -> int:
    """The largest divisor of ``n`` that is <= ``at_most`` and a multiple of ``multiple_of`` (else 1)."""
    for d in range(min(n, at_most), 0, -1):
        if n % d == 0 and d % multiple_of == 0:
            return d
    return 1


def _gemm_axes(sch, gemm):
    """The reduction block's loops split into spatial and reduction ones, with extents."""
    iter_types = [iv.iter_type for iv in sch.get(gemm).iter_vars]
    loops = sch.get_loops(gemm)[-len(iter_types):]  # its own loops (innermost, in order)
    spatial = [l for l, it in zip(loops, iter_types) if it == 0]
    reduction = [l for l, it in zip(loops, iter_types) if it != 0]
    return spatial, reduction


def uses_tf32(func) -> bool:
    """Whether the kernel's function asks for TF32 tensor cores (:func:`tvmrnn.kernels.tf32`)."""
    return bool(func.attrs is not None and int(func.attrs.get("tvmrnn.tf32", 0)))


def tensor_core_operands(func) -> str:
    """What a tensor-core kernel's GEMM multiplies (:func:`tvmrnn.kernels.tf32`): "tf32", or the
    half type its operands are rounded to."""
    value = func.attrs.get("tvmrnn.tensor_core_operands") if func.attrs is not None else None
    return str(value) if value is not None else "tf32"


def persistent_blocks(func) -> int | None:
    """The block limit of a persistent kernel's function (:func:`tvmrnn.kernels.persistent`), else None."""
    value = func.attrs.get("tvmrnn.persistent_blocks") if func.attrs is not None else None
    return int(value) if value is not None else None


def _fused_step_axes(sch, kernel: Kernel):
    """``(spatial, reduction, n_rows)`` of the GEMM of the kernel held by ``sch`` where it is a
    step's (a reduction, rows past the problems' axis, fused with an epilogue:
    :func:`fused_epilogue`), else None."""
    spatial, reduction = _gemm_axes(sch, sch.get_sblock(kernel.gemm))
    n_rows = len(spatial) - len(kernel.columns)
    if not reduction or n_rows <= kernel.batch or not fused_epilogue(sch, kernel):
        return None
    return spatial, reduction, n_rows


def tf32_step(sch, kernel: Kernel) -> bool:
    """Whether the kernel held by ``sch`` is a step that a build with TF32 steps
    (``BuildOptions.tensor_core_steps``) runs on the TF32 tiles: a GEMM fused with a step's gate
    math, not persistent, of at least :data:`GPU_TF32_STEP_ROWS` rows and
    :data:`GPU_TF32_STEP_WORK` multiply-adds a direction (problem), whose reduction is no longer
    than its columns (a forward step; the backward's reduce G x H gate gradients into H columns,
    and take the tiles by :data:`GPU_TF32_BACKWARD_STEPS` and :data:`GPU_TF32_BACKWARD_OUTPUTS`).
    The one rule: :func:`_gpu_kind`, :func:`tvmrnn.schedules.cuda.tf32_applies` and
    :func:`launches_beat_persistence` ask it."""
    if kernel.gemm is None or persistent_blocks(sch.mod["main"]) is not None:
        return False
    axes = _fused_step_axes(sch, kernel)
    if axes is None:
        return False
    spatial, reduction, n_rows = axes
    own_rows = math.prod(_extent(sch, l) for l in spatial[kernel.batch:n_rows])
    columns = math.prod(_extent(sch, l) for l in spatial[n_rows:])
    total = math.prod(_extent(sch, l) for l in reduction)
    if own_rows < GPU_TF32_STEP_ROWS:
        return False
    work = own_rows * columns * total >= GPU_TF32_STEP_WORK
    if total <= columns or GPU_TF32_BACKWARD_STEPS == "all":  # a forward step
        return work
    if GPU_TF32_BACKWARD_STEPS == "off":
        return False
    outputs = math.prod(_extent(sch, l) for l in spatial[:n_rows]) * columns
    if _gpu_kind(sch, kernel, False) == "matmul" and outputs >= GPU_TF32_BACKWARD_OUTPUTS:
        return True
    return GPU_TF32_BACKWARD_STEPS == "rows" and own_rows >= GPU_TF32_BACKWARD_ROWS and work


def _gpu_kind(sch, kernel: Kernel, tensor_cores: bool | None = None) -> str | None:
    """Which GPU GEMM schedule fits the kernel held by ``sch``. ``tensor_cores``: whether its
    GEMM is on TF32 tiles (None: as its function says, :func:`uses_tf32`), which takes a step of
    :func:`tf32_step` to "matmul"."""
    if tensor_cores is None:
        tensor_cores = uses_tf32(sch.mod["main"])
    if tensor_cores and tf32_step(sch, kernel):
        return "matmul"  # the TF32 tiles, then the epilogue as a kernel of its own
    gemm = sch.get_sblock(kernel.gemm)
    spatial, reduction = _gemm_axes(sch, gemm)
    n_rows = len(spatial) - len(kernel.columns)
    if not reduction:
        return None
    if math.prod(_extent(sch, l) for l in reduction) == 1:
        # a product, not a sum (the weight gradient of one step of one row, an input projection of
        # one feature): the pointwise rule. The tiled GEMM padded its unit reduction and summed
        # wrong on the H100 (v28, weight_gradient_t1_n1: 13x off); split-K has nothing to split.
        return None
    if n_rows == 0:  # a sum into one row (the bias gradient)
        return "column sum"
    rows = math.prod(_extent(sch, l) for l in spatial[:n_rows])
    # a fused epilogue (several sibling outputs, or outputs reading whole gate groups): split-K for
    # few rows, else row tiles, and past row tiles' units the tiled GEMM with the epilogue as a
    # second kernel; in a persistent kernel row tiles from GPU_ROW_TILE_ROWS rows a problem
    # (direction), whatever the work (an LSTM's from GPU_FEW_ROW_TILE_ROWS at few units)
    if fused_epilogue(sch, kernel):
        persistent = persistent_blocks(sch.mod["main"]) is not None
        columns = math.prod(_extent(sch, l) for l in spatial[n_rows:])
        total = math.prod(_extent(sch, l) for l in reduction)
        work = rows * columns * total
        units = _extent(sch, spatial[n_rows])
        own_rows = math.prod(_extent(sch, l) for l in spatial[kernel.batch:n_rows])  # a problem's
        if persistent:  # weights on chip either way; row tiles read only a block's own rows
            # a unit's gate columns (forward) or gates reduced (backward), as gpu_row_tiles counts them
            gates = math.prod(_extent(sch, l) for l in spatial[n_rows + 1:]) * math.prod(
                _extent(sch, l) for l in reduction[1:])
            few = (kernel.batch == 0 and own_rows >= GPU_FEW_ROW_TILE_ROWS and units <= GPU_FEW_ROW_TILE_UNITS
                   and gates >= GPU_FEW_ROW_TILE_GATES and 4 * columns * total > ROW_GROUP_MAX_WEIGHT_BYTES)
            tiled = own_rows >= GPU_ROW_TILE_ROWS or few or row_groups(sch.mod["main"])
            return "row tiles" if tiled and units <= GPU_ROW_TILE_UNITS else "split-K"
        backward = total > columns  # G x H gate gradients reduced into H columns
        large = rows * columns >= (GPU_BACKWARD_STEP_MATMUL_OUTPUTS if backward else GPU_STEP_MATMUL_OUTPUTS)
        tiled = own_rows >= GPU_ROW_TILE_ROWS or (rows >= GPU_ROW_TILE_ROWS and own_rows >= GPU_STACKED_MATMUL_ROWS)
        if tiled and units > GPU_ROW_TILE_UNITS and large:
            return "matmul"  # the tiled GEMM, then the epilogue as a kernel of its own
        if backward and GPU_BACKWARD_MATMUL_ROWS <= own_rows < GPU_ROW_TILE_ROWS and work >= GPU_BACKWARD_MATMUL_WORK:
            return "matmul"  # (its reduction split over blocks: cuda.matmul_k_slices)
        many = rows >= GPU_ROW_TILE_ROWS and work >= GPU_ROW_TILE_WORK and units <= GPU_ROW_TILE_UNITS
        return "row tiles" if many else "split-K"
    return "split-K" if rows <= GPU_SPLIT_K_ROWS else "matmul"


def launches_beat_persistence(kernel: Kernel, tensor_cores: bool = False, launched=None) -> bool:
    """Whether a step kernel's time loop runs faster as launches than as a persistent kernel: a
    large step (:data:`GPU_STEP_MATMUL_OUTPUTS`, backward :data:`GPU_BACKWARD_STEP_MATMUL_OUTPUTS`:
    its launches take the tiled GEMM, from :data:`GPU_ROW_TILE_ROWS` rows a direction) of
    :data:`GPU_PERSISTENT_SPLIT_K_ROWS` rows a direction or more, or of fewer where its launched
    GEMM is split over blocks (``launched(kernel)``: the launched form as scheduled, or None: not
    asked); with ``tensor_cores`` (a build with TF32 steps), also a step that its launches run on
    the TF32 tiles (:func:`tf32_step`). A tuning record of the launched form decides so too: one
    that does not split it (or splits it other than by :data:`SLICE_SUM`'s template) leaves the
    loop persistent. Tuning's tasks (:func:`tvmrnn.tune.tasks.extract_tasks`) decide without records."""
    if kernel.gemm is None:
        return False
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    if tensor_cores and tf32_step(sch, kernel):
        return True
    if _gpu_kind(sch, kernel, False) != "matmul" or not fused_epilogue(sch, kernel):
        return False
    spatial, _ = _gemm_axes(sch, sch.get_sblock(kernel.gemm))
    n_rows = len(spatial) - len(kernel.columns)
    if math.prod(_extent(sch, l) for l in spatial[kernel.batch:n_rows]) >= GPU_PERSISTENT_SPLIT_K_ROWS:
        return True
    return launched is not None and splits_over_blocks(launched(kernel))


SLICE_SUM = "tvmrnn.slice_sum"  # the block that sums a split GEMM's slices (cuda._split_reduction)


def splits_over_blocks(func) -> bool:
    """Whether a scheduled GPU kernel's GEMM is split over blocks (it has a :data:`SLICE_SUM` block)."""
    found = []

    def visit(block, visitor):
        found.append(SLICE_SUM in block.annotations)
        visitor.default_visit(block)
    tvm_ffi.structural_visit(func.body, [(tvm.s_tir.SBlock, visit)])
    return any(found)


# Persistent steps of fewer rows than row tiles take (GPU_ROW_TILE_ROWS a direction) try blocks that
# split the rows alone first, each with all of its direction's weights on chip, where those fit a
# block (:func:`row_groups_apply`; ``kernels.persistent(row_groups=True)``; the default of
# ``BuildOptions.row_groups``): such blocks meet at
# ``__syncthreads`` only, with no grid barrier and no exchange of the hidden state through L2 a
# step, as cuDNN's one-block persistent kernels do for small hidden sizes (``RNN_blockPersist_fp_LSTM``
# at N = 13, H = 90 on the H100: 0.7 us a step, where split-K's 16-132 blocks and their grid
# barrier took 2.2-2.5; notes/performance.md v76).
GPU_ROW_GROUP_STEPS = True
# the most shared memory of a block on any GPU (sm_90: 227 KB): a direction's weights past it
# cannot fit one block, so no row-groups form is tried
ROW_GROUP_MAX_WEIGHT_BYTES = 227 * 1024


def row_groups_apply(kernel: Kernel) -> bool:
    """Whether a step kernel's persistent form may try blocks of row groups (``BuildOptions.row_groups``,
    default :data:`GPU_ROW_GROUP_STEPS`):
    a GEMM fused with its epilogue, fewer than :data:`GPU_ROW_TILE_ROWS` rows a direction, at most
    :data:`GPU_ROW_TILE_UNITS` units, a direction's weights within :data:`ROW_GROUP_MAX_WEIGHT_BYTES`
    (whether they fit this device's block is the schedule's to find: the tile it makes then has
    independent blocks, :func:`tvmrnn.schedules.row_tiles.independent_blocks`)."""
    if kernel.gemm is None or "w" not in kernel.roles:
        return False
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    axes = _fused_step_axes(sch, kernel)
    if axes is None:
        return False
    spatial, _, n_rows = axes
    own_rows = math.prod(_extent(sch, l) for l in spatial[kernel.batch:n_rows])
    units = _extent(sch, spatial[n_rows])
    w = kernel.func.params[kernel.roles.index("w")]
    weights = 4 * math.prod(int(d) for d in w.shape[kernel.batch:])
    return own_rows < GPU_ROW_TILE_ROWS and units <= GPU_ROW_TILE_UNITS and weights <= ROW_GROUP_MAX_WEIGHT_BYTES


def gemm_work(kernel: Kernel) -> int:
    """The multiply-adds of a kernel's GEMM (every iteration of its block), 0 without one."""
    if kernel.gemm is None:
        return 0
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    return math.prod(int(iv.dom.extent) for iv in sch.get(sch.get_sblock(kernel.gemm)).iter_vars)


def backward_launches_beat_persistence(kernel: Kernel) -> bool:
    """Whether a backward step kernel that split-K runs (not row tiles) runs faster as one launch a
    step than persistent: from :data:`GPU_BACKWARD_PERSISTENT_WORK` multiply-adds a step."""
    if kernel.gemm is None or _gpu_kind(s_tir.Schedule(s_tir.renew_defs(kernel.func)), kernel) == "row tiles":
        return False
    return gemm_work(kernel) >= GPU_BACKWARD_PERSISTENT_WORK


def backward_blocks_too_few(kernel: Kernel, blocks: int) -> bool:
    """Whether ``blocks`` blocks of a persistent backward step would each do more than
    :data:`GPU_BACKWARD_BLOCK_WORK` of its multiply-adds a step."""
    return gemm_work(kernel) > GPU_BACKWARD_BLOCK_WORK * blocks


def fused_epilogue(sch, kernel: Kernel) -> bool:
    """Whether the GEMM of the kernel held by ``sch`` feeds an epilogue that reads whole gate
    groups or writes several sibling outputs (a step's gate math): one that the tiled GEMM cannot
    inline into its register tile."""
    gemm = sch.get_sblock(kernel.gemm)
    spatial, _ = _gemm_axes(sch, gemm)
    consumers = sch.get_consumers(gemm)
    return len(consumers) > 1 or (bool(consumers) and len(sch.get_loops(consumers[0])) < len(spatial))


def _uses(expr, var) -> bool:
    found = []

    def visit(v, mutator):
        if v.same_as(var):
            found.append(v)
        return v

    tvm_ffi.structural_mutate(expr, [(tvm.ir.Var, visit)])
    return bool(found)


class _Unfit(Exception):
    """A schedule tried on ``sch`` itself did not fit (:data:`_IN_PLACE`): ``sch`` is left half
    scheduled, so the caller starts again on a fresh one, with copies."""


# Set by :func:`tvmrnn.schedules.default_schedule`, which needs the scheduled function and not the
# trace: a schedule that may not fit goes on ``sch`` itself, not on a copy replayed into it (the
# replay was 8% of a small H100 build's time), and if it does not fit the whole kernel is
# scheduled again with copies.
_IN_PLACE = contextvars.ContextVar("tvmrnn_schedule_in_place", default=False)


def _copy_applied(sch, schedule) -> bool:
    """Apply ``schedule(sch_copy)`` to a copy of ``sch``'s function and replay its trace through
    ``sch`` (so that tuning can measure it); False where it does not fit this kernel. Under
    :data:`_IN_PLACE`, ``schedule(sch)`` itself, raising :class:`_Unfit` where it does not fit."""
    if _IN_PLACE.get():
        before = sch.mod["main"]
        try:
            schedule(sch)
        except tvm.s_tir.ScheduleError:
            if sch.mod["main"].same_as(before):  # refused after look-ups alone: nothing changed
                return False
            raise _Unfit() from None
        return True
    copy = s_tir.Schedule(s_tir.renew_defs(sch.mod["main"]))
    try:
        schedule(copy)
    except tvm.s_tir.ScheduleError:
        return False
    copy.trace.apply_to_schedule(sch, remove_postproc=False)
    return True


def _all_blocks(sch):
    found = []

    def visit(b):
        found.append(b)
        for c in sch.get_child_blocks(b):
            visit(c)
    visit(sch.get_sblock("root"))
    return found


def _thread_extent_of(sch, block) -> int:
    for loop in sch.get_loops(block):
        for_ = sch.get(loop)
        if for_.thread_binding is not None and for_.thread_binding.thread_tag == "threadIdx.x":
            return int(for_.extent)
    raise AssertionError("no threadIdx.x loop")


def nvcc_unroll(sch, loop) -> None:
    """Unroll ``loop`` in NVCC (``#pragma unroll``) rather than in TIR. TVM's explicit unrolling
    writes every iteration out as CUDA source, and NVCC's front end (``cicc``) takes several times
    longer on the result than on the loop it unrolls itself into the same PTX: the tiled GEMM's
    16-deep reduction tile was ~1,100 lines of source, and twice that with a software pipeline,
    whose epilogue repeats the loop's body (v62: an LSTM N=256 H=1024 build's kernels compiled in
    4.9 s instead of 23 s, the same instructions, registers and no spills). Loops whose indices
    into warp buffers must stay symbolic need it too (:mod:`tvmrnn.schedules.tensor_cores`)."""
    sch.unroll(loop)
    sch.annotate(loop, "pragma_unroll_explicit", 0)


def _vectorize(sch, loop, lanes, partition_hint: bool = False):
    """Vectorise in whole registers: a loop of several vectors becomes an unrolled loop of
    ``lanes``-wide ones. LLVM turns one wide odd vector (a 48-float tile: 3 gates x 16 units)
    into code 15x slower than three 16-float ones (measured on the dev machine's Zen 5).
    ``partition_hint``: LoopPartition cuts the loop (each piece) at its predicate (a guarded tile's)."""
    extent = _extent(sch, loop)
    pieces = [loop]
    if extent > lanes and extent % lanes == 0:
        outer, loop = sch.split(loop, [None, lanes])
        sch.unroll(outer)
        pieces = [outer, loop]
    if partition_hint:
        for piece in pieces:
            sch.annotate(piece, "pragma_loop_partition_hint", 1)
    sch.vectorize(loop)


def _vectorize_trailing(sch, loops, width, lanes, partition_hint: bool = False):
    trailing, product = [], 1
    for loop in reversed(loops):
        if product * _extent(sch, loop) > width:
            break
        product *= _extent(sch, loop)
        trailing.insert(0, loop)
    if product > 1:
        loop = sch.fuse(*trailing) if len(trailing) > 1 else trailing[0]
        _vectorize(sch, loop, lanes, partition_hint)  # (a guarded tile's: LoopPartition cuts the vector)


def sum_slices_per_output(sch, gemm, consumer) -> None:
    """The second kernel of a reduction split over blocks: one thread per output element of
    ``consumer`` sums the slices (``gemm``, the block left after ``rfactor``) in registers, then
    ``consumer`` runs its epilogue on the sum."""
    loops = sch.get_loops(consumer)
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    block_loop, thread_loop = sch.split(fused, [None, min(GPU_THREADS, _extent(sch, fused))])
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(thread_loop, "threadIdx.x")
    sch.compute_at(gemm, thread_loop, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    for loop in sch.get_loops(gemm)[2:]:
        sch.unroll(loop)


class _FramesWithoutSource:
    """``inspect`` as TVMScript's ``@T.prim_func`` uses it, with ``stack()`` returning the frames
    without their source lines (see :func:`tvmscript_frames_without_source`)."""

    def __getattr__(self, name):
        return getattr(inspect, name)

    @staticmethod
    def stack(context: int = 1):
        frames, frame = [], sys._getframe(1)
        while frame is not None:
            frames.append(inspect.FrameInfo(frame, frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name,
                                            None, None))
            frame = frame.f_back
        return frames


_SCRIPT_LOCK = threading.Lock()


@contextlib.contextmanager
def tvmscript_frames_without_source():
    """Parse ``@T.prim_func`` functions (tensor intrinsics) in this block without
    ``inspect.stack()``'s cost. TVM's decorator calls it for the caller's frames, whose locals it
    reads (closure variables that ``from __future__ import annotations`` hides); but ``stack()``
    also finds each frame's source line, searching ``sys.modules`` a frame at a time: 0.5 s a
    function here, and 0.9 s under a torch import and a test's stack, so registering the 17
    tensor-core intrinsics took 15 s of a process's first half-precision GPU build. The frames
    are the same; only their ``code_context`` is left out (TVM reads it to tell a function
    defined in an ``@I.ir_module`` class, which these are not)."""
    from tvm.tirx.script.parser import entry
    with _SCRIPT_LOCK:
        real = entry.inspect
        entry.inspect = _FramesWithoutSource()
        try:
            yield
        finally:
            entry.inspect = real
