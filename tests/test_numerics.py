"""NaN and Inf behave as in torch.nn: a NaN or Inf in x, h0, the weights or dy reaches exactly the
outputs, states and gradients it reaches there, and only those (every built-in cell; test_cuda.py
runs the same checks on the GPU)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tvmrnn
from conftest import H, I, N, built, torch_module

CELLS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
T = 6


def _numpy(a):
    return np.asarray(a.detach().cpu() if hasattr(a, "detach") else a)


def _case(cell, place, hidden):
    """(x, h0, c0, params, dy) of a 1-layer bidirectional ``cell`` with one bad value at ``place``:
    ``x`` (a NaN in one row at step 2), ``inf`` (every x +Inf), ``x_inf``, ``h0_inf``, ``c0_inf``
    (one Inf: tanh and sigmoid saturate exactly, so their derivatives times it are NaN, as in
    torch.nn), ``h0``, ``c0`` (a NaN in one row's state), ``weight`` (a NaN in one recurrent weight of the reverse direction), ``bias`` (an Inf in
    one input bias: a saturated gate, finite in torch.nn for some cells) or ``dy`` (a NaN in one output gradient); None where nothing is bad."""
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    ref = torch_module(cell, I, hidden, 1, True, False)
    params = tvmrnn.params_from_torch(ref)
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    h0 = 0.5 * rng.standard_normal((2, N, hidden)).astype(np.float32)
    c0 = 0.5 * rng.standard_normal((2, N, hidden)).astype(np.float32) if cell == "lstm" else None
    dy = rng.standard_normal((T, N, 2 * hidden)).astype(np.float32)
    if place == "x":
        x[2, 1, 0] = np.nan
    elif place == "inf":
        x[:] = np.inf
    elif place == "x_inf":  # one Inf: saturated tanh and sigmoid whose derivatives meet it (0 x Inf)
        x[1, 0, 0] = np.inf
    elif place == "h0_inf":
        h0[1, 2, 3] = -np.inf
    elif place == "c0_inf":
        c0[0, 1, 2] = np.inf
    elif place == "h0":
        h0[0, 2, 3] = np.nan
    elif place == "c0":
        c0[1, 0, 4] = np.nan
    elif place == "weight":
        params["weight_hh_l0_reverse"][5, 1] = np.nan
    elif place == "bias":
        params["bias_ih_l0"][2] = np.inf
    elif place == "dy":
        dy[3, 1, 5] = np.nan
    return ref, params, x, h0, c0, dy


def _torch_side(cell, ref, params, x, h0, c0, dy):
    """torch.nn's outputs and gradients (float32, as tvmrnn computes) for the case."""
    with torch.no_grad():
        for name, p in ref.named_parameters():
            p.copy_(torch.from_numpy(params[name]))
    xt, h0t = torch.tensor(x, requires_grad=True), torch.tensor(h0, requires_grad=True)
    c0t = torch.tensor(c0, requires_grad=True) if c0 is not None else None
    y, state = ref(xt, (h0t, c0t) if cell == "lstm" else h0t)
    y.backward(torch.from_numpy(dy))
    hy, cy = state if cell == "lstm" else (state, None)
    outs = {"y": y, "hy": hy, "cy": cy}
    grads = {"x": xt.grad, "h0": h0t.grad, "c0": c0t.grad if c0t is not None else None,
             **{name: p.grad for name, p in ref.named_parameters()}}
    return {k: v.detach().numpy() for k, v in outs.items() if v is not None}, \
        {k: v.numpy() for k, v in grads.items() if v is not None}


def _nan_pattern_matches(place, ours: dict, theirs: dict, what: str):
    for name, want in theirs.items():
        got = _numpy(ours[name])
        assert np.array_equal(np.isnan(got), np.isnan(want)), \
            f"{what}[{name}]: NaN at {np.isnan(got).sum()} entries, torch.nn at {np.isnan(want).sum()} ({place})"
        assert np.array_equal(np.isinf(got), np.isinf(want)), f"{what}[{name}]: Inf differs ({place})"


def check(cell, place, target=None, as_array=lambda a: a, hidden=H):
    """One bad value at ``place``: tvmrnn's forward, training forward and backward put NaN and Inf
    where torch.nn does."""
    rnn = built(cell, 1, True, target=target, hidden_size=hidden)
    ref, params, x, h0, c0, dy = _case(cell, place, hidden)
    want, want_grads = _torch_side(cell, ref, params, x, h0, c0, dy)
    bad = [k for k, v in {**want, **want_grads}.items() if not np.isfinite(v).all()]
    # an Inf bias may saturate a gate; ReLU's backward drops dy where its output is 0
    assert bad or place == "bias" or (place, cell) == ("dy", "rnn_relu"), "the case reaches nothing"
    if place not in ("weight", "inf"):  # those reach everything; the others must not
        assert not all(np.isnan(v).all() for v in want.values())
    w = rnn.pack_weights({k: as_array(v) for k, v in params.items()})
    states = dict(h0=as_array(h0), c0=as_array(c0) if c0 is not None else None)
    y, hy, cy = rnn.forward(w, as_array(x), **states)
    _nan_pattern_matches(place, {"y": y, "hy": hy, "cy": cy}, want, "forward")
    y, hy, cy, ws = rnn.forward_train(w, as_array(x), **states)
    _nan_pattern_matches(place, {"y": y, "hy": hy, "cy": cy}, want, "forward_train")
    grads = rnn.backward(w, ws, as_array(dy))
    _nan_pattern_matches(place, grads, want_grads, "backward")


PLACES = ["x", "inf", "x_inf", "h0", "h0_inf", "c0", "c0_inf", "weight", "bias", "dy"]


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("cell", CELLS)
def test_nan_and_inf_reach_what_they_reach_in_torch(cell, place):
    if place.startswith("c0") and cell != "lstm":
        pytest.skip("only the LSTM has a cell state")
    check(cell, place)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_an_inf_weight_meets_padding_rows_as_it_meets_real_ones(cell):
    """A call of fewer rows than the build's batch (and a build whose kernels pad its batch) runs
    padding rows. They were zeros: an Inf recurrent weight times a zero state is NaN there, which
    reached the next layer and the other direction through the padding's outputs, and the
    backward's weight-gradient sums over rows (0 x NaN) then made every later weight gradient NaN,
    where torch.nn's are finite (its real rows saturate). Padding rows now copy the first row
    (``Frame.padded``): the NaN and Inf pattern of every output and gradient is torch.nn's, for a
    2-layer bidirectional build called with 3 of its 4 rows."""
    layers, n = 2, 3
    rnn = built(cell, layers, True, batch_size=n + 1)
    rng = np.random.default_rng(1)
    torch.manual_seed(1)
    ref = torch_module(cell, I, H, layers, True, False)
    params = {k: v.copy() for k, v in tvmrnn.params_from_torch(ref).items()}
    params["weight_hh_l0"][1, 2] = np.inf
    x = rng.standard_normal((T, n, I)).astype(np.float32)
    h0 = rng.standard_normal((2 * layers, n, H)).astype(np.float32)
    c0 = rng.standard_normal((2 * layers, n, H)).astype(np.float32) if cell == "lstm" else None
    dy = rng.standard_normal((T, n, 2 * H)).astype(np.float32)
    want, want_grads = _torch_side(cell, ref, params, x, h0, c0, dy)
    assert np.isnan(want_grads["weight_hh_l0"]).any() and np.isfinite(want_grads["weight_hh_l1"]).all()
    w = rnn.pack_weights(params)
    y, hy, cy, ws = rnn.forward_train(w, x, h0, c0)
    _nan_pattern_matches("inf weight", {"y": y, "hy": hy, "cy": cy}, want, "forward_train")
    _nan_pattern_matches("inf weight", rnn.backward(w, ws, dy), want_grads, "backward")
