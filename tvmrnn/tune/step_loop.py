"""What tuning measures for a persistent task's candidate: its step kernel run as a pass's time
loop runs it, many steps in one persistent launch (:func:`step_loop`)."""
from __future__ import annotations

import tvm
from tvm import tirx

from .. import kernels
from ..kernels import Kernel
from ..program.sequence import COOPERATIVE, F32, LAUNCH_PARAMS, Program, SequenceTensor
from ..schedules import default_schedule
from ..schedules.split_k import persistent_blocks
from ..device import dependent_launch
from ..options import BuildOptions


# Steps a persistent task's candidate runs in one launch when tuning measures it (`step_loop`):
# enough that the weights' copy into shared memory, once per launch, is a small part of the time
# (as at T = 300), few enough that a measurement stays short.
STEP_LOOP_STEPS = 64


def step_loop(func: tirx.PrimFunc, target: tvm.target.Target, steps: int = STEP_LOOP_STEPS) -> tirx.PrimFunc:
    """A scheduled persistent step kernel (:func:`tvmrnn.kernels.persistent`) run ``steps`` times
    in one persistent launch, as a pass's time loop runs it (:meth:`Program.loop`: the block's
    weights copied into shared memory once, a grid barrier after each step), on the kernel's own
    buffers: the function has the kernel's parameters, every step reads the same inputs and
    writes the same outputs. This is what tuning measures for a persistent task's candidate (a
    kernel measured alone would copy its weights at every call; :class:`tvmrnn.tune.tuner.StepLoopBuilder`).
    Raises ValueError where the schedule cannot run persistently (more blocks than the kernel's
    limit, or more than one launch a step): a pass would run it as a host loop of launches."""
    blocks = persistent_blocks(func)
    if blocks is None:
        raise ValueError("step_loop: not a persistent kernel (no tvmrnn.persistent_blocks attribute)")
    rows = kernels.row_groups(func)  # blocks of row groups (kernels.persistent(row_groups=True))
    suffix = "_persistent_rows" if rows else "_persistent"
    name = str(func.attrs.get("global_symbol", "step")).removesuffix(suffix)

    def schedule(kernel):  # the candidate, and the barrier's reset
        return func if kernel.name == f"{name}{suffix}" else default_schedule(kernel, target)
    prog = Program("main", schedule, persistent_blocks=blocks, barrier_param=False)
    prog.persistent_if_on_chip = False  # measure the schedule as it is
    prog.row_groups = rows
    prog.check_resident = False
    prog.dependent_launch = dependent_launch(target, BuildOptions())
    for param in func.params:
        if param.dtype != F32:
            raise ValueError(f"step_loop: parameter {param.name} is {param.dtype}, not {F32}")
    tensors = [SequenceTensor(p.name, [int(d) for d in p.shape], tuple(f"d{i}" for i in range(len(p.shape))))
               for p in func.params]
    prog.params.extend(tensors)
    kernel = Kernel(name, func, tuple(p.name for p in func.params))
    with prog.loop(steps, "step"):
        prog.call(kernel, **{t.name: t.at(*t.axes) for t in tensors})
    if not prog.uses_persistent_loops:
        raise ValueError(f"step_loop: the schedule of {name} does not run persistently (a single grid of at most "
                         f"{blocks} blocks)")
    loop = prog.build()
    # launched cooperatively, as in a pass, without tvmrnn's pipeline (a tuning worker builds this
    # with MetaSchedule's): the driver's flag goes to both its kernels (the barrier's one-block
    # reset as well, which changes nothing for it)
    flags = [str(p) for p in (loop.attrs.get(LAUNCH_PARAMS) or [])]
    return loop.with_attr(LAUNCH_PARAMS, flags + [COOPERATIVE])
