"""Masked CPU forward steps skip the recurrent GEMM of a row tile whose rows have all ended.

A variable-lengths build (``BuildOptions(variable_lengths=True)``: ``lengths=``, ``PackedSequence``)
runs every row to the longest; a row whose sequence has ended keeps its state through a select in
the forward step's epilogue (:func:`tvmrnn.kernels._where_running`), which discards whatever the
step's GEMM gave that row. So each task of a scheduled CPU forward step tests its rows' mask
before its reduction loop and skips the loop where no row runs: the same bits, less work. The
drop-ins run a ``PackedSequence`` in packed order (longest first), so the rows that have ended
are the last ones and fill whole row tiles (this 2-core VM, bidirectional, T=100, lengths over
[50, 100]: N=20 inference 4.7% faster, training 2.8%; N=64 5.4-5.6% and 3.7-4.6%;
notes/performance.md v49).

Masked CPU backward steps too, on their ``gemm_mask`` (:func:`tvmrnn.kernels.backward_step`): a
row that had ended at the step whose gate gradients the GEMM reads got zero gate gradients there,
so its GEMM gives zeros, which the skip leaves (the output's init). The step's own ``mask`` is its
epilogue's step's: for the reverse direction, a row's first real step (its own last time) comes
after the epilogue's step is past the row's end, and that row's GEMM result passes on to ``dh0``
(v49 tested ``mask`` there, and its test caught ``dh0`` off). Against a weight that is Inf or NaN
a skipped row gets 0 for the GEMM's 0 x Inf = NaN; the rows that run still meet it, as
torch.nn's packed path, which computes no ended row, does.

A masked chunk's input projection and input gradient too (a variable-lengths CPU build:
:func:`tvmrnn.kernels.input_projection`'s ``masked``), on their ``(steps, rows)`` mask: an ended
row's projection is discarded by its step's select, its input gradient is zero (its gate gradients
are). Packed order leaves the ended rows of each step last, so whole row tiles skip. A chunk's
weight gradients sum over its rows: :func:`skip_ended_reduction_rows` leaves the ended ones out
(a 2-core VM, bidirectional, T=100, lengths over [T/2, T], against the same builds without the
chunks' skips, rows in packed order: inference 6-15% faster, training 7-15%; notes/performance.md v72).

This runs on scheduled kernels (as :mod:`tvmrnn.schedules.fast_math` does), so records and
tuning keep the kernels' plain form.
"""
from __future__ import annotations

import itertools
import math

import tvm_ffi
from tvm import s_tir, tirx

from ..kernels import _substitute
from .common import _uses

# the most combinations of a task's inner row loops whose rows are tested (a register tile's rows)
MAX_ROWS_TESTED = 64


def _find_update(func, block_name: str):
    """(the For loops around the GEMM's update block, outermost first; its SBlockRealize), or None."""
    found = []
    stack = []

    def on_for(loop, mutator):
        stack.append(loop)
        mutator.default_mutate(loop)
        stack.pop()
        return loop

    def on_realize(realize, mutator):
        if realize.block.name_hint == block_name:
            found.append((list(stack), realize))
        mutator.default_mutate(realize)
        return realize

    tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for), (s_tir.SBlockRealize, on_realize)])
    return found[0] if len(found) == 1 else None


def _masked_update(func: tirx.PrimFunc, gemm: str, mask: str):
    """``(the mask's buffer, the loops around the GEMM's update block, its SBlockRealize)``, or None
    where ``func`` has no parameter ``mask`` or no single update block of ``gemm``."""
    flags = next((p for p in func.params if p.name == mask), None)
    found = _find_update(func, f"{gemm}_update") if flags is not None else None
    return (flags, *found) if found is not None else None


def skip_ended_rows(func: tirx.PrimFunc, gemm: str, mask: str = "mask") -> tirx.PrimFunc:
    """``func`` (a scheduled masked step on a CPU: a ``mask`` parameter, one value per row of each
    problem, 0 where the GEMM ``gemm``'s row result is not used (a forward step's select keeps
    the old state) or is zero (a backward step's ``gemm_mask``), the GEMM as an init and an update
    block) with the update's outermost reduction loop run only where a row of the task runs.
    Unchanged where the structure is not that (a tensorized GEMM, no mask, more rows a task than
    :data:`MAX_ROWS_TESTED`). A guarded tile (a predicate: ``cpu.CPU_GUARDED_TILES``' columns,
    ``CPU_GUARDED_ROWS``' rows) tests its rows' flags clamped to the mask's extent: the rows past
    the end belong to the last tile, which holds the last row too."""
    found = _masked_update(func, gemm, mask)
    if found is None:
        return func
    flags, loops, realize = found
    block = realize.block
    store = block.body
    m = len(flags.shape)
    if not isinstance(store, tirx.BufferStore) or len(store.indices) < m or any(
            int(a) != int(b) for a, b in zip(store.buffer.shape[:m], flags.shape)):
        return func
    bindings = dict(zip([iv.var for iv in block.iter_vars], realize.iter_values))
    reductions = [v for iv, v in zip(block.iter_vars, realize.iter_values) if iv.iter_type == tirx.IterVar.CommReduce]

    def in_reduction(loop) -> bool:
        return any(_uses(value, loop.loop_var) for value in reductions)
    outer = next((i for i, loop in enumerate(loops) if in_reduction(loop)), None)
    if outer is None:
        return func
    rows = [_substitute(index, bindings) for index in store.indices[:m]]
    inner = [loop for loop in loops[outer:] if any(_uses(index, loop.loop_var) for index in rows)]
    if any(in_reduction(loop) for loop in inner):
        return func  # a row index that moves with the reduction: not a GEMM this pass knows
    extents = [int(loop.extent) for loop in inner]
    if math.prod(extents) > MAX_ROWS_TESTED:
        return func
    running = None
    for values in itertools.product(*(range(e) for e in extents)):
        env = {loop.loop_var: tirx.const(int(loop.min) + v, str(loop.loop_var.ty)) for loop, v in zip(inner, values)}
        at = [tirx.min(_substitute(index, env), int(extent) - 1)
              for index, extent in zip(rows, flags.shape)]  # (a guarded tile's rows past the end: the last)
        test = tirx.BufferLoad(flags, at) > tirx.const(0.5, "float32")
        running = test if running is None else tirx.Or(running, test)
    target = loops[outer]

    def on_for(loop, mutator):
        if loop.loop_var.same_as(target.loop_var):
            return tirx.IfThenElse(running, loop, None)
        return mutator.default_mutate(loop)
    return func.with_body(tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for)]))


def skip_ended_reduction_rows(func: tirx.PrimFunc, gemm: str, mask: str = "mask") -> tirx.PrimFunc:
    """``func`` (a scheduled masked weight gradient on a CPU, :func:`tvmrnn.kernels.weight_gradient`:
    a ``(steps, rows)`` ``mask`` and a GEMM ``gemm`` whose reduction runs over the chunk's steps and
    rows, as an init and an update block) with the products of ended rows left out: their gate
    gradients are zero, so the sums keep their bits, in the same order.

    The reduction's rows move with two loops, an outer ``A`` and the innermost ``B`` (the default
    schedule's L1 block of rows and its rows; loops between them sweep register tiles over a block).
    At each iteration of ``A`` the rows of ``B`` that run are listed once (a local array and its
    count), and ``B`` walks that list: the register tile's loop stays free of branches. (A test a
    row inside ``B`` kept LLVM from holding the tile in registers: the backward of an LSTM T=100
    N=20 H=256 went from 53 to 73 ms on a 2-core VM, v72.) Unchanged where the structure is not
    that (no update block, ``B`` vectorised or parallel, other than two loops moving the rows)."""
    found = _masked_update(func, gemm, mask)
    if found is None or len(found[0].shape) != 2:
        return func
    flags, loops, realize = found
    reductions = [v for iv, v in zip(realize.block.iter_vars, realize.iter_values)
                  if iv.iter_type == tirx.IterVar.CommReduce]
    if len(reductions) != 2:  # (t, n): kernels.weight_gradient's
        return func
    moving = [loop for loop in loops if any(_uses(value, loop.loop_var) for value in reductions)]
    if len(moving) != 2:  # (one loop, no L1 block of rows: not met by the default schedules)
        return func
    outer, inner = moving
    if inner.kind not in (tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED) or outer.kind not in (
            tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED, tirx.ForKind.PARALLEL):
        return func
    extent = int(inner.extent)
    i32 = str(inner.loop_var.ty)
    rows = tirx.decl_buffer((extent,), i32, "running_rows", scope="local")
    count = tirx.decl_buffer((1,), i32, "running_count", scope="local")
    zero = tirx.const(0, i32)
    r = tirx.Var("r", i32)
    at = [_substitute(value, {inner.loop_var: r + inner.min}) for value in reductions]
    steps, rows_of = (int(e) for e in flags.shape)
    runs = tirx.And(tirx.And(at[0] < steps, at[1] < rows_of),  # (a split that does not divide: none past the end)
                    tirx.BufferLoad(flags, [tirx.min(at[0], steps - 1), tirx.min(at[1], rows_of - 1)])
                    > tirx.const(0.5, "float32"))
    listing = tirx.For(r, zero, extent, tirx.ForKind.SERIAL, tirx.IfThenElse(runs, tirx.SeqStmt([
        tirx.BufferStore(rows, r, [tirx.BufferLoad(count, [zero])]),
        tirx.BufferStore(count, tirx.BufferLoad(count, [zero]) + 1, [zero])]), None))
    i = tirx.Var("i", i32)
    walk = tirx.For(i, zero, tirx.BufferLoad(count, [zero]), tirx.ForKind.SERIAL,
                    _substitute(inner.body, {inner.loop_var: tirx.BufferLoad(rows, [i]) + inner.min}))

    def prologue(body):
        return tirx.SeqStmt([tirx.AllocBuffer(rows), tirx.AllocBuffer(count), tirx.BufferStore(count, zero, [zero]),
                             listing, body])
    state = {}

    def on_for(loop, mutator):
        if loop.loop_var.same_as(inner.loop_var):
            state["inner"] = True
            return walk
        if loop.loop_var.same_as(outer.loop_var):
            body = mutator.default_mutate(loop).body
            return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, prologue(body), loop.thread_binding,
                            loop.annotations, getattr(loop, "step", None))
        return mutator.default_mutate(loop)
    body = tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for)])
    return func.with_body(body) if state.get("inner") else func
