"""The per-step GEMM with its fused gate math on GPUs, for many rows: a tiled GEMM whose blocks own
a tile of rows x units, with the epilogue on each thread's register tile (:func:`gpu_row_tiles`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

from tvm import s_tir

from ..kernels import Kernel

from .common import GPU_ROW_TILE_ROWS, _divisor, _extent, _gemm_axes, _loops_after, _vectorize
from .split_k import FIRST_STEP_ONLY, _copy_by_threads


# The annotation of a persistent step's block loop whose blocks each own all of a problem's units
# for their rows: no block reads what another wrote, so its time loop needs no grid barrier.
INDEPENDENT_BLOCKS = "tvmrnn.independent_blocks"


# Registers a thread of gpu_row_tiles(register_weights=True) needs beside its column of the weights
# (ptxas on sm_90: the LSTM's step at H = 96 used 123 registers, the GRU's at H = 128 158)
REGISTERS_BESIDE_WEIGHTS = 32


# The GEMM block of a forward step (tvmrnn.kernels.recurrent_step): gpu_row_tiles' default gate
# threads differ between forward and backward steps (what the H200 measured, v58, v59)
FORWARD_STEP_GEMM = "recurrent_projection"


# A persistent row tile whose block's rows of the step's input (``4 * reduction`` bytes a row) do
# not fit beside its weights stages them this many columns of the reduction at a time (the row
# tiles' ``k_tile``): an LSTM's backward step at H = 384 (a 1,536-long reduction) keeps its
# weights on chip so (:func:`persistent_row_tiles`).
ROW_CHUNK = 16
# ... and as many more (doubling) as fit, up to this many bytes
MAX_ROW_CHUNK_BYTES = 32 * 1024
# Hidden sizes whose backward persistent step takes gate threads by default (gpu_row_tiles): on the
# H200 (notes/performance.md v58, v59, N = 128) training 10-12% faster for the LSTM at H = 96 and 112
# and the GRU at H = 96, 3% slower for the LSTM at H = 64 and the GRU at H = 128
BACKWARD_GATE_UNITS = (96, 128)
# The most rows a block of a unit-splitting persistent tile whose forward step takes gate threads
# over its rows by default (gpu_row_tiles): on the H200 (notes/performance.md v59, 4 rows a block)
# inference 8-30% faster for the LSTM at N = 128, H = 128 and 200 and the GRU at H = 160 and 200;
# at 8 rows (the LSTM at N = 256, H = 128) 19% slower
UNIT_GATE_ROWS = 4
# A persistent backward step's tile whose blocks split the units (its dh: ``inner`` 1) prefers,
# after 128 threads a block, up to this many threads before more rows a thread (_persistent_tile):
# its block's weights fill the SM's shared memory, so its threads are the SM's only warps, and at 128
# (4 warps, 8 rows a thread) their loads' latency went unhidden. H100 (notes/performance.md v83,
# 128 -> 256, training, the same bits): LSTM N = 256, H = 510 25.60 -> 23.60 ms, GRU 22.64 ->
# 20.37; LSTM N = 128, H = 256 5.68 -> 4.42; GRU N = 200, H = 300 6.61 -> 5.86; LSTM N = 160,
# H = 384 the same. From GPU_ROW_TILE_ROWS rows (fewer, the LSTM's few-row tiles, were measured
# with 128).
BACKWARD_PERSISTENT_THREADS = 256


def independent_blocks(loop) -> bool:
    """Whether a scheduled kernel's ``blockIdx`` loop carries :data:`INDEPENDENT_BLOCKS`."""
    return bool(int(loop.annotations.get(INDEPENDENT_BLOCKS, 0)))


def default_row_tiles(rows: int, units: int, inner: int, problems: int = 1, sms: int = 132,
                      thread_rows: int | None = None, thread_units: int | None = None, row_threads: int | None = None,
                      unit_threads: int | None = None) -> tuple[int, int, int, int]:
    """The default tile of :func:`gpu_row_tiles` for a ``rows x units`` output (``inner`` columns a
    unit: the gates): ``(thread_rows, thread_units, row_threads, unit_threads)``;
    any given value is kept. Blocks of 8 x 32 threads (fewer where an axis is short), 2 columns a
    thread where the unit has one (the backward's dh: at N = 160, H = 384 on the H100 the LSTM's
    backward step took 55.3 us with 4, 38.4 with 2, v35), and the most rows a thread (up to 4, at most 16
    accumulators) that still give half the SMs a block, else 1. On the H100 (notes/performance.md
    v33) more threads a block and fewer accumulators a thread were faster at every size measured:
    the GRU's N = 128, H = 128 step 11.1 us with 2 x 32 threads, 5.5 with 8 x 32; the LSTM's
    backward step at N = H = 256 51.7 -> 27.3 us; 8 rows a thread were the slowest everywhere.
    A rule from those measurements, not a model: tuning searches the rest."""
    tu = thread_units or _divisor(units, max(1, 2 // inner))
    ut = unit_threads or _near_divisor(-(-units // tu), 32)
    rt = row_threads or _near_divisor(rows, 8)
    if thread_rows:
        tr = _divisor(rows, thread_rows)
    else:
        def blocks(tr):
            return problems * -(-rows // (tr * rt)) * -(-units // (tu * ut))
        tr = next((t for t in (4, 2) if rows % t == 0 and t * tu * inner <= 16 and blocks(t) >= sms // 2), 1)
    rt = min(rt, -(-rows // tr)) if not row_threads else rt
    return tr, tu, rt, ut


def _near_divisor(n: int, at_most: int) -> int:
    """Threads along an axis of ``n``: a divisor of it if one is at least half of ``at_most``, else
    ``at_most`` (capped at ``n``) with the last block's threads padded (predicates guard them)."""
    d = _divisor(n, at_most)
    return d if 2 * d >= min(at_most, n) else min(at_most, n)


def persistent_row_tiles(rows: int, units: int, inner: int, reduction: int, problems: int, max_blocks: int,
                         budget: int, thread_rows: int | None = None, thread_units: int | None = None,
                         row_threads: int | None = None, unit_threads: int | None = None,
                         row_chunk: int = ROW_CHUNK, chunk: int | None = None,
                         backward: bool = False) -> PersistentTile | None:
    """The tile of a persistent :func:`gpu_row_tiles` step: ``(thread_rows, thread_units,
    row_threads, unit_threads)`` with at most ``max_blocks`` blocks (all resident), each block's
    units' weights (``units x inner x reduction`` floats a block) and its rows of the hidden state
    within ``budget`` bytes of shared memory; None where no tile fits. Among those: the most
    blocks (SMs at work), then at least 128 threads a block, then (a ``backward`` step's tile of
    128 rows or more whose blocks split the units) up to :data:`BACKWARD_PERSISTENT_THREADS`
    threads, then the most rows a thread (up to 16 accumulators), then the least padding, then 32
    units a block's row of threads.

    From the H200 (persistent inference steps timed in their loop, notes/performance.md v34): at
    N = H = 256 the LSTM's step took 5.4 us with 4 rows a thread and 4 x 32 threads (128 blocks),
    7.0 with 2 rows and 8 x 32, 19 with 2 units a thread, 38 with 8 x 64 threads; the GRU's 5.4,
    5.9, 8.3 (2 units a thread). At N = H = 128 (GRU and LSTM) 1 row a thread and 128 blocks of
    128 or 64 threads were best (2.5-2.9 us), and fewer blocks slower (2 rows, 32 blocks: 3.5).
    Two units a thread were slower at every size measured, so a thread keeps one unit. Given
    values (a tuning candidate's knobs) are kept: the rule chooses the rest.

    Before those, a tile whose block owns *all* of a problem's units (its rows' every column:
    :func:`independent_blocks`) where the direction's weights fit a block's shared memory (LSTM
    H <= ~110, GRU H <= ~128, an Elman RNN H <= ~230, fp32): such blocks need no other block's
    results, so their time loop meets at ``__syncthreads`` only, with no grid-wide barrier and no
    broadcast of the state through L2 a step (:meth:`tvmrnn.program.sequence.Program._persistent_loop`;
    the one-block loops of small batches, notes/performance.md v39, are the case of one row group).
    A block's threads then span up to 256 units (the next power of two at or above the units).
    It is taken wherever it fits, even where it reads more shared memory a step than a tile with
    a grid barrier (the barrier cost more, notes/performance.md v42).

    Where no tile fits with its rows whole (an LSTM's backward step, whose reduction is 4H: at
    H = 384 a block's 32 units of weights take 192 KB and its 16 rows 96 KB), the rows are staged
    ``row_chunk`` columns of the reduction at a time beside the weights, and the chunk is then
    doubled while it fits (up to :data:`MAX_ROW_CHUNK_BYTES`): that step took 20.5 us in its
    persistent loop on the H200 against 38.8 as one launch a step, and 32 KB chunks were 5-6%
    faster in the pass than 8 or 16 KB (notes/performance.md v55). Returned as
    :class:`PersistentTile`, its ``row_chunk`` 0 for rows staged whole. A given ``chunk`` (a
    tuning candidate's ``row_chunk`` knob) stages the rows in chunks of that many columns
    (at most the reduction), whether or not they would fit whole."""
    given = dict(tr=thread_rows, tu=thread_units, rt=row_threads, ut=unit_threads)
    # the rows staged whole (chunk 0), else a chunk of the reduction at a time; a tuning
    # candidate's chunk (the ``row_chunk`` knob) alone, whether or not they would fit whole
    for staged in ((min(chunk, reduction),) if chunk else (0, row_chunk)):
        for most_threads in (256, 1024):  # (a prime row count may leave no tile of at most 256 threads)
            found = _persistent_tile(rows, units, inner, reduction, problems, max_blocks, budget, most_threads,
                                     given, staged, backward)
            if not found:
                continue
            if staged and not chunk:  # the largest chunk that fits (each chunk's copy waits on L2 before its columns run)
                tr, tu, rt, ut = found
                weights = 4 * reduction * min(ut * tu, units) * inner
                while (2 * staged <= reduction and weights + 8 * staged * rt * tr <= budget
                       and 8 * staged * rt * tr <= MAX_ROW_CHUNK_BYTES):
                    staged *= 2
            return PersistentTile(*found, row_chunk=staged)
    return None


class PersistentTile(NamedTuple):
    """A persistent row tile (:func:`persistent_row_tiles`): threads' register tile, the block's
    threads, and how the block's rows of the step's input are staged in shared memory: whole at
    each step's start (``row_chunk`` 0), else ``row_chunk`` columns of the reduction at a time
    (beside the weights; both in dynamic shared memory)."""
    thread_rows: int
    thread_units: int
    row_threads: int
    unit_threads: int
    row_chunk: int = 0


def _persistent_tile(rows, units, inner, reduction, problems, max_blocks, budget, most_threads, given, chunk,
                     backward=False):
    def candidates(name, values):
        return (given[name],) if given[name] else values
    best, best_score = {}, {}  # by whether the tile's blocks are independent (own all the units)
    for tr in candidates("tr", (1, 2, 4, 8, 16)):
        for tu in candidates("tu", (1,)):
            if rows % tr or units % tu or tr * tu * inner > (32 if given["tr"] or given["tu"] else 16):
                continue
            for rt in candidates("rt", (1, 2, 4, 8, 16, 32)):
                if rt > -(-rows // tr) and not given["rt"]:
                    continue
                for ut in candidates("ut", (16, 32, 64, 128, 256)):
                    threads = rt * ut
                    # up to 64 threads within the units (16 past them), or the fewest that span them all
                    spans = ut * tu >= units > ut // 2 * tu
                    if threads > 1024 or not (given["rt"] or given["ut"] or 64 <= threads <= most_threads) \
                            or not (given["ut"] or spans or (ut <= 64 and (ut * tu <= units or ut == 16))):
                        continue
                    row_blocks, unit_blocks = -(-rows // (rt * tr)), -(-units // (ut * tu))
                    blocks = problems * row_blocks * unit_blocks
                    weights = 4 * reduction * min(ut * tu, units) * inner
                    staged = weights + 4 * (chunk or reduction) * rt * tr
                    if blocks > max_blocks or staged > budget:
                        continue
                    padding = row_blocks * rt * tr * unit_blocks * ut * tu - rows * units
                    more = min(threads, BACKWARD_PERSISTENT_THREADS) \
                        if backward and unit_blocks > 1 and rows >= GPU_ROW_TILE_ROWS and threads >= 128 else 0
                    score = (blocks, threads >= 128, more, tr, -padding, ut == 32, -threads)
                    kind = unit_blocks == 1
                    if kind not in best_score or score > best_score[kind]:
                        best[kind], best_score[kind] = (tr, tu, rt, ut), score
    # independent blocks wherever they fit: an Elman RNN at N = 128, H = 200, whose independent
    # tile reads 4/3 the shared memory a step of the best barrier tile, still ran its inference in
    # 0.47 ms independent and 0.61 ms with the barrier (H200, notes/performance.md v41, v42)
    return best.get(True, best.get(False))


def gpu_row_tiles(sch, kernel: Kernel, thread_rows: int | None = None, thread_units: int | None = None,
                  row_threads: int | None = None, unit_threads: int | None = None, k_tile: int = 16,
                  unroll: int = 4, stage: bool = True, sms: int = 132, max_blocks: int | None = None,
                  stationary_bytes: int = 0, prefetch: bool = True, row_chunk: int | None = None,
                  gate_threads: bool | None = None, register_weights: bool | None = None,
                  registers: int = 65536) -> None:
    """A per-step GEMM with many rows and its fused epilogue (the gate math, or the backward's
    pointwise): a block of ``row_threads x unit_threads`` threads owns a tile of rows x units (every
    unit with all its columns: the G gates), each thread ``thread_rows x thread_units`` of it in
    registers over the whole reduction; the epilogue runs on the thread's tile before it leaves
    registers, so the step is one kernel. With ``stage``, each ``k_tile`` of the reduction stages
    the block's rows of the hidden state and its units' weights in shared memory, copied by all of
    the block's threads (the GEMM's operands are read from L2 once a block, not once a thread).

    Split-K (:func:`tvmrnn.schedules.split_k.gpu_split_k`) gives a block all the rows and a few
    units: with few rows (N = 20) that fills the GPU, with many every block reads the whole
    hidden state. Here blocks split the rows too, as cuBLAS's and cuDNN's GEMMs do.
    ``sms``: the GPU's SMs (:func:`tvmrnn.device.device_model`), which the default tile fills.

    ``max_blocks`` and ``stationary_bytes`` (a persistent kernel's, :func:`tvmrnn.kernels.persistent`):
    at most that many blocks (:func:`persistent_row_tiles` picks the tile, keeping any given
    value), and each block's units' weights and its rows of the step's hidden state go to dynamic
    shared memory at the block's top instead of a shared tile a reduction tile: the time loop
    around the kernel hoists the weights' copy out of it (the weights stay on chip for every
    step), and the hidden state's copy stays in the step. Split-K's persistent form gives every
    block all the rows; here a block reads only its own, so many rows cost no more L2 traffic.
    Where no such tile fits, the kernel gets its one-launch-a-step tile, which no time loop runs
    persistent (:meth:`tvmrnn.program.sequence.Program.call`).

    ``row_chunk`` (persistent kernels): stage the rows this many columns of the reduction at a
    time (:func:`persistent_row_tiles`' ``chunk``); None: whole where they fit.

    ``prefetch``: the epilogue's per-step inputs from memory (the step's input projection, the
    carried cell state, the mask) are loaded into the thread's registers before its GEMM,
    so that their latency passes during the GEMM instead of after it (:func:`_prefetch_epilogue_inputs`).

    ``gate_threads`` (a persistent tile of independent blocks, one row a thread): each thread of
    the GEMM computes one column of a unit (one gate) instead of all of them, its result to
    shared memory, and the epilogue runs on one thread a unit after a ``__syncthreads``
    (:func:`_gate_threads`): G times the threads to hide the weights' shared-memory loads behind
    (an LSTM's step at N = 128, H = 96: 4 warps a block, 60% of its stalls on those loads, v57).
    ``register_weights`` (with ``gate_threads``): each thread keeps its column's weights in
    registers for every step (copied at a persistent loop's first step, :data:`FIRST_STEP_ONLY`),
    the reduction unrolled whole; only the hidden state is read from shared memory a step (a
    broadcast); where a thread's column and :data:`REGISTERS_BESIDE_WEIGHTS` more fit its share of
    the block's ``registers`` (the device model's) and of a thread's 255. A backward step's
    reduction runs over every gate of each unit: there a thread takes a (unit, gate), sums that
    gate's share (``rfactor``), and the pointwise's thread of the unit adds the G partial sums.

    Both None (the default), where gate threads fit (notes/performance.md v58, v59, the H200):
    - a gated cell's forward step takes them with the weights in registers where those fit (LSTM
      N = 128, H = 96: inference 1.8x faster; GRU N = H = 128: 1.3x; GRU N = 256, H = 64, two
      rows a block: 1.25x), and without them at two or more rows a block where the gate sums
      and staged inputs fit beside the weights in shared memory (GRU N = 200, H = 100: 1.12x;
      LSTM N = 200, H = 96: 1.05x; past that the kernel would overflow and the build lose
      persistence); not at one row without them (GRU N = H = 128: 10% slower) nor for an Elman
      RNN (one gate: no more threads; 1% slower);
    - a backward step takes them, with its weights in registers, at ``BACKWARD_GATE_UNITS`` (96 <= H < 128: training 10-12%
      faster for the LSTM at H = 96 and 112 and the GRU at H = 96; 3% slower for the LSTM at
      H = 64 and the GRU at H = 128).
    A gated forward step whose persistent tile splits the units over blocks (its weights do not
    fit one block: LSTM N = 128, H = 128, a grid barrier a step) takes their form over rows
    (:func:`_unit_gate_threads`): a thread a gate column of the block's units, the weights in its
    registers, its sums for the block's rows (up to 16) in registers; by default where a thread's
    column of weights fits its registers (H up to ~200) and a block has at most
    :data:`UNIT_GATE_ROWS` rows (H200, v59: inference 0.80 -> 0.69 ms for the LSTM at N = 128,
    H = 128, T = 200; 0.89 -> 0.62 at H = 200; 19% slower at 8 rows a block). A backward step's
    unit-splitting tile takes the same form on ``gate_threads=True`` (a thread a (unit, gate) of
    the reduction, the partial sums added by the pointwise's threads; not yet timed on a GPU).
    True: that
    form or a :class:`ScheduleError`; False: not that form."""
    gemm = sch.get_sblock(kernel.gemm)
    spatial, reduction = _gemm_axes(sch, gemm)
    ncols, nb = len(kernel.columns), kernel.batch
    n_rows = len(spatial) - ncols
    consumer = sch.get_consumers(gemm)[0]
    out = sch.get_loops(consumer)
    if len(out) < n_rows + 1:
        raise ValueError(f"{kernel.name}: row tiles need the epilogue's loops over rows and units")
    problems = math.prod(_extent(sch, l) for l in spatial[:nb])
    rows = math.prod(_extent(sch, l) for l in spatial[nb:n_rows])
    units = _extent(sch, spatial[n_rows])
    inner = math.prod(_extent(sch, l) for l in spatial[n_rows + 1:])
    reduction_total = math.prod(_extent(sch, l) for l in reduction)
    chosen = None
    if max_blocks and stationary_bytes:  # a persistent kernel: its tile must fit the blocks and shared memory
        chosen = persistent_row_tiles(rows, units, inner, reduction_total, problems, max_blocks, stationary_bytes,
                                      thread_rows, thread_units, row_threads, unit_threads, row_chunk=k_tile,
                                      chunk=row_chunk, backward=kernel.gemm != FORWARD_STEP_GEMM)
    # else (none fits) the kernel's tile of one launch a step, operands staged per reduction tile:
    # a time loop does not run it persistent (too many blocks, or no weights on chip)
    stationary = chosen is not None
    if chosen is None:
        chosen = default_row_tiles(rows, units, inner, problems, sms, thread_rows, thread_units, row_threads,
                                   unit_threads)
    rows_whole = not stationary or not chosen.row_chunk
    if not rows_whole:
        k_tile = chosen.row_chunk
    tr, tu, rt, ut = chosen[:4]
    threads = rt * ut
    # gate threads' block: a thread a (row, gate column), and in a backward step (whose reduction
    # runs over (j, g): every gate of each unit) a thread a gate of the reduction as well
    split = math.prod(_extent(sch, l) for l in reduction[1:])
    block_rows = rt * tr
    gate_columns = block_rows * units * inner * split
    gate_fits = stationary and rows_whole and tu == 1 and -(-units // ut) == 1 and gate_columns <= 1024
    per_thread = reduction_total // split  # a thread's share of the weights (H: one gate's, in a backward step)
    wanted = per_thread + REGISTERS_BESIDE_WEIGHTS
    registers_fit = wanted <= 255 and wanted * gate_columns <= registers
    # gate threads reading the weights from shared memory add the gate sums and the staged
    # per-step inputs beside the tile's weights and rows: where those overflow the block's shared
    # memory the build would drop persistence (LSTM N = 200, H = 120: 240,000 bytes)
    shared_fits = (4 * reduction_total * (units * inner + block_rows) + 4 * (2 * gate_columns + 3 * block_rows * units)
                   <= stationary_bytes)
    # ... and a tile whose blocks split the units (a grid barrier a step): a thread a gate column
    # of its block's units, that column's weights in its registers, looping over the block's rows
    unit_columns = ut * inner * split
    unit_blocks = stationary and rows_whole and tu == 1 and -(-units // ut) > 1
    # (the weights, the rows' sums, the hidden state's operands of ``unroll`` reduction indices)
    unit_wanted = per_thread + block_rows * (1 + unroll) + REGISTERS_BESIDE_WEIGHTS
    unit_fits = (unit_blocks and inner * split > 1 and block_rows <= 16 and unit_columns <= 1024
                 and unit_wanted <= 255 and unit_wanted * unit_columns <= registers)
    by_default = (kernel.gemm == FORWARD_STEP_GEMM and unit_fits and block_rows <= UNIT_GATE_ROWS
                  and gate_threads is None and register_weights is None)
    if unit_blocks and gate_threads is not False and register_weights is not False \
            and (gate_threads or register_weights or by_default):
        if not unit_fits:
            raise s_tir.ScheduleError(f"{kernel.name}: gate threads over a block's rows need several gate columns "
                                      f"a unit, at most 16 rows and 1024 columns a block, and a thread's "
                                      f"{per_thread} weights in its registers")
        _unit_gate_threads(sch, kernel, gemm, out, nb, n_rows, block_rows, ut, inner * split, k_tile, unroll)
        return
    if gate_threads is None:  # (weights in registers asked for: they need gate threads)
        if kernel.gemm == FORWARD_STEP_GEMM:  # a gated cell's forward step: where the weights fit
            by_default = inner > 1 and gate_fits and (registers_fit or (block_rows > 1 and shared_fits))
        else:  # a backward step: with its weights in registers, at 96 <= H < 128 (v58, v59)
            by_default = (split > 1 and gate_fits and registers_fit
                          and BACKWARD_GATE_UNITS[0] <= units < BACKWARD_GATE_UNITS[1])
        gate_threads = register_weights if register_weights is not None else by_default
    if gate_threads:
        if not gate_fits:
            raise s_tir.ScheduleError(f"{kernel.name}: gate threads need a persistent tile of independent blocks "
                                      f"with rows staged whole and at most 1024 gate columns a block")
        if register_weights is None:
            register_weights = registers_fit
        if register_weights and not registers_fit:
            raise s_tir.ScheduleError(f"{kernel.name}: a thread's {per_thread} weights in registers do not fit "
                                      f"{gate_columns} threads' share of {registers}")
        _gate_threads(sch, kernel, gemm, out, nb, n_rows, block_rows, units * inner * split, k_tile, unroll,
                      register_weights)
        return
    if register_weights:
        raise s_tir.ScheduleError(f"{kernel.name}: weights in registers need gate threads")

    # the epilogue's nest: (problems..., rows..., units) -> blocks of tiles, threads, a thread's tile
    row = sch.fuse(*out[nb:n_rows]) if n_rows - nb > 1 else out[nb]
    r_block, r_thread, r_in = sch.split(row, [None, rt, tr])
    u_block, u_thread, u_in = sch.split(out[n_rows], [None, ut, tu])
    sch.reorder(*out[:nb], r_block, u_block, r_thread, u_thread, r_in, u_in)
    block = sch.fuse(*out[:nb], r_block, u_block)
    thread = sch.fuse(r_thread, u_thread)
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    if stationary and -(-units // (ut * tu)) == 1:
        sch.annotate(block, INDEPENDENT_BLOCKS, 1)
    for loop in (r_in, u_in):
        sch.unroll(loop)

    # the GEMM: a thread's tile in registers, its reduction outermost
    sch.compute_at(gemm, thread, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    if prefetch:
        _prefetch_epilogue_inputs(sch, kernel, sch.get_consumers(gemm), thread)
    _, g_reduction = _gemm_axes(sch, gemm)
    # the reduction tiled along its first axis (the backward's (j, g): whole units, every gate of
    # each, so that a tile's operands are boxes in memory)
    first, rest = g_reduction[0], g_reduction[1:]
    rest_total = math.prod(_extent(sch, l) for l in rest)
    k_tile = _divisor(_extent(sch, first), max(1, k_tile // rest_total))
    k_outer, k_in = sch.split(first, [None, k_tile])
    k_in, k_unrolled = sch.split(k_in, [None, _divisor(k_tile, max(1, unroll // rest_total))])
    own = sch.get_loops(gemm)[2:]  # the thread's tile (with unit loops of the problems and rows)
    skip = (k_outer, k_in, k_unrolled, *rest)
    tile_loops = [l for l in own if not any(sch.get(l).same_as(sch.get(x)) for x in skip)]
    sch.reorder(k_outer, k_in, k_unrolled, *rest, *tile_loops)
    init = sch.decompose_reduction(gemm, k_outer)
    for loop in [k_unrolled, *rest, *tile_loops]:
        sch.unroll(loop)
    for loop in sch.get_loops(init)[2:]:
        sch.unroll(loop)
    if stationary and _stage_for_the_time_loop(sch, kernel, gemm, block, threads, rows_whole):
        _operands_to_registers(sch, gemm, k_unrolled, "shared.dyn")
        if rows_whole:
            return
    elif not stage:
        return
    # each k tile's operands (or, where the weights stay on chip, the rows') in shared memory,
    # copied by the whole block: the copies sit under the thread loop's parent (the block), so
    # every thread takes part. Chunks of the rows beside the weights are dynamic shared memory
    # too: TVM opts a kernel into more than 48 KB only for its dynamic part
    scope = "shared" if rows_whole else "shared.dyn"
    reads = sch.get(gemm).reads
    for index in reversed(range(len(reads))):
        if reads[index].source.scope() != "global":  # the accumulators
            continue
        copy = sch.cache_read(gemm, index, scope, consumer_blocks=[gemm])  # not the epilogue's
        sch.compute_at(copy, k_outer, preserve_unit_loops=True)
        copy_loops = _loops_after(sch, copy, k_outer)
        fused = sch.fuse(*copy_loops) if len(copy_loops) > 1 else copy_loops[0]
        outer, t = sch.split(fused, [None, threads])
        sch.bind(t, "threadIdx.x")
        sch.unroll(outer)  # a thread's loads of the tile all in flight at once (a loop waits for each)
    _operands_to_registers(sch, gemm, k_unrolled, scope)


def _gate_threads(sch, kernel: Kernel, gemm, out, nb: int, n_rows: int, rows: int, columns: int, k_tile: int,
                  unroll: int, register_weights: bool = False) -> None:
    """:func:`gpu_row_tiles`' ``gate_threads`` form: blocks of ``rows`` rows, each thread of the
    GEMM one (row, column) output (``rows x columns`` threads), its sum in shared memory; the
    epilogue's loop over the block's (row, unit) pairs on the same threads (TVM gives every
    ``threadIdx.x`` loop of a kernel one extent), the rest predicated off."""
    threads = rows * columns
    epilogue = sch.get_consumers(gemm)
    row = sch.fuse(*out[nb:n_rows]) if n_rows - nb > 1 else out[nb]
    r_block, r_in = sch.split(row, [None, rows])
    sch.reorder(*out[:nb], r_block, r_in, out[n_rows])
    block = sch.fuse(*out[:nb], r_block)
    # a row's threads: its units, padded to its gate columns, so that a thread's row is exact
    # (t // columns) and the GEMM's region in a block is its own rows: with the (row, unit) pairs
    # fused and then padded, the rows a block's GEMM covered were over-estimated (6 of 2 at the
    # GRU's N = 256, H = 64: three times the work, v58)
    pad, unit = sch.split(out[n_rows], [None, columns])
    sch.reorder(pad, r_in, unit)
    thread = sch.fuse(r_in, unit)
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    sch.annotate(block, INDEPENDENT_BLOCKS, 1)
    _, reduction = _gemm_axes(sch, gemm)
    if len(reduction) > 1:  # a backward step: a thread a gate of the reduction too
        gemm = _gate_partial_sums(sch, gemm, reduction, thread)
    # the GEMM: one output a thread, summed in a register, then to shared memory for the epilogue
    sch.compute_at(gemm, block, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "shared")
    result = sch.cache_write(gemm, 0, "local")
    _, reduction = _gemm_axes(sch, gemm)
    own = [l for l in _loops_after(sch, gemm, block) if not any(sch.get(l).same_as(sch.get(r)) for r in reduction)]
    _, g_thread = sch.split(sch.fuse(*own) if len(own) > 1 else own[0], [None, threads])
    sch.bind(g_thread, "threadIdx.x")
    sch.reverse_compute_at(result, g_thread, preserve_unit_loops=True)
    first, rest = reduction[0], reduction[1:]
    rest_total = math.prod(_extent(sch, l) for l in rest)
    k_tile = _divisor(_extent(sch, first), max(1, k_tile // rest_total))
    k_outer, k_in = sch.split(first, [None, k_tile])
    k_in, k_unrolled = sch.split(k_in, [None, _divisor(k_tile, max(1, unroll // rest_total))])
    for loop in [k_unrolled, *rest] + ([k_outer, k_in] if register_weights else []):
        sch.unroll(loop)  # (weights in registers: the whole reduction, so each index is a register)
    sch.decompose_reduction(gemm, k_outer)
    # the epilogue's per-step inputs (the input projection, the cell state) staged in shared
    # memory at the step's start beside the hidden state, their loads' latency overlapping its
    for copy in _epilogue_inputs(sch, kernel, epilogue, "shared"):
        sch.compute_at(copy, block, preserve_unit_loops=True, index=0)
        _copy_by_threads(sch, copy, threads)
    if register_weights:
        _weights_to_registers(sch, kernel, gemm, block, g_thread, threads)
    elif not _stage_for_the_time_loop(sch, kernel, gemm, block, threads, True):
        raise s_tir.ScheduleError(f"{kernel.name}: gate threads need the weights and the rows on chip")
    _operands_to_registers(sch, gemm, k_unrolled, "shared.dyn")


def _unit_gate_threads(sch, kernel: Kernel, gemm, out, nb: int, n_rows: int, rows: int, units: int, gates: int,
                       k_tile: int, unroll: int) -> None:
    """:func:`gpu_row_tiles`' ``gate_threads`` form for a persistent tile whose blocks split the
    units (``rows`` rows x ``units`` units a block, a grid barrier a step): a thread a gate column
    of the block's units (``units x gates`` threads), that column's weights in its registers
    (copied at the time loop's first step), its sums for the block's rows in registers (each
    weight used once a row), over the hidden state's rows broadcast from shared memory; the sums
    to shared memory, then the epilogue on ``rows x units`` of the threads after a barrier. A
    backward step's reduction runs over (j, g): there a thread takes a (unit, gate) of it
    (``gates`` = G), its H weights in registers, and the epilogue's thread of a (row, unit) adds
    the G partial sums (``rfactor``, as :func:`_gate_threads` does)."""
    threads = units * gates
    epilogue = sch.get_consumers(gemm)
    row = sch.fuse(*out[nb:n_rows]) if n_rows - nb > 1 else out[nb]
    r_block, r_in = sch.split(row, [None, rows])
    u_block, u_in = sch.split(out[n_rows], [None, units])
    sch.reorder(*out[:nb], r_block, u_block, r_in, u_in)
    block = sch.fuse(*out[:nb], r_block, u_block)
    _, thread = sch.split(sch.fuse(r_in, u_in), [None, threads])
    sch.bind(block, "blockIdx.x")
    sch.bind(thread, "threadIdx.x")
    _, reduction = _gemm_axes(sch, gemm)
    if len(reduction) > 1:  # a backward step (its reduction over (j, g)): a thread a (unit, gate)
        gemm = _gate_partial_sums(sch, gemm, reduction, thread)
    # the GEMM: the block's rows x units x gates, a thread a (unit, gate), the rows in its registers
    sch.compute_at(gemm, block, preserve_unit_loops=True)
    if len(reduction) > 1:  # (rfactor's gate loop comes first: after the unit, as in a forward step)
        spatial, reduction = _gemm_axes(sch, gemm)
        sch.reorder(*spatial[1:], spatial[0], *reduction)
    sch.set_scope(gemm, 0, "shared")
    result = sch.cache_write(gemm, 0, "local")
    spatial, reduction = _gemm_axes(sch, gemm)
    own = _loops_after(sch, gemm, block)
    row_loops = own[:len(own) - len(reduction)][:-2]  # (a leading loop of the problems too: one iteration)
    unit_loop, gate_loop = own[len(own) - len(reduction) - 2:len(own) - len(reduction)]
    column = sch.fuse(unit_loop, gate_loop)
    sch.reorder(column, *row_loops)
    _, g_thread = sch.split(column, [None, threads])
    sch.bind(g_thread, "threadIdx.x")
    (first,) = reduction
    k_tile = _divisor(_extent(sch, first), max(1, k_tile))
    k_outer, k_in = sch.split(first, [None, k_tile])
    k_in, k_unrolled = sch.split(k_in, [None, _divisor(k_tile, max(1, unroll))])
    sch.reorder(k_outer, k_in, k_unrolled, *row_loops)
    sch.reverse_compute_at(result, g_thread, preserve_unit_loops=True)
    init = sch.decompose_reduction(gemm, k_outer)
    for loop in [k_outer, k_in, k_unrolled, *row_loops, *_loops_after(sch, init, g_thread)]:
        sch.unroll(loop)  # (the whole reduction: each weight's index a register)
    for loop in _loops_after(sch, result, g_thread):
        sch.unroll(loop)
    for copy in _epilogue_inputs(sch, kernel, epilogue, "shared"):
        sch.compute_at(copy, block, preserve_unit_loops=True, index=0)
        _copy_by_threads(sch, copy, threads)
    _weights_to_registers(sch, kernel, gemm, block, g_thread, threads)
    # each row's hidden state for ``unroll`` reduction indices: one vector load (a broadcast) a row
    _operands_to_registers(sch, gemm, k_in, "shared.dyn")


def _gate_partial_sums(sch, gemm, reduction, thread):
    """A backward step's gate threads (its reduction over (j, g)): the GEMM ``rfactor``-ed over the
    gates, each partial sum a gate's share (computed by a thread a (unit, gate)); the G partials
    added up in registers by the epilogue's ``thread`` of the unit. Returns the partial block."""
    rest = sch.fuse(*reduction[1:]) if len(reduction) > 2 else reduction[1]
    partial = sch.rfactor(rest, 0)
    sch.compute_at(gemm, thread, preserve_unit_loops=True)
    sch.set_scope(gemm, 0, "local")
    for loop in _loops_after(sch, gemm, thread):
        sch.unroll(loop)
    return partial


def _weights_to_registers(sch, kernel: Kernel, gemm, block, g_thread, threads: int) -> None:
    """Gate threads' operands: a thread's column of the weights to its registers, copied under the
    GEMM's own thread loop ``g_thread`` (so that TVM gives the array one thread's column) at the
    time loop's first step only (:data:`FIRST_STEP_ONLY`); the rows to shared memory at the
    ``block``'s top, copied by its ``threads``."""
    wbuf = sch.mod["main"].params[kernel.roles.index("w")]
    rows_read = [i for i, r in enumerate(sch.get(gemm).reads) if not r.source.same_as(wbuf) and r.source.scope() == "global"]
    if len(rows_read) != 1:
        raise s_tir.ScheduleError(f"{kernel.name}: gate threads need the weights and the rows on chip")
    copy = sch.cache_read(gemm, rows_read[0], "shared.dyn", consumer_blocks=[gemm])
    sch.compute_at(copy, block, preserve_unit_loops=True, index=0)
    _copy_by_threads(sch, copy, threads)
    w_index = next(i for i, r in enumerate(sch.get(gemm).reads) if r.source.same_as(wbuf))
    copy = sch.cache_read(gemm, w_index, "local", consumer_blocks=[gemm])
    sch.compute_at(copy, g_thread, preserve_unit_loops=True)
    for loop in _loops_after(sch, copy, g_thread):
        sch.unroll(loop)
    sch.annotate(copy, FIRST_STEP_ONLY, 1)


# Inputs the same at every step (the bias, per-unit parameters): cached on chip after the first
# step, so not worth registers a step (and a time loop should not read its weights' buffer a step)
_STEP_INVARIANT_ROLES = ("w", "b", "unit")


def _epilogue_inputs(sch, kernel: Kernel, consumers, scope: str) -> list:
    """A copy in ``scope`` (a new block, not yet placed) of each global input that the epilogue's
    blocks ``consumers`` read and do not write and that moves with the step (not one of
    :data:`_STEP_INVARIANT_ROLES`), read by them from the copy (:func:`_prefetch_epilogue_inputs`
    places them in a thread's registers, :func:`_gate_threads` in shared memory)."""
    params = sch.mod["main"].params
    invariant = [params[i] for i, role in enumerate(kernel.roles) if role in _STEP_INVARIANT_ROLES]
    written = [w.source for c in consumers for w in sch.get(c).writes]
    copies = []
    for param in params:
        if any(param.same_as(p) for p in invariant) or any(param.same_as(w) for w in written):
            continue
        readers = [c for c in consumers if any(r.source.same_as(param) for r in sch.get(c).reads)]
        if not readers:
            continue
        index = next(i for i, r in enumerate(sch.get(readers[0]).reads) if r.source.same_as(param))
        copies.append(sch.cache_read(readers[0], index, scope, consumer_blocks=readers))
    return copies


def _prefetch_epilogue_inputs(sch, kernel: Kernel, consumers, thread) -> None:
    """Each global input that the epilogue's blocks ``consumers`` (its sibling outputs: h, y, c,
    the saved values...) read and do not write, and that moves with the step
    (:data:`_STEP_INVARIANT_ROLES` stay), copied once into registers as the first statement of the
    thread's body (before its GEMM) for all of them: the loads are issued then and waited on only
    in the epilogue, after the reduction (a step's input projection comes from L2 or memory,
    hundreds of cycles, which otherwise follow the GEMM every step). Inputs are taken by
    parameter, not by position in a block's reads (a masked kernel's lists differ)."""
    for copy in _epilogue_inputs(sch, kernel, consumers, "local"):
        sch.compute_at(copy, thread, preserve_unit_loops=True, index=0)
        for loop in _loops_after(sch, copy, thread):
            sch.unroll(loop)


def _stage_for_the_time_loop(sch, kernel: Kernel, gemm, block, threads: int, rows_whole: bool = True) -> bool:
    """A persistent row-tile step's operands in dynamic shared memory, each copied whole at the
    block's top by all its threads: the weights (the time loop hoists their copy: they do not move
    with the step) and, with ``rows_whole``, the hidden state's rows (the tile's bytes were checked
    by :func:`persistent_row_tiles`; else the caller stages them a reduction tile at a time).
    False, with nothing changed, where the GEMM does not read exactly those two (weights alone,
    the rows read by each thread from memory, measured no faster than one launch a step:
    notes/performance.md v34)."""
    if "w" not in kernel.roles:
        return False
    wbuf = sch.mod["main"].params[kernel.roles.index("w")]
    reads = sch.get(gemm).reads
    index = next((i for i, r in enumerate(reads) if r.source.same_as(wbuf)), None)
    rows = [i for i, r in enumerate(reads) if i != index and r.source.scope() == "global"]
    if index is None or len(rows) != 1:
        return False
    for i in sorted([index, rows[0]] if rows_whole else [index], reverse=True):  # each copy to the block's top
        copy = sch.cache_read(gemm, i, "shared.dyn", consumer_blocks=[gemm])
        sch.compute_at(copy, block, preserve_unit_loops=True, index=0)
        _copy_by_threads(sch, copy, threads)
    return True


def _operands_to_registers(sch, gemm, k_unrolled, scope: str) -> None:
    """Each thread's operands for one reduction index, from shared memory into registers: its
    columns (a unit's gates) as one vector load where they are contiguous and 4 or 2 wide."""
    for index, read in enumerate(sch.get(gemm).reads):
        if read.source.scope() != scope:
            continue
        load = sch.cache_read(gemm, index, "local", consumer_blocks=[gemm])
        sch.compute_at(load, k_unrolled, preserve_unit_loops=True)
        own = sch.get_loops(load)[-len(sch.get(load).iter_vars):]
        for loop in own[:-1]:
            sch.unroll(loop)
        lanes = next((v for v in (4, 2) if _extent(sch, own[-1]) % v == 0), 1)
        if lanes > 1:
            _vectorize(sch, own[-1], lanes)
        else:
            sch.unroll(own[-1])
