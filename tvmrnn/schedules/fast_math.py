"""Vectorisable exp, sigmoid and tanh for CPU kernels.

LLVM lowers TVM's ``exp`` (and the ``sigmoid``/``tanh`` TVM builds on it) to ``llvm.exp``, which
without a vector math library becomes one scalar ``expf`` call per lane: in the fused LSTM
step that made the gate math cost as much as the recurrent GEMM (2-core dev machine: 945 us for
the step against 468 us for the same GEMM alone). Here they are rewritten, in scheduled CPU
kernels only, as plain arithmetic that vectorises: Cephes' ``expf`` (Cody-Waite range reduction,
a degree-5 polynomial, the power of two built in the exponent bits; about 1 ulp on the clamped
range), ``sigmoid(x) = 1 / (1 + exp(-x))`` and ``tanh(x) = sign(x) (1 - e) / (1 + e)`` with
``e = exp(-2|x|)``, the formula TVM's own LLVM lowering of tanh uses, except below
``|x| < 1/8``, where ``1 - e`` cancels (1e-2 relative error at 1e-6) and its Taylor series to
``x^7`` is exact to float32 instead. The cell definitions and
the tuned workloads keep the exact functions; GPUs keep CUDA's.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

F32 = "float32"
_EXP_LIMIT = 88.3762626647949  # the polynomial's range (Cephes' expf); exp(x) saturates there
_EXP_OVERFLOW = 88.72283935546875  # ln of float32's largest value: exp overflows to inf beyond
_LOG2E = 1.44269504088896341
_LN2_HIGH, _LN2_LOW = 0.693359375, -2.12194440e-4  # Cody-Waite split of ln 2
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)


def _c(v):
    return tirx.const(v, F32)


def _let(value, body):
    """``body(v)`` with ``v`` bound to ``value`` once (the argument may be a large expression)."""
    var = tirx.Var("v", str(value.ty))
    return tirx.Let(var, value, body(var))


def _is_nan(v):
    """``isnan(v)`` for float32 as integer arithmetic on its bits (exponent all ones, mantissa not
    zero): TVM's vectorizer scalarises a loop that calls ``isnan``, and the simplifier folds ``v != v``."""
    bits = tirx.reinterpret("int32", v) & tirx.const(0x7FFFFFFF, "int32")
    return bits > tirx.const(0x7F800000, "int32")


def fast_exp(x):
    def body(v):
        # NaN and +Inf as exp gives them (issue 40): the clamp below keeps the polynomial in range,
        # and x86's min/max return the other operand for a NaN, so without these a NaN input
        # became a number; past ln(FLT_MAX) exp is +Inf.
        return tirx.Select(_is_nan(v), v, tirx.Select(v > _c(_EXP_OVERFLOW), _c(float("inf")), clamped(v)))

    def clamped(v):
        v = tirx.max(tirx.min(v, _c(_EXP_LIMIT)), _c(-_EXP_LIMIT))

        def reduced(n):
            def poly(r):
                p = _c(_POLY[0])
                for coef in _POLY[1:]:
                    p = p * r + _c(coef)
                scale = tirx.reinterpret(F32, tirx.shift_left(n.astype("int32") + 127, 23))
                return (p * r * r + r + _c(1.0)) * scale
            return _let(v - n * _c(_LN2_HIGH) - n * _c(_LN2_LOW), poly)
        return _let(tirx.floor(v * _c(_LOG2E) + _c(0.5)), reduced)
    return _let(x, body)


def fast_sigmoid(x):
    return _c(1.0) / (_c(1.0) + fast_exp(_c(0.0) - x))


def fast_tanh(x):
    def body(v):
        def ratio(e):
            magnitude = (_c(1.0) - e) / (_c(1.0) + e)
            return tirx.Select(v < _c(0.0), _c(0.0) - magnitude, magnitude)

        def series(v2):  # x - x^3/3 + 2x^5/15 - 17x^7/315
            return v * (_c(1.0) + v2 * (_c(-1.0 / 3) + v2 * (_c(2.0 / 15) + v2 * _c(-17.0 / 315))))
        large = _let(fast_exp(_c(-2.0) * tirx.abs(v)), ratio)
        return tirx.Select(tirx.abs(v) < _c(0.125), _let(v * v, series), large)
    return _let(x, body)


_REWRITES = {"tirx.exp": fast_exp, "tirx.sigmoid": fast_sigmoid, "tirx.tanh": fast_tanh}


def _indicator(e):
    """``(condition, value where it holds)`` if ``e`` is ``Select(c, 1, 0)`` or ``1 - Select(c, 1, 0)``
    (autodiff's derivative of ``max`` against a constant and of a ``Select``), else None."""
    def ones_if(s):
        return isinstance(s, tirx.Select) and _is(s.true_value, 1.0) and _is(s.false_value, 0.0)
    if ones_if(e):
        return e.condition, True
    if isinstance(e, tirx.Sub) and _is(e.a, 1.0) and ones_if(e.b):
        return e.b.condition, False
    return None


_COMPLEMENT = {tirx.GT: tirx.LE, tirx.LT: tirx.GE, tirx.GE: tirx.LT, tirx.LE: tirx.GT}


def _is(e, value) -> bool:
    return isinstance(e, tirx.FloatImm) and e.value == value


def nan_propagating(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with NaN and Inf going where they go in ``torch.nn`` (issue 40):

    - every floating ``max(v, c)`` and ``min(v, c)`` against a constant (ReLU, a clamp in a user's
      cell) returns a NaN ``v`` as NaN, as ``torch.relu`` and ``torch.clamp`` do. LLVM's
      ``maxnum``/``minnum`` (x86 ``maxps`` after it) and CUDA's ``fmaxf``/``fminf`` return the other
      operand when one is NaN, so ``max(NaN, 0)`` was 0;
    - a gradient times a 0/1 indicator (``g * [y > 0]``, ReLU's derivative) selects instead
      (``y <= 0 ? 0 : g``), as PyTorch's ``threshold_backward`` and ``where``'s backward do, so
      a NaN or Inf gradient does not pass through the branch that was not taken (NaN * 0 is NaN).
      An indicator ``[y > c]`` against a constant passes ``g`` where ``y`` is NaN, as ReLU's
      backward does in PyTorch (so a user's ``Select(v > c, ...)`` on a NaN ``v`` passes it too,
      where ``torch.where``'s backward would not).

    The workloads (and so the tuning records) keep the cell's plain math: this runs on scheduled
    kernels, for every target.
    """
    def minmax(e, mutator):
        e = mutator.default_mutate(e)
        if str(e.ty).startswith(("float", "bfloat")):
            for v, c in ((e.a, e.b), (e.b, e.a)):
                if isinstance(c, (tirx.FloatImm, tirx.IntImm)) and not isinstance(v, (tirx.FloatImm, tirx.IntImm)):
                    # max(v, c) = v < c ? c : v, min(v, c) = v > c ? c : v: false, so v, for a NaN
                    # (no isnan: TVM's vectorizer scalarises loops that call it)
                    wins = tirx.LT if isinstance(e, tirx.Max) else tirx.GT
                    return _let(v, lambda u: tirx.Select(wins(u, c), tirx.Cast(str(e.ty), c), u))
        return e

    def product(e, mutator):
        e = mutator.default_mutate(e)
        if str(e.ty).startswith(("float", "bfloat")):
            for g, i in ((e.a, e.b), (e.b, e.a)):
                found = _indicator(i)
                if found is not None:
                    cond, taken = found
                    zero = tirx.const(0.0, str(e.ty))
                    flip = _COMPLEMENT.get(type(cond))
                    if taken and flip and (isinstance(cond.a, tirx.FloatImm) or isinstance(cond.b, tirx.FloatImm)):
                        # [y > c] (ReLU's derivative; the simplifier may have written c < y) as
                        # torch's threshold_backward: y <= c ? 0 : g, which passes g where y is NaN
                        return tirx.Select(flip(cond.a, cond.b), zero, g)
                    return tirx.Select(cond, g, zero) if taken else tirx.Select(cond, zero, g)
        return e

    body = tvm_ffi.structural_mutate(func.body, [(tirx.Max, minmax), (tirx.Min, minmax), (tirx.Mul, product)])
    return func.with_body(body)


def vectorisable(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with every float32 exp, sigmoid and tanh rewritten as above."""
    def rewrite(e, mutator):
        e = mutator.default_mutate(e)
        if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in _REWRITES \
                and str(e.ty) == F32:
            return _REWRITES[e.op.name](e.args[0])
        return e

    body = tvm_ffi.structural_mutate(func.body, [(tvm.ir.Call, rewrite)])
    return func.with_body(body)
