"""NaN and Inf behave as in torch.nn: a NaN in the input reaches exactly the outputs it reaches there."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tvmrnn
from conftest import H, I, N, built, torch_module


# rnn_relu is left out: its max(v, 0) drops a NaN on x86 (issue 40 has the rest of this work)
def _numpy(a):
    return np.asarray(a.detach().cpu() if hasattr(a, "detach") else a)


def _built_beside_torch(cell, target, as_array, hidden):
    """A 1-layer bidirectional build, the torch.nn module whose weights it packs (seeded), and a
    random input of 6 steps."""
    rnn = built(cell, 1, True, target=target, hidden_size=hidden)
    torch.manual_seed(0)
    ref = torch_module(cell, I, hidden, 1, True, False)
    w = rnn.pack_weights({k: as_array(v) for k, v in tvmrnn.params_from_torch(ref).items()})
    return rnn, ref, w, np.random.default_rng(0).standard_normal((6, N, I)).astype(np.float32)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_nan_and_inf_inputs_reach_the_outputs_torch_gives(cell, target=None, as_array=lambda a: a, hidden=H):
    rnn, ref, w, x = _built_beside_torch(cell, target, as_array, hidden)
    x[2, 1, 0] = np.nan
    for batch in (x, np.full_like(x, np.inf)):
        with torch.no_grad():
            want = np.isnan(ref(torch.from_numpy(batch))[0].numpy())
        assert want.any() and (batch is not x or not want.all())  # a NaN reaches some outputs, not all
        for y in (rnn.forward(w, as_array(batch))[0], rnn.forward_train(w, as_array(batch))[0]):
            assert np.array_equal(np.isnan(_numpy(y)), want)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_a_nan_in_dy_reaches_the_gradients_torch_gives(cell, target=None, as_array=lambda a: a, hidden=H):
    """The backward: one NaN in dy reaches exactly the gradient entries it reaches in torch.nn."""
    rnn, ref, w, x = _built_beside_torch(cell, target, as_array, hidden)
    y, _, _, ws = rnn.forward_train(w, as_array(x))
    dy = np.random.default_rng(1).standard_normal(tuple(y.shape)).astype(np.float32)
    dy[3, 1, 5] = np.nan
    grads = rnn.backward(w, ws, as_array(dy))
    xt = torch.tensor(x, requires_grad=True)
    ref(xt)[0].backward(torch.from_numpy(dy))
    want = {"x": xt.grad, **{name: p.grad for name, p in ref.named_parameters()}}
    assert np.isnan(want["x"].numpy()).any() and not np.isnan(want["x"].numpy()).all()
    for name, g in want.items():
        assert np.array_equal(np.isnan(_numpy(grads[name])), np.isnan(g.numpy())), name
