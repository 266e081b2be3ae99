"""``tvmrnn.build``: compile the passes of one configuration for a target, or take them from the
on-disk build cache (:mod:`.cache`)."""
from __future__ import annotations

import dataclasses
import os
import warnings

import numpy as np

import tvm
from tqdm import tqdm

from .. import device as targets
from . import cache as build_cache
from .loader import load
from .threads import prepare_cpu_threads
from .rnn import PASSES, RNN
from ..cells.definition import get_cell
from ..options import DTYPES, as_options
from ..schedules.common import is_gpu
from ..schedules.cpu import packed_units, padded_batch, padded_inputs
from ..program.passes import (Config, half_precision_choices, loop_block_caps, planned_programs,
                              projections_refused, training_wavefront)
from ..program import passes
from ..program.sequence import SharedMemoryError, compile_module
from ..tune.records import as_built, report_untuned, scheduler, tuned_options


def _check_options(name, value, kind, minimum=None):
    if isinstance(value, bool) or not isinstance(value, kind):
        raise TypeError(f"{name}: expected {kind.__name__}, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected >= {minimum}, got {value}")


def dtype_name(dtype) -> str:
    """``"float32"``, ``"bfloat16"`` or ``"float16"`` from a name or a NumPy or torch dtype."""
    if isinstance(dtype, type) and issubclass(dtype, np.generic):  # a NumPy scalar type (np.float32)
        dtype = np.dtype(dtype).name
    name = str(dtype).removeprefix("torch.")
    name = {"float": "float32", "half": "float16", "bf16": "bfloat16"}.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}; got {dtype!r}")
    return name


def build(cell, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
          batch_size: int = 1, batch_first: bool = False, target=None, tuning_logs=None,
          allow_tf32: bool = False, options=None, cache=None, dtype=None, proj_size: int = 0) -> RNN:
    """Build a fused multi-layer RNN for fixed sizes; the sequence length stays free.

    Parameters
    ----------
    cell : str or Cell
        ``"lstm"``, ``"gru"``, ``"rnn_tanh"`` or ``"rnn_relu"``, or a cell made by
        :func:`tvmrnn.define_cell`.
    input_size, hidden_size, num_layers, bidirectional, batch_first
        As for ``torch.nn.LSTM``.
    batch_size : int
        The largest batch N a call may pass: the kernels are built for it, and a call with fewer
        rows runs padded to it (exact: rows are independent; a smaller batch costs what this one
        does, plus copying the rows in and out). Build for the batch you run most. On a CPU a
        batch whose register tiles would be one or two rows (7, 11, 13, ...) gets kernels for a
        few rows more (``rnn.config.rows``), and every call runs padded to them.
    target : None, dict, str or tvm.target.Target
        None builds for this machine's CPU, ``"cuda"`` for this machine's GPU (``"cuda:1"``: its
        GPU 1, where the RNN then runs; the PyTorch drop-ins build for their input's GPU); or e.g.
        ``"nvidia/nvidia-h100"``, ``{"kind": "llvm", "mcpu": "sapphirerapids"}``.
    tuning_logs : None, str or False
        A folder of per-target raw MetaSchedule logs (what ``tvmrnn-tune`` writes), read beside the
        records shipped in the package (the fastest record of a kernel wins); one that does not
        exist is a ValueError. None: the
        ``TVMRNN_TUNING_LOGS`` environment variable, else a source checkout's ``tuning_logs/``,
        else ``~/.local/share/tvmrnn/tuning_logs``. Kernels without a record use a default schedule
        (a warning says so, once); False (or ``TVMRNN_TUNING_LOGS=off``) uses default schedules
        throughout.
    allow_tf32 : bool
        On a CUDA target, compute the GEMMs over all steps (input projections, input and weight
        gradients) on TF32 tensor cores, as ``torch.backends.cuda.matmul.allow_tf32`` lets cuBLAS
        do: operands rounded to 10 mantissa bits, products summed in fp32 (relative errors
        ~1e-3 instead of ~1e-6). The per-step recurrent GEMMs stay fp32 (except the backward
        steps of one-gate cells past 64 rows, which run as such a GEMM, and the large forward steps
        of ``BuildOptions.tensor_core_steps``), and so does the gate math. Off by default; a CPU
        target ignores it.
    options : None, BuildOptions or dict
        Build choices beyond the sizes (:class:`tvmrnn.BuildOptions`: persistence, chunk sizes,
        direction stacking, threads, ...); None takes the measured defaults. Where they leave every
        pass-level choice to the target (:func:`tvmrnn.options.left_to_target`) and ``tvmrnn-tune``
        measured this configuration's whole passes, its winning choices apply
        (:mod:`tvmrnn.runtime.pass_tuning`). Recorded in
        ``rnn.config.options`` and in exported packages.
    dtype : None, str, numpy or torch dtype
        ``"float32"`` (the default), ``"bfloat16"`` or ``"float16"``: the dtype of the passes'
        inputs, outputs and states (:attr:`tvmrnn.BuildOptions.dtype`, which says what a half
        build computes in which precision). CPUs take ``"bfloat16"`` where they have AVX512-BF16
        or AMX-BF16; CUDA targets take both. None: ``options.dtype``.
    proj_size : int
        As for ``torch.nn.LSTM`` (0: none): an LSTM with projections, ``h_t = W_hr (o_t *
        tanh(c_t))`` of ``proj_size`` features (the states ``h0``/``hy`` and each direction's output),
        the parameters ``weight_hh_l{k}`` ``(4 * hidden_size, proj_size)`` and ``weight_hr_l{k}``
        ``(proj_size, hidden_size)``. Each step runs the recurrent step on the projected state and
        then the projection, forward and backward (fp32, on CPUs and CUDA, not with ``allow_tf32``;
        both directions of a bidirectional layer in one launch a step where ``stack_directions``
        says so). Any cell that reads ``h_{t-1}`` only through its gates takes it (not the GRU).
    cache : None or bool
        Take the build from the on-disk build cache, or put it there (:mod:`tvmrnn.runtime.cache`:
        ``~/.cache/tvmrnn`` unless ``TVMRNN_CACHE_DIR`` says otherwise). None: on unless
        ``TVMRNN_CACHE=off``. A cached build loads in about a second; it is the same package
        :meth:`RNN.export` writes, so ``rnn.programs`` (for :mod:`tvmrnn.runtime.profile`) is empty.

    Returns
    -------
    RNN
    """
    config, target, allow_tf32, device_index = _configure(
        cell, input_size, hidden_size, num_layers, bidirectional, batch_size, batch_first, target, tuning_logs,
        allow_tf32, options, dtype, proj_size)
    options = config.options
    if not is_gpu(target):
        prepare_cpu_threads(options)  # before any module of this build is loaded
    if cache is None:
        cache = not build_cache.cache_off()
    elif not isinstance(cache, bool):
        raise TypeError(f"cache: expected None or bool, got {type(cache).__name__}")

    def make():
        return _compile(config, target, tuning_logs, allow_tf32, options, device_index)

    if not (cache and build_cache.runnable_here(target)):
        return make()
    key = build_cache.build_key(config, target, options, allow_tf32, tuning_logs)  # the same for every GPU of a kind
    rnn, hit = build_cache.cached_build(
        key, make, lambda path: load(path, device=f"cuda:{device_index}" if is_gpu(target) else None))
    if hit:
        rnn.from_cache = True
        report_untuned(target, rnn.schedules)
    return rnn


@dataclasses.dataclass
class Plan:
    """What :func:`build` would compile for a configuration, without compiling it (:func:`plan`)."""
    config: Config  # the configuration as the build would have it (options, the rows its kernels take)
    target: tvm.target.Target
    allow_tf32: bool
    programs: dict  # pass name -> tvmrnn.program.sequence.Program (scheduled kernels; .build() gives its TIR)
    schedules: dict  # kernel name -> "tuned", "default", "tf32" or "unmasked record", as RNN.schedules
    records: dict  # kernel name -> the tuning record it takes, as RNN.records
    persistent_blocks: int | None  # the most blocks a persistent loop takes (GPUs), as RNN.persistent_blocks


def plan(cell, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
         batch_size: int = 1, batch_first: bool = False, target=None, tuning_logs=None,
         allow_tf32: bool = False, options=None, dtype=None, proj_size: int = 0) -> Plan:
    """What :func:`build` with the same arguments would compile, without compiling: the passes'
    programs with every kernel scheduled, and which kernels take a tuning record and which a
    default schedule (``plan(...).schedules``; no warning about untuned kernels). A few seconds
    less than a build (the compile is half or more of one), and it needs no compiler for the
    target (no CUDA toolkit for a GPU). The arguments are :func:`build`'s (no ``cache``), checked
    the same way. What only compiling finds is not here: a persistent kernel whose shared memory
    does not fit the device makes :func:`build` fall back to launched steps (with a warning),
    which a plan does not show."""
    config, target, allow_tf32, _ = _configure(
        cell, input_size, hidden_size, num_layers, bidirectional, batch_size, batch_first, target, tuning_logs,
        allow_tf32, options, dtype, proj_size)
    config, programs, used, picked = _programs(config, target, tuning_logs, allow_tf32, config.options)
    return Plan(config, target, allow_tf32 and is_gpu(target), {p.name: p for p in programs}, used, picked,
                _persistent_blocks(programs))


def _configure(cell, input_size, hidden_size, num_layers, bidirectional, batch_size, batch_first, target,
               tuning_logs, allow_tf32, options, dtype, proj_size):
    """:func:`build`'s arguments checked and resolved: ``(config, target, allow_tf32, device_index)``,
    the configuration with the options that apply (tuned pass choices, half precision's, the rows
    its kernels take)."""
    cell = get_cell(cell)
    if cell.math is None:
        raise ValueError(f"cell: {cell.name!r} came from a package and carries no math to build from; "
                         f"pass the cell made by tvmrnn.define_cell")
    for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                        ("num_layers", num_layers), ("batch_size", batch_size)):
        _check_options(name, value, int, 1)
    for name, value in (("bidirectional", bidirectional), ("batch_first", batch_first), ("allow_tf32", allow_tf32)):
        if not isinstance(value, bool):
            raise TypeError(f"{name}: expected bool, got {type(value).__name__}")
    # TVM indexes buffers with int32: a build's arrays, a layer's weights or a step's gates (an
    # all-steps GEMM's chunk holds several), must have fewer than 2^31 elements
    gates = len(cell.gates)
    weights = gates * hidden_size * max(input_size, (2 if bidirectional else 1) * hidden_size)
    if weights >= 2**31:
        raise ValueError(f"input_size, hidden_size: a weight matrix of {weights} elements (gates x hidden_size x "
                         f"inputs), past the 2^31 that TVM's int32 indexing addresses")
    if batch_size * gates * hidden_size >= 2**31:
        raise ValueError(f"batch_size: {batch_size} rows of {gates} x {hidden_size} gates make a step's arrays past "
                         f"the 2^31 elements that TVM's int32 indexing addresses")
    options = as_options(options)
    _check_options("proj_size", proj_size, int, 0)
    # (a folder that is not there, a typo, would silently build on default schedules)
    if isinstance(tuning_logs, (str, os.PathLike)) and not os.path.isdir(tuning_logs):
        raise ValueError(f"tuning_logs: {os.fspath(tuning_logs)!r} is not a folder (tvmrnn-tune writes one folder "
                         f"per target under it; None: the default logs, False: no records)")
    if dtype is not None:
        dtype = dtype_name(dtype)
        if options.dtype not in ("float32", dtype):
            raise ValueError(f"dtype: {dtype!r} disagrees with options.dtype={options.dtype!r}")
        options = dataclasses.replace(options, dtype=dtype)
    config = Config(cell, input_size, hidden_size, num_layers, bidirectional, batch_size, batch_first, options,
                    proj_size=proj_size)
    device_index = targets.gpu_index(target)  # "cuda:1": the RNN runs on GPU 1
    target = targets.resolve(target)
    refused = projections_refused(config, target, allow_tf32)
    if refused:
        raise ValueError(f"proj_size: {refused}")
    # the pass-level choices a whole-pass tuning measured for this configuration (tvmrnn-tune)
    options = tuned_options(config, target, tuning_logs, options)
    config = dataclasses.replace(config, options=options)
    options, allow_tf32 = half_precision_choices(config, options, target, allow_tf32)
    config = dataclasses.replace(config, options=options)
    config = with_compiled_rows(config, target)
    return config, target, allow_tf32, device_index


def with_compiled_rows(config: Config, target) -> Config:
    """``config`` with the batch rows its kernels are built for (``Config.compiled_rows``): on a
    CPU, fp32, a batch whose register tiles would be short (7, 11, 13 rows...) gets a few rows more,
    every call padded to them (:func:`tvmrnn.schedules.cpu.padded_batch`: 2x faster at 7 rows).
    And the other choices that the passes' arrays depend on: whether a stack's training passes
    run its layers as a wavefront (``Config.wave_steps``: its training workspace's layout)."""
    if training_wavefront(config, target, config.options):
        config = dataclasses.replace(config, wave_steps=passes.WAVE_STEPS)
    if is_gpu(target):
        return config
    # and the units of its forward gate columns (Config.packed_units): weight panels that do not
    # divide H pad the last one (tvmrnn.schedules.cpu.CPU_PADDED_PANELS)
    units = packed_units(target, config.cell.num_gates, config.hidden_size, config.options.weight_panels)
    config = dataclasses.replace(config, packed_units=units if units != config.hidden_size else 0)
    # and the backward's copies of the weights, padded where their panels do not divide K (Config.padded_inputs)
    config = dataclasses.replace(config, padded_inputs=padded_inputs(target, config.layout, config.options.weight_panels))
    if config.options.dtype != "float32" or config.options.bf16_projections:
        return config
    rows = padded_batch(config.batch_size, config.cell.num_gates, config.hidden_size, target)
    return dataclasses.replace(config, compiled_rows=rows if rows != config.batch_size else 0)


def _compile(config: Config, target, tuning_logs, allow_tf32: bool, options, device_index: int = 0) -> RNN:
    """Compile, and where a persistent kernel's shared memory does not fit the device (a template
    that undercounts its buffers at some size: sm_89's 99 KB at batch 1, H = 800, was 384 bytes
    over), compile again without persistent kernels, saying so: a build never fails for that."""
    try:
        return _compile_once(config, target, tuning_logs, allow_tf32, options, device_index)
    except SharedMemoryError as err:
        if not targets.persistent_blocks(target, options):
            raise
        warnings.warn(f"tvmrnn: a persistent kernel does not fit this GPU ({err}); building without persistent "
                      f"kernels (options.persistent='off')", RuntimeWarning, stacklevel=3)
        options = dataclasses.replace(options, persistent="off")
        return _compile_once(dataclasses.replace(config, options=options), target, tuning_logs, allow_tf32, options,
                             device_index)


def _programs(config: Config, target, tuning_logs, allow_tf32: bool, options):
    """The passes' programs, their kernels scheduled: ``(config, programs, used, picked)``, ``used``
    and ``picked`` the schedule each called kernel took and its record (``RNN.schedules``,
    ``RNN.records``); ``config`` as :func:`tvmrnn.program.passes.planned_programs` leaves it."""
    schedule, used, picked = scheduler(target, tuning_logs, allow_tf32=allow_tf32, tf32_steps=options.tf32_steps,
                                       operands=options.tensor_core_operands)
    config, programs = planned_programs(config, schedule, target, loop_block_caps(config, target))
    # the kernels the passes call (a step's launched form scheduled to decide on its persistence,
    # a persistent form that fit no block count: scheduled, not called)
    called = {as_built(k, target, allow_tf32, options.tf32_steps, options.tensor_core_operands).name
              for p in programs for k in p.kernels.values()}
    used = {name: how for name, how in used.items() if name in called}
    picked = {name: record for name, record in picked.items() if name in called}
    return config, programs, used, picked


def _persistent_blocks(programs) -> int | None:
    """The most blocks a persistent loop took (a package's load checks the GPU has that many SMs)."""
    return max((p.blocks_used for p in programs if p.uses_persistent_loops), default=None)


def _compile_once(config: Config, target, tuning_logs, allow_tf32: bool, options, device_index: int) -> RNN:
    # a long build (a 5-layer GPU build: a minute or more) shows its stages on a terminal
    with tqdm(total=2 + len(PASSES), desc=f"tvmrnn build ({target.kind.name})", unit="stage", leave=False, disable=None,
              dynamic_ncols=True) as bar:
        config, programs, used, picked = _programs(config, target, tuning_logs, allow_tf32, options)
        bar.update(1)
        functions = {}
        for p in programs:
            bar.set_postfix_str(p.name)
            functions[p.name] = p.build()
            bar.update(1)
        bar.set_postfix_str("compiling")
        module = tvm.IRModule(functions)
        for p in programs:  # CPU: the kernels the passes call (one table for all of them)
            for gvar, func in (p.subroutines.functions.items() if p.subroutines is not None else ()):
                if gvar not in module.functions:
                    module[gvar] = func
        executable = compile_module(module, target)
        bar.update(1)
    signatures = {p.name: [t.signature() for t in p.params] for p in programs}
    report_untuned(target, used)
    # TVM's JIT compiles at LLVM's highest level whatever the target says: a build that names a lower
    # one (TVMRNN_LLVM_OPT_LEVEL, the tests) is linked as a library instead, when it first runs
    level = targets.llvm_opt_level(target)
    linked = level is not None and level < 3
    rnn = RNN(config, target, None if linked else executable.jit(), signatures, executable, device_index=device_index)
    rnn.schedules = used  # kernel name -> "tuned", "default", "tf32" or "unmasked record"
    rnn.records = picked  # kernel name -> the record it took (workload key, where, its JSON)
    rnn.allow_tf32 = allow_tf32 and is_gpu(target)
    rnn.programs = {p.name: p for p in programs}  # what was compiled, for tvmrnn.runtime.profile
    rnn.persistent_blocks = _persistent_blocks(programs)
    return rnn


