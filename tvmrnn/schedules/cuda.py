"""CUDA SIMT templates: the tiled GEMM over chunks of steps or weights (:func:`gpu_matmul`), its
TF32 tensor-core form (:func:`gpu_matmul_tf32`), and the cross-thread column sum
(:func:`gpu_column_sum`).
"""
from __future__ import annotations

import math
import tvm
from tvm import s_tir
from tvm.s_tir import dlight
from . import tensor_cores
from ..kernels import Kernel

from .common import (GPU_THREADS, SLICE_SUM, _divisor, _extent, _gemm_axes, _gpu_kind, _uses, _writes_param,
                     fused_epilogue, is_gpu, nvcc_unroll, tensor_core_operands, sum_slices_per_output, tf32_step)
from .split_k import persistent_blocks


# Streaming multiprocessors a default shape is chosen for where the device model knows none
# (:func:`tvmrnn.device.device_model`): the H100's.
GPU_SMS = 132


def tf32_applies(kernel: Kernel, target, steps: bool = False) -> str | None:
    """Whether a build with ``allow_tf32`` computes this kernel's GEMM on tensor cores, and as
    what: "gemm" (an all-steps GEMM or an inlined epilogue's step) or "step" (a step whose
    epilogue is a kernel of its own), else None. These are the
    GPU's tiled GEMMs without a fused epilogue (the all-steps GEMMs: input projections, input
    and weight gradients; and the launched steps of one-gate cells past split-K's rows, whose
    epilogue inlines), and with ``steps`` (``BuildOptions.tensor_core_steps``) the large
    steps launched one a step (:func:`tvmrnn.schedules.common.tf32_step`), their epilogue a
    kernel of its own. The other per-step GEMMs (split-K, row tiles, the SIMT tiled GEMM, every
    persistent one) and every CPU kernel stay fp32."""
    if kernel.gemm is None or not is_gpu(target) or persistent_blocks(kernel.func):
        return None
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    if fused_epilogue(sch, kernel):
        return "step" if steps and tf32_step(sch, kernel) else None
    return "gemm" if _gpu_kind(sch, kernel, False) == "matmul" else None


# :func:`gpu_column_sum`'s threads a block; its columns a block are the most of these that still
# give half the SMs a block (the bias gradient at N = 128, H = 128: 512 outputs, 16 blocks of 32
# columns took 133 us of the LSTM's 2.3 ms training pass on the H200, notes/performance.md v56)
GPU_COLUMN_SUM_THREADS = 256
GPU_COLUMN_SUM_COLUMNS = (32, 16, 8)


def column_sum_tile(outputs: int, sms: int = GPU_SMS) -> tuple[int, int]:
    """``(columns, slices)`` of :func:`gpu_column_sum` for ``outputs`` sums: the most columns of
    :data:`GPU_COLUMN_SUM_COLUMNS` that give at least half the SMs a block (else the fewest), and
    :data:`GPU_COLUMN_SUM_THREADS` threads a block."""
    columns = next((c for c in GPU_COLUMN_SUM_COLUMNS if -(-outputs // c) >= sms // 2), GPU_COLUMN_SUM_COLUMNS[-1])
    return columns, GPU_COLUMN_SUM_THREADS // columns


def gpu_column_sum(sch, kernel: Kernel, columns: int | None = None, slices: int | None = None, unroll: int = 8,
                   sms: int = GPU_SMS) -> None:
    """A reduction to one row (the bias gradient: ``db[g, j] += sum_{t,n} dg[t, n, j, g]``), few
    outputs (512-3200) over a long reduction (320 per 16-step chunk at DS2 sizes, 32,768 for 256
    steps of 128 rows): a block of ``columns`` x ``slices`` threads, ``threadIdx.x`` along the
    output in the order of the input's memory (consecutive threads read consecutive addresses:
    the gates innermost), the reduction split over ``threadIdx.y`` and added up by TVM's
    cross-thread reduction. ``columns`` and ``slices``: None, :func:`column_sum_tile`'s for the
    GPU's ``sms``. (One thread per output left 7-25 blocks of threads each running a 320-long
    chain of loads: 52 us per chunk on the H100; dlight's ``GeneralReduction``, one block per
    output, took 960 us.)"""
    gemm = sch.get_sblock(kernel.gemm)
    output = sch.get_consumers(gemm)[0]
    out_loops = _in_input_order(sch, gemm, output)
    fused = sch.fuse(*out_loops) if len(out_loops) > 1 else out_loops[0]
    auto_columns, auto_slices = column_sum_tile(_extent(sch, fused), sms)
    block, thread = sch.split(fused, [None, min(columns or auto_columns, _extent(sch, fused))])
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.compute_at(gemm, thread, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    _, reduction = _gemm_axes(sch, gemm)
    red = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    per_thread, across = sch.split(red, [None, min(slices or auto_slices, _extent(sch, red))])
    sch.reorder(across, per_thread)
    sch.bind(across, "threadIdx.y")
    _, unrolled = sch.split(per_thread, [None, _divisor(_extent(sch, per_thread), unroll)])
    sch.unroll(unrolled)


def _in_input_order(sch, gemm, output) -> list:
    """The loops of the column sum's ``output`` block, reordered (where they map one to one onto
    its iteration variables) as the sum's input is laid out: the loop of its last index innermost."""
    loops = sch.get_loops(output)
    out_block, sum_block = sch.get(output), sch.get(gemm)
    if len(loops) < 2 or len(loops) != len(out_block.iter_vars):
        return loops
    result = sum_block.writes[0].source
    inputs = [r for r in sum_block.reads if not r.source.same_as(result)]
    read = next((r for r in out_block.reads if r.source.same_as(result)), None)
    if len(inputs) != 1 or read is None:
        return loops
    input_vars = [r.min for r in inputs[0].region]

    def place(out_var):  # where the sum's input holds the sum's variable that this output variable reads
        at = next((i for i, r in enumerate(read.region) if r.min.same_as(out_var)), None)
        if at is None:
            return None
        sum_var = sum_block.writes[0].region[at].min
        return next((i for i, v in enumerate(input_vars) if v.same_as(sum_var)), None)

    places = [place(iv.var) for iv in out_block.iter_vars]
    if None in places or sorted(places) == places:
        return loops
    order = [loop for _, loop in sorted(zip(places, loops), key=lambda pair: pair[0])]
    sch.reorder(*order)
    return order


# :func:`gpu_matmul`'s block shapes, (rows, cols) as (micro-tiles, threads, micro-tile size) along
# each: 128 x 128 (256 threads), 64 x 128 and 128 x 64 (128), 256 x 64 (256), 64 x 64 (64), every
# thread 8 x 8 outputs; and for small outputs with long reductions (the RNN's 800 x 800 weight
# gradient: 91 blocks of 64 x 128 ran at 11 TFLOP/s, dlight's 325 of 32 x 64 at 17) 32 x 64 (128
# threads of 4 x 4). The default takes the one that gives the most loaded SM the least work
# (:func:`matmul_shape`); tuning measures all of them (:func:`variants`).
GPU_MATMUL_SHAPES = (((2, 16, 4), (2, 16, 4)), ((2, 8, 4), (2, 16, 4)), ((2, 16, 4), (2, 8, 4)),
                     ((2, 32, 4), (2, 8, 4)), ((2, 8, 4), (2, 8, 4)), ((1, 8, 4), (1, 16, 4)))


# The rest of its default (``tiles["matmul"]`` overrides any of it; the ``gemm_study`` (a study script, at 34424c0)
# times others): 16 reduction steps per shared-memory tile (8 was 4-12% slower on the H100), and
# two stages of shared tiles filled by ``cp.async`` (sm_80 on; ``async_stages``): the copy of the
# next tile runs while this one's multiply-adds do. On the H200 (notes/performance.md v61) a large
# step's GEMM, one block an SM with nothing else to hide its copies, ran 1.2-2.3x faster so
# (LSTM N=256 H=1024: the forward step 104 -> 67 us, the backward 221 -> 114; passes 22-24%
# faster), GEMMs over many steps within -7% to +20%, and whole passes the same or faster at every
# shape measured. The synchronous double buffer (``pipeline``) was no faster (v50): its copies
# wait for their loads before the multiply-adds start.
GPU_MATMUL = dict(k_tile=16, pipeline=False, async_stages=2)


def matmul_defaults(async_copies: bool) -> dict:
    """:data:`GPU_MATMUL` on a device with or without ``cp.async`` (the device model's
    ``async_copies``): without it, no asynchronous stages."""
    return GPU_MATMUL if async_copies else {**GPU_MATMUL, "async_stages": 0}


def matmul_shape(rows: int, cols: int, sms: int = GPU_SMS):
    """The block shape of :data:`GPU_MATMUL_SHAPES` for a ``rows x cols`` output: the least work
    on the busiest SM, ``ceil(blocks / sms)`` blocks of padded output elements, each weighted by
    its tile's loads (``bm + bn`` values per ``bm x bn`` multiply-adds, a smaller tile does more
    of them), the larger tile on ties. Blocks come in whole waves, and a GEMM of a few waves loses
    up to one of them: on the H100 the LSTM's input gradient (5120 x 800) ran at 21.7 TFLOP/s in 280 128 x 128
    blocks (3 on the busiest SMs) and 36.6 in 260 256 x 64 blocks (2); its weight gradient
    (3200 x 800) at 23.8 in 175 blocks of 128 x 128 and 32.4 in 350 of 64 x 128
    (``notes/bench/gemm_study_h100_v8.txt``)."""
    def work(shape):
        (vi, ti, mi), (vj, tj, mj) = shape
        bm, bn = vi * ti * mi, vj * tj * mj
        blocks = -(-rows // bm) * -(-cols // bn)
        return -(-blocks // sms) * bm * bn * (1 + 8 * (bm + bn) / (bm * bn)), -bm * bn
    return min(GPU_MATMUL_SHAPES, key=work)


def _matmul_axes(stmt, name: str):
    """A GEMM block's iteration variables as ``(S, I, J, K)`` of ``C[s, i, j] += A[s, i, k] B[s, j, k]``,
    each in the order its operand (``A`` for ``I`` and ``K``, ``B`` for ``J``) indexes them, and
    whether each operand is contiguous along the reduction (its last index a reduction variable).
    Raises ``ScheduleError`` for other blocks."""
    ivs = [iv.var for iv in stmt.iter_vars]
    is_red = {iv.var: iv.iter_type != 0 for iv in stmt.iter_vars}
    if len(stmt.reads) != 2:
        raise s_tir.ScheduleError(f"{name}: not a product of two operands")
    a_region, b_region = stmt.reads[0].region, stmt.reads[1].region

    def axes(region):  # the block's iteration variables in the operand's index order
        out = []
        for r in region:  # an index may combine several (a reduction split into slices by rfactor)
            out += [v for v in ivs if _uses(r.min, v) and not any(v.same_as(o) for o in out)]
        return out

    a_axes, b_axes = axes(a_region), axes(b_region)
    S = [v for v in a_axes if not is_red[v] and any(v.same_as(b) for b in b_axes)]
    I = [v for v in a_axes if not is_red[v] and not any(v.same_as(s) for s in S)]
    J = [v for v in b_axes if not is_red[v] and not any(v.same_as(s) for s in S)]
    K = [v for v in a_axes if is_red[v]]
    if len(S) + len(I) + len(J) + len(K) != len(ivs) or not (I and J and K):
        raise s_tir.ScheduleError(f"{name}: not a GEMM of the form C[s, i, j] += A[s, i, k] B[s, j, k]")
    k_inner = [any(_uses(r[-1].min, v) for v in K) for r in (a_region, b_region)]
    return S, I, J, K, k_inner


def matmul_extents(kernel: Kernel) -> tuple[int, int, int]:
    """``(rows, columns, reduction)`` of a kernel's GEMM as :func:`gpu_matmul` sees it."""
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    stmt = sch.get(sch.get_sblock(kernel.gemm))
    _, I, J, K, _ = _matmul_axes(stmt, kernel.name)
    extent = {iv.var: int(iv.dom.extent) for iv in stmt.iter_vars}
    return tuple(math.prod(extent[v] for v in vs) for vs in (I, J, K))


def default_matmul_shape(kernel: Kernel):
    """The block shape :func:`gpu_matmul` takes for ``kernel`` by default (:func:`matmul_shape`
    of its output's rows and columns)."""
    rows, cols, _ = matmul_extents(kernel)
    return matmul_shape(rows, cols)


def slice_variants(kernel: Kernel, counts=(1, 2, 4, 5, 8, 10), tf32: bool = False) -> list[int]:
    """The reduction splits (``k_slices``) worth measuring for a kernel's tiled GEMM: none for a
    GEMM whose default tiles give every SM :data:`GPU_MATMUL_FILL_THREADS` threads, else every
    count of ``counts`` that cuts the reduction into whole 16-long tiles (a backward step's, where
    none does: each that divides it, :data:`GPU_MATMUL_PADDED_SLICES`). A step's GEMM with a
    fused epilogue has them only where :data:`GPU_STEP_MATMUL_K_SLICES` is on, and never on the
    TF32 tiles (``tf32``: the TF32 template's ``k_slices`` knob, which refuses a count whose
    slices its ``k_tile`` does not divide; tuning rejects it)."""
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    if fused_epilogue(sch, kernel) and (tf32 or not GPU_STEP_MATMUL_K_SLICES):
        return []
    rows, cols, reduction = matmul_extents(kernel)
    (vi, ti, mi), (vj, tj, mj) = matmul_shape(rows, cols)
    threads = -(-rows // (vi * ti * mi)) * -(-cols // (vj * tj * mj)) * ti * tj
    if threads >= GPU_SMS * GPU_MATMUL_FILL_THREADS:
        return []
    whole = [s for s in counts if reduction % s == 0 and (reduction // s) % GPU_MATMUL["k_tile"] == 0]
    if whole or not (GPU_MATMUL_PADDED_SLICES and fused_epilogue(sch, kernel) and reduction > cols):
        return whole
    return [s for s in counts if reduction % s == 0]  # a backward step's padded slices (GPU_MATMUL_PADDED_SLICES)


# Split-K across blocks for the tiled GEMM (:func:`matmul_k_slices`): a GEMM whose output tiles
# give the GPU fewer than a quarter of ``GPU_MATMUL_FILL_THREADS`` threads per SM has its
# reduction split over blocks, each slice at least ``GPU_MATMUL_MIN_SLICE`` long.
GPU_MATMUL_FILL_THREADS = 512


GPU_MATMUL_MIN_SLICE = 256


# Whether the SIMT GEMM's reduction may be split into slices that are not whole ``k_tile`` tiles
# (each slice's last tile padded with zeros, as an unsplit reduction's is) where no count of whole
# tiles is possible: a slice count need only divide the reduction. Before (v78) a reduction of no
# multiple of 16 (G x H gate gradients at an odd H: the LSTM's backward step at H = 645 reduces
# 2580) could not be split at all, so its tiled GEMM ran as few blocks as it has output tiles.
# Backward steps only (the GEMMs over steps and the forward steps as before: not measured).
GPU_MATMUL_PADDED_SLICES = True


# Whether a step's tiled GEMM with a fused epilogue (its epilogue a kernel of its own:
# :func:`gpu_matmul`) takes :func:`matmul_k_slices`' split by default too, its slices summed by a
# kernel of their own before the epilogue. A large backward step has few output tiles for a long
# reduction (LSTM N = 256, H = 1024: 128 blocks of 128 threads over 4096; the rule gives 4 slices;
# GRU N = 256, H = 2048: 8), one block an SM. v62 wrote it; v63 measured it on the H200
# (T = 50, whole passes, notes/bench/v63/h200/split_ab.txt, split_outputs_ab.txt): training
# 61.8 -> 52.9 ms for the GRU at N = 256, H = 2048, 16.0 -> 15.0 at N = 256, H = 1024, and with
# GPU_BACKWARD_STEP_MATMUL_OUTPUTS at 2^16 (those backward steps on the split GEMM, not split-K) the LSTM
# at N = 192, H = 768 13.7 -> 10.7, N = 128, H = 1024 12.2 -> 10.3, the GRU at N = 128, H = 1024
# 10.1 -> 8.8 (their forward steps, then persistent below 160 rows, unchanged). The forward step it
# split where it was launched (the LSTM's at N = 256, H = 1024: 4 slices of 256) took inference
# 5.84 -> 6.13 ms: see GPU_FORWARD_STEP_K_SLICES and GPU_FORWARD_STEP_FILL.
GPU_STEP_MATMUL_K_SLICES = True
# Whether that split counts the tiles of both directions of a stacked step (a batch axis of two
# problems, as forward steps do: forward_step_k_slices), so that a step of both directions at N
# rows takes the slices of a one-direction step of 2N rows. Off: measured on the H200 (v67,
# notes/bench/v67/h200/slices_ab*.txt, T = 50 bidirectional passes) it changed nothing below 128
# rows and cost 1-2.6% from 128 (the GRU at N = 128, H = 2048: training 56.9 -> 58.4 ms).
GPU_STEP_SLICES_COUNT_DIRECTIONS = False


# Whether every forward step's GEMM (a fused epilogue whose reduction, H, is no longer than its G x H
# columns) takes the rule's split by default. Off: the one such split measured with tiles that
# filled a quarter of the GPU's threads (above) lost, and its split writes and reads back slices x
# rows x G x H partial sums a step for a short reduction. Tuning's ``k_slices`` knob still offers
# forward splits.
GPU_FORWARD_STEP_K_SLICES = False


# A forward step's GEMM is split by the rule where its output tiles give the GPU at most
# 1 / GPU_FORWARD_STEP_FILL of ``GPU_MATMUL_FILL_THREADS`` threads an SM (the GEMMs' rule splits
# from a quarter): 64 x 64 tiles of 128 rows, one block of 64 threads an SM. On the H200 (T = 50,
# notes/performance.md v64) the GRU's forward at N = 128, H = 1024 (96 blocks, 1/11 of the threads;
# 4 slices) took 4.10 ms inference launched unsplit, 2.86 split (3.50 with its persistent loop,
# which such a split now replaces: common.launches_beat_persistence); launched and split won over
# persistent loops at 1/8.2 to 1/14.7 of the threads; the LSTM's at N = 256, H = 1024 (1/4.1) lost
# 5% split (v63). 6 lies between (and keeps 1/8.2 on GPUs of 108-132 SMs above it).
GPU_FORWARD_STEP_FILL = 6


# A forward step's GEMM that fills more than 1 / GPU_FORWARD_STEP_FILL of the threads but at most
# 1 / GPU_FORWARD_STEP_LONG_FILL is split too, into slices at least GPU_FORWARD_STEP_LONG_SLICE
# long (fewer, longer slices: their partial sums and the kernel adding them cost less against a
# long reduction). On the H200 (notes/performance.md v65, tuning's listed variants) the GRU's
# forward step at N = 256, H = 2048 (384 blocks of 64 x 64, 1/2.75 of the threads) took 220 us
# unsplit and 179 in 2 slices of 1024 (181 in 4, 191 in 8); in whole passes (T = 50) inference
# 18.64 -> 16.48 ms. The LSTM's at N = 256, H = 1024 (1/4.1) lost 5% in 4 slices of 256 (v63)
# and keeps its unsplit GEMM (no slice of 1024 leaves two).
GPU_FORWARD_STEP_LONG_FILL = 2
GPU_FORWARD_STEP_LONG_SLICE = 1024


def forward_step_k_slices(rows: int, cols: int, reduction: int, shape, k_tile: int = 16, sms: int = GPU_SMS,
                          problems: int = 1) -> int:
    """How many blocks share a forward step's reduction by default (:func:`matmul_k_slices` with
    :data:`GPU_FORWARD_STEP_FILL`, else in slices of at least :data:`GPU_FORWARD_STEP_LONG_SLICE`
    up to :data:`GPU_FORWARD_STEP_LONG_FILL`)."""
    slices = matmul_k_slices(rows, cols, reduction, shape, k_tile, sms, fill=GPU_FORWARD_STEP_FILL, problems=problems)
    if slices > 1:
        return slices
    return matmul_k_slices(rows, cols, reduction, shape, k_tile, sms, fill=GPU_FORWARD_STEP_LONG_FILL,
                           problems=problems, min_slice=GPU_FORWARD_STEP_LONG_SLICE)


def matmul_k_slices(rows: int, cols: int, reduction: int, shape, k_tile: int = 16, sms: int = GPU_SMS,
                    fill: int = 4, problems: int = 1, min_slice: int | None = None, padded: bool = False) -> int:
    """How many blocks share the reduction of a ``rows x cols`` GEMM tiled by ``shape`` by default.

    The all-steps GEMMs of a short chunk (the last steps of a sequence: 4 steps x N = 20 rows)
    have long reductions (800-3200) and few output tiles: the LSTM's 4-step input projection
    (80 x 3200 x 1600) is 100 blocks of 64 threads on the H100's 132 SMs, ~10 TFLOP/s
    (notes/performance.md v12), the 4-step input gradient (80 x 1600 x 3200) 75 blocks of 128.
    Slices multiply the blocks, each summing its part of the reduction into a partial result in
    global memory that a second kernel adds up with the GEMM's epilogue (cuBLAS's split-K). A
    slice count divides the reduction into whole ``k_tile`` tiles (rfactor needs even slices).
    ``fill``: split only where the tiles give at most ``1 / fill`` of the threads wanted (a
    forward step's GEMM: :data:`GPU_FORWARD_STEP_FILL`), counting the tiles of ``problems``
    independent GEMMs (a step of both directions); ``min_slice``: the shortest slice (None:
    :data:`GPU_MATMUL_MIN_SLICE`); ``padded``: where no count of whole ``k_tile`` tiles exists,
    slices that are not (:data:`GPU_MATMUL_PADDED_SLICES`)."""
    (vi, ti, mi), (vj, tj, mj) = shape
    blocks = -(-rows // (vi * ti * mi)) * -(-cols // (vj * tj * mj))
    return _k_slices(blocks * ti * tj * problems, reduction, k_tile, sms, fill, min_slice, padded)


def _k_slices(threads: int, reduction: int, k_tile: int, sms: int, fill: int = 4, min_slice: int | None = None,
              padded: bool = False) -> int:
    """:func:`matmul_k_slices`' rule, given the GEMM's threads in all its output tiles. ``padded``:
    slices need not be whole ``k_tile`` tiles (:data:`GPU_MATMUL_PADDED_SLICES`)."""
    want = sms * GPU_MATMUL_FILL_THREADS
    if fill * threads > want:
        return 1
    most = max(1, min(want // threads, reduction // (min_slice or GPU_MATMUL_MIN_SLICE)))
    whole = max([1] + [s for s in range(2, most + 1) if reduction % s == 0 and (reduction // s) % k_tile == 0])
    if whole > 1 or not padded:
        return whole
    return max([1] + [s for s in range(2, most + 1) if reduction % s == 0])  # (none of whole tiles)


def _split_reduction(sch, gemm, slices: int, sum_at_consumer: bool = True):
    """rfactor ``gemm``'s reduction into ``slices`` slices (a leading spatial axis of the partial
    block, which is returned); ``gemm`` is left adding the slices up, computed at its first
    consumer's output, one thread per element (the epilogue kernel), or, without
    ``sum_at_consumer`` (a fused epilogue reading whole gate groups), at the root, the slice loop
    innermost, for :func:`_epilogue_kernel` to make a kernel of its own."""
    _, reduction = _gemm_axes(sch, gemm)
    # unit axes stay out of the fusion (fused in, one would be bound to a constant, which
    # transform_block_layout refuses)
    reduction = [l for l in reduction if _extent(sch, l) > 1] or reduction
    red = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    block_slice, _ = sch.split(red, [slices, None])
    spatial, _ = _gemm_axes(sch, gemm)
    partial = sch.rfactor(block_slice, 0)
    p_loops = sch.get_loops(partial)
    sch.reorder(p_loops[len(spatial)], *p_loops[:len(spatial)])  # the slice first, as the block binds it
    if not sum_at_consumer:  # the slice loop innermost (where rfactor leaves it, made sure of),
        # the block marked for _epilogue_kernel
        loops = sch.get_loops(gemm)
        sch.reorder(*[l for l in loops if not sch.get(l).same_as(sch.get(block_slice))], block_slice)
        sch.annotate(gemm, SLICE_SUM, 1)
        return partial
    consumers = sch.get_consumers(gemm)
    if len(consumers) != 1:
        raise s_tir.ScheduleError(f"split-K: the GEMM needs one consumer, has {len(consumers)}")
    sum_slices_per_output(sch, gemm, consumers[0])
    return partial


def _static(extent):
    """An extent as an int where it is a constant, else the expression (a symbolic row count)."""
    return int(extent) if isinstance(extent, tvm.tirx.IntImm) else extent


def normalize_matmul(sch, kernel: Kernel, slices, k_tile: int, sum_at_consumer: bool = True,
                     padded_slices: bool = False):
    """Bring the kernel's GEMM block to the form ``C[s, i, j] += A[s, i, k] * B[s, j, k]``
    (``reindex`` and ``transform_layout``, as dlight's ``Matmul`` does), each fused axis in the
    order its operand lays it out (the weight gradient's rows as ``(j, g)``, the order of ``dg``),
    so that copies of tiles read rows of contiguous memory. ``slices(rows, cols, reduction)``
    says how many blocks share the reduction: more than one splits it first
    (:func:`_split_reduction`, ``sum_at_consumer`` passed on; the slice becomes the leading axis
    ``s`` of a partial GEMM).

    Returns the normalised block, ``(rows, cols, reduction)`` before any split, whether each
    operand is contiguous along the reduction, and the slice count."""
    main = sch.get_sblock(kernel.gemm)
    stmt = sch.get(main)
    extent = {iv.var: _static(iv.dom.extent) for iv in stmt.iter_vars}
    S, I, J, K, k_inner = _matmul_axes(stmt, kernel.name)
    totals = tuple(math.prod(extent[v] for v in vs) for vs in (I, J, K))
    k_slices = slices(*totals)
    if k_slices > 1:
        if not isinstance(totals[2], int):
            raise s_tir.ScheduleError(f"{kernel.name}: a reduction of symbolic length is not split over blocks")
        if totals[2] % k_slices or ((totals[2] // k_slices) % k_tile and not padded_slices):
            raise s_tir.ScheduleError(f"{kernel.name}: {k_slices} slices of a {totals[2]}-long reduction "
                                      f"in {k_tile}-long tiles")
        main = _split_reduction(sch, main, k_slices, sum_at_consumer)
        stmt = sch.get(main)
        extent = {iv.var: _static(iv.dom.extent) for iv in stmt.iter_vars}
        S, I, J, K, k_inner = _matmul_axes(stmt, kernel.name)
    ivs = [iv.var for iv in stmt.iter_vars]

    def index_map(used, groups):
        names = [tvm.tirx.Var(f"i{n}", "int32") for n in range(len(used))]
        env = dict(zip(used, names))

        def fuse(vs):
            e = tvm.tirx.const(0, "int32")
            for v in vs:
                e = e * extent[v] + env[v]
            return e
        return tvm.tirx.IndexMap(names, [fuse(g) for g in groups], None)

    def used(group):  # a reindexed buffer's axes: the block's variables it uses, in block order
        return [v for v in ivs if any(v.same_as(x) for x in group)]

    reindex_a = sch.reindex(main, ("read", 0))
    reindex_b = sch.reindex(main, ("read", 1))
    reindex_c = sch.reindex(main, ("write", 0))
    sch.transform_layout(reindex_a, ("write", 0), index_map(used(S + I + K), [S, I, K]))
    sch.transform_layout(reindex_b, ("write", 0), index_map(used(S + J + K), [S, J, K]))
    sch.transform_layout(reindex_c, ("read", 0), index_map(used(S + I + J), [S, I, J]))
    sch.transform_block_layout(main, index_map(ivs, [S, I, J, K]))
    return main, totals, k_inner, k_slices


def _epilogue_kernel(sch, threads: int = GPU_THREADS) -> None:
    """Every loop nest left at the root without threads (a step's gate math, after its GEMM was
    tiled into a buffer of its own; the sum of its slices where the GEMM was split over blocks) as
    a kernel of one thread per output element: each nest's spatial loops fused and spread over
    ``threads``-thread blocks (a step's sibling outputs share one)."""
    root = sch.get_sblock("root")

    def unbound():
        return [b for b in sch.get_child_blocks(root)
                if not any(sch.get(l).thread_binding is not None for l in sch.get_loops(b))]
    pending = unbound()
    while pending:
        loops = sch.get_loops(pending[0])
        if not loops:
            raise s_tir.ScheduleError(f"{sch.get(pending[0]).name_hint}: an epilogue without loops")
        block = sch.get(pending[0])
        if any(iv.iter_type != 0 for iv in block.iter_vars):
            if SLICE_SUM not in block.annotations:
                raise s_tir.ScheduleError(f"{block.name_hint}: an epilogue with a reduction")
            # the sum of a split GEMM's slices (_split_reduction, its slice loop innermost): a
            # thread an output, the slices summed in its loop
            sch.unroll(loops[-1])
            loops = loops[:-1]
        fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
        block_loop, thread_loop = sch.split(fused, [None, min(threads, _extent(sch, fused))])
        sch.bind(block_loop, "blockIdx.x")
        sch.bind(thread_loop, "threadIdx.x")
        left = unbound()
        if len(left) >= len(pending):
            raise s_tir.ScheduleError("the epilogue's loop nests could not be bound")
        pending = left


# TF32 tensor-core tiles (tensor_cores.tf32_tiles) for the all-steps GEMMs of a build with
# ``allow_tf32``: (warps, 16 x 16 fragments per warp) along (rows, cols), and the reduction steps
# per shared-memory tile. The larger tile where it gives the GPU at least a wave of blocks.
TF32_TILES = (dict(warps=(2, 4), fragments=(4, 2), k_tile=32), dict(warps=(2, 2), fragments=(2, 2), k_tile=32))


# The tiles of a step on TF32 tiles (``BuildOptions.tensor_core_steps``): a step has few rows (the
# batch), so its blocks are short; the first that gives the GPU a wave of blocks, else the last.
# 128 reduction steps a shared tile: with a block or two an SM, each copy's latency is paid once
# per tile (H200, LSTM N = 128, H = 1024 fp16 inference: 32 steps 5.3 ms, 128 steps 4.2;
# double-buffered 5.5: notes/performance.md v50).
TF32_STEP_TILES = (dict(warps=(2, 2), fragments=(2, 2), k_tile=128), dict(warps=(2, 2), fragments=(1, 2), k_tile=128))


# The TF32 block tiles tuning explores ((warps, fragments) along (rows, cols); the knob
# ``tf32_shape`` of :mod:`tvmrnn.schedules.knobs`): every default's, and 64 x 128.
TF32_SHAPES = tuple(dict.fromkeys([(t["warps"], t["fragments"]) for t in TF32_TILES + TF32_STEP_TILES]
                                  + [((2, 4), (2, 2))]))


def tf32_default(kernel: Kernel, sms: int = GPU_SMS) -> dict:
    """The TF32 tile :func:`gpu_matmul_tf32` takes for ``kernel`` by default: :data:`TF32_STEP_TILES`'
    rule for a step's GEMM (a fused epilogue), :data:`TF32_TILES`' for the others."""
    rows, cols, _ = matmul_extents(kernel)
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    return dict(tf32_tile(rows, cols, sms, TF32_STEP_TILES if fused_epilogue(sch, kernel) else TF32_TILES))


def _tf32_blocks(rows: int, cols: int, tile: dict) -> int:
    """Thread blocks of a ``rows x cols`` output in ``tile``'s block tiles."""
    (wi, wj), (fi, fj) = tile["warps"], tile["fragments"]
    return -(-rows // (wi * fi * 16)) * -(-cols // (wj * fj * 16))


def tf32_tile(rows: int, cols: int, sms: int = GPU_SMS, tiles=None) -> dict:
    """The entry of ``tiles`` (:data:`TF32_TILES`) for a ``rows x cols`` output."""
    tiles = TF32_TILES if tiles is None else tiles
    return next((t for t in tiles if _tf32_blocks(rows, cols, t) >= sms), tiles[-1])


def tf32_k_slices(rows: int, cols: int, reduction: int, tile: dict, sms: int = GPU_SMS) -> int:
    """Split-K for a TF32 GEMM with few output tiles (the short chunks' GEMMs), by the rule of
    :func:`matmul_k_slices`."""
    threads = _tf32_blocks(rows, cols, tile) * tile["warps"][0] * tile["warps"][1] * 32
    return _k_slices(threads, reduction, tile["k_tile"], sms)


def gpu_matmul_tf32(sch, kernel: Kernel, k_slices: int | None = None, tile: dict | None = None,
                    sms: int = GPU_SMS) -> None:
    """:func:`gpu_matmul` on TF32 tensor cores (``mma.sync`` m16n8k8, :mod:`tvmrnn.schedules.tensor_cores`):
    the same normalised GEMM, block tiles of :func:`tf32_tile` (``tile`` overrides any of its
    ``warps``, ``fragments``, ``k_tile``, or sets ``pipeline`` or ``stage_pad``), split-K by
    :func:`tf32_k_slices` (or ``k_slices``), the epilogue fused into the write of the output.
    ``sms``: the GPU's SMs (:func:`tvmrnn.device.device_model`), whose waves the tiles fill.
    A step's GEMM with a fused epilogue (``BuildOptions.tensor_core_steps``) writes its tiles to
    the GEMM's buffer in global memory, and the epilogue runs as a second kernel, one thread per
    output element (:func:`_epilogue_kernel`), as :func:`gpu_matmul` does it; its reduction is
    not split."""
    epilogue = fused_epilogue(sch, kernel)
    chosen = {**tf32_default(kernel, sms), **(tile or {})}
    if epilogue and k_slices not in (None, 1):
        raise s_tir.ScheduleError(f"{kernel.name}: a fused epilogue's GEMM is not split over blocks")

    def slices(m_total, n_total, k_total):
        if epilogue:
            return 1
        return tf32_k_slices(m_total, n_total, k_total, chosen, sms) if k_slices is None else k_slices
    main, _, k_inner, n_slices = normalize_matmul(sch, kernel, slices, chosen["k_tile"])
    tensor_cores.tf32_tiles(sch, main, k_inner, split_k=n_slices > 1, keep=kernel.gemm, epilogue=epilogue,
                            operands=tensor_core_operands(sch.mod["main"]), **chosen)
    if epilogue:
        _epilogue_kernel(sch)


def gpu_matmul(sch, kernel: Kernel, rows=None, cols=None, k_tile: int = 16, pipeline: bool = False,
               pad: int = 4, k_slices: int | None = None, tf32: bool = False, sms: int = GPU_SMS,
               async_stages: int = 0) -> None:
    """The GEMMs over chunks of steps or over weights: the classic SGEMM of CUTLASS's SIMT path.

    The GEMM is first normalised to ``C[s, i, j] += A[s, i, k] * B[s, j, k]`` (``reindex`` and
    ``transform_layout``, as dlight's ``Matmul`` does), each fused axis in the order its operand
    lays it out (the weight gradient's rows as ``(j, g)``, the order of ``dg``), so that the
    copies into shared memory read rows of contiguous memory. A block of ``rows[1] x cols[1]``
    threads owns a ``prod(rows) x prod(cols)`` tile of ``C``; a thread an ``rows[0] x cols[0]``
    grid of ``rows[2] x cols[2]`` micro-tiles (virtual threads, 64 accumulators with the default),
    strided so that the threads of a warp read consecutive ``float4`` from shared memory. Both
    operands are kept in shared memory reduction-major (``A`` transposed as it is copied in), rows
    padded by ``pad`` floats (no bank conflicts for the transposed stores), so a thread loads its
    micro-tile's operands with 128-bit loads: 4 of them per ``k`` for 64 multiply-adds. dlight's
    ``Matmul`` read single floats from shared memory, 16 per 64 multiply-adds, which is as many
    shared-memory instructions as the FMA pipes can take (on the H100 it ran at ~23 TFLOP/s, half
    of cuBLAS, ``notes/performance.md`` v6). With ``pipeline`` the shared tiles are double-buffered
    (TIR's software pipeline): the copy of the next tile is issued before the multiply-adds of
    this one; with ``async_stages`` (2 or more, sm_80 on) there are that many shared tiles, filled
    by ``cp.async`` (``software_pipeline_async_stages``; the build's pass config lowers them), so the
    copies of the next tiles are in flight while this one's multiply-adds run (dynamic shared
    memory where the stages pass the 48 KB of static shared memory). Global memory is read and
    written with scalar accesses: the sequence driver hands kernels views at offsets that need not
    be 16-byte aligned (``cp.async`` copies 4 bytes at a time so). Shapes that are not multiples of
    the tile are padded (``pad_einsum``): the copies read zeros past the edges.

    ``k_slices`` splits the reduction over that many blocks (:func:`matmul_k_slices` picks the
    default; a forward step's, :func:`forward_step_k_slices`): the slice becomes a leading batch
    axis (``blockIdx.z``) of a partial GEMM and a second kernel adds the slices up and runs the
    epilogue (:func:`_split_reduction`). ``sms``:
    the GPU's SMs (:func:`tvmrnn.device.device_model`), whose waves the default shapes fill.

    A large per-step GEMM with a fused epilogue (a step's gate math reading whole gate groups,
    several sibling outputs: :data:`tvmrnn.schedules.common.GPU_STEP_MATMUL_OUTPUTS`) keeps its
    result in a buffer in global memory, and the epilogue runs as a second kernel, one thread per
    output element (:func:`_epilogue_kernel`); its reduction is split over blocks where
    ``k_slices`` asks (or by :func:`matmul_k_slices`' rule, a forward step's by
    :func:`forward_step_k_slices`, where :data:`GPU_STEP_MATMUL_K_SLICES` is on), a third kernel
    summing the slices before the epilogue.
    """
    if tf32:  # a tiling of its own: ``tf32`` may be a dict overriding the tile (:data:`TF32_TILES`)
        gpu_matmul_tf32(sch, kernel, k_slices=k_slices, tile=tf32 if isinstance(tf32, dict) else None, sms=sms)
        return

    epilogue = fused_epilogue(sch, kernel)
    stmt = sch.get(sch.get_sblock(kernel.gemm))  # a step of both directions: twice the tiles
    problems = math.prod(_static(iv.dom.extent) for iv in stmt.iter_vars[:kernel.batch])
    if epilogue and k_slices not in (None, 1) and not GPU_STEP_MATMUL_K_SLICES:
        raise s_tir.ScheduleError(f"{kernel.name}: a fused epilogue's GEMM is split over blocks only with "
                                  "GPU_STEP_MATMUL_K_SLICES on")

    def slices(m_total, n_total, k_total):
        if not all(isinstance(x, int) for x in (m_total, n_total, k_total)) and not (rows and cols and k_slices):
            # (a step count only known at launch: no model of the GEMM's shape chooses for it)
            raise s_tir.ScheduleError(f"{kernel.name}: a symbolic step count needs rows=, cols= and k_slices=")
        if epilogue and not GPU_STEP_MATMUL_K_SLICES:  # (an explicit split was refused above)
            return 1
        shape = (rows or matmul_shape(m_total, n_total, sms)[0], cols or matmul_shape(m_total, n_total, sms)[1])
        if k_slices is not None:
            return k_slices
        if epilogue and k_total <= n_total and not GPU_FORWARD_STEP_K_SLICES:  # a forward step
            return forward_step_k_slices(m_total, n_total, k_total, shape, k_tile, sms, problems=problems)
        stacked = problems if epilogue and GPU_STEP_SLICES_COUNT_DIRECTIONS else 1
        # (a backward step's reduction, G x H, may be split into padded slices; not measured elsewhere)
        return matmul_k_slices(m_total, n_total, k_total, shape, k_tile, sms, problems=stacked,
                               padded=epilogue and GPU_MATMUL_PADDED_SLICES)
    main, (m_total, n_total, _), k_inner, k_slices = normalize_matmul(sch, kernel, slices, k_tile,
                                                                      sum_at_consumer=not epilogue,
                                                                      padded_slices=GPU_MATMUL_PADDED_SLICES)
    default_rows, default_cols = matmul_shape(m_total, n_total, sms) if isinstance(m_total, int) else (rows, cols)
    vi, ti, mi = rows or default_rows
    vj, tj, mj = cols or default_cols
    if isinstance(m_total, int) and m_total <= vi * ti * mi // 2:  # a small GEMM: one micro-tile row per thread
        vi = 1
    if n_total <= vj * tj * mj // 2:
        vj = 1
    sch.pad_einsum(main, [1, vi * ti * mi, vj * tj * mj, k_tile])
    s, i, j, k = sch.get_loops(main)
    bi, li, ti_, ii = sch.split(i, [None, vi, ti, mi])
    bj, lj, tj_, jj = sch.split(j, [None, vj, tj, mj])
    ko, ki = sch.split(k, [None, k_tile])
    sch.reorder(s, bi, bj, li, lj, ti_, tj_, ko, ki, ii, jj)
    sch.bind(s, "blockIdx.z")
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    sch.bind(li, "vthread.y")
    sch.bind(lj, "vthread.x")
    sch.bind(ti_, "threadIdx.y")
    sch.bind(tj_, "threadIdx.x")
    accumulate = sch.cache_write(main, 0, "local")
    sch.reverse_compute_at(accumulate, tj_, preserve_unit_loops=True)

    # the operands' shared tiles (``async_stages`` of them): dynamic shared memory past the 48 KB a
    # kernel's static shared memory may take
    stages = async_stages if async_stages > 1 else (2 if pipeline else 1)
    tile_bytes = 4 * stages * k_tile * (vi * ti * mi + vj * tj * mj + 2 * pad)
    scope = "shared.dyn" if tile_bytes > 48 * 1024 else "shared"

    def to_shared(index, contiguous_k):
        copy = sch.cache_read(main, index, scope)
        sch.compute_at(copy, ko, preserve_unit_loops=True)
        m, kk = sch.get_loops(copy)[-2:]
        if not contiguous_k:  # consecutive threads along the operand's contiguous axis
            sch.reorder(kk, m)
            m, kk = kk, m
        _, y, x = sch.split(sch.fuse(m, kk), [None, ti, tj])
        sch.bind(y, "threadIdx.y")
        sch.bind(x, "threadIdx.x")
        sch.transform_layout(copy, ("write", 0), lambda b, m, kk: (b, kk, m))  # reduction-major
        sch.storage_align(copy, 0, axis=1, factor=32, offset=pad)
        return copy

    copies = [to_shared(0, k_inner[0]), to_shared(1, k_inner[1])]
    for index in (0, 1):  # each thread's operands: 128-bit loads from shared memory
        load = sch.cache_read(main, index, "local")
        sch.compute_at(load, ki, preserve_unit_loops=True)
        sch.vectorize(sch.get_loops(load)[-1])
    for copy in copies:
        dlight.gpu.matmul.auto_inline_producers(sch, copy)
    if k_slices > 1:  # the partials go straight to global memory (the copies out of the padded
        # and reindexed layouts inlined), where the epilogue kernel sums them (with a fused
        # epilogue, a kernel of its own sums them first)
        while True:
            copies = [c for c in sch.get_consumers(accumulate) if sch.get(c).name_hint != kernel.gemm]
            if not copies:
                break
            sch.reverse_compute_inline(copies[0])
        if epilogue:
            _epilogue_kernel(sch)
    elif epilogue:  # the tile goes to the GEMM's buffer; the epilogue is a kernel of its own
        params = sch.mod["main"].params
        while True:  # the copies out of the padded and reindexed layouts, not the epilogue's outputs
            copies = [c for c in sch.get_consumers(accumulate) if not _writes_param(sch, c, params)]
            if not copies:
                break
            sch.reverse_compute_inline(copies[0])
        _epilogue_kernel(sch)
    else:
        dlight.gpu.matmul.auto_inline_consumer_chain(sch, accumulate)
    sch.decompose_reduction(main, ko)
    nvcc_unroll(sch, ki)  # (the micro-tile's loops inside it with it)
    for loop in (ii, jj):
        sch.unroll(loop)
    if async_stages > 1:
        sch.annotate(ko, "software_pipeline_stage", [0, 0, async_stages - 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
        sch.annotate(ko, "software_pipeline_async_stages", [0])
    elif pipeline:
        sch.annotate(ko, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])
