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
read back from the state sequence instead of being stored twice. Per-unit parameters (and
anything computed from them alone, like a gate ``sigmoid(a)``) are inputs of the backward too,
read from the weights, so they are recomputed rather than kept once per step.

:func:`derive` is also where a cell's math is checked: it traces the math on symbolic inputs and
raises :class:`CellDefinitionError`, naming the offending expression, for anything the kernels
cannot be generated from. :func:`tvmrnn.define_cell` calls it when a cell is defined.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import tvm
import tvm_ffi
from tvm import tirx

if TYPE_CHECKING:  # cells.py imports this module to check its definitions
    from .definition import Cell

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
    if isinstance(e, tirx.Cast) and str(e.value.ty) == "bool":
        raise CellDefinitionError(f"cannot differentiate {e}: a comparison used as a value; "
                                  f"write tirx.Select(condition, a, b) instead")
    raise CellDefinitionError(f"cannot differentiate {type(e).__name__} expression {e}")


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
        raise CellDefinitionError(f"cannot differentiate {e}: {name} has no derivative here (differentiable: "
                                  f"sigmoid, tanh, exp, log, sqrt, +, -, *, /, max, min, Select)")
    return []


def _free_vars(e) -> list:
    """The variables an expression reads, in order of first appearance."""
    found = []

    def visit(v, visitor):
        if not any(v.same_as(f) for f in found):
            found.append(v)

    tvm_ffi.structural_visit(e, [(tvm.ir.Var, visit), (tvm.ir.Expr, lambda v, s: s.default_visit(v))])
    return found


@dataclass
class Derivation:
    """A cell's forward and derived backward, as scalar expressions per hidden unit.

    Forward inputs: ``x_gates``, ``h_gates`` (projections with biases), ``h_prev``, ``c_prev``,
    ``params`` (the unit's parameters, in the cell's ``unit_params`` order).
    Backward inputs: ``dh`` and ``dc`` (gradients of h_t and c_t), ``saved`` values, ``params``,
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
    params: list = field(default_factory=list)  # one Var per unit parameter
    saved: list = field(default_factory=list)  # [(Var in backward, forward expression)]
    grad_x: list = field(default_factory=list)  # d/d x_gates[k]
    grad_h: list = field(default_factory=list)  # d/d h_gates[k]
    grad_h_prev: object | None = None  # direct (pointwise) part only; None when zero
    grad_c_prev: object | None = None
    grad_params: list = field(default_factory=list)  # d/d params[i], per (n, j): summed over t, n later

    @property
    def gate_grads_shared(self) -> bool:
        """True when d/dx_k == d/dh_k for every gate, so one gradient buffer serves both GEMMs."""
        return all(tvm_ffi.structural_equal(a, b) for a, b in zip(self.grad_x, self.grad_h))

    def backward_uses(self, var) -> bool:
        exprs = self.grad_x + self.grad_h + [self.grad_h_prev, self.grad_c_prev] + self.grad_params
        return any(any(v.same_as(var) for v in _free_vars(e)) for e in exprs if e is not None)


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


_LOGICAL = (tirx.LT, tirx.LE, tirx.GT, tirx.GE, tirx.EQ, tirx.NE, tirx.And, tirx.Or)


def _condition_values(order: list) -> list:
    """The float32 values the conditions of the Selects in ``order`` read (no derivative flows
    through a condition, so :func:`_children` leaves it out; the backward still evaluates it: a
    value only a condition reads must be kept too)."""
    found = []

    def visit(e):
        if isinstance(e, _LOGICAL):
            visit(e.a)
            visit(e.b)
        elif isinstance(e, tirx.Not):
            visit(e.a)
        elif isinstance(e, tvm.ir.Expr) and str(e.ty) == F32:
            found.extend(_topological([e]))

    for n in order:
        if isinstance(n, tirx.Select):
            visit(n.condition)
    return found


class _Gates:
    """What ``math`` receives as ``x`` and ``h``: gate ``k`` by index or by name, nothing else."""

    def __init__(self, what: str, gates: tuple, values: list):
        self.what, self.gates, self.values = what, gates, values

    def __getitem__(self, key):
        if isinstance(key, str) and key in self.gates:
            return self.values[self.gates.index(key)]
        if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(self.gates):
            return self.values[key]
        raise CellDefinitionError(
            f"{self.what}[{key!r}] does not exist: the cell has {len(self.gates)} gates {self.gates}, "
            f"indexed 0..{len(self.gates) - 1} or by name")

    def __len__(self):
        return len(self.values)

    def __iter__(self):
        return iter(self.values)


class _UnitParams(Mapping):
    """What ``math`` receives as ``p``: {unit parameter name: that unit's value}."""

    def __init__(self, names: tuple, values: list):
        self.names, self.values = names, dict(zip(names, values))

    def __getitem__(self, key):
        if key not in self.values:
            raise CellDefinitionError(f"p[{key!r}] is not a unit parameter of this cell; it declares "
                                      f"unit_params={self.names}")
        return self.values[key]

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


def _trace(cell: Cell, x_gates, h_gates, h_prev, c_prev, params) -> tuple:
    """Run ``cell.math`` on the symbolic inputs and check what comes back."""
    try:
        result = cell.math(_Gates("x", cell.gates, x_gates), _Gates("h", cell.gates, h_gates), h_prev, c_prev,
                           _UnitParams(cell.unit_params, params))
    except CellDefinitionError:
        raise
    except Exception as err:  # TVM's own errors (mixed dtypes, ...) or Python's (math.exp on a Var)
        raise CellDefinitionError(f"math raised {type(err).__name__}: {err}") from err
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise CellDefinitionError(f"math must return a pair (h_t, c_t), with c_t None when the cell has no "
                                  f"cell state; it returned {result!r}")
    h_out, c_out = result
    if cell.has_cell_state and c_out is None:
        raise CellDefinitionError("math returned no cell state (c_t is None) but the cell is defined with "
                                  "cell_state=True")
    if not cell.has_cell_state and c_out is not None:
        raise CellDefinitionError(f"math returned a cell state c_t = {c_out} but the cell is defined with "
                                  f"cell_state=False (return (h_t, None))")
    for what, out in (("h_t", h_out), ("c_t", c_out)):
        if out is not None and (not isinstance(out, tvm.ir.Expr) or str(out.ty) != F32):
            kind = str(out.ty) if isinstance(out, tvm.ir.Expr) else type(out).__name__
            raise CellDefinitionError(f"{what} = {out!r} is not a float32 expression (it is {kind}); build it "
                                      f"from the inputs x, h, h_prev, c_prev, p")
    inputs = [*x_gates, *h_gates, h_prev, *params] + ([c_prev] if c_prev is not None else [])
    outputs = [e for e in (h_out, c_out) if e is not None]
    used = [v for e in outputs for v in _free_vars(e)]
    for v in used:
        if not any(v.same_as(i) for i in inputs):
            raise CellDefinitionError(f"the math reads a variable {v.name!r} that is not one of its inputs "
                                      f"(x[k], h[k], h_prev, c_prev, p[name])")
    for k, gate in enumerate(cell.gates):
        if not any(v.same_as(x_gates[k]) or v.same_as(h_gates[k]) for v in used):
            raise CellDefinitionError(f"gate {k} ({gate!r}) is used neither as x[{k}] nor as h[{k}]: its weights "
                                      f"would never be trained; declare {len(cell.gates) - 1} gates instead")
    if not any(v.same_as(g) for v in used for g in h_gates):
        raise CellDefinitionError("the math reads no h[k]: the cell would have no recurrent GEMM and its W_hh "
                                  "would never be trained; read at least one gate through h[k]")
    for name, v in zip(cell.unit_params, params):
        if not any(u.same_as(v) for u in used):
            raise CellDefinitionError(f"unit parameter {name!r} is declared but the math never reads p[{name!r}]")
    return h_out, c_out


def derive(cell: Cell) -> Derivation:
    """Trace ``cell.math`` on symbolic inputs and differentiate it.

    Raises
    ------
    CellDefinitionError
        For math that kernels cannot be generated from, naming the cell and the expression.
    """
    try:
        return _derive(cell)
    except CellDefinitionError as err:
        raise CellDefinitionError(f"cell {cell.name!r}: {err}") from err.__cause__


def _derive(cell: Cell) -> Derivation:
    gates = cell.gates
    x_gates = [tirx.Var(f"x_{g}", F32) for g in gates]
    h_gates = [tirx.Var(f"h_{g}", F32) for g in gates]
    h_prev = tirx.Var("h_prev", F32)
    c_prev = tirx.Var("c_prev", F32) if cell.has_cell_state else None
    params = [tirx.Var(f"p_{name}", F32) for name in cell.unit_params]
    h_out, c_out = _trace(cell, x_gates, h_gates, h_prev, c_prev, params)
    outputs = [e for e in (h_out, c_out) if e is not None]

    d = Derivation(cell, x_gates, h_gates, h_prev, c_prev, h_out, c_out,
                   dh=tirx.Var("dh", F32), dc=tirx.Var("dc", F32) if c_out is not None else None,
                   h_next=tirx.Var("h_next", F32), c_next=tirx.Var("c_next", F32) if c_out is not None else None,
                   params=params)

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
    # Values of the unit's parameters alone are the same at every step: recomputed, never kept.
    from_params = {tvm_ffi.StructuralKey(n) for n in order
                   if not _is_const(n) and all(any(v.same_as(p) for p in params) for v in _free_vars(n))}
    forward = {tvm_ffi.StructuralKey(n): n for n in order + _condition_values(order)
               if not _is_const(n) and tvm_ffi.StructuralKey(n) not in keep | from_params}
    saved_by_key = {}

    def of_states(e):
        """A nonlinearity of values the backward reads anyway (h_t, c_t, h_{t-1}, c_{t-1}, per-unit
        parameters), like the LSTM's tanh(c_t): recomputed, which costs one function per unit
        in the backward and saves a (T, N, H) array of the workspace (a DS2 LSTM's peak training
        memory went under cuDNN's by this)."""
        if not isinstance(e, tvm.ir.Call):
            return False
        return all(_is_const(a) or tvm_ffi.StructuralKey(a) in available
                   or tvm_ffi.StructuralKey(a) in keep or tvm_ffi.StructuralKey(a) in from_params for a in e.args)

    def substitute(e, mutator):
        key = tvm_ffi.StructuralKey(e)
        if key in available:
            return available[key]
        if key in from_params:
            return e
        cheap = isinstance(e, (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div)) and (
            _is_const(e.a) or _is_const(e.b))
        if key in forward and not cheap and not of_states(e):  # recompute (1 - z) rather than store it
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
    d.grad_params = [gate_grad(v) for v in params]
    return d


def fingerprint(cell: Cell) -> str:
    """The cell's name, gates and state, and its traced math: two cells that share a name but not
    their math are different builds (the build cache's key, a pass-level tuning verdict's)."""
    import json
    d = derive(cell)
    return json.dumps([cell.signature, str(d.h_out), str(d.c_out), list(cell.unit_param_init)], sort_keys=True)
