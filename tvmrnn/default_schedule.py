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

Everything else, and every kernel on GPUs, gets one rule: the output nest fused and spread
over threads (GPU: one thread per output element; CPU: a parallel loop), the reduction per
output element. Tuning (MetaSchedule) replaces these with better schedules.
"""
from __future__ import annotations

import math

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


def vector_lanes(target: tvm.target.Target) -> int:
    """float32 lanes of the target's widest vectors."""
    return 16 if tvm.target.codegen.llvm_cpu_has_features("avx512f", target) else 8


def _divisor(n: int, at_most: int, multiple_of: int = 1) -> int:
    """The largest divisor of ``n`` that is <= ``at_most`` and a multiple of ``multiple_of`` (else 1)."""
    for d in range(min(n, at_most), 0, -1):
        if n % d == 0 and d % multiple_of == 0:
            return d
    return 1


def cpu_gemm(sch, kernel: Kernel, target, accumulators: int = 24, column_vectors: int = 4) -> None:
    """Register-blocked GEMM (see the module docstring) on the kernel's reduction block.

    ``accumulators``: vector registers the output tile may use (of AVX-512's 32 or AVX2's 16,
    the rest hold the broadcast inputs and streamed operand); ``column_vectors``: widest tile
    along the columns, in vectors.
    """
    lanes = vector_lanes(target)
    if lanes == 8:
        accumulators = min(accumulators, 12)
    gemm = sch.get_sblock(kernel.gemm)
    epilogues = sch.get_consumers(gemm)
    loops = sch.get_loops(gemm)
    iter_types = [iv.iter_type for iv in sch.get(gemm).iter_vars]
    spatial = [l for l, it in zip(loops, iter_types) if it == 0]
    reduction = [l for l, it in zip(loops, iter_types) if it != 0]
    names = [sch.get(l).loop_var.name for l in spatial]
    ncols = len(kernel.columns)
    if tuple(names[len(names) - ncols:]) != kernel.columns:
        raise AssertionError(f"{kernel.name}: columns {kernel.columns} are not the trailing axes of {names}")
    extents = [_extent(sch, l) for l in spatial]
    row_loops, col_loops = spatial[:-ncols], spatial[-ncols:]
    row_extents, col_extents = extents[:-ncols], extents[-ncols:]

    # Column tile: whole trailing column axes (e.g. all G gates of a unit), the leading one tiled
    # so that the tile is at most `column_vectors` vectors, a whole number of them where possible.
    inner = 1
    for e in col_extents[1:]:
        inner *= e
    lead = col_extents[0]
    cap = max(1, column_vectors * lanes // inner)
    # Whole vectors, so that `_vectorize` can run the tile as lane-wide pieces: with 3 gates,
    # 16 units make 48 floats (3 vectors); 20 units (60 floats) could not be split so.
    lead_tile = _divisor(lead, cap, multiple_of=lanes // math.gcd(lanes, inner))
    if lead_tile == 1:
        lead_tile = _divisor(lead, cap)
    width = lead_tile * inner
    # Row tile: the last row axis tiled so that rows x column vectors fit the accumulators.
    rows = _divisor(row_extents[-1], max(1, accumulators // max(1, -(-width // lanes)))) if row_extents else 1

    if len(sch.get_loops(epilogues[0])) < len(spatial):
        _tile_from_outputs(sch, gemm, epilogues[0], lead_tile, rows, lanes)
        return
    col_outer, col_inner = sch.split(col_loops[0], [None, lead_tile])
    if row_loops:
        row_outer, row_inner = sch.split(row_loops[-1], [None, rows])
    else:  # a reduction to a row (the bias gradient)
        row_outer, row_inner = sch.split(sch.add_unit_loop(col_outer), [None, 1])
    outer = [*row_loops[:-1], row_outer]
    # columns outermost: a core keeps its columns (its slice of the weights) from call to call
    sch.reorder(col_outer, *outer, *reduction, row_inner, col_inner, *col_loops[1:])
    tile = sch.fuse(col_outer, *outer)
    sch.parallel(tile)
    sch.unroll(row_inner)
    _vectorize(sch, sch.fuse(col_inner, *col_loops[1:]), lanes)
    sch.decompose_reduction(gemm, reduction[0])
    for consumer in epilogues:  # the epilogue on the tile, vectorised along its columns
        sch.reverse_compute_at(consumer, tile, preserve_unit_loops=True)
        _vectorize_trailing(sch, sch.get_loops(consumer)[1:], width, lanes)


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
    """The fused step: its outputs are ``(n, j)`` and read all gates of a unit (``gemm[n, j, 0:G]``),
    which ``reverse_compute_at`` cannot place, so the tile is made on the output nest and the
    GEMM computed under it (``compute_at``) instead."""
    n, j = sch.get_loops(output)
    j_outer, j_inner = sch.split(j, [None, unit_tile])
    n_outer, n_inner = sch.split(n, [None, rows])
    sch.reorder(j_outer, n_outer, n_inner, j_inner)
    tile = sch.fuse(j_outer, n_outer)
    sch.parallel(tile)
    sch.compute_at(gemm, tile, preserve_unit_loops=True)
    *_, gn, gj, gg, k = sch.get_loops(gemm)
    sch.reorder(k, gn, gj, gg)
    sch.unroll(gn)
    _vectorize(sch, sch.fuse(gj, gg), lanes)
    sch.decompose_reduction(gemm, k)
    _vectorize(sch, j_inner, lanes)


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
