"""CPU templates: the register-blocked GEMM (:func:`cpu_gemm`) and the gate-blocked weight panels
it streams (:func:`weight_panel`, :func:`gradient_panel`).
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

from tvm import s_tir

from ..device import device_model, host_target
from ..kernels import Kernel, is_step, panels

from .common import _divisor, _extent, _gemm_axes, _uses, _vectorize, _vectorize_trailing, is_gpu, vector_lanes


def cpu_column_tile(lanes: int, lead: int, inner: int, column_vectors: int | None = None,
                    min_tiles: int | None = None) -> int:
    """:func:`cpu_gemm`'s column tile, in steps of its leading column axis (``lead`` long; the
    trailing ones, ``inner`` elements, e.g. all G gates of a unit, are taken whole): at most
    ``column_vectors`` vectors of ``lanes`` floats, a whole number of them where possible; where
    that is one vector of several gates, up to :data:`CPU_WIDE_TILE_VECTORS` if that leaves
    ``min_tiles`` tiles (default :data:`CPU_WIDE_TILE_MIN_TILES`)."""
    def lead_tile_for(vectors):
        cap = max(1, vectors * lanes // inner)
        # Whole vectors, so that `_vectorize` can run the tile as lane-wide pieces: with 3 gates,
        # 16 units make 48 floats (3 vectors); 20 units (60 floats) could not be split so.
        tile = _divisor(lead, cap, multiple_of=lanes // math.gcd(lanes, inner))
        if tile > 1:
            return tile
        # No whole number of vectors divides the columns (H not a multiple of the lanes; on AVX-512
        # the backward's data GEMMs and the RNN at H = 72, the GRU at H = 100, 300, 1000): at most
        # one vector (CPU_PARTIAL_TILE_VECTORS), since a wider tile is one odd-width LLVM vector,
        # which `_vectorize` cannot cut into lane-wide pieces and LLVM runs slowly
        if column_vectors is None and CPU_PARTIAL_TILE_VECTORS:
            narrow = _divisor(lead, max(1, CPU_PARTIAL_TILE_VECTORS * lanes // inner))
            if narrow * inner > 1:
                return narrow
        return _divisor(lead, cap)

    lead_tile = lead_tile_for(column_vectors or 4)
    if (column_vectors is None and CPU_WIDE_TILE_VECTORS and lanes >= 16 and inner > 1
            and lead_tile * inner == lanes):
        wide = lead_tile_for(CPU_WIDE_TILE_VECTORS)
        if wide * inner % lanes == 0 and lead // wide >= (CPU_WIDE_TILE_MIN_TILES if min_tiles is None else min_tiles):
            lead_tile = wide
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


# The widest default column tile, in vectors, where no whole number of vectors divides the
# columns (``cpu_column_tile``'s fallback; None: up to ``column_vectors``' 4, as before v69). A tile
# of 36-60 floats on AVX-512 was one odd-width LLVM vector; one partial vector instead (12-15
# floats), on a 2-core Zen 4 dev VM, 2 threads, interleaved, the same bits (notes/performance.md
# v69): GRU T=40 N=7 I=H=300 inference 17.3 -> 1.8 ms, training 68.5 -> 6.7; GRU N=4 H=1000
# 67 -> 10, 165 -> 42; LSTM N=4 H=1000 training 86 -> 48; RNN N=8 H=90 1.2 -> 0.14, 3.6 -> 0.5;
# LSTM N=5 H=72 training 1.46 -> 0.89; even 3 floats (RNN H=129: 43 before) 2.6 -> 0.42 ms. AVX2
# code (mcpu haswell / znver3) on the same VM: GRU H=75 (3 floats for 15) 1.65 -> 0.58 ms, H=225
# 38 -> 9, H=300 26 -> 3.4, RNN H=90 0.81 -> 0.19. A one-float tile (a prime count of plain
# columns, e.g. RNN H=37) measured mixed (inference 1.8x faster, training 1.2x slower): the old
# tile stayed there (since v70 CPU_GUARDED_TILES gives both whole vectors and a peeled tail).
CPU_PARTIAL_TILE_VECTORS = 1

# Where 2-4 whole vectors of units divide no gate-blocked columns and one does (an AVX-512 LSTM at
# H = 500, 700, 1100, 1220: 4-unit panels, a register tile of 24 rows x 1 vector, each k 24
# broadcasts for one weight vector), up to this many vectors (5: 20 units, 4 rows) instead (0:
# off), where that leaves CPU_WIDE_TILE_MIN_TILES column tiles or more (H = 100's 5 tiles of 20
# units would leave most of 16 cores idle at small batches). On a 2-core Zen 5 dev VM, 2 threads,
# one process, interleaved, off -> on, inference / training ms (the same bits; notes/performance.md
# v75): LSTM T=96 N=24 I=H=700 45.0 / 164.4 -> 39.1 / 154.6; N=32 H=500 31.8 / 107.0 -> 27.0 / 101.0;
# N=8 H=1100 47.0 / 167.3 -> 39.1 / 153.3; T=125 N=1 I=1024 H=1220 2 layers 72.9 / 327.5 -> 45.6 /
# 291.7; N=64 H=100 (5 tiles, below the minimum) 4.17 / 11.40 -> 2.67 / 11.44. Not run on a Xeon.
CPU_WIDE_TILE_VECTORS = 6
CPU_WIDE_TILE_MIN_TILES = 8


def weight_panel(target, gates: int, hidden: int, enabled: bool | None = None) -> int:
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
    interleaved, the ``panel_study`` (a study script, at 34424c0)) a step's GEMM went 1,214-1,408 -> 767-801 us and a
    16-step chunk 14.3-14.7 -> 11.6-12.5 ms. On the GPU machine's AVX-512 Xeon (16 threads,
    notes/performance.md v23, the ``step_study`` (a study script, at 34424c0)) the LSTM's step alone went 154 -> 123 us
    (125 -> 119 with huge pages), on one thread 1,108 -> 942 us, and whole passes interleaved
    with PyTorch (the ``cpu_pass_study`` (a study script, at 34424c0), huge pages on both sides of the comparison)
    LSTM inference 58.3 -> 48.4 ms, training 211 -> 198 ms, the GRU's the same or faster, the
    RNNs' the same. So every CPU gets them. ``enabled`` (``BuildOptions.weight_panels``): None or
    True (default: panels), False K-major (for comparisons). The panel is the default schedule's tile
    (:func:`cpu_column_tile`), so that the tile's index into the panel simplifies; a schedule with
    another tile stays correct but is slow (a 10 x 2-vector tile on 16-unit panels ran 4x slower
    on the Xeon: its index does not simplify). GPUs: none (a warp reads a K-major row coalesced).
    The backward's copy of a weight with K inputs takes ``weight_panel(target, 1, K)`` (its tile
    runs along K alone: :func:`tvmrnn.kernels.backward_weight_shape`).
    """
    if target is None:
        target = host_target()
    if enabled is False or is_gpu(target):
        return 0
    lanes = vector_lanes(target)
    units = cpu_column_tile(lanes, hidden, gates)
    # whole vectors only (a narrower tile, e.g. 2 of 74 features, gains nothing from a panel)
    panel = units if 1 < units < hidden and hidden % units == 0 and units * gates % lanes == 0 else 0
    if CPU_PADDED_PANELS and gates > 1 and (lanes >= 16 or CPU_PADDED_PANELS_AVX2) and panel * gates <= lanes:
        # one vector or none: 2-4 whole vectors of units in panels (a GRU's 3 gates: 16 units, 3
        # vectors; 5 or 7 gates: none), the last padded (CPU_PADDED_PANELS); 8 lanes (AVX2, and
        # generic x86-64 builds, which take AVX2's tiles), 16 registers: 2 vectors, or 3 (the default
        # tile, cpu_column_tile: 2 vectors where they hold whole units; CPU_PADDED_PANELS_AVX2)
        sizes = [v * lanes // gates for v in ((4, 3, 2) if lanes >= 16 else (2, 3)) if v * lanes % gates == 0]
        return (_padded_panel(hidden, sizes) if sizes else 0) or panel
    return panel


def _padded_panel(hidden: int, sizes) -> int:
    """Of ``sizes`` (units a panel, widest first), the widest whose padding of ``hidden`` is at most
    1/16 more units, else the one padding least if that is at most 1/8 more (0: none)."""
    def padded(u):
        return panels(hidden, u) * u
    best = next((u for u in sizes if padded(u) * 16 <= hidden * 17), None)
    best = best or min(sizes, key=lambda u: (padded(u), -u))
    return best if padded(best) * 8 <= hidden * 9 and best < hidden else 0


def backward_panel(target, in_size: int, enabled: bool | None = None) -> int:
    """Features per panel of the backward's copy of a weight with ``in_size`` inputs (0: PyTorch's
    ``(G, H, K)``; :func:`tvmrnn.kernels.backward_weight_shape`): its data GEMMs (``dh = dg W_hh``,
    ``dx = dg W_ih``) tile along K alone, so the panel is :func:`weight_panel`'s for one gate; where
    no panel of whole vectors divides K (:data:`CPU_PADDED_BACKWARD_PANELS`), 2-4 vectors with the
    last panel padded by zero weights, as :data:`CPU_PADDED_PANELS` pads the forward's (only those
    whose padded K the default tile, :func:`cpu_column_tile`, divides into whole panels)."""
    if target is None:
        target = host_target()
    panel = weight_panel(target, 1, in_size, enabled)
    if panel or enabled is False or is_gpu(target) or not CPU_PADDED_BACKWARD_PANELS:
        return panel
    lanes = vector_lanes(target)
    if lanes < 16:  # (AVX2: not measured)
        return 0
    sizes = [u for u in (v * lanes for v in (4, 3, 2))
             if cpu_column_tile(lanes, panels(in_size, u) * u, 1) == u]
    return _padded_panel(in_size, sizes) if sizes else 0


def padded_inputs(target, layout, enabled: bool | None = None) -> tuple[tuple[int, int], ...]:
    """``(K, Kp)`` for each weight width K whose backward copy :func:`backward_panel` pads to Kp
    (``Config.padded_inputs``, :class:`tvmrnn.cells.parameters.Layout`)."""
    widths = sorted({s.torch_shape[1] for s in layout.slots if len(s.torch_shape) == 2})
    out = []
    for k in widths:
        panel = backward_panel(target, k, enabled)
        if panel and k % panel:
            out.append((k, panels(k, panel) * panel))
    return tuple(out)


def packed_units(target, gates: int, hidden: int, enabled: bool | None = None) -> int:
    """The units the forward kernels' gate columns hold: ``hidden``, or more where the weight
    panels (:func:`weight_panel`) do not divide it (the last one padded)."""
    panel = weight_panel(target, gates, hidden, enabled)
    return panels(hidden, panel) * panel if panel else hidden


def gradient_panel(target, gates: int, hidden: int, enabled: bool | None = None,
                   weight_panels: bool | None = None) -> int:
    """Units per column panel in which a CPU backward sums its weight gradients (0: rows ``(K, H,
    G)``; :func:`tvmrnn.kernels.weight_gradient`): the forward weights' panel
    (:func:`weight_panel`), where the weight gradient's register tile is one whole panel.
    A 16-step DS2 LSTM chunk on the GPU machine's Xeon (16 threads, interleaved,
    the ``wgrad_study`` (a study script, at 34424c0)): 1,706 us in rows, 1,381 in panels, plus 110 us to pack the gate
    gradients into panels (one pack serves both weights where dgh is dgx: the backward uses panels
    only there, not for the GRU); one thread 15.8 -> 12.1 ms (notes/performance.md v25).
    ``enabled`` (``BuildOptions.gradient_panels``): None or True (default), False (rows, for
    comparisons); none where the weights have none (``weight_panels``, as for :func:`weight_panel`);
    GPUs: none (they sum weight gradients in PyTorch's layout)."""
    if enabled is False:
        return 0
    if target is None:
        target = host_target()
    panel = weight_panel(target, gates, hidden, weight_panels)
    if panel and hidden % panel and not CPU_PADDED_GRADIENT_PANELS:  # padded panels: the weight gradients in rows
        return 0
    return panel if panel and cpu_column_tile(vector_lanes(target), panel, gates, min_tiles=1) == panel else 0


def guarded_tile(lanes: int, lead: int, inner: int, lead_tile: int) -> bool:
    """Whether :func:`cpu_gemm`'s default tile of ``lead_tile`` steps of the leading column axis
    (``lead`` long, ``inner`` elements a step) becomes one whole guarded vector
    (:data:`CPU_GUARDED_TILES`): no whole number of vectors, not fuller than
    :data:`CPU_GUARDED_TILE_MAX_FILL`, two vectors of columns or more, and gates that divide the
    lanes or (:data:`CPU_GUARDED_GATE_TILES`) ``lanes // gates`` units, one partial vector."""
    width = lead_tile * inner
    return bool(CPU_GUARDED_TILES and width % lanes and not CPU_GUARDED_TILE_MAX_FILL * lanes < width < lanes
                and (lanes % inner == 0 or CPU_GUARDED_GATE_TILES) and lead * inner >= 2 * lanes)


def tile_rows(extent: int, width: int, lanes: int, accumulators: int = 24, multiple_of: int = 1) -> int:
    """:func:`cpu_gemm`'s register tile rows: the last row axis (``extent``) tiled so that rows x
    the tile's column vectors (``width`` floats) fit the accumulators (12 at most on AVX2); a
    multiple of ``multiple_of`` (else 1)."""
    if lanes == 8:
        accumulators = min(accumulators, 12)
    return _divisor(extent, max(1, accumulators // max(1, -(-width // lanes))), multiple_of)


def padded_batch(batch: int, gates: int, hidden: int, target) -> int:
    """The rows to build a CPU RNN for, to run batches of ``batch`` rows fast: of ``batch`` and up
    to an eighth more rows, the fewest whose fused steps take the least time by a model of their
    register tiles (:func:`tile_rows`): a row count's time is its rows over the share of the FMA
    rate its tiles reach, a tile of fewer accumulators (rows x vectors) than the device model's
    ``busy_accumulators`` reaching that fraction, and a short tile (one or two rows: a batch of 7,
    11, 13, 14, 17, ... rows with no divisor near the tile's) half. So 7 -> 8, 13 -> 15, 14 -> 15
    (v67); with tiles of 2 vectors (an AVX-512 LSTM at H = 200), 129 -> 130 and 57 -> 60 (v74:
    on a 2-core Zen 5, inference 21.5 -> 16.7 and 9.2 -> 7.8 ms; training 93.9 -> 78.1 and
    30.3 -> 32.0). The padding's
    rows are copies of the first row the passes compute and drop (exact: rows are independent). ``tvmrnn.build`` of an
    fp32 CPU RNN builds so (``Config.compiled_rows``; the drop-ins through it), ``batch_size`` staying
    the largest batch a call may pass. An LSTM (T=100, I=H=512) running 7 rows on a 2-core Zen 5:
    built for 7, inference 19.6 ms, training 50.3; for 8, 9.7 and 34.0 (v67). A step whose tile
    is guarded (:func:`guarded_tile`) is one vector wide, so its rows are those of a vector. Since
    v80 the backward's GEMMs over the rows count too (:data:`PADDED_BATCH_DATA_GEMMS`): 129 -> 130
    and 57 -> 60 at any width."""
    lanes = vector_lanes(target)
    lead_tile = cpu_column_tile(lanes, hidden, gates)
    guarded = CPU_GUARDED_STEP_TILES and guarded_tile(lanes, hidden, gates, lead_tile)
    width = lanes if guarded else lead_tile * gates
    panel = weight_panel(target, gates, hidden)
    if panel and hidden % panel:  # padded panels: a tile of one panel
        width = panel * gates
    busy = device_model(target).busy_accumulators

    def cost(rows, width):  # the time of GEMMs over the rows, as rows over the share of the FMA rate their tiles reach
        vectors = -(-width // lanes)
        tile = tile_rows(rows, width, lanes)
        if tile <= 2 < rows:  # a short tile: each weight vector loaded for one or two rows (v67)
            return Fraction(2 * rows)
        return Fraction(rows * max(tile * vectors, busy), tile * vectors)
    # the steps, and (PADDED_BATCH_DATA_GEMMS) the backward's GEMMs over the rows of other widths
    # (the input gradient's K columns: tiles of two vectors)
    widths = (width, 2 * lanes) if PADDED_BATCH_DATA_GEMMS else (width,)
    return min(range(batch, batch + max(2, batch // 8) + 1), key=lambda rows: (sum(cost(rows, w) for w in widths), rows))


# Whether padded_batch also weighs a GEMM over the rows whose tile is two vectors (the backward's
# input gradient over K columns, v80): at a row count whose tile is short for it alone (129 = 3 x
# 43, 57 = 3 x 19) it ran a chunk's input gradient 2x slower (GRU N=129 H=292: 3-row tiles, 2.55
# against 1.26 ms at 130). A 2-core Zen 5, 2 threads, one process, interleaved, training ms, old ->
# new rows: LSTM T=100 N=129 I=161 H=292 128.1 -> 117.1 (129 -> 130), GRU 113.9 -> 104.0; N=57
# H=645 (57 -> 60) LSTM 108.3 -> 107.3, GRU 92.9 -> 89.6; LSTM N=39 H=300 61.7 -> 57.1; GRU N=69
# H=200 42.1 -> 40.2; RNN N=23 H=100 2.01 -> 1.92, N=46 3.04 / 2.07 -> 3.15 / 1.97 (two runs);
# LSTM N=51 I=H=256 (51 -> 52) 42.7 / 46.5 -> 43.8 / 47.9, 3% slower. Inference the same or faster.
PADDED_BATCH_DATA_GEMMS = True


# The fewest input features and batch rows whose weight gradients take input panels
# (input_panel): the whole backward on a 2-core Sapphire Rapids VM, interleaved, inputs in panels
# against rows: LSTM T=50 N=256 I=H=64 12.1 against 10.8 ms, N=64 I=H=256 28.2 against 27.1; N=256
# I=H=512 171 against 182; N=4 I=H=512 11.0 / 13.0 against 10.6 / 12.5, N=1 I=H=1024 45.3
# against 44.3 (notes v46)
INPUT_PANEL_MIN_FEATURES = 512
INPUT_PANEL_MIN_BATCH = 16


def input_panel(target, in_size: int, gates: int, panel: int, batch: int) -> int:
    """Rows per panel of the inputs a CPU weight gradient in ``panel``-unit gradient panels
    multiplies (0: none; :func:`tvmrnn.kernels.input_panels`): the rows of its default register
    tile (:func:`tile_rows`), so that the tile reads one panel. Both operands then stream
    contiguous blocks, as BLIS packs them. Kernel alone, a 16-step LSTM chunk N=64 K=H=1024 on a
    2-core Sapphire Rapids VM: 123-130 -> 184-191 GFLOP/s (PyTorch's ``addmm`` ~300); the GRU's
    (G=3) 106 -> 160-200; at K=800 (DS2), where a row of the inputs is not a multiple of 4 KB,
    162 -> 178 (notes v46). None below :data:`INPUT_PANEL_MIN_FEATURES` inputs or
    :data:`INPUT_PANEL_MIN_BATCH` rows (``batch``), where a chunk's inputs stay in cache as they
    are and the pack costs more than it saves."""
    if not panel or in_size < INPUT_PANEL_MIN_FEATURES or batch < INPUT_PANEL_MIN_BATCH:
        return 0
    rows = tile_rows(in_size, panel * gates, vector_lanes(host_target() if target is None else target))
    return rows if rows > 1 else 0


# Whether a fused step over plain columns (the backward step's GEMM onto dh, K columns in panels)
# takes the tallest of its register tiles that fill the accumulators as well as the widest does
# (:func:`step_tile`): at 24 rows, 12 x 2 vectors instead of 6 x 4. AVX-512 only (AVX2's tile is
# already 2 vectors wide). On a 2-core Zen 5, the kernel alone (notes/bench/v82/vm_step_tiles.txt):
# LSTM N=24 H=423 108 -> 97 us, N=64 H=256 114 -> 107, N=256 H=512 1,472 -> 1,332; GRU N=24 H=423
# 75 -> 60; N=5 and N=20 unchanged (no taller tile fills as many accumulators).
CPU_TALL_STEP_TILES = True
# Whether such a step's rows are tiled for the device's cores (:func:`step_tile`): of the tiles of
# that width holding the device model's ``busy_accumulators`` or more, the one whose busiest core
# has the least work (TVM's static partition: ceil(tiles / cores) tiles a core, a tile's work its
# accumulators, at least ``busy_accumulators``), ties to tiles enough for CPU_STEP_TASKS_PER_CORE a
# core, then to the taller. A 16-core Emerald Rapids Xeon, the backward step alone, 16 threads
# (notes/bench/v82/xeon_step_tiles.txt: an exploratory grid, one schedule's timings varying by up
# to 15% between runs; not checked in whole passes): LSTM N=12 H=256 12 x 2 (8 tiles) 21 us, 6 x 2
# (16) 13.4; N=48 H=423 12 x 2 (56 tiles) > 128, 6 x 2 (112) 111; N=32 H=343 8 x 2 (44) > 65, 4 x 2
# (88) 56-64; N=24 H=423 12 x 2 (28) 75, 6 x 2 (56) 62-72; GRU N=24 H=423 69 against 45-52 at 56-84
# tiles; N=130 H=292 10 x 2 184, 5 x 2 171; no change at N=64 H=256, N=256 H=512 (ties: taller).
# tvmrnn-tune's search there found the same (LSTM N=24 H=423: 3 x 4, 56 tiles, 84 -> 56 us). In
# whole training passes on that Xeon (v83, notes/bench/v83/xeon_tasks.txt, a process a side, two
# rounds, T=100): LSTM N=24 I=161 H=423 26.1 / 24.5 -> 23.5 / 22.4 ms, but N=48 I=256 H=423 (56
# tall tiles) 32.4 / 35.6 -> 36.0 / 39.9; so only where the tall tile leaves fewer than
# CPU_STEP_TASKS_PER_CORE tiles a core. On 2 cores the tiles stay the tall ones but for a few
# small batches.
CPU_STEP_TILES_BY_CORES = True
CPU_STEP_TASKS_PER_CORE = 3


def step_tile(lanes: int, columns: int, rows: int, lead_tile: int, accumulators: int = 24,
              cores: int | None = None, busy: int = 8, problems: int = 1) -> tuple[int, int]:
    """A fused step's register tile over plain columns: ``(column tile in floats, accumulators)``
    for :func:`tile_rows`. Of ``lead_tile`` and the narrower whole-vector tiles down to 2 vectors
    (dividing ``columns``), the one whose tile holds the most accumulators, ties to the narrower
    (taller) one (:data:`CPU_TALL_STEP_TILES`); then, for ``cores`` cores where that tile leaves
    fewer than :data:`CPU_STEP_TASKS_PER_CORE` tiles a core, its rows as
    :data:`CPU_STEP_TILES_BY_CORES` says (``busy``: the device model's ``busy_accumulators``;
    ``problems``: the step's leading axes, a stacked step's directions, each as many tiles).
    ``accumulators`` is a cap here: tuning's knob of that name (AUTO ``column_vectors``) gives the
    most this rule may use."""
    def fill(tile, acc):
        return tile_rows(rows, tile, lanes, acc) * (tile // lanes)

    def tasks(tile, acc):
        return problems * (columns // tile) * (rows // tile_rows(rows, tile, lanes, acc))
    if CPU_TALL_STEP_TILES:
        candidates = [lead_tile] + [v * lanes for v in range(2, lead_tile // lanes) if columns % (v * lanes) == 0]
        lead_tile = max(candidates, key=lambda tile: (fill(tile, accumulators), -tile))
    if not cores or not CPU_STEP_TILES_BY_CORES or tasks(lead_tile, accumulators) >= CPU_STEP_TASKS_PER_CORE * cores:
        return lead_tile, accumulators
    options = [accumulators] + [a for a in range(accumulators - 1, 0, -1) if fill(lead_tile, a) >= busy]

    def cost(acc):  # the busiest core's work; then tiles enough for the cores; then the taller tile
        return (-(-tasks(lead_tile, acc) // cores) * max(fill(lead_tile, acc), busy),
                -min(tasks(lead_tile, acc), CPU_STEP_TASKS_PER_CORE * cores), -fill(lead_tile, acc))
    return lead_tile, min(options, key=cost)


def cpu_gemm(sch, kernel: Kernel, target, accumulators: int = 24, column_vectors: int | None = None,
             row_block: int | None = None, red_block: int | None = None, guarded_vectors: int | None = None) -> None:
    """Register-blocked GEMM (see the module docstring) on the kernel's reduction block.

    ``accumulators``: vector registers the output tile may use (of AVX-512's 32 or AVX2's 16,
    the rest hold the broadcast inputs and streamed operand); ``column_vectors``: widest tile
    along the columns, in vectors (default 4; on AVX2, 2 where that is a whole number of units).
    ``row_block`` and ``red_block`` block for L1 (BLIS's loop order): a parallel task takes
    ``row_block`` register tiles down the last row axis, and runs the reduction (its axes fused)
    in slices of ``red_block`` outside them, so that one slice of the streamed operand serves
    every tile of the block from L1, their partial sums waiting in the block's output buffer.
    Default: :func:`l1_blocks`. ``guarded_vectors``: the vectors of a guarded tile where the GEMM
    has no fused epilogue (:func:`guarded_tile_units`; None: its rule, 1: one vector).
    """
    lanes = vector_lanes(target)
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
    fused_epilogue = len(sch.get_loops(epilogues[0])) < len(spatial) or len(epilogues) > 1
    # a guarded tile: one whole vector, the last tile cut at the columns' end (see CPU_GUARDED_TILES);
    # without a fused epilogue, several (guarded_tile_units), also where one vector divides the columns
    guarded = ((CPU_GUARDED_STEP_TILES or not fused_epilogue) and column_vectors is None
               and guarded_tile(lanes, col_extents[0], inner, lead_tile))
    wide = 0
    if not fused_epilogue and column_vectors is None and _widens(kernel, lanes, col_extents[0], inner, lead_tile):
        wide = guarded_tile_units(lanes, col_extents[0], inner, device_model(target).cores, guarded_vectors)
    if guarded or wide:
        guarded, lead_tile = True, wide or lanes // inner
    if fused_epilogue and column_vectors is None and not guarded and inner == 1 and lanes >= 16 and row_extents:
        # a step over plain columns (the backward's): tall tiles, enough of them for the cores
        model = device_model(target)
        lead_tile, accumulators = step_tile(lanes, col_extents[0], row_extents[-1], lead_tile, accumulators,
                                            model.cores, model.busy_accumulators, math.prod(row_extents[:-1]))
    width = lead_tile * inner
    rows = tile_rows(row_extents[-1], width, lanes, accumulators) if row_extents else 1

    if fused_epilogue:
        # the tile in units: gate-blocked columns (p, g, u) take lead_tile panels of u units each
        units = lead_tile * (col_extents[-1] if kernel.columns[-1] == "u" else 1)
        _tile_from_outputs(sch, gemm, epilogues[0], units, rows, lanes, bool(guarded))
        return
    if CPU_FUSED_ROW_TILES and len(row_loops) > kernel.batch + 1:
        # rows over several axes (an all-steps GEMM's steps x batch rows): a tile down the last
        # alone has at most that axis' rows, one at a batch of 1 (each weight vector loaded for
        # one row's multiply-adds); down the fused rows it takes the rows of several steps. Whole
        # steps a tile: a tile that ended inside a step would have its epilogue computed over the
        # steps' bounding box, rows of other tiles included, read and written early (wrong where
        # the epilogue reads the buffer it writes: the second direction's input gradient adds to
        # the first's, dx = acc + matmul in one buffer)
        # Leading batch axes (a stacked GEMM's directions, ``kernel.batch``) stay out: their
        # problems are not rows of one GEMM
        lead, own = row_loops[:kernel.batch], row_loops[kernel.batch:]
        total = math.prod(row_extents[kernel.batch:])
        fused = tile_rows(total, width, lanes, accumulators, multiple_of=row_extents[-1])
        if fused > rows:
            row_loops, row_extents, rows = [*lead, sch.fuse(*own)], [*row_extents[:kernel.batch], total], fused
    # a row count with no divisor near the tile's (K = 37, 129, 343: the weight gradients' rows):
    # the tallest tile, the last one guarded and peeled (CPU_GUARDED_ROWS). One row axis of the
    # GEMM's own, not fused steps x rows (a tile must hold whole steps: see above)
    cap = max(1, (min(accumulators, 12) if lanes == 8 else accumulators) // -(-width // lanes))
    # a weight gradient in panels (p, k, u, g): its rows are K of each panel p, whose tiles then
    # run in turn in the panel's task (CPU_GUARDED_PANEL_ROWS)
    # (not with the inputs in row panels, whose tile is the panel's rows; and a task a core at least)
    panel_rows = (CPU_GUARDED_PANEL_ROWS and re.match(r"weight_gradient_panels_p\d+_t", kernel.name) is not None
                  and len(row_loops) == len(spatial) - ncols == 2 and not guarded
                  and row_extents[0] * -(-col_extents[0] // lead_tile) >= (device_model(target).cores or 1))
    short = (CPU_GUARDED_ROWS and (len(row_loops) == len(spatial) - ncols == 1 or panel_rows)
             and column_vectors is None and rows * 2 <= cap < row_extents[-1]
             and (not guarded or -(-col_extents[0] // lead_tile) >= 2 * (device_model(target).cores or 1)))
    if row_block is None and red_block is None and not (short and CPU_GUARDED_ROWS_UNBLOCKED):
        row_block, red_block = l1_blocks(kernel)
    row_block = _divisor(row_extents[-1] // rows, row_block or 1) if row_extents else 1
    guarded_rows = 0
    if short and row_block == 1:
        rows = guarded_rows = cap
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
    if guarded_rows and panel_rows:  # the panels in parallel, each running its row tiles in turn
        tile = sch.fuse(col_outer, outer[0])
        sch.annotate(outer[-1], "pragma_loop_partition_hint", 1)
    elif guarded_rows and guarded:  # the column tiles in parallel, each running its row tiles in turn
        tile = col_outer
        sch.annotate(outer[-1], "pragma_loop_partition_hint", 1)  # (the tile's hint: below)
    elif guarded_rows:  # rows outermost: the last row tile is the parallel loop's last tiles
        sch.reorder(*outer, col_outer)
        tile = sch.fuse(*outer, col_outer)
    else:
        tile = sch.fuse(col_outer, *outer)
    sch.parallel(tile)
    sch.unroll(row_inner)
    vector = sch.fuse(col_inner, *col_loops[1:])
    # TIR's LoopPartition peels the last tile off (the tile loop's hint), then cuts its rows or its
    # vector to the remainder (theirs)
    for loop, hint in ((tile, guarded or guarded_rows), (row_inner, guarded_rows)):
        if hint:
            sch.annotate(loop, "pragma_loop_partition_hint", 1)
    _vectorize(sch, vector, lanes, partition_hint=bool(guarded))
    sch.decompose_reduction(gemm, reduction[0])
    for consumer in epilogues:  # the epilogue on the tile, vectorised along its columns
        sch.reverse_compute_at(consumer, tile, preserve_unit_loops=True)
        _vectorize_trailing(sch, sch.get_loops(consumer)[1:], width, lanes, partition_hint=bool(guarded))
    if LOCAL_PROJECTION_TILE and kernel.name.startswith("input_projection") and width % lanes == 0:
        # the task's tile on its stack: global, a kernel the passes call has the whole chunk's
        # buffer hoisted to the caller and its partial sums go through memory (v44: LSTM T=80
        # N=160 H=384 inference 8% faster on a 2-core SPR VM). Whole vectors only: a local tile of
        # odd-width vectors (rnn_tanh H=37: 37 lanes) gave NaN in the 1-step chunk's kernel
        # called as a function (LLVM's alloca of <37 x float>; not pinned down, v44)
        sch.set_scope(gemm, 0, "local")


# Whether cpu_gemm's default tile, where no whole number of vectors divides the columns
# (cpu_column_tile's fallback: 3 floats for the backward's data GEMMs at H = 129, one odd
# 37-float vector at a prime H = 37), is one whole vector instead, the columns split by it without
# dividing them. The split's predicate masks the last tile's columns past the end, and TIR's
# LoopPartition (``pragma_loop_partition_hint`` on the parallel tile loop and on the vector loops)
# peels that tile off: every other tile runs unguarded whole vectors and the last one a vector of the
# remainder (129 = 8 x 16 + 1). For plain columns and for gates that divide the lanes (the LSTM's 4;
# not the GRU's 3), two vectors or more (one and a tail would be two one-tile parts, run by one
# thread), where no tile was asked for (``column_vectors``); fused steps too
# (CPU_GUARDED_STEP_TILES). The same bits (the reduction's order is unchanged). notes/performance.md
# v70, 2 threads, old -> new: a 2-core Zen 4: LSTM T=50 N=13 I=H=129 inference 1.57 -> 1.22-1.33 ms,
# training 6.4 -> 4.0-4.3 (its backward step 31 -> 11 us, 16-step input gradient 487 -> 127); RNN
# N=3 H=129 0.35 -> 0.16, 1.20 -> 0.52; RNN N=8 H=100 0.77 -> 0.59 training; H = 37 (a 37-float
# vector before): RNN N=4 0.19 -> 0.09, 0.47 -> 0.27, LSTM N=2 training 0.43-0.53 -> 0.32-0.33, GRU
# N=5 0.82 -> 0.69. The H200 machine's Xeon: LSTM H=129 2.74 -> 2.25 ms, 14.0 -> 7.9.
CPU_GUARDED_TILES = True

# Vectors of a guarded tile (CPU_GUARDED_TILES) in a GEMM without a fused epilogue and not a step
# kernel (the backward's weight and input gradients, the GRU's plain input projections, dh0's
# GEMM, at an H that no whole vector of units divides: every odd H; and
# where one whole vector divides the columns and no wider tile does, an LSTM's weight gradients at
# H = 4 x odd, whose tile was 24 rows x one unguarded vector), at least (``guarded_tile_units``;
# 1: as before v79). A register tile of 24 rows x one vector loads 25 operands for 24
# multiply-adds; 12 rows x 2 vectors, 14. On a 2-core Zen 5 dev VM, kernels alone, medians of 7
# interleaved rounds (notes/performance.md v79, notes/bench/v79/vm_guarded_wide_tiles.txt), LSTM
# one vector -> two: 16-step weight gradients dW_hh N=20 H=467 1,617 -> 1,192 us, N=24 H=423
# 1,608 -> 1,270, N=48 H=423 3,384 -> 2,212, N=64 H=373 3,829 -> 2,381, N=100 H=423 8,025 ->
# 4,935; 64-step N=5 H=1471 21.4 -> 12.9 ms, N=8 H=883 12.2 -> 6.9; input gradients 13-23% faster
# (N=129 I=161 H=292 4,486 -> 3,445 us); at H = 4 x odd (one vector before) N=129 H=292 3,797 ->
# 3,095, N=100 H=236 1,857 -> 1,516, N=57 H=292 1,661 -> 1,412, small sizes (N=1-20, H=68-124)
# the same or 5-18% faster. An Elman RNN's dW_hh N=24 H=423 363 -> 298 us (input gradient at N=64
# H=208 195 -> 166). GRU, 5 units (15 floats) -> 16 units (3
# vectors): dW_hh N=20 H=467 1,305 -> 905 us, N=64 H=373 3,019 -> 1,812, N=130 H=292 4,223 ->
# 2,235, N=100 H=236 1,941 -> 1,125, N=57 H=151 367 -> 291; 64-step N=5 H=1471 17.4 -> 9.4 ms;
# its input projection at H=467 (no panels: a plain GEMM) 1,239 -> 966 us. Three LSTM vectors:
# mixed (N=24 H=423 dW_hh 1,770 us). Not for a step kernel (an Elman RNN's backward step has no
# fused epilogue): a partition hint on its parallel loop would cost its time loop the single
# parallel region (tvmrnn.program.sequence.Program._region_loop), a region launch a step.
CPU_GUARDED_TILE_VECTORS = 2
# Whether AVX2 (8 lanes) takes those tiles too (since v81; v79 had left it at one vector: a 16-step
# LSTM dW_ih at I=161 H=423 1,229 -> 1,957 us, a kernel still slower so, 1,258 -> 1,740, but the
# passes are faster). AVX2 code (znver3) on a 2-core Zen 5, 2 threads, one process, interleaved, the
# same bits, training ms (notes/performance.md v81), the GRU's alone first: GRU T=50 N=32 I=512
# H=343 62.0 -> 51.8, N=57 I=40 H=206 2 layers 65.1 -> 56.3, T=100 N=20 I=H=467 120.1 -> 79.0, N=8
# I=H=75 1.28 -> 1.08; then every cell's, LSTM T=50 N=24 I=161 H=423 56.9 -> 50.2, N=57 I=40 H=206 2
# layers 67.0 -> 52.4, T=100 N=20 I=H=467 141.9 -> 102.7; inference the same.
CPU_WIDE_GUARDED_TILES_AVX2 = True
# the most vectors such a tile may take (a custom cell of 5 gates would need 5 for whole vectors)
CPU_GUARDED_TILE_MAX_VECTORS = 4


def guarded_tile_units(lanes: int, lead: int, inner: int, cores: int | None, vectors: int | None = None) -> int:
    """Steps of the leading column axis (units) in :func:`cpu_gemm`'s guarded tile (see
    :data:`CPU_GUARDED_TILES`; or a tile of one whole vector that no wider one divides, guarded
    instead) of a GEMM without a fused epilogue, whose columns are ``lead`` steps
    of ``inner`` elements (the gates): the fewest units that fill whole vectors, times what it
    takes to reach :data:`CPU_GUARDED_TILE_VECTORS` vectors (an LSTM's 4 gates: 8 units, 2
    vectors; an Elman RNN's plain columns: 32; a GRU's 3 gates: 16 units, 3 vectors; on AVX2 4, 16
    and 8: :data:`CPU_WIDE_GUARDED_TILES_AVX2`), where that leaves two column tiles or more a core (``cores``: the parallel loop is
    the column tiles where the rows are guarded too, :data:`CPU_GUARDED_ROWS`; at H = 236 an
    AVX-512 LSTM's 944 columns make 30 tiles of two vectors, too few for 16 cores) and takes at most
    :data:`CPU_GUARDED_TILE_MAX_VECTORS`. 0: none of that (the caller's one guarded vector).
    ``vectors`` (the ``guarded_vectors`` knob, a tuning candidate's): that many instead of the
    rule's, on any vector width and tile count, the tile still of at least two and at most
    :data:`CPU_GUARDED_TILE_MAX_VECTORS` whole vectors and two tiles or more (else 0)."""
    asked = vectors is not None
    vectors = CPU_GUARDED_TILE_VECTORS if vectors is None else vectors
    if vectors <= 1 or (lanes < 16 and not asked and not CPU_WIDE_GUARDED_TILES_AVX2):
        return 0
    whole = lanes // math.gcd(lanes, inner)  # the fewest units in whole vectors
    units = whole * max(1, vectors // (inner // math.gcd(lanes, inner)))
    if units * inner // lanes > CPU_GUARDED_TILE_MAX_VECTORS or units >= lead \
            or (not asked and -(-lead // units) < 2 * (cores or 1)):
        return 0
    return units


def guarded_gemm(kernel: Kernel, target) -> bool:
    """Whether ``guarded_vectors`` decides the width of :func:`cpu_gemm`'s default tile of
    ``kernel`` (a GEMM without a fused epilogue) on ``target``: its columns take a guarded tile
    (:data:`CPU_GUARDED_TILES`: no whole number of vectors divides them) or a tile of one whole
    vector that no wider one divides (an LSTM's weight gradients at H = 4 x odd), the cases
    :func:`guarded_tile_units` widens; not a step kernel (:func:`tvmrnn.kernels.is_step`: see
    :data:`CPU_GUARDED_TILE_VECTORS`)."""
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    spatial, _ = _gemm_axes(sch, sch.get_sblock(kernel.gemm))
    lead, *rest = [_extent(sch, l) for l in spatial[len(spatial) - len(kernel.columns):]]
    lanes, inner = vector_lanes(target), math.prod(rest)
    return _widens(kernel, lanes, lead, inner, cpu_column_tile(lanes, lead, inner))


def _widens(kernel: Kernel, lanes: int, lead: int, inner: int, tile: int) -> bool:
    """Whether :func:`guarded_tile_units` may widen the default column tile (``tile`` units of
    ``inner`` elements, of ``lead`` units) of ``kernel``, a GEMM without a fused epilogue: a guarded
    tile, or one whole vector of columns that span two vectors or more; not a step kernel."""
    return not is_step(kernel) and (guarded_tile(lanes, lead, inner, tile)
                                    or (tile * inner == lanes and lead * inner >= 2 * lanes))


# Whether cpu_gemm's default register tile, where its one row axis has no divisor near the tile's
# rows (tile_rows at most half of what the accumulators hold: K = 37 or 129, the weight gradients'
# rows), is as tall as they allow instead, the rows split by it without dividing them and the last
# tile peeled by LoopPartition as CPU_GUARDED_TILES' columns. Where the columns are guarded too, the
# column tiles are the parallel loop and each runs its row tiles in turn (the two guards cannot
# share one fused loop), so only where there are two column tiles or more a core. The same bits.
# v70, 2-core Zen 4, 2 threads, training, old -> new: LSTM T=50 N=13 I=H=129 4.0-4.3 -> 3.5 ms,
# GRU N=13 H=129 4.2 -> 3.8, RNN N=3 H=129 0.49 -> 0.45, LSTM N=2 H=37 0.41-0.44 -> 0.39;
# inference unchanged (no forward GEMM takes it).
CPU_GUARDED_ROWS = True
# Whether such a GEMM leaves L1_BLOCKS' blocking (a block of ``row_block`` register tiles) out where
# its rows take guarded tiles: a block of the short tiles' rows (the divisor of K near 8: 7 at K =
# 343) had kept the guarded rows off, the tile one row tall. AVX2 code (znver3) on a 2-core Zen 5,
# the LSTM's 16-step dW_hh at N=32 H=343 alone: 5,010 us blocked, 2,111-2,139 unblocked (what
# tvmrnn-tune found: row_block 1-2, the reduction whole or in 256s; notes/performance.md v82).
# Where the guarded rows applied before (row_block came out 1: AVX-512 at K = 37, 129, 257) the
# reduction's blocks go too: the same time (0.98-1.01x alone, vm_avx512_unblocked_ab.txt).
CPU_GUARDED_ROWS_UNBLOCKED = True
# Whether a weight gradient summed in gradient panels (``(H / u, K, u, G)``, :func:`gradient_panel`)
# takes such guarded rows too, where K has no divisor near its tile's rows (K = 161, 247): the
# panels are the parallel loop, each task running its K's tiles in turn, the last peeled. Before, a
# tile one row tall (4 vectors of the panel loaded for 4 multiply-adds). Only where there are as many
# panels as cores (16 cores: H >= 241 with 16-unit panels); not where the inputs come in row
# panels (``input_rows``: the tile is a panel's rows). Measured on 2 cores only (v89).
CPU_GUARDED_PANEL_ROWS = True

# Whether a CPU's gate-blocked weight panels may leave the last one padded: where no panel of 2-4
# whole vectors of units divides H (an AVX-512 LSTM at H = 124, 151, 292, 467, 883), panels of
# the 2-4 vectors that pad H least (at most an eighth more units), the padding's weights and biases
# zero; the forward GEMMs compute the padded units, the gate math runs on the H real ones (the
# fused step's last tile peeled), and the recurrent reduction is over H (Layout.packed_units,
# Config.packed_units). Before, such an H took panels of one vector (H = 4 x odd) or one guarded
# vector: a register tile of 24 rows x 1 vector. notes/performance.md v75. The GRU's 3 gates since
# v80 (16-unit panels, 3 vectors; before, 5-unit tiles of 15 floats or one guarded vector at any H
# but a multiple of 16): a 2-core Zen 5, 2 threads, one process, interleaved, inference / training
# ms, old -> new: T=100 N=20 H=467 15.5 / 48.4 -> 11.9 / 46.2, N=1 H=1082 19.0 / 40.4 -> 8.8 /
# 28.9, N=64 H=373 31.8 / 100.0 -> 23.9 / 93.4, N=13 H=129 1.60 / 6.27 -> 1.02 / 4.45, N=57 I=161
# H=645 55.8 / 204 -> 41.8 / 189; one loss: N=129 I=161 H=292 training 106 -> 112 (its rows 130 ->
# 129, padded_batch: the input gradient's row tile at 129 rows is 3, 1.26 -> 2.55 ms a chunk).
CPU_PADDED_PANELS = True
# The same below AVX-512 (8 lanes: AVX2 and generic x86-64 targets), since v81: 2 vectors (the LSTM's
# 4 units) or 3 (the GRU's 8). Before, an AVX2 LSTM at H = 2 x odd took 2-unit panels (one-vector
# tiles) and the GRU none unless 8 divided H. AVX2 code (znver3) on a 2-core Zen 5, 2 threads, one
# process, interleaved, the same bits, off -> on, inference / training ms (notes/performance.md
# v81): LSTM T=50 N=57 I=40 H=206 2 layers 30.3 / 100.8 -> 14.7 / 64.9; GRU N=32 I=512 H=343
# 26.6 / 71.9 -> 10.7 / 53.0; LSTM the same 26.6 / 75.4 -> 17.0 / 64.3; GRU N=100 I=192 H=190 24.8 /
# 65.2 -> 8.9 / 49.8; LSTM N=20 I=H=467 36.6 / 133.1 -> 29.2 / 124.7. Not run on an AVX2-only CPU.
CPU_PADDED_PANELS_AVX2 = True

# Whether the backward's copies of the weights take padded panels too (:func:`backward_panel`),
# where no panel of 2-4 whole vectors divides their K inputs (AVX-512: K = 1220, 467, 883...):
# the backward step's GEMM onto dh runs over the padded K (zero weights), its gate math over the
# real units; dh0's and the input gradients' GEMMs write the real K alone. Before, such a copy was
# PyTorch's (G, H, K), a tile's reduction walking rows K floats apart: the backward step at N = 1,
# H = 1220 513 us against 233 at H = 1216 in panels (a 2-core Zen 5, notes/performance.md v76, v77).
CPU_PADDED_BACKWARD_PANELS = True

# Whether the weight gradients are summed in the forward weights' padded panels too (where the
# panel does not divide H, CPU_PADDED_PANELS; :func:`gradient_panel`): each chunk's gate gradients
# packed into panels whose last one is padded with zeros, the sums over its padded units wasted
# (at most 1/8 more: _padded_panel). Before, such an H summed them in rows (K, H, G).
CPU_PADDED_GRADIENT_PANELS = True

# Whether CPU_GUARDED_TILES applies also where the gates do not divide the lanes (the GRU's 3 on
# AVX-512 and AVX2): the tile is then lanes // gates units, one partial vector (15 floats on AVX-512,
# 6 on AVX2), the last tile peeled, where the old tile was 12 floats or fewer (a GRU H with no
# divisor of 5 units: prime H, 4 x odd). On a 2-core Zen 5 dev VM, 2 threads, T=50, off -> on
# (notes/performance.md v75): GRU N=57 H=151 inference 11.1 -> 3.4-3.8 ms, training 26.5 -> 9.9-10.9;
# N=5 H=506 7.5 -> 3.9, 20.9 -> 13.3; N=64 H=101 6.1 -> 2.8, 15.4 -> 8.1; N=20 H=232 3.3 -> 2.4,
# 7.8 -> 7.2; N=13 H=124 2 layers the same (1.10 / 3.06 -> 1.07 / 3.16); AVX2 code (znver3) on the
# same VM: N=57 H=151 19.4 -> 9.1, 47.2 -> 26.3; N=20 H=75 2 layers 2.75 -> 1.64. The same results.
CPU_GUARDED_GATE_TILES = True

# Whether CPU_GUARDED_TILES applies also to the GEMMs tiled from a fused step's outputs
CPU_GUARDED_STEP_TILES = True

# A partial tile fuller than this fraction of a vector is kept (not CPU_GUARDED_TILES'): the peeled
# last tile is a second parallel loop (a second launch a call), which did not pay back against a
# 15-float tile (the GRU at H = 300: its backward's 300 plain columns; training 1-6% slower, 3 rounds)
CPU_GUARDED_TILE_MAX_FILL = 0.75


# Whether cpu_gemm tiles the fused row axes (whole steps a tile) where that gives a taller register
# tile than the last row axis alone: an all-steps GEMM of a batch of 1 had a one-row tile. On a
# 2-core Zen 5 (v66), a 16-step input projection at N = 1, K = H = 512, alone: 561 -> 153 us; the
# LSTM's whole passes at T = 300, N = 1, I = H = 512: inference 11.8 -> 8.0 ms, training 28.8 ->
# 23.8 (the GRU 8.3 -> 6.1, 21.9 -> 17.1); N = 3: 4-5%; N = 20: the same tiles. A switch for A/B
# comparisons in one process (notes/bench/v66/fused_rows_ab_zen5.txt). Off in v66: a bidirectional
# GRU of one unit and one row gave the reverse direction's dh0 wrong at T = 1; that was LLVM's
# alias tags across inlined kernels (v67: tvmrnn.program.sequence.one_alias_root_per_tensor)
CPU_FUSED_ROW_TILES = True

# Whether the fp32 input projection's tile is the task's own (local scope; see ``cpu_gemm``): on
# since v44 (a switch for A/B comparisons in one process, as notes/bench/v44/ab_local_tile.py makes)
LOCAL_PROJECTION_TILE = True

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


def output_tiles(sch, gemm, output, unit_tile, rows, partition_hint: bool = False):
    """A fused epilogue: the outputs are ``(n, j)``, several sibling blocks in one nest (the gate
    math and its backward), and the forward step's read all gates of a unit (``gemm[n, j, 0:G]``),
    which ``reverse_compute_at`` cannot place; so the tile (``rows`` x ``unit_tile`` units, a
    parallel task each) is made on the output nest and the GEMM computed under it
    (``compute_at``) instead, the siblings staying in one loop body. Returns the tiles' loop, the
    leading (direction) loops and the tile's loop over its units."""
    *lead, n, j = sch.get_loops(output)  # lead: a direction axis (kernels.recurrent_step), if any
    partition_hint = partition_hint or _extent(sch, j) % unit_tile != 0  # (padded panels: the last tile peeled)
    j_outer, j_inner = sch.split(j, [None, unit_tile])
    n_outer, n_inner = sch.split(n, [None, rows])
    sch.reorder(j_outer, *lead, n_outer, n_inner, j_inner)
    tile = sch.fuse(j_outer, *lead, n_outer)
    sch.parallel(tile)
    if partition_hint:
        sch.annotate(tile, "pragma_loop_partition_hint", 1)
    sch.compute_at(gemm, tile, preserve_unit_loops=True)
    return tile, lead, j_inner, partition_hint


def _tile_from_outputs(sch, gemm, output, unit_tile, rows, lanes, guarded: bool = False):
    """:func:`output_tiles`, the GEMM's register tile under each (rows unrolled, columns vectorised)."""
    _, lead, j_inner, peeled = output_tiles(sch, gemm, output, unit_tile, rows, guarded)
    spatial, reduction = _gemm_axes(sch, gemm)
    gn, gj, *trailing = spatial[len(lead):]
    sch.reorder(*reduction, gn, gj, *trailing)
    sch.unroll(gn)
    vector = sch.fuse(gj, *trailing) if trailing else gj
    if guarded:  # the GEMM's columns guarded too (padded panels: only the gate math's units)
        sch.annotate(vector, "pragma_loop_partition_hint", 1)
    _vectorize(sch, vector, lanes)
    sch.decompose_reduction(gemm, reduction[0])
    _vectorize(sch, j_inner, lanes, partition_hint=peeled)  # (a tile of several vectors: each peeled)


# Whether cpu_transpose tiles transpositions whose axes no tile divides (H = 1471: the backward's
# packed weight gradients back to PyTorch's layout), the tiles past the ends predicated, and the
# forward's padded panels (a guarded load: zeros past the real units), the last panel cut off (v78).
CPU_GUARDED_TRANSPOSES = True


def cpu_transpose(sch, kernel: Kernel, target, row_tile: int = 32, column_tile: int = 16,
                  min_elements: int = 1 << 16) -> bool:
    """A CPU copy whose output's innermost axis strides through its input (a transposition: the
    backward's packed weight gradients back to PyTorch's ``(G, H, K)``, :func:`tvmrnn.kernels.gate_untranspose`)
    in tiles of ``row_tile`` x ``column_tile``: the output axis the input lays out most densely
    (its rows) by the innermost (columns, stored as whole vectors), so that each tile reads
    ``column_tile`` lines of the input and writes ``row_tile`` runs of the output, all in L1.
    Row by row, each output row read a line of the input per element and the lines fell out of
    L1 before the next row reused them: DS-size GRU (G = 3, H = K = 1024) 8.1 ms, tiled 0.85 ms
    (2 threads, notes/performance.md v45); PyTorch's ``(3, 1024, 1024)`` packed to ``(K, H, G)``
    10.3 -> 1.7 ms. False, with nothing changed, where the kernel is not one such copy or has
    fewer than ``min_elements`` (there a tile's parallel loop cost more than it saved: 1.4 -> 1.9 us
    at 8 K floats)."""
    copy = _one_copy(sch)
    if copy is None or (copy[3] and not CPU_GUARDED_TRANSPOSES):
        return False
    sblock, block, load, padded = copy  # (padded: kernels.gate_transpose's panels, zeros past the real units)
    loops = sch.get_loops(sblock)
    ivars = [iv.var for iv in block.iter_vars]
    if len(loops) != len(ivars) or len(ivars) < 2 or math.prod(_extent(sch, l) for l in loops) < min_elements:
        return False
    # the columns: the output's innermost axis, with the axes before it while they hold fewer than
    # a tile (the packed layouts end in the G gates: 3 or 4), the outermost of them split
    n = len(ivars)
    first = n - 1
    while first > 0 and math.prod(_extent(sch, loops[a]) for a in range(first, n)) < column_tile:
        first -= 1
    within = math.prod(_extent(sch, loops[a]) for a in range(first + 1, n))
    split = column_tile // within if column_tile % within == 0 else column_tile  # (3 gates: 16 units)
    guarded = False  # tiles past the ends (no tile divides an axis): predicated, the full ones cut off
    if _extent(sch, loops[first]) % split:
        if not (CPU_GUARDED_TRANSPOSES and first == n - 1):
            return False
        guarded = True
    # a transposition: the input's index the columns' axes move is not its last
    where = [i for i, index in enumerate(load.indices) if any(_uses(index, ivars[a]) for a in range(first, n))]
    if not where or where[-1] == len(load.indices) - 1:
        return False
    # the rows: the longest other output axis found in the input's later (denser) indices
    later = load.indices[where[-1] + 1:]
    rows = [a for a in range(first) if any(_uses(index, ivars[a]) for index in later)]
    if not rows:
        return False
    row = max(rows, key=lambda a: _extent(sch, loops[a]))
    if _extent(sch, loops[row]) % row_tile:
        if not CPU_GUARDED_TRANSPOSES:
            return False
        guarded = True
    ro, ri = sch.split(loops[row], [None, row_tile])
    co, ci = sch.split(loops[first], [None, split])
    others = [loops[a] for a in range(first) if a != row]
    sch.reorder(ro, co, *others, ri, ci, *loops[first + 1:])
    if padded:  # the panels' loop cut where the padding's guard holds (the last panel's), so that
        # the full ones index without min() and if_then_else: H = 1471 (16-unit panels) 5.2 -> 1.9 ms
        for loop in others:
            sch.annotate(loop, "pragma_loop_partition_hint", 1)
    if guarded:  # LoopPartition cuts the last row and column tiles off the full ones
        for loop in (ro, co):
            sch.annotate(loop, "pragma_loop_partition_hint", 1)
        sch.parallel(ro)  # (the tiles' rows in parallel; a fused loop would hide the edges)
    else:
        outer = sch.fuse(ro, co)
        if _extent(sch, outer) > 1:
            sch.parallel(outer)
    lanes = vector_lanes(target)
    if first == n - 1 and column_tile % lanes == 0:
        _vectorize(sch, ci, lanes)
    return True


# Whether a CPU copy along its innermost axis (the backward's weight panels, a chunk's staged
# operands, states in and out) runs that axis in whole vectors (cpu_copy). Before, every such copy
# took the generic schedule, one scalar loop over its fused axes: the LSTM's pack_weights at
# H = 800 6.6 ms, of which its two backward copies (kernels.weight_panels) 4.6 (2-core Zen 5,
# notes/performance.md v77).
CPU_VECTOR_COPIES = True


def cpu_copy(sch, kernel: Kernel, target, tasks_per_core: int = 4, min_elements: int = 1 << 12) -> bool:
    """A CPU copy (one block, its value a load, or a guarded load: ``if_then_else``) whose
    output's innermost axis is a whole number of vectors and is the innermost index of its input
    too: the other axes fused and split over the cores' tasks, the innermost in whole vectors (a
    guarded copy's outermost axis, the panels, outside them, in turn). False, with nothing changed, where the kernel is not one such copy or has fewer than
    ``min_elements``."""
    copy = _one_copy(sch) if CPU_VECTOR_COPIES else None
    if copy is None:
        return False
    sblock, block, value, guarded = copy
    loops = sch.get_loops(sblock)
    ivars = [iv.var for iv in block.iter_vars]
    lanes = vector_lanes(target)
    if (len(loops) != len(ivars) or len(ivars) < 2 or _extent(sch, loops[-1]) % lanes
            or math.prod(_extent(sch, l) for l in loops) < min_elements):
        return False
    inner = ivars[-1]
    # the innermost axis indexes the input's last index alone (contiguous there too)
    if not (_uses(value.indices[-1], inner) and not any(_uses(i, inner) for i in value.indices[:-1])):
        return False
    if guarded and len(loops) > 2:
        # the outermost axis in turn, LoopPartition cutting off where the guard holds throughout
        # (there the load is contiguous; vectorised under the guard throughout, LLVM's code was scalar: 3x slower)
        sch.annotate(loops[0], "pragma_loop_partition_hint", 1)
        loops = loops[1:]
    fused = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    workers = max(1, int(target.attrs.get("num-cores", 0) or 0)) * tasks_per_core
    if _extent(sch, fused) > 1:
        outer, _ = sch.split(fused, [min(workers, _extent(sch, fused)), None])
        sch.parallel(outer)
    _, vector = sch.split(loops[-1], [None, lanes])
    sch.vectorize(vector)
    return True


def _one_copy(sch):
    """``(block, its statement, the load it stores, guarded)`` where the kernel held by ``sch`` is
    one block storing one load, or one guarded load (``if_then_else``: a padded panel's, zeros past
    the real units; ``guarded`` True and the load its value); else None."""
    from tvm import tirx
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if len(blocks) != 1:
        return None
    block = sch.get(blocks[0])
    if not isinstance(block.body, tirx.BufferStore):
        return None
    value = block.body.value
    guarded = str(getattr(getattr(value, "op", None), "name", "")).endswith("if_then_else")
    if guarded:
        value = value.args[1]
    if not hasattr(value, "indices"):  # (a load is an ``ir.TensorLoad`` in this TVM: taken by its fields)
        return None
    return blocks[0], block, value, guarded


def is_transposition(kernel: Kernel, target) -> bool:
    """Whether :func:`cpu_transpose` schedules ``kernel`` (with its default tiles) on ``target``."""
    from tvm import s_tir
    if kernel.gemm is not None or is_gpu(target):
        return False
    try:
        return cpu_transpose(s_tir.Schedule(s_tir.renew_defs(kernel.func)), kernel, target)
    except s_tir.ScheduleError:
        return False
