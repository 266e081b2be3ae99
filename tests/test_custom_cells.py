"""Custom cells (``tvmrnn.define_cell``): the four example cells against per-step PyTorch
references differentiated by autograd, their derived backward against finite differences,
definition-time errors, packages loaded without the cell's math, the drop-in, and tuning.

Tolerance as in test_rnn.py and for the same reasons: relative error 1e-4 between float32
kernels and a float64 reference (rounding sits near 1e-7 at these sizes; a wrong gate, index or
missing term shows up at 1e-2 or more).
"""
from __future__ import annotations

import re

import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from tvm import tirx

import tvmrnn
import tvmrnn.torch as tt
from tvmrnn.cells import examples as ex
from tvmrnn.runtime import loader, package
from tvmrnn.tune import tasks, tuner
from tvmrnn.cells.autodiff import derive
from tvmrnn.program.passes import Config
from conftest import H, I, N, built, grid, rel_error, torch_module
from test_autodiff import evaluate

TOL = 1e-4
EXAMPLES = sorted(ex.EXAMPLES)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _params(cell, num_layers, bidirectional, seed=0):
    """Random PyTorch-named parameters: float32 for tvmrnn, the same values in float64 for the reference."""
    p32 = ex.reference_params(cell, I, H, num_layers, bidirectional, generator=torch.Generator().manual_seed(seed))
    p64 = {k: v.double().requires_grad_(True) for k, v in p32.items()}
    return {k: v.numpy() for k, v in p32.items()}, p64


def _check(name, num_layers, bidirectional, T, rng, batch_first=False, with_states=True, target=None,
           as_array=lambda a: a):
    """Forward, training forward and backward on ``as_array`` inputs against the float64 reference."""
    cell = ex.EXAMPLES[name]
    rnn = built(cell, num_layers, bidirectional, batch_first, target=target)
    params, ref_params = _params(cell, num_layers, bidirectional)
    w = rnn.pack_weights(params)
    D, has_c = 2 if bidirectional else 1, cell.has_cell_state
    state = (num_layers * D, N, H)
    x = rng.standard_normal((N, T, I) if batch_first else (T, N, I)).astype(np.float32)
    h0 = rng.standard_normal(state).astype(np.float32) if with_states else None
    c0 = rng.standard_normal(state).astype(np.float32) if with_states and has_c else None

    arr = lambda a: None if a is None else as_array(a)  # noqa: E731
    y, hy, cy, ws = rnn.forward_train(w, arr(x), arr(h0), arr(c0))
    y_inf, hy_inf, cy_inf = rnn.forward(w, arr(x), arr(h0), arr(c0))

    as64 = lambda a: torch.tensor(a if a is not None else np.zeros(state), dtype=torch.float64,  # noqa: E731
                                  requires_grad=True)
    xt, h0t, c0t = as64(x), as64(h0), as64(c0)
    yr, hyr, cyr = ex.reference_forward(cell, ref_params, xt, h0t, c0t if has_c else None, num_layers,
                                        bidirectional, batch_first)
    for got, expected in ((y, yr), (y_inf, yr), (hy, hyr), (hy_inf, hyr)):
        assert rel_error(got, expected) < TOL
    if has_c:
        assert rel_error(cy, cyr) < TOL and rel_error(cy_inf, cyr) < TOL
    else:
        assert cy is None and cy_inf is None

    dy = rng.standard_normal(y.shape).astype(np.float32)
    dhy = rng.standard_normal(state).astype(np.float32)
    dcy = rng.standard_normal(state).astype(np.float32) if has_c else None
    grads = rnn.backward(w, ws, arr(dy), arr(dhy), arr(dcy))
    loss = (yr * torch.from_numpy(dy).double()).sum() + (hyr * torch.from_numpy(dhy).double()).sum()
    if has_c:
        loss = loss + (cyr * torch.from_numpy(dcy).double()).sum()
    loss.backward()
    expected = {"x": xt.grad, "h0": h0t.grad, **({"c0": c0t.grad} if has_c else {})}
    expected.update({k: v.grad for k, v in ref_params.items()})
    assert set(grads) == set(expected)
    for key, e in expected.items():
        assert rel_error(grads[key], e) < TOL, key


# ---- correctness against the PyTorch references -------------------------------------------------
@pytest.mark.parametrize(*grid({"name": list(EXAMPLES), "num_layers": [1, 2], "bidirectional": [False, True]},
                              every={"T": [1, 7]}, ids={"bidirectional": lambda b: "bidir" if b else "uni"}))
def test_matches_pytorch_reference(name, num_layers, bidirectional, T, rng):
    """Every example cell, 1 and 2 layers, 1 and 2 directions: each pair of settings in the
    default run (two builds a cell, :func:`conftest.grid`), all with ``--full-grid``."""
    _check(name, num_layers, bidirectional, T, rng)


def test_batch_first_and_zero_states(rng):
    _check("peephole_lstm", 2, True, 5, rng, batch_first=True, with_states=False)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_reference_loop_matches_torch_nn(cell):
    """The per-step reference is itself checked: for the built-in cells it must be torch.nn."""
    torch.manual_seed(0)
    module = torch_module(cell, I, H, 2, True, True).double()
    params = dict(module.named_parameters())
    x = torch.randn(N, 6, I, dtype=torch.float64)
    h0 = torch.randn(4, N, H, dtype=torch.float64)
    c0 = torch.randn(4, N, H, dtype=torch.float64)
    if cell == "lstm":
        y, (hy, cy) = module(x, (h0, c0))
    else:
        (y, hy), cy = module(x, h0), None
    yr, hyr, cyr = ex.reference_forward(cell, params, x, h0, c0, 2, True, batch_first=True)
    assert rel_error(yr, y) < 1e-12 and rel_error(hyr, hy) < 1e-12
    assert cell != "lstm" or rel_error(cyr, cy) < 1e-12


def test_unit_parameter_gradients_are_deterministic(rng):
    cell = ex.PEEPHOLE_LSTM
    rnn = built(cell, 2, True)
    w = rnn.pack_weights(_params(cell, 2, True)[0])
    x = rng.standard_normal((20, N, I)).astype(np.float32)  # a 16-step chunk and single steps
    _, _, _, ws = rnn.forward_train(w, x)
    dy = rng.standard_normal((20, N, 2 * H)).astype(np.float32)
    first, second = rnn.backward(w, ws, dy), rnn.backward(w, ws, dy)
    assert {"w_ci_l0", "w_cf_l1_reverse", "w_co_l1"} <= set(first)
    for key in first:
        assert np.array_equal(first[key], second[key]), key


# ---- the derivation -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EXAMPLES)
def test_derived_backward_matches_finite_differences(name):
    """Every gradient, per-unit parameters included, against central differences in float64."""
    d = derive(ex.EXAMPLES[name])
    rng = np.random.default_rng(7)
    has_c = d.c_prev is not None
    inputs = [*d.x_gates, *d.h_gates, d.h_prev, *d.params] + ([d.c_prev] if has_c else [])
    analytic = [*d.grad_x, *d.grad_h, d.grad_h_prev, *d.grad_params] + ([d.grad_c_prev] if has_c else [])
    outputs = [d.h_out] + ([d.c_out] if has_c else [])
    for _ in range(20):
        point = {v.name: float(rng.standard_normal()) for v in inputs}
        seeds = {"dh": float(rng.standard_normal()), "dc": float(rng.standard_normal())}

        def loss(p):
            values = [evaluate(o, p) for o in outputs]
            return seeds["dh"] * values[0] + (seeds["dc"] * values[1] if has_c else 0.0)

        env = dict(point, **seeds, h_next=evaluate(d.h_out, point))
        if has_c:
            env["c_next"] = evaluate(d.c_out, point)
        env.update({var.name: evaluate(e, point) for var, e in d.saved})
        for var, grad in zip(inputs, analytic):
            eps = 1e-6
            up, down = dict(point), dict(point)
            up[var.name] += eps
            down[var.name] -= eps
            numeric = (loss(up) - loss(down)) / (2 * eps)
            got = 0.0 if grad is None else evaluate(grad, env)
            assert abs(got - numeric) < 1e-6 * max(1.0, abs(numeric)), (name, var.name, got, numeric)


def test_a_gate_read_only_by_a_select_condition_is_kept_for_the_backward():
    """A hard gate, ``h_t = h_prev where x_0 + h_0 > 0 else tanh(x_1 + h_1)``: gate 0 is read only
    by the Select's condition (no derivative flows through it), and the backward evaluates the
    condition, so its value is kept (the build failed inside TVM: an undefined x_g0). Against a
    float64 torch loop: outputs and every gradient (gate 0's weights get none)."""
    def hard_gate(x, h, h_prev, c_prev, p):
        return tirx.Select(x[0] + h[0] > 0.0, h_prev, tirx.tanh(x[1] + h[1])), None
    cell = tvmrnn.define_cell("hard_gate", gates=("g", "c"), math=hard_gate)
    assert len(derive(cell).saved) >= 1
    torch.manual_seed(0)
    ours = tt.CustomRNN(cell, 5, 7)
    x, h0 = torch.randn(6, 3, 5), torch.randn(1, 3, 7)
    y, hy = ours(x, h0)
    (y.pow(2).sum() + hy.sum()).backward()
    w = {n: p.detach().double().requires_grad_() for n, p in ours.named_parameters()}
    h, ys = h0[0].double(), []
    for t in range(6):
        gates = (x[t].double() @ w["weight_ih_l0"].t() + w["bias_ih_l0"] + h @ w["weight_hh_l0"].t()
                 + w["bias_hh_l0"]).view(3, 2, 7)
        h = torch.where(gates[:, 0] > 0, h, torch.tanh(gates[:, 1]))
        ys.append(h)
    yr = torch.stack(ys)
    (yr.pow(2).sum() + h.sum()).backward()
    assert rel_error(y, yr) < 1e-5
    for name, p in ours.named_parameters():
        assert rel_error(p.grad, w[name].grad) < 1e-5, name
    assert not ours.weight_hh_l0.grad.view(2, 7, 7)[0].any()


def test_unit_parameters_are_never_kept():
    """Per-unit parameters, and values of them alone, are recomputed in the backward."""
    leaky = derive(ex.LEAKY_RNN)
    assert [str(e) for _, e in leaky.saved] == ["T.tanh(x_h + h_h)"]  # not sigmoid(leak)
    assert ex.LEAKY_RNN.num_saved == 1
    peephole = derive(ex.PEEPHOLE_LSTM)
    assert not any(any(v.same_as(e) for v in peephole.params) for _, e in peephole.saved)
    assert ex.PEEPHOLE_LSTM.num_saved == 4  # i, f, g, o, as for the LSTM (tanh(c_t) is recomputed from c_t)
    assert not derive(ex.MGU).gate_grads_shared  # f scales W_hn h: two gradients for gate n, as in GRU


# ---- errors at definition time ----------------------------------------------------------------------
def _one_gate(body, **kwargs):
    kwargs.setdefault("gates", ("h",))
    return lambda: tvmrnn.define_cell("bad", math=body, **kwargs)


@pytest.mark.parametrize("define, match", [
    (_one_gate(lambda x, h, hp, cp, p: (tirx.floor(x[0] + h[0]), None)),
     r"cell 'bad': cannot differentiate T\.floor\(x_h \+ h_h\): tirx\.floor has no derivative"),
    (_one_gate(lambda x, h, hp, cp, p: (tirx.tanh(tirx.round(x[0]) + h[0]), None)),
     r"cannot differentiate T\.round\(x_h\)"),
    (_one_gate(lambda x, h, hp, cp, p: ((x[0] > h[0]) * x[0] + h[0], None)),
     r"cannot differentiate T\.Cast\(\"float32\", x_h > h_h\): a comparison used as a value; write tirx\.Select"),
    (_one_gate(lambda x, h, hp, cp, p: (x[4] + h[0], None), gates=("i", "f", "g", "o")),
     r"x\[4\] does not exist: the cell has 4 gates \('i', 'f', 'g', 'o'\)"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] + h["q"], None)), r"h\['q'\] does not exist: the cell has 1 gates"),
    (_one_gate(lambda x, h, hp, cp, p: tirx.tanh(x[0] + h[0])), r"math must return a pair \(h_t, c_t\)"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] + h[0], hp)), r"returned a cell state c_t = h_prev but the cell is "
                                                           r"defined with cell_state=False"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] + h[0] + cp, None), cell_state=True),
     r"returned no cell state \(c_t is None\) but the cell is defined with cell_state=True"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] > h[0], None)), r"h_t = .* is not a float32 expression \(it is bool\)"),
    (_one_gate(lambda x, h, hp, cp, p: (tirx.Cast("float64", x[0] + h[0]), None)),
     r"is not a float32 expression \(it is float64\)"),
    (_one_gate(lambda x, h, hp, cp, p: (0.5, None)), r"h_t = 0\.5 is not a float32 expression \(it is float\)"),
    (_one_gate(lambda x, h, hp, cp, p: (math.tanh(x[0]), None)), r"math raised TypeError"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] + h[0] * p["w_cx"], None), unit_params=("w_ci",)),
     r"p\['w_cx'\] is not a unit parameter of this cell; it declares unit_params=\('w_ci',\)"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] + h[0], None), unit_params=("gain",)),
     r"unit parameter 'gain' is declared but the math never reads p\['gain'\]"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] + h[0], None), gates=("a", "b")),
     r"gate 1 \('b'\) is used neither as x\[1\] nor as h\[1\]"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] + h[0] + tirx.Var("bias", "float32"), None)),
     r"reads a variable 'bias' that is not one of its inputs"),
    (_one_gate(lambda x, h, hp, cp, p: (x[0] * 2.0 + hp, None)), r"the math reads no h\[k\]: the cell would have no "
                                                                 r"recurrent GEMM"),  # (it failed at build)
])
def test_math_errors_name_the_expression(define, match):
    with pytest.raises(tvmrnn.CellDefinitionError, match=match):
        define()


def _fine(x, h, h_prev, c_prev, p):
    return tirx.tanh(x[0] + h[0]), None


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="my cell"), r"name: expected a Python identifier .*'my cell'"),
    (dict(name="lstm"), r"name: 'lstm' is a built-in cell; choose another name"),
    (dict(gates=("h", "h")), r"gates: names must be distinct, \['h'\] repeated"),
    (dict(gates=()), r"gates: a cell needs at least one gate"),
    (dict(gates="ifgo"), r"gates: expected a sequence of names"),
    (dict(unit_params=("weight_ih",)), r"unit_params: \['weight_ih'\] would clash with the standard parameters"),
    (dict(unit_params=("2x",)), r"unit_params: expected a Python identifier"),
    (dict(cell_state="yes"), r"cell_state: expected bool"),
    (dict(math="tanh"), r"math: expected a function"),
    (dict(init={"gain": 1.0}), r"init: 'gain' is not one of unit_params=\(\)"),
])
def test_bad_definitions(kwargs, match):
    args = dict(name="fine", gates=("h",), math=_fine) | kwargs
    with pytest.raises(tvmrnn.CellDefinitionError, match=match):
        tvmrnn.define_cell(args.pop("name"), **args)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("name", ["peephole_lstm", "mgu"])
def test_cuda_sm90_compiles(name):
    """No GPU needed: the kernels of a custom cell, per-unit parameters included, compile for sm_90."""
    rnn = tvmrnn.build(ex.EXAMPLES[name], input_size=16, hidden_size=32, batch_size=4, bidirectional=True,
                       target={"kind": "cuda", "arch": "sm_90"})
    (device_module,) = rnn.executable.mod.imports
    source = device_module.inspect_source()
    assert device_module.kind == "cuda" and source.count("__global__") >= 10
    # the per-unit parameters' view, a kernel parameter (``w_unit``; ``w_unit_ptr`` in a persistent loop)
    assert bool(re.search(r"\bw_unit(_ptr)?\b", source)) == bool(ex.EXAMPLES[name].unit_params)


def test_cells_by_name_for_the_scripts():
    """What scripts/export.py and scripts/tune.py accept for a cell."""
    from tvmrnn.cells import find_cell
    assert find_cell("gru") is tvmrnn.CELLS["gru"] and find_cell("mgu") is ex.MGU
    assert find_cell("tvmrnn.cells.examples:LEAKY_RNN") is ex.LEAKY_RNN
    with pytest.raises(ValueError, match=r"unknown cell 'nope'; expected one of \['gru', .*'peephole_lstm'\]"):
        find_cell("nope")
    with pytest.raises(ValueError, match="'tvmrnn.cells.examples:EXAMPLES' is not a tvmrnn Cell"):
        find_cell("tvmrnn.cells.examples:EXAMPLES")


def test_cell_definition_error_is_a_value_error():
    assert issubclass(tvmrnn.CellDefinitionError, ValueError)
    assert tvmrnn.define_cell("fine", gates=2, math=lambda x, h, hp, cp, p: (x[0] + h[1], None)).gates == ("g0", "g1")


# ---- packages, drop-in, tuning ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("pkg") / "peephole.so"
    built(ex.PEEPHOLE_LSTM, 1, True).export(path)
    return str(path)


@pytest.mark.llvm_optimized  # (the package's bits against a build's in this process)
def test_package_runs_without_the_cells_math(exported, tmp_path):
    """A fresh interpreter that never imports the example cells loads and runs the package."""
    params = _params(ex.PEEPHOLE_LSTM, 1, True)[0]
    rng = np.random.default_rng(3)
    x = rng.standard_normal((9, N, I)).astype(np.float32)
    dy = rng.standard_normal((9, N, 2 * H)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, dy=dy, **params)
    script = f"""
import sys, numpy as np, tvm, tvmrnn
tvm.compile = None  # loading must not compile
rnn = tvmrnn.load({exported!r})
data = np.load(r"{tmp_path}/in.npz")
w = rnn.pack_weights({{k: data[k] for k in rnn.config.layout.names}})
y, hy, cy, ws = rnn.forward_train(w, data["x"])
g = rnn.backward(w, ws, data["dy"])
np.savez(r"{tmp_path}/out.npz", y=y, cy=cy, **{{"d_" + k: v for k, v in g.items()}})
assert "tvmrnn.cells.examples" not in sys.modules and rnn.config.cell.math is None
"""
    subprocess.run([sys.executable, "-c", script], check=True, cwd=REPO)
    out = np.load(tmp_path / "out.npz")
    rnn = built(ex.PEEPHOLE_LSTM, 1, True)
    w = rnn.pack_weights(params)
    y, _, cy, ws = rnn.forward_train(w, x)
    grads = rnn.backward(w, ws, dy)
    assert np.array_equal(out["y"], y) and np.array_equal(out["cy"], cy)
    for key, value in grads.items():
        assert np.array_equal(out["d_" + key], value), key


@pytest.mark.llvm_optimized  # (shares the package above)
def test_package_metadata_and_loaded_cell(exported):
    meta = package.read_metadata(exported)
    assert meta["format_version"] == package.FORMAT_VERSION == 5
    assert (meta["cell"], meta["gates"], meta["has_cell_state"]) == ("peephole_lstm", ["i", "f", "g", "o"], True)
    assert meta["unit_params"] == ["w_ci", "w_cf", "w_co"] and meta["num_saved"] == 4
    assert [name for name, _, _ in meta["parameters"]][4:6] == ["w_ci_l0", "w_cf_l0"]
    loaded = tvmrnn.load(exported)
    assert loaded.config.cell.signature == ex.PEEPHOLE_LSTM.signature
    with pytest.raises(ValueError, match="'peephole_lstm' came from a package and carries no math"):
        tvmrnn.build(loaded.config.cell, input_size=I, hidden_size=H)
    module = tt.CustomRNN(loaded.config.cell, I, H, bidirectional=True, package=loaded)  # no math needed
    y, (hy, cy) = module(torch.randn(5, N, I))
    assert y.shape == (5, N, 2 * H) and cy.shape == (2, N, H)


def test_a_loaded_cell_keeps_its_parameters_start_values(tmp_path):
    """A package records its cell's ``init=`` constants, so a drop-in on the loaded cell starts
    its per-unit parameters where the defined cell's does (it drew them at random)."""
    path = tmp_path / "leaky.so"
    tvmrnn.build(ex.LEAKY_RNN, input_size=I, hidden_size=H, batch_size=2, cache=False).export(path)
    loaded = tvmrnn.load(path)
    assert loaded.config.cell.unit_param_init == ex.LEAKY_RNN.unit_param_init == (("leak", 0.0),)
    module = tt.CustomRNN(loaded.config.cell, I, H, package=loaded)
    assert not module.leak_l0.any()


def test_format_1_packages_still_read():
    meta = {"format_version": 1, "cell": "gru"}
    assert loader._cell_of(meta) is tvmrnn.CELLS["gru"]


def _train(cell, ours: bool, steps=8):
    """Same seed, data and loss for the drop-in and for the per-step reference of the same cell."""
    torch.manual_seed(0)
    module = tt.CustomRNN(cell, I, H, num_layers=2, bidirectional=True, package=built(cell, 2, True))
    params = dict(module.named_parameters()) if ours else {
        name: torch.nn.Parameter(p.detach().clone()) for name, p in module.named_parameters()}
    head = torch.nn.Linear(2 * H, 1)
    opt = torch.optim.SGD(list(params.values()) + list(head.parameters()), lr=0.1)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(11, N, I, generator=data)
        target = torch.randn(11, N, 1, generator=data)
        if ours:
            y, state = module(x)
            h = state[0] if cell.has_cell_state else state
        else:
            y, h, _ = ex.reference_forward(cell, params, x, num_layers=2, bidirectional=True)
        loss = ((head(y) - target) ** 2).mean() + 0.1 * h.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, params


@pytest.mark.parametrize("name", ["peephole_lstm", "leaky_rnn"])
def test_drop_in_trains_like_the_reference(name):
    """float32 on both sides: the losses agree to 1e-4 over the steps."""
    cell = ex.EXAMPLES[name]
    (a, ours), (b, theirs) = _train(cell, ours=True), _train(cell, ours=False)
    assert all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(a, b)), (a, b)
    assert a[-1] < a[0]
    torch.manual_seed(0)
    initial = tt.CustomRNN(cell, I, H, 2, bidirectional=True).state_dict()  # as _train starts
    for unit in cell.unit_params:  # the per-unit parameters were trained, identically on both sides
        key = f"{unit}_l1_reverse"
        assert not torch.equal(ours[key], initial[key])
        assert rel_error(ours[key], theirs[key]) < 1e-4


def test_drop_in_parameters_and_init():
    torch.manual_seed(0)
    module = tt.CustomRNN(ex.LEAKY_RNN, 5, 7, num_layers=2, bidirectional=True)
    names = [n for n, _ in module.named_parameters()]
    assert names[:5] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "leak_l0"]
    assert len(names) == 20 and module.leak_l1_reverse.shape == (7,)
    assert torch.all(module.leak_l0 == 0.0)  # the cell's init; weights as PyTorch's
    assert module.weight_hh_l1.abs().max() <= 7 ** -0.5 and module.weight_hh_l1.std() > 0.1
    peephole = tt.CustomRNN(ex.PEEPHOLE_LSTM, 5, 7)
    assert peephole.w_ci_l0.std() > 0  # no init given: uniform like the weights
    no_bias = tt.CustomRNN(ex.MGU, 5, 7, bias=False)  # as torch.nn: no bias parameters (zeros run)
    assert [n for n, _ in no_bias.named_parameters()] == ["weight_ih_l0", "weight_hh_l0"]
    y, _ = no_bias(torch.randn(3, 2, 5))
    y.sum().backward()
    assert no_bias.weight_hh_l0.grad is not None and y.shape == (3, 2, 7)


def test_tuning_tasks_and_a_tiny_run(tmp_path, rng):
    config = Config(ex.LEAKY_RNN, 4, 8, 1, False, 2, False)
    names = {t.kernel.name for t in tasks.extract_tasks([config])}
    step = "recurrent_step_leaky_rnn_infer_n2_h8"
    assert {step, "recurrent_step_leaky_rnn_train_n2_h8", "pointwise_backward_leaky_rnn_n2_h8",
            "bias_gradient_t1_n2_h8_g1"} <= names
    results = tuner.tune([config], tvmrnn.device.host_target(), log_dir=str(tmp_path), trials_per_task=2,
                          kernels=[step], num_trials_per_iter=2, out=lambda line: None)
    assert results[0][0].kernel.name == step and results[0][2] >= 2
    rnn = tvmrnn.build(ex.LEAKY_RNN, input_size=4, hidden_size=8, batch_size=2, tuning_logs=str(tmp_path))
    assert rnn.schedules[step] == "tuned"
    p32 = ex.reference_params(ex.LEAKY_RNN, 4, 8, generator=torch.Generator().manual_seed(0))
    x = rng.standard_normal((12, 2, 4)).astype(np.float32)
    y, _, _ = rnn.forward(rnn.pack_weights({k: v.numpy() for k, v in p32.items()}), x)
    yr = ex.reference_forward(ex.LEAKY_RNN, {k: v.double() for k, v in p32.items()}, torch.from_numpy(x).double())[0]
    assert rel_error(y, yr) < TOL
