"""Derive a cell's backward from its forward math by reverse-mode symbolic differentiation.

The cell's pointwise math is a small expression DAG of scalar TVM expressions per hidden unit
(:mod:`tvmrnn.cells`). We differentiate that DAG here rather than with a tensor-level
autodiff because the per-unit math is where all the structure is: the GEMMs around it have
fixed, known gradients (they are transposed GEMMs), while the pointwise part is what differs
from cell to cell.

Besides the gradient expressions, the derivation decides what the training forward must keep
(the "reserved workspace", as cuDNN calls it): every forward value that the gradient
expressions read and that is not available otherwise. Nonlinearities are differentiated in
terms of their own output (sigmoid' = s(1-s), tanh' = 1-t^2, relu' = [y > 0]), so what is kept
are gate activations, exactly as in cuDNN, and never a pre-activation that would have to be
pushed through the nonlinearity again. Values equal to the step's own outputs (h_t, c_t) are
read back from the state sequence instead of being stored twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi
from tvm import tirx

from .cells import Cell

F32 = "float32"
_LEAVES = (tirx.FloatImm, tirx.IntImm)


class CellDefinitionError(ValueError):
    """A cell's math cannot be turned into kernels (and why, naming the expression)."""


def _const(value: float):
    return tirx.const(value, F32)


def _is_const(e, value=None) -> bool:
    return isinstance(e, _LEAVES) and (value is None or float(e.value) == value)


def _add(a, b):
    if a is None or _is_const(a, 0.0):
        return b
    if b is None or _is_const(b, 0.0):
        return a
    return a + b


def _mul(a, b):
    if _is_const(a, 0.0) or _is_const(b, 0.0):
        return _const(0.0)
    if _is_const(a, 1.0):
        return b
    if _is_const(b, 1.0):
        return a
    return a * b


def _children(e) -> list:
    if isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Max, tirx.Min)):
        return [e.a, e.b]
    if isinstance(e, tvm.ir.Call):
        return list(e.args)
    if isinstance(e, tirx.Select):
        return [e.true_value, e.false_value]
    if isinstance(e, (tvm.ir.Var,) + _LEAVES):
        return []
    raise CellDefinitionError(f"cannot differentiate {type(e).__name__} expression: {e}")


def _one_if(cond):
    return tirx.Select(cond, _const(1.0), _const(0.0))


def _local_derivatives(e) -> list:
    """d e / d child, for each child of ``e``, written in terms of e's own value where possible."""
    if isinstance(e, tirx.Add):
        return [_const(1.0), _const(1.0)]
    if isinstance(e, tirx.Sub):
        return [_const(1.0), _const(-1.0)]
    if isinstance(e, tirx.Mul):
        return [e.b, e.a]
    if isinstance(e, tirx.Div):
        return [_const(1.0) / e.b, _const(0.0) - e / e.b]
    if isinstance(e, (tirx.Max, tirx.Min)):
        wins = (lambda u, v: u > v) if isinstance(e, tirx.Max) else (lambda u, v: u < v)
        # Against a constant, test the output (relu' = [y > 0], as PyTorch's threshold_backward)
        # so that no pre-activation needs to be kept.
        if _is_const(e.b):
            return [_one_if(wins(e, e.b)), _const(0.0)]
        if _is_const(e.a):
            return [_const(0.0), _one_if(wins(e, e.a))]
        first = tirx.Or(wins(e.a, e.b), e.a == e.b)
        return [_one_if(first), _const(1.0) - _one_if(first)]
    if isinstance(e, tirx.Select):
        return [_one_if(e.condition), _const(1.0) - _one_if(e.condition)]
    if isinstance(e, tvm.ir.Call):
        name = e.op.name
        if name == "tirx.sigmoid":
            return [e * (_const(1.0) - e)]
        if name == "tirx.tanh":
            return [_const(1.0) - e * e]
        if name == "tirx.exp":
            return [e]
        if name == "tirx.log":
            return [_const(1.0) / e.args[0]]
        if name == "tirx.sqrt":
            return [_const(0.5) / e]
        raise CellDefinitionError(f"cannot differentiate call to {name} in {e}")
    return []


@dataclass
class Derivation:
    """A cell's forward and derived backward, as scalar expressions per hidden unit.

    Forward inputs: ``x_gates``, ``h_gates`` (projections with biases), ``h_prev``, ``c_prev``.
    Backward inputs: ``dh`` and ``dc`` (gradients of h_t and c_t), ``saved`` values,
    ``h_prev``/``c_prev`` and ``h_next``/``c_next`` (h_t, c_t, read from the state sequence).
    """

    cell: Cell
    x_gates: list
    h_gates: list
    h_prev: tirx.Var
    c_prev: tirx.Var | None
    h_out: object
    c_out: object | None
    dh: tirx.Var
    dc: tirx.Var | None
    h_next: tirx.Var
    c_next: tirx.Var | None
    saved: list = field(default_factory=list)  # [(Var in backward, forward expression)]
    grad_x: list = field(default_factory=list)  # d/d x_gates[k]
    grad_h: list = field(default_factory=list)  # d/d h_gates[k]
    grad_h_prev: object | None = None  # direct (pointwise) part only; None when zero
    grad_c_prev: object | None = None

    @property
    def gate_grads_shared(self) -> bool:
        """True when d/dx_k == d/dh_k for every gate, so one gradient buffer serves both GEMMs."""
        return all(tvm_ffi.structural_equal(a, b) for a, b in zip(self.grad_x, self.grad_h))

    def backward_uses(self, var) -> bool:
        exprs = self.grad_x + self.grad_h + [self.grad_h_prev, self.grad_c_prev]
        found = []

        def visit(v, visitor):
            if v.same_as(var):
                found.append(v)
                return
            visitor.default_visit(v)

        for e in exprs:
            if e is not None:
                tvm_ffi.structural_visit(e, [(tvm.ir.Var, visit), (tvm.ir.Expr, lambda v, s: s.default_visit(v))])
        return bool(found)


def _topological(outputs: list) -> list:
    """Nodes of the expression DAG, children before parents, deduplicated structurally."""
    order, seen = [], set()
    stack = [(e, False) for e in reversed(outputs)]
    while stack:
        e, expanded = stack.pop()
        key = tvm_ffi.StructuralKey(e)
        if key in seen:
            continue
        if expanded:
            seen.add(key)
            order.append(e)
            continue
        stack.append((e, True))
        stack.extend((c, False) for c in reversed(_children(e)))
    return order


def derive(cell: Cell) -> Derivation:
    """Trace ``cell.math`` on symbolic inputs and differentiate it."""
    gates = cell.gates
    x_gates = [tirx.Var(f"x_{g}", F32) for g in gates]
    h_gates = [tirx.Var(f"h_{g}", F32) for g in gates]
    h_prev = tirx.Var("h_prev", F32)
    c_prev = tirx.Var("c_prev", F32) if cell.has_cell_state else None
    h_out, c_out = cell.math(x_gates, h_gates, h_prev, c_prev)
    if (c_out is None) == cell.has_cell_state:
        raise CellDefinitionError(
            f"cell {cell.name!r}: math must return a cell state exactly when has_cell_state is set")
    outputs = [e for e in (h_out, c_out) if e is not None]
    for out in outputs:
        if not isinstance(out, tvm.ir.Expr) or str(out.ty) != F32:
            raise CellDefinitionError(f"cell {cell.name!r}: output {out} is not a float32 expression")

    d = Derivation(cell, x_gates, h_gates, h_prev, c_prev, h_out, c_out,
                   dh=tirx.Var("dh", F32), dc=tirx.Var("dc", F32) if c_out is not None else None,
                   h_next=tirx.Var("h_next", F32), c_next=tirx.Var("c_next", F32) if c_out is not None else None)

    order = _topological(outputs)
    adjoint = {tvm_ffi.StructuralKey(h_out): d.dh}
    if c_out is not None:
        key = tvm_ffi.StructuralKey(c_out)
        adjoint[key] = _add(adjoint.get(key), d.dc)
    for node in reversed(order):
        a = adjoint.get(tvm_ffi.StructuralKey(node))
        if a is None:
            continue
        for child, local in zip(_children(node), _local_derivatives(node)):
            if _is_const(child):
                continue
            key = tvm_ffi.StructuralKey(child)
            adjoint[key] = _add(adjoint.get(key), _mul(a, local))

    def grad(var):
        return adjoint.get(tvm_ffi.StructuralKey(var))

    available = {tvm_ffi.StructuralKey(h_out): d.h_next}
    if c_out is not None:
        available[tvm_ffi.StructuralKey(c_out)] = d.c_next
    keep = {tvm_ffi.StructuralKey(v) for v in (h_prev, c_prev) if v is not None}
    forward = {tvm_ffi.StructuralKey(n): n for n in order
               if not _is_const(n) and tvm_ffi.StructuralKey(n) not in keep}
    saved_by_key = {}

    def substitute(e, mutator):
        key = tvm_ffi.StructuralKey(e)
        if key in available:
            return available[key]
        cheap = isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div)) and (
            _is_const(e.a) or _is_const(e.b))
        if key in forward and not cheap:  # recompute (1 - z) rather than store it
            if key not in saved_by_key:
                name = e.name if isinstance(e, tvm.ir.Var) else (
                    e.op.name.split(".")[-1] if isinstance(e, tvm.ir.Call) else type(e).__name__.lower())
                var = tirx.Var(f"saved{len(saved_by_key)}_{name}", F32)
                saved_by_key[key] = var
                d.saved.append((var, forward[key]))
            return saved_by_key[key]
        return mutator.default_mutate(e)

    def to_backward(e):
        if e is None or _is_const(e, 0.0):
            return None
        return tvm_ffi.structural_mutate(e, [(tvm.ir.Expr, substitute)])

    def gate_grad(var):
        e = to_backward(grad(var))
        return _const(0.0) if e is None else e

    d.grad_x = [gate_grad(v) for v in x_gates]
    d.grad_h = [gate_grad(v) for v in h_gates]
    d.grad_h_prev = to_backward(grad(h_prev))
    d.grad_c_prev = to_backward(grad(c_prev)) if c_prev is not None else None
    return d
