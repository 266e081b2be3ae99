"""Bad input gets a clear ValueError/TypeError naming the argument; never a crash or a wrong answer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tvmrnn
from conftest import H, I, N, built, torch_module


@pytest.fixture(scope="module")
def lstm():
    rnn = built("lstm", 1, False)
    torch.manual_seed(0)
    return rnn, rnn.pack_weights(tvmrnn.params_from_torch(torch_module("lstm", I, H, 1, False, False)))


@pytest.fixture(scope="module")
def gru():
    rnn = built("gru", 1, False)
    torch.manual_seed(0)
    return rnn, rnn.pack_weights(tvmrnn.params_from_torch(torch_module("gru", I, H, 1, False, False)))


def x_of(T=4, n=N, features=I, dtype=np.float32):
    return np.random.default_rng(0).standard_normal((T, n, features)).astype(dtype)


def test_unknown_cell():
    with pytest.raises(ValueError, match="cell: unknown cell 'lstmm'"):
        tvmrnn.build("lstmm", input_size=4, hidden_size=4)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(hidden_size=0), ValueError, "hidden_size: expected >= 1"),
    (dict(num_layers=1.5), TypeError, "num_layers: expected int"),
    (dict(bidirectional="yes"), TypeError, "bidirectional: expected bool"),
    (dict(target="nonsense-target"), ValueError, "target"),
    (dict(target="cuda:x"), ValueError, "target: expected 'cuda' or 'cuda:N'"),
    (dict(target={"kind": "llvm", "mcpu": "sapphirerapid"}), ValueError, "LLVM knows no CPU named mcpu='sapphirerapid'"),
    (dict(hidden_size=100000), ValueError, r"input_size, hidden_size: a weight matrix of 30000\d+ elements"),
    (dict(batch_size=3 * 10**9), ValueError, "batch_size: 3000000000 rows of 3 x 4 gates make a step"),
    (dict(dtype="float64"), ValueError, "dtype: expected one of"),
    (dict(tuning_logs="/nonexistent/tvmrnn-logs"), ValueError, "tuning_logs: '/nonexistent/tvmrnn-logs' is not a folder"),
    (dict(tuning_logs=3), TypeError, "tuning_logs: expected None, False or a folder"),
])
def test_bad_build_options(kwargs, error, match):
    args = dict(input_size=4, hidden_size=4, batch_size=2) | kwargs
    with pytest.raises(error, match=match):
        tvmrnn.build("gru", **args)


def test_llvm_opt_level_from_the_environment(monkeypatch):
    """TVMRNN_LLVM_OPT_LEVEL (the suite's quick builds, tests/conftest.py) goes into every LLVM
    target that names no level itself, the GPU's host code's too, and a bad value is refused by name."""
    from tvmrnn.device import host_target, resolve
    monkeypatch.setenv("TVMRNN_LLVM_OPT_LEVEL", "1")
    assert int(host_target().attrs["opt-level"]) == 1
    assert int(resolve({"kind": "llvm", "mcpu": "haswell"}).attrs["opt-level"]) == 1
    assert int(resolve("nvidia/nvidia-h100").host.attrs["opt-level"]) == 1
    assert int(resolve({"kind": "llvm", "opt-level": 2}).attrs["opt-level"]) == 2
    monkeypatch.delenv("TVMRNN_LLVM_OPT_LEVEL")
    assert "opt-level" not in host_target().attrs
    monkeypatch.setenv("TVMRNN_LLVM_OPT_LEVEL", "fast")
    with pytest.raises(ValueError, match="TVMRNN_LLVM_OPT_LEVEL: expected 0, 1, 2 or 3, got 'fast'"):
        tvmrnn.build("gru", 3, 4, batch_size=2)


def test_a_build_below_llvms_top_level_runs_linked_not_jitted(monkeypatch):
    """TVM's JIT compiles at LLVM's top level whatever the target says, so a build at a lower
    level (the suite's) is linked as a library when it first runs, and computes what the same build
    through the JIT does (to rounding: LLVM's levels may contract or reorder differently)."""
    from tvmrnn.device import llvm_opt_level
    monkeypatch.setenv("TVMRNN_LLVM_OPT_LEVEL", "0")
    low = tvmrnn.build("gru", 5, 7, batch_size=3)
    assert llvm_opt_level(low.target) == 0 and low._module is None
    monkeypatch.setenv("TVMRNN_LLVM_OPT_LEVEL", "3")
    top = tvmrnn.build("gru", 5, 7, batch_size=3)
    assert llvm_opt_level(top.target) == 3 and top._module is not None  # TVM's JIT, at its first call
    x = np.random.default_rng(4).standard_normal((6, 3, 5), dtype=np.float32)
    params = tvmrnn.params_from_torch(torch_module("gru", 5, 7, 1, False, False))
    ys = [rnn.forward(rnn.pack_weights(params), x)[0] for rnn in (low, top)]
    assert low.module.kind == "library"
    np.testing.assert_allclose(ys[0], ys[1], rtol=1e-5, atol=1e-6)
    # where linking fails (no C++ compiler, a noexec temp folder), TVM's JIT runs it, with a warning
    from tvmrnn.runtime import rnn as rnn_module

    class Unlinkable:
        def export_library(self, path):
            raise OSError("no compiler here")

        def jit(self):
            return "jitted"
    with pytest.warns(RuntimeWarning, match="linking the build failed .OSError: no compiler here.; running it "
                                            "through TVM's JIT"):
        assert rnn_module._linked(Unlinkable()) == "jitted"


def test_dtypes_by_any_name():
    from tvmrnn.runtime.build import dtype_name
    assert {dtype_name(d) for d in ("float32", np.float32, np.dtype("float32"), torch.float32, "float")} == {"float32"}
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_name(np.float16) == "float16"


@pytest.mark.parametrize("x, error, match", [
    (x_of(n=N + 1), ValueError, r"x: a batch of 4 rows; this RNN was built for batches of 1 to 3"),
    (x_of(n=0), ValueError, r"x: a batch of 0 rows"),
    (x_of(features=I + 1), ValueError, r"x: expected shape"),
    (x_of()[0], ValueError, "x: expected a 3-d array"),
    (x_of(T=0), ValueError, "T must be >= 1"),
    (x_of(dtype=np.float64), TypeError, "x: expected dtype float32, got float64"),
    (x_of(dtype=np.int32), TypeError, "x: expected dtype float32, got int32"),
    (np.asfortranarray(x_of()), ValueError, "x: expected a C-contiguous array"),
    (x_of(T=8)[::2], ValueError, "x: expected a C-contiguous array"),
    ([[[1.0]]], TypeError, "x: expected a numpy.ndarray or a torch.Tensor"),
    (torch.zeros(4, N, I, device="meta"), ValueError, "x: this RNN was built for llvm"),
])
def test_bad_x(lstm, x, error, match):
    rnn, w = lstm
    with pytest.raises(error, match=match):
        rnn.forward(w, x)


def test_states_must_match(lstm, gru):
    rnn, w = lstm
    with pytest.raises(ValueError, match=r"h0: expected shape \(1, 3, 37\)"):
        rnn.forward(w, x_of(), h0=np.zeros((2, N, H), np.float32))
    with pytest.raises(ValueError, match=r"h0: expected shape \(1, 2, 37\)"):  # x's rows decide
        rnn.forward(w, x_of(n=2), h0=np.zeros((1, N, H), np.float32))
    with pytest.raises(TypeError, match="c0: expected dtype float32"):
        rnn.forward(w, x_of(), c0=np.zeros((1, N, H)))
    with pytest.raises(ValueError, match="h0: expected a NumPy array"):
        rnn.forward(w, x_of(), h0=torch.zeros(1, N, H))
    g, gw = gru
    with pytest.raises(ValueError, match="c0: a gru has no cell state"):
        g.forward(gw, x_of(), c0=np.zeros((1, N, H), np.float32))


def test_bad_parameters(lstm):
    rnn, _ = lstm
    torch.manual_seed(0)
    params = tvmrnn.params_from_torch(torch_module("lstm", I, H, 1, False, False))
    missing = {k: v for k, v in params.items() if k != "bias_hh_l0"}
    with pytest.raises(ValueError, match=r"params: missing parameter\(s\) \['bias_hh_l0'\]"):
        rnn.pack_weights(missing)
    misshaped = dict(params, weight_hh_l0=params["weight_hh_l0"][:, :-1])
    with pytest.raises(ValueError, match=r"params\['weight_hh_l0'\]: expected shape \(148, 37\), got \(148, 36\)"):
        rnn.pack_weights(misshaped)
    with pytest.raises(ValueError, match="unexpected parameter"):
        rnn.pack_weights(dict(params, weight_ih_l1=params["weight_ih_l0"]))
    with pytest.raises(TypeError, match="params: expected a mapping"):
        rnn.pack_weights([1, 2])
    with pytest.raises(TypeError, match="params_from_torch: expected"):
        tvmrnn.params_from_torch(42)


def test_weights_and_workspace_must_belong(lstm, gru):
    rnn, w = lstm
    g, gw = gru
    with pytest.raises(TypeError, match="w: expected the result of pack_weights"):
        rnn.forward({"weight_ih_l0": 1}, x_of())
    with pytest.raises(ValueError, match="w: these weights were packed for a different configuration"):
        rnn.forward(gw, x_of())
    y, _, _, ws = rnn.forward_train(w, x_of())
    with pytest.raises(TypeError, match="ws: expected the workspace returned by this RNN's forward_train"):
        g.backward(gw, ws, y)
    with pytest.raises(ValueError, match=r"dy: expected shape \(4, 3, 37\)"):
        rnn.backward(w, ws, y[:-1].copy())
    with pytest.raises(TypeError, match="dy: expected dtype float32"):
        rnn.backward(w, ws, y.astype(np.float64))


def test_cpu_kernels_use_every_core_unless_told():
    """TVM alone takes half the logical CPUs on x86; a CPU build asks for the physical cores it may
    use (importing tvmrnn changes nothing), ``BuildOptions(threads=n)`` for n, and the user's
    ``OMP_NUM_THREADS`` stands."""
    import os
    import subprocess
    import sys
    import psutil
    code = ("import tvmrnn, tvm, os, sys; before = os.environ.get('TVM_NUM_THREADS', '-'); "
            "tvmrnn.build('gru', input_size=3, hidden_size=4, batch_size=2, options=eval(sys.argv[1])); "
            "print(before, os.environ.get('TVM_NUM_THREADS', '-'), tvm.get_global_func('runtime.NumThreads')())")
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    want = min(len(os.sched_getaffinity(0)), psutil.cpu_count(logical=False) or os.cpu_count())

    def run(options, **extra):
        return subprocess.run([sys.executable, "-c", code, options], env=dict(env, **extra), capture_output=True,
                              text=True, check=True).stdout.split()
    assert run("None") == ["-", str(want), str(want)]
    assert run("tvmrnn.BuildOptions(threads=1)") == ["-", "1", "1"]
    out = run("None", OMP_NUM_THREADS="1")[1:]
    assert out == ["-", "1"]  # the user's choice stands (TVM reads OMP_NUM_THREADS too)


def test_length_checks_are_cached_not_skipped(monkeypatch):
    """A call's shape table and its 32-bit size check are computed once per sequence length
    (they cost ~0.6 ms a call, the GPU idle meanwhile): a length over the limit is refused at
    every call, one within it keeps working, and ``shapes`` hands out copies of the cached table.
    A build of its own: a shared one may have checked T=7 before the limit falls here."""
    import tvmrnn.runtime.rnn as rnn_module
    rnn = tvmrnn.build("lstm", input_size=I, hidden_size=H, batch_size=N)
    torch.manual_seed(0)
    w = rnn.pack_weights(tvmrnn.params_from_torch(torch_module("lstm", I, H, 1, False, False)))
    y5 = rnn.forward(w, x_of(T=5))[0]
    largest = max(int(np.prod(s)) for p in rnn_module.PASSES for s in rnn.shapes(p, 7).values())
    monkeypatch.setattr(rnn_module, "_INT32_MAX", largest - 1)
    for _ in range(2):
        with pytest.raises(ValueError, match="x: T=7 makes buffers of over 2..31 elements"):
            rnn.forward(w, x_of(T=7))
    np.testing.assert_array_equal(rnn.forward(w, x_of(T=5))[0], y5)  # T=5 was checked before the limit fell
    shapes = rnn.shapes("forward", 5)
    shapes["x"] = (0,)
    assert rnn.shapes("forward", 5)["x"] == (5, N, I)


def test_numpy_arrays_we_allocate_are_64_byte_aligned(lstm):
    """Packed weights, outputs, workspaces and gradients made for NumPy callers start on a 64-byte
    boundary (NumPy's own large arrays start 16 bytes past one: the DS2 LSTM ran 1.4x slower with
    its packed weights there, notes/performance.md v18); misaligned inputs still work."""
    from tvmrnn.runtime.arrays import ALIGNMENT, aligned_empty
    rnn, w = lstm
    x = np.empty(x_of().size + 1, np.float32)[1:].reshape(x_of().shape)  # 4 bytes off any boundary
    x[...] = x_of()
    y, hy, cy, ws = rnn.forward_train(w, x)
    grads = rnn.backward(w, ws, np.ones_like(y))
    made = [w.flat, y, hy, cy, *ws.arrays.values(), grads["x"], grads["h0"], grads["weight_ih_l0"]]  # (the first
    # parameter starts the gradient buffer; the others are views at their offsets)
    assert all(a.ctypes.data % ALIGNMENT == 0 for a in made if a.size)
    np.testing.assert_array_equal(rnn.forward(w, np.ascontiguousarray(x))[0], rnn.forward(w, x)[0])
    for shape in [(3,), (5, 7, 9), (0,), ()]:
        a = aligned_empty(shape)
        assert a.shape == shape and a.dtype == np.float32 and a.flags["C_CONTIGUOUS"] and a.flags["WRITEABLE"]
        assert a.ctypes.data % ALIGNMENT == 0 or a.size == 0
