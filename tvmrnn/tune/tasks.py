"""Tuning tasks: one per distinct kernel of the programs a build compiles (kernels with the same
name share a workload), weighted by how often each runs in a training step and an inference pass at
a reference sequence length, and ranked by their share of that time."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
import tvm
import tvm_ffi
from ..schedules import default_schedule
from ..schedules.common import is_gpu
from ..schedules.split_k import persistent_blocks
from ..kernels import Kernel
from ..program.passes import half_precision_choices, loop_block_caps, planned_programs

from .records import as_built, best_latency_us, is_fused_step, workload


REFERENCE_LENGTH = 300  # Deep Speech 2's T: the sequence length task weights are counted at


# ---- tasks ------------------------------------------------------------------------------------
@dataclass
class Task:
    kernel: Kernel
    calls: int  # runs per training step (forward_train + backward) and inference forward, at REFERENCE_LENGTH

    @functools.cached_property
    def flops(self) -> float:
        """Floating-point operations of one call (TVM's estimate from the kernel's loops)."""
        try:
            return float(tvm.s_tir.analysis.estimate_tir_flops(workload(self.kernel)))
        except Exception:  # an estimate only: a kernel it cannot read ranks by its calls alone
            return 0.0


def rank_tasks(tasks: list[Task], db=None) -> list[Task]:
    """Tasks by their share of a training step, largest first: where trials should go.

    A task the log has measured counts its calls x best latency; one it has not, its calls x its
    FLOPs at the rate (FLOP/s) of the measured tasks together, or with none measured its calls x
    FLOPs alone. Per-step kernels run hundreds of times, each all-steps GEMM a few times but
    hundreds of times longer, so the count of calls alone ranks the GEMMs far too low.
    """
    measured = {id(t): best_latency_us(db, t.kernel) if db is not None else None for t in tasks}
    done = [t for t in tasks if measured[id(t)] and t.flops]
    # FLOP per us over the measured tasks together: the big GEMMs' rate, which is what the
    # unmeasured tasks with many FLOPs (GEMMs of other shapes) are likely to run at
    rate = sum(t.flops for t in done) / sum(measured[id(t)] for t in done) if done else None

    def cost(t):
        if measured[id(t)]:
            return t.calls * measured[id(t)]
        if rate:
            return t.calls * max(t.flops / rate, 1.0)  # at least a microsecond a call
        return t.calls * max(t.flops, 1.0)

    return sorted(tasks, key=lambda t: -cost(t))


def select_tasks(configs, target, kernels=None, max_tasks=None, db=None) -> list[Task]:
    """The tasks of ``configs`` on ``target`` that :func:`tune` works on, in its order: those whose
    name contains one of ``kernels`` (None: all), ranked by :func:`rank_tasks`, the first ``max_tasks``."""
    tasks = [t for t in extract_tasks(configs, target=target)
             if kernels is None or any(k in t.kernel.name for k in kernels)]
    return rank_tasks(tasks, db)[:max_tasks]


def extract_tasks(configs, length: int = REFERENCE_LENGTH, target=None, allow_tf32: bool = False) -> list[Task]:
    """One task per distinct kernel over all ``configs``, weighted by runs per step at ``length``.

    ``target`` picks the programs as build does (``passes.planned_programs``: chunk sizes, direction
    stacking, and on GPUs the persistent time loops, whose step kernel is a task of its own:
    :func:`is_persistent`), and the choices a build makes for the configuration's dtype
    (:func:`tvmrnn.program.passes.half_precision_choices`): on CPUs a bf16 build's bf16 kernels;
    on GPUs, a half configuration, one with ``tensor_core_steps``, or any with ``allow_tf32``,
    has the kernels its build runs on TF32 tiles as their TF32 workloads
    (:func:`tvmrnn.tune.records.as_built`, as the build's scheduler takes them).
    """
    tasks: dict[str, Task] = {}
    target = tvm.target.Target(target) if isinstance(target, (str, dict)) else target

    def schedule(kernel):
        # a persistent loop is decided by its step's schedule (weights on chip), and a large forward
        # step's loop below 160 rows by its launched form's (split over blocks or not:
        # common.launches_beat_persistence), each as a build without records schedules it
        if persistent_blocks(kernel.func) or (target is not None and is_gpu(target) and is_fused_step(kernel)):
            return default_schedule(kernel, target)
        return kernel.func

    for config in configs:
        tf32_on = False
        if target is not None:  # the options and TF32 choice a build makes (CPU bf16 GEMMs, TF32 on GPUs);
            # an fp32 configuration asking for TF32 steps builds only with allow_tf32
            options, tf32_on = half_precision_choices(
                config, config.options, target, allow_tf32 or bool(config.options.tensor_core_steps))
            config = dataclasses.replace(config, options=options)
        blocks = loop_block_caps(config, target) if target is not None and is_gpu(target) else None
        for program in planned_programs(config, schedule, target, blocks)[1]:
            for name, count in program.calls(length).items():
                kernel = as_built(tuned_as(program.kernels[name]), target, tf32_on, config.options.tf32_steps,
                                  config.options.tensor_core_operands)
                task = tasks.setdefault(kernel.name, Task(kernel, 0))
                task.calls += count
    return sorted(tasks.values(), key=lambda t: -t.calls)


def tuned_as(kernel: Kernel) -> Kernel:
    """The kernel whose task tunes ``kernel``: its unmasked twin where no block reads its mask.

    A variable-lengths CPU build's chunk GEMMs take the chunk's mask only for the skip that
    :mod:`tvmrnn.schedules.ended_rows` adds after scheduling (:func:`tvmrnn.kernels._ended_rows_mask`):
    the same computation as the twin, whose record the build replays on them
    (:func:`tvmrnn.tune.records.scheduler`), so trials on them would be spent twice. Masked steps,
    whose select reads the mask, stay tasks of their own."""
    if kernel.unmasked is None:
        return kernel
    reads = []

    def visit(block, mutator):
        reads.extend(str(r.source.name) for r in block.reads)
        return mutator.default_mutate(block)
    tvm_ffi.structural_mutate(kernel.func.body, [(tvm.s_tir.SBlock, visit)])
    return kernel if "mask" in reads else kernel.unmasked


def is_persistent(kernel: Kernel) -> bool:
    """A persistent time loop's step kernel (:func:`tvmrnn.kernels.persistent`). Its task measures
    a candidate as that loop runs it, :data:`tvmrnn.tune.step_loop.STEP_LOOP_STEPS` steps in one launch
    (:class:`StepLoopBuilder`), and logs the time per step; its design space is its template's
    (split-K's persistent form, :data:`tvmrnn.schedules.PERSISTENT_VARIANTS`, or row tiles' for
    many rows, :data:`tvmrnn.schedules.variants.ROW_TILE_VARIANTS`), whose listed shapes
    :func:`seed_defaults` measures: MetaSchedule's own rules do not keep weights in shared memory
    across steps, which is what makes such a loop fast."""
    return persistent_blocks(kernel.func) is not None
