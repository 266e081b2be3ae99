"""Vectorisable exp, sigmoid and tanh for CPU kernels.

LLVM lowers TVM's ``exp`` (and the ``sigmoid``/``tanh`` TVM builds on it) to ``llvm.exp``, which
without a vector math library becomes one scalar ``expf`` call per lane: in the fused LSTM
step that made the gate math cost as much as the recurrent GEMM (2-core dev machine: 945 us for
the step against 468 us for the same GEMM alone). Here they are rewritten, in scheduled CPU
kernels only, as plain arithmetic that vectorises:

- ``exp``: Cephes' ``expf`` (Cody-Waite range reduction, a degree-5 polynomial; under 1 ulp from
  -80 to 88.72), with the power of two ``2^n`` built in the exponent bits as two factors
  ``2^(n - n//2) 2^(n//2)``, so that the clamped range [-104, 89] reaches float32's overflow
  (exp is +inf past 88.72) and its denormals (0 below -103.97);
- ``sigmoid(x) = 1 / (1 + exp(-x))``;
- ``tanh``: Eigen's rational approximation (``generic_fast_tanh_float``: odd degree 13 over
  even degree 6; under 6 ulp), the argument clamped to +-10.5, where it is just above 1.0, and
  the result to [-1, 1]: exactly +-1 past about 9.2, as float32's tanh is past 9.01.

They use no ``Select``: a conditional per activation made LLVM's code generation of a CPU step
kernel 3x slower than with the exact functions (an LSTM I=13 H=37 build: 1.6 s against 0.6 s;
notes v37), and a nest of them in the clamp ran for minutes. The clamps are ``min(c, x)`` and
``max(c, x)`` with the constant first: TVM emits them as ``c < x ? c : x``, which passes a NaN
``x`` through, as exp, sigmoid and tanh do (issue 40). The cell definitions and the tuned
workloads keep the exact functions.

GPUs keep CUDA's exp and sigmoid, but not its tanh (:func:`accurate_tanh`): TVM compiles CUDA
with ``--use_fast_math`` (NVRTC, unconditionally), under which ``tanhf`` is the hardware's
``tanh.approx.f32``, relative error up to 2^-11 (5e-4). A 1-unit tanh RNN's weight gradients were
2.7e-4 to 6.5e-4 from float64 on an H200, against the documented 1e-4 (notes v46). ``expf``
becomes ``ex2.approx`` there, off by a few ulp, which the tolerance allows.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

F32 = "float32"
_EXP_HIGH = 89.0  # past ln(FLT_MAX) = 88.72: the two factors' product overflows to +inf there
_EXP_LOW = -104.0  # below ln(2^-150): the product rounds to 0, as float32's exp does
_LOG2E = 1.44269504088896341
_LN2_HIGH, _LN2_LOW = 0.693359375, -2.12194440e-4  # Cody-Waite split of ln 2
_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1)
# Eigen clamps at 7.90531110763549805, where the rational function is 1.0 evaluated as written;
# compiled (LLVM's and NVCC's contractions into FMAs) it was 0.99999976 there, so tanh(inf) fell
# short of 1 and its derivative 1 - tanh^2 was not 0 (an Inf input gave Inf weight gradients where
# torch.nn's are NaN, 0 x Inf). From about 9.2 to 11 the function is just above 1.0, most at 10.5
# (6 units of 2^-23, more than the compiled code's rounding and CUDA's approximate division move
# it): clamped there and then to [-1, 1], tanh saturates at exactly +-1.
_TANH_CLAMP = 10.5
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11, 5.12229709037114e-08,
           1.48572235717979e-05, 6.37261928875436e-04, 4.89352455891786e-03)  # odd numerator, by x^2
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)


def _c(v):
    return tirx.const(v, F32)


def _let(value, body):
    """``body(v)`` with ``v`` bound to ``value`` once (the argument may be a large expression)."""
    var = tirx.Var("v", str(value.ty))
    return tirx.Let(var, value, body(var))


def _clamp(x, low, high):
    """``x`` within [low, high], a NaN ``x`` passed through (the constants first: see above)."""
    return tirx.max(_c(low), tirx.min(_c(high), x))


def _horner(coefs, x):
    p = _c(coefs[0])
    for coef in coefs[1:]:
        p = p * x + _c(coef)
    return p


def _times_power_of_two(m, n):
    """``m 2^n`` for an integer-valued float ``n`` in [-150, 129]: ``2^n`` as two normal floats,
    multiplied in one at a time, so that neither the factors' product nor ``m`` times one of them
    leaves float32's range unless ``m 2^n`` does."""
    def factor(e):
        return tirx.reinterpret(F32, tirx.shift_left(e + 127, 23))

    def split(k):
        half = tirx.shift_right(k, 1)  # floor(k / 2), in [-75, 64]
        return m * factor(k - half) * factor(half)
    return _let(n.astype("int32"), split)


def fast_exp(x):
    def body(v):
        def reduced(n):
            def poly(r):
                return _times_power_of_two(_horner(_POLY, r) * r * r + r + _c(1.0), n)
            return _let(v - n * _c(_LN2_HIGH) - n * _c(_LN2_LOW), poly)
        return _let(tirx.floor(v * _c(_LOG2E) + _c(0.5)), reduced)
    return _let(_clamp(x, _EXP_LOW, _EXP_HIGH), body)


def fast_sigmoid(x):
    return _c(1.0) / (_c(1.0) + fast_exp(_c(0.0) - x))


def fast_tanh(x):
    def body(v):
        return _let(v * v, lambda v2: v * _horner(_TANH_P, v2) / _horner(_TANH_Q, v2))
    return _clamp(_let(_clamp(x, -_TANH_CLAMP, _TANH_CLAMP), body), -1.0, 1.0)


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


def _rewritten(func: tvm.tirx.PrimFunc, rewrites: dict) -> tvm.tirx.PrimFunc:
    def rewrite(e, mutator):
        e = mutator.default_mutate(e)
        if isinstance(e, tvm.ir.Call) and isinstance(e.op, tvm.ir.Op) and e.op.name in rewrites \
                and str(e.ty) == F32:
            return rewrites[e.op.name](e.args[0])
        return e

    body = tvm_ffi.structural_mutate(func.body, [(tvm.ir.Call, rewrite)])
    return func.with_body(body)


def vectorisable(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with every float32 exp, sigmoid and tanh rewritten as above."""
    return _rewritten(func, _REWRITES)


def accurate_tanh(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """A GPU ``func`` with every float32 tanh as :func:`fast_tanh` (under 6 ulp) instead of the
    ``tanh.approx.f32`` that CUDA's fast math makes of ``tanhf`` (see the module docstring). Its
    clamp is a ``min``/``max`` against constants: run :func:`nan_propagating` after this, so that
    a NaN passes through it."""
    return _rewritten(func, {"tirx.tanh": fast_tanh})
