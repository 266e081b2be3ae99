"""The derived pointwise backward, checked by central finite differences in float64."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from tvm import tirx

from tvmrnn import CELLS
from tvmrnn.cells.autodiff import derive


def evaluate(e, env: dict) -> float:
    """A float64 interpreter for the scalar expressions cells are made of."""
    if isinstance(e, tvm.ir.Var):
        return env[e.name]
    if isinstance(e, (tirx.FloatImm, tirx.IntImm)):
        return float(e.value)
    binary = {tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b, tirx.Mul: lambda a, b: a * b,
              tirx.Div: lambda a, b: a / b, tirx.Max: max, tirx.Min: min,
              tirx.GT: lambda a, b: a > b, tirx.LT: lambda a, b: a < b, tirx.EQ: lambda a, b: a == b}
    for kind, f in binary.items():
        if isinstance(e, kind):
            return f(evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, tirx.Select):
        return evaluate(e.true_value if evaluate(e.condition, env) else e.false_value, env)
    if isinstance(e, tvm.ir.Call):
        fn = {"tirx.sigmoid": lambda v: 1 / (1 + math.exp(-v)), "tirx.tanh": math.tanh, "tirx.exp": math.exp}
        return fn[e.op.name](evaluate(e.args[0], env))
    raise TypeError(type(e))


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_derived_backward_matches_finite_differences(cell):
    d = derive(CELLS[cell])
    rng = np.random.default_rng(7)
    inputs = [*d.x_gates, *d.h_gates, d.h_prev] + ([d.c_prev] if d.c_prev is not None else [])
    outputs = [d.h_out] + ([d.c_out] if d.c_out is not None else [])
    analytic = [*d.grad_x, *d.grad_h, d.grad_h_prev] + ([d.grad_c_prev] if d.c_prev is not None else [])
    for _ in range(20):
        point = {v.name: float(rng.standard_normal()) for v in inputs}
        seeds = {"dh": float(rng.standard_normal()), "dc": float(rng.standard_normal())}

        def loss(p):
            values = [evaluate(o, p) for o in outputs]
            return seeds["dh"] * values[0] + (seeds["dc"] * values[1] if len(values) > 1 else 0.0)

        env = dict(point, **seeds, h_next=evaluate(d.h_out, point))
        if d.c_out is not None:
            env["c_next"] = evaluate(d.c_out, point)
        env.update({var.name: evaluate(e, point) for var, e in d.saved})
        for var, grad in zip(inputs, analytic):
            eps = 1e-6
            up, down = dict(point), dict(point)
            up[var.name] += eps
            down[var.name] -= eps
            numeric = (loss(up) - loss(down)) / (2 * eps)
            got = 0.0 if grad is None else evaluate(grad, env)
            assert abs(got - numeric) < 1e-6 * max(1.0, abs(numeric)), (cell, var.name, got, numeric)


def test_lstm_keeps_gate_activations_and_rnns_keep_nothing():
    # i, f, g, o; tanh(c_t) is recomputed from c_t, which the state sequence holds anyway
    assert [e.op.name.split(".")[-1] for _, e in derive(CELLS["lstm"]).saved] == ["sigmoid", "tanh", "sigmoid", "sigmoid"]
    assert derive(CELLS["lstm"]).c_out is not None
    assert len(derive(CELLS["rnn_tanh"]).saved) == 0  # tanh' from h_t itself
    assert len(derive(CELLS["rnn_relu"]).saved) == 0  # relu' = [h_t > 0]
    assert not derive(CELLS["gru"]).gate_grads_shared  # r scales W_hn h: two gradients for gate n
