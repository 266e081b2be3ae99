"""Where the time goes: every kernel of a build timed alone, against the whole passes.

Each pass (:mod:`tvmrnn.program.passes`) is one compiled function that runs scheduled per-step kernels
in loops. Here each distinct kernel is compiled on its own with the schedule ``build`` gives it
(tuned record or default), timed with TVM's ``time_evaluator`` on random inputs, and multiplied
by how often the pass runs it at sequence length ``T``. The difference between the sum and the
measured pass is what the loops cost beyond their kernels: on a GPU the launch gaps, on a CPU
the parallel-region start-up and the caches a kernel alone does not see. A persistent time
loop's step kernel is timed as its loop runs it (:func:`tvmrnn.tune.step_loop.step_loop`: 64 steps in
one cooperative launch, the weights staged once, a grid barrier a step), per step: alone, one
launch would stage its block's weights every time.

Kernels fall in four groups (:data:`GROUPS`): ``input GEMM`` (the all-steps GEMMs on the input
side: the forward's input projection, the backward's input gradient), ``weight grads`` (the
backward's weight and bias gradients), ``recurrent`` (the per-step kernels of the time loop: fused
forward and backward steps, and the backward's first and last step on their own) and ``other``
(copies).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
import tvm

from ..schedules import bf16
from ..schedules.common import is_gpu
from ..schedules.split_k import persistent_blocks
from ..tune.step_loop import STEP_LOOP_STEPS, step_loop
from ..program.sequence import Program, compile_module
from .arrays import round_to

GROUPS = ("input GEMM", "weight grads", "recurrent", "other")
_PREFIXES = {"input GEMM": ("input_projection", "input_gradient"),
             "weight grads": ("weight_gradient", "bias_gradient", "gate_untranspose"),
             "recurrent": ("recurrent_step", "backward_step", "pointwise_backward", "recurrent_backward",
                           "projection_step", "projected_recurrent_backward", "projected_gradient_start",
                           "bf16_state")}


def group_of(kernel_name: str) -> str:
    for group, prefixes in _PREFIXES.items():
        if kernel_name.startswith(prefixes):
            return group
    return "other"


@dataclass
class KernelTime:
    name: str
    group: str
    calls: int  # per pass at the profiled T
    latency_us: float  # one call, median (a persistent loop's step: one step of the loop)
    in_loop: bool = False  # a persistent loop's step, timed as one step of that loop

    @property
    def total_ms(self) -> float:
        return self.calls * self.latency_us / 1e3


@dataclass
class PassProfile:
    name: str
    T: int
    measured_ms: float  # the whole pass, median
    kernels: list[KernelTime]
    steps: int  # time-loop iterations in the pass (steps x layers x directions run one after the other)
    launches_per_step: int  # kernels run inside one iteration of a time loop
    persistent: bool = False  # the time loops are persistent kernels: one launch per loop, not per step

    @property
    def kernel_ms(self) -> float:
        return sum(k.total_ms for k in self.kernels)

    def group_ms(self, group: str) -> float:
        return sum(k.total_ms for k in self.kernels if k.group == group)

    @property
    def gap_us_per_step(self) -> float:
        """Pass time not accounted for by its kernels, per time-loop iteration."""
        return 1e3 * (self.measured_ms - self.kernel_ms) / max(self.steps, 1)

    def table(self) -> str:
        if self.persistent:
            launches = "persistent time loops (one launch per loop; steps meet at a grid barrier)"
            gap = "beyond its kernels (steps timed in their loop)"
        else:
            launches, gap = f"{self.launches_per_step} kernels per step", "gap"
        lines = [f"{self.name}: {self.measured_ms:.2f} ms measured, {self.kernel_ms:.2f} ms in kernels timed alone; "
                 f"{self.steps} steps, {launches}, "
                 f"{1e3 * self.measured_ms / max(self.steps, 1):.1f} us per step, "
                 f"{gap} {self.gap_us_per_step:.1f} us per step"]
        for group in GROUPS:
            ms = self.group_ms(group)
            if ms or group != "weight grads":
                lines.append(f"  {group:12s} {ms:9.2f} ms  {100 * ms / max(self.measured_ms, 1e-9):5.1f}% of the pass")
        for k in sorted(self.kernels, key=lambda k: -k.total_ms):
            lines.append(f"    {k.name:48s} {k.calls:6d} x {k.latency_us:9.2f} us = {k.total_ms:8.2f} ms"
                         + ("  (a step of its persistent loop)" if k.in_loop else ""))
        return "\n".join(lines)


def _device(target):
    return tvm.cuda(0) if is_gpu(target) else tvm.cpu(0)


# a variable-lengths build's masks (kernels.recurrent_step's ``mask``, backward_step's ``gemm_mask``,
# ...): 1 where a row runs. Timed with every row running, as a padded batch runs them; random
# values (below 0.5) had every row ended, and the CPU kernels skipped their GEMMs
_MASKS = ("mask", "gemm_mask", "mask_next")


def random_tensors(shapes, dev, names=None):
    """Random float32 arguments on ``dev`` (those ``names`` calls a mask: ones, every row running);
    on a CPU where tvmrnn's own arrays get huge pages
    (:func:`tvmrnn.runtime.arrays.huge_pages`), the large ones get them too, as a user's call gives its
    scratch and workspaces (with 4 KB pages a pass measured 20-34 us a step slower than its kernels
    on the Xeon, against 4-7 us with a user's arrays: notes/performance.md v24)."""
    import tvm_ffi

    from .arrays import huge_empty, wants_huge_pages
    rng = np.random.default_rng(0)
    tensors = []
    for shape, name in zip(shapes, names or [None] * len(shapes)):
        values = _pairs_of_bf16(rng.random(shape, np.float32) - 0.5, rng.random(shape, np.float32) - 0.5)
        if name in _MASKS:
            values = np.ones(shape, np.float32)
        if dev.dlpack_device_type() == tvm.cpu(0).dlpack_device_type() and wants_huge_pages(values.nbytes):
            array = huge_empty(values.shape)
            array[...] = values
            tensors.append(tvm_ffi.from_dlpack(array))
        else:
            tensors.append(tvm.runtime.tensor(values, device=dev))
    return tensors


def pass_arguments(rnn, name: str, T: int, dev) -> list:
    """A pass's arguments at sequence length ``T``, as its kernels are timed: random values, masks
    of ones (:func:`random_tensors`)."""
    shapes = rnn.shapes(name, T)
    return random_tensors(shapes.values(), dev, list(shapes))


def _pairs_of_bf16(high, low) -> np.ndarray:
    """float32 values whose two 16-bit halves are each a bf16 value of the same range: ``high``
    rounded to bf16 (:func:`tvmrnn.runtime.arrays.round_to`) with ``low``'s bf16 bits below. Read
    as float32 they are ``high`` within bf16's rounding; a bf16 kernel's pair-packed buffers
    (weights and states of ``BuildOptions.bf16_projections``, :func:`tvmrnn.kernels.bf16_pair`)
    read them as two sane bf16 values. Plain uniform float32s gave those kernels random bit patterns as their low
    halves, infinities, NaN and denormals among them, whose arithmetic can run far slower than
    real data's (a division-free sigmoid tried in notes/performance.md v49 timed 3x slower alone
    on them, 10% slower on real data)."""
    def bits(v):
        return round_to("bfloat16", np.asarray(v, np.float32)).view(np.uint32)
    return (bits(high) | (bits(low) >> np.uint32(16))).view(np.float32).reshape(np.shape(high))


def kernel_timer(func, target, number: int = 20, repeat: int = 5):
    """One scheduled kernel compiled alone, ready to time: ``(timer, args)``, TVM's
    ``time_evaluator`` over it (``number`` calls a result, ``repeat`` results) and its arguments,
    random values, the same at every call (:func:`random_tensors`)."""
    dev = _device(target)
    if not is_gpu(target) and bf16.supports_amx(target) and not bf16.request_amx():
        # (a tile instruction the OS has not allowed is SIGILL: the whole process, not an error)
        raise RuntimeError("tvmrnn: timing a kernel for an AMX target, and the OS refused this process AMX tiles")
    lib = compile_module(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target)
    args = random_tensors([[int(s) for s in param.shape] for param in func.params], dev,
                          [param.name for param in func.params])
    return lib.jit().time_evaluator("main", dev, number=number, repeat=repeat), args


def time_kernel(func, target, number: int = 20, repeat: int = 5, results: list | None = None) -> float:
    """Median latency of one scheduled kernel alone, in microseconds. Its arguments are the same
    random values at every call; ``results``, if given, gets them as NumPy arrays after the runs
    (so two schedules of one kernel can be compared)."""
    timer, args = kernel_timer(func, target, number, repeat)
    us = 1e6 * statistics.median(timer(*args).results)
    if results is not None:
        results.extend(a.numpy() for a in args)
    return us


def profile_pass(rnn, program: Program, T: int, reps: int = 5) -> PassProfile:
    """Time one pass of a built RNN and every kernel in it."""
    dev = _device(rnn.target)
    frame_args = pass_arguments(rnn, program.name, T, dev)
    fn = rnn.module[program.name]
    fn(*frame_args)
    dev.sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn(*frame_args)
        dev.sync()
        times.append(time.perf_counter() - t0)
    kernels = []
    for name, calls in program.calls(T).items():
        if calls == 0:
            continue
        func = program.scheduled(name)
        if program.uses_persistent_loops and persistent_blocks(func) is not None:
            us = time_kernel(step_loop(func, rnn.target), rnn.target, number=5) / STEP_LOOP_STEPS
            kernels.append(KernelTime(name, group_of(name), calls, us, in_loop=True))
        else:
            kernels.append(KernelTime(name, group_of(name), calls, time_kernel(func, rnn.target)))
    steps, per_step = program.step_counts(T)
    return PassProfile(program.name, T, 1e3 * statistics.median(times), kernels, steps, per_step,
                       persistent=program.uses_persistent_loops)


def profile(rnn, T: int = 300, passes=("forward", "forward_train", "backward"), reps: int = 5) -> list[PassProfile]:
    """Profile the passes of a built RNN (``tvmrnn.build``) at sequence length ``T``: the kernels
    timed are the scheduled ones the build compiled."""
    if not rnn.programs:
        raise ValueError("rnn: profiling needs an RNN made by tvmrnn.build (a loaded package keeps "
                         "no per-kernel code)")
    return [profile_pass(rnn, rnn.programs[p], T, reps) for p in passes]
