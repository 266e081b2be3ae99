"""Design spaces of our own for the fused recurrent step (MetaSchedule space generators).

MetaSchedule's default rules tile the recurrent GEMM well, but they cannot keep the gate math
in the same kernel: the step's outputs (h, y, c and, for training, the kept activations) are
sibling blocks of one loop nest that all read the GEMM result, and the default rules either
split them into a second launch or (TVM 0.27: ``AutoInline`` reverse-inlining one sibling
into the GEMM's write-back) produce a module that does not compile. So the step kernel gets:

* :func:`fused_step_space`, a parameterised schedule whose every knob is a MetaSchedule
  sampling instruction (so the evolutionary search and the XGBoost model tune it):
  the output nest ``(n, j)`` (after the direction axis of a two-direction step) is the anchor
  and the GEMM is computed under it, one thread (GPU) or one core (CPU) owning a slice of
  hidden units ``j`` with all gates of a unit side by side
  (the gate-interleaved ``w[k, j, g]`` layout of :mod:`tvmrnn.kernels`, or its gate-blocked panels). Knobs:

  - GPU: hidden units per block, batch rows per thread (register tile over ``n`` reusing each
    loaded weight), **split-K** across ``threadIdx.y`` with a cross-thread reduction (small
    batches leave too few output elements to fill the H100 otherwise), unrolling.
  - CPU: hidden units per core (a core keeps the same slice of the recurrent weights, hence
    in its own L2, at every step; whole panels of gate-blocked weights), batch rows per inner
    tile, the ``(j, g)`` (or ``(p, g, u)``) run vectorised over contiguous weights, unrolling.

The workload keeps the output blocks marked not to be inlined (:func:`prepare`), so that
MetaSchedule's default space also stays correct on it (two launches per step, an intermediate in
global memory). Logs from 2026-11-23 hold such records; the driver cannot embed them on the GPU
(:func:`tvmrnn.tune.records.embeddable`), so ``build`` skips them and the step space is ours alone.

Other kernels (GEMMs over chunks of steps, gradients, copies) use the default space.
"""
from __future__ import annotations

import tvm
from tvm.s_tir import meta_schedule as ms

from ..kernels import Kernel
from ..schedules.common import is_gpu
from .records import is_fused_step

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


def space_generator(kernel: Kernel, target: tvm.target.Target):
    """What :func:`tvmrnn.tune.tuner.tune` searches for one kernel."""
    if not is_fused_step(kernel):
        return "post-order-apply"
    return ms.space_generator.ScheduleFn(fused_step_space(target))
