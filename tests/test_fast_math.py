"""The vectorisable exp/sigmoid/tanh of CPU kernels against float64 NumPy, over their whole range."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from tvmrnn.schedules.fast_math import accurate_tanh, nan_propagating, vectorisable
from tvmrnn.device import host_target


@pytest.fixture(scope="module")
def compiled():
    n = 4096
    x = te.placeholder((n,), "float32", "x")
    outs = [te.compute((n,), lambda i: te.exp(x[i]), name="exp"),
            te.compute((n,), lambda i: te.sigmoid(x[i]), name="sigmoid"),
            te.compute((n,), lambda i: te.tanh(x[i]), name="tanh")]
    func = vectorisable(te.create_prim_func([x] + outs))
    text = func.script()
    assert "T.exp" not in text and "T.tanh" not in text and "T.sigmoid" not in text  # all rewritten
    return n, tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=host_target()).jit()


def test_matches_float64_reference(compiled):
    n, lib = compiled
    rng = np.random.default_rng(0)
    special = [0.0, 1e-6, -1e-6, 1e-3, 0.124, 0.125, -0.126, 0.5, -3.0, 7.9, 7.91, -7.91, 9.0, 80.0, -80.0, -87.0,
               88.4, 88.7, -90.0, -103.0]  # exp near overflow and in the denormals
    x = np.concatenate([rng.uniform(-30, 30, 2048), rng.uniform(-0.3, 0.3, 2048 - len(special)), special])
    x = x.astype(np.float32)
    args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(np.zeros(n, np.float32)) for _ in range(3)]
    lib["main"](*args)
    xd = x.astype(np.float64)
    for got, want in zip(args[1:], (np.exp(xd), 1 / (1 + np.exp(-xd)), np.tanh(xd))):
        got = got.numpy().astype(np.float64)
        tiny = np.abs(want) < 1e-30
        # a few ulp of float32: Cephes' expf is ~1 ulp, Eigen's tanh under 6
        rel = np.abs(got - want)[~tiny] / np.abs(want)[~tiny]
        assert rel.max() < 5e-7
        assert np.all(np.abs(got[tiny]) < 1e-30)


def test_nan_and_inf_as_numpy_gives_them(compiled):
    """NaN stays NaN through exp, sigmoid and tanh (x86's min/max alone would drop it), exp(+inf) is
    inf, and the infinities saturate sigmoid and tanh as in NumPy (and torch.nn)."""
    n, lib = compiled
    special = np.array([np.nan, np.inf, -np.inf, 89.0, 1e30, -1e30, -np.nan], np.float32)
    x = np.resize(special, n).astype(np.float32)
    args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(np.zeros(n, np.float32)) for _ in range(3)]
    lib["main"](*args)
    xd = x.astype(np.float64)
    with np.errstate(over="ignore"):  # what float32 holds: exp(89) is inf there
        wants = [w.astype(np.float32).astype(np.float64) for w in (np.exp(xd), 1 / (1 + np.exp(-xd)), np.tanh(xd))]
    for name, got, want in zip(("exp", "sigmoid", "tanh"), args[1:], wants):
        got = got.numpy().astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(want)), name
        assert np.array_equal(np.isposinf(got), np.isposinf(want)), name
        finite = np.isfinite(want)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-30, err_msg=name)
    # saturated exactly (a derivative 1 - tanh^2 of 0 then, as torch.nn's: 0 x Inf is NaN in the
    # gradients of an Inf input, not Inf), and never past 1
    x = np.resize(np.array([np.inf, -np.inf, 1e30, 20.0, 10.0, -12.0], np.float32), n)
    args = [tvm.runtime.tensor(x)] + [tvm.runtime.tensor(np.zeros(n, np.float32)) for _ in range(3)]
    lib["main"](*args)
    assert np.array_equal(args[3].numpy(), np.sign(x)), args[3].numpy()[:6]
    assert np.array_equal(args[2].numpy()[:3], [1.0, 0.0, 1.0])
    x = np.linspace(-12, 12, n, dtype=np.float32)
    args[0] = tvm.runtime.tensor(x)
    lib["main"](*args)
    assert np.abs(args[3].numpy()).max() == 1.0


def test_gpu_tanh_is_accurate_and_passes_nan():
    """GPUs' tanh (:func:`accurate_tanh`, then :func:`nan_propagating`, as ``build`` schedules a
    GPU kernel; CUDA's fast-math ``tanhf`` is off by up to 5e-4): the same TIR, compiled for this
    CPU, within a few ulp of float64 and NaN / Inf as NumPy gives them."""
    n = 1024
    x = te.placeholder((n,), "float32", "x")
    func = te.create_prim_func([x, te.compute((n,), lambda i: te.tanh(x[i]), name="tanh")])
    func = nan_propagating(accurate_tanh(func))
    assert "T.tanh" not in func.script() and "T.max" not in func.script() and "T.min" not in func.script()
    lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=host_target()).jit()
    rng = np.random.default_rng(1)
    special = [np.nan, np.inf, -np.inf, 0.0, 1e-6, -1e-3, 7.9, 7.91, -9.0, 1e30, 20.0, -1e30]
    xs = np.concatenate([rng.uniform(-10, 10, n // 2), rng.uniform(-0.3, 0.3, n // 2 - len(special)),
                         special]).astype(np.float32)
    out = tvm.runtime.tensor(np.zeros(n, np.float32))
    lib["main"](tvm.runtime.tensor(xs), out)
    got, want = out.numpy().astype(np.float64), np.tanh(xs.astype(np.float64))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=5e-7, atol=1e-30)
    assert np.array_equal(got[[-11, -10, -3, -2, -1]], [1.0, -1.0, 1.0, 1.0, -1.0]) and np.abs(got[finite]).max() == 1.0
