"""Whole forward and backward passes of a multi-layer, possibly bidirectional RNN, as Programs.

Buffers (T is the run-time sequence length, LD = layers x directions, D*H = layer output width):

* ``x`` (T, N, I), ``y`` (T, N, D*H), or batch-first (N, T, ·): the user's arrays, used in place.
* ``gx`` (D', T, N, H, G): the input projections of all steps of the D' directions whose time
  loops run together (both, or one at a time; see below), a temporary; with CPU weight panels
  of u units gate-blocked, (D', T, N, H/u, G, u) (:func:`tvmrnn.kernels.gate_shape`). On CPUs
  (:func:`interleaved_projections`) it holds one chunk of steps, (D', 16, N, ...): each chunk's
  projection runs just before the chunk's steps (for direction 1, the chunk's times in reverse).
* training workspace, kept for the backward: every step's state in time order; ``cs`` (LD, T+1,
  N, H) for c, and for h: ``hs`` (D, T+1, N, H) for the last layer (the forward direction's h0
  sits at row 0, the reverse one's at row T), ``layer_out`` (L-1, T+2, N, D*H) for the inner
  layers, which is also what the layers above read (time t at row t+1; the forward direction's
  h0 in row 0, the reverse one's in row T+1): an inner layer's states are its outputs, kept once;
  ``saved`` (LD, T, N, H, S), the values the derivation keeps.
* ``dunit`` (D', T, N, H, P): in the backward of a cell with P per-unit parameters, each step's
  gradient of them per batch row, summed over steps and rows afterwards (a temporary).
* inference keeps no workspace: states ping-pong between two rows, layer outputs between two.

Time runs forwards for direction 0 and backwards for direction 1; step ``u`` of direction 1
is time ``T-1-u``. A bidirectional layer's two time loops run as one where
:func:`stack_directions` says so (GPUs): step ``u`` of both directions in one launch, the step
kernels with a leading direction axis (:func:`tvmrnn.kernels.recurrent_step`).

Launches per step: the forward, one (the fused step); the backward, one (``backward_step``: a
step's recurrent GEMM with the gate-math backward of the step before it as its epilogue; the
last step's gate math and the first step's GEMM run on their own). On GPUs given
``persistent_blocks``, each time loop is instead one launch of a persistent kernel
(:meth:`tvmrnn.program.sequence.Program.loop`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

from tvm import tirx

from .. import kernels
from ..cells.definition import Cell
from ..options import BuildOptions
from ..schedules.cpu import backward_panel, gradient_panel, input_panel, packed_units, padded_inputs, weight_panel
from ..schedules.common import _divisor, is_gpu
from ..cells.parameters import Layout
from ..device import dependent_launch, device_model, persistent_block_caps, shared_kernels
from .sequence import GpuKernels, Program, Stacked, Subroutines, _const

# The all-steps GEMMs (input projection, weight and input gradients) run over chunks of steps with
# static shapes: as many of the first size as fit, then the next... (``Program.chunked``). The chunk
# size changes no buffer, only the GEMMs' shapes. On the H100 a few large GEMMs beat many small ones
# (DS2 LSTM, inference / training: 16-step chunks 6.32 / 20.0 ms, one 300-step chunk 5.77 / 16.6 ms,
# the chunk_study script (at 34424c0); 256/32/4/1 5.89 / 17.9 ms in the v5 bench, another run); on the 16-core
# Xeon the 16-step chunks were faster (LSTM training 387 against 486 ms with 256/32/4/1; GRU
# inference 60 against 81 ms). The 4-step chunks cover the tail: a one-step weight gradient reads
# and writes all of dW for one step's work (LSTM: 893 us a step alone, 512 in a 4-step chunk, 295
# in a 16-step one, dev machine); the DS2 LSTM backward took 336-337 ms instead of 348-356 so.
# On GPUs, for batches of GPU_WIDE_CHUNK_BATCH rows or more, 128- and 64-step sizes cover
# sequences between the 256- and 32-step chunks with fewer, larger GEMMs (a 32-step chunk of 128
# rows a step ran at ~20 TFLOP/s on the H200, a 256-step one at 35-42): against (256, 32, 4, 1),
# inference / training, LSTM N=128 H=128 T=200 0.684 / 2.010 -> 0.656 / 1.906 ms, GRU the same
# 0.374 / 1.367 -> 0.342 / 1.200, LSTM N=64 H=1024 T=100 3.81 / 12.55 -> 3.83 / 12.21, for builds
# with two more sizes of each all-steps GEMM to compile (18 -> 27 s at N=64 H=1024;
# notes/performance.md v60). Fewer rows were not measured, and the shipped (DS2, N=20) records
# are for the four sizes: smaller batches keep them.
CHUNK_STEPS = (16, 4, 1)
# CPU batches of CPU_NARROW_CHUNK_BATCH rows or fewer take 64-step chunks first (at most 512 rows, as
# many as a 16-step chunk of 32): a chunk's weight gradient reads and writes all of dW, which at
# a few rows dominates its GEMM. On a 2-core Zen 5 dev VM, one process, interleaved, against (16,
# 4, 1), inference / training ms (notes/performance.md v75): LSTM T=125 N=1 I=1024 H=1220 2 layers
# 47.3 / 327.3 -> 44.3 / 294.8; T=300 N=1 H=512 8.09 / 22.6 -> 7.66 / 20.7; T=200 N=4 H=800 20.2 /
# 81.4 -> 21.3 / 71.6; N=8 H=512 15.3 / 54.7 -> 15.3 / 52.3; T=300 N=2 H=256 2 layers 3.74 / 12.9
# -> 3.80 / 12.1; GRU T=300 N=1 H=512 5.69 / 18.3 -> 5.70 / 16.7; but LSTM N=20 H=800 T=100 45.1 /
# 152.3 -> 43.8 / 157.8 (so 16 steps from 9 rows on). Not run on a Xeon.
CPU_NARROW_CHUNK_STEPS = (64, 16, 4, 1)
CPU_NARROW_CHUNK_BATCH = 8
# Whether a CPU backward of at most CPU_STAGED_WEIGHT_GRADIENT_ROWS rows sums the weight gradients
# of its tail (the T mod 64 steps after the whole 64-step chunks, in chunks of 16, 4 and 1) in one
# call, over a staged copy of those chunks' gate gradients, inputs and mask (zero past the tail; a
# span of the smallest chunk size that holds it), where the tail takes two chunks or more: each
# call reads and writes all of dW, which at a few rows costs more than its multiply-adds (an LSTM
# at N = 1, K = H = 1220 on a 2-core Zen 5: 1.99 ms for 1 step, 2.82 for 4, 2.94 for 16, 4.69 for 64;
# notes/performance.md v76, v77). Staged where the calls it saves cost more than the padding's
# rows: (calls - 1) x CPU_STAGED_PASS_ROWS > rows x (span - tail steps), a pass over dW costing
# about as much as CPU_STAGED_PASS_ROWS rows' multiply-adds (on that VM ~90 at N = 1, K = H =
# 1220, ~35 at N = 4, K = H = 800; the lower kept: LSTM T=100 N=4 I=H=800 staged into a 64-step
# span, 36 steps of them real, was 14% slower in training). The chunks' bias and input gradients
# stay as they were.
# Only where the recurrent weight's gradient has CPU_STAGED_MIN_BYTES or more (a smaller one stays
# in cache from call to call: and each staged chunk's copies are more kernels to compile).
CPU_STAGED_WEIGHT_GRADIENTS = True
CPU_STAGED_WEIGHT_GRADIENT_ROWS = 8
CPU_STAGED_PASS_ROWS = 32
CPU_STAGED_MIN_BYTES = 1 << 20
# Fewer rows take 16- and 8-step chunks too: the backward cannot cover its last steps with an
# overlapping chunk as the forward does (its weight gradients sum), and a 4-step chunk's GEMMs took
# 43-60% of a 32-step one's time at N = 12, H = 2048 (input gradient 156 against 367 us), so 16-
# and 8-step chunks cover 28 steps in 3 launches instead of 7. Against (256, 32, 4, 1), H200,
# one process, gradients compared (notes/performance.md v69): GRU N=12 H=2048 T=60 training
# 9.20 -> 7.87 ms (inference 3.02 -> 3.08), LSTM N=24 H=1280 T=120 12.37 -> 12.11, LSTM N=8
# H=320 T=90 with the changes below 1.10 -> 1.02; the Deep Speech 2 sizes within 1%.
GPU_CHUNK_STEPS = (256, 32, 16, 8, 4, 1)
GPU_WIDE_CHUNK_STEPS = (256, 128, 64, 32, 4, 1)
GPU_WIDE_CHUNK_BATCH = 64
# Batches of GPU_MID_CHUNK_BATCH to GPU_WIDE_CHUNK_BATCH rows take both: 128- and 64-step chunks
# (a 32-step chunk of 32 rows is a GEMM of 1,024 rows: the GRU's projection at H = 126 ran 15 us,
# ~9 TFLOP/s) and the 16- and 8-step ones of the backward's tail. On the H100 (v78,
# notes/bench/v78/ladder_ab.txt; one process, T = 200, 3 layers, interleaved) the GRU at N = 32,
# H = 126 took 0.797 -> 0.648 ms inference (0.99x -> 1.22x cuDNN), 2.810 -> 2.373 training; two
# more sizes of each all-steps GEMM to compile. Not measured at 16-31 rows. Builds whose shipped
# records hold the old 4-step ladder keep it (records.records_ladder: the Deep Speech 2 sizes).
GPU_MID_CHUNK_STEPS = (256, 128, 64, 32, 16, 8, 4, 1)
GPU_MID_CHUNK_BATCH = 16
# The ladder GPUs used for few rows up to v68, which whole-pass tuning still tries (fewer kernels
# to compile; the GRU above ran inference 2% faster with it).
GPU_SHORT_CHUNK_STEPS = (256, 32, 4, 1)
# GPU forwards cover the steps left after whole chunks with one more chunk of the same size,
# overlapping steps done before (``Program.chunked``'s ``tail_waste``), where the steps it computes
# twice hold at most this many multiply-adds (x2: FLOPs) in all: a few microseconds of work, about
# what each launch it saves costs a small GEMM (3.3 us a 4-step chunk at LSTM N = 1, H = 96 on the
# H200, notes/performance.md v45). At Deep Speech 2 sizes a step's projection is 51 M multiply-adds:
# no tails.
GPU_TAIL_FLOPS = 64 * 10**6
# ... or where the launches it saves are GEMMs too short to fill the GPU: an all-steps GEMM of
# fewer rows (chunk steps x batch rows) than this takes about as long as one of this many (GRU
# N = 12, H = 2048 on the H200: a 4-step chunk of 48 rows 227 us, a 32-step one of 384 rows 325 us;
# at 64 rows or fewer it took the per-step split-K schedule, whose scalar loads stream the weights
# slowly, until v69 lowered common.GPU_SPLIT_K_ROWS to 32; notes/performance.md v68). The tail is
# taken where it costs at most half the cover it replaces in those units (max(rows,
# GPU_GEMM_FULL_ROWS) a GEMM): at T = 60 the GRU's
# seven 4-step chunks after one of 32 become a second 32-step chunk. The Deep Speech 2 sizes
# (N = 20, T = 300) keep their cover (three 4-step chunks, 768 units, against 640 for a tail).
GPU_GEMM_FULL_ROWS = 256
# Whether a GPU backward covers its first direction's input gradients with the forward's tails too
# (a second cover of the steps after the weight gradients'; exact: the input gradient of the first
# direction writes dx, the second adds to it after). The weight gradients cannot take tails (they
# sum). Measured in v69 on the H200 against none: GRU N=12 H=2048 T=60 training 9.22 -> 8.50 ms
# (one 32-step input gradient instead of seven 4-step ones), LSTM N=8 H=320 T=90 1.09 -> 1.05,
# others within 1% (LSTM N=24 H=1280, the bidirectional DS2 LSTM).
GPU_INPUT_GRADIENT_TAILS = True


def tail_flops(target) -> int:
    """The FLOPs a forward's last chunk of projections may compute twice to save launches
    (:data:`GPU_TAIL_FLOPS` on GPUs; none on CPUs, whose kernels are function calls)."""
    return GPU_TAIL_FLOPS if target is not None and is_gpu(target) else 0


def tail_rows(target) -> int:
    """The rows below which a forward's all-steps GEMM costs about what one of that many rows does,
    for the overlapping tail's choice (:data:`GPU_GEMM_FULL_ROWS` on GPUs; 0, no such tails, on
    CPUs)."""
    return GPU_GEMM_FULL_ROWS if target is not None and is_gpu(target) else 0


# GPU builds: the step GEMMs' reduction over the state (the forward steps' S inputs, the backward
# steps' and recurrent_backward's H units) padded where S has no divisor near the slices split-K
# wants (kernels.recurrent_step's and kernels.backward_step's ``reduction``; step_reduction). Off
# until run on a GPU: written in v91 (no device time left) after the H100's LSTM N=2 H=947 took
# 135 us a forward step, 0.08x cuDNN (one slice: 947 is prime, 8 threads a block; padded to 960:
# 512 threads, and the backward's 32 -> 512; compiled, not run).
GPU_PADDED_REDUCTION = False
# ... where S's largest divisor up to 64 is below this, to the next multiple of 32
PADDED_REDUCTION_BELOW = 8
# ... in GEMMs of fewer rows than this (a step's batch; an input gradient's steps x batch): those
# of more may take TF32 tiles (allow_tf32, tensor_core_steps), whose template refuses the guarded
# product and left a GEMM of one thread an output (v91's review)
PADDED_REDUCTION_ROWS = 128


def step_reduction(target, config: "Config") -> int:
    """The forward steps' padded reduction on ``target`` (:data:`GPU_PADDED_REDUCTION`), or 0."""
    S = config.state_size
    if not (GPU_PADDED_REDUCTION and target is not None and is_gpu(target)) or config.options.dtype != "float32":
        return 0
    if config.rows >= PADDED_REDUCTION_ROWS or config.proj_size:  # (LSTMP: not tried)
        return 0
    if S <= 64 or _divisor(S, 64) >= PADDED_REDUCTION_BELOW:
        return 0
    return -(-S // 32) * 32


def chunk_steps(target, options: BuildOptions, batch: int = 1) -> tuple[int, ...]:
    """The chunk sizes the all-steps GEMMs use on ``target`` (a ``tvm.target.Target``, or None: CPU)
    for a build of ``batch`` rows."""
    if options.chunk_steps is not None:
        return options.chunk_steps
    if target is None or not is_gpu(target):
        return CPU_NARROW_CHUNK_STEPS if batch <= CPU_NARROW_CHUNK_BATCH else CHUNK_STEPS
    if batch >= GPU_WIDE_CHUNK_BATCH:
        return GPU_WIDE_CHUNK_STEPS
    return GPU_MID_CHUNK_STEPS if batch >= GPU_MID_CHUNK_BATCH else GPU_CHUNK_STEPS


@dataclass(frozen=True)
class Config:
    """Everything ``build`` fixes: the kernels depend on these, not on the sequence length."""

    cell: Cell
    input_size: int
    hidden_size: int
    num_layers: int
    bidirectional: bool
    batch_size: int
    batch_first: bool
    options: BuildOptions = field(default_factory=BuildOptions)
    # the batch rows the kernels are built for where more than batch_size (0: batch_size): a CPU
    # build pads a batch whose register tiles would be short (tvmrnn.schedules.cpu.padded_batch)
    compiled_rows: int = 0
    # an LSTM with projections (torch.nn's proj_size P < H): h_t = W_hr (o * tanh(c_t)) has P
    # features; each step is the recurrent step on a P-wide state, then the projection
    # (kernels.recurrent_step's state_size, kernels.projection_step). 0: none
    proj_size: int = 0
    # the units of the forward kernels' gate columns where a CPU build pads them to whole weight
    # panels (tvmrnn.schedules.cpu.weight_panel; Layout.packed_units); 0: hidden_size
    packed_units: int = 0
    # ((K, Kp), ...): the backward's copies of the weights with K inputs padded to Kp, where a CPU
    # build's backward panels do not divide K (tvmrnn.schedules.cpu.backward_panel; Layout.padded_inputs)
    padded_inputs: tuple[tuple[int, int], ...] = ()
    # a unidirectional stack's training passes run its layers as a wavefront of chunks of this many
    # steps (training_wavefront; build sets it), and its training workspace keeps
    # the last layer's states in ``layer_out`` with the others' (the stacked step reads every
    # layer's from one tensor): no ``hs``. 0: layer after layer
    wave_steps: int = 0

    @property
    def state_size(self) -> int:
        """Features of the hidden state h (and of each direction's output): ``proj_size`` where
        the LSTM has projections, else ``hidden_size``."""
        return self.proj_size or self.hidden_size

    @property
    def rows(self) -> int:
        """The batch rows the kernels and the passes' arrays have: ``batch_size`` (the largest batch
        a call may pass), or ``compiled_rows`` where the build pads it."""
        return self.compiled_rows or self.batch_size

    @property
    def num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    @functools.cached_property  # (a drop-in asks at every call: building it took ~0.1 ms)
    def layout(self) -> Layout:
        return Layout.create(self.input_size, self.hidden_size, self.num_layers,
                             self.num_directions, self.cell.num_gates, self.cell.unit_params, self.proj_size,
                             self.packed_units, self.padded_inputs)

    @property
    def num_saved(self) -> int:
        if self.cell.num_saved is not None:  # always, for cells made by define_cell or loaded
            return self.cell.num_saved
        return len(kernels.derivation(self.cell).saved)

    def seq_shape(self, T, features):
        return (self.rows, T, features) if self.batch_first else (T, self.rows, features)

    @property
    def seq_axes(self):
        return ("n", "t", "k") if self.batch_first else ("t", "n", "k")

    def workspace_shapes(self, T) -> dict:
        """Shapes of the training workspace arrays (beside the input x, which it also keeps)."""
        L, LD, N, H = self.num_layers, self.num_layers * self.num_directions, self.rows, self.hidden_size
        S = self.state_size
        shapes = {} if self.wavefront else {"hs": (self.num_directions, T + 1, N, S)}
        if self.cell.has_cell_state:
            shapes["cs"] = (LD, T + 1, N, H)
        if self.num_saved:
            shapes["saved"] = (LD, T, N, H, self.num_saved)
        if self.proj_size:  # each step's unprojected output r_t, for the gradient of W_hr
            shapes["rs"] = (LD, T, N, H)
        if L > 1:
            shapes["layer_out"] = (L if self.wavefront else L - 1, T + 2, N, self.num_directions * S)
        return shapes

    @property
    def unidirectional_stack(self) -> bool:
        """A unidirectional stack of 2 layers or more without projections: the configurations whose
        layers may run as a wavefront (:func:`layer_wavefront`)."""
        return self.num_directions == 1 and self.num_layers > 1 and not self.proj_size

    @property
    def wavefront(self) -> bool:
        """Whether the training passes run the layers as a wavefront, their workspace laid out
        for it (``wave_steps``, where it applies: :attr:`unidirectional_stack`)."""
        return bool(self.wave_steps) and self.unidirectional_stack


class TrainingStates:
    """Where the training workspace keeps layer l, direction d's h state of row ``row``, rows
    counted as in ``hs`` (T+1 of them; direction 0: h0 at row 0 and step t's state at t+1;
    direction 1: h0 at row T and step t's state at row t). See the module docstring. A wavefront's
    (``Config.wavefront``) last layer keeps them in ``layer_out`` as the inner layers do (there
    is no ``hs``; ``y`` holds its outputs too)."""

    def __init__(self, config: Config, hs, layer_out):
        self.last, self.H, self.hs, self.layer_out = config.num_layers - 1, config.state_size, hs, layer_out
        if config.wavefront:
            self.last = None

    def at(self, l, d, row, axes=("n", "j")):
        if l == self.last:
            return self.hs.at(*axes, ld=d, t=row)
        return self.layer_out.at(*axes, l=l, t=row + d, j=d * self.H)

    def layer_input(self, l, start):
        """Steps ``start``.. of the output of inner layer l (the input of layer l+1)."""
        return self.layer_out.at("t", "n", "j", l=l, t=start + 1)


def prev_row(d, s):
    """The training state row (``hs`` and ``cs`` rows) that direction d's step at time s reads."""
    return s if d == 0 else s + 1


def next_row(d, s):
    """The training state row that direction d's step at time s writes."""
    return s + 1 if d == 0 else s


def _time(config, T, d, u):
    return u if d == 0 else T - 1 - u


def kernel_sharing(target, options: BuildOptions) -> tuple:
    """How the passes embed their kernels: ``(view_pointers, subroutines)``.

    With ``options.shared_kernels`` each distinct kernel is compiled once for all of its call
    sites: on a GPU as a function launching it (:class:`sequence.GpuKernels`), its views as
    pointers the host computes, so that the launches of different layers and directions are one
    kernel; on a CPU as a function the passes call (:class:`sequence.Subroutines`, one table for
    all four passes), or, in a time loop that is one parallel region, a function of one tile of
    its parallel loop, which the loop calls. Without it every call site embeds its kernel."""
    if not shared_kernels(target, options):
        return False, None
    if target is not None and is_gpu(target):
        return True, GpuKernels(target, dependent_launch(target, options))
    return False, Subroutines()


def time_loop_regions(target, options: BuildOptions) -> bool:
    """Whether each time loop runs as one parallel region on ``target`` (a ``tvm.target.Target``,
    or None: CPU) instead of one per step (:meth:`sequence.Program._region_loop`):
    ``options.time_loop_regions`` on CPUs, yes where it is None; GPUs never (their loops are launches)."""
    if target is not None and is_gpu(target):
        return False
    return options.time_loop_regions is not False


def interleaved_projections(target, options: BuildOptions) -> bool:
    """Whether a forward pass on ``target`` (a ``tvm.target.Target``, or None: CPU) runs each
    chunk's input projection just before that chunk's steps, into a buffer of one chunk, rather
    than every step's projection before the time loop into a buffer of T steps: a DS2 LSTM's
    4 MB instead of 77 MB a direction, a 5-layer bidirectional one's 8 MB instead of 154 MB.
    CPUs do: on the GPU machine's Xeon (16 threads, the ``cpu_pass_study`` (a study script, at 34424c0), interleaved
    with PyTorch, notes/performance.md v26) the LSTM's inference took 58.7 / 59.4 / 62.5 / 94.8 ms
    projections first against 60.3 / 62.3 / 62.3 / 94.8 interleaved in four studies, its training
    220.6 / 221.4 against 213.2 / 221.3, the 5-layer bidirectional LSTM's 918 / 3,188 against 919 /
    2,891 ms, the GRU's and RNN-tanh's within 3%; longer chunks for it (32, 64 steps) gained
    nothing. The backward does the same with each chunk's gradients (:func:`backward_program`
    ``interleave``, v74). ``options.interleave_projections``: None (default: CPUs yes), or True / False
    (False: projections first, for comparisons). GPUs never by default: their forward time loop is one persistent kernel where the
    weights fit on chip, and the all-steps GEMM runs there in chunks of 256 steps."""
    if options.interleave_projections is not None:
        return options.interleave_projections
    return not (target is not None and is_gpu(target))


def packed_weight_gradients(target=None) -> bool:
    """Whether the backward sums weight gradients in the packed layout on ``target`` (a
    ``tvm.target.Target``, or None: CPU): CPUs do. On the GPU machine's Xeon the weight gradient
    of a 16-step LSTM chunk ran at 484 GFLOP/s into PyTorch's layout and 1,120 packed and blocked
    for L1 (16 threads; PyTorch's own GEMM 1,116), on one thread 49 against 94-116
    (notes/bench/wgrad_study_spr_v12.txt). GPUs keep PyTorch's layout (their GEMM schedule reads
    both operands through shared memory whatever the layout; not measured packed)."""
    return target is None or not is_gpu(target)


def loop_block_caps(config: Config, target) -> tuple[int, ...] | None:
    """The block counts ``config``'s persistent time loops try on ``target``
    (:func:`tvmrnn.device.persistent_block_caps`), for the directions one launch runs: both
    where they are stacked (:func:`stack_directions`). None: no persistent loops."""
    directions = config.num_directions if stack_directions(target, config.options) else 1
    return persistent_block_caps(target, config.options, config, directions)


def stack_directions(target, options: BuildOptions) -> bool:
    """Whether a bidirectional layer runs both directions in one launch per step on ``target``
    (a ``tvm.target.Target``, or None: CPU). ``options.stack_directions`` decides for
    every target where it is not None; else GPUs do, and CPUs with
    at least :data:`CPU_STACK_MIN_CORES` cores. On the H100 the two-direction LSTM step took
    17.7 us against 2 x 13.4 us (5-layer LSTM inference 1.06x -> 1.28-1.33x cuDNN). On the GPU
    machine's 16-core Xeon a bidirectional layer was faster so (LSTM inference 205 -> 189 ms,
    GRU 175 -> 146 ms, GRU training 602 -> 548 ms, LSTM training the same), on the 2-core dev
    machine 11-20% slower: each core then streams both directions' weights at every step, which
    fit in 16 cores' L2 (2 x 10 MB for the LSTM at H = 800) and not in 2 cores'."""
    if options.stack_directions is not None:
        return options.stack_directions
    if target is None:
        return False
    if is_gpu(target):
        return True
    return int(target.attrs.get("num-cores", 0) or 0) >= CPU_STACK_MIN_CORES


# CPU cores from which both directions share a launch (measured at 2, slower, and 16, faster).
CPU_STACK_MIN_CORES = 8


# A unidirectional stack's passes as a wavefront of its layers (``BuildOptions.layer_wavefront``):
# chunks of this many steps (even: a layer's state rows alternate with the step's parity, the
# same in every layer of a wave), layer l on chunk k while layer l+1 runs chunk k-1. Per wave, a
# projection launch per layer and one launch of every layer's steps; the first and last waves
# run fewer layers (L - 1 chunks of skew in all).
WAVE_STEPS = 64
# the share of the chip's shared memory (SMs x a block's) that all layers' recurrent weights may
# take for the wavefront to be the default: each layer's steps keep their weights on chip, and
# the stacked step runs every layer's blocks at once
WAVE_WEIGHT_SHARE = 0.5
# ... and the most multiply-adds a layer's step may have: a step with more keeps the GPU busy by
# itself, and the layers' steps in one launch share its blocks. On the H100 (v86, inference, one
# process, interleaved): GRU N = 128 H = 256 3 layers (25 M a step) 4.00 -> 3.20 ms with the
# wavefront, LSTM N = 256 H = 128 2 layers (17 M) 1.86 -> 1.64, LSTM N = 8 H = 455 (6.6 M) 2.50 ->
# 2.11, GRU N = 32 H = 126 3 layers (1.5 M) 2.55 -> 1.36; LSTM N = 64 H = 512 2 layers (67 M)
# 4.67 -> 6.42, slower
WAVE_MAX_STEP_WORK = 2**25


def layer_wavefront(config: Config, target, options: BuildOptions) -> bool:
    """Whether the inference forward runs its layers as a wavefront (:func:`_wavefront_forward`):
    unidirectional stacks of 2 layers or more without projections, where ``options.layer_wavefront``
    says so; where it is None, GPUs whose SMs' shared memory holds every layer's recurrent
    weights with room to spare (:data:`WAVE_WEIGHT_SHARE`), for steps too small to keep the GPU
    busy alone (:data:`WAVE_MAX_STEP_WORK`). A build with persistent forwards whose stacked
    steps would not all run persistent then takes the layers one after another
    (:func:`all_programs`). fp32 only (the wavefront's kernels are the fp32 ones: not
    ``bf16_projections``' packed pairs, nor half builds, which were not tried). The training
    passes follow: :func:`training_wavefront`."""
    if not _wavefront_applies(config, options):
        return False
    if options.layer_wavefront is not None:
        return options.layer_wavefront
    if target is None or not is_gpu(target):
        return False
    model = device_model(target)
    if not model.multiprocessors:
        return False
    G, H, S = config.cell.num_gates, config.hidden_size, config.state_size
    weights = 4 * G * H * S * config.num_layers
    return (weights <= WAVE_WEIGHT_SHARE * model.multiprocessors * model.shared_bytes_per_block
            and config.rows * G * H * S <= WAVE_MAX_STEP_WORK)


def training_wavefront(config: Config, target, options: BuildOptions) -> bool:
    """Whether the training passes (forward and backward, and their workspace's layout:
    ``Config.wave_steps``) run the layers as a wavefront too: where the inference forward does
    (:func:`layer_wavefront`: on GPUs by default, for stacks whose steps are small and whose weights
    fit the chip; elsewhere where ``options.layer_wavefront`` says so). On the H100 (v88, one
    process, interleaved, training passes against layer by layer): GRU N = 32 H = 126 3 layers
    8.08 -> 4.97 ms, LSTM the same 15.99 -> 12.05, GRU N = 128 H = 256 3 layers 11.50 -> 10.04;
    outputs and gradients the same as layer by layer's within 4e-7. Where the default's stacked
    training steps would not all run persistent, build takes the layers one after another
    (:func:`planned_programs`)."""
    return layer_wavefront(config, target, options)


def planned_programs(config: Config, schedule, target=None,
                     persistent_blocks: int | tuple[int, ...] | None = None) -> tuple[Config, tuple[Program, ...]]:
    """:func:`all_programs`, as build and the tuning tasks take them: ``(config, programs)``, the
    training passes a wavefront where ``config.wave_steps`` says so (by default where the
    inference forward is one: :func:`training_wavefront`), but not where that was the default
    and a stacked step of theirs that was to run persistent does not (a wave of launches a step):
    then the layers one after another (``wave_steps`` 0), as the inference forward's default does."""
    programs = all_programs(config, schedule, target, persistent_blocks)
    if not config.wave_steps or config.options.layer_wavefront is not None:
        return config, programs
    asked = config.options.persistent_passes
    if all(p.all_step_loops_persistent for p in programs if p.name in ("forward_train", "backward") and p.name in asked):
        return config, programs
    config = dataclasses.replace(config, wave_steps=0)
    return config, all_programs(config, schedule, target, persistent_blocks)


def _wavefront_applies(config: Config, options: BuildOptions) -> bool:
    """A unidirectional stack without projections, fp32 throughout."""
    return config.unidirectional_stack and options.dtype == "float32" and not options.bf16_projections


def _direction_groups(config: Config, stacked: bool) -> list[tuple[int, ...]]:
    """The directions whose time loops run together (one launch per step for each group)."""
    D = config.num_directions
    return [tuple(range(D))] if D > 1 and stacked else [(d,) for d in range(D)]


def _step_weights(config: Config, l: int, d: int) -> dict:
    """Where layer l, direction d's recurrent step finds its parameters in the packed buffer
    (offsets), by the step kernel's role: its weights, bias and, for cells with per-unit
    parameters, those."""
    layout = config.layout
    found = {"w": layout.packed_offset(layout.slot(l, d, "weight_hh")),
             "b": layout.packed_offset(layout.slot(l, d, "bias_hh"))}
    if config.cell.unit_params:
        found["unit"] = layout.unit_offset(l, d, packed=True)
    return found


def _step_states(config: Config, ld, rows, s, *, cs, mask, saved) -> dict:
    """A step's views beside its gates, weights and hidden states (every forward's, as
    :func:`tvmrnn.kernels.recurrent_step` names them): the cell state rows ``rows`` (read,
    written) of layer-direction ``ld`` where the cell has one, the mask of time ``s`` where
    lengths vary, and the training forward's saved values of time ``s`` (``saved`` None: inference)."""
    views = {}
    if cs is not None:
        views.update(c_prev=cs.at("n", "j", ld=ld, t=rows[0]), c=cs.at("n", "j", ld=ld, t=rows[1]))
    if mask is not None:
        views["mask"] = mask.at("n", t=s)
    if saved is not None:
        views.update({f"saved{i}": saved.at("n", "j", ld=ld, t=s, s=i) for i in range(config.num_saved)})
    return views


def _bind(group, views_of):
    """The views of one step for a group of directions: one direction's views as they are, two
    directions' stacked (:class:`tvmrnn.program.sequence.Stacked`) for the two-direction kernel."""
    if len(group) == 1:
        return views_of(group[0])
    per_direction = [views_of(d) for d in group]
    return {role: Stacked(tuple(v[role] for v in per_direction)) for role in per_direction[0]}


def half_precision_choices(config: Config, options: BuildOptions, target, allow_tf32: bool):
    """``(options, allow_tf32)`` as a build on ``target`` takes them: the choices a half
    ``options.dtype`` makes (bf16 GEMMs on CPUs, the all-steps GEMMs on tensor cores on GPUs),
    and ``tensor_core_steps`` checked. A target that cannot is a ValueError here, not at the first
    call. ``tvmrnn.build`` and tuning's tasks (:func:`tvmrnn.tune.tasks.extract_tasks`) ask it."""
    if options.tensor_core_steps and not is_gpu(target):
        raise ValueError("options.tensor_core_steps: GPU builds only (CPU steps have no TF32 tiles)")
    if options.half_operands and not is_gpu(target):
        raise ValueError("options.half_operands: GPU builds only (CPU half builds have bf16_projections)")
    if options.half_operands and options.dtype == "float32":
        raise ValueError("options.half_operands=True needs a half dtype ('float16' or 'bfloat16'); an fp32 "
                         "build's tensor cores take TF32 operands")
    if options.dtype == "float32":
        if options.tensor_core_steps and not allow_tf32:
            raise ValueError("options.tensor_core_steps=True in a float32 build needs allow_tf32=True "
                             "(its steps would round the hidden state to TF32)")
        return options, allow_tf32
    if is_gpu(target):
        return options, True
    from ..schedules import bf16
    if options.dtype != "bfloat16":
        raise ValueError(f"dtype: {options.dtype!r} builds need a CUDA target; CPUs compute half precision "
                         f"in bfloat16 (dtype='bfloat16')")
    try:
        bf16.check_target(target)
    except ValueError as err:
        raise ValueError(f"dtype='bfloat16': {err}") from None
    # bf16 GEMMs where they apply; elsewhere (hidden sizes without 16-unit weight panels) fp32 GEMMs
    # on the bf16-rounded inputs and weights
    return dataclasses.replace(options, bf16_projections=bf16_projections_refused(target, config) is None), allow_tf32


def projections_refused(config: Config, target, allow_tf32: bool = False) -> str | None:
    """Why ``config.proj_size`` (an LSTM's projections) cannot be built for ``target``, or None
    (also where it is 0): it must be below ``hidden_size`` (as torch.nn asks), for a cell that reads
    ``h_{t-1}`` through its gates alone, in fp32 (on CUDA too: run on the H200 in fp32, v72; TF32
    GEMMs, ``allow_tf32``, with projections have not run)."""
    if not config.proj_size:
        return None
    if config.proj_size >= config.hidden_size:
        return f"must be smaller than hidden_size ({config.hidden_size}), got {config.proj_size}"
    if kernels.has_direct_part(config.cell):
        return (f"a {config.cell.name} reads h_(t-1) outside its gates, so its state cannot be projected; "
                f"projections are for cells that read it through their gates alone (the LSTM)")
    if config.options.dtype != "float32" or config.options.bf16_projections:
        return "projections run in fp32 (not with dtype bfloat16 or bf16_projections)"
    if allow_tf32 and target is not None and is_gpu(target):
        return ("with allow_tf32 (TF32 GEMMs and steps), which have not run with projections on a GPU; "
                "build it with allow_tf32=False")
    return None


def bf16_projections_refused(target, config: Config, panel: int | None = None) -> str | None:
    """Why ``options.bf16_projections`` cannot apply to ``config`` on ``target``, a CPU target
    with bf16 dot products (:func:`tvmrnn.schedules.bf16.check_target`), or None."""
    from ..schedules import weight_panel
    if panel is None:
        panel = weight_panel(target, config.cell.num_gates, config.hidden_size, config.options.weight_panels)
    if not panel or panel % 16:
        return (f"needs the weights in column panels of a multiple of 16 units (AVX-512), smaller than the hidden "
                f"size: hidden_size {config.hidden_size} of a {config.cell.num_gates}-gate cell gets "
                f"{'no panels' if not panel else f'{panel}-unit panels'} (weight_panels={config.options.weight_panels})")
    if config.hidden_size % panel:
        return (f"needs column panels that divide the hidden size: hidden_size {config.hidden_size} takes "
                f"{panel}-unit panels, the last one padded")
    return None


def _check_bf16_projections(target, config: Config, panel: int) -> None:
    """A clear error at build where ``options.bf16_projections`` cannot apply."""
    from ..device import host_target
    from ..schedules import bf16
    target = target if target is not None else host_target()
    if is_gpu(target):
        raise ValueError("options.bf16_projections: CPUs only (a GPU build puts its all-steps GEMMs on TF32 "
                         "tensor cores with allow_tf32=True, and so does dtype='bfloat16' there)")
    bf16.check_target(target)
    reason = bf16_projections_refused(target, config, panel)
    if reason:
        raise ValueError(f"options.bf16_projections: {reason}")


def forward_program(config: Config, schedule, train: bool, persistent_blocks: int | None = None,
                    chunks: tuple[int, ...] = CHUNK_STEPS, stacked: bool = False, one_region: bool = False,
                    panel: int = 0, view_pointers: bool = False, interleave: bool = False,
                    subroutines: Subroutines | GpuKernels | None = None, tail_flops: int = 0,
                    tail_rows: int = 0, proj_panel: int = 0, skip_ended: bool = False, wave: int | None = None,
                    reduction: int = 0) -> Program:
    """The inference or training forward. ``panel``: the forward weights' column panels, as
    :func:`packing_program` packed them (:func:`tvmrnn.kernels.weight_shape`). ``interleave``
    (:func:`interleaved_projections`): each chunk's input projection just before the chunk's steps,
    into a buffer of one chunk, instead of every step's projection before the time loop (a loop
    that is one persistent kernel keeps the latter). ``tail_flops`` (:data:`GPU_TAIL_FLOPS`): with
    the projections before the time loop, the FLOPs a chunk overlapping the steps before it may
    spend again to save launches (``Program.chunked``'s ``tail_waste``); ``tail_rows``
    (:data:`GPU_GEMM_FULL_ROWS`): or where the chunks it saves are GEMMs of fewer rows than that
    (``Program.chunked``'s ``tail_rows``). With projections (``config.proj_size``), each step is
    two calls, the recurrent step into ``r`` and its projection (:func:`kernels.projection_step`,
    its weights in panels of ``proj_panel`` units), both stacked where the directions are.
    ``skip_ended`` (variable lengths, CPUs): the input projections take the chunk's mask and skip
    the rows that have ended (:func:`kernels.input_projection`'s ``masked``). ``wave``: the
    layers of a unidirectional stack without projections run as a wavefront of chunks of that
    many steps (:func:`_wavefront_forward`; 0: layer after layer; None: ``config.wave_steps``, which
    also decides the training workspace's layout, :class:`TrainingStates`). ``reduction``: the
    steps' (:func:`step_reduction`)."""
    c, N, H, L, D = config.cell, config.rows, config.hidden_size, config.num_layers, config.num_directions
    G, LD, I = c.num_gates, L * D, config.input_size
    S, P = config.state_size, config.proj_size
    layout = config.layout
    groups = _direction_groups(config, stacked)
    prog = Program("forward_train" if train else "forward", schedule, persistent_blocks, one_region, options=config.options,
                   view_pointers=view_pointers, subroutines=subroutines)
    T = tirx.Var("T", "int32")
    x = prog.tensor("x", config.seq_shape(T, I), config.seq_axes)
    h0 = prog.tensor("h0", (LD, N, S), ("ld", "n", "j"))
    c0 = prog.tensor("c0", (LD, N, H), ("ld", "n", "j")) if c.has_cell_state else None
    w = prog.flat("w", layout.packed_total)
    y = prog.tensor("y", config.seq_shape(T, D * S), tuple("j" if a == "k" else a for a in config.seq_axes))
    hy = prog.tensor("hy", (LD, N, S), ("ld", "n", "j"))
    cy = prog.tensor("cy", (LD, N, H), ("ld", "n", "j")) if c.has_cell_state else None
    # the input projections of the directions that run together (one, or both)
    gate_axes = kernels.gate_axes(panel)
    interleave = interleave and persistent_blocks is None
    wave = (config.wave_steps if wave is None else wave) if config.wavefront or (not train and wave) else 0
    if wave and not config.unidirectional_stack:
        raise AssertionError("a layer wavefront needs a unidirectional stack without projections")
    gx_steps = wave or (max(chunks) if interleave else T)
    gx = prog.tensor("gx", (L if wave else len(groups[0]), gx_steps, N, *kernels.gate_shape(H, G, panel)),
                     ("d", "t", "n", *gate_axes))
    masked = config.options.variable_lengths
    # per step and row, 1 while the row's sequence runs (variable lengths; see kernels.recurrent_step)
    mask = prog.tensor("mask", (T, N), ("t", "n")) if masked else None
    skip = masked and skip_ended
    if train:
        shapes = config.workspace_shapes(T)
        hs = prog.tensor("hs", shapes["hs"], ("ld", "t", "n", "j")) if "hs" in shapes else None
        cs = prog.tensor("cs", shapes["cs"], ("ld", "t", "n", "j")) if c.has_cell_state else None
        saved = prog.tensor("saved", shapes["saved"], ("ld", "t", "n", "j", "s")) if config.num_saved else None
        outs = prog.tensor("layer_out", shapes["layer_out"], ("l", "t", "n", "j")) if L > 1 else None
        states = TrainingStates(config, hs, outs)
        rs = prog.tensor("rs", shapes["rs"], ("ld", "t", "n", "j")) if P else None
    else:
        hs = prog.tensor("h_state", (LD, 2, N, S), ("ld", "t", "n", "j"))
        cs = prog.tensor("c_state", (LD, 2, N, H), ("ld", "t", "n", "j")) if c.has_cell_state else None
        # (a wavefront's layers each write their own: one tensor for every layer's steps, the last's too)
        outs = prog.tensor("layer_out", (L if wave else min(L - 1, 2), T, N, D * S),
                           ("l", "t", "n", "j")) if L > 1 else None
        # a step's r, projected at once (a direction each where they run together)
        rs = prog.tensor("r_state", (len(groups[0]), N, H), ("d", "n", "j")) if P else None
    bf16 = config.options.bf16_projections
    # a bf16 step's state rounded (kernels.bf16_state), a direction each where they run together
    hb = prog.tensor("h_bf16", (len(groups[0]), N, H // 2), ("d", "n", "j")) if bf16 else None
    if wave:
        _wavefront_forward(prog, config, T, wave, chunks, panel, x=x, h0=h0, c0=c0, w=w, y=y, hy=hy, cy=cy, gx=gx,
                           mask=mask, hs=hs, cs=cs, outs=outs, states=states if train else None,
                           saved=saved if train else None, reduction=reduction)
        return prog

    copy, copy_h = kernels.copy(N, H), kernels.copy(N, S)
    for l in range(L):
        in_size = I if l == 0 else D * S
        if l == 0:
            def layer_in(start, size):
                return x.at("t", "n", "k", t=start)
        elif train:
            def layer_in(start, size, _l=l):
                return states.layer_input(_l - 1, start)
        else:
            def layer_in(start, size, _l=l):
                return outs.at("t", "n", "j", l=(_l - 1) % 2, t=start)
        if l == L - 1:
            def layer_out(s, d):
                return y.at("n", "j", t=s, j=d * S)
        elif train:  # the state itself (written twice, the same value by the same thread)
            def layer_out(s, d, _l=l):
                return states.at(_l, d, next_row(d, s))
        else:
            def layer_out(s, d, _l=l):
                return outs.at("n", "j", l=_l % 2, t=s, j=d * S)

        def h_row(d, row, _l=l):
            return states.at(_l, d, row) if train else hs.at("n", "j", ld=_l * D + d, t=row)
        for group in groups:
            step = kernels.recurrent_step(c, N, H, train, directions=len(group), panel=panel, masked=masked,
                                          bf16=bf16, state_size=P, reduction=reduction)
            rounding = kernels.bf16_state(N, H, directions=len(group)) if bf16 else None

            def base(d, start, size):  # with interleave: the first time step of a chunk (direction d's order)
                return start if d == 0 else T - start - size

            def project(start, size, _group=group, _l=l, _in=in_size):
                for gd, d in enumerate(_group):
                    k = kernels.input_projection(size, N, _in, H, G, panel=panel, bf16=bf16, masked=skip)
                    t0 = base(d, start, size) if interleave else start
                    views = dict(mask=mask.at("t", "n", t=t0)) if skip else {}
                    prog.call(k, x=layer_in(t0, size), w=w.piece(layout.packed_offset(layout.slot(_l, d, "weight_ih"))),
                              b=w.piece(layout.packed_offset(layout.slot(_l, d, "bias_ih"))),
                              gx=gx.at("t", "n", *gate_axes, d=gd, t=0 if interleave else start), **views)

            if not interleave:
                step_flops = 2 * N * in_size * G * H * len(group)
                prog.chunked(T, chunks, project, tail_waste=tail_flops // step_flops,
                             tail_rows=(N, tail_rows) if tail_rows else None)
            for d in group:
                ld = l * D + d
                # State rows: training keeps all T+1 in time order (see the module docstring);
                # inference alternates two.
                first = (0 if d == 0 else T) if train else 0
                prog.call(copy_h, src=h0.at("n", "j", ld=ld), dst=h_row(d, first))
                if cs is not None:
                    prog.call(copy, src=c0.at("n", "j", ld=ld), dst=cs.at("n", "j", ld=ld, t=first))

            def steps(start, size, _l=l, _group=group, _step=step, _rounding=rounding):
                with prog.loop(size, "step") as v:
                    u = v if start is None else start + v

                    def views_of(d):
                        ld, gd = _l * D + d, _group.index(d)
                        s = _time(config, T, d, u)
                        if train:
                            rows = (prev_row(d, s), next_row(d, s))
                        else:
                            rows = (tirx.floormod(u, 2), tirx.floormod(u + 1, 2))
                        t_gx = s - base(d, start, size) if interleave else s
                        views = dict(gx=gx.at("n", *gate_axes, d=gd, t=t_gx), h_prev=h_row(d, rows[0]),
                                     **{role: w.piece(o) for role, o in _step_weights(config, _l, d).items()},
                                     **_step_states(config, ld, rows, s, cs=cs, mask=mask,
                                                    saved=saved if train else None))
                        if P:  # the step's r, then its projection (below) into the state and output
                            views["r"] = rs.at("n", "j", ld=ld, t=s) if train else rs.at("n", "j", d=gd)
                        else:
                            views.update(h=h_row(d, rows[1]), y=layer_out(s, d))
                        if hb is not None:
                            views["hb"] = hb.at("n", "j", d=gd)
                        return views
                    if _rounding is not None:  # the state rounded to bf16 first, in a kernel of its own
                        prog.call(_rounding, **_bind(_group, lambda d: {k: v for k, v in views_of(d).items()
                                                                        if k in ("h_prev", "hb")}))
                    prog.call(_step, **_bind(_group, views_of))
                    if P:
                        def projection_views(d):
                            views, s = views_of(d), _time(config, T, d, u)
                            out = dict(r=views["r"], w=w.piece(layout.packed_offset(layout.slot(_l, d, "weight_hr"))),
                                       h=h_row(d, next_row(d, s) if train else tirx.floormod(u + 1, 2)),
                                       y=layer_out(s, d))
                            if masked:
                                out.update(h_prev=views["h_prev"], mask=views["mask"])
                            return out
                        prog.call(kernels.projection_step(N, H, P, panel=proj_panel, masked=masked,
                                                          directions=len(_group)), **_bind(_group, projection_views))

            if interleave:
                def chunk(start, size):
                    project(start, size)
                    steps(start, size)
                prog.chunked(T, chunks, chunk)
            else:
                steps(None, T)
            for d in group:
                ld = l * D + d
                last = (T if d == 0 else 0) if train else tirx.floormod(T, 2)
                prog.call(copy_h, src=h_row(d, last), dst=hy.at("n", "j", ld=ld))
                if cs is not None:
                    prog.call(copy, src=cs.at("n", "j", ld=ld, t=last), dst=cy.at("n", "j", ld=ld))
    return prog


def _stacked_copies(prog: Program, w, L: int, kernel, pieces: dict):
    """Copies of every layer's pieces of the packed weights ``w`` that ``kernel`` (one layer's step)
    reads, one stride apart, as a wavefront's stacked step reads them (the packed layout puts other
    pieces between two layers'): ``pieces`` maps a role of the kernel to ``offset_of(l)``, layer
    l's piece. Emits the copies; returns ``at(l)``, layer l's copies by role."""
    sizes = {role: math.prod(int(d) for d in kernel.func.params[kernel.roles.index(role)].shape) for role in pieces}
    stride = sum(sizes.values())
    copies = prog.flat("wave_weights", L * stride)

    def at(l):
        found, start = {}, l * stride
        for role in pieces:
            found[role] = copies.piece(start)
            start += sizes[role]
        return found
    for l in range(L):
        for role, view in at(l).items():
            prog.call(kernels.copy(1, sizes[role]), src=w.piece(pieces[role](l)), dst=view)
    return at


def _wave_count(steps, C: int, L: int):
    """The whole chunks of ``C`` of ``steps`` that a wavefront of L layers runs as waves: where
    fewer than L - 1 (the waves that start and finish the layers would have no static set of
    layers) or than 2 (one chunk alone runs no two layers at once: the H100's LSTM N = 64 H = 256,
    2 layers, T = 100 took 3% longer so), none."""
    whole = tirx.floordiv(steps, C)
    return tirx.Select(whole >= max(L - 1, 2), whole, _const(0))


def _wave_loops(prog: Program, q, L: int, wave) -> None:
    """The waves over ``q`` chunks (:func:`_wave_count`): ``wave(k, first, last)`` emits wave k,
    which runs the layers ``first``..``last`` in the order the pass takes them (from 0, the
    first: layer ``first + i`` on its chunk ``k - first - i``): L - 1 waves that start them,
    ``q - (L - 1)`` with all of them, L - 1 that finish them."""
    some = tirx.Select(q > 0, _const(1), _const(0))
    for first in range(L - 1):
        with prog.loop(some, f"wave_start{first}"):
            wave(first, 0, first)
    with prog.loop(tirx.Select(q > 0, q - (L - 1), _const(0)), "wave") as i:
        wave(i + L - 1, 0, L - 1)
    for first in range(1, L):
        with prog.loop(some, f"wave_end{first}"):
            wave(q - 1 + first, first, L - 1)


def _wavefront_forward(prog: Program, config: Config, T, C: int, chunks: tuple[int, ...], panel: int, *, x, h0, c0,
                       w, y, hy, cy, gx, mask, hs, cs, outs, states=None, saved=None, reduction: int = 0) -> None:
    """A unidirectional stack's forward as a wavefront of its layers (cuDNN runs its stacks so):
    the time axis in chunks of ``C`` steps, wave ``k`` runs layer l's chunk ``k - l`` for every
    layer that has one, all of them in one launch a step (the step kernel with a leading axis over
    the wave's layers, as over the two directions of a bidirectional layer), after each layer's
    input projection of its chunk (layer l+1's reads what layer l wrote in the wave before). A step
    of few rows leaves most of a GPU idle: L layers' steps take about the time of one.

    ``q``, the whole chunks the waves cover, is T // C where that is at least L - 1 (so that the
    first L - 1 waves, which start the layers one after another, and the last L - 1, which finish
    them, have static sets of layers) and at least 2 (one chunk alone runs no two layers at once:
    the H100's LSTM N = 64 H = 256, 2 layers, T = 100 took 3% longer so), else 0; the steps
    after ``q * C`` (all of them where q is 0) run layer after layer in interleaved chunks (each
    chunk's projection, then its steps). The stacked step reads the layers' recurrent weights one
    stride apart (copies, made first: the packed layout puts each layer's input weights between
    them) and writes every layer's output into one tensor (the last layer's too), the last layer's
    chunk then copied into ``y``. Inference (``states`` None): states ping-pong between two rows
    by the step's parity, which a wave's layers share (``C`` is even), outputs in ``outs`` (L, T,
    ...). Training: every layer's states in ``states`` (a wavefront's :class:`TrainingStates`,
    the last layer's in ``layer_out`` too), which are also the outputs the layer above reads."""
    c, N, H, L, G, I = config.cell, config.rows, config.hidden_size, config.num_layers, config.cell.num_gates, config.input_size
    S, layout = config.state_size, config.layout
    train = states is not None
    if C % 2:
        raise AssertionError(f"wavefront chunks of {C} steps: an even number is needed (states by parity)")
    gate_axes = kernels.gate_axes(panel)
    masked = mask is not None
    copy, copy_h = kernels.copy(N, H), kernels.copy(N, S)

    def state(l, row):  # layer l's h of state row ``row``
        return states.at(l, 0, row) if train else hs.at("n", "j", ld=l, t=row)

    def rows(s, parity):  # the state rows the step at time s reads and writes
        return (s, s + 1) if train else (tirx.floormod(parity, 2), tirx.floormod(parity + 1, 2))

    def output(l, s):  # where layer l's output of time s goes in a wave (the last layer's too)
        return state(l, s + 1) if train else outs.at("n", "j", l=l, t=s)

    def layer_out(l, s):  # ... and outside the waves
        if l == L - 1:
            return y.at("n", "j", t=s)
        return output(l, s)

    def outputs(l, t0):  # layer l's outputs of steps t0.., as the layer above reads them
        return states.layer_input(l, t0) if train else outs.at("t", "n", "j", l=l, t=t0)

    for l in range(L):
        prog.call(copy_h, src=h0.at("n", "j", ld=l), dst=state(l, 0))
        if cs is not None:
            prog.call(copy, src=c0.at("n", "j", ld=l), dst=cs.at("n", "j", ld=l, t=0))

    single = kernels.recurrent_step(c, N, H, train, panel=panel, masked=masked, reduction=reduction)
    copies = _stacked_copies(prog, w, L, single, {role: lambda l, _r=role: _step_weights(config, l, 0)[_r]
                                                  for role in _step_weights(config, 0, 0)})

    def weights(l, stacked: bool):
        return copies(l) if stacked else {role: w.piece(o) for role, o in _step_weights(config, l, 0).items()}

    def project(l, t0, size, slot):  # layer l's input projection of steps t0.. into gx[slot]
        k = kernels.input_projection(size, N, I if l == 0 else S, H, G, panel=panel)
        src = x.at("t", "n", "k", t=t0) if l == 0 else outputs(l - 1, t0)
        prog.call(k, x=src, w=w.piece(layout.packed_offset(layout.slot(l, 0, "weight_ih"))),
                  b=w.piece(layout.packed_offset(layout.slot(l, 0, "bias_ih"))),
                  gx=gx.at("t", "n", *gate_axes, d=slot, t=0))

    def views(l, s, t_gx, slot, parity, stacked, out):  # layer l's step at time s
        before, after = rows(s, parity)
        return dict(gx=gx.at("n", *gate_axes, d=slot, t=t_gx), h_prev=state(l, before), h=state(l, after), y=out,
                    **weights(l, stacked), **_step_states(config, l, (before, after), s, cs=cs, mask=mask, saved=saved))

    q = _wave_count(T, C, L)

    def wave(k, lo, hi):  # wave k: layers lo..hi, layer l on its chunk k - l
        for l in range(lo, hi + 1):
            project(l, (k - l) * C, C, l)
        step = kernels.recurrent_step(c, N, H, train, directions=hi - lo + 1, panel=panel, masked=masked,
                                      reduction=reduction)
        with prog.loop(C, "step") as v:
            per_layer = [views(l, (k - l) * C + v, v, l, v, hi > lo, output(l, (k - l) * C + v))
                         for l in range(lo, hi + 1)]
            if hi == lo:
                prog.call(step, **per_layer[0])
            else:
                prog.call(step, **{role: Stacked(tuple(p[role] for p in per_layer)) for role in per_layer[0]})
        if hi == L - 1:  # the last layer's chunk, into y
            t0 = (k - L + 1) * C
            src = outputs(L - 1, t0)
            prog.call(kernels.copy_steps(C, N, S), src=src, dst=y.at("t", "n", "j", t=t0))

    _wave_loops(prog, q, L, wave)  # (layers from the first)
    # the steps after the waves' chunks, layer after layer
    sizes_left = tuple(sorted({C, *(s for s in chunks if s < C)}, reverse=True))
    for l in range(L):
        def chunk(start, size, _l=l):
            t0 = q * C + start
            project(_l, t0, size, 0)
            with prog.loop(size, "step") as v:
                s = t0 + v
                prog.call(single, **views(_l, s, v, 0, s, False, layer_out(_l, s)))
        prog.chunked(T - q * C, sizes_left, chunk)
    for l in range(L):
        last = T if train else tirx.floormod(T, 2)
        prog.call(copy_h, src=state(l, last), dst=hy.at("n", "j", ld=l))
        if cs is not None:
            prog.call(copy, src=cs.at("n", "j", ld=l, t=last), dst=cy.at("n", "j", ld=l))


# From how many units a cell whose dgh is not its dgx (the GRU) packs each into panels for its
# weight gradients. With the gate gradients alone in panels, two packs cost more than the panels gained
# (16-step DS2 chunk on the Xeon: 2 x 1,749 us in rows against 2 x 1,586 + 2 x 98, its training
# pass 4-10% slower; notes v25). With the inputs in panels too (schedules.cpu.input_panel), the
# GRU's backward on a 2-core Sapphire Rapids VM, interleaved: T=20 N=64 I=H=1024 170.8 -> 130.4
# ms, N=256 I=H=512 159.2 -> 144.3; but T=50 N=64 I=H=256 23.5 -> 24.9 ms, N=256 I=H=64 8.7 ->
# 11.4 (notes v46). 512 -> 288 in v89 (the gate gradients' pack split, padded panels at odd H:
# schedules.cpu.CPU_PADDED_GRADIENT_PANELS): a 2-core Sapphire Rapids VM, 2 threads, one process,
# interleaved, the same bits, GRU training, T=50 unless said: N=13 I=H=354 21.8 -> 19.7 ms, N=20
# I=H=467 51.9 -> 46.9, N=64 I=H=300 91.9 -> 85.8; the same at N=8 I=H=384, N=64 I=H=256, T=62 N=20
# I=161 H=247 (not measured on the Xeon)
TWO_GRADIENT_PACKS_MIN_UNITS = 288


# A/B switch (v74): CPU backwards take each chunk's gradients right after its steps
BACKWARD_CHUNK_GRADIENTS = True
# Where a cell's gate gradients are the same for its input and recurrent GEMMs (the LSTM's, the
# Elman RNN's: ``CellDerivatives.gate_grads_shared``), b_ih's and b_hh's gradients are one sum:
# it is taken once (a column sum over every step's gate gradients), and copied (v78). On the H100
# the LSTM at N=256 H=510 spent 0.98 ms of an 18 ms backward in bias sums, half of them a repeat.
SHARED_BIAS_GRADIENTS = True


def backward_program(config: Config, schedule, persistent_blocks: int | None = None,
                     chunks: tuple[int, ...] = CHUNK_STEPS, stacked: bool = False,
                     packed_grads: bool = False, one_region: bool = False, panel_of=lambda k: 0,
                     grad_panel: int = 0, input_rows_of=lambda k, panel: 0, view_pointers: bool = False,
                     subroutines: Subroutines | GpuKernels | None = None, tail_flops: int = 0,
                     tail_rows: int = 0, skip_ended: bool = False, interleave: bool = False,
                     staged: bool = False, wave: int | None = None, reduction: int = 0) -> Program:
    """The backward pass. ``reduction``: its step GEMMs' units padded (:func:`step_reduction`).
    With ``packed_grads`` the weight gradients are summed in the packed ``(k, j, g)`` layout
    (:func:`kernels.weight_gradient`) in a scratch buffer, one weight at a time, and transposed into ``dw`` when the weight is done (:func:`packed_weight_gradients`);
    with ``grad_panel`` too, in column panels of that many units, each chunk's gate gradients
    packed into panels first, once for both weights where the cell's dgh is its dgx, else each
    from :data:`TWO_GRADIENT_PACKS_MIN_UNITS` units on (:func:`tvmrnn.schedules.cpu.gradient_panel`),
    and the inputs they multiply in row panels of
    ``input_rows_of(K, grad_panel)`` features (:func:`tvmrnn.schedules.cpu.input_panel`).
    ``panel_of(K)``: the panels of the backward's weight copy with K input features, as
    :func:`packing_program` packed them (:func:`tvmrnn.kernels.backward_weight_shape`).
    ``tail_flops``, ``tail_rows``: with :data:`GPU_INPUT_GRADIENT_TAILS`, the first direction's
    input gradients over a cover of their own with the forward's tails (:func:`forward_program`).
    With projections (``config.proj_size`` P), a step is two calls after the last step's
    :func:`kernels.projected_gradient_start`: the projection's backward fused with the gate math
    (:func:`kernels.backward_step` with ``proj``), then the recurrent GEMM with the step before's
    gradient of its projected state in its epilogue (:func:`kernels.projected_recurrent_backward`);
    those gradients (``dhp``) and the forward's ``rs`` make the gradient of ``W_hr``.
    ``skip_ended`` (variable lengths, CPUs): the input and weight gradients take each chunk's mask
    and leave out the rows that have ended, whose gate gradients are zero (``masked`` of
    :func:`kernels.input_gradient` and :func:`kernels.weight_gradient`). ``interleave``
    (:func:`interleaved_projections`; not with projections): each chunk's gradients right after
    its steps, walked from the end, while its gate gradients are in cache (stacked directions:
    their weight gradients so, their input gradients after the loop). ``staged``
    (:data:`CPU_STAGED_WEIGHT_GRADIENTS`): the weight gradients of the chunks after the longest
    ones in one call over a staged copy of their operands, where they are two chunks or more.
    ``wave``: the layers as a wavefront of chunks of that many steps (:func:`_wavefront_backward`;
    None: ``config.wave_steps`` where the configuration is a wavefront's; 0: layer after layer)."""
    c, N, H, L, D = config.cell, config.rows, config.hidden_size, config.num_layers, config.num_directions
    G, LD, I = c.num_gates, L * D, config.input_size
    S, P = config.state_size, config.proj_size
    layout = config.layout
    deriv = kernels.derivation(c)
    masked = config.options.variable_lengths
    groups = _direction_groups(config, stacked)
    DG = len(groups[0])  # directions whose temporaries are live together
    wave = (config.wave_steps if wave is None else wave) if config.wavefront else 0
    # the temporaries of a step, one a direction of a group, or one a layer of a wavefront
    DW = L if wave else DG

    def gslot(l, d):  # layer l, direction d's slot in them
        return l if wave else d % DG
    prog = Program("backward", schedule, persistent_blocks, one_region, view_pointers=view_pointers,
                   options=config.options, subroutines=subroutines)
    T = tirx.Var("T", "int32")
    y_axes = tuple("j" if a == "k" else a for a in config.seq_axes)
    dy = prog.tensor("dy", config.seq_shape(T, D * S), y_axes)
    dhy = prog.tensor("dhy", (LD, N, S), ("ld", "n", "j"))
    dcy = prog.tensor("dcy", (LD, N, H), ("ld", "n", "j")) if c.has_cell_state else None
    w = prog.flat("w", layout.packed_total)
    x = prog.tensor("x", config.seq_shape(T, I), config.seq_axes)
    shapes = config.workspace_shapes(T)
    hs = prog.tensor("hs", shapes["hs"], ("ld", "t", "n", "j")) if "hs" in shapes else None
    cs = prog.tensor("cs", shapes["cs"], ("ld", "t", "n", "j")) if c.has_cell_state else None
    saved = prog.tensor("saved", shapes["saved"], ("ld", "t", "n", "j", "s")) if config.num_saved else None
    outs = prog.tensor("layer_out", shapes["layer_out"], ("l", "t", "n", "j")) if L > 1 else None
    states = TrainingStates(config, hs, outs)
    rs = prog.tensor("rs", shapes["rs"], ("ld", "t", "n", "j")) if P else None
    dx = prog.tensor("dx", config.seq_shape(T, I), config.seq_axes)
    dh0 = prog.tensor("dh0", (LD, N, S), ("ld", "n", "j"))
    dc0 = prog.tensor("dc0", (LD, N, H), ("ld", "n", "j")) if c.has_cell_state else None
    dw = prog.flat("dw", layout.total)  # PyTorch layout; zeroed first (the pass accumulates into it)
    dgx = prog.tensor("dgx", (DW, T, N, H, G), ("d", "t", "n", "j", "g"))
    dgh = dgx if deriv.gate_grads_shared else prog.tensor("dgh", (DW, T, N, H, G), ("d", "t", "n", "j", "g"))
    # the gradient of an inner layer's output: written by the layer above's input gradients, read
    # by its own time loop. With one time loop per layer, a layer's input gradients run after
    # its loop has read all it needs, so one slot serves every layer; with one per direction,
    # direction 0's input gradients run before direction 1's loop: two slots, in turn.
    # A wavefront: a slot a layer, the last layer's holding the chunks of dy its stacked steps read.
    slots = L if wave else 1 if len(groups) == 1 else 2
    dlayer = prog.tensor("dlayer_out", (min(L - 1, slots) if not wave else L, T, N, D * S),
                         ("l", "t", "n", "j")) if L > 1 else None
    if P:  # each step's gradient of its projected state; the gate math's dy (zeros); masked: dh carried
        dhp = prog.tensor("dhp", (DG, T, N, P, 1), ("d", "t", "n", "j", "g"))
        zero_dy = prog.flat("zero_dy", DG * N * H)  # (a direction each: stacked views need distinct buffers)
        carry = prog.tensor("dh_carry", (DG, 2, N, P), ("d", "slot", "n", "j")) if masked else None
    dc_carry = prog.tensor("dc_carry", (DW, 2, N, H), ("d", "slot", "n", "j")) if c.has_cell_state else None
    # the pointwise's direct part of dh_{t-1}, read by the next launch's GEMM epilogue: two slots
    dh_direct = (prog.tensor("dh_direct", (DW, 2, N, H), ("d", "slot", "n", "j"))
                 if kernels.has_direct_part(c, masked) else None)
    mask = prog.tensor("mask", (T, N), ("t", "n")) if masked else None
    skip = masked and skip_ended

    def chunk_mask(start):  # a chunk's mask, for its GEMMs that skip ended rows
        return dict(mask=mask.at("t", "n", t=start)) if skip else {}
    U = len(c.unit_params)
    dunit = prog.tensor("dunit", (DW, T, N, H, U), ("d", "t", "n", "j", "p")) if U else None
    # the gate gradients in panels: one pack of a chunk serves both weights where dgh is dgx (the
    # LSTM, the RNNs), the GRU packs each at many units (TWO_GRADIENT_PACKS_MIN_UNITS)
    two_packs = H >= TWO_GRADIENT_PACKS_MIN_UNITS
    grad_panel = grad_panel if packed_grads and (deriv.gate_grads_shared or two_packs) else 0
    # the units the packed weight gradients hold: H, or the panels' (the last one padded)
    HP = kernels.panels(H, grad_panel) * grad_panel if grad_panel else H
    # packed weight gradients: W_ih's (the largest input size) then W_hh's, reused by every layer
    k_most = max(I, D * S) if L > 1 else I
    # (a pair a direction where stacked directions take their chunks' gradients in their loop)
    packed_size = (k_most + S) * HP * G
    chunk_grads = interleave and not P and not wave  # (projections: their own time loop, _projected_steps)
    packed_pairs = DG if chunk_grads else 1
    dw_packed = prog.flat("dw_packed", packed_pairs * packed_size) if packed_grads else None
    packed_at = {"weight_ih": 0, "weight_hh": k_most * HP * G}
    # a chunk's gate gradients in panels (kernels.gradient_panels_shape), for the weight gradients
    dg_panels = prog.flat("dg_panels", max(chunks) * N * HP * G) if grad_panel else None
    # and the inputs they multiply (x, a layer's h_{t-1}) in row panels (kernels.input_panels)
    input_rows = {k: input_rows_of(k, grad_panel) if grad_panel else 0 for k in {I, D * S, S}}
    paneled = [k for k, rows in input_rows.items() if rows]
    a_panels = prog.flat("a_panels", max(chunks) * N * max(paneled)) if paneled else None

    # the tail's staged operands (staged): a direction's gate gradients, inputs (the widest layer's
    # row stride) and h_{t-1}, and mask, zero past the tail (every layer stages the same rows)
    C = chunks[0]
    staged = staged and len(chunks) > 2
    if staged:
        rest = tirx.floormod(T, C)  # the tail's steps
        tails, left = _const(0), rest
        for size in chunks[1:]:
            tails, left = tails + tirx.floordiv(left, size), tirx.floormod(left, size)
        # a span of each chunk size but 1 takes the tails of more steps than the next size, where
        # the calls it saves cost more than its padding's rows (CPU_STAGED_PASS_ROWS)
        spans = [(size, tirx.And(tirx.And(rest > smaller, rest <= size),
                                 (tails - 1) * CPU_STAGED_PASS_ROWS > N * (size - rest)))
                 for size, smaller in zip(chunks[:-1], chunks[1:])]
        use_stage = functools.reduce(tirx.Or, [fits for _, fits in spans])
        stage = {"dgx": prog.tensor("stage_dgx", (DG, C, N, H, G), ("d", "t", "n", "j", "g"))}
        stage["dgh"] = stage["dgx"] if deriv.gate_grads_shared else prog.tensor(
            "stage_dgh", (DG, C, N, H, G), ("d", "t", "n", "j", "g"))
        stage["ih"] = prog.tensor("stage_ih", (DG, C, N, k_most), ("d", "t", "n", "k"))
        stage["hh"] = prog.tensor("stage_hh", (DG, C, N, S), ("d", "t", "n", "j"))
        if skip:
            stage["mask"] = prog.tensor("stage_mask", (DG, C, N), ("d", "t", "n"))
        with prog.loop(tirx.Select(use_stage, _const(1), _const(0)), "stage_zero"):  # (N=8 H=1220: 13 MB)
            for t in {id(v): v for v in stage.values()}.values():
                prog.call(kernels.fill_zero(math.prod(t.shape)), dst=t.at(**{a: 0 for a in t.axes}))

    # zeroed here, not by the caller: a caller's torch.zeros is a parallel PyTorch op whose OpenMP
    # threads then spin on the cores this pass needs (a DS2 LSTM training call on the Xeon: 37 ms
    # more than its bare passes; notes/performance.md v25)
    prog.call(kernels.fill_zero(layout.total), dst=dw.piece(0))
    if P:
        prog.call(kernels.fill_zero(DG * N * H), dst=zero_dy.piece(0))
    copy = kernels.copy(N, H)
    pointwise = kernels.pointwise_backward(c, N, H, masked=masked)
    recurrent = kernels.recurrent_backward(N, H, G, dh_direct is not None, panel=panel_of(H), reduction=reduction)
    layer_fns: dict[int, dict] = {}  # a wavefront's: each layer's views and gradients

    wave_weights = None  # a wavefront's: layer l's copies of its step's weights, one stride apart
    if wave:  # (the recurrent weights' backward copies, and per-unit parameters)
        single = kernels.backward_step(c, N, H, panel=panel_of(H), masked=masked, reduction=reduction)
        pieces = {"w": lambda l: layout.backward_copy(layout.slot(l, 0, "weight_hh"))}
        if "unit" in single.roles:
            pieces["unit"] = lambda l: layout.unit_offset(l, 0, packed=True)
        wave_weights = _stacked_copies(prog, w, L, single, pieces)

    for l in reversed(range(L)):
        in_size = I if l == 0 else D * S
        if l == L - 1:
            def d_out(**at):
                return dy.at(*at.pop("axes"), **at)
        else:
            def d_out(_l=l, **at):
                return dlayer.at(*at.pop("axes"), l=_l % slots, **at)
        if l == 0:
            def layer_in(start):
                return x.at("t", "n", "k", t=start)

            def d_in(start):
                return dx.at("t", "n", "k", t=start)
        else:
            def layer_in(start, _l=l):
                return states.layer_input(_l - 1, start)

            def d_in(start, _l=l):
                return dlayer.at("t", "n", "j", l=(_l - 1) % slots, t=start)

        def gate_math(d, v, _l=l, _d_out=d_out, parity=None, stacked=False):
            """Views for direction d's pointwise backward of the v-th step from the end (its dh aside).
            ``parity``: the carries' slot (default v; a wavefront's layers share their chunk's); ``stacked``:
            a wavefront's step of several layers (their dy in dlayer_out, their weights' copies one stride apart)."""
            ld, gd = _l * D + d, gslot(_l, d)
            s = _time(config, T, d, T - 1 - v)  # walk the forward's steps in reverse
            parity = v if parity is None else parity
            cur, nxt = tirx.floormod(parity, 2), tirx.floormod(parity + 1, 2)
            if P:
                views = {"dy": zero_dy.piece(gd * N * H)}
            else:
                views = {"dy": dlayer.at("n", "j", l=_l, t=s) if stacked else _d_out(axes=("n", "j"), t=s, j=d * S)}
            if c.has_cell_state:  # the first step's dc comes in as dcy
                views.update(dc=dcy.at("n", "j", ld=ld) if isinstance(v, int) and v == 0
                             else dc_carry.at("n", "j", d=gd, slot=cur), dc_prev=dc_carry.at("n", "j", d=gd, slot=nxt))
            if saved is not None:
                views["saved"] = saved.at("n", "j", "s", ld=ld, t=s)
            for role, row in (("h_prev", prev_row(d, s)), ("h_next", next_row(d, s))):
                if role in pointwise.roles:
                    # with projections the cell's own output is r_t (its h_next), its state's
                    # h_{t-1} is read through the gates alone (projections_refused)
                    views[role] = rs.at("n", "j", ld=ld, t=s) if P else states.at(_l, d, row)
            for role, row in (("c_prev", prev_row(d, s)), ("c_next", next_row(d, s))):
                if role in pointwise.roles:
                    views[role] = cs.at("n", "j", ld=ld, t=row)
            for g in range(G):
                views[f"dgx{g}"] = dgx.at("n", "j", d=gd, t=s, g=g)
                if not deriv.gate_grads_shared:
                    views[f"dgh{g}"] = dgh.at("n", "j", d=gd, t=s, g=g)
            if dh_direct is not None:
                views["dh_direct"] = dh_direct.at("n", "j", d=gd, slot=nxt)
            if "unit" in pointwise.roles:
                views["unit"] = (wave_weights(_l)["unit"] if stacked
                                 else w.piece(layout.unit_offset(_l, d, packed=True)))
            views.update({f"dp{i}": dunit.at("n", "j", d=gd, t=s, p=i) for i in range(U)})
            if mask is not None:
                views["mask"] = mask.at("n", t=s)
            return views

        def recurrent_views(d, v, _l=l, parity=None, stacked=False):
            """The GEMM of direction d's v-th step from the end: its dgh (and direct part of dh) in."""
            s = _time(config, T, d, T - 1 - v)
            w_hh = (wave_weights(_l)["w"] if stacked  # (G, H, H) or its panels
                    else w.piece(layout.backward_copy(layout.slot(_l, d, "weight_hh"))))
            views = dict(dgh=dgh.at("n", "j", "g", d=gslot(_l, d), t=s), w=w_hh)
            if dh_direct is not None:
                parity = v if parity is None else parity
                views["dh_direct"] = dh_direct.at("n", "j", d=gslot(_l, d), slot=tirx.floormod(parity + 1, 2))
            return views

        def _gradient_emitters(l, d, inputs_after=False, inputs=True, in_size=in_size, layer_in=layer_in, d_in=d_in):
            """Direction d's weight, bias and input gradients of layer l: ``chunk(start, size)``
            emits one chunk's, ``zero()`` and ``finish()`` what comes before and after all chunks
            (packed weight gradients), ``all()`` all three over the whole sequence. ``inputs_after``:
            the input gradients in ``finish()``, over the whole sequence, not in the chunks;
            ``inputs`` False: none (a wavefront's run after each chunk's steps: ``inputs(start, size)``)."""
            slot = {k: layout.slot(l, d, k).offset for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh",
                                                              *(("weight_hr",) if P else ()))}
            w_ih = layout.backward_copy(layout.slot(l, d, "weight_ih"))
            shared_bias = SHARED_BIAS_GRADIENTS and deriv.gate_grads_shared

            def input_gradient(start, size):
                views = dict(dg=dgx.at("t", "n", "j", "g", d=gslot(l, d), t=start),
                             w=w.piece(w_ih), dx=d_in(start))
                if d > 0:
                    views["acc"] = d_in(start)
                # (padded only where its rows are a step's few, as the steps': a GEMM of 128 rows or
                # more may take TF32 tiles, whose template refuses the guarded product)
                padded = reduction if size * N < PADDED_REDUCTION_ROWS else 0
                prog.call(kernels.input_gradient(size, N, in_size, H, G, accumulate=d > 0, panel=panel_of(in_size),
                                                 masked=skip, reduction=padded), **views, **chunk_mask(start))
            # the first direction's input gradients write dx: a cover of their own may overlap
            own_cover = inputs_after or (GPU_INPUT_GRADIENT_TAILS and d == 0 and bool(tail_flops or tail_rows))
            own_cover = own_cover and inputs
            base = (d % DG) * packed_size if packed_pairs > 1 else 0

            def weight_gradients(size, operands, mask_views):
                """The two weights' gradients over ``size`` steps: ``operands`` the views of
                dgx, dgh, the inputs (ih) and h_{t-1} (hh)."""
                for dg, kind_w, a, k_size in (("dgx", "weight_ih", operands["ih"], in_size),
                                              ("dgh", "weight_hh", operands["hh"], S)):
                    piece = dw_packed.piece(base + packed_at[kind_w]) if packed_grads else dw.piece(slot[kind_w])
                    operand = operands[dg]
                    if grad_panel:  # packed once where dgh is dgx
                        operand = dg_panels.piece(0)
                        if kind_w == "weight_ih" or not deriv.gate_grads_shared:
                            prog.call(kernels.gradient_panels(size, N, H, G, grad_panel), src=operands[dg],
                                      dst=operand)
                            if H % grad_panel:  # the padded last panel, after the whole ones
                                prog.call(kernels.gradient_panels(size, N, H, G, grad_panel, last=True),
                                          src=operands[dg],
                                          dst=dg_panels.piece(H // grad_panel * size * N * grad_panel * G))
                    rows = input_rows[k_size]
                    if rows:
                        prog.call(kernels.input_panels(size, N, k_size, rows), src=a, dst=a_panels.piece(0))
                        a = a_panels.piece(0)
                    prog.call(kernels.weight_gradient(size, N, k_size, H, G, packed=packed_grads,
                                                      panel=grad_panel, input_rows=rows, masked=skip),
                              dg=operand, a=a, acc=piece, dw=piece, **mask_views)

            def stage_views(row, gd=d % DG):  # the stage's operands from its row ``row``
                views = {"dgx": stage["dgx"].at("t", "n", "j", "g", d=gd, t=row),
                         "dgh": stage["dgh"].at("t", "n", "j", "g", d=gd, t=row),
                         "ih": stage["ih"].at("t", "n", "k", d=gd, t=row),
                         "hh": stage["hh"].at("t", "n", "j", d=gd, t=row)}
                return views, (dict(mask=stage["mask"].at("t", "n", d=gd, t=row)) if skip else {})

            def gradients(start, size):
                gd = gslot(l, d)
                h_before = states.at(l, d, prev_row(d, start), ("t", "n", "j"))  # the steps' h_{t-1}
                operands = {"dgx": dgx.at("t", "n", "j", "g", d=gd, t=start),
                            "dgh": dgh.at("t", "n", "j", "g", d=gd, t=start), "ih": layer_in(start), "hh": h_before}
                if staged and size < C:  # a chunk of the tail: staged, where the tail is two chunks or more
                    # (its times: [0, rest) for the first direction's chunks walked from the end, else [T - rest, T))
                    row = start if chunk_grads and d == 0 else start - (T - rest)
                    with prog.loop(tirx.Select(use_stage, _const(1), _const(0)), "staged"):
                        to, mask_to = stage_views(row)
                        shapes = {"dgx": (size, N, H, G), "dgh": (size, N, H, G), "ih": (size, N, in_size),
                                  "hh": (size, N, S)}
                        for key in ("dgx", "ih", "hh") if deriv.gate_grads_shared else ("dgx", "dgh", "ih", "hh"):
                            prog.call(kernels.copy_steps(*shapes[key]), src=operands[key], dst=to[key])
                        if skip:
                            prog.call(kernels.copy_steps(size, N), src=chunk_mask(start)["mask"], dst=mask_to["mask"])
                    with prog.loop(tirx.Select(use_stage, _const(0), _const(1)), "unstaged"):
                        weight_gradients(size, operands, chunk_mask(start))
                else:
                    weight_gradients(size, operands, chunk_mask(start))
                for dg, kind_b in (("dgx", "bias_ih"),) if shared_bias else (("dgx", "bias_ih"), ("dgh", "bias_hh")):
                    bias = dw.piece(slot[kind_b])
                    prog.call(kernels.bias_gradient(size, N, H, G), dg=operands[dg], acc=bias, db=bias)
                if P:  # W_hr's: dw[p, j] += sum dhp[t, n, p] r[t, n, j]
                    hr = dw.piece(slot["weight_hr"])
                    prog.call(kernels.weight_gradient(size, N, H, S, 1, masked=skip),
                              dg=dhp.at("t", "n", "j", "g", d=gd, t=start),
                              a=rs.at("t", "n", "j", ld=l * D + d, t=start), acc=hr, dw=hr, **chunk_mask(start))
                if U:  # a per-unit parameter's gradient is a bias gradient over its (T, N, H) shares
                    unit = dw.piece(layout.unit_offset(l, d))
                    prog.call(kernels.bias_gradient(size, N, H, U), dg=dunit.at("t", "n", "j", "p", d=gd, t=start),
                              acc=unit, db=unit)
                if not own_cover and inputs:
                    input_gradient(start, size)

            def zero():
                if packed_grads:
                    for kind, k_size in (("weight_ih", in_size), ("weight_hh", S)):
                        prog.call(kernels.fill_zero(k_size * HP * G), dst=dw_packed.piece(base + packed_at[kind]))

            def finish():
                if shared_bias:  # both biases' gradients are the sum of the same gate gradients
                    prog.call(kernels.copy(G, H), src=dw.piece(slot["bias_ih"]), dst=dw.piece(slot["bias_hh"]))
                if staged:  # the tail's weight gradients, over the smallest chunk size that holds it
                    for size, fits in spans:
                        with prog.loop(tirx.Select(fits, _const(1), _const(0)), f"flush{size}"):
                            weight_gradients(size, *stage_views(0))
                if packed_grads:
                    for kind, k_size in (("weight_ih", in_size), ("weight_hh", S)):
                        prog.call(kernels.gate_untranspose(G, H, k_size, panel=grad_panel),
                                  src=dw_packed.piece(base + packed_at[kind]),
                                  dst=dw.piece(slot[kind]))
                if own_cover:
                    prog.chunked(T, chunks, input_gradient, tail_waste=tail_flops // (2 * N * in_size * G * H),
                                 tail_rows=(N, tail_rows) if tail_rows else None)

            def whole():
                zero()
                prog.chunked(T, chunks, gradients)
                finish()
            return dict(chunk=gradients, zero=zero, finish=finish, all=whole, inputs=input_gradient)

        if wave:  # the layers' steps together after the loop (_wavefront_backward)
            layer_fns[l] = dict(gate_math=gate_math, recurrent_views=recurrent_views,
                                emitters=_gradient_emitters(l, 0, inputs=False))
            continue
        for group in groups:
            # each chunk's gradients right after the chunk's steps, while its gate gradients are
            # in cache. Stacked directions (one loop, time walked in opposite orders) take their
            # weight and bias gradients so, each into a packed pair of its own; their input
            # gradients run after the loop, the first's first (the second's add to them)
            emitters = {d: _gradient_emitters(l, d, inputs_after=chunk_grads and len(group) > 1) for d in group}
            for d in group if chunk_grads else ():
                emitters[d]["zero"]()
            if P:
                _projected_steps(prog, config, l, group, T, gate_math, d_out=d_out, w=w, dgh=dgh, dhp=dhp, dhy=dhy,
                                 dh0=dh0, carry=carry, mask=mask, panel_of=panel_of)
            else:
                fused = kernels.backward_step(c, N, H, directions=len(group), panel=panel_of(H), masked=masked,
                                              reduction=reduction)
                # the last step's gate math with dhy; then one launch per step: step v's GEMM and
                # step v+1's gate math (from the end); then the first step's GEMM, into dh0
                for d in group:
                    prog.call(pointwise, dh=dhy.at("n", "j", ld=l * D + d), **gate_math(d, 0))

                def fused_steps(first, count, _group=group, _fused=fused):
                    with prog.loop(count, "step") as i:
                        u = first + i

                        def views_of(d):
                            views = gate_math(d, u + 1)
                            gemm = recurrent_views(d, u)
                            views.update(dgh=gemm["dgh"], w=gemm["w"])
                            if dh_direct is not None:
                                views["dh_direct_in"] = gemm["dh_direct"]
                            if mask is not None:  # the GEMM's step's mask (views["mask"]: its epilogue's step's)
                                views["gemm_mask"] = mask.at("n", t=_time(config, T, d, T - 1 - u))
                            return views
                        prog.call(_fused, **_bind(_group, views_of))
                if chunk_grads:
                    def time_of(d, v, size):  # the first time of the steps v..v+size-1 from the end
                        return T - v - size if d == 0 else v

                    def chunk(start, size, _group=group):
                        # the steps start..start+size-1 from the end have their gate math in the
                        # launches start-1..start+size-2 (step 0's before the loop): then their
                        # gradients, over the times they cover (chunks as the forward's, over T)
                        first = tirx.max(start - 1, 0)
                        fused_steps(first, start + size - 1 - first)
                        for d in _group:
                            emitters[d]["chunk"](time_of(d, start, size), size)
                    prog.chunked(T, chunks, chunk)
                else:
                    fused_steps(0, T - 1)
                for d in group:
                    prog.call(recurrent, dh=dh0.at("n", "j", ld=l * D + d), **recurrent_views(d, T - 1))
            for d in group if c.has_cell_state else ():  # the first step's dc: dc0
                prog.call(copy, src=dc_carry.at("n", "j", d=d % DG, slot=tirx.floormod(T, 2)),
                          dst=dc0.at("n", "j", ld=l * D + d))
            for d in group:
                if chunk_grads:
                    emitters[d]["finish"]()
                else:
                    emitters[d]["all"]()
    if wave:
        _wavefront_backward(prog, config, T, wave, chunks, layer_fns, pointwise=pointwise, recurrent=recurrent,
                            single=single, panel=panel_of(H), dy=dy, dhy=dhy, dh0=dh0, dc0=dc0, dlayer=dlayer,
                            dc_carry=dc_carry, dh_direct=dh_direct, mask=mask, reduction=reduction)
    return prog


def _wavefront_backward(prog: Program, config: Config, T, C: int, chunks: tuple[int, ...], layer_fns: dict, *,
                        pointwise, recurrent, single, panel: int, dy, dhy, dh0, dc0, dlayer, dc_carry, dh_direct,
                        mask, reduction: int = 0) -> None:
    """:func:`backward_program`'s time loops as a wavefront of the layers (the forward's,
    :func:`_wavefront_forward`, backwards): from the last step on, layer l's chunk j of ``C``
    steps (chunks counted from the end) runs in one launch a step with the layer above's chunk
    j + 1 and the layer below's j - 1 (the fused backward step with a leading axis over the
    wave's layers); after a wave's
    steps, each layer's input gradients of its chunk (what the layer below's gate math reads in
    the next wave, or ``dx``). A chunk of steps here is the gate math of its steps: launch u runs
    step u's recurrent GEMM and step u+1's gate math (from the end), so a chunk's launches start
    one step before it.

    First, layer after layer from the top, the ``r`` steps that end the sequence (1 to C; all of
    them where the waves would be fewer than :func:`_wavefront_forward`'s least): the last step's
    gate math with ``dhy`` alone, then launches, then their input gradients. Then the waves over
    the ``q`` chunks before them; then each layer's first step's GEMM (into ``dh0``), ``dc0``, and
    its weight and bias gradients over every step. The carried slots (``dc_carry``, ``dh_direct``)
    alternate with the launch's parity, the same in every layer of a wave (``C`` is even); the
    last layer's ``dy`` is copied chunk by chunk into its slot of ``dlayer_out``, where its stacked
    steps read it with the other layers'."""
    c, N, H, L, S = config.cell, config.rows, config.hidden_size, config.num_layers, config.state_size
    if C % 2:
        raise AssertionError(f"wavefront chunks of {C} steps: an even number is needed (carried slots by parity)")
    masked = mask is not None
    q = _wave_count(T - 1, C, L)
    r = T - q * C

    def launch(l, u, parity, stacked):  # layer l's launch u: step u's GEMM, step u+1's gate math
        fns = layer_fns[l]
        views = fns["gate_math"](0, u + 1, parity=parity + 1, stacked=stacked)
        gemm = fns["recurrent_views"](0, u, parity=parity, stacked=stacked)
        views.update(dgh=gemm["dgh"], w=gemm["w"])
        if dh_direct is not None:
            views["dh_direct_in"] = gemm["dh_direct"]
        if masked:  # the GEMM's step's mask (views["mask"]: its epilogue's step's)
            views["gemm_mask"] = mask.at("n", t=T - 1 - u)
        return views

    def inputs(l, start, length):  # layer l's input gradients of the times start..start+length-1
        prog.chunked(length, chunks, lambda first, size: layer_fns[l]["emitters"]["inputs"](start + first, size))

    for l in reversed(range(L)):  # the steps that end the sequence, layer after layer
        prog.call(pointwise, dh=dhy.at("n", "j", ld=l), **layer_fns[l]["gate_math"](0, 0))
        with prog.loop(r - 1, "step") as i:
            prog.call(single, **launch(l, i, i, False))
        inputs(l, T - r, r)

    def wave(k, lo, hi):  # wave k: layers lo..hi, layer l on its chunk k - (L-1-l) before them
        def start_of(l):  # the first time of layer l's chunk
            return T - r - (k - (L - 1 - l) + 1) * C
        if hi == L - 1 and hi > lo:  # the last layer's dy, where the stacked step reads it
            t0 = start_of(L - 1)
            prog.call(kernels.copy_steps(C, N, S), src=dy.at("t", "n", "j", t=t0), dst=dlayer.at("t", "n", "j", l=L - 1, t=t0))
        step = single if hi == lo else kernels.backward_step(c, N, H, directions=hi - lo + 1, panel=panel, masked=masked,
                                                             reduction=reduction)
        with prog.loop(C, "step") as i:
            per_layer = [launch(l, r - 1 + (k - (L - 1 - l)) * C + i, r - 1 + i, hi > lo) for l in range(lo, hi + 1)]
            if hi == lo:
                prog.call(step, **per_layer[0])
            else:
                prog.call(step, **{role: Stacked(tuple(p[role] for p in per_layer)) for role in per_layer[0]})
        for l in range(lo, hi + 1):
            inputs(l, start_of(l), C)

    # (layers from the top: the i-th the pass takes is layer L-1-i)
    _wave_loops(prog, q, L, lambda k, first, last: wave(k, L - 1 - last, L - 1 - first))
    for l in reversed(range(L)):
        fns = layer_fns[l]
        prog.call(recurrent, dh=dh0.at("n", "j", ld=l), **fns["recurrent_views"](0, T - 1))
        if dc_carry is not None:
            prog.call(kernels.copy(N, H), src=dc_carry.at("n", "j", d=l, slot=tirx.floormod(T, 2)), dst=dc0.at("n", "j", ld=l))
        fns["emitters"]["all"]()


def _projected_steps(prog: Program, config: Config, l: int, group: tuple, T, gate_math, *, d_out, w, dgh, dhp, dhy,
                     dh0, carry, mask, panel_of) -> None:
    """The time loop of the directions ``group`` of layer l (one, or both where they run together)
    of :func:`backward_program` with projections: the last step's gradient of its projected state,
    then one step after another from the end, the projection's backward with the gate math, the
    recurrent GEMM with the gradient of the step before (``dhp``; masked: the carried dh in
    ``carry``'s two slots), into dh0 at the end."""
    c, N, H, D = config.cell, config.rows, config.hidden_size, config.num_directions
    S, G, layout = config.state_size, c.num_gates, config.layout
    masked, k = mask is not None, len(group)

    def s_of(d, v):  # the time of direction d's v-th step from the end
        return _time(config, T, d, T - 1 - v)

    def weight(d, kind):  # W_hr (P, H): a one-gate weight; W_hh (G, H, P)
        return w.piece(layout.backward_copy(layout.slot(l, d, kind)))

    def dy_at(d, v):
        return d_out(axes=("n", "j"), t=s_of(d, v), j=d * S)

    def step(v):  # the projection's backward and the gate math of the v-th step from the end
        def views_of(d):
            views = gate_math(d, v)
            views.update(dgh=dhp.at("n", "j", "g", d=group.index(d), t=s_of(d, v)), w=weight(d, "weight_hr"))
            if masked:
                views["gemm_mask"] = mask.at("n", t=s_of(d, v))
            return views
        return _bind(group, views_of)

    def recurrent(v, last: bool):  # its GEMM (the recurrent side's gate gradients), the next one's dhp in the epilogue
        def views_of(d):
            gd = group.index(d)
            views = dict(dgh=dgh.at("n", "j", "g", d=gd, t=s_of(d, v)), w=weight(d, "weight_hh"))
            if masked:
                views.update(carry=carry.at("n", "j", d=gd, slot=tirx.floormod(v, 2)), mask=mask.at("n", t=s_of(d, v)))
            if last:
                views["dh"] = dh0.at("n", "j", ld=l * D + d)
            else:
                views.update(dy=dy_at(d, v + 1), g=dhp.at("n", "j", d=gd, t=s_of(d, v + 1), g=0))
                if masked:
                    views.update(mask_next=mask.at("n", t=s_of(d, v + 1)),
                                 carry_next=carry.at("n", "j", d=gd, slot=tirx.floormod(v + 1, 2)))
            return views
        return _bind(group, views_of)

    def start(d):
        views = dict(dy=dy_at(d, 0), dh=dhy.at("n", "j", ld=l * D + d), g=dhp.at("n", "j", d=group.index(d), t=s_of(d, 0), g=0))
        if masked:
            views["mask"] = mask.at("n", t=s_of(d, 0))
        return views
    for d in group if masked else ():
        prog.call(kernels.copy(N, S), src=dhy.at("n", "j", ld=l * D + d), dst=carry.at("n", "j", d=group.index(d), slot=0))
    prog.call(kernels.projected_gradient_start(N, S, masked, directions=k), **_bind(group, start))
    fused = kernels.backward_step(c, N, H, directions=k, panel=panel_of(H), masked=masked, proj=S)
    prog.call(fused, **step(0))
    gemm = kernels.projected_recurrent_backward(N, H, S, G, panel=panel_of(S), masked=masked, directions=k)
    with prog.loop(T - 1, "step") as u:
        prog.call(gemm, **recurrent(u, False))
        prog.call(fused, **step(u + 1))
    prog.call(kernels.projected_recurrent_backward(N, H, S, G, panel=panel_of(S), masked=masked, last=True,
                                                   directions=k), **recurrent(T - 1, True))


def packing_program(config: Config, schedule, panel: int = 0, panel_of=lambda k: 0,
                    view_pointers: bool = False, subroutines: Subroutines | GpuKernels | None = None,
                    backward: bool = True, proj_panel: int = 0) -> Program:
    """PyTorch-layout flat parameters (``params``) -> the packed layout (``w``), on the device:
    every parameter transposed for the forward kernels (the weights in column panels of ``panel``
    units if given: :func:`tvmrnn.schedules.cpu.weight_panel`), then the weights copied for
    the backward's, as they are or in panels of ``panel_of(K)`` input features (see
    :mod:`tvmrnn.cells.parameters`). Without ``backward``: ``pack_forward``, the forward's part
    alone (an inference call never reads the backward's copies: half the packing kernels). An
    LSTM's projection ``weight_hr`` ``(P, H)`` is a one-gate weight of P units and H inputs, in
    panels of ``proj_panel`` units."""
    layout, G, H = config.layout, config.cell.num_gates, config.hidden_size
    prog = Program("pack_weights" if backward else "pack_forward", schedule, view_pointers=view_pointers,
                   options=config.options, subroutines=subroutines)
    prog.weight_panel = panel  # recorded in exported packages' metadata, with the backward's
    prog.backward_weight_panels = {}  # K -> panel of the backward's copy of a weight with K inputs
    src = prog.flat("params", layout.total)
    dst = prog.flat("w", layout.packed_total)
    for slot in layout.slots:
        k_size = slot.torch_shape[1] if len(slot.torch_shape) == 2 else 1  # a bias is a (G, H, 1) weight
        gates = 1 if slot.kind in layout.unit_params else G  # a per-unit parameter: a 1-gate bias, copied
        units, own_panel = H, panel if gates == G else 0
        if slot.kind == "weight_hr":
            gates, units, own_panel = 1, config.proj_size, proj_panel
        # weights and biases in the forward kernels' layout (a per-unit parameter as it is)
        kernel = kernels.gate_transpose(gates, units, k_size, panel=own_panel)
        if slot.kind in ("weight_ih", "weight_hh") and config.options.bf16_projections:  # rounded, in pairs
            kernel = kernels.bf16_weight_pairs(G, H, k_size, panel)
        prog.call(kernel, src=src.piece(slot.offset), dst=dst.piece(layout.packed_offset(slot)))
        if len(slot.torch_shape) == 2 and backward:
            back = prog.backward_weight_panels[k_size] = panel_of(k_size)
            copy = kernels.weight_panels(gates, units, k_size, back) if back else kernels.copy(*slot.torch_shape)
            prog.call(copy, src=src.piece(slot.offset), dst=dst.piece(layout.backward_copy(slot)))
    return prog


def staged_weight_gradients(target, config: Config) -> bool:
    """Whether the backward stages its tail's weight gradients (:data:`CPU_STAGED_WEIGHT_GRADIENTS`):
    CPUs, at most :data:`CPU_STAGED_WEIGHT_GRADIENT_ROWS` rows, a recurrent weight of at least
    :data:`CPU_STAGED_MIN_BYTES`."""
    return (CPU_STAGED_WEIGHT_GRADIENTS and not (target is not None and is_gpu(target))
            and config.rows <= CPU_STAGED_WEIGHT_GRADIENT_ROWS
            and 4 * config.cell.num_gates * config.hidden_size * config.state_size >= CPU_STAGED_MIN_BYTES)


def all_programs(config: Config, schedule, target=None,
                 persistent_blocks: int | tuple[int, ...] | None = None) -> tuple[Program, ...]:
    """The passes a build compiles for ``target`` (a ``tvm.target.Target``, or None: CPU):
    inference forward, training forward, backward and weight packing (for all of them, and for
    the forwards alone), with the target's chunk
    sizes (:func:`chunk_steps`) and direction stacking (:func:`stack_directions`). Tuning takes
    its tasks from the same programs."""
    options = config.options
    pointers, subroutines = kernel_sharing(target, options)  # each kernel compiled once, or embedded
    how = dict(chunks=chunk_steps(target, options, config.rows), stacked=stack_directions(target, options),
               one_region=time_loop_regions(target, options), view_pointers=pointers, subroutines=subroutines)
    panel = weight_panel(target, config.cell.num_gates, config.hidden_size, options.weight_panels)
    units = packed_units(target, config.cell.num_gates, config.hidden_size, options.weight_panels)
    if config.packed_units and config.packed_units != units:
        raise ValueError(f"config.packed_units: {config.packed_units}, where this target's weight panels of {panel} "
                         f"units pack {units} (tvmrnn.runtime.build.with_compiled_rows sets it)")
    if units != config.hidden_size:  # (also for a configuration made without build's with_compiled_rows)
        config = dataclasses.replace(config, packed_units=units)
    padded = padded_inputs(target, config.layout, options.weight_panels)
    if config.padded_inputs and tuple(config.padded_inputs) != padded:
        raise ValueError(f"config.padded_inputs: {config.padded_inputs}, where this target's backward panels pad "
                         f"{padded} (tvmrnn.runtime.build.with_compiled_rows sets it)")
    if padded:
        config = dataclasses.replace(config, padded_inputs=padded)
    if not config.wave_steps and options.layer_wavefront is True and _wavefront_applies(config, options):
        config = dataclasses.replace(config, wave_steps=WAVE_STEPS)  # (as build's with_compiled_rows sets it)
    if options.bf16_projections:
        _check_bf16_projections(target, config, panel)
    proj_panel = weight_panel(target, 1, config.proj_size, options.weight_panels) if config.proj_size else 0

    def panel_of(k_size):  # the backward's data GEMMs: their tile runs along K, one "gate"
        return backward_panel(target, k_size, options.weight_panels)
    passes = options.persistent_passes

    def blocks(name):  # (a step of two kernels, with projections, is never one persistent launch)
        return persistent_blocks if name in passes and not config.proj_size else None
    interleave = interleaved_projections(target, options)
    reduction = step_reduction(target, config)
    tails = dict(tail_flops=tail_flops(target), tail_rows=tail_rows(target))
    # (CPU schedules skip ended rows' products: tvmrnn.schedules.ended_rows; GPU ones do not)
    how["skip_ended"] = options.variable_lengths and not (target is not None and is_gpu(target))

    def forward(train: bool) -> Program:
        """A forward, as a wavefront where it is one (the inference forward: :func:`layer_wavefront`,
        layer after layer where its stacked steps would not all run persistent unless asked for;
        the training forward: the configuration's, :func:`training_wavefront`)."""
        name = "forward_train" if train else "forward"
        wave = None if train else WAVE_STEPS if layer_wavefront(config, target, options) else 0
        trial = wave and options.layer_wavefront is None and blocks(name) is not None
        shared = how["subroutines"]
        kernels_table = shared.trial() if trial and isinstance(shared, GpuKernels) else shared
        made = forward_program(config, schedule, train=train, persistent_blocks=blocks(name), panel=panel,
                               interleave=interleave, proj_panel=proj_panel, wave=wave, reduction=reduction, **tails,
                               **dict(how, subroutines=kernels_table))
        if trial and not made.all_step_loops_persistent:  # a wave of launches a step: layer after layer
            return forward_program(config, schedule, train=train, persistent_blocks=blocks(name), panel=panel,
                                   interleave=interleave, proj_panel=proj_panel, wave=0, reduction=reduction, **tails,
                                   **how)
        if kernels_table is not shared:
            shared.adopt(kernels_table)
            made.subroutines = shared
        return made

    def backward() -> Program:  # (a wavefront where the configuration is one's)
        return backward_program(config, schedule, persistent_blocks=blocks("backward"),
                                packed_grads=packed_weight_gradients(target), panel_of=panel_of,
                                grad_panel=gradient_panel(target, config.cell.num_gates, config.hidden_size,
                                                          options.gradient_panels, options.weight_panels),
                                input_rows_of=lambda k, p: input_panel(target, k, config.cell.num_gates, p,
                                                                       config.rows),
                                interleave=interleave and BACKWARD_CHUNK_GRADIENTS,
                                staged=staged_weight_gradients(target, config), reduction=reduction, **tails, **how)
    programs = (forward(train=False), forward(train=True),
                backward(),
                packing_program(config, schedule, panel=panel, panel_of=panel_of, view_pointers=pointers,
                                subroutines=subroutines, proj_panel=proj_panel),
                packing_program(config, schedule, panel=panel, view_pointers=pointers, subroutines=subroutines,
                                backward=False, proj_panel=proj_panel))
    for p in programs:
        p.dependent_launch = dependent_launch(target, options)
    return programs
