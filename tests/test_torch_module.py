"""tvmrnn.torch.LSTM/GRU/RNN: drop-ins for torch.nn's, trained side by side with them."""
from __future__ import annotations

import pytest
import torch

import tvmrnn
import tvmrnn.torch as tt
from conftest import built, rel_error


def _train(cls, steps=20, **kwargs):
    torch.manual_seed(0)
    rnn = cls(8, 16, num_layers=2, bidirectional=True, **kwargs)
    head = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(list(rnn.parameters()) + list(head.parameters()), lr=0.1)
    data = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(11, 4, 8, generator=data)
        target = torch.randn(11, 4, 1, generator=data)
        y, state = rnn(x)
        h = state[0] if isinstance(state, tuple) else state
        loss = ((head(y) - target) ** 2).mean() + 0.1 * h.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("ours, theirs, kwargs", [
    (tt.LSTM, torch.nn.LSTM, {}), (tt.GRU, torch.nn.GRU, {}), (tt.RNN, torch.nn.RNN, {"nonlinearity": "relu"})])
def test_trains_like_torch_for_20_steps(ours, theirs, kwargs):
    """Same seed, same data: the two losses stay equal (float32 on both sides, so within 1e-4)."""
    a, b = _train(ours, **kwargs), _train(theirs, **kwargs)
    assert all(abs(x - y) <= 1e-4 * abs(y) for x, y in zip(a, b)), (a, b)
    assert a[-1] < a[0]  # and it learned something


def test_state_dict_both_ways_and_forward_signature():
    torch.manual_seed(0)
    ref = torch.nn.LSTM(5, 7, batch_first=True)
    ours = tt.LSTM(5, 7, batch_first=True)
    ours.load_state_dict(ref.state_dict())
    back = torch.nn.LSTM(5, 7, batch_first=True)
    back.load_state_dict(ours.state_dict())
    x, h0, c0 = torch.randn(2, 9, 5), torch.randn(1, 2, 7), torch.randn(1, 2, 7)
    y, (h, c) = ours(x, (h0, c0))
    yr, (hr, cr) = back(x, (h0, c0))
    assert rel_error(y, yr) < 1e-5 and rel_error(h, hr) < 1e-5 and rel_error(c, cr) < 1e-5
    yu, hu = tt.GRU(5, 7)(torch.randn(9, 5))  # unbatched input, as torch.nn accepts
    assert yu.shape == (9, 7) and hu.shape == (1, 7)


def test_runs_on_a_given_package():
    rnn = built("gru", 1, False)  # I=13, H=37, N=3
    ours = tt.GRU(13, 37, package=rnn)
    y, h = ours(torch.randn(4, 3, 13))
    assert y.shape == (4, 3, 37)
    with pytest.raises(ValueError, match="package: built for gru"):
        ours(torch.randn(4, 5, 13))  # batch 5, package has 3


@pytest.mark.parametrize("kwargs, match", [
    (dict(proj_size=3), "proj_size"), (dict(bias=False), "bias"), (dict(num_layers=2, dropout=0.5), "dropout")])
def test_unsupported_options_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tt.LSTM(5, 7, **kwargs)


def test_packed_sequences_are_refused():
    seq = torch.nn.utils.rnn.pack_sequence([torch.randn(3, 5), torch.randn(2, 5)])
    with pytest.raises(TypeError, match="PackedSequence"):
        tt.LSTM(5, 7)(seq)
