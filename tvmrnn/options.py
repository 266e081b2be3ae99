"""Build options: every choice a build makes beyond the RNN's sizes and target, in one typed object.

``tvmrnn.build(..., options=BuildOptions(persistent="off"))``. The options are recorded in the
build's config (``rnn.config.options``) and in exported packages' metadata; a choice that changes a
kernel (a panel width, a chunk size, persistence) changes that kernel's name and workload, so its
tuning records are its own. ``None`` means "the target decides" (the defaults measured best, each
documented where it is applied).

One environment variable sets a default here, for users who cannot reach the ``build`` call (a
training script using the PyTorch drop-ins): ``TVMRNN_PERSISTENT`` (``auto``, ``forward``, ``all``
or ``off``). The other user-facing variables are runtime settings, not build choices:
``TVMRNN_TUNING_LOGS`` (where records are read), ``TVMRNN_HUGE_PAGES`` (``auto``/``1``/``0``, the
kept arrays' pages) and ``TVM_NUM_THREADS`` (CPU threads; see :attr:`BuildOptions.threads`).
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass, field

PERSISTENT = ("auto", "forward", "all", "off")
# the passes whose time loops may run persistently, by `BuildOptions.persistent`
PERSISTENT_PASSES = {"auto": ("forward", "forward_train", "backward"), "forward": ("forward",),
                     "all": ("forward", "forward_train", "backward"), "off": ()}
# the values TVMRNN_PERSISTENT took before it named the choices (kept so that old scripts run;
# "train" meant both forwards, and as "auto" now also runs many-row backward loops persistent)
_PERSISTENT_ALIASES = {"1": "all", "0": "off", "train": "auto"}
DEPENDENT_LAUNCH = ("off", "wait", "early")
DTYPES = ("float32", "bfloat16", "float16")


def _persistent_default() -> str:
    value = os.environ.get("TVMRNN_PERSISTENT", "") or "auto"
    value = _PERSISTENT_ALIASES.get(value, value)
    if value not in PERSISTENT:
        raise ValueError(f"TVMRNN_PERSISTENT: expected one of {', '.join(PERSISTENT)}; got {value!r}")
    return value


@dataclass(frozen=True)
class BuildOptions:
    """What a build chooses beyond sizes and target. Every field has a measured default.

    Parameters
    ----------
    persistent : {"auto", "forward", "all", "off"}
        GPU time loops that run as one persistent kernel (the loop inside the kernel, a grid
        barrier between steps, each block's slice of the recurrent weights in shared memory for
        every step). ``auto``: both forward passes, where the step's weights fit on chip (fastest
        on the H100 at Deep Speech 2 sizes, notes v10, v14, v21), and the backward where its step
        takes row tiles (128 rows or more a direction; an LSTM's from 32 at up to 160 units, v83)
        with its weights on chip (many-row training 0.48-0.84x -> 0.74-1.29x cuDNN on the H200,
        notes v34) or split-K with less than
        2^24 multiply-adds a step (few rows, small H: LSTM N = 8, H = 128 training 0.80 -> 0.57 ms,
        notes v57); ``forward``: the inference
        forward, whether or not they fit; ``all``: every pass's (the backward's larger split-K steps
        too: slower at Deep Speech 2 sizes; and steps whose weights do not fit on chip; for studies);
        ``off``: one launch per step. Default: ``TVMRNN_PERSISTENT``, else ``auto``.
    persistent_blocks : int or None
        At most this many thread blocks per persistent kernel (each then owns more of the step's
        columns and their weights). None: one per SM. Fewer blocks make each step's grid barrier
        cheaper where a step has little work (batch 1, small hidden sizes); one block meets at
        ``__syncthreads`` alone. A time loop whose step cannot be split so (two directions in one
        launch need a block each) stays a loop of launches. ``tvmrnn-tune``'s whole-pass stage
        tries it.
    persist_stacked : bool
        Whether a time loop running both directions of a layer in one launch may be persistent too
        (on since v21: 5-layer LSTM training 1.46x -> 1.62x cuDNN on the H100).
    dependent_launch : {"off", "wait", "early"}
        Programmatic dependent launch between a GPU pass's kernels (sm_90+; ignored elsewhere).
    shared_kernels : bool
        One compiled kernel for every call site running the same code. GPU: views passed as
        pointers; a 5-layer bidirectional GRU's 530 kernels become a few dozen (builds 2.5-3x
        faster, v20), each lowered once as a device function the passes launch (a 4-layer
        bidirectional LSTM's build 33.1 -> 10.8 s, v55). CPU: kernels are functions the passes
        call (builds 2-3x faster, the same bits, v31, v33).
    stack_directions : bool or None
        Both directions of a bidirectional layer in one launch per step. None: GPUs and CPUs of
        8 cores or more (faster there; 11-20% slower on 2 cores, whose L2 cannot hold both).
    interleave_projections : bool or None
        CPU forwards project each 16-step chunk just before its steps, into a buffer of one chunk
        (4 MB instead of 77 MB for a DS2 LSTM, same speed, v26), and backwards take each chunk's
        weight and input gradients right after its steps (v74: 0-20% faster backwards on a 2-core
        EPYC). None: CPUs yes, GPUs no.
    time_loop_regions : bool or None
        CPU: each time loop as one parallel region with a barrier between steps, instead of a region
        a step. None: CPUs yes (v74: as fast or faster at every shape measured, the 16-core Xeon
        up to 38% for a forward and 32% for training at few rows, a 2-core EPYC 0-7%; notes v73-v74);
        ``tvmrnn-tune`` measures the other choice per configuration as a pass-level option. A
        kernel whose columns take guarded tiles (a hidden or input size that no whole number of
        vectors divides: ``schedules.cpu.CPU_GUARDED_TILES``) joins the region with its tile loop
        given whole (``program.sequence._whole_tiles``, v79; a region per step before).
    weight_panels, gradient_panels : bool or None
        CPU: recurrent weights, and the backward's weight gradients, in gate-blocked column panels
        that the GEMM's register tile reads whole. None: where the schedule's tile is narrower
        than the hidden size.
    chunk_steps : tuple of int or None
        Sizes of the chunks of steps the all-steps GEMMs run over, largest first, ending in 1.
        None: ``(16, 4, 1)`` on CPUs (each chunk's gates stay in L2), ``(256, 32, 16, 8, 4, 1)`` on GPUs,
        ``(256, 128, 64, 32, 4, 1)`` there for batches of 64 rows or more.
    threads : int or None
        CPU threads. None: ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS`` if set, else this process's
        physical cores (TVM alone would take half the logical CPUs). TVM's thread pool reads this
        once, at the first parallel kernel of the process, so the first CPU build decides it (as it
        does the OpenMP pool's, :mod:`tvmrnn.runtime.threads`); a later build asking for another
        count runs on the first's, with a RuntimeWarning.
    bf16_projections : bool
        CPUs with AVX512-BF16 (Zen 4 and later, Sapphire Rapids and later): the forwards' GEMMs,
        the input projections and every step's recurrent projection, multiply bf16-rounded
        operands (``vdpbf16ps``) and sum in fp32; relative errors ~2e-3 (fp32: ~2e-7). The weights
        are packed rounded (so packed weights serve only builds with the same choice); the state,
        the gate math and the backward stay fp32. Forwards 1.5-2x faster on a 2-core Zen 4
        (notes v40). Off by default; a target without the instruction, a GPU, or a hidden size
        without 16-unit weight panels is a ValueError at build. The PyTorch drop-ins use it where
        torch.nn computes in bf16 (under CPU bf16 autocast, which runs every RNN's GEMMs in bf16,
        and for bf16 modules).
    variable_lengths : bool
        Rows of different lengths in one batch (``lengths=`` of the passes; ``PackedSequence`` in
        the PyTorch drop-ins): each step takes a mask of the rows still running, and a finished
        row keeps its state and outputs zeros, as ``torch.nn`` does for packed sequences. Off by
        default: the masked steps are other kernels (their own tuning records).
    dtype : {"float32", "bfloat16", "float16"}
        The dtype of the passes' inputs, outputs and states (``tvmrnn.build(dtype=...)`` sets it).
        A half build takes ``x``, the states and the output gradients in that dtype and returns
        ``y``, ``hy``, ``cy`` and the input and state gradients in it; the weights are packed
        rounded to it (from fp32 or half parameters); the weight gradients come back fp32, for an
        optimizer's master weights. Inside, sums are fp32 and so are the states between steps
        (torch.nn and cuDNN round ``h`` to half at every step; tvmrnn keeps it fp32, and only the GEMMs
        on half operands read it, and the layers' outputs, rounded (``half_operands``), so its
        errors are at most theirs). CPUs: ``bfloat16`` only, its forward GEMMs those of ``bf16_projections``
        (AMX or AVX512-BF16) where they apply, else fp32 GEMMs on the rounded values (a hidden
        size without 16-unit weight panels); the casts in and out
        run on TVM's threads. CUDA: both; the all-steps GEMMs on tensor cores (the TF32 tiles of
        ``allow_tf32``, exact on half operands; the forward's on half operands, ``half_operands``),
        the steps' recurrent GEMMs in fp32 except the large steps of ``tensor_core_steps``.
    tensor_core_steps : bool or None
        GPU: a forward step whose recurrent GEMM is large (128 rows or more a direction, 2^27
        multiply-adds a direction, :func:`tvmrnn.schedules.common.tf32_step`) runs on the TF32
        tiles of the all-steps GEMMs, one launch a step, its gate math a second kernel, instead of
        fp32 split-K, row tiles or the SIMT tiled GEMM (where ``persistent`` is ``auto``: the
        other settings keep such a loop persistent and fp32). H200 fp16, LSTM N = 128, H = 1024:
        1.7x faster inference; N = 256, H = 512: 1.46x; smaller steps lost (notes v50). So do the
        backward's steps on the SIMT tiled GEMM and those of 160 rows or more a direction
        (:data:`tvmrnn.schedules.common.GPU_TF32_BACKWARD_STEPS`): GRU N = 256, H = 2048 training
        1.44x faster (notes v52). The hidden state then reaches the tensor cores rounded to
        TF32 every step (10 mantissa bits, as many as fp16: cuDNN's half path rounds it to half).
        None: half builds (``dtype``) yes, fp32 builds no; True in an fp32 build needs
        ``allow_tf32`` (errors of TF32, ~1e-3, in every step); GPU builds only.
    half_operands : bool or None
        GPU half builds: the forward passes' tensor-core GEMMs round their operands to ``dtype`` as
        they stage them in shared memory and multiply them with ``mma.m16n8k16`` (fragments
        loaded by ``ldmatrix``), twice TF32's rate, instead of the TF32 tiles. Exact for the first
        layer's inputs and the weights (half values already); a later layer's input (the layer
        below's output) and a step's hidden state reach their GEMMs rounded to half, as cuDNN's
        half path stores them (fp16: values past 65504 become inf there too). None: the input projections
        (GEMMs over all steps) of half builds; their steps (``tensor_core_steps``) stay on TF32
        tiles, which were 7-15% faster on the H200 (the steps' copies from global memory, fp32
        and a float at a time, bound them, not the multiply-adds; notes v51). True: the steps too;
        False: neither. The backward's GEMMs stay TF32 (gradients rounded to fp16 would
        underflow). True needs a half ``dtype``.
    row_groups : bool or None
        GPU: a persistent step of fewer than 128 rows a direction whose direction's weights fit one
        block's shared memory (fp32 on the H100: LSTM H up to ~110, GRU ~128, Elman ~230) runs in
        blocks that split the rows alone, each holding all of the weights, meeting at
        ``__syncthreads`` with no grid barrier (as cuDNN's ``RNN_blockPersist`` kernels do), instead
        of split-K's blocks of a few units each and a grid barrier a step. The blocks' code is that
        of the row tiles measured at 128 rows (notes v57-v59). None: on (where it applies and
        ``persistent_blocks`` is not given); ``tvmrnn-tune``'s whole-pass stage tries it off.
    layer_wavefront : bool or None
        A unidirectional stack (2 layers or more, without projections) runs its layers as a
        wavefront, as cuDNN does: chunks of :data:`tvmrnn.program.passes.WAVE_STEPS` steps,
        layer l on chunk k while layer l+1 runs chunk k-1, every layer's steps in one launch (a
        leading axis over layers, as over the two directions of a bidirectional layer). A step
        that leaves most of the GPU idle (few rows, small hidden sizes) then does the work of
        every layer in the time of one: the H100's GRU N = 32, H = 126, 3 layers, T = 700
        inference 2.55 -> 1.36 ms (cuDNN 1.93; notes v86), training 8.08 -> 4.97 ms (cuDNN 5.67;
        notes v88). None: every pass (the training forward's workspace then keeps the last
        layer's states with the others') on GPUs where every layer's recurrent weights fit half
        the chip's shared memory and a step has at most 2^25 multiply-adds
        (:func:`tvmrnn.program.passes.layer_wavefront`), and where its stacked steps run
        persistent; layer after layer elsewhere. True: wherever it applies, persistent or not
        (on a CPU: correct, slower on 2 cores); ``tvmrnn-tune``'s whole-pass stage measures both.
    """

    persistent: str = field(default_factory=_persistent_default)
    persistent_blocks: int | None = None
    persist_stacked: bool = True
    dependent_launch: str = "wait"
    shared_kernels: bool = True
    stack_directions: bool | None = None
    interleave_projections: bool | None = None
    time_loop_regions: bool | None = None
    weight_panels: bool | None = None
    gradient_panels: bool | None = None
    chunk_steps: tuple[int, ...] | None = None
    threads: int | None = None
    variable_lengths: bool = False
    bf16_projections: bool = False
    dtype: str = "float32"
    tensor_core_steps: bool | None = None
    half_operands: bool | None = None
    row_groups: bool | None = None
    layer_wavefront: bool | None = None

    def __post_init__(self):
        persistent = _PERSISTENT_ALIASES.get(self.persistent, self.persistent) if isinstance(
            self.persistent, (str, bool, type(None))) else self.persistent
        if not isinstance(persistent, str) or persistent not in PERSISTENT:
            raise ValueError(f"options.persistent: expected one of {', '.join(PERSISTENT)}; got {self.persistent!r}")
        object.__setattr__(self, "persistent", persistent)
        if not isinstance(self.dependent_launch, (str, type(None))) or self.dependent_launch not in DEPENDENT_LAUNCH:
            raise ValueError(f"options.dependent_launch: expected one of {', '.join(DEPENDENT_LAUNCH)}; "
                             f"got {self.dependent_launch!r}")
        for name in ("persist_stacked", "shared_kernels", "variable_lengths", "bf16_projections"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"options.{name}: expected True or False, got {getattr(self, name)!r}")
        for name in ("stack_directions", "interleave_projections", "time_loop_regions", "weight_panels", "gradient_panels",
                     "tensor_core_steps", "half_operands", "row_groups", "layer_wavefront"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), bool):
                raise TypeError(f"options.{name}: expected None, True or False, got {getattr(self, name)!r}")
        if self.chunk_steps is not None:
            steps = tuple(self.chunk_steps) if isinstance(self.chunk_steps, (tuple, list)) else None
            if (not steps or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 or s > 4096 for s in steps)
                    or list(steps) != sorted(set(steps), reverse=True) or steps[-1] != 1):
                raise ValueError(f"options.chunk_steps: expected distinct ints from 1 to 4096, largest first, ending in 1; "
                                 f"got {self.chunk_steps!r}")
            object.__setattr__(self, "chunk_steps", steps)
        if self.dtype not in DTYPES:
            raise ValueError(f"options.dtype: expected one of {', '.join(DTYPES)}; got {self.dtype!r}")
        for name in ("persistent_blocks", "threads"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"options.{name}: expected None or a positive int, got {value!r}")

    @property
    def persistent_passes(self) -> tuple[str, ...]:
        """The passes whose time loops may run as persistent kernels."""
        return PERSISTENT_PASSES[self.persistent]

    @property
    def tf32_steps(self) -> bool:
        """Whether large steps run on TF32 tiles, in a GPU build (``tensor_core_steps``; None: half
        builds; CPU builds never act on it)."""
        return self.tensor_core_steps if self.tensor_core_steps is not None else self.dtype != "float32"

    @property
    def tensor_core_operands(self) -> tuple[str, str]:
        """What a GPU build's forward tensor-core GEMMs multiply, ``(GEMMs over all steps,
        steps)``: ``dtype`` or "tf32", as ``half_operands`` says."""
        half = self.dtype != "float32" and self.half_operands is not False
        return (self.dtype if half else "tf32", self.dtype if half and self.half_operands else "tf32")

    def to_dict(self) -> dict:
        """JSON-ready fields (for package metadata and records)."""
        out = dataclasses.asdict(self)
        if not out["bf16_projections"]:  # (left out at its default: packages and cache keys as before it)
            del out["bf16_projections"]
        if out["dtype"] == "float32":  # (the same)
            del out["dtype"]
        if out["tensor_core_steps"] is None:  # (the same)
            del out["tensor_core_steps"]
        if out["half_operands"] is None:  # (the same)
            del out["half_operands"]
        if out["row_groups"] is None:  # (the same)
            del out["row_groups"]
        if out["layer_wavefront"] is None:  # (the same)
            del out["layer_wavefront"]
        if out["chunk_steps"] is not None:
            out["chunk_steps"] = list(out["chunk_steps"])
        return out

    @classmethod
    def from_dict(cls, fields: dict) -> "BuildOptions":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(f"options: unknown field(s) {unknown}; known: {sorted(known)}")
        fields = dict(fields)
        if fields.get("chunk_steps") is not None:
            fields["chunk_steps"] = tuple(fields["chunk_steps"])
        return cls(**fields)


# the pass-level choices that ``tvmrnn-tune`` measures as whole passes (tvmrnn.runtime.pass_tuning)
# and ``build`` applies from its verdicts where the options leave them to the target: each one's
# "the target decides" value
TUNED_FIELDS = {"persistent": "auto", "persistent_blocks": None, "row_groups": None, "layer_wavefront": None,
                "stack_directions": None, "interleave_projections": None,
                "weight_panels": None, "gradient_panels": None, "chunk_steps": None, "time_loop_regions": None}


def left_to_target(options: BuildOptions) -> bool:
    """Whether every pass-level choice of ``options`` (:data:`TUNED_FIELDS`) is left to the target,
    so that a tuned choice of them may apply."""
    return all(getattr(options, name) == value for name, value in TUNED_FIELDS.items())


# the experiment switches BuildOptions replaced (v27), and what replaces each
_REMOVED_SWITCHES = {"TVMRNN_PDL": "dependent_launch", "TVMRNN_SHARED_KERNELS": "shared_kernels",
                     "TVMRNN_STACK_DIRECTIONS": "stack_directions", "TVMRNN_INTERLEAVE": "interleave_projections",
                     "TVMRNN_TIME_LOOP_REGION": "time_loop_regions", "TVMRNN_WEIGHT_PANELS": "weight_panels",
                     "TVMRNN_GRADIENT_PANELS": "gradient_panels", "TVMRNN_PERSIST_STACKED": "persist_stacked"}
_warned: set = set()


def _warn_removed_switches() -> None:
    for name, field_name in _REMOVED_SWITCHES.items():
        if name in os.environ and name not in _warned:
            _warned.add(name)
            warnings.warn(f"tvmrnn: {name} is no longer read; pass tvmrnn.BuildOptions({field_name}=...) to build",
                          UserWarning, stacklevel=4)


def as_options(options) -> BuildOptions:
    """``options`` as :class:`BuildOptions`: None (the defaults), an instance, or a dict of its fields."""
    _warn_removed_switches()
    if options is None:
        return BuildOptions()
    if isinstance(options, BuildOptions):
        return options
    if isinstance(options, dict):
        return BuildOptions.from_dict(options)
    raise TypeError(f"options: expected a tvmrnn.BuildOptions, a dict of its fields or None; got {type(options).__name__}")


def cpu_threads(options: BuildOptions) -> int:
    """The CPU thread count a build runs with (:attr:`BuildOptions.threads`)."""
    if options.threads is not None:
        return options.threads
    for name in ("TVM_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        import psutil
        physical = psutil.cpu_count(logical=False) or allowed
    except ImportError:
        physical = allowed
    return max(1, min(allowed, physical))


def use_cpu_threads(options: BuildOptions) -> None:
    """Give TVM's CPU thread pool :func:`cpu_threads` threads, if it has not started yet.

    TVM's pool reads ``TVM_NUM_THREADS`` when it starts (the first parallel kernel), so this sets
    that variable, for this process and the processes it starts (MetaSchedule's measuring
    workers), unless the user set it or ``OMP_NUM_THREADS``. Called by CPU builds and by tuning,
    never on import."""
    if options.threads is None and ("TVM_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ):
        return
    os.environ["TVM_NUM_THREADS"] = str(cpu_threads(options))
