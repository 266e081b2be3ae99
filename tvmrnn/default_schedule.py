"""The schedule a kernel gets when no tuning record matches: correct everywhere, fast on CPUs.

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

import math

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import dlight

from . import tensor_cores
from .kernels import Kernel

GPU_THREADS = 128
GPU_SPLIT_K_ROWS = 64  # GEMMs with at most this many output rows get split-K on GPUs
CPU_MIN_PARALLEL = 256  # elements below which a parallel region costs more than it saves


def is_gpu(target: tvm.target.Target) -> bool:
    return target.kind.name in ("cuda", "rocm", "vulkan", "metal", "opencl", "webgpu")


def _writes_param(sch, block, params) -> bool:
    return any(any(r.source.same_as(p) for p in params) for r in sch.get(block).writes)


def _extent(sch, loop) -> int:
    return int(sch.get(loop).extent)


def vector_lanes(target: tvm.target.Target) -> int:
    """float32 lanes of the target's widest vectors."""
    return 16 if tvm.target.codegen.llvm_cpu_has_features("avx512f", target) else 8


def _divisor(n: int, at_most: int, multiple_of: int = 1) -> int:
    """The largest divisor of ``n`` that is <= ``at_most`` and a multiple of ``multiple_of`` (else 1)."""
    for d in range(min(n, at_most), 0, -1):
        if n % d == 0 and d % multiple_of == 0:
            return d
    return 1


def cpu_column_tile(lanes: int, lead: int, inner: int, column_vectors: int | None = None) -> int:
    """:func:`cpu_gemm`'s column tile, in steps of its leading column axis (``lead`` long; the
    trailing ones, ``inner`` elements, e.g. all G gates of a unit, are taken whole): at most
    ``column_vectors`` vectors of ``lanes`` floats, a whole number of them where possible."""
    def lead_tile_for(vectors):
        cap = max(1, vectors * lanes // inner)
        # Whole vectors, so that `_vectorize` can run the tile as lane-wide pieces: with 3 gates,
        # 16 units make 48 floats (3 vectors); 20 units (60 floats) could not be split so.
        tile = _divisor(lead, cap, multiple_of=lanes // math.gcd(lanes, inner))
        return tile if tile > 1 else _divisor(lead, cap)

    lead_tile = lead_tile_for(column_vectors or 4)
    if lanes == 8 and column_vectors is None:
        # AVX2's 16 registers: a 2-vector-wide tile with 5 rows (each loaded vector of the
        # streamed operand feeds 5 multiply-adds) instead of a 4-wide one with 2 rows (2), where
        # 2 vectors hold a whole number of units. Gate-interleaved columns (the fused step, the
        # input projection) ran 7-14% faster so on a Zen 5 (x86-64-v3 code, two runs: LSTM step
        # 540-560 -> 491-505 us, input projection chunk 8.0 -> 7.0-7.2 ms); plain columns were
        # 7-10% slower there, but on an AVX2-only Zen 3 (2 threads, two runs each) 1.1-2.2x
        # faster: the LSTM's backward step 3,731 / 3,207 -> 1,862-3,285 / 1,488 us, the GRU's
        # 1,381 -> 939-970, the RNN's 253-259 -> 192-198, the RNN's forward step 255-257 -> 184,
        # the LSTM's 16-step input gradient 25.8 -> 16.8-20.6 ms (notes/performance.md v17).
        narrow = lead_tile_for(2)
        if narrow * inner % lanes == 0:
            lead_tile = narrow
    return lead_tile


def weight_panel(target, gates: int, hidden: int) -> int:
    """Units per column panel of the forward weights for ``target`` (0: none, K-major).

    The forward GEMMs (input projection, recurrent step) read ``w[k, j, g]``: a register tile of
    u units reads u*G floats of row k, then jumps H*G floats (12.8 KB for a DS2 LSTM) to row
    k + 1, a new page at every step of its reduction, which hardware prefetchers do not follow.
    Packed in panels, ``w[j // u, k, g, j % u]`` with u the tile's units (BLIS's packing), a
    tile's reduction walks one contiguous block. Within a panel's row the gates are blocked
    (gate g of the u units side by side), and so are the biases and the input projection
    (:func:`tvmrnn.kernels.gate_shape`): the fused gate math after the GEMM then reads whole
    vectors (with ``(j % u, g)`` order it gathered each gate lane by lane, ~1,400 ``vinsertps``
    a register tile on AVX-512: notes/performance.md v23-v24). On the AVX2-only Zen 3 dev machine (2 threads,
    interleaved, ``scripts/panel_study.py``) a step's GEMM went 1,214-1,408 -> 767-801 us and a
    16-step chunk 14.3-14.7 -> 11.6-12.5 ms. On the GPU machine's AVX-512 Xeon (16 threads,
    notes/performance.md v23, ``scripts/step_study.py``) the LSTM's step alone went 154 -> 123 us
    (125 -> 119 with huge pages), on one thread 1,108 -> 942 us, and whole passes interleaved
    with PyTorch (``scripts/cpu_pass_study.py``, huge pages on both sides of the comparison)
    LSTM inference 58.3 -> 48.4 ms, training 211 -> 198 ms, the GRU's the same or faster, the
    RNNs' the same. So every CPU gets them. ``TVMRNN_WEIGHT_PANELS``: ``auto`` or ``1``
    (default: panels), ``0`` K-major (for comparisons). The panel is the default schedule's tile
    (:func:`cpu_column_tile`), so that the tile's index into the panel simplifies; a schedule with
    another tile stays correct but is slow (a 10 x 2-vector tile on 16-unit panels ran 4x slower
    on the Xeon: its index does not simplify). GPUs: none (a warp reads a K-major row coalesced).
    The backward's copy of a weight with K inputs takes ``weight_panel(target, 1, K)`` (its tile
    runs along K alone: :func:`tvmrnn.kernels.backward_weight_shape`).
    """
    import os
    mode = os.environ.get("TVMRNN_WEIGHT_PANELS", "auto")
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"TVMRNN_WEIGHT_PANELS: expected auto, 0 or 1, got {mode!r}")
    if target is None:
        from .target import host_target
        target = host_target()
    if mode == "0" or is_gpu(target):
        return 0
    lanes = vector_lanes(target)
    units = cpu_column_tile(lanes, hidden, gates)
    # whole vectors only (a narrower tile, e.g. 2 of 74 features, gains nothing from a panel)
    return units if 1 < units < hidden and hidden % units == 0 and units * gates % lanes == 0 else 0


def gradient_panel(target, gates: int, hidden: int) -> int:
    """Units per column panel in which a CPU backward sums its weight gradients (0: rows ``(K, H,
    G)``; :func:`tvmrnn.kernels.weight_gradient`): the forward weights' panel
    (:func:`weight_panel`), where the weight gradient's register tile is one whole panel.
    A 16-step DS2 LSTM chunk on the GPU machine's Xeon (16 threads, interleaved,
    ``scripts/wgrad_study.py``): 1,706 us in rows, 1,381 in panels, plus 110 us to pack the gate
    gradients into panels (one pack serves both weights where dgh is dgx: the backward uses panels
    only there, not for the GRU); one thread 15.8 -> 12.1 ms (notes/performance.md v25). ``TVMRNN_GRADIENT_PANELS``: ``auto`` (default) or ``0`` (rows, for
    comparisons); GPUs: none (they sum weight gradients in PyTorch's layout)."""
    import os
    mode = os.environ.get("TVMRNN_GRADIENT_PANELS", "auto")
    if mode not in ("auto", "0"):
        raise ValueError(f"TVMRNN_GRADIENT_PANELS: expected auto or 0, got {mode!r}")
    if mode == "0":
        return 0
    if target is None:
        from .target import host_target
        target = host_target()
    panel = weight_panel(target, gates, hidden)
    return panel if panel and cpu_column_tile(vector_lanes(target), panel, gates) == panel else 0


def cpu_gemm(sch, kernel: Kernel, target, accumulators: int = 24, column_vectors: int | None = None,
             row_block: int | None = None, red_block: int | None = None) -> None:
    """Register-blocked GEMM (see the module docstring) on the kernel's reduction block.

    ``accumulators``: vector registers the output tile may use (of AVX-512's 32 or AVX2's 16,
    the rest hold the broadcast inputs and streamed operand); ``column_vectors``: widest tile
    along the columns, in vectors (default 4; on AVX2, 2 where that is a whole number of units).
    ``row_block`` and ``red_block`` block for L1 (BLIS's loop order): a parallel task takes
    ``row_block`` register tiles down the last row axis, and runs the reduction (its axes fused)
    in slices of ``red_block`` outside them, so that one slice of the streamed operand serves
    every tile of the block from L1, their partial sums waiting in the block's output buffer.
    Default: :func:`l1_blocks`.
    """
    lanes = vector_lanes(target)
    if lanes == 8:
        accumulators = min(accumulators, 12)
    gemm = sch.get_sblock(kernel.gemm)
    epilogues = sch.get_consumers(gemm)
    iter_types = [iv.iter_type for iv in sch.get(gemm).iter_vars]
    loops = sch.get_loops(gemm)[-len(iter_types):]  # its own loops (innermost, in order)
    spatial = [l for l, it in zip(loops, iter_types) if it == 0]
    reduction = [l for l, it in zip(loops, iter_types) if it != 0]
    names = [sch.get(l).loop_var.name for l in spatial]
    ncols = len(kernel.columns)
    if tuple(names[len(names) - ncols:]) != kernel.columns:
        raise AssertionError(f"{kernel.name}: columns {kernel.columns} are not the trailing axes of {names}")
    extents = [_extent(sch, l) for l in spatial]
    row_loops, col_loops = spatial[:-ncols], spatial[-ncols:]
    row_extents, col_extents = extents[:-ncols], extents[-ncols:]

    inner = 1
    for e in col_extents[1:]:
        inner *= e
    lead_tile = cpu_column_tile(lanes, col_extents[0], inner, column_vectors)
    width = lead_tile * inner
    # Row tile: the last row axis tiled so that rows x column vectors fit the accumulators.
    rows = _divisor(row_extents[-1], max(1, accumulators // max(1, -(-width // lanes)))) if row_extents else 1

    if len(sch.get_loops(epilogues[0])) < len(spatial) or len(epilogues) > 1:
        # the tile in units: gate-blocked columns (p, g, u) take lead_tile panels of u units each
        units = lead_tile * (col_extents[-1] if kernel.columns[-1] == "u" else 1)
        _tile_from_outputs(sch, gemm, epilogues[0], units, rows, lanes)
        return
    if row_block is None and red_block is None:
        row_block, red_block = l1_blocks(kernel)
    row_block = _divisor(row_extents[-1] // rows, row_block or 1) if row_extents else 1
    red_total = math.prod(_extent(sch, l) for l in reduction)
    red_block = _divisor(red_total, red_block or red_total)
    col_outer, col_inner = sch.split(col_loops[0], [None, lead_tile])
    row_mid = []  # the row block's tiles
    if row_loops and row_block > 1:
        row_outer, row_mid, row_inner = sch.split(row_loops[-1], [None, row_block, rows])
        row_mid = [row_mid]
    elif row_loops:
        row_outer, row_inner = sch.split(row_loops[-1], [None, rows])
    else:  # a reduction to a row (the bias gradient)
        row_outer, row_inner = sch.split(sch.add_unit_loop(col_outer), [None, 1])
    outer = [*row_loops[:-1], row_outer]
    if red_block < red_total:
        red_outer, red_inner = sch.split(sch.fuse(*reduction) if len(reduction) > 1 else reduction[0],
                                         [None, red_block])
        reduction = [red_outer, red_inner]
        sch.reorder(col_outer, *outer, red_outer, *row_mid, red_inner, row_inner, col_inner, *col_loops[1:])
    else:
        # columns outermost: a core keeps its columns (its slice of the weights) from call to call
        sch.reorder(col_outer, *outer, *row_mid, *reduction, row_inner, col_inner, *col_loops[1:])
    tile = sch.fuse(col_outer, *outer)
    sch.parallel(tile)
    sch.unroll(row_inner)
    _vectorize(sch, sch.fuse(col_inner, *col_loops[1:]), lanes)
    sch.decompose_reduction(gemm, reduction[0])
    for consumer in epilogues:  # the epilogue on the tile, vectorised along its columns
        sch.reverse_compute_at(consumer, tile, preserve_unit_loops=True)
        _vectorize_trailing(sch, sch.get_loops(consumer)[1:], width, lanes)


# L1 blocking (``cpu_gemm``'s ``row_block``, ``red_block``) for the kernels it was measured on.
# The weight gradient in the packed layout (a 16-step chunk, DS2 LSTM), GFLOP/s on the GPU
# machine's Xeon at 16 threads / 1 thread: 835 / 99 unblocked, 1,120 / 94 with 8 tiles of 64
# reduction rows (PyTorch's ``dg^T @ a`` 1,116 / 120; notes/bench/wgrad_study_spr_v12.txt).
L1_BLOCKS = {"weight_gradient": (8, 64)}


def l1_blocks(kernel: Kernel) -> tuple[int | None, int | None]:
    """The default ``(row_block, red_block)`` of :func:`cpu_gemm` for ``kernel``: from
    :data:`L1_BLOCKS` by the kernel's family (its name up to the shape), none for the others."""
    for family, blocks in L1_BLOCKS.items():
        if kernel.name.startswith(family + "_"):
            return blocks
    return None, None


def _gemm_axes(sch, gemm):
    """The reduction block's loops split into spatial and reduction ones, with extents."""
    iter_types = [iv.iter_type for iv in sch.get(gemm).iter_vars]
    loops = sch.get_loops(gemm)[-len(iter_types):]  # its own loops (innermost, in order)
    spatial = [l for l, it in zip(loops, iter_types) if it == 0]
    reduction = [l for l, it in zip(loops, iter_types) if it != 0]
    return spatial, reduction


def gpu_gemm(sch, kernel: Kernel, target, **tiles) -> bool:
    """A GPU GEMM schedule for the kernel, if one applies (else the caller's fallback).

    Few output rows (the per-step GEMMs: the batch, ``N = 20`` at Deep Speech 2 sizes) leave too
    few output elements to fill the GPU with one thread per output tile, so these get split-K
    (:func:`gpu_split_k`); the GEMMs over chunks of steps or over weights (hundreds of rows or
    more) get :func:`gpu_matmul` (shared-memory tiles, a register micro-tile per thread).
    """
    kind = _gpu_kind(sch, kernel)
    if kind == "column sum":
        gpu_column_sum(sch, kernel)
    elif kind == "split-K":
        gpu_split_k(sch, kernel, **tiles)
    elif kind == "matmul":
        config = {**GPU_MATMUL, "tf32": uses_tf32(sch.mod["main"]), **tiles.get("matmul", {})}
        return _copy_applied(sch, lambda copy: gpu_matmul(copy, kernel, **config))
    return kind is not None


def uses_tf32(func) -> bool:
    """Whether the kernel's function asks for TF32 tensor cores (:func:`tvmrnn.kernels.tf32`)."""
    return bool(func.attrs is not None and int(func.attrs.get("tvmrnn.tf32", 0)))


def tf32_applies(kernel: Kernel, target) -> bool:
    """Whether a build with ``allow_tf32`` computes this kernel's GEMM on TF32 tensor cores: the
    GPU's tiled GEMMs (the all-steps GEMMs: input projections, input and weight gradients). The
    per-step GEMMs (split-K, fused with the gate math) and every CPU kernel stay fp32."""
    if kernel.gemm is None or not is_gpu(target) or persistent_blocks(kernel.func):
        return False
    return _gpu_kind(s_tir.Schedule(s_tir.renew_defs(kernel.func)), kernel) == "matmul"


def _gpu_kind(sch, kernel: Kernel) -> str | None:
    """Which GPU GEMM schedule fits the kernel held by ``sch``."""
    gemm = sch.get_sblock(kernel.gemm)
    spatial, reduction = _gemm_axes(sch, gemm)
    n_rows = len(spatial) - len(kernel.columns)
    if not reduction:
        return None
    if n_rows == 0:  # a sum into one row (the bias gradient)
        return "column sum"
    rows = math.prod(_extent(sch, l) for l in spatial[:n_rows])
    consumers = sch.get_consumers(gemm)
    # a fused epilogue (several sibling outputs, or outputs reading whole gate groups) stays in
    # split-K at any batch size: the tiled GEMM cannot place it
    fused_epilogue = len(consumers) > 1 or len(sch.get_loops(consumers[0])) < len(spatial)
    return "split-K" if rows <= GPU_SPLIT_K_ROWS or fused_epilogue else "matmul"


def gpu_column_sum(sch, kernel: Kernel, columns: int = 32, slices: int = 8, unroll: int = 8) -> None:
    """A reduction to one row (the bias gradient: ``db[g, j] += sum_{t,n} dg[t, n, j, g]``), few
    outputs (800-3200) over a long reduction (320 per 16-step chunk at DS2 sizes): a block of
    ``columns`` x ``slices`` threads, ``threadIdx.x`` along the output (consecutive threads read
    consecutive columns), the reduction split over ``threadIdx.y`` and added up by TVM's
    cross-thread reduction. (One thread per output left 7-25 blocks of threads each running a
    320-long chain of loads: 52 us per chunk on the H100; dlight's ``GeneralReduction``, one block
    per output, took 960 us.)"""
    gemm = sch.get_sblock(kernel.gemm)
    output = sch.get_consumers(gemm)[0]
    out_loops = sch.get_loops(output)
    fused = sch.fuse(*out_loops) if len(out_loops) > 1 else out_loops[0]
    block, thread = sch.split(fused, [None, min(columns, _extent(sch, fused))])
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.compute_at(gemm, thread, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    _, reduction = _gemm_axes(sch, gemm)
    red = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    per_thread, across = sch.split(red, [None, min(slices, _extent(sch, red))])
    sch.reorder(across, per_thread)
    sch.bind(across, "threadIdx.y")
    _, unrolled = sch.split(per_thread, [None, _divisor(_extent(sch, per_thread), unroll)])
    sch.unroll(unrolled)


# :func:`gpu_matmul`'s block shapes, (rows, cols) as (micro-tiles, threads, micro-tile size) along
# each: 128 x 128 (256 threads), 64 x 128 and 128 x 64 (128), 256 x 64 (256), 64 x 64 (64), every
# thread 8 x 8 outputs; and for small outputs with long reductions (the RNN's 800 x 800 weight
# gradient: 91 blocks of 64 x 128 ran at 11 TFLOP/s, dlight's 325 of 32 x 64 at 17) 32 x 64 (128
# threads of 4 x 4). The default takes the one that gives the most loaded SM the least work
# (:func:`matmul_shape`); tuning measures all of them (:func:`variants`).
GPU_MATMUL_SHAPES = (((2, 16, 4), (2, 16, 4)), ((2, 8, 4), (2, 16, 4)), ((2, 16, 4), (2, 8, 4)),
                     ((2, 32, 4), (2, 8, 4)), ((2, 8, 4), (2, 8, 4)), ((1, 8, 4), (1, 16, 4)))
# The rest of its default (``tiles["matmul"]`` overrides any of it; ``scripts/gemm_study.py``
# times others): 16 reduction steps per shared-memory tile (8 was 4-12% slower on the H100), not
# double-buffered (no faster there: two blocks per SM hide the copies' latency).
GPU_MATMUL = dict(k_tile=16, pipeline=False)
# Streaming multiprocessors the default shape is chosen for (the H100's; TVM's CUDA targets do
# not say): on another GPU it is a guess that tuning corrects.
GPU_SMS = 132


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


def _uses(expr, var) -> bool:
    found = []

    def visit(v, mutator):
        if v.same_as(var):
            found.append(v)
        return v

    tvm_ffi.structural_mutate(expr, [(tvm.ir.Var, visit)])
    return bool(found)


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


def slice_variants(kernel: Kernel, counts=(1, 2, 4, 5, 8, 10)) -> list[int]:
    """The reduction splits (``k_slices``) worth measuring for a kernel's tiled GEMM: none for a
    GEMM whose default tiles give every SM :data:`GPU_MATMUL_FILL_THREADS` threads, else every
    count of ``counts`` that cuts the reduction into whole 16-long tiles."""
    rows, cols, reduction = matmul_extents(kernel)
    (vi, ti, mi), (vj, tj, mj) = matmul_shape(rows, cols)
    threads = -(-rows // (vi * ti * mi)) * -(-cols // (vj * tj * mj)) * ti * tj
    if threads >= GPU_SMS * GPU_MATMUL_FILL_THREADS:
        return []
    return [s for s in counts if reduction % s == 0 and (reduction // s) % GPU_MATMUL["k_tile"] == 0]


# Split-K across blocks for the tiled GEMM (:func:`matmul_k_slices`): a GEMM whose output tiles
# give the GPU fewer than a quarter of ``GPU_MATMUL_FILL_THREADS`` threads per SM has its
# reduction split over blocks, each slice at least ``GPU_MATMUL_MIN_SLICE`` long.
GPU_MATMUL_FILL_THREADS = 512
GPU_MATMUL_MIN_SLICE = 256


def matmul_k_slices(rows: int, cols: int, reduction: int, shape, k_tile: int = 16, sms: int = GPU_SMS) -> int:
    """How many blocks share the reduction of a ``rows x cols`` GEMM tiled by ``shape`` by default.

    The all-steps GEMMs of a short chunk (the last steps of a sequence: 4 steps x N = 20 rows)
    have long reductions (800-3200) and few output tiles: the LSTM's 4-step input projection
    (80 x 3200 x 1600) is 100 blocks of 64 threads on the H100's 132 SMs, ~10 TFLOP/s
    (notes/performance.md v12), the 4-step input gradient (80 x 1600 x 3200) 75 blocks of 128.
    Slices multiply the blocks, each summing its part of the reduction into a partial result in
    global memory that a second kernel adds up with the GEMM's epilogue (cuBLAS's split-K). A
    slice count divides the reduction into whole ``k_tile`` tiles (rfactor needs even slices)."""
    (vi, ti, mi), (vj, tj, mj) = shape
    blocks = -(-rows // (vi * ti * mi)) * -(-cols // (vj * tj * mj))
    return _k_slices(blocks * ti * tj, reduction, k_tile, sms)


def _k_slices(threads: int, reduction: int, k_tile: int, sms: int) -> int:
    """:func:`matmul_k_slices`' rule, given the GEMM's threads in all its output tiles."""
    want = sms * GPU_MATMUL_FILL_THREADS
    if 4 * threads > want:
        return 1
    most = max(1, min(want // threads, reduction // GPU_MATMUL_MIN_SLICE))
    return max([1] + [s for s in range(2, most + 1) if reduction % s == 0 and (reduction // s) % k_tile == 0])


def _split_reduction(sch, gemm, slices: int):
    """rfactor ``gemm``'s reduction into ``slices`` slices (a leading spatial axis of the partial
    block, which is returned); ``gemm`` is left adding the slices up, computed at its first
    consumer's output, one thread per element (the epilogue kernel)."""
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
    consumers = sch.get_consumers(gemm)
    if len(consumers) != 1:
        raise s_tir.ScheduleError(f"split-K: the GEMM needs one consumer, has {len(consumers)}")
    loops = sch.get_loops(consumers[0])
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    block_loop, thread_loop = sch.split(fused, [None, min(GPU_THREADS, _extent(sch, fused))])
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(thread_loop, "threadIdx.x")
    sch.compute_at(gemm, thread_loop, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    for loop in sch.get_loops(gemm)[2:]:
        sch.unroll(loop)
    return partial


def normalize_matmul(sch, kernel: Kernel, slices, k_tile: int):
    """Bring the kernel's GEMM block to the form ``C[s, i, j] += A[s, i, k] * B[s, j, k]``
    (``reindex`` and ``transform_layout``, as dlight's ``Matmul`` does), each fused axis in the
    order its operand lays it out (the weight gradient's rows as ``(j, g)``, the order of ``dg``),
    so that copies of tiles read rows of contiguous memory. ``slices(rows, cols, reduction)``
    says how many blocks share the reduction: more than one splits it first
    (:func:`_split_reduction`; the slice becomes the leading axis ``s`` of a partial GEMM).

    Returns the normalised block, ``(rows, cols, reduction)`` before any split, whether each
    operand is contiguous along the reduction, and the slice count."""
    main = sch.get_sblock(kernel.gemm)
    stmt = sch.get(main)
    extent = {iv.var: int(iv.dom.extent) for iv in stmt.iter_vars}
    S, I, J, K, k_inner = _matmul_axes(stmt, kernel.name)
    totals = tuple(math.prod(extent[v] for v in vs) for vs in (I, J, K))
    k_slices = slices(*totals)
    if k_slices > 1:
        if totals[2] % k_slices or (totals[2] // k_slices) % k_tile:
            raise s_tir.ScheduleError(f"{kernel.name}: {k_slices} slices of a {totals[2]}-long reduction "
                                      f"in {k_tile}-long tiles")
        main = _split_reduction(sch, main, k_slices)
        stmt = sch.get(main)
        extent = {iv.var: int(iv.dom.extent) for iv in stmt.iter_vars}
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


# TF32 tensor-core tiles (tensor_cores.tf32_tiles) for the all-steps GEMMs of a build with
# ``allow_tf32``: (warps, 16 x 16 fragments per warp) along (rows, cols), and the reduction steps
# per shared-memory tile. The larger tile where it gives the GPU at least a wave of blocks.
TF32_TILES = (dict(warps=(2, 4), fragments=(4, 2), k_tile=32), dict(warps=(2, 2), fragments=(2, 2), k_tile=32))


def _tf32_blocks(rows: int, cols: int, tile: dict) -> int:
    """Thread blocks of a ``rows x cols`` output in ``tile``'s block tiles."""
    (wi, wj), (fi, fj) = tile["warps"], tile["fragments"]
    return -(-rows // (wi * fi * 16)) * -(-cols // (wj * fj * 16))


def tf32_tile(rows: int, cols: int, sms: int = GPU_SMS) -> dict:
    """The entry of :data:`TF32_TILES` for a ``rows x cols`` output."""
    return next((t for t in TF32_TILES if _tf32_blocks(rows, cols, t) >= sms), TF32_TILES[-1])


def tf32_k_slices(rows: int, cols: int, reduction: int, tile: dict, sms: int = GPU_SMS) -> int:
    """Split-K for a TF32 GEMM with few output tiles (the short chunks' GEMMs), by the rule of
    :func:`matmul_k_slices`."""
    threads = _tf32_blocks(rows, cols, tile) * tile["warps"][0] * tile["warps"][1] * 32
    return _k_slices(threads, reduction, tile["k_tile"], sms)


def gpu_matmul_tf32(sch, kernel: Kernel, k_slices: int | None = None, tile: dict | None = None) -> None:
    """:func:`gpu_matmul` on TF32 tensor cores (``mma.sync`` m16n8k8, :mod:`tvmrnn.tensor_cores`):
    the same normalised GEMM, block tiles of :func:`tf32_tile` (``tile`` overrides any of its
    ``warps``, ``fragments``, ``k_tile``, or sets ``pipeline``), split-K by
    :func:`tf32_k_slices` (or ``k_slices``), the epilogue fused into the write of the output."""
    rows, cols, _ = matmul_extents(kernel)
    chosen = {**tf32_tile(rows, cols), **(tile or {})}

    def slices(m_total, n_total, k_total):
        return tf32_k_slices(m_total, n_total, k_total, chosen) if k_slices is None else k_slices
    main, _, k_inner, n_slices = normalize_matmul(sch, kernel, slices, chosen["k_tile"])
    tensor_cores.tf32_tiles(sch, main, k_inner, split_k=n_slices > 1, keep=kernel.gemm, **chosen)


def gpu_matmul(sch, kernel: Kernel, rows=None, cols=None, k_tile: int = 16, pipeline: bool = False,
               pad: int = 4, k_slices: int | None = None, tf32: bool = False) -> None:
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
    this one. Global memory is read and written with scalar accesses: the sequence driver hands
    kernels views at offsets that need not be 16-byte aligned. Shapes that are not multiples of
    the tile are padded (``pad_einsum``): the copies read zeros past the edges.

    ``k_slices`` splits the reduction over that many blocks (:func:`matmul_k_slices` picks the
    default): the slice becomes a leading batch axis (``blockIdx.z``) of a partial GEMM and a
    second kernel adds the slices up and runs the epilogue (:func:`_split_reduction`).
    """
    if tf32:  # a tiling of its own: ``tf32`` may be a dict overriding the tile (:data:`TF32_TILES`)
        gpu_matmul_tf32(sch, kernel, k_slices=k_slices, tile=tf32 if isinstance(tf32, dict) else None)
        return

    def slices(m_total, n_total, k_total):
        shape = (rows or matmul_shape(m_total, n_total)[0], cols or matmul_shape(m_total, n_total)[1])
        return matmul_k_slices(m_total, n_total, k_total, shape, k_tile) if k_slices is None else k_slices
    main, (m_total, n_total, _), k_inner, k_slices = normalize_matmul(sch, kernel, slices, k_tile)
    default_rows, default_cols = matmul_shape(m_total, n_total)
    vi, ti, mi = rows or default_rows
    vj, tj, mj = cols or default_cols
    if m_total <= vi * ti * mi // 2:  # a small GEMM: one micro-tile row per thread
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

    def to_shared(index, contiguous_k):
        copy = sch.cache_read(main, index, "shared")
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
        # and reindexed layouts inlined), where the epilogue kernel sums them
        while True:
            copies = [c for c in sch.get_consumers(accumulate) if sch.get(c).name_hint != kernel.gemm]
            if not copies:
                break
            sch.reverse_compute_inline(copies[0])
    else:
        dlight.gpu.matmul.auto_inline_consumer_chain(sch, accumulate)
    sch.decompose_reduction(main, ko)
    for loop in (ki, ii, jj):
        sch.unroll(loop)
    if pipeline:
        sch.annotate(ko, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])


def _copy_applied(sch, schedule) -> bool:
    """Apply ``schedule(sch_copy)`` to a copy of ``sch``'s function and replay its trace through
    ``sch`` (so that tuning can measure it); False where it does not fit this kernel."""
    copy = s_tir.Schedule(s_tir.renew_defs(sch.mod["main"]))
    try:
        schedule(copy)
    except tvm.s_tir.ScheduleError:
        return False
    copy.trace.apply_to_schedule(sch, remove_postproc=False)
    return True


def gpu_split_k(sch, kernel: Kernel, threads: int = 256, max_shared_bytes: int = 48 * 1024,
                min_blocks: int = 200, thread_columns: int = 4, unroll: int = 8, accumulators: int = 96,
                max_blocks: int | None = None, block_slices: int | None = None,
                stationary_bytes: int = 0, stage_rows: bool = False, vector_k: int = 1,
                stage_epilogue: bool = False, groups_outer: bool = False, row_vector: int = 1,
                row_phases: int | None = None) -> None:
    """Split-K for a GEMM with few rows, its epilogue (a fused step's gate math) in the same kernel.

    A thread block owns a few output columns (hidden units, each with all its trailing columns:
    the G gates of a unit) for all rows, few enough that there are ``min_blocks`` blocks (in all:
    a kernel with a leading batch axis, :attr:`tvmrnn.kernels.Kernel.batch`, gives each problem
    its share, each block working on one problem: on the H100 the two-direction LSTM step took
    17.7 us so, 23.9 us with 200 blocks per direction, against 13.4 us for one direction). Its
    threads split the reduction (its axes fused; ``(j, g)`` of the backward's GEMMs is contiguous
    in their row operand) ``slices`` ways (``rfactor``): each thread keeps a
    tile of rows x ``thread_columns`` in registers (the G gates of one unit, or 4 units of a
    one-gate cell, or 4 columns of the backward's ``dh``: each loaded input row value feeds 4
    multiply-adds) and accumulates it over every ``slices``-th reduction index; consecutive
    threads take consecutive columns (a warp reads the weights in contiguous runs). The partial
    sums meet in shared memory, where one thread per output element adds them up and runs the
    epilogue. At DS2 sizes (N = 20, H = 800) an LSTM step is 200 blocks of 100 threads (4 units
    x 25 slices, as many as 48 KB of shared memory holds), 80 accumulators per thread; a GRU step
    200 blocks of 200 threads (4 units x 50 slices). ``scripts/tile_study.py --device cuda``
    times other shapes; on the H100, 256 threads was best or within noise for every per-step
    kernel (GRU step 11.5 us against 24.3 us with 128 threads, ``notes/performance.md``).

    ``max_blocks`` (a persistent kernel's, :func:`tvmrnn.kernels.persistent`; :func:`apply` passes
    it): at most this many blocks, each owning as many columns as that takes (fewer
    ``accumulators`` per thread, set in :data:`PERSISTENT_TILES`, give a block more threads for
    its larger share). With ``stationary_bytes``, a persistent block's slice of the weights, if at
    most that large, is copied into shared memory once (:func:`_stationary_weights`).
    ``vector_k`` (where both GEMM operands are staged in shared memory): each thread sums a
    contiguous run of the reduction, read ``vector_k`` values at a time (:func:`_vector_operand_loads`).
    ``stage_epilogue``: the epilogue's other global inputs (the step's input projection, the
    carried cell state) are staged at the top of the step, their loads in flight during the GEMM
    (:func:`_stage_epilogue_inputs`).
    ``groups_outer`` (a persistent kernel with stationary weights): a thread's row group is the
    outermost part of its index, its reduction slice inside it, so a warp's threads share their
    rows and differ in their slices. Its loads of the staged hidden state (one element of each of
    its rows, at consecutive reduction indices) then fall in distinct shared-memory banks, and its
    loads of the weights (a unit's gates, one 16-byte vector a thread) are consecutive. With the
    slice outermost, a warp held two row groups, ``rows_per_thread`` rows of 800 words apart at
    DS2 sizes: the same banks, two wavefronts per load (Nsight Compute on the H100,
    notes/performance.md v16). Padding those rows to an odd stride removed the conflicts too, but
    the copy's index arithmetic took 128 registers instead of 80 and the step ran slower.
    ``row_vector``: the staged hidden state is copied ``row_vector`` floats a load (a whole copy;
    a phase's part is copied a float a load).
    ``row_phases`` (with ``stage_rows``): the reduction runs in that many phases, each staging its
    part of the hidden state (``rows x K / row_phases``) in one shared buffer, then summing it;
    None: one phase where the whole hidden state fits beside the weights and partial sums, else
    the fewest of up to :data:`MAX_ROW_PHASES` that fit (two-direction steps; one-direction steps
    take one phase unless asked). A block of a two-direction step holds 13
    LSTM units' weights (166 KB at DS2 sizes) and its partial sums (33 KB): the direction's whole
    hidden state (64 KB) does not fit in the 227 KB, its halves do.
    """
    gemm = sch.get_sblock(kernel.gemm)
    spatial, reduction = _gemm_axes(sch, gemm)
    ncols = len(kernel.columns)
    if len(spatial) == ncols or not reduction:
        raise ValueError(f"{kernel.name}: split-K needs output rows and a reduction")
    if block_slices is None:
        block_slices = default_block_slices(sch, kernel, gemm)
    # even slices (see _split_k_in_blocks)
    block_slices = _divisor(math.prod(_extent(sch, l) for l in reduction), block_slices)
    if block_slices > 1 and not max_blocks:
        gemm, consumer = _split_across_blocks(sch, kernel, gemm, block_slices)
        nb = kernel.batch + 1  # the block slice is one more independent problem
    else:
        consumer = sch.get_consumers(gemm)[0]
        nb = kernel.batch  # leading independent problems (directions): blocks of their own
        block_slices = 1
    stationary = bool(max_blocks and stationary_bytes)
    weight_bytes, partial_bytes, block_outputs, inner_loop, phase = _split_k_in_blocks(
        sch, gemm, consumer, nb, ncols, threads, max_shared_bytes, min_blocks, thread_columns, unroll, accumulators,
        max_blocks, block_slices, vector_k=vector_k if stationary and stage_rows else 1,
        groups_outer=groups_outer and stationary,
        stage_bytes=stationary_bytes if stationary and stage_rows else 0, dynamic_partials=stationary,
        # one-direction steps only where asked until phases are measured on a GPU (their default
        # build at any size stays as it was)
        row_phases=row_phases if row_phases is not None or kernel.batch else 1)
    if not (stationary and weight_bytes + partial_bytes <= stationary_bytes):
        return
    room = stationary_bytes - weight_bytes - partial_bytes
    row_bytes = _stationary_weights(sch, kernel, room if stage_rows else 0, row_vector, phase)
    if row_bytes is None:
        return
    if stage_epilogue:
        _stage_epilogue_inputs(sch, kernel, block_outputs, room - row_bytes)
    if inner_loop is not None and row_bytes:
        _vector_operand_loads(sch, *inner_loop)


# Reduction length a thread block's slice of a per-step GEMM gets by default (see
# default_block_slices).
GPU_BLOCK_SLICE = 200
# Block slices of a per-step GEMM whose units have an odd number of columns (see default_block_slices).
GPU_ODD_GATE_SLICES = 2


def default_block_slices(sch, kernel: Kernel, gemm) -> int:
    """How many blocks share a per-step GEMM's reduction by default: enough that each block
    sums about :data:`GPU_BLOCK_SLICE` of it, counting the problems (directions) as blocks too.

    Each column block reads the whole row operand of its slice, so with the reduction in one
    block it is read once per column block: the backward's gate gradients (N x 4H: 256 KB at
    DS2 sizes) 200 times per step. On the H100 (``scripts/tile_study.py --device cuda
    --block-slices``, notes/performance.md v9) the LSTM's backward step went 21.8 -> 11.3 us
    over 16 slices, the GRU's 17.2 -> 10.6 over 8, the LSTM's forward step 13.2 -> 11.2 over 4;
    two directions at once 23.8 -> 17.4 (LSTM backward, 8), 19.4 -> 14.8 (GRU backward, 4).
    Cells with an odd number of gates per unit (the GRU's 3) split their forward step over 2
    block slices, each with half the column blocks (:func:`_split_k_in_blocks`): on the H100
    the two-direction GRU step went 22.4 -> 18.3 us so, one direction 11.4 -> 11.6; 4 slices
    were slower (``notes/bench/gru_tiles_h100_v11.txt``).
    """
    spatial, reduction = _gemm_axes(sch, gemm)
    n_rows = len(spatial) - len(kernel.columns)
    inner = math.prod(_extent(sch, l) for l in spatial[n_rows + 1:])
    red_total = math.prod(_extent(sch, l) for l in reduction)
    if inner & (inner - 1):
        return _divisor(red_total, GPU_ODD_GATE_SLICES)
    problems = math.prod(_extent(sch, l) for l in spatial[:kernel.batch])
    return _divisor(red_total, max(1, red_total // (GPU_BLOCK_SLICE * problems)))


def _split_across_blocks(sch, kernel: Kernel, gemm, block_slices: int):
    """Split the reduction of the kernel's GEMM over ``block_slices`` thread blocks: each block
    slice sums its part of the reduction into a global buffer of partials, and the epilogue (a
    second kernel, one thread per output element) adds the slices in order before its own math.
    Every block then reads only its slice of the row operand (the hidden state, or the backward's
    gate gradients) instead of all of it. Returns the partial GEMM's block and the block that
    writes its results (a copy from registers), for :func:`_split_k_in_blocks`."""
    spatial, reduction = _gemm_axes(sch, gemm)
    red = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    block_slice, _ = sch.split(red, [block_slices, None])
    partial = sch.rfactor(block_slice, 0)
    p_loops = sch.get_loops(partial)
    sch.reorder(p_loops[len(spatial)], *p_loops[:len(spatial)])  # the slice first: a leading problem axis
    write = sch.cache_write(partial, 0, "local")
    # The epilogue kernel: one thread per output element sums the slices, then runs the gate math.
    outputs = sch.get_consumers(gemm)
    loops = sch.get_loops(outputs[0])
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    block_loop, thread_loop = sch.split(fused, [None, min(GPU_THREADS, _extent(sch, fused))])
    sch.bind(block_loop, "blockIdx.x")
    sch.bind(thread_loop, "threadIdx.x")
    sch.compute_at(gemm, thread_loop, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    for loop in sch.get_loops(gemm)[2:]:
        sch.unroll(loop)
    return partial, write


def _split_k_in_blocks(sch, gemm, consumer, nb: int, ncols: int, threads, max_shared_bytes, min_blocks,
                       thread_columns, unroll, accumulators, max_blocks, block_slices: int = 1,
                       vector_k: int = 1, groups_outer: bool = False, stage_bytes: int = 0,
                       row_phases: int | None = None,
                       dynamic_partials: bool = False) -> tuple[int, int, int, tuple | None, tuple | None]:
    """:func:`gpu_split_k` on the GEMM block ``gemm`` whose results ``consumer`` (its epilogue, or
    a copy) writes out, with ``nb`` leading independent problem axes and ``ncols`` column axes
    (the first of them the ``block_slices`` slices of the reduction, where it is split over blocks).
    Returns the bytes of a block's slice of the weights (its columns, the whole reduction) and of
    its partial sums in shared memory, the output elements of a block (rows x units), and with
    ``vector_k`` > 1 (each thread's slice of the reduction a contiguous run, not every
    ``slices``-th index) the partial GEMM block, its loop over the run in steps of a vector and
    the vector's width, for :func:`_vector_operand_loads` (else None), and where the hidden state
    is staged in phases (``stage_bytes``, the shared memory a block may use, and ``row_phases``:
    see :func:`gpu_split_k`) the partial GEMM block, its phase loop and the phase count (else
    None)."""
    spatial, reduction = _gemm_axes(sch, gemm)
    n_rows = len(spatial) - ncols
    problems = math.prod(_extent(sch, l) for l in spatial[:nb])
    row_total = math.prod(_extent(sch, l) for l in spatial[nb:n_rows])
    lead = _extent(sch, spatial[n_rows])
    inner = math.prod(_extent(sch, l) for l in spatial[n_rows + 1:])
    red = sch.fuse(*reduction) if len(reduction) > 1 else reduction[0]
    red_total = _extent(sch, red)

    per_thread = _divisor(lead, max(1, thread_columns // inner))  # lead columns per thread
    if max_blocks:
        units = per_thread * -(-lead // (max(1, max_blocks // problems) * per_thread))
    else:
        # per problem: the blocks shared between the problems, except with an odd number of
        # columns per unit (the GRU's 3 gates), where each direction keeps its own and only the
        # block slices share them. There 8-unit blocks over the whole reduction ran 3.7x slower
        # than 4-unit ones on the H100 (one direction 43.6 against 11.7 us, two 44.8 against
        # 22.5); a likely cause (not proven): 48 KB of partial sums hold 16 slices of 24 columns,
        # so such a block has 128 threads, and 200 of them give an SM ~6 warps, too few to hide
        # the loads' latency. Over 2 block slices the same blocks are twice as many (two
        # directions 18.3 us, notes/performance.md v11).
        shared = inner & (inner - 1) == 0
        blocks = max(1, min_blocks // problems) if shared else max(1, min_blocks // block_slices)
        units = per_thread * max(1, min(threads // 32, lead // (blocks * per_thread)))  # per block
    column_threads = units // per_thread
    rows_per_thread = _divisor(row_total, max(1, accumulators // (inner * per_thread)))
    row_groups = row_total // rows_per_thread
    most = max(1, threads // (column_threads * row_groups))
    # A divisor of the reduction: rfactor drops an uneven split's predicate (the last slice would
    # read past the end and add it in), so a reduction without one near stays less split.
    slices = _divisor(red_total, most)
    while slices > 1 and slices * row_total * units * inner * 4 > max_shared_bytes:
        slices = _divisor(red_total, slices // 2)

    sizes = (4 * units * inner * red_total, 4 * slices * row_total * units * inner if slices > 1 else 0)
    phases = 1
    if stage_bytes and slices > 1:
        phases = _row_phases(4 * row_total * red_total, stage_bytes - sum(sizes), red_total, row_phases)
        if phases > 1:  # each phase's part of the reduction split evenly over the slices
            slices = _divisor(red_total // phases, slices)
            sizes = (sizes[0], 4 * slices * row_total * units * inner)
    run = red_total // slices // phases
    vector = next((v for v in (4, 2) if v <= vector_k and run % v == 0), 1) if slices > 1 else 1
    if slices > 1:
        if phases > 1 and vector > 1:  # phase p, slice s sums [p * K / phases + s * run, ... + run)
            _, r_slice, _ = sch.split(red, [phases, slices, None])
        elif phases > 1:  # phase p, slice s sums every slices-th index of [p * K / phases, ...) from s
            _, _, r_slice = sch.split(red, [phases, None, slices])
        elif vector > 1:  # slice s sums the contiguous run [s * run, (s + 1) * run)
            r_slice, _ = sch.split(red, [slices, None])
        else:  # slice s sums every slices-th index from s
            _, r_slice = sch.split(red, [None, slices])
        partial = sch.rfactor(r_slice, 0)
        # past the 48 KB a block may declare statically, dynamic shared memory (up to 227 KB); and
        # dynamic beside a block's other dynamic buffers (``dynamic_partials``: a persistent step's
        # staged weights and hidden state): TVM's runtime opts a kernel into more than 48 KB only
        # when its dynamic part alone passes 48 KB, so 40 KB of static partial sums beside 13 KB
        # of dynamic buffers was refused at launch (v22: H = 128 and 256, N = 20)
        dynamic = dynamic_partials or max_shared_bytes > 48 * 1024
        sch.set_scope(partial, 0, "shared.dyn" if dynamic else "shared")
    # The output nest: (rows..., lead column, trailing columns); a block per `units` columns.
    out_loops = sch.get_loops(consumer)
    col_block, col_unit = sch.split(out_loops[n_rows], [None, units])
    sch.reorder(*out_loops[:nb], col_block, *out_loops[nb:n_rows], col_unit)
    element = sch.fuse(*out_loops[nb:n_rows], col_unit)
    total_threads = slices * column_threads * row_groups
    _, thread = sch.split(element, [None, total_threads])
    if nb:  # each block works on one problem (its own weights)
        col_block = sch.fuse(*out_loops[:nb], col_block)
    sch.bind(col_block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.compute_at(gemm, thread, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    if slices == 1:
        return (*sizes, row_total * units, None, None)
    for loop in sch.get_loops(gemm)[3:]:  # the sum of the partials: unrolled into registers
        sch.unroll(loop)
    # The partial sums: one thread per (slice, row group, column group), registers, then shared.
    sch.compute_at(partial, col_block, preserve_unit_loops=True)
    p_loops = sch.get_loops(partial)[1:]  # slice, rows..., lead, trailing..., reductions...
    p_slice, p_rows = p_loops[0], p_loops[1:n_rows + 1]
    p_lead, p_trailing = p_loops[n_rows + 1], p_loops[n_rows + 2:n_rows + 2 + ncols - 1]
    p_red = p_loops[n_rows + 1 + ncols]
    p_phase = None
    if phases > 1:
        p_phase, p_red = p_red, p_loops[n_rows + 2 + ncols]
    p_row = sch.fuse(*p_rows) if len(p_rows) > 1 else p_rows[0]
    p_group, p_row_in = sch.split(p_row, [row_groups, rows_per_thread])
    p_cols, p_col_in = sch.split(p_lead, [column_threads, per_thread])
    # a few reduction steps unrolled: their loads issue together (with vector loads, one vector)
    r_outer, r_unrolled = sch.split(p_red, [None, vector if vector > 1 else _divisor(_extent(sch, p_red), unroll)])
    lead = (p_group, p_slice) if groups_outer else (p_slice, p_group)
    sch.reorder(*lead, p_cols, *([p_phase] if p_phase is not None else []), r_outer, r_unrolled, p_row_in,
                p_col_in, *p_trailing)
    p_thread = sch.fuse(*lead, p_cols)
    sch.bind(p_thread, "threadIdx.x")
    write_back = sch.cache_write(partial, 0, "local")
    sch.reverse_compute_at(write_back, p_thread, preserve_unit_loops=True)
    init = sch.decompose_reduction(partial, p_phase if p_phase is not None else r_outer)
    for loop in [r_unrolled, p_row_in, p_col_in, *p_trailing]:
        sch.unroll(loop)
    for block in (init, write_back):
        for loop in sch.get_loops(block)[2:]:
            sch.unroll(loop)
    return (*sizes, row_total * units, (partial, r_outer, vector) if vector > 1 else None,
            (partial, p_phase, phases) if p_phase is not None else None)


# The most phases a persistent step's staged row operand is split into (see gpu_split_k): the
# backward step's is the gate gradients, 256 KB a direction for the DS2 LSTM (8 phases of 32 KB).
MAX_ROW_PHASES = 8


def _row_phases(row_bytes: int, room: int, reduction: int, asked: int | None) -> int:
    """How many phases of the ``reduction`` stage the hidden state (``row_bytes``, ``room`` bytes
    of shared memory left for it): ``asked`` if given, else 1 where it fits whole, else the fewest
    up to :data:`MAX_ROW_PHASES` whose part fits; phases cut the reduction evenly. 1 where none
    does (then nothing is staged)."""
    if asked is not None:
        return asked if asked >= 1 and reduction % asked == 0 else 1
    if row_bytes <= room:
        return 1
    return next((p for p in range(2, MAX_ROW_PHASES + 1) if reduction % p == 0 and -(-row_bytes // p) <= room), 1)


# Shared memory a block may use (the H100's 227 KB per block, less room for the partial sums).
GPU_MAX_SHARED_BYTES = 227 * 1024


def _stationary_weights(sch, kernel: Kernel, room: int = 0, row_vector: int = 1, phase=None) -> int | None:
    """A persistent kernel's weights stay on its SM: each block's slice of ``w`` (its columns,
    the whole reduction) goes to dynamic shared memory in a copy placed at the block's top. A
    block works on the same columns at every step, so the time loop built around the kernel
    (:meth:`tvmrnn.sequence.Program.loop`) hoists that copy out of the loop
    (:func:`tvmrnn.sequence.hoist_invariant_copies`): the weights are read from global memory
    once per launch instead of once per step (the persistent RNN kernels of Diamos et al., 2016).
    With ``room`` bytes of shared memory left, the GEMM's other operand (the step's hidden state)
    is also staged there at each step if it fits, one cooperative copy instead of every thread
    reading it from L2, ``row_vector`` elements a load. With ``phase`` (the GEMM block, its phase
    loop and the phase count, :func:`_split_k_in_blocks`), the copy goes inside the phase loop: each
    phase stages its part of the reduction's hidden state, overwriting the last. Returns the bytes
    of that per-step copy (0 without one), None where the weights are not staged either."""
    if "w" not in kernel.roles:
        return None
    func = sch.mod["main"]
    wbuf = func.params[kernel.roles.index("w")]
    readers = [b for b in _all_blocks(sch) if sch.get(b).name_hint != "root"
               and any(r.source.same_as(wbuf) for r in sch.get(b).reads)]
    if len(readers) != 1:
        return None
    block = readers[0]
    grid = sch.get_loops(block)[0]  # blockIdx.x
    threads = _thread_extent_of(sch, block)
    reads = sch.get(block).reads
    index = next(i for i, r in enumerate(reads) if r.source.same_as(wbuf))
    rows = [i for i, r in enumerate(reads) if i != index and any(r.source.same_as(p) for p in func.params)]
    staged, row_bytes = [index], 0
    if phase is not None and len(rows) == 1:
        # a direction's share of the hidden state (a two-direction kernel's buffer holds both)
        per_problem = math.prod(int(s) for s in reads[rows[0]].source.shape[kernel.batch:])
        if room and 4 * -(-per_problem // phase[2]) <= room:
            staged.append(rows[0])
            row_bytes = 4 * -(-per_problem // phase[2])
    elif room and len(rows) == 1 and 4 * math.prod(int(s) for s in reads[rows[0]].source.shape) <= room:
        staged.append(rows[0])
        row_bytes = 4 * math.prod(int(s) for s in reads[rows[0]].source.shape)
    for i in sorted(staged, reverse=True):
        if i != index and phase is not None:
            # each phase's part, copied by all the block's threads inside their loop (a
            # cooperative copy; the barriers around it come from TVM's thread sync); for the
            # GEMM only (an epilogue that reads the hidden state, the GRU's, reads it from memory)
            copy = sch.cache_read(block, i, "shared.dyn", consumer_blocks=[block])
            sch.compute_at(copy, phase[1], preserve_unit_loops=True)
            _copy_by_threads(sch, copy, threads, 1, after=phase[1])
            continue
        copy = sch.cache_read(block, i, "shared.dyn")
        sch.compute_at(copy, grid, preserve_unit_loops=True)
        # the hidden state is copied whole (one contiguous buffer): vectors where asked
        _copy_by_threads(sch, copy, threads, row_vector if i != index else 1)
    return row_bytes


def _copy_by_threads(sch, copy, threads: int, vector: int = 1, after=None) -> None:
    """A copy placed under a block's ``blockIdx`` loop, spread over its ``threads`` threads, each
    thread's share unrolled: every thread's loads in flight at once (a loop waits for each).
    ``vector``: each thread moves ``vector`` consecutive elements at a time, where the copy's size
    is a multiple of it (only for a copy of a whole contiguous buffer: its vectors are aligned).
    ``after``: the copy sits under this loop (inside the threads' own loop), not the block's."""
    loops = sch.get_loops(copy)
    if after is None:
        loops = loops[1:]
    else:
        loops = loops[next(i for i, l in enumerate(loops) if sch.get(l).same_as(sch.get(after))) + 1:]
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    total = _extent(sch, fused)
    if vector > 1 and total % vector == 0 and total >= vector * threads:
        outer, thread, lanes = sch.split(fused, [None, threads, vector])
        sch.vectorize(lanes)
    else:
        outer, thread = sch.split(fused, [None, threads])
    sch.bind(thread, "threadIdx.x")
    sch.unroll(outer)


def _vector_operand_loads(sch, partial, loop, vector: int) -> None:
    """Each thread of a persistent step's partial GEMM loads its operands for ``vector``
    consecutive reduction indices from shared memory at once, into registers (``loop`` steps
    through the thread's contiguous run of the reduction a vector at a time): the staged hidden
    state's rows (``rows`` x ``vector``, contiguous along the reduction) as ``vector``-wide loads,
    the weights' columns (``vector`` x the thread's columns, contiguous along the columns) as
    vectors of up to 4 where the columns allow, else unrolled scalars. Fewer, wider shared-memory
    loads per multiply-add: before, each thread issued one scalar load per row and per column at
    every reduction index."""
    reads = sch.get(partial).reads
    for index in reversed(range(len(reads))):
        if reads[index].source.scope() != "shared.dyn":
            continue
        load = sch.cache_read(partial, index, "local", consumer_blocks=[partial])  # not the epilogue's
        sch.compute_at(load, loop, preserve_unit_loops=True)
        own = sch.get_loops(load)[-len(sch.get(load).iter_vars):]
        last = own[-1]
        extent = _extent(sch, last)
        lanes = next((v for v in (4, 2) if extent % v == 0), 1)
        for l in own[:-1]:
            sch.unroll(l)
        if lanes > 1:
            _vectorize(sch, last, lanes)
        else:
            sch.unroll(last)


def _stage_epilogue_inputs(sch, kernel: Kernel, per_block: int, room: int) -> None:
    """Stage the epilogue's global inputs in a persistent step (every parameter its output blocks
    read: the step's slice of the input projection, the bias, the carried cell state) in shared
    memory, copied at the top of the block's step where ``room`` bytes allow, before the hidden
    state's copy: their loads are then in flight during the GEMM instead of waiting after it (the
    bias's copy, which does not move with the step, goes before the time loop with the weights').
    ``per_block``: the output elements of a block."""
    func = sch.mod["main"]
    params = func.params
    outputs = [b for b in _all_blocks(sch) if sch.get(b).name_hint != "root" and _writes_param(sch, b, params)]
    if not outputs:
        return
    grid = sch.get_loops(outputs[0])[0]  # blockIdx.x
    threads = _thread_extent_of(sch, outputs[0])
    out_size = math.prod(int(x) for x in sch.get(outputs[0]).writes[0].source.shape)
    inputs = [p for p in params if any(r.source.same_as(p) for o in outputs for r in sch.get(o).reads)
              and not any(w.source.same_as(p) for o in outputs for w in sch.get(o).writes)]
    # each input's elements per output element, times a block's output elements; a block's single
    # element is left in global memory (TVM 0.27's merge of dynamic shared memory fails on a
    # one-element buffer copied before the time loop: an RNN's bias at one unit a block)
    sizes = {p: per_block * math.prod(int(x) for x in p.shape) // out_size for p in inputs}
    inputs = [p for p in inputs if sizes[p] > 1]
    if sum(4 * sizes[p] for p in inputs) > room:
        return
    for param in inputs:
        reader = next(o for o in outputs if any(r.source.same_as(param) for r in sch.get(o).reads))
        index = next(i for i, r in enumerate(sch.get(reader).reads) if r.source.same_as(param))
        copy = sch.cache_read(reader, index, "shared.dyn", consumer_blocks=outputs)
        sch.compute_at(copy, grid, preserve_unit_loops=True, index=0)  # the step's first statement
        _copy_by_threads(sch, copy, threads)


def keeps_weights_on_chip(func: tvm.tirx.PrimFunc, kernel: Kernel) -> bool:
    """Whether a scheduled kernel copies its weights (role ``w``) into shared memory, as
    :func:`_stationary_weights` does for a persistent kernel whose block slices fit there (whether
    the default schedule or a tuned one did it)."""
    if "w" not in kernel.roles:
        return False
    wbuf = func.params[kernel.roles.index("w")]
    found = []

    def visit(realize, mutator):
        b = realize.block
        if any(r.source.same_as(wbuf) for r in b.reads) and any(w.source.scope() == "shared.dyn" for w in b.writes):
            found.append(b)
        return mutator.default_mutate(realize)  # and the blocks inside it

    tvm_ffi.structural_mutate(func.body, [(s_tir.SBlockRealize, visit)])
    return bool(found)


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


def persistent_blocks(func) -> int | None:
    """The block limit of a persistent kernel's function (:func:`tvmrnn.kernels.persistent`), else None."""
    value = func.attrs.get("tvmrnn.persistent_blocks") if func.attrs is not None else None
    return int(value) if value is not None else None


def _vectorize(sch, loop, lanes):
    """Vectorise in whole registers: a loop of several vectors becomes an unrolled loop of
    ``lanes``-wide ones. LLVM turns one wide odd vector (a 48-float tile: 3 gates x 16 units)
    into code 15x slower than three 16-float ones (measured on the dev machine's Zen 5)."""
    extent = _extent(sch, loop)
    if extent > lanes and extent % lanes == 0:
        outer, loop = sch.split(loop, [None, lanes])
        sch.unroll(outer)
    sch.vectorize(loop)


def _vectorize_trailing(sch, loops, width, lanes):
    trailing, product = [], 1
    for loop in reversed(loops):
        if product * _extent(sch, loop) > width:
            break
        product *= _extent(sch, loop)
        trailing.insert(0, loop)
    if product > 1:
        _vectorize(sch, sch.fuse(*trailing) if len(trailing) > 1 else trailing[0], lanes)


def _tile_from_outputs(sch, gemm, output, unit_tile, rows, lanes):
    """A fused epilogue: the outputs are ``(n, j)``, several sibling blocks in one nest (the gate
    math and its backward), and the forward step's read all gates of a unit (``gemm[n, j, 0:G]``),
    which ``reverse_compute_at`` cannot place; so the tile is made on the output nest and the GEMM
    computed under it (``compute_at``) instead, the siblings staying in one loop body."""
    *lead, n, j = sch.get_loops(output)  # lead: a direction axis (kernels.recurrent_step), if any
    j_outer, j_inner = sch.split(j, [None, unit_tile])
    n_outer, n_inner = sch.split(n, [None, rows])
    sch.reorder(j_outer, *lead, n_outer, n_inner, j_inner)
    tile = sch.fuse(j_outer, *lead, n_outer)
    sch.parallel(tile)
    sch.compute_at(gemm, tile, preserve_unit_loops=True)
    spatial, reduction = _gemm_axes(sch, gemm)
    gn, gj, *trailing = spatial[len(lead):]
    sch.reorder(*reduction, gn, gj, *trailing)
    sch.unroll(gn)
    _vectorize(sch, sch.fuse(gj, *trailing) if trailing else gj, lanes)
    sch.decompose_reduction(gemm, reduction[0])
    _vectorize(sch, j_inner, lanes)


# Other shapes of the GPU split-K (``gpu_split_k`` arguments) that tuning measures beside the
# default: on the H100 the best shape differed by cell (``scripts/tile_study.py --device cuda``).
# Half the blocks, each with twice the columns (8 units of the backward's dh, or 2 LSTM units),
# was 5-10% faster for the fused backward steps in one tile study (notes/bench/gpu_tiles_h100_v6.txt).
# Twice the blocks: the two-direction GRU step's best (22.5 us, against 44.8 with 200 blocks in
# all; notes/bench/gpu_tiles_h100_v7.txt).
# The reduction over more or fewer blocks (block_slices): LSTM backward step 11.3 us over 16
# slices, 15.0 over 8 (notes/bench/gpu_tiles_h100_v9a.txt).
GPU_SPLIT_K_VARIANTS = ({}, dict(threads=128), dict(threads=64), dict(threads=128, min_blocks=400),
                        dict(thread_columns=8), dict(min_blocks=100), dict(min_blocks=400),
                        dict(block_slices=1), dict(block_slices=4), dict(block_slices=8), dict(block_slices=16))


# gpu_matmul's variants that tuning measures beside the default: every block shape, the
# shorter and the double-buffered reduction tiles.
GPU_MATMUL_VARIANTS = tuple(dict(rows=r, cols=c) for r, c in GPU_MATMUL_SHAPES) + (dict(k_tile=8), dict(pipeline=True))


# A persistent step's shapes that tuning measures (``tiles`` over :data:`PERSISTENT_TILES`): its
# whole design space (:func:`tvmrnn.tuning.is_persistent`). At DS2 sizes the default LSTM step
# is 115 blocks of 224 threads (7 warps an SM: latency-bound, v16's Nsight Compute); fewer
# registers of partial sums a thread (``accumulators``) or more room for them
# (``max_shared_bytes``) give 448; ``row_vector`` and ``vector_k`` were 3-4% by median in v16's
# studies, within the rounds' ranges.
PERSISTENT_VARIANTS = ({}, dict(row_vector=4), dict(vector_k=4), dict(stage_epilogue=False),
                       dict(accumulators=24), dict(accumulators=24, row_vector=4), dict(accumulators=32),
                       dict(max_shared_bytes=96 * 1024), dict(max_shared_bytes=96 * 1024, row_vector=4),
                       dict(accumulators=96), dict(thread_columns=8), dict(unroll=4), dict(unroll=16),
                       # one output column a thread: a two-direction backward step's 13 columns of
                       # weights a block (166 KB) fit on chip, 16 (thread_columns=4) do not
                       dict(thread_columns=1))


def variants(kernel: Kernel, target: tvm.target.Target) -> list[dict]:
    """The default's own shapes worth measuring for ``kernel`` (``tiles`` for :func:`apply`),
    the default first: tuning seeds each new task with all of them."""
    if is_gpu(target) and kernel.gemm is not None and persistent_blocks(kernel.func):
        return [dict(v) for v in PERSISTENT_VARIANTS]
    if is_gpu(target) and kernel.gemm is not None:
        kind = _gpu_kind(s_tir.Schedule(s_tir.renew_defs(kernel.func)), kernel)
        if kind == "split-K":
            return [dict(v) for v in GPU_SPLIT_K_VARIANTS]
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


# The split-K shape of persistent kernels (``gpu_split_k`` arguments; ``scripts/persistent_study.py``
# compares others on a GPU).
# v15 (H100, 1-layer LSTM inference, ``notes/bench/persistent_study_h100_v15_lstm*.txt``,
# ``bench_h100_v15b_lstm_infer.txt``): staging the epilogue's inputs measured 4.37 -> 3.72 ms in one
# run and 3.88 -> 4.24 ms in another (the same builds differ by ~10% from run to run); vector operand
# loads 4.33 alone, 3.95 with the staging. Neither is a measured gain, so both stay off.
# v16 (``notes/bench/persistent_study_h100_v16*.txt``, 5 interleaved rounds each, ms): LSTM 3.81 (rounds
# 3.80-3.83) -> row groups outermost 3.65 (3.64-3.65) -> with the epilogue's inputs staged 3.41 (3.39-3.43),
# again 3.44; GRU 3.64 -> 3.69 -> 3.21; RNN-tanh 1.99 / 1.99 / 2.01 (rounds 1.8-2.3). Both on; vector loads
# stay off (3.51 with both).
PERSISTENT_TILES = dict(threads=512, accumulators=48, stationary_bytes=GPU_MAX_SHARED_BYTES, stage_rows=True,
                        vector_k=1, stage_epilogue=True, groups_outer=True)


def default_schedule(kernel: Kernel, target: tvm.target.Target, **tiles) -> tvm.tirx.PrimFunc:
    """The default schedule; ``tiles`` (``accumulators``, ``column_vectors``) override the CPU
    GEMM's register tile (``scripts/tile_study.py`` compares them)."""
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))  # a copy: Schedule edits its input in place
    apply(sch, kernel, target, **tiles)
    return sch.mod["main"]


def apply(sch, kernel: Kernel, target: tvm.target.Target, **tiles) -> None:
    """Schedule the kernel held by ``sch`` (its ``main``) the default way. Everything goes through
    ``sch``'s primitives, so its trace replays the default schedule: tuning measures it as a
    candidate like any other (:func:`tvmrnn.tuning.tune`)."""
    if kernel.gemm is not None and not is_gpu(target):
        cpu_gemm(sch, kernel, target, **tiles)
        return
    blocks = persistent_blocks(sch.mod["main"])
    if blocks:
        tiles = {**PERSISTENT_TILES, "max_blocks": blocks, **tiles}
    if kernel.gemm is not None and gpu_gemm(sch, kernel, target, **tiles):
        return
    params = sch.mod["main"].params
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
