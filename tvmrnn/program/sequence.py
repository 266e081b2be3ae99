"""The sequence driver: whole forward and backward passes as single TIR functions.

Per-step kernels (:mod:`tvmrnn.kernels`), once scheduled, are embedded in loops over the
sequence: each kernel parameter becomes a strided view (``DeclBuffer``) into a whole-sequence
buffer at an offset that depends on the loop variables, so the tuned per-step code runs
unchanged at every step while the sequence length ``T`` stays a run-time variable. One call
runs a whole pass: no Python per time step. On a GPU the loops stay on the host and each
embedded kernel becomes one launch per step.
"""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from tvm.backend.cuda import op as cuda_op
from tvm.tirx import compilation_pipeline as _tir_pipelines

from .. import kernels
from ..kernels import Kernel
from ..schedules import common
from ..schedules.common import (backward_blocks_too_few, backward_launches_beat_persistence, is_gpu,
                                launches_beat_persistence, row_groups_apply)
from ..schedules.row_tiles import INDEPENDENT_BLOCKS, independent_blocks
from ..schedules.split_k import FIRST_STEP_ONLY, keeps_weights_on_chip
from ..device import SHARED_BYTES_WITHOUT_OPT_IN, device_model
from ..options import BuildOptions

F32 = "float32"
I32 = "int32"


def _const(v):
    return tirx.const(v, I32) if isinstance(v, int) else v


def _iterations(nest, length: int, env: tuple = ()) -> int:
    """How many times a body nested in these loops (``(variable, extent)`` pairs, outermost
    first) runs; an extent may read the variables of the loops around it (a chunk's steps)."""
    if not nest:
        return 1
    (var, extent), rest = nest[0], nest[1:]
    n = max(evaluate(extent, length, env), 0)
    if any(_mentions(e, var) for _, e in rest):
        return sum(_iterations(rest, length, (*env, (var, i))) for i in range(n))
    return n * _iterations(rest, length, env)


def _mentions(e, var) -> bool:
    if isinstance(e, tvm.ir.Var):
        return e.same_as(var)
    return any(_mentions(getattr(e, f), var) for f in ("a", "b", "condition", "true_value", "false_value")
               if hasattr(e, f))


def evaluate(e, length: int, env: tuple = ()) -> int:
    """Value of an integer expression in the sequence length ``T`` (the variable that ``env``, the
    values of enclosing loops' variables, does not give)."""
    if isinstance(e, int):
        return e
    if isinstance(e, tvm.ir.Var):
        return next((value for var, value in env if var.same_as(e)), length)
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    if isinstance(e, tirx.Not):
        return int(not evaluate(e.a, length, env))
    if isinstance(e, tirx.Select):
        return evaluate(e.true_value if evaluate(e.condition, length, env) else e.false_value, length, env)
    ops = {tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b, tirx.Mul: lambda a, b: a * b,
           tirx.Max: max, tirx.Min: min,
           tirx.FloorDiv: lambda a, b: a // b, tirx.FloorMod: lambda a, b: a % b,
           tirx.LT: lambda a, b: int(a < b), tirx.LE: lambda a, b: int(a <= b),
           tirx.GT: lambda a, b: int(a > b), tirx.GE: lambda a, b: int(a >= b),
           tirx.And: lambda a, b: int(bool(a) and bool(b)), tirx.Or: lambda a, b: int(bool(a) or bool(b))}
    for kind, f in ops.items():
        if isinstance(e, kind):
            return f(evaluate(e.a, length, env), evaluate(e.b, length, env))
    raise AssertionError(f"unexpected integer expression {e}")


@dataclass
class View:
    """A request for a view: which tensor, which of its axes map to the kernel's, where it starts."""

    tensor: "SequenceTensor"
    axes: tuple[str, ...]
    start: dict


class SequenceTensor:
    """A driver parameter: a buffer whose axes have names, so views can be asked for by name."""

    def __init__(self, name: str, shape, axes: tuple[str, ...]):
        if len(shape) != len(axes):
            raise AssertionError(f"{name}: {len(shape)} dims but axes {axes}")
        self.name, self.shape, self.axes = name, tuple(_const(s) for s in shape), tuple(axes)
        self.buffer = tirx.decl_buffer(self.shape, F32, name, data_alignment=4, offset_factor=1)
        strides, acc = [], _const(1)
        for s in reversed(self.shape):
            strides.append(acc)
            acc = acc * s
        self.strides = dict(zip(self.axes, reversed(strides)))

    def concrete_shape(self, length: int) -> tuple[int, ...]:
        """The shape for sequence length ``length``."""
        return tuple(evaluate(s, length) for s in self.shape)

    def signature(self) -> list:
        """``[name, [[a, b], ...]]``: dimension i is ``a*T + b`` (what a loader needs to allocate)."""
        at0, at1 = self.concrete_shape(0), self.concrete_shape(1)
        if self.concrete_shape(2) != tuple(2 * (y - x) + x for x, y in zip(at0, at1)):
            raise AssertionError(f"{self.name}: shape is not affine in T")
        return [self.name, [[y - x, x] for x, y in zip(at0, at1)]]

    def at(self, *axes: str, **start) -> View:
        """A view whose dimensions are ``axes`` of this tensor, starting at ``start``.

        Axes of this tensor that are not in ``axes`` must be fixed by ``start``.
        """
        unknown = [a for a in (*axes, *start) if a not in self.axes]
        loose = [a for a in self.axes if a not in axes and a not in start]
        if unknown or loose:
            raise AssertionError(f"{self.name}: bad view {axes} {start} of axes {self.axes}")
        return View(self, axes, start)


class FlatTensor(SequenceTensor):
    """A flat buffer of packed pieces (weights, weight gradients), viewed at element offsets."""

    def __init__(self, name: str, size: int):
        super().__init__(name, (size,), ("element",))

    def piece(self, offset: int) -> View:
        return View(self, (), {"element": offset})


@dataclass
class Stacked:
    """Views of one tensor for a kernel with a leading batch axis (:attr:`Kernel.batch`): the
    axis's i-th entry is ``views[i]``. Its stride is the distance between consecutive views (the
    same between every two), an expression in the loop variables that may be negative: both
    directions of a layer at step ``u`` sit at times ``u`` and ``T-1-u``, so one of them is
    ``T-1-2u`` rows further on; a wavefront's layers (``passes.WAVE_STEPS``) a layer's slot on and
    a chunk of steps back."""

    views: tuple[View, ...]


def _offset(view: View):
    t, offset = view.tensor, _const(0)
    for axis, start in view.start.items():
        offset = offset + _const(start) * t.strides[axis]
    return offset


def _view_layout(view, param) -> tuple:
    """(data pointer, element offset, strides) of the view that binds kernel parameter ``param``
    (a :class:`View`, or a :class:`Stacked` of them for a leading axis)."""
    shape = list(param.shape)
    lead = []
    if isinstance(view, Stacked):
        views = view.views
        if len(views) < 2 or int(shape[0]) != len(views) or any(v.tensor is not views[0].tensor for v in views):
            raise AssertionError(f"{param.name}: a stack of {int(shape[0])} views of one tensor for its leading axis")
        lead = [_offset(views[1]) - _offset(views[0])]
        analyzer = tvm.sym.Analyzer()
        for a, b in zip(views[1:], views[2:]):
            if not analyzer.can_prove_equal(_offset(b) - _offset(a), lead[0]):
                raise AssertionError(f"{param.name}: the stacked views are not one stride apart")
        shape = shape[1:]
        view = view.views[0]
    t = view.tensor
    if view.axes:
        if len(view.axes) != len(shape):
            raise AssertionError(f"{t.name}: view axes {view.axes} for a {len(shape)}-d parameter")
        strides = [t.strides[a] for a in view.axes]
    else:  # a packed piece: compact in its own shape
        strides, acc = [], _const(1)
        for s in reversed(shape):
            strides.append(acc)
            acc = acc * s
        strides.reverse()
    return tirx.buffer_data(t.buffer), _offset(view), lead + strides


POOL_NAME = "scratch_pool"  # a pass's scratch pool (Program._pool)
CPU_KERNEL_ATTR = "tvmrnn.cpu_kernel"  # marks the functions Subroutines defines


def _pooled_piece(shape, dtype) -> bool:
    """Whether a kernel's global scratch piece goes in its pass's pool (Program._pool_offsets):
    float32 and of static size; others take an allocation of their own."""
    return dtype == F32 and all(isinstance(d, tirx.IntImm) for d in shape)


def _byte_offset(data, offset):
    """``data`` advanced by ``offset`` float32 elements, in 64-bit arithmetic (a 5-layer LSTM's
    training workspace alone is 1.1 GB)."""
    return tirx.handle_add_byte_offset(data, tirx.Cast("int64", offset) * 4)


def _make_view(view, param, pointer: bool = False) -> tuple:
    """The view buffer for kernel parameter ``param`` and the statement that declares it.

    ``pointer``: the view's offset goes into its data pointer, computed where the view is
    declared, and the buffer starts at element 0. On a GPU the host computes it, so a kernel
    launched at several call sites (each layer and direction: other offsets into the same
    flat buffers) takes its place as an argument and compiles to the same code at each, which
    :func:`merge_identical_kernels` then keeps once. With the offset in the buffer instead,
    each call site's constants are compiled into a kernel of its own."""
    data, offset, strides = _view_layout(view, param)
    if pointer:
        data, offset = _byte_offset(data, offset), 0
    buf = tirx.decl_buffer(param.shape, F32, f"{_view_tensor(view).name}_{param.name}", strides=strides,
                           elem_offset=offset, data_alignment=4, offset_factor=1)
    return buf, tirx.DeclBuffer(buf, data=data)


def _view_tensor(view) -> "SequenceTensor":
    return view.views[0].tensor if isinstance(view, Stacked) else view.tensor


def _same_view(a: tirx.DeclBuffer, b: tirx.DeclBuffer) -> bool:
    """Whether two view declarations address the same elements the same way."""
    return all(tvm_ffi.structural_equal(x, y) for x, y in ((a.data, b.data), (list(a.buffer.shape), list(b.buffer.shape)),
                                                            (list(a.buffer.strides), list(b.buffer.strides))))


def _bound_loop(stmt, tag: str):
    """The first loop in ``stmt`` bound to the thread tag ``tag`` (``"threadIdx.x"``,
    ``"blockIdx.x"``) whose extent is constant, or None."""
    found = []

    def visit(loop, mutator):
        if not found and loop.thread_binding is not None and loop.thread_binding.thread_tag == tag \
                and isinstance(loop.extent, tirx.IntImm):
            found.append(loop)
        # a callback's result is not descended into: the loops inside, until one is found (the
        # first thread loop may sit in an unrolled loop of one, as at H = 37)
        return mutator.default_mutate(loop) if not found else loop

    tvm_ffi.structural_mutate(stmt, [(tirx.For, visit)])
    return found[0] if found else None


def _bound_extent(stmt, tag: str) -> int | None:
    """The constant extent of :func:`_bound_loop`'s loop, or None."""
    loop = _bound_loop(stmt, tag)
    return int(loop.extent) if loop is not None else None


def _thread_extent(stmt) -> int | None:
    """The extent of the first ``threadIdx.x`` loop in ``stmt`` (a kernel's threads per block)."""
    return _bound_extent(stmt, "threadIdx.x")


def _seq(stmts: list):
    """``stmts`` as one statement (TVM refuses a SeqStmt of one)."""
    return stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)


def grid_barrier(counter, target, threads: int):
    """Every block of the grid waits here until all have arrived (``counter`` reaches ``target``).

    The pattern of CUDA's cooperative-groups ``grid.sync()``: the block's threads meet; one thread
    publishes the block's writes (``__threadfence``) and counts itself in with an atomic add, then
    waits until the count says every block has (TVM's ``cuda_wait_until``: relaxed loads, closed
    by one acquire load, so the other blocks' writes are visible); the block meets again. The
    counter only grows (barrier i waits for ``(i+1) * blocks``): one reset per launch. (Polling
    with atomic adds instead made each barrier ~20 us on the H100: the arrivals queued behind
    the polls at the one address.) ``counter`` None: a grid of one block, whose threads meeting
    is the whole barrier (``__syncthreads`` orders the block's global writes for its own threads).
    """
    tx = tirx.Var("barrier_thread", I32)
    sync = tirx.Evaluate(tirx.call_intrin("int32", "tirx.tvm_storage_sync", "shared"))
    binding = tirx.IterVar(None, tx, tirx.IterVar.ThreadIndex, "threadIdx.x")
    if counter is None:
        return tirx.For(tx, _const(0), _const(threads), tirx.ForKind.THREAD_BINDING, sync, thread_binding=binding)
    address = tirx.address_of(tirx.BufferLoad(counter, [_const(0)]))
    seen = tirx.decl_buffer((1,), I32, "barrier_seen", scope="local")
    fence = tirx.Evaluate(cuda_op.cuda_thread_fence())
    arrive = tirx.Evaluate(cuda_op.cuda_atomic_add(address, _const(1)))
    wait = tirx.Evaluate(cuda_op.cuda_wait_until(seen, address, lambda value: value >= target, backoff_ns=32))
    leader = tirx.IfThenElse(tx == 0, tirx.SeqStmt([tirx.AllocBuffer(seen), fence, arrive, wait]), None)
    return tirx.For(tx, _const(0), _const(threads), tirx.ForKind.THREAD_BINDING, tirx.SeqStmt([sync, leader, sync]),
                    thread_binding=binding)


def _uses(node, var) -> bool:
    found = []

    def visit(v, mutator):
        if v.same_as(var):
            found.append(v)
        return v

    tvm_ffi.structural_mutate(node, [(tvm.ir.Var, visit)])
    return bool(found)


def _sblocks(stmt) -> list:
    found = []

    def visit(realize, mutator):
        found.append(realize.block)
        return realize

    tvm_ffi.structural_mutate(stmt, [(s_tir.SBlockRealize, visit)])
    return found


def _grid_blocks(func) -> int | None:
    """The ``blockIdx.x`` extent of a scheduled GPU kernel (its first such loop), if constant."""
    return _bound_extent(func.body, "blockIdx.x")


def first_step_only(stmt, var):
    """``stmt`` with each block annotated :data:`tvmrnn.schedules.split_k.FIRST_STEP_ONLY` (a
    thread's copy of its weights into registers) run at the first step of the time loop over
    ``var`` only: its registers then hold the weights for every step."""
    def visit(realize, mutator):
        if FIRST_STEP_ONLY not in realize.block.annotations:
            return mutator.default_mutate(realize)
        return s_tir.SBlockRealize(realize.iter_values, tirx.And(realize.predicate, var == 0), realize.block)
    return tvm_ffi.structural_mutate(stmt, [(s_tir.SBlockRealize, visit)])


def hoist_invariant_copies(decls, grid_body, var):
    """Split a persistent kernel's per-block body into what runs once and what runs every step.

    The statements of ``grid_body`` (the body under the kernel's ``blockIdx`` loop) that only copy
    into shared memory from buffers that nothing in the kernel writes and whose views do not move
    with the step ``var`` (a block's slice of the weights, :func:`tvmrnn.schedules.split_k._stationary_weights`)
    run once, before the time loop. Returns ``(decls outside the loop, decls inside it, the
    hoisted statements, the per-step statements)``.
    """
    stmts = list(grid_body.seq) if isinstance(grid_body, tirx.SeqStmt) else [grid_body]
    moving = [d for d in decls if _uses(d.buffer.elem_offset, var) or any(_uses(s, var) for s in d.buffer.strides)]
    fixed = [d for d in decls if not any(d.same_as(m) for m in moving)]
    written = [w.source for s in stmts for b in _sblocks(s) for w in b.writes]

    def invariant_copy(stmt) -> bool:
        blocks = _sblocks(stmt)
        if not blocks:
            return False
        for b in blocks:
            if not all(w.source.scope() == "shared.dyn" for w in b.writes):
                return False
            for r in b.reads:
                if any(r.source.same_as(w) for w in written) or any(r.source.same_as(m.buffer) for m in moving):
                    return False
        return True

    lead = 0  # the leading copies into shared memory (independent of each other)
    while lead < len(stmts) and all(w.source.scope() == "shared.dyn" for b in _sblocks(stmts[lead]) for w in b.writes) \
            and _sblocks(stmts[lead]):
        lead += 1
    hoisted = [s for s in stmts[:lead] if invariant_copy(s)]
    stmts = [s for s in stmts[:lead] if not invariant_copy(s)] + stmts[lead:]
    if not hoisted:
        return [], list(decls), [], stmts
    return fixed, moving, hoisted, stmts


def _grid_dependency(early: bool) -> list:
    """``griddepcontrol.wait`` (PTX, sm_90+); with ``early``, then ``griddepcontrol.launch_dependents``."""
    actions = ("wait", "launch_dependents") if early else ("wait",)
    return [tirx.Evaluate(tirx.call_intrin("void", "tirx.ptx.griddepcontrol", action, "")) for action in actions]


def with_grid_dependencies(stmt, early: bool = False):
    """``stmt`` with every kernel in it (each outermost chain of thread-bound loops) starting by
    waiting for the kernels launched before it (:func:`_grid_dependency`), for programmatic
    dependent launch: see :attr:`Program.dependent_launch`."""
    def rec(stmt):
        if isinstance(stmt, tirx.For) and stmt.thread_binding is not None:
            def chain(loop):
                if isinstance(loop, tirx.For) and loop.thread_binding is not None:
                    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, chain(loop.body),
                                    loop.thread_binding, loop.annotations)
                return tirx.SeqStmt(_grid_dependency(early) + [loop])
            return chain(stmt)
        if isinstance(stmt, tirx.SeqStmt):
            return tirx.SeqStmt([rec(s) for s in stmt.seq])
        if isinstance(stmt, tirx.For):
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, rec(stmt.body),
                            stmt.thread_binding, stmt.annotations)
        if isinstance(stmt, tirx.IfThenElse):
            return tirx.IfThenElse(stmt.condition, rec(stmt.then_case),
                                   None if stmt.else_case is None else rec(stmt.else_case))
        if isinstance(stmt, s_tir.SBlockRealize):
            b = stmt.block
            block = s_tir.SBlock(b.iter_vars, b.reads, b.writes, b.name_hint, rec(b.body), b.init,
                                 b.alloc_buffers, b.match_buffers, b.annotations)
            return s_tir.SBlockRealize(stmt.iter_values, stmt.predicate, block)
        if _has_thread_loop(stmt):  # a kernel we would miss: a race
            raise AssertionError(f"with_grid_dependencies: a kernel under a {type(stmt).__name__}")
        return stmt
    return rec(stmt)


COOPERATIVE = "tirx.use_cooperative_launch"
DEPENDENT = "tirx.use_programtic_dependent_launch"  # (sic: TVM's spelling)
LAUNCH_PARAMS = "tirx.kernel_launch_params"
DYNAMIC_SHARED = "tirx.use_dyn_shared_memory"


def _contains(node, node_type, predicate) -> bool:
    """Whether some ``node_type`` node anywhere inside ``node`` satisfies ``predicate``."""
    found = []

    def visit(n, mutator):
        if predicate(n):
            found.append(n)
            return n
        return mutator.default_mutate(n)  # and the nodes inside it

    tvm_ffi.structural_mutate(node, [(node_type, visit)])
    return bool(found)


def _waits_on_grid(func) -> bool:
    """Whether a device function spins on a global word (:func:`grid_barrier`'s wait)."""
    return _contains(func.body, tvm.ir.Call,
                     lambda call: isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.cuda.wait_until")


def with_launch_flag(params: list[str], flag: str) -> list[str]:
    """A kernel's launch parameters (its thread axes, then flags) with ``flag`` added: before the
    dynamic shared memory's, which TVM's runtime requires to come last (it is the launch's last
    argument)."""
    if DYNAMIC_SHARED in params:
        i = params.index(DYNAMIC_SHARED)
        return params[:i] + [flag] + params[i:]
    return params + [flag]


def _is_kernel(func) -> bool:
    """Whether ``func`` is a device kernel (what ``SplitHostDevice`` split off its driver)."""
    return isinstance(func, tirx.PrimFunc) and func.attrs is not None and bool(func.attrs.get("tirx.is_global_func"))


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.CooperativeGridBarriers")
def cooperative_grid_barriers(mod, _ctx):
    """Launch every kernel that has a grid barrier (a persistent time loop) cooperatively.

    A grid barrier needs all of the kernel's blocks resident at once. An ordinary launch does not
    promise that (another stream's kernels, or another process's under MPS, may hold the SMs the
    barrier waits for: a hang); a cooperative launch (``CU_LAUNCH_ATTRIBUTE_COOPERATIVE``, TVM's
    ``tirx.use_cooperative_launch``) either has them all resident or fails at launch. TVM takes a
    kernel's launch flags from its driver for all of its kernels (``SplitHostDevice``), so this
    runs after that pass and flags the barrier's kernels alone, on their device functions, which
    is where the CUDA module's function table takes them from."""
    updates = {}
    for gvar, func in mod.functions.items():
        if not _is_kernel(func) or not _waits_on_grid(func):
            continue
        params = [str(p) for p in (func.attrs.get(LAUNCH_PARAMS) or [])]
        if COOPERATIVE not in params:
            updates[gvar] = func.with_attr(LAUNCH_PARAMS, with_launch_flag(params, COOPERATIVE))
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


# Shared memory a CUDA kernel gets without opting in. TVM's runtime opts a kernel in (the driver's
# MAX_DYNAMIC_SHARED_SIZE_BYTES, up to the device's limit) only when its *dynamic* shared memory
# alone is more than this; static arrays beside a smaller dynamic part still count against 48 KB.
SHARED_WITHOUT_OPT_IN = SHARED_BYTES_WITHOUT_OPT_IN


class SharedMemoryError(RuntimeError):
    """A compiled GPU kernel whose shared memory the CUDA runtime would refuse at launch."""


_SHARED_MEMORY_MESSAGE = r"kernel \S+: \d+ bytes of (static and \d+ bytes of dynamic )?shared memory.*?use less\."


def shared_memory_bytes(func: tirx.PrimFunc) -> tuple[int, int]:
    """``(static, dynamic)`` bytes of shared memory a device function allocates (``shared`` and
    ``shared.dyn`` buffers; sizes that are not constants count as 0)."""
    sizes = {"shared": 0, "shared.dyn": 0}

    def count(buffer):
        if buffer.scope() not in sizes:
            return
        elements = 1
        for extent in buffer.shape:
            if not isinstance(extent, tirx.IntImm):
                return
            elements *= int(extent)
        sizes[buffer.scope()] += elements * tvm.DataType(buffer.dtype).bits // 8

    def visit(node, mutator):
        if isinstance(node, tirx.AllocBuffer):
            count(node.buffer)
        else:  # a block's own allocations (before blocks are lowered)
            for buffer in node.alloc_buffers:
                count(buffer)
        return mutator.default_mutate(node)

    tvm_ffi.structural_mutate(func.body, [(tirx.AllocBuffer, visit), (s_tir.SBlock, visit)])
    return sizes["shared"], sizes["shared.dyn"]


def shared_memory_problem(func: tirx.PrimFunc, target, sizes: tuple[int, int] | None = None) -> str | None:
    """Why a CUDA kernel's shared memory would fail its launch on ``target``'s GPU, or None: static
    and dynamic together past :data:`SHARED_WITHOUT_OPT_IN` while the dynamic part alone is not
    (TVM's runtime opts a kernel in only when its dynamic part passes it), or more than the device
    gives a block (:func:`tvmrnn.device.device_model`). Takes a device function or a scheduled
    kernel (its blocks' buffers); ``sizes``: its ``(static, dynamic)`` bytes where known better."""
    static, dynamic = sizes or shared_memory_bytes(func)
    if static + dynamic > SHARED_WITHOUT_OPT_IN >= dynamic:
        return (f"{static} bytes of static and {dynamic} bytes of dynamic shared memory "
                f"({static + dynamic} in all) pass the {SHARED_WITHOUT_OPT_IN} a kernel gets without opting in, "
                f"and TVM's runtime opts in only when the dynamic part alone passes it: the launch would fail. "
                f"Its schedule must keep its large shared buffers dynamic (tvmrnn.schedules), or use less.")
    limit = device_model(target).shared_bytes_per_block
    if static + dynamic > limit:
        return (f"{static + dynamic} bytes of shared memory; a block of this GPU "
                f"({device_model(target).arch}) gets at most {limit}: the launch would fail. Its schedule must use less.")
    return None


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.CheckSharedMemory")
def check_shared_memory(mod, _ctx):
    """Refuse, at build time and by name, a CUDA kernel whose static and dynamic shared memory
    together pass :data:`SHARED_WITHOUT_OPT_IN` while its dynamic part alone does not: TVM's
    runtime would not opt it in and every launch would fail (v22's persistent step at H = 128 did,
    with ``CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE``, and an ordinary launch fails with
    ``CUDA_ERROR_INVALID_VALUE``); and one that needs more than the device gives a block at all
    (:func:`tvmrnn.device.device_model`). Runs on the device functions after TVM's device passes
    (shared buffers merged), changing nothing."""
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        target = func.attrs.get("target") if func.attrs else None
        if target is None or target.kind.name != "cuda":
            continue
        problem = shared_memory_problem(func, target)
        if problem:
            raise SharedMemoryError(f"kernel {gvar.name_hint}: {problem}")
    return mod


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.MergeIdenticalKernels")
def merge_identical_kernels(mod, _ctx):
    """Keep one of each set of identical device kernels, and launch it at all of their call sites.

    A pass embeds a kernel at every call site (each layer, direction and chunk size), and TVM's
    ``SplitHostDevice`` makes each embedding a device function of its own. With the views as
    pointers (:func:`_make_view`) most of them are the same code: a 5-layer bidirectional GRU's
    530 kernels were 38 MB of CUDA source, which NVRTC compiled for about four minutes at each
    build or load of a package on the H100 machine. Runs after ``SplitHostDevice`` (whose host
    code names each kernel in a ``call_ffi_kernel``) and after :func:`cooperative_grid_barriers`
    (launch flags are part of a kernel's identity). Kernels that differ only in their views' offsets are
    identical only where the views are pointers (``BuildOptions.shared_kernels``). Since v55 a
    kernel's launches are device functions of their own (:class:`GpuKernels`), one per call
    signature; this still merges the persistent loops' kernels, which stay embedded, and a
    kernel whose call signatures differ but whose code does not."""
    canonical, keep = {}, {}  # kernel name -> the name of the one kept; structural hash -> kept kernels
    for gvar, func in mod.functions.items():
        if not _is_kernel(func):
            continue
        anonymous = func.with_attr("global_symbol", "kernel")
        key = tvm_ffi.structural_hash(anonymous)
        for name, other in keep.get(key, []):
            if tvm_ffi.structural_equal(anonymous, other):
                canonical[gvar.name_hint] = name
                break
        else:
            keep.setdefault(key, []).append((gvar.name_hint, anonymous))
    if not canonical:
        return mod

    def rename(call, mutator):
        if call.op.same_as(_CALL_KERNEL) and isinstance(call.args[0], tvm.ir.StringImm) \
                and call.args[0].value in canonical:
            return tvm.ir.Call(call.op, [tvm.ir.StringImm(canonical[call.args[0].value]), *call.args[1:]],
                               attrs=call.attrs, ty_args=call.ty_args, span=call.span, ret_ty=call.ty)
        return call

    out = mod.clone()
    for gvar, func in mod.functions.items():
        if gvar.name_hint in canonical:
            del out[gvar]
        elif isinstance(func, tirx.PrimFunc) and not _is_kernel(func):
            out.update_func(gvar, func.with_body(tvm_ffi.structural_mutate(func.body, [(tvm.ir.Call, rename)])))
    return out


_CALL_KERNEL = tvm.ir.Op.get("tirx.call_ffi_kernel")


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.CpuLocalsOnStack")
def cpu_locals_on_stack(mod, _ctx):
    """Keep a CPU kernel's ``local`` buffers on the stack, whatever their size.

    TVM allocates a CPU buffer over 1 KB from its workspace pool (``TVMBackendAllocWorkspace``),
    which needs the device the function runs on, and the kernels the passes call as functions
    (:class:`Subroutines`) have none (TVM: "Unknown device id in current IR"). The bf16
    projections keep a task's rounded weights and inputs in such buffers (tens of KB,
    :func:`tvmrnn.schedules.bf16.cpu_gemm_bf16`); a worker thread's stack (8 MB) holds them.
    ``disable_lower_builtin`` is TVM's own mark for an allocation ``LowerTVMBuiltin`` leaves as is."""
    def mark(node, mutator):
        node = mutator.default_mutate(node)
        if node.buffer.scope() == "local" and not node.annotations.get("disable_lower_builtin"):
            return tirx.AllocBuffer(node.buffer, {**node.annotations, "disable_lower_builtin": tvm.tirx.IntImm("bool", 1)}, node.span)
        return node

    return _mutate_bodies(mod, "llvm", [(tirx.AllocBuffer, mark)])


def _mutate_bodies(mod, kind: str, callbacks, wanted=lambda body: True):
    """``mod`` with the bodies of its functions for targets of ``kind`` (``"llvm"``, ``"cuda"``)
    that are ``wanted`` mutated by ``callbacks`` (``tvm_ffi.structural_mutate``'s)."""
    updates = {}
    for gvar, func in mod.functions.items():
        target = func.attrs.get("target") if isinstance(func, tirx.PrimFunc) and func.attrs is not None else None
        if target is None or target.kind.name != kind or not wanted(func.body):
            continue
        body = tvm_ffi.structural_mutate(func.body, callbacks)
        if not body.same_as(func.body):
            updates[gvar] = func.with_body(body)
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


# The masks of a variable-lengths build's kernels (kernels.recurrent_step's ``mask``, backward_step's
# ``gemm_mask`` and ``mask_next``): 1 where a row runs at the step
_MASK_NAME = re.compile(r"(^|_)mask(_|$)")
# Whether GPU builds run masked_selects_without_branches (a switch for comparisons)
MASKED_SELECTS_WITHOUT_BRANCHES = True


def _reads_a_mask(expr) -> bool:
    """Whether ``expr`` loads from a mask (in a program a kernel's buffer is named after its
    parameter and the tensor or scope it is: ``mask_mask``, ``mask_local``, ``gemm_mask_shared``)."""
    return _contains(expr, tvm.ir.TensorLoad, lambda load: _MASK_NAME.search(load.source.name) is not None)


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.MaskedSelectsWithoutBranches")
def masked_selects_without_branches(mod, _ctx):
    """On GPUs, a masked step's selects (a row that runs takes the step's value, one that has ended
    keeps its state: :func:`tvmrnn.kernels._where_running`) evaluate both values and pick one,
    rather than branch on the mask.

    TVM's ``RewriteUnsafeSelect`` turns a select whose values read memory into an if-then-else,
    so the mask's load and the branch on it came before the loads of the step's value (the
    input projection, the bias, the old cell state), after the grid barrier: two memory round
    trips a step instead of one (H100, DS2 bidirectional LSTM: the masked persistent step 12.3 us
    against 11.2 unmasked, notes/performance.md v84). Here each such select's values are bound to
    variables around it (``Let(v, value, Select(mask, v, w))``), which the rewrite leaves alone (a
    statement-level binding before the store made StorageRewrite fail on a persistent step
    compiled alone). Every load of those values is at the element's own place in its buffer, in
    bounds for a row that has ended too, and a select keeps a NaN or Inf of the value it drops out
    of the result, as the branch did. Only selects on a mask: others may guard a load that would
    be out of bounds."""
    if not MASKED_SELECTS_WITHOUT_BRANCHES:
        return mod

    def on_select(select, mutator):
        select = mutator.default_mutate(select)  # (a select inside one of its values first)
        if not _reads_a_mask(select.condition):
            return select
        bound, values = [], []
        for value in (select.true_value, select.false_value):
            if _contains(value, tvm.ir.TensorLoad, lambda _: True):
                var = tirx.Var(f"masked_value{len(bound)}", value.ty)
                bound.append((var, value))
                value = var
            values.append(value)
        result = tirx.Select(select.condition, *values)
        for var, value in reversed(bound):
            result = tirx.Let(var, value, result)
        return result

    def on_store(store, mutator):
        store = mutator.default_mutate(store)
        value = tvm_ffi.structural_mutate(store.value, [(tirx.Select, on_select)])
        return store if value.same_as(store.value) else tirx.BufferStore(store.buffer, value, store.indices)

    return _mutate_bodies(mod, "cuda", [(tirx.BufferStore, on_store)], wanted=_reads_a_mask)


# Whether one_alias_root_per_tensor runs (a switch for comparisons: off, a build can be wrong)
ONE_ALIAS_ROOT_PER_TENSOR = True


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.OneAliasRootPerTensor")
def one_alias_root_per_tensor(mod, _ctx):
    """Give the CPU kernels' pointer parameters of one name (a pass's tensor: :class:`Subroutines`
    names each after the tensor it points into, and its scratch pool ``scratch_pool``) one variable
    across every function of the module, at the end of the host passes.

    TVM's LLVM code tags each load and store for type-based alias analysis (TBAA) by the variable
    its buffer's data comes from, a type per variable, as if distinct variables never overlapped;
    a called function's pointer parameters get such types of their own. Once LLVM inlined the
    kernels into a pass, one kernel's store into ``dh_direct`` and the next one's load from it
    carried the types of two variables, and LLVM reordered them (v67: a bidirectional GRU's reverse
    dh0 wrong at batch 1, H = 1, where no parallel loop was left to keep the kernels apart). One
    variable a tensor gives every access to it one type, in every kernel; tensors keep their own
    (the kernels' speed: without TBAA the passes ran 2.1-2.3x slower, :data:`LLVM_TBAA`). Kernels
    hold one pointer per tensor (their views are offsets on it), so the types inside a kernel do
    not change. TVM's SSA conversion gives each function variables of its own, so this runs last,
    on the functions :class:`Subroutines` marks (``CPU_KERNEL_ATTR``)."""
    if not ONE_ALIAS_ROOT_PER_TENSOR:
        return mod
    shared, updates = {}, {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or not func.attrs.get(CPU_KERNEL_ATTR):
            continue
        pointers = [p for p in func.params if isinstance(p.ty, tvm.ir.PointerType)]
        names = [p.name for p in pointers]
        if len(set(names)) != len(names):
            raise AssertionError(f"{gvar.name_hint}: two pointer parameters of one name ({names}): one variable each "
                                 f"is what keeps LLVM's alias tags sound")
        vmap = {}
        for p in pointers:
            key = (p.name, str(p.ty))
            if key not in shared:
                shared[key] = tirx.Var(p.name, p.ty)
            vmap[p] = shared[key]
        params = [vmap.get(p, p) for p in func.params]
        body = kernels._substitute(func.body, vmap)
        updates[gvar] = tirx.PrimFunc(params, body, func.ret_type, attrs=func.attrs)
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def _tvmrnn_pipeline():
    """:func:`masked_selects_without_branches`, TVM's default TIR pipeline, then
    :func:`cooperative_grid_barriers` and :func:`merge_identical_kernels` (``tvm.compile(...,
    tir_pipeline="tvmrnn")``).

    The ``cp.async`` copies that GPU schedules ask for (software-pipeline stages marked async:
    :func:`tvmrnn.schedules.cuda.gpu_matmul`) are injected after TVM's pipeline rather than by
    its ``tirx.use_async_copy`` option, which also runs ``LowerAsyncDMA`` (Hexagon's DMA
    lowering). That pass left tvmrnn's kernels as they were (the CUDA source of whole builds and
    of ~350 tiled-GEMM settings was the same either way, notes/performance.md v85), yet took half
    of the pipeline's time (2.9 of 5.8 s in a 2-layer bidirectional LSTM's build); where a thread
    copies a contiguous run in a serial loop of an async stage (no tvmrnn schedule does), it
    makes a Hexagon DMA call that CUDA code cannot compile, and ``InjectPTXAsyncCopy`` alone
    gives ``cp.async``."""
    base, finalize_host, finalize_device = tirx.get_tir_pipeline("s_tir")
    # TVM 0.27's LowerWarpMemory turns the first warp-scope allocation of a statement sequence
    # into registers and leaves its siblings in warp scope (later TVM continues through them);
    # a tensor-core GEMM (tvmrnn.schedules.tensor_cores) has three side by side, so the pass runs until
    # none is left (it leaves lowered code unchanged)
    def device_passes():
        lower_warp = [tirx.transform.LowerWarpMemory() for _ in range(WARP_ALLOCATIONS - 1)]
        return tvm.transform.Sequential([*lower_warp, finalize_device(), check_shared_memory], name="tvmrnn_device")
    def host_passes():
        return tvm.transform.Sequential([finalize_host(), one_alias_root_per_tensor], name="tvmrnn_host")
    return (tvm.transform.Sequential([masked_selects_without_branches, base, s_tir.transform.InjectPTXAsyncCopy(),
                                      cooperative_grid_barriers, merge_identical_kernels, cpu_locals_on_stack],
                                     name="tvmrnn"),
            host_passes, device_passes)


WARP_ALLOCATIONS = 3  # the most warp-scope buffers side by side in one kernel (A, B and C fragments)


PIPELINE = "tvmrnn"
_tir_pipelines.PIPELINE_MAP[PIPELINE] = _tvmrnn_pipeline

# Whether LLVM may use TVM's type-based alias metadata (TBAA) on CPU builds (False: compiled with
# LLVM's -enable-tbaa=false). Without it every pass ran 2.1-2.3x slower on a 2-core Zen 5 (v67,
# notes/bench/v67/tbaa_ab_zen5.txt: LSTM N=20 H=512 T=100 inference 20.8 -> 41.7 ms): the kernels'
# parameters are not noalias, and TBAA is what tells LLVM a kernel's stores miss its weights. Its
# soundness across kernels is :func:`one_alias_root_per_tensor`'s. A switch for comparisons.
LLVM_TBAA = True


def compile_module(mod: tvm.IRModule, target):
    """``tvm.compile`` as every build compiles: with :data:`PIPELINE`, and without TIR's
    common-subexpression elimination on GPUs. CSE is superlinear in a function's size: on a GPU
    target, where the passes embed a launch per call site, it took 83% of a 2-layer bidirectional
    LSTM's build (31 of 37 s) and pushed a 5-layer one past minutes; NVCC eliminates the same
    subexpressions itself (the kernels' PTX was within 0.5% and used the same registers without it,
    notes/performance.md, v5). It would also hide the lane index of the TF32 kernels' warp-buffer
    stores from ``LowerWarpMemory`` (:mod:`tvmrnn.schedules.tensor_cores`). CPU builds keep it."""
    gpu = is_gpu(target)
    if not gpu and not LLVM_TBAA:  # (LLVM's option, for this compile: TVM restores its options after it)
        exported = dict(target.export())
        exported["cl-opt"] = [*exported.get("cl-opt", []), "-enable-tbaa:bool=false"]
        target = tvm.target.Target(exported)
    # (no "tirx.use_async_copy": the pipeline injects cp.async itself, _tvmrnn_pipeline)
    with tvm.transform.PassContext(config={"tirx.disable_cse_tir": gpu}):
        try:
            return tvm.compile(mod, target=target, tir_pipeline=PIPELINE)
        except SharedMemoryError:
            raise
        except Exception as e:  # TVM hands a Python pass's exception on as an error of its own
            found = re.search(_SHARED_MEMORY_MESSAGE, str(e), re.S)
            if found:
                raise SharedMemoryError(found.group(0)) from None
            raise


def _has_thread_loop(stmt) -> bool:
    """Whether a thread-bound loop (a kernel) is anywhere inside ``stmt``, under serial loops too."""
    return _contains(stmt, tirx.For, lambda loop: loop.thread_binding is not None)


def _hoist_scratch(body, scratch: list):
    """``body`` (an embedded kernel) without its root block's global-memory allocations, which
    go to ``scratch``."""
    if not isinstance(body, s_tir.SBlockRealize):
        return body
    block = body.block
    hoisted = [b for b in block.alloc_buffers if b.scope() == "global"]
    if not hoisted:
        return body
    scratch.extend(hoisted)
    kept = [b for b in block.alloc_buffers if b.scope() != "global"]
    block = s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint, block.body, block.init, kept,
                         block.match_buffers, block.annotations)
    return s_tir.SBlockRealize(body.iter_values, body.predicate, block)


def _called_strides(param, strides, stride_params: list) -> list:
    """The strides of a called kernel's view of ``param``: the constant ones as they are
    (``strides``: an int, or None for one that varies), a new integer parameter for each other
    one, appended to ``stride_params``."""
    full = []
    for i, x in enumerate(strides):
        if x is None:
            x = tirx.Var(f"{param.name}_stride{i}", I32)
            stride_params.append(x)
        full.append(_const(x))
    return full


def _scratch_parameters(scratch, decls: list, mapping: list, prefix: str = "") -> list:
    """A pointer parameter for each of a called kernel's global scratch buffers ``scratch`` (the
    caller passes where its pool places them), each declared in ``decls`` and mapped in
    ``mapping`` from the kernel's own buffer."""
    params = []
    for b in scratch:
        pointer = tirx.Var(prefix + b.name, tvm.ir.PointerType(tvm.ir.PrimType(b.dtype)))
        params.append(pointer)
        buf = tirx.decl_buffer(b.shape, b.dtype, b.name, elem_offset=0, data_alignment=4, offset_factor=1)
        decls.append(tirx.DeclBuffer(buf, data=pointer))
        mapping.append((b, buf))
    return params


def _tile_loop(func):
    """The parallel loop that is the whole of a scheduled CPU kernel ``func`` (its root block
    holding nothing else, bar ``local`` allocations, which only the loop can use: a task's own,
    such as the bf16 AMX step's C tile, which each tile function then allocates on its stack,
    :meth:`Subroutines._define`; global ones go to the pass's pool, :func:`_hoist_scratch`), or
    None. A loop that LoopPartition would cut (guarded tiles: :func:`_whole_tiles`) is given
    whole, or None where that cannot be done (:meth:`Program._region_loop`)."""
    body = _hoist_scratch(func.body, [])
    if not isinstance(body, s_tir.SBlockRealize) or body.block.init is not None or any(
            b.scope() != "local" for b in body.block.alloc_buffers):
        return None
    loop = body.block.body
    if not (isinstance(loop, tirx.For) and loop.kind == tirx.ForKind.PARALLEL):
        return None
    if "pragma_loop_partition_hint" in loop.annotations:
        return _whole_tiles(loop) if WHOLE_GUARDED_TILES else None
    return loop


# Whether a time loop that is one parallel region takes kernels with guarded tiles
# (:func:`_whole_tiles`; v79). Before, such a loop was a region a step, at every odd H.
WHOLE_GUARDED_TILES = True


def _whole_tiles(loop):
    """A parallel tile loop whose last tiles are guarded (``cpu.CPU_GUARDED_TILES``: block
    predicates that depend on the tile, and ``pragma_loop_partition_hint`` so that LoopPartition
    peels those tiles off) as one loop that LoopPartition need not cut, so that it can be one
    iteration of a time loop's parallel region (:meth:`Program._region_loop`, where a cut loop's
    second part would have no barrier and a part of one tile no loop at all, v70).

    The first ``m`` tiles, those for which every predicate is provable (TVM's arithmetic analyzer,
    the inner loops at their ranges: the largest such ``m``), run the body with the predicates
    dropped and the inner loops' hints removed: whole vectors, nothing to partition. Each later
    tile runs the body at a constant index (``for w in range(n - m): if tile == m + w``), so that
    LoopPartition cuts its inner loops at constant bounds as it cut the peeled tiles (a tile index
    it cannot bound left a ``min`` extent that TVM cannot vectorise, v70). The same arithmetic as
    the cut loop's, so the same bits. None where no tile is provably whole."""
    var, n = loop.loop_var, int(loop.extent)
    predicates, ranges = [], []

    def visit_for(node, visitor):
        ranges.append((node.loop_var, node.min, node.extent))
        return visitor.default_visit(node)

    def visit_realize(node, visitor):
        if not (isinstance(node.predicate, tirx.IntImm) and int(node.predicate) == 1):
            predicates.append(node.predicate)
        return visitor.default_visit(node)
    tvm_ffi.structural_visit(loop.body, [(tirx.For, visit_for), (s_tir.SBlockRealize, visit_realize)])

    def whole(m):  # every predicate provable for the first m tiles
        analyzer = tvm.sym.Analyzer()
        analyzer.bind(var, tvm.ir.Range.from_min_extent(loop.min, m))
        for v, lo, extent in ranges:
            analyzer.bind(v, tvm.ir.Range.from_min_extent(lo, extent))
        return all(analyzer.can_prove(p) for p in predicates)
    low, high = 0, n
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if whole(mid) else (low, mid - 1)
    m = low
    if m == 0 or not isinstance(loop.min, tirx.IntImm) or int(loop.min) != 0:
        return None

    def unguarded(node, mutator):
        node = mutator.default_mutate(node)
        return s_tir.SBlockRealize(node.iter_values, tirx.const(True, "bool"), node.block)

    def unhinted(node, mutator):
        return _unhinted(mutator.default_mutate(node))
    body = tvm_ffi.structural_mutate(loop.body, [(s_tir.SBlockRealize, unguarded), (tirx.For, unhinted)])
    if m < n:
        dtype = str(loop.extent.ty)
        w = tirx.Var("peeled", dtype)
        at = tirx.IntImm(dtype, m) + w
        rest = tirx.For(w, tirx.IntImm(dtype, 0), tirx.IntImm(dtype, n - m), tirx.ForKind.SERIAL,
                        tirx.IfThenElse(tirx.EQ(var, at), kernels._substitute(loop.body, {var: at}), None))
        body = tirx.IfThenElse(var < m, body, rest)
    return _unhinted(loop, body)


def _unhinted(loop, body=None):
    """``loop`` (with ``body`` instead of its own) without LoopPartition's hint."""
    if body is None and "pragma_loop_partition_hint" not in loop.annotations:
        return loop
    annotations = {k: v for k, v in loop.annotations.items() if k != "pragma_loop_partition_hint"}
    return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body if body is None else body,
                    loop.thread_binding, annotations)


class Subroutines:
    """CPU: each distinct kernel compiled once, as a function the passes call.

    A pass embedding its kernels inline compiles each kernel once per call site (each layer,
    direction and chunk size), and LLVM's code generation is most of a CPU build's time: it grew
    with call sites, not distinct kernels (197 call sites of 50 kernels in a 2-layer bidirectional
    LSTM at I=13, H=37: 15.5 of 19.7 s in LLVM; 7.4 s in all with the kernels of parallel loops
    called, 3.2 s with every kernel called, v33). Here a call site calls a private function of the
    module instead: each tensor the kernel's views look into becomes one pointer parameter, each
    view an integer offset on it (computed by the caller), and strides that vary (with the
    sequence length, say) integer ones; constant strides stay constants in the kernel's code.

    One pointer per tensor, not per view: TVM tags every load and store for LLVM's type-based
    alias analysis (TBAA) by its buffer's variable. With a pointer per view, a step's ``h_prev``
    (hs[t]) and its output (hs[t+1]) were buffers on two variables, which LLVM took for unrelated
    memory: once it inlined the step into its time loop it vectorised the loop across steps,
    loading step t+1's state before step t stored it (wrong states at H = N = 1, v31-v33). So
    until v33 only kernels whose every access sat in a parallel loop were called (TVM outlines
    those into functions LLVM does not inline). Turning TBAA off instead made the passes run 2x
    slower (v33). Across kernels the same held: two kernels' pointers into one tensor were two
    variables, and once LLVM inlined both into a pass it reordered one's store and the other's load
    (v67). So each pointer parameter is named after the pass's tensor it points into (a function
    per kernel and binding of tensors; the scratch pool is one pointer, its pieces offsets on it),
    and :func:`one_alias_root_per_tensor` makes each name one variable in every function here.
    One table serves every pass of a build, so the inference and training forwards share their
    kernels too (their tensors have the same names). One view bound to two parameters is one
    parameter. Each kernel's parallel loop stays its own parallel region, as inline."""

    def __init__(self):
        self._entries: dict = {}  # key -> (GlobalVar, the kernel's global scratch buffers)
        self.functions: dict = {}  # GlobalVar -> PrimFunc

    def call(self, program: "Program", kernel: Kernel, views: dict, tiles: bool = False) -> tirx.Stmt | None:
        """The call of ``kernel`` on ``views`` (role -> view), defining
        its function at the first call with these constant strides and these shared views.

        ``tiles`` (a time loop that is one parallel region, :meth:`Program._region_loop`): the
        kernel's parallel loop stays at the call site, and the function is one iteration of it
        (one tile, its index a parameter), so that the loop can join the time loop's region while
        its tiles' code is compiled once. Returns the call site (a block whose body is that loop),
        or None where the kernel is not one parallel loop (:func:`_tile_loop`)."""
        func = program.scheduled(kernel.name)
        loop = _tile_loop(func) if tiles else None  # (its bounds; _define takes that of its own copy of func)
        if tiles and loop is None:
            return None
        layouts, aliases = [], []
        for param, role in zip(func.params, kernel.roles):
            data, offset, strides = _view_layout(views[role], param)
            same = next((i for i, (d, o, st, shape) in enumerate(layouts)
                         if aliases[i] is None
                         and tvm_ffi.structural_equal((d, o, st, shape), (data, offset, strides, list(param.shape)))),
                        None)
            layouts.append((data, offset, strides, list(param.shape)))
            aliases.append(same)
        signature = tuple(tuple(int(x) if isinstance(x, tirx.IntImm) else None for x in strides)
                          for _, _, strides, _ in layouts)
        # views of one tensor share one base pointer, each its offset on it: inside the function
        # they are then buffers on one variable, which TVM's alias tags (TBAA) treat as one
        # object; as parameters of their own, LLVM took them for unrelated memory (v33)
        bases, names, groups = [], [], []
        for (d, _, _, _), same, role in zip(layouts, aliases, kernel.roles):
            if same is None:
                group = next((i for i, b in enumerate(bases) if tvm_ffi.structural_equal(b, d)), None)
                if group is None:
                    bases.append(d)
                    names.append(_view_tensor(views[role]).name)
                    group = len(bases) - 1
                groups.append(group)
        key = (kernel.name, signature, tuple(aliases), tuple(groups), tuple(names), tiles)
        if key not in self._entries:
            self._entries[key] = self._define(func, kernel, signature, aliases, groups, names, tiles)
        gvar, scratch = self._entries[key]
        args = [_byte_offset(b, 0) for b in bases]
        args += [o for (_, o, _, _), same in zip(layouts, aliases) if same is None]
        args += [x for (_, _, strides, _), same in zip(layouts, aliases) if same is None
                 for x in strides if not isinstance(x, tirx.IntImm)]
        args += program.scratch_arguments(scratch)

        def checked(call):
            # the function returns nonzero where a check in the kernel failed (it has set the error):
            # the pass stops there with an error, not on with the kernel's outputs unwritten
            # (TVM 0.27's Python AssertStmt hands its arguments on in the FFI's order: condition first)
            return tirx.AssertStmt(call == tirx.const(0, I32), tvm.ir.StringImm("RuntimeError"),
                                   [tvm.ir.StringImm(f"tvmrnn: a check in kernel {kernel.name} failed")])
        if not tiles:
            return checked(tvm.ir.Call(gvar, args, ret_ty=I32))
        tile = tirx.Var("tile", I32)
        grid = tirx.For(tile, loop.min, loop.extent, tirx.ForKind.PARALLEL,
                        checked(tvm.ir.Call(gvar, args + [tile], ret_ty=I32)))
        return s_tir.SBlockRealize([], tirx.const(True, "bool"), s_tir.SBlock([], [], [], kernel.name, grid))

    def _define(self, func, kernel: Kernel, signature, aliases, groups, names, tiles: bool = False) -> tuple:
        func = s_tir.renew_defs(func)  # variables of its own (before _tile_loop: _whole_tiles defines some twice)
        tile_params = []
        if tiles:  # the function is one iteration of its parallel loop, the loop's variable a parameter
            loop = _tile_loop(func)
            tile_params.append(loop.loop_var)
            root = func.body.block
            # the body under the loop's range as a condition, so that TVM's analyzer bounds the tile
            # index: unbounded, LowerIntrin's bound of ``tile // 4 * 2 // 3 * 89664`` (a weight
            # panel's stride) passed int32 and the build failed (an LSTM backward step, N=20 H=467, on
            # 16 cores: "Literal value 32091995695488 exceeds range of int32", v89)
            var = loop.loop_var
            in_range = tirx.And(var >= loop.min, var < loop.min + loop.extent)
            func = func.with_body(s_tir.SBlockRealize(func.body.iter_values, func.body.predicate, s_tir.SBlock(
                root.iter_vars, root.reads, root.writes, root.name_hint, tirx.IfThenElse(in_range, loop.body, None),
                root.init, root.alloc_buffers, root.match_buffers, root.annotations)))
        # named after their tensors: one_alias_root_per_tensor makes each name one variable
        bases = [tirx.Var(name, tvm.ir.PointerType(tvm.ir.PrimType(F32))) for name in names]
        params, stride_params, decls, mapping = [], [], [], []
        own = iter(groups)
        for param, strides, same in zip(func.params, signature, aliases):
            if same is not None:
                mapping.append((param, mapping[same][1]))
                continue
            pointer = bases[next(own)]
            offset = tirx.Var(f"{param.name}_offset", I32)
            params.append(offset)
            buf = tirx.decl_buffer(param.shape, F32, param.name, strides=_called_strides(param, strides, stride_params),
                                   elem_offset=offset, data_alignment=4, offset_factor=1)
            decls.append(tirx.DeclBuffer(buf, data=pointer))
            mapping.append((param, buf))
        body = _hoist_scratch(func.body, scratch := [])
        scratch_params, pool_offsets = [], []
        pooled = [_pooled_piece(b.shape, b.dtype) for b in scratch]
        if any(pooled):  # the pass's scratch pool: one variable in every kernel, each piece an offset on it
            scratch_params.append(tirx.Var(POOL_NAME, tvm.ir.PointerType(tvm.ir.PrimType(F32))))
        for b, in_pool in zip(scratch, pooled):
            if in_pool:
                offset = tirx.Var(f"{b.name}_pool_offset", I32)
                pool_offsets.append(offset)
                buf = tirx.decl_buffer(b.shape, F32, b.name, elem_offset=offset, data_alignment=4, offset_factor=1)
                decls.append(tirx.DeclBuffer(buf, data=scratch_params[0]))
                mapping.append((b, buf))
            else:
                # (an allocation of its own, named apart from the pass's tensors)
                scratch_params += _scratch_parameters([b], decls, mapping, prefix="scratch_own_")

        body = kernels._substitute(body, dict(mapping))
        sub = tirx.PrimFunc(bases + params + stride_params + pool_offsets + scratch_params + tile_params,
                            tirx.SeqStmt(decls + [body, tirx.Return(tirx.const(0, I32))]),
                            ret_type=tvm.ir.PrimType(I32))
        gvar = tvm.ir.GlobalVar(f"{kernel.name}_{len(self._entries)}")
        # Not ``tirx.noalias``, unlike the pass: with it (while serial kernels were called too,
        # with a pointer per view, before v33), a noalias kernel of the backward alone made the inference forward read
        # its state before the copy that set it (NaN at T = 1). Not pinned down and not retried;
        # without it the called kernels ran as fast as embedded ones (notes/performance.md v31).
        self.functions[gvar] = sub.with_attr(CPU_KERNEL_ATTR, True)  # (one_alias_root_per_tensor's)
        return gvar, [(b.shape, b.dtype, b.name) for b in scratch]


class GpuKernels:
    """GPU: each distinct kernel lowered once, as a function the passes call, which launches it.

    A pass that embeds a launch at every call site (each layer, direction and chunk size) is one
    function that TVM's lowering passes walk whole before it splits host from device code; they
    grew faster than the call sites (a 4-layer bidirectional LSTM: 84 of 93 s of its build in
    passes over the drivers, FlattenBuffer alone 30 s, while the device kernels' own passes took
    1.2 s; the same 55 distinct kernels as at 2 layers, which built in a third of the time,
    notes/performance.md v54, v55). Here a call site calls a private function of the module
    instead, one per kernel and call signature, which holds the kernel alone: TVM splits it into
    a host stub (the launch) and the device kernel. Its parameters are those of the embedded
    kernel with its views as pointers (``view_pointers``): a pointer per view, computed by the
    caller, so that the kernel compiles to the code :func:`merge_identical_kernels` kept of the
    embedded launches, plus the strides that vary (with the sequence length) and the kernel's
    global scratch. A persistent time loop still embeds its kernel (the loop moves inside it).
    Kernels are ``tirx.noalias`` as the passes are: distinct views never overlap, and one view
    bound to two parameters is one pointer."""

    def __init__(self, target, dependent_launch: bool | str = False):
        self._entries: dict = {}  # key -> (GlobalVar, the kernel's global scratch buffers)
        self.functions: dict = {}  # GlobalVar -> PrimFunc
        # the device target without its host, given to each kernel's function: TVM binds a
        # function that host code calls to the host's target unless it has one, splits host
        # from device code only in functions whose target has a host, and launches a call from
        # host code to a device function as that kernel (LowerDeviceKernelLaunch)
        exported = dict(target.export())
        exported.pop("host", None)
        self.target = tvm.target.Target(exported)
        # programmatic dependent launch for every kernel here (``Program.dependent_launch``:
        # False, "wait" or "early"; ``device.dependent_launch``)
        self.dependent_launch = dependent_launch

    def trial(self) -> "GpuKernels":
        """A copy whose new functions stay its own until :meth:`adopt` takes them: for a program
        that may be discarded (a layer wavefront that would not run persistent), whose kernels
        the module should not hold."""
        copy = GpuKernels.__new__(GpuKernels)
        copy.__dict__.update(self.__dict__)
        copy._entries, copy.functions = dict(self._entries), dict(self.functions)
        return copy

    def adopt(self, trial: "GpuKernels") -> None:
        """Take a :meth:`trial`'s functions as this table's."""
        self._entries.update(trial._entries)
        self.functions.update(trial.functions)

    def call(self, program: "Program", kernel: Kernel, views: dict) -> tirx.Stmt | None:
        """The calls of ``kernel``'s launches on ``views`` (role -> view), defining their
        functions at the first call with these constant strides and these shared views; None
        where the kernel is not a sequence of launches alone (the caller embeds it)."""
        func = program.scheduled(kernel.name)
        pointers, strides_of, aliases = [], [], []
        for param, role in zip(func.params, kernel.roles):
            data, offset, strides = _view_layout(views[role], param)
            pointer = _byte_offset(data, offset)
            same = next((i for i, (p, st) in enumerate(zip(pointers, strides_of))
                         if aliases[i] is None and tvm_ffi.structural_equal((p, st), (pointer, strides))), None)
            pointers.append(pointer)
            strides_of.append(strides)
            aliases.append(same)
        signature = tuple(tuple(int(x) if isinstance(x, tirx.IntImm) else None for x in strides)
                          for strides in strides_of)
        key = (kernel.name, signature, tuple(aliases))
        if key not in self._entries:
            names = tuple(f"{_view_tensor(views[role]).name}_{param.name}" for param, role in zip(func.params, kernel.roles))
            self._entries[key] = self._define(func, signature, aliases, names, kernel.name)
        entry = self._entries[key]
        if entry is None:
            return None
        launches, scratch = entry
        scratch_pointers = program.scratch_pointers(scratch)
        calls = []
        for gvar, params, scratch_used in launches:
            args = [pointers[i] for i in params]
            args += [x for i in params for x in strides_of[i] if not isinstance(x, tirx.IntImm)]
            args += [scratch_pointers[i] for i in scratch_used]
            calls.append(tirx.Evaluate(tvm.ir.Call(gvar, args, ret_ty=tvm.ir.PrimType("void"))))
        return tirx.SeqStmt(calls) if len(calls) > 1 else calls[0]

    def _define(self, func, signature, aliases, names, name) -> tuple | None:
        """``(launches, scratch)``: for each launch of the kernel, its function, the kernel
        parameters it takes (those it uses, one of each set of aliases) and the scratch it uses;
        the kernel's global scratch, ``(shape, dtype, name)`` each. None where the kernel's body
        is not launches alone."""
        func = s_tir.renew_defs(func)  # variables of its own
        body = _hoist_scratch(func.body, scratch := [])
        regions = _launch_regions(body)
        if regions is None:
            return None
        launches = []
        for region in regions:
            params, decls, mapping, stride_params, used = [], [], [], [], []
            for i, (param, strides, same, view_name) in enumerate(zip(func.params, signature, aliases, names)):
                if same is not None or not any(_uses(region, p) for j, p in enumerate(func.params)
                                               if j == i or aliases[j] == i):
                    continue
                used.append(i)
                pointer = tirx.Var(view_name, tvm.ir.PointerType(tvm.ir.PrimType(F32)))
                params.append(pointer)
                buf = tirx.decl_buffer(param.shape, F32, view_name, strides=_called_strides(param, strides, stride_params),
                                       elem_offset=0, data_alignment=4, offset_factor=1)
                decls.append(tirx.DeclBuffer(buf, data=pointer))
                mapping.append((param, buf))
                mapping += [(p, buf) for j, p in enumerate(func.params) if aliases[j] == i]
            scratch_used = [k for k, b in enumerate(scratch) if _uses(region, b)]
            scratch_params = _scratch_parameters([scratch[k] for k in scratch_used], decls, mapping)
            launch = kernels._substitute(region, dict(mapping))
            if self.dependent_launch:
                launch = with_grid_dependencies(launch, early=self.dependent_launch == "early")
            sub = tirx.PrimFunc(params + stride_params + scratch_params, tirx.SeqStmt(decls + [launch]))
            sub = sub.with_attr("tirx.noalias", True).with_attr("target", self.target)
            if self.dependent_launch:
                sub = sub.with_attr(LAUNCH_PARAMS, [DEPENDENT])
            gvar = tvm.ir.GlobalVar(f"{name}_{len(self.functions)}")
            self.functions[gvar] = sub
            launches.append((gvar, used, scratch_used))
        return launches, [(b.shape, b.dtype, b.name) for b in scratch]


def _launch_regions(body) -> list | None:
    """A scheduled GPU kernel's launches (the statements of its root block, each a grid of
    thread blocks), each in a root block of its own with the allocations it uses; None where a
    statement there is not a launch (it would run on the host)."""
    if not isinstance(body, s_tir.SBlockRealize):
        return None
    block = body.block
    stmts = list(block.body.seq) if isinstance(block.body, tirx.SeqStmt) else [block.body]
    if not stmts or not all(isinstance(s, tirx.For) and s.thread_binding is not None for s in stmts):
        return None
    regions = []
    for stmt in stmts:
        allocs = [b for b in block.alloc_buffers if _uses(stmt, b)]
        regions.append(s_tir.SBlockRealize(body.iter_values, body.predicate, s_tir.SBlock(
            block.iter_vars, block.reads, block.writes, block.name_hint, stmt, block.init, allocs,
            block.match_buffers, block.annotations)))
    return regions


class Program:
    """Builds one driver PrimFunc from kernel calls and loops over symbolic extents."""

    def __init__(self, name: str, schedule: Callable[[Kernel], tirx.PrimFunc],
                 persistent_blocks: int | tuple[int, ...] | None = None,
                 one_region: bool = False, barrier_param: bool = True, view_pointers: bool = False,
                 options: BuildOptions | None = None, subroutines: Subroutines | GpuKernels | None = None):
        options = options if options is not None else BuildOptions()
        self.name = name
        # the persistent loops' grid-barrier counter: a parameter of the driver (a pass), or its
        # own scratch allocation (`step_loop`, whose function keeps the kernel's parameters)
        self.barrier_param = barrier_param
        self.schedule = schedule
        # GPU only: the most thread blocks that are surely resident at once; with it, each time
        # loop of one kernel runs as one persistent launch (see `loop`). A tuple: the counts a
        # loop's step tries in order until its schedule qualifies (device.persistent_block_caps),
        # the last the most
        caps = (persistent_blocks,) if isinstance(persistent_blocks, int) else persistent_blocks
        self.persistent_caps: tuple[int, ...] | None = tuple(caps) if caps else None
        self.persistent_blocks = max(caps) if caps else None
        self._persistent_choice: dict[str, Kernel | None] = {}  # step kernel -> its persistent form, or None
        self._persistent: list | None = None  # the calls of the persistent time loop being emitted
        # with it, only kernels whose schedule keeps their weights in shared memory run
        # persistent (``options.persistent == "auto"``); the others' loops stay per-step
        self.persistent_if_on_chip = persistent_blocks is not None and options.persistent == "auto"
        # steps of few rows try blocks of row groups first (``options.row_groups``, common.GPU_ROW_GROUP_STEPS;
        # not where a block count is asked for: that asks for split-K's blocks)
        self.row_groups = (self.persistent_if_on_chip and options.persistent_blocks is None
                           and (options.row_groups if options.row_groups is not None else common.GPU_ROW_GROUP_STEPS))
        # large steps on TF32 tiles run one launch a step (``options.tensor_core_steps``)
        self.tf32_steps = persistent_blocks is not None and options.tf32_steps
        # a persistent kernel scheduled with more blocks than are surely resident (a tile that did
        # not fit) runs its loop one launch a step (`step_loop`, which measures a schedule as it
        # is, turns this off: it refuses such a schedule instead)
        self.check_resident = True
        # time loops of two-direction kernels too (``options.persist_stacked``)
        self.persist_stacked = persistent_blocks is not None and options.persist_stacked
        # CPU only: each time loop as one parallel region, a barrier between steps (`_region_loop`)
        self.one_region = one_region
        self._region: list | None = None  # the calls of that time loop being emitted
        self._barrier: SequenceTensor | None = None  # the grid barriers' counter (loops of 2 or more blocks)
        self._persistent_loops = 0
        self.blocks_used = 0  # the largest block count of a persistent step it took
        self.params: list[SequenceTensor] = []
        self._scheduled: dict[str, tirx.PrimFunc] = {}
        self._launched_forms: dict[str, tirx.PrimFunc] = {}  # (scheduled to decide on persistence)
        self._stack: list[list] = [[]]
        self._extents: list = []  # (variable, extent) of the loops being emitted, innermost last
        self.kernels: dict[str, Kernel] = {}
        self._call_extents: dict[str, list] = {}  # kernel name -> loop extents of each call
        self._step_loops: list[list] = []  # per time loop: [extents down to it, calls directly in it]
        self._in_step_loop = False
        # global-memory scratch of the embedded kernels (a GEMM's partial sums split over blocks),
        # allocated once at the top of the driver (a kernel's own allocation, left in place inside
        # a loop, would not lower)
        self._scratch: list = []
        # ... most of it in one pool the calls share (`_pooled`)
        # (its size is known once every call is in: `build` swaps this stand-in for the real one)
        self._pool = tirx.decl_buffer((tirx.Var("pool_size", I32),), F32, POOL_NAME)
        self._pool_size = 0
        # GPU (sm_90+) only: launch every kernel with programmatic dependent launch (Hopper's
        # PDL: the next kernel's blocks are launched while this one runs, and wait at their
        # start, ``griddepcontrol.wait``, until it has finished and its writes are visible),
        # which hides the launch latency between a time loop's back-to-back kernels
        # (`with_grid_dependencies`; set by `passes.all_programs` from `target.dependent_launch`):
        # False, "wait" (a kernel is launched once the one before has exited) or "early" (also
        # ``launch_dependents`` at each kernel's start: launched once the one before is running)
        self.dependent_launch: bool | str = False
        # GPU: views declared as pointers the host computes (`_make_view`)
        self.view_pointers = view_pointers
        # CPU: kernels called as functions, each compiled once (:class:`Subroutines`); in a time
        # loop that is one parallel region, each kernel's parallel loop calling a function of a tile
        self.subroutines = subroutines

    def _pool_offsets(self, pieces) -> list:
        """Where a kernel call's global scratch (a GEMM's partial sums split over blocks; ``(shape,
        dtype)`` each) goes in the program's one scratch pool, from its start: the calls run one
        after the other, so they share it, and a pass holds the largest call's scratch, not the
        sum over every call of every layer (a 5-layer LSTM's backward: 17 MB against 223 MB).
        Each piece's offset in elements, or None for one that needs an allocation of its own (not
        float32, or not of static size)."""
        offsets, offset = [], 0
        for shape, dtype in pieces:
            if not _pooled_piece(shape, dtype):
                offsets.append(None)
                continue
            offsets.append(offset)
            size = 1
            for d in shape:
                size *= int(d)
            offset += -(-size // 64) * 64  # each piece 256-byte aligned
        self._pool_size = max(self._pool_size, offset)
        return offsets

    def _pooled(self, buffers) -> tuple[list, list]:
        """Declarations of an embedded kernel's global scratch in the pool (:meth:`_pool_offsets`),
        and the buffers they replace."""
        decls, mapping = [], []
        for b, offset in zip(buffers, self._pool_offsets([(b.shape, b.dtype) for b in buffers])):
            if offset is None:
                self._scratch.append(b)  # its own allocation
                continue
            view = tirx.decl_buffer(b.shape, F32, b.name, elem_offset=_const(offset), data_alignment=4, offset_factor=1)
            decls.append(tirx.DeclBuffer(view, data=tirx.buffer_data(self._pool)))
            mapping.append((b, view))
        return decls, mapping

    def _placed(self, scratch) -> tuple[list, list]:
        """A called kernel's global scratch ((shape, dtype, name) each) placed as
        :meth:`_pool_offsets` places it: each piece's offset in the pool (None: its own
        allocation), and the data pointers of the pieces with an allocation of their own."""
        offsets = self._pool_offsets([(sh, dt) for sh, dt, _ in scratch])
        own = []
        for (shape, dtype, name), offset in zip(scratch, offsets):
            if offset is None:
                self._scratch.append(tirx.decl_buffer(shape, dtype, name))
                own.append(tirx.buffer_data(self._scratch[-1]))
        return offsets, own

    def scratch_pointers(self, scratch) -> list:
        """Pointers to a called kernel's global scratch, a piece each (:meth:`_placed`)."""
        offsets, own = self._placed(scratch)
        owned = iter(own)
        return [next(owned) if o is None else _byte_offset(tirx.buffer_data(self._pool), o) for o in offsets]

    def scratch_arguments(self, scratch) -> list:
        """A called CPU kernel's scratch arguments (``Subroutines``): the offsets of its pieces in
        the pool, then the pool's pointer where it has any, then the pointers of pieces with an
        allocation of their own."""
        offsets, own = self._placed(scratch)
        pooled = [tirx.const(o, I32) for o in offsets if o is not None]
        return pooled + ([_byte_offset(tirx.buffer_data(self._pool), 0)] if pooled else []) + own

    @property
    def all_step_loops_persistent(self) -> bool:
        """Whether every time loop became a persistent kernel (none stayed a loop of launches)."""
        return self._persistent_loops == len(self._step_loops)

    @property
    def uses_persistent_loops(self) -> bool:
        """Whether some time loop became a persistent kernel (its blocks must all be resident)."""
        return self._persistent_loops > 0

    def tensor(self, name, shape, axes) -> SequenceTensor:
        t = SequenceTensor(name, shape, axes)
        self.params.append(t)
        return t

    def flat(self, name, size) -> FlatTensor:
        t = FlatTensor(name, size)
        self.params.append(t)
        return t

    def call(self, kernel: Kernel, **views) -> None:
        """Run ``kernel`` here, each of its parameters bound to a :class:`View` (by role), or to a
        :class:`Stacked` pair of them for a kernel with a leading batch axis."""
        if set(views) != set(kernel.roles):
            raise AssertionError(f"{kernel.name}: roles {kernel.roles}, bound {sorted(views)}")
        if self._persistent is not None and kernel.batch and not self.persist_stacked:
            self._persistent = None  # this time loop stays a host loop of launches
        if self._persistent is not None:
            persistent = self._persistent_form(kernel)
            if persistent is None:
                self._persistent = None  # this time loop stays a host loop of launches
            else:
                kernel = persistent
        if kernel.name not in self._scheduled:
            launched = self._launched_forms.get(kernel.name)
            self._scheduled[kernel.name] = launched if launched is not None else self.schedule(kernel)
            self.kernels[kernel.name] = kernel
        self._call_extents.setdefault(kernel.name, []).append(list(self._extents))
        if self._in_step_loop:
            self._step_loops[-1][1] += 1
        if self.subroutines is not None and self._persistent is None:
            in_region = self._region is not None and self._in_step_loop
            # in a time loop that is one parallel region, a kernel's tiles are called from its
            # parallel loop, which joins the region; one that is not a parallel loop is called
            # whole (the loop then stays a region per step: _region_loop)
            called = self.subroutines.call(self, kernel, views, tiles=True) if in_region else None
            if called is not None:
                self._region.append(called)
            else:
                called = self.subroutines.call(self, kernel, views)
            if called is not None:
                self._stack[-1].append(called)
                return
        func = s_tir.renew_defs(self._scheduled[kernel.name])  # fresh variables per embedding
        decls, mapping = [], []
        # a persistent loop's views stay offsets: `hoist_invariant_copies` reads them to tell
        # which move with the step
        pointer = self.view_pointers and self._persistent is None
        for param, role in zip(func.params, kernel.roles):
            buf, decl = _make_view(views[role], param, pointer)
            # The same view for two parameters (an accumulating kernel's ``acc`` and its output):
            # one buffer, as offsets into one parameter share its pointer. Two pointers would
            # reach the kernel as two ``__restrict__`` arguments to the same memory.
            same = next((d.buffer for d in decls if _same_view(d, decl)), None) if pointer else None
            if same is not None:
                mapping.append((param, same))
                continue
            decls.append(decl)
            mapping.append((param, buf))

        body = _hoist_scratch(kernels._substitute(func.body, dict(mapping)), hoisted := [])
        if hoisted:
            pooled, mapping = self._pooled(hoisted)
            decls += pooled
            body = kernels._substitute(body, dict(mapping))
        if self._persistent is not None:
            self._persistent.append((decls, body))
        if self._region is not None and self._in_step_loop:
            self._region.append(body)
        self._stack[-1].append(tirx.SeqStmt(decls + [body]))

    @contextmanager
    def loop(self, extent, name="i"):
        """``for i in range(extent)``: statements emitted inside go into the loop body."""
        var = tirx.Var(name, I32)
        self._stack.append([])
        self._extents.append((var, _const(extent)))
        outer_step = self._in_step_loop
        persistent = name == "step" and self.persistent_blocks is not None
        if name == "step":
            self._step_loops.append([list(self._extents), 0])
            self._in_step_loop = True
        if persistent:
            self._persistent = []
        region = name == "step" and self.one_region and not persistent
        if region:
            self._region = []
        yield var
        calls, self._persistent = self._persistent, None
        region_calls = self._region
        if region:
            self._region = None
        self._in_step_loop = outer_step
        self._extents.pop()
        body = self._stack.pop()
        kernel_loop = self._persistent_loop(var, extent, calls) if persistent and calls is not None else None
        if kernel_loop is None and region and body:
            kernel_loop = self._region_loop(var, extent, body, region_calls)
        if kernel_loop is not None:
            self._stack[-1].extend(kernel_loop)
        elif body:
            self._stack[-1].append(tirx.For(var, _const(0), _const(extent), tirx.ForKind.SERIAL,
                                            tirx.SeqStmt(body) if len(body) > 1 else body[0]))

    def _region_loop(self, var, extent, body: list, calls: list) -> list | None:
        """CPU: a time loop as one parallel region instead of one per step.

        Each embedded kernel's tiles are one parallel loop, and TVM's thread pool starts its
        threads for each such loop: a region per step. Here the time loop itself becomes the
        region (``pragma_parallel_launch_point``: every thread runs the loop), each kernel's
        parallel loop inside it is split over the threads as before (the same static partition
        at every step, so a core keeps its slice of the weights), and a barrier of the pool
        (``pragma_parallel_barrier_when_finish``, ``TVMBackendParallelBarrier``) ends each
        kernel, so that step t+1 reads what every thread wrote at step t. Returns the loop, or
        None (the loop stays a region per step) unless every statement of its body is a kernel
        whose body is one parallel loop: anything outside one would run on every thread. A kernel
        with guarded tiles (``cpu.CPU_GUARDED_TILES``), whose parallel loop TIR's LoopPartition
        would cut in two at lowering (the second part without the barrier, a part of one tile no
        loop at all, run by every thread), comes with its loop given whole (:func:`_whole_tiles`,
        through :class:`Subroutines`' tile functions; embedded inline it still leaves the loop a
        region per step).
        """
        kernels_in = list(calls or ())
        stmts = []
        for stmt in body:
            stmts.extend(stmt.seq if isinstance(stmt, tirx.SeqStmt) else [stmt])
        launches = [s for s in stmts if not isinstance(s, tirx.DeclBuffer)]
        if not kernels_in or len(launches) != len(kernels_in):
            return None
        grids = []
        for kernel_body in kernels_in:
            if not isinstance(kernel_body, tvm.s_tir.SBlockRealize):
                return None
            grid = kernel_body.block.body
            if not (isinstance(grid, tirx.For) and grid.kind == tirx.ForKind.PARALLEL) or "pragma_loop_partition_hint" in grid.annotations:
                return None
            grids.append(grid)

        def barrier_after(loop, mutator):
            if any(loop.same_as(g) for g in grids):
                return tirx.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, loop.thread_binding,
                                {**loop.annotations, "pragma_parallel_barrier_when_finish": 1})
            return loop

        steps = [tvm_ffi.structural_mutate(stmt, [(tirx.For, barrier_after)]) for stmt in body]
        return [tirx.For(var, _const(0), _const(extent), tirx.ForKind.SERIAL,
                         tirx.SeqStmt(steps) if len(steps) > 1 else steps[0],
                         annotations={"pragma_parallel_launch_point": 1})]

    def _persistent_form(self, kernel: Kernel) -> Kernel | None:
        """The persistent form of a step kernel (:func:`tvmrnn.kernels.persistent`) at the first of
        :attr:`persistent_caps` whose schedule qualifies, scheduled; None where none does (its
        time loop then runs one launch a step). Decided once per kernel."""
        if kernel.name in self._persistent_choice:
            return self._persistent_choice[kernel.name]
        chosen = None
        # "auto" in the backward: steps of row tiles (many rows), and split-K's steps (a few rows)
        # below a step's work from which they were faster as per-step launches (notes v10, v57;
        # common.backward_launches_beat_persistence). Nor, in any pass, a large step of many rows,
        # whose launches take the tiled GEMM: the LSTM's persistent forward at N = 256, H = 1024
        # (split-K, every block all 256 rows) took 58.7 ms on the H200, its launches 7.8 (v42;
        # common.launches_beat_persistence); nor one of fewer rows whose launched GEMM is split over
        # blocks (v64)
        rows = self._row_groups_form(kernel)  # blocks of row groups first, where they apply
        if rows is not None:
            persistent, scheduled = rows
            self._take(persistent, scheduled, _grid_blocks(scheduled) or 1)
            self._persistent_choice[kernel.name] = persistent
            return persistent
        declined = self.persistent_if_on_chip and (launches_beat_persistence(kernel, self.tf32_steps, self._launched) or (
            self.name == "backward" and backward_launches_beat_persistence(kernels.persistent(kernel, self.persistent_caps[0]))))
        if not declined:
            for cap in self.persistent_caps:
                persistent = kernels.persistent(kernel, cap)
                scheduled = self.schedule(persistent)
                if self.persistent_if_on_chip and not keeps_weights_on_chip(scheduled, persistent):
                    continue  # its weights would be read from L2 every step: slower
                if self.check_resident and (_grid_blocks(scheduled) or 0) > cap:
                    continue  # more blocks than are surely resident (a tile that did not fit)
                if (self.persistent_if_on_chip and self.name == "backward" and cap != self.persistent_caps[-1]
                        and backward_blocks_too_few(kernel, _grid_blocks(scheduled) or cap)):
                    continue  # too much of a backward step a block: more blocks (the next cap)
                self._take(persistent, scheduled, cap)
                chosen = persistent
                break
        self._persistent_choice[kernel.name] = chosen
        return chosen

    def _take(self, persistent: Kernel, scheduled: tirx.PrimFunc, blocks: int) -> None:
        """Record a step kernel's chosen persistent form, scheduled, of ``blocks`` blocks."""
        self._scheduled[persistent.name] = scheduled
        self.kernels[persistent.name] = persistent
        self.blocks_used = max(self.blocks_used, blocks)

    def _row_groups_form(self, kernel: Kernel) -> tuple[Kernel, tirx.PrimFunc] | None:
        """A step kernel's persistent form in blocks of row groups (common.GPU_ROW_GROUP_STEPS) and
        its schedule, where it applies and the schedule's blocks are independent (each holds the
        weights) and fit the SMs; else None. A schedule measured as it is (tvmrnn.tune.step_loop:
        ``persistent_if_on_chip`` off) is taken as it is."""
        if not (self.row_groups and (row_groups_apply(kernel) or not self.persistent_if_on_chip)):
            return None
        persistent = kernels.persistent(kernel, self.persistent_caps[-1], row_groups=True)
        try:
            scheduled = self.schedule(persistent)
        except (s_tir.ScheduleError, tvm.error.TVMError, ValueError):
            if not self.persistent_if_on_chip:
                raise
            return None  # a template that does not take this kernel: split-K's forms instead
        if not self.persistent_if_on_chip:
            return persistent, scheduled
        grid = _bound_loop(scheduled.body, "blockIdx.x")
        if (grid is not None and independent_blocks(grid) and keeps_weights_on_chip(scheduled, persistent)
                and int(grid.extent) <= self.persistent_caps[-1]):
            return persistent, scheduled
        return None

    def _launched(self, kernel: Kernel) -> tirx.PrimFunc:
        """A step kernel's launched form, scheduled (once: :meth:`call` takes it from here)."""
        if kernel.name not in self._launched_forms:
            self._launched_forms[kernel.name] = self.schedule(kernel)
        return self._launched_forms[kernel.name]

    def _persistent_loop(self, var, extent, calls) -> list | None:
        """A time loop of one kernel as one launch: the loop moves inside the kernel.

        The kernel's blocks (at most ``persistent_blocks``, so all are resident) each run every
        step, meeting at a grid-wide barrier (:func:`grid_barrier`) after each, so that step t+1
        reads the state all blocks wrote at step t. This saves a launch per step, and each block
        works on the same columns at every step, so its slice of the recurrent weights can stay
        on its SM (the persistent RNN kernels of Diamos et al., 2016, and EcoRNN; on the H100 so
        far it is slower than per-step launches, ``notes/performance.md`` v4). Returns the
        statements (reset the barrier, run the kernel), or None where the kernel's schedule is
        not a single grid of at most ``persistent_blocks`` blocks (then the host loop runs it).
        """
        if len(calls) != 1:
            return None
        decls, body = calls[0]
        if not isinstance(body, tvm.s_tir.SBlockRealize):
            return None
        grid = body.block.body
        if not (isinstance(grid, tirx.For) and grid.thread_binding is not None
                and grid.thread_binding.thread_tag == "blockIdx.x" and isinstance(grid.extent, tirx.IntImm)
                and int(grid.extent) <= self.persistent_blocks):
            return None
        threads = _thread_extent(grid.body)
        if threads is None:
            return None
        blocks = int(grid.extent)
        self._persistent_loops += 1
        # blocks that each own all units of their rows (row groups) read nothing another wrote:
        # they meet at __syncthreads only, as one block does (no counter, atomic, polling, reset)
        annotations = {k: v for k, v in grid.annotations.items() if k != INDEPENDENT_BLOCKS}
        if blocks > 1 and not independent_blocks(grid):
            if self._barrier is None:
                if self.barrier_param:
                    self._barrier = self.tensor("grid_barrier", (1,), ("i",))
                else:
                    self._barrier = SequenceTensor("grid_barrier", (1,), ("i",))
                    self._scratch.append(self._barrier.buffer)
            self.call(kernels.fill_zero(1), dst=self._barrier.at("i"))
            reset = [self._stack[-1].pop()]
            # the counter is an int32 view of the float32 parameter (zero bits are 0 either way)
            counter = tirx.decl_buffer((1,), I32, "grid_barrier_count", elem_offset=0, data_alignment=4)
            sync = grid_barrier(counter, (var + 1) * blocks, threads)
            declare = [tirx.DeclBuffer(counter, data=tirx.buffer_data(self._barrier.buffer))]
        else:
            # one block, or independent ones: no counter, no atomic, no polling, no reset launch
            reset, declare = [], []
            sync = grid_barrier(None, None, threads)
        outer_decls, step_decls, hoisted, per_step = hoist_invariant_copies(decls, grid.body, var)
        per_step = [first_step_only(s, var) for s in per_step]
        steps = tirx.For(var, _const(0), _const(extent), tirx.ForKind.SERIAL,
                         tirx.SeqStmt(step_decls + per_step + [sync]))
        new_grid = tirx.For(grid.loop_var, grid.min, grid.extent, grid.kind,
                            _seq(declare + outer_decls + hoisted + [steps]),
                            grid.thread_binding, annotations)

        def swap(loop, mutator):
            return new_grid if loop.same_as(grid) else loop

        return reset + [tvm_ffi.structural_mutate(body, [(tirx.For, swap)])]

    def chunked(self, length, sizes: tuple[int, ...], emit: Callable, tail_waste: int = 0,
                tail_rows: tuple[int, int] | None = None) -> None:
        """Cover ``range(length)`` with chunks: as many of ``sizes[0]`` as fit, then ``sizes[1]``...

        ``emit(start, size)`` emits the calls for one chunk. ``sizes`` must end with 1, so that
        every length is covered while each kernel keeps a static chunk size.

        ``tail_waste`` (for chunks whose calls may run twice over a step with the same result: the
        GPU's all-steps input projections, each step's rows written from its own inputs alone):
        where the steps left after a size's whole chunks would take more than one chunk of the
        next size, one more chunk of this size ending at ``length`` covers them, recomputing at
        most ``tail_waste`` steps that a chunk before it covered. At T = 60 with the GPU's chunks
        that is 2 launches (0-32, 28-60) instead of 8 (one of 32, seven of 4): a small GEMM's
        launch costs more than its work (LSTM N = 1, H = 96 on the H200: 3.3 us each, the eight
        a third of the forward's kernel time, notes/performance.md v45).

        ``tail_rows`` = ``(rows, full)``: the tail is also taken, whatever it recomputes, where it
        costs at most half the chunks it replaces, counting a chunk of ``size`` steps as
        ``max(size * rows, full)`` (a GEMM of fewer rows than ``full`` took about as long as one
        of ``full`` rows on the H200, :data:`tvmrnn.program.passes.GPU_GEMM_FULL_ROWS`).
        """
        if sizes[-1] != 1:
            raise AssertionError("chunk sizes must end with 1")
        # the plain cover's starts; a tail, once taken, leaves nothing to the sizes after it (each
        # condition reads the plain cover: expressions that nest a Select in the next size's made a
        # 1.6 s build take 160 s)
        start, tail_before = _const(0), None
        for index, size in enumerate(sizes):
            count = tirx.floordiv(_const(length) - start, size) if size > 1 else _const(length) - start
            with self.loop(count if tail_before is None else tirx.Select(tail_before, _const(0), count),
                           f"chunk{size}") as i:
                emit(start + i * size, size)
            start = start + count * size
            # (not before the one-step chunks: a tail there saves at most sizes[-2] - 2 launches, and
            # each tail is one more call site of the kernel to compile: 5.9 -> 8.5 s for a 2-layer
            # bidirectional GPU build here with tails at every size, 6.7 s without that one)
            if (tail_waste or tail_rows) and index < len(sizes) - 2:
                rest = _const(length) - start  # < size
                cheap = size - rest <= tail_waste
                if tail_rows:
                    rows, full = tail_rows
                    left, plain = rest, _const(0)  # the plain cover of rest, in rows (no Selects)
                    for smaller in sizes[index + 1:]:
                        plain = plain + tirx.floordiv(left, smaller) * max(smaller * rows, full)
                        left = tirx.floormod(left, smaller)
                    cheap = tirx.Or(cheap, 2 * max(size * rows, full) <= plain)
                wanted = tirx.And(tirx.And(rest > sizes[index + 1], cheap), _const(length) >= size)
                taken = wanted if tail_before is None else tirx.And(wanted, tirx.Not(tail_before))
                with self.loop(tirx.Select(taken, _const(1), _const(0)), f"tail{size}"):
                    emit(_const(length) - size, size)
                tail_before = wanted if tail_before is None else tirx.Or(tail_before, wanted)

    def calls(self, length: int) -> dict[str, int]:
        """How many times each kernel runs in one pass over a sequence of ``length`` steps."""
        return {name: sum(_iterations(extents, length) for extents in calls)
                for name, calls in self._call_extents.items()}

    def scheduled(self, kernel_name: str) -> tirx.PrimFunc:
        """The scheduled PrimFunc this program embeds for a kernel."""
        return self._scheduled[kernel_name]

    def step_counts(self, length: int) -> tuple[int, int]:
        """(iterations of all time loops, most kernels run in one iteration) at ``length`` steps."""
        iterations = sum(_iterations(extents, length) for extents, _ in self._step_loops)
        return iterations, max((calls for _, calls in self._step_loops), default=0)

    def build(self) -> tirx.PrimFunc:
        stmts = self._stack[0]
        body = tirx.SeqStmt(stmts) if len(stmts) > 1 else stmts[0]
        scratch = list(self._scratch)
        if self._pool_size:
            pool = tirx.decl_buffer((self._pool_size,), F32, POOL_NAME)
            body = tvm_ffi.structural_mutate(body, [(tvm.ir.Var, lambda v, m: pool if v.same_as(self._pool) else v)])
            scratch.append(pool)
        if scratch:
            body = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], "root", body, alloc_buffers=scratch))
        if self.dependent_launch:
            body = with_grid_dependencies(body, early=self.dependent_launch == "early")
        func = tirx.PrimFunc([t.buffer for t in self.params], body)
        if self.dependent_launch:  # SplitHostDevice gives the flag to every kernel of the driver
            func = func.with_attr(LAUNCH_PARAMS, [DEPENDENT])
        # Distinct parameters never overlap (the passes allocate every output themselves), so say
        # so: without it LLVM must assume a kernel's stores may hit its weights and reloads them
        # at every step of the reduction (4x slower fused step on the CPU). Views of one
        # parameter still share its data pointer and alias as they should.
        return func.with_attr("global_symbol", self.name).with_attr("tirx.noalias", True)


