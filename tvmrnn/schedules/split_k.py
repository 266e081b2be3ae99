"""The per-step GEMM with its fused gate math on GPUs: split-K inside a thread block
(:func:`gpu_split_k`), and its persistent form, where each block keeps its slice of the
recurrent weights in shared memory for every step (:func:`keeps_weights_on_chip`,
:func:`persistent_blocks`).
"""
from __future__ import annotations

import math
import tvm
import tvm_ffi
from tvm import s_tir
from ..kernels import Kernel

from .common import (_all_blocks, _divisor, _extent, _gemm_axes, _loops_after, _thread_extent_of, _vectorize, _writes_param, persistent_blocks,
                     sum_slices_per_output)


def gpu_split_k(sch, kernel: Kernel, threads: int = 256, max_shared_bytes: int = 48 * 1024,
                min_blocks: int = 200, thread_columns: int | None = None, unroll: int = 8, accumulators: int = 96,
                max_blocks: int | None = None, block_slices: int | None = None,
                stationary_bytes: int = 0, stage_rows: bool = False, vector_k: int | None = 1,
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
    tile of rows x ``thread_columns`` in registers (None: :func:`default_thread_columns`; the G
    gates of one unit, or 4 units of a one-gate cell, or 4 columns of the backward's ``dh``: each
    loaded input row value feeds 4 multiply-adds) and accumulates it over every ``slices``-th
    reduction index; consecutive threads take consecutive columns (a warp reads the weights in contiguous runs). The partial
    sums meet in shared memory, where one thread per output element adds them up and runs the
    epilogue. At DS2 sizes (N = 20, H = 800) an LSTM step is 200 blocks of 100 threads (4 units
    x 25 slices, as many as 48 KB of shared memory holds), 80 accumulators per thread; a GRU step
    200 blocks of 200 threads (4 units x 50 slices). the ``tile_study`` (a study script, at 34424c0)
    times other shapes; on the H100, 256 threads was best or within noise for every per-step
    kernel (GRU step 11.5 us against 24.3 us with 128 threads, ``notes/performance.md``).

    ``max_blocks`` (a persistent kernel's, :func:`tvmrnn.kernels.persistent`; :func:`apply` passes
    it): at most this many blocks, each owning as many columns as that takes (fewer
    ``accumulators`` per thread, set in :data:`PERSISTENT_TILES`, give a block more threads for
    its larger share). With ``stationary_bytes``, a persistent block's slice of the weights, if at
    most that large, is copied into shared memory once (:func:`_stationary_weights`).
    ``vector_k`` (where both GEMM operands are staged in shared memory): each thread sums a
    contiguous run of the reduction, read ``vector_k`` values at a time (:func:`_vector_operand_loads`);
    None (:data:`PERSISTENT_TILES`' default): 4 where a unit has 4 gate columns (an LSTM's: one
    16-byte vector of weights a reduction index) and a problem :data:`GPU_VECTOR_K_ROWS` rows or
    more, else 1.
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
    take one phase unless asked); 0 (:data:`PERSISTENT_TILES`' default): that rule for either
    (at N = 64, H = 1024 a one-direction step's hidden state, 256 KB, fits whole in no block, so
    one phase left it in L2, read there by every thread). A block of a two-direction step holds 13
    LSTM units' weights (166 KB at DS2 sizes) and its partial sums (33 KB): the direction's whole
    hidden state (64 KB) does not fit in the 227 KB, its halves do.
    """
    gemm = sch.get_sblock(kernel.gemm)
    spatial, reduction = _gemm_axes(sch, gemm)
    ncols = len(kernel.columns)
    if thread_columns is None:
        thread_columns = default_thread_columns(sch, kernel, gemm)
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


# A launched (not persistent) split-K step kernel (one row axis a problem: a step's batch rows)
# whose GEMM has this many output units (the leading output column) or more keeps 8 output columns
# a thread in registers by default, others 4 (``thread_columns``; a persistent step's is in
# PERSISTENT_TILES). v63, H200, T = 50, whole passes (notes/bench/v63/h200/columns_ab*.txt), with
# 8 for every launched split-K kernel (the one-step GEMMs of a sequence's last steps too, which
# the rule leaves at 4: a few calls a pass against a step's): 8 columns took the LSTM at N = 32,
# H = 2048 from 5.60 / 14.69 ms (inference / training) to 5.26 / 13.75, the GRU at N = 64, H = 2048 from 10.36 / 24.62 to 9.26 / 23.27 (their forward and
# backward steps launched: the weights do not fit on chip); for the backward steps alone, the
# LSTM's at N = 64, H = 1024 trained 6.62 -> 6.43 ms, the GRU's at N = 20, H = 800 2.98 -> 3.09;
# N = 128, H = 128 and N = 64, H = 256 were the same. The GEMMs over chunks of steps (rows of
# steps x batch) keep 4: with 8, 4 steps x 16 rows of the LSTM's input gradient at H = 1536 left
# a loop of a thread-dependent extent that TVM refused to unroll.
GPU_SPLIT_K_WIDE_UNITS = 2048


def default_thread_columns(sch, kernel: Kernel, gemm) -> int:
    """:func:`gpu_split_k`'s ``thread_columns`` by default: 8 for a launched step's GEMM (one row
    axis a problem, not persistent) of :data:`GPU_SPLIT_K_WIDE_UNITS` output units or more, else 4."""
    if persistent_blocks(sch.mod["main"]) is not None:
        return 4
    spatial, _ = _gemm_axes(sch, gemm)
    n_rows = len(spatial) - len(kernel.columns)
    step = n_rows - kernel.batch == 1
    return 8 if step and _extent(sch, spatial[n_rows]) >= GPU_SPLIT_K_WIDE_UNITS else 4


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
    DS2 sizes) 200 times per step. On the H100 (``the tile_study script (at 34424c0) --device cuda
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
    sum_slices_per_output(sch, gemm, outputs[0])
    return partial, write


def _split_k_in_blocks(sch, gemm, consumer, nb: int, ncols: int, threads, max_shared_bytes, min_blocks,
                       thread_columns, unroll, accumulators, max_blocks, block_slices: int = 1,
                       vector_k: int | None = 1, groups_outer: bool = False, stage_bytes: int = 0,
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
    if vector_k is None:
        vector_k = 4 if inner == 4 and row_total >= GPU_VECTOR_K_ROWS else 1
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
    # (a prime row count leaves one row a thread: 257 rows x 8 column threads would be 2,056
    # threads, past a block's 1,024, refused at launch; the threads then take several elements)
    total_threads = min(slices * column_threads * row_groups, 1024)
    if nb:  # each block works on one problem (its own weights)
        col_block = sch.fuse(*out_loops[:nb], col_block)
    sch.bind(col_block, "blockIdx.x")
    if row_total > 1 or units >= total_threads:
        _, thread = sch.split(element, [None, total_threads])
        sch.bind(thread, "threadIdx.x")
        sch.compute_at(gemm, thread, preserve_unit_loops=True)
        sch.set_scope(gemm, 0, "local")
        if slices > 1:
            sch.compute_at(partial, col_block, preserve_unit_loops=True)
        gemm_unrolled = sch.get_loops(gemm)[3:]
    else:
        # One row (batch 1) and fewer columns in a block than threads in its partial sums. A
        # loop bound to threadIdx.x with fewer iterations than the block's threads gets no guard
        # in TVM's CUDA code (every thread would run it), and computing the sum under a padded
        # thread loop makes compute_at widen the partial sums' region to every thread's columns
        # (with more rows than one, the padding falls on the rows, which a predicate clips: that
        # form stays as measured). So the sum and the partials are placed in the block first,
        # over the block's elements exactly, and the sum's and the epilogue's element loops are
        # then each padded to the block's threads (their predicates guard the padding).
        sch.compute_at(gemm, col_block, preserve_unit_loops=True)
        if slices > 1:
            sch.compute_at(partial, col_block, preserve_unit_loops=True)
        sch.set_scope(gemm, 0, "local")
        _, thread = sch.split(element, [None, total_threads])
        sch.bind(thread, "threadIdx.x")
        g_spatial, g_reduction = _gemm_axes(sch, gemm)  # (problems, rows..., lead, trailing...), (the slices)
        sch.reorder(*g_spatial, *g_reduction)
        g_element = sch.fuse(*g_spatial[:n_rows + 1])
        _, g_thread = sch.split(g_element, [None, total_threads])
        sch.bind(g_thread, "threadIdx.x")
        gemm_unrolled = sch.get_loops(gemm)[3:]
    if slices == 1:
        return (*sizes, row_total * units, None, None)
    for loop in gemm_unrolled:  # the sum of the partials: unrolled into registers
        sch.unroll(loop)
    # The partial sums: one thread per (slice, row group, column group), registers, then shared.
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


# The most phases a persistent step's staged row operand is split into by default (see
# gpu_split_k): the backward step's is the gate gradients, 256 KB a direction for the DS2 LSTM (8
# phases of 32 KB). More phases (a knob value) mean more barriers a step for smaller parts: where
# a block has room for only a sliver (an LSTM at N = 8, H = 1280: 2 KB of its 40 KB state, 20
# phases), the rule leaves the state in L2, unmeasured either way.
MAX_ROW_PHASES = 8


def _row_phases(row_bytes: int, room: int, reduction: int, asked: int | None) -> int:
    """How many phases of the ``reduction`` stage the hidden state (``row_bytes``, ``room`` bytes
    of shared memory left for it): ``asked`` if given (0: the rule), else 1 where it fits whole,
    else the fewest up to :data:`MAX_ROW_PHASES` whose part fits; phases cut the reduction evenly.
    1 where none does (then nothing is staged)."""
    if asked == 0:
        asked = None
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
    (:meth:`tvmrnn.program.sequence.Program.loop`) hoists that copy out of the loop
    (:func:`tvmrnn.program.sequence.hoist_invariant_copies`): the weights are read from global memory
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
    loops = sch.get_loops(copy)[1:] if after is None else _loops_after(sch, copy, after)
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


# The annotation of a copy (into a thread's registers) that a persistent time loop runs at its first
# step only: what it copies stays in the registers for every step
# (``row_tiles.gpu_row_tiles(register_weights=True)``; ``sequence.Program._persistent_loop``)
FIRST_STEP_ONLY = "tvmrnn.first_step_only"


def keeps_weights_on_chip(func: tvm.tirx.PrimFunc, kernel: Kernel) -> bool:
    """Whether a scheduled kernel copies its weights (role ``w``) into shared memory (or into its
    threads' registers at a persistent loop's first step: a copy annotated :data:`FIRST_STEP_ONLY`), as
    :func:`_stationary_weights` does for a persistent kernel whose block slices fit there (or the
    row tiles' :func:`tvmrnn.schedules.row_tiles._stage_for_the_time_loop`; whether the default
    schedule or a tuned one did it)."""
    if "w" not in kernel.roles:
        return False
    wbuf = func.params[kernel.roles.index("w")]
    found = []

    def visit(realize, mutator):
        b = realize.block
        if any(r.source.same_as(wbuf) for r in b.reads) and any(
                w.source.scope() == "shared.dyn" or (w.source.scope() == "local" and FIRST_STEP_ONLY in b.annotations)
                for w in b.writes):
            found.append(b)
        return mutator.default_mutate(realize)  # and the blocks inside it

    tvm_ffi.structural_mutate(func.body, [(s_tir.SBlockRealize, visit)])
    return bool(found)


# The split-K shape of persistent kernels (``gpu_split_k`` arguments; the ``persistent_study`` (a study script, at 34424c0)
# compares others on a GPU).
# v15 (H100, 1-layer LSTM inference, ``notes/bench/persistent_study_h100_v15_lstm*.txt``,
# ``bench_h100_v15b_lstm_infer.txt``): staging the epilogue's inputs measured 4.37 -> 3.72 ms in one
# run and 3.88 -> 4.24 ms in another (the same builds differ by ~10% from run to run); vector operand
# loads 4.33 alone, 3.95 with the staging. Neither is a measured gain, so both stay off.
# v16 (``notes/bench/persistent_study_h100_v16*.txt``, 5 interleaved rounds each, ms): LSTM 3.81 (rounds
# 3.80-3.83) -> row groups outermost 3.65 (3.64-3.65) -> with the epilogue's inputs staged 3.41 (3.39-3.43),
# again 3.44; GRU 3.64 -> 3.69 -> 3.21; RNN-tanh 1.99 / 1.99 / 2.01 (rounds 1.8-2.3). Both on; vector loads
# stay off (3.51 with both).
# v35 (H100, the step in its 64-step loop, the default against listed variants,
# notes/bench/v35/tune_*): the hidden state staged in phases wherever it does not fit whole
# (``row_phases=0``; a one-direction step took one phase, so one too large to stage whole was read
# from L2 by every thread): LSTM N = 64, H = 1024 30.2 -> 23.6 us; GRU there 85.3 -> 24.3; GRU
# N = 24, H = 1280 168.6 -> 15.7. Where it fits whole (DS2 sizes) nothing changes. 24 accumulators
# with it were a little faster still at two of those (23.0, 19.9; 16.4 at the third) and were the
# LSTM's best DS2 record in v18, but the GRU's DS2 training step spilled registers with them in
# its persistent loop: a listed variant, not the default.
# v62 (H200, ``notes/bench/v62/h200/seeds.txt``, ``tune.txt``): the persistent step's shared-memory
# loads were its limit at N = 128, H = 1024 (Nsight Compute: the shared pipe 72% busy, the FMA pipe
# 28%), and reading the staged hidden state 4 reduction indices a load (``vector_k=4``) took the
# LSTM's inference step alone 56.6 -> 43.7 us, the pass 4.43 -> 3.75 ms; at N = 128, H = 768 32.6 ->
# 29.4 us, N = 64, H = 1024 23.6 -> 22.7, DS2's N = 20 5.8 -> 5.6. Not so elsewhere: the GRU's step
# went 35.9 -> 50.0 us at N = 128, H = 1024, and in whole passes (``vector_k_ab.txt``) the tanh RNN
# at N = 128, H = 1024 took 2.03 -> 2.47 ms inference, the ReLU RNN at DS2 sizes 1.64 -> 1.88 (the
# LSTM there 4.39 -> 3.72, and the same at N = 64, H = 1024): ``None`` takes 4 only where a unit
# has 4 gate columns, and from GPU_VECTOR_K_ROWS rows, where the hidden state's loads weigh most
# (at N = 64 the pass was the same; smaller steps were not measured in whole passes, and v16 had
# the DS2 LSTM's pass 3% slower with it on the H100).
GPU_VECTOR_K_ROWS = 128
PERSISTENT_TILES = dict(threads=512, accumulators=48, thread_columns=4, stationary_bytes=GPU_MAX_SHARED_BYTES,
                        stage_rows=True, vector_k=None, stage_epilogue=True, groups_outer=True, row_phases=0)
