"""Listed variants of the default templates: the alternatives tuning measures beside the default
(:func:`variants`).
"""
from __future__ import annotations

import tvm
from tvm import s_tir
from ..kernels import Kernel

from .common import _gpu_kind, is_gpu, uses_tf32
from .cuda import GPU_MATMUL_SHAPES, TF32_SHAPES, slice_variants
from .split_k import persistent_blocks


# Other shapes of the GPU split-K (``gpu_split_k`` arguments) that tuning measures beside the
# default: on the H100 the best shape differed by cell (the ``tile_study`` (a study script, at 34424c0)).
# Half the blocks, each with twice the columns (8 units of the backward's dh, or 2 LSTM units),
# was 5-10% faster for the fused backward steps in one tile study (notes/bench/gpu_tiles_h100_v6.txt).
# Twice the blocks: the two-direction GRU step's best (22.5 us, against 44.8 with 200 blocks in
# all; notes/bench/gpu_tiles_h100_v7.txt). Since v63 a step of 2048+ units takes 8 columns a
# thread by default (split_k.default_thread_columns), and 4 is listed for it.
# The reduction over more or fewer blocks (block_slices): LSTM backward step 11.3 us over 16
# slices, 15.0 over 8 (notes/bench/gpu_tiles_h100_v9a.txt).
GPU_SPLIT_K_VARIANTS = ({}, dict(threads=128), dict(threads=64), dict(threads=128, min_blocks=400),
                        dict(thread_columns=8), dict(thread_columns=4), dict(min_blocks=100), dict(min_blocks=400),
                        dict(block_slices=1), dict(block_slices=4), dict(block_slices=8), dict(block_slices=16))


# gpu_matmul's variants that tuning measures beside the default: every block shape, the
# shorter and the longer reduction tiles, no cp.async stages (the tiles copied synchronously, or
# double-buffered so), and three stages.
GPU_MATMUL_VARIANTS = tuple(dict(rows=r, cols=c) for r, c in GPU_MATMUL_SHAPES) + (
    dict(k_tile=8), dict(async_stages=0), dict(async_stages=0, pipeline=True), dict(async_stages=3),
    dict(k_tile=32))


# The TF32 tiles' variants (``gpu_matmul_tf32``'s ``tile`` overrides): every block tile of
# TF32_SHAPES, the other reduction tiles, double buffering, and the staging tile's padded rows.
TF32_VARIANTS = tuple(dict(warps=w, fragments=f) for w, f in TF32_SHAPES) + (
    dict(k_tile=32), dict(k_tile=128), dict(pipeline=True), dict(stage_pad=4))


# A persistent split-K step's shapes that tuning measures (``tiles`` over :data:`PERSISTENT_TILES`)
# (:func:`tvmrnn.tune.tasks.is_persistent`; a persistent step of row tiles takes ROW_TILE_VARIANTS). At DS2 sizes the default LSTM step
# is 115 blocks of 224 threads (7 warps an SM: latency-bound, v16's Nsight Compute); fewer
# registers of partial sums a thread (``accumulators``) or more room for them
# (``max_shared_bytes``) give 448; ``row_vector`` and ``vector_k`` were 3-4% by median in v16's
# studies, within the rounds' ranges. v35's measurements of these: notes/bench/v35/tune_*. Since
# v62 ``vector_k`` has a rule (4 for LSTM steps of 128+ rows), so one of its two variants is the
# default's schedule wherever it applies.
PERSISTENT_VARIANTS = ({}, dict(row_vector=4), dict(vector_k=4), dict(vector_k=1), dict(stage_epilogue=False),
                       dict(accumulators=24), dict(accumulators=24, row_vector=4), dict(accumulators=32),
                       dict(max_shared_bytes=96 * 1024), dict(max_shared_bytes=96 * 1024, row_vector=4),
                       dict(accumulators=96), dict(thread_columns=8), dict(unroll=4), dict(unroll=16),
                       # one output column a thread: a two-direction backward step's 13 columns of
                       # weights a block (166 KB) fit on chip, 16 (thread_columns=4) do not
                       dict(thread_columns=1),
                       # the hidden state staged whole or not at all (v34's one-direction
                       # default), and in more phases than it needs
                       dict(row_phases=1), dict(row_phases=1, accumulators=24), dict(row_phases=4),
                       # half the threads a block (fewer row groups and slices)
                       dict(threads=256), dict(threads=256, accumulators=24))


# Row tiles' other shapes (``gpu_row_tiles`` arguments): larger and smaller register tiles, other
# block shapes, reduction tiles, and the operands read from L2 instead of staged.
ROW_TILE_VARIANTS = ({}, dict(thread_rows=1), dict(thread_rows=2), dict(thread_rows=4), dict(thread_rows=8),
                     dict(thread_units=2), dict(thread_units=4), dict(unit_threads=16), dict(unit_threads=64),
                     dict(row_threads=4), dict(row_threads=8), dict(k_tile=32), dict(k_tile=8), dict(stage=False),
                     dict(prefetch=False))
# ... and a persistent tile's: gate threads (the weights in registers where they fit) or not,
# whichever the default is not (row_tiles.gpu_row_tiles' default takes them where the H200 measured
# them faster: forward steps, and backward steps at 96 <= H < 128; elsewhere tuning decides, v58, v59)
PERSISTENT_ROW_TILE_VARIANTS = (dict(gate_threads=True), dict(gate_threads=False))


def variants(kernel: Kernel, target: tvm.target.Target) -> list[dict]:
    """The default's own shapes worth measuring for ``kernel`` (``tiles`` for :func:`apply`),
    the default first: tuning seeds each new task with all of them."""
    if is_gpu(target) and kernel.gemm is not None:
        kind = _gpu_kind(s_tir.Schedule(s_tir.renew_defs(kernel.func)), kernel)
        if kind == "split-K" and persistent_blocks(kernel.func):
            return [dict(v) for v in PERSISTENT_VARIANTS]
        if kind == "split-K":
            return [dict(v) for v in GPU_SPLIT_K_VARIANTS]
        if kind == "row tiles":
            persistent = PERSISTENT_ROW_TILE_VARIANTS if persistent_blocks(kernel.func) else ()
            return [dict(v) for v in ROW_TILE_VARIANTS + persistent]
        if kind == "matmul" and uses_tf32(kernel.func):
            return [{}] + [dict(matmul=dict(tf32=dict(v))) for v in TF32_VARIANTS]
        if kind == "matmul":
            counts = slice_variants(kernel)
            slices = [dict(k_slices=n) for n in counts]
            # the largest tile with its reduction over 2 or 4 blocks: a GEMM whose large tiles make
            # too few blocks for the GPU (the 256-step weight gradient with K = 800: 156 tiles of
            # 128 x 128, 1.2 waves of 132 SMs) gets whole waves of them without a smaller tile's loads
            rows, cols = GPU_MATMUL_SHAPES[0]
            slices += [dict(rows=rows, cols=cols, k_slices=n) for n in counts if n in (2, 4)]
            return [{}] + [dict(matmul=dict(v)) for v in GPU_MATMUL_VARIANTS + tuple(slices)]
    return [{}]
