"""The design spaces tuning searches, as MetaSchedule space generators.

**Template spaces** (:func:`template_space`, the default). Each schedule template of
:mod:`tvmrnn.schedules` is a space: its knobs (:mod:`tvmrnn.schedules.knobs`: tiles, threads,
columns per thread, split-K, accumulators, unrolling, shared-memory staging, the persistent
step's shape) are ``sample_categorical`` decisions, annotated on the root block. The
:class:`ApplyTemplate` postprocessor reads them and schedules the kernel with the template, so a
candidate's trace holds its decisions, then every primitive the template applied: the
evolutionary search replays a trace with other decisions (:class:`MutateKnob`), the XGBoost model
ranks the candidates by the code they make, and ``build`` replays a record as it was measured.
The default schedule is the point where every knob takes its default, each listed variant
another point (:func:`tvmrnn.schedules.knobs.seeded_settings`): tuning measures those first, and the search starts
from them.

**Generic spaces** (``space="generic"``): MetaSchedule's own rules, kept as a second space.
They cannot keep the gate math in the same kernel as the step's GEMM: the step's outputs
(h, y, c and, for training, the kept activations) are sibling blocks of one loop nest that all
read the GEMM result, and the default rules either split them into a second launch or (TVM 0.27:
``AutoInline`` reverse-inlining one sibling into the GEMM's write-back) produce a module that
does not compile. So the fused step gets :func:`fused_step_space` there: the output nest
``(n, j)`` is the anchor and the GEMM is computed under it, one thread (GPU) or one core (CPU)
owning a slice of hidden units with all gates of a unit side by side; its knobs are
``sample_perfect_tile`` splits, split-K over ``threadIdx.y`` and unrolling. The workload keeps
the output blocks marked not to be inlined (:func:`tvmrnn.tune.records.workload`), so that
MetaSchedule's default space also stays correct on it (two launches per step, an intermediate in
global memory); the driver cannot embed those on the GPU (:func:`tvmrnn.tune.records.embeddable`),
so ``build`` skips them.
"""
from __future__ import annotations

import random

import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from ..kernels import Kernel
from ..schedules import apply as apply_template
from ..schedules.common import is_gpu
from ..schedules.knobs import KNOB, Knob, knob_values_json, knobs, tiles_of
from .records import _plain, embeddable, is_fused_step, workload

SPACES = ("template", "generic")

REDUCTION = "recurrent_projection"


def _split(sch, loop, parts, max_innermost):
    factors = sch.sample_perfect_tile(loop, n=parts, max_innermost_factor=max_innermost)
    return sch.split(loop, factors)


def _blocks(sch):
    root = sch.get_sblock("root")
    gemm = sch.get_sblock(REDUCTION)
    outputs = [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint != REDUCTION]
    return root, gemm, outputs


def _unroll(sch, root):
    sch.annotate(root, "meta_schedule.unroll_explicit", sch.sample_categorical([0, 16, 64, 512], [0.25] * 4))


def fused_step_space(target: tvm.target.Target):

    def gpu(sch, split_k: bool):
        root, gemm, outputs = _blocks(sch)
        *lead, n, j = sch.get_loops(outputs[0])  # lead: the direction axis of a two-direction step
        j_block, j_thread = _split(sch, j, 2, 256)
        n_thread, n_reg = _split(sch, n, 2, 8)
        sch.reorder(*lead, j_block, n_thread, j_thread, n_reg)
        thread = sch.fuse(n_thread, j_thread)
        sch.bind(sch.fuse(*lead, j_block) if lead else j_block, "blockIdx.x")
        sch.bind(thread, "threadIdx.x")
        sch.compute_at(gemm, thread, preserve_unit_loops=True)
        sch.set_scope(gemm, 0, "local")
        *_, gn, gj, gg, k = sch.get_loops(gemm)
        if split_k:  # a cross-thread reduction: its loops must be innermost
            k_thread, _ = sch.split(k, [sch.sample_categorical([2, 4, 8, 16], [0.25] * 4), None])
            sch.bind(k_thread, "threadIdx.y")
        else:  # k outermost: each weight loaded once per thread, reused over its batch rows
            sch.reorder(k, gn, gj, gg)
        _unroll(sch, root)

    def cpu(sch):
        root, gemm, outputs = _blocks(sch)
        iters = sch.get(gemm).iter_vars
        names = [iv.var.name for iv in iters]
        # gate-blocked columns (p, g, u) (kernels.gate_shape): a core's and a tile's units are whole
        # panels of u, so that their index into the panels simplifies (a tile across panels ran
        # 4-5x slower on the Xeon, notes/performance.md v23)
        panel = int(iters[names.index("v_u")].dom.extent) if "v_u" in names else 1
        *lead, n, j = sch.get_loops(outputs[0])
        units = []
        if panel > 1:
            j, unit = sch.split(j, [None, panel])
            units = [unit]
        j_core, j_inner = _split(sch, j, 2, max(1, 64 // panel))
        sch.reorder(j_core, *lead, n, j_inner, *units)
        sch.parallel(sch.fuse(j_core, *lead) if lead else j_core)
        n_outer, _ = _split(sch, n, 2, 4)
        sch.compute_at(gemm, n_outer, preserve_unit_loops=True)
        # the GEMM's own loops: its row n, its columns (j, g), or gate-blocked (p, g, u), and k
        gn, *columns, k = sch.get_loops(gemm)[names.index("v_n") - len(names):]
        sch.reorder(k, gn, *columns)
        sch.vectorize(sch.fuse(*columns))
        _unroll(sch, root)

    def space(sch):
        if not is_gpu(target):
            cpu(sch)
            return sch
        variants = [sch.copy(), sch]
        gpu(variants[0], split_k=False)
        gpu(variants[1], split_k=True)
        return variants

    return space


# ---- template spaces ----------------------------------------------------------------------
def _sample_knobs(sch, found: tuple[Knob, ...], values: dict | None = None) -> None:
    """One ``sample_categorical`` per knob (``values``: its decision fixed to that value), each
    annotated on the root block for :class:`ApplyTemplate`."""
    root = sch.get_sblock("root")
    for knob in found:
        decision = knob.values.index(values[knob.name]) if values is not None else None
        value = sch.sample_categorical(list(knob.values), [1.0 / len(knob.values)] * len(knob.values), decision)
        sch.annotate(root, KNOB + knob.name, value)


@derived_object
class ApplyTemplate(ms.postproc.PyPostproc):
    """Schedule a candidate with its kernel's template, at the knob values its trace decided
    (the root block's ``tvmrnn.knob.*`` annotations, removed first). A candidate without them
    (another space's) passes unchanged; one whose values the template refuses, or whose kernel
    ``build`` could not use (:func:`tvmrnn.tune.records.embeddable`), is rejected."""

    def __init__(self, kernel: Kernel, target, made: dict | None = None):
        super().__init__()
        self.kernel, self.target = kernel, target
        self.workload = workload(kernel)
        # knob values -> the template's trace at them on a fresh workload, or None where they make
        # no usable kernel: shared by the clones (one a search thread). The search proposes the
        # same points of a small space again and again (a population of 64, three genetic rounds
        # a batch); running the template, lowering for the shared-memory check and the replay
        # check took 63 ms a candidate, 30 of a 2-task search's 41 s of host work (notes v37),
        # a replay of the kept trace ~8 ms.
        self.made = {} if made is None else made

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, sch) -> bool:
        root = sch.get_sblock("root")
        annotations = sch.get(root).annotations
        values = {k[len(KNOB):]: int(v) for k, v in annotations.items() if k.startswith(KNOB)}
        if not values:
            return True
        setting = tuple(sorted(values.items()))
        if setting not in self.made:
            self.made[setting] = self._make(values)
        trace = self.made[setting]
        if trace is None:
            return False
        # The search hands this schedule a module whose statements its threads reuse: TVM's
        # schedule edits statements in place where nothing else refers to them, so each would
        # carry the last candidate's loops into the next. Holding a reference to every statement
        # makes each edit copy instead.
        held = []
        tvm_ffi.structural_walk(sch.mod["main"].body, [(tvm.tirx.Stmt, held.append)])
        for key in list(annotations.keys()):
            if key.startswith(KNOB):
                sch.unannotate(root, key)
        try:
            trace.apply_to_schedule(sch, remove_postproc=False)
        except Exception:  # noqa: BLE001 - not expected: the same replay passed in _make
            return False
        return True

    def _make(self, values):
        """The template applied at ``values`` to a fresh workload: its trace, or None for a setting
        the template cannot make on this kernel, whose launch would fail for its shared memory or
        that the driver cannot embed (build would skip its record), or whose trace does not replay
        to the same kernel (build replays it so: on the H100 a few searched traces did not, a loop
        more at replay, and their records failed to load)."""
        made = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(self.workload["main"])}))
        try:
            apply_template(made, self.kernel, self.target, **tiles_of(self.kernel, self.target, values))
            if not embeddable(made.mod["main"], self.target):
                return None
        except Exception:  # noqa: BLE001 - a setting the template or the lowering refuses
            return None
        fresh = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(self.workload["main"])}))
        try:
            made.trace.apply_to_schedule(fresh, remove_postproc=False)
        except Exception:  # noqa: BLE001
            return None
        return made.trace if tvm_ffi.structural_equal(fresh.mod["main"], made.mod["main"]) else None

    def clone(self):
        return ApplyTemplate(self.kernel, self.target, self.made)


@derived_object
class MutateKnob(ms.mutator.PyMutator):
    """Change one knob's decision to another of its candidates, at random."""

    def _initialize_with_tune_context(self, context) -> None:
        pass

    def apply(self, trace, rand_state):
        rng = random.Random(int(rand_state))
        choices = [i for i in trace.insts if i.kind.name == "SampleCategorical" and len(i.attrs[0]) > 1]
        if not choices:
            return None
        inst = rng.choice(choices)
        old = int(trace.decisions[inst])
        new = rng.choice([d for d in range(len(inst.attrs[0])) if d != old])
        return trace.with_decision(inst, new, remove_postproc=True)

    def clone(self):
        return MutateKnob()


def template_space(kernel: Kernel, target: tvm.target.Target):
    """The space of ``kernel``'s template on ``target`` (a ``ScheduleFn`` generator), or None
    where the template has no knobs."""
    found = knobs(kernel, target)
    if not found:
        return None

    def space(sch):
        _sample_knobs(sch, found)
        return sch

    return ms.space_generator.ScheduleFn(space, sch_rules=[], postprocs=[ApplyTemplate(kernel, target)],
                                         mutator_probs={MutateKnob(): 1.0})


def is_template_space(kernel: Kernel, target, space: str = "template") -> bool:
    """Whether :func:`space_generator` gives ``kernel`` its template space: no MetaSchedule rules,
    so no tensor intrinsics of TVM's."""
    return space == "template" and bool(knobs(kernel, target))


def knob_schedule(mod: tvm.IRModule, kernel: Kernel, target, values: dict) -> tvm.s_tir.Schedule | None:
    """The template space's candidate at knob ``values``, scheduled (its trace as the search
    makes it), or None where the template refuses them."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
    _sample_knobs(sch, knobs(kernel, target), values)
    sch.enter_postproc()
    return sch if ApplyTemplate(kernel, target).apply(sch) else None


def knob_values(trace) -> dict[str, int] | None:
    """The knob setting a template-space trace decided, or None for another space's trace."""
    return knob_values_json(_plain(trace.as_json()))


def space_generator(kernel: Kernel, target: tvm.target.Target, space: str = "template"):
    """What :func:`tvmrnn.tune.tuner.tune` searches for one kernel: its template space (or, where
    the template has no knobs, or with ``space="generic"``, MetaSchedule's own rules)."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}, not {space!r}")
    if space == "template":
        found = template_space(kernel, target)
        if found is not None:
            return found
    if not is_fused_step(kernel):
        return "post-order-apply"
    return ms.space_generator.ScheduleFn(fused_step_space(target))
