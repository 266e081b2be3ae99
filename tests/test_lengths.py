"""Rows of different lengths in one batch (``BuildOptions(variable_lengths=True)``, ``lengths=``),
against torch.nn on the same packed sequences in float64: outputs past each row's length are zero,
hy/cy are each row's states at its own last step, the reverse direction starts there, and every
gradient matches."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import tvmrnn
from tvmrnn.cells import examples as ex
from conftest import built, rel_error, torch_module

I, H, N = 5, 7, 4
VARIABLE = tvmrnn.BuildOptions(variable_lengths=True)


def _arrays(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check(cell, num_layers, bidirectional, batch_first, lengths, T, as_array=lambda a: a, rows=None, target=None,
           hidden=H, options=VARIABLE, batch=N, pad_value=None, proj_size=0):
    """``batch``: the build's rows; ``rows``: the call's (default: as many); ``pad_value``: tvmrnn's
    ``x`` holds it past each row's length (never read: torch.nn's packed run has no padding)."""
    rows = rows or batch
    rnn = built(cell, num_layers, bidirectional, batch_first, input_size=I, hidden_size=hidden, batch_size=batch,
                target=target, options=options, proj_size=proj_size)
    H = hidden
    torch.manual_seed(0)
    ref = torch_module(cell, I, H, num_layers, bidirectional, batch_first, proj_size).double()
    w = rnn.pack_weights({k: as_array(v) for k, v in tvmrnn.params_from_torch(ref).items()})
    D, has_c = 2 if bidirectional else 1, cell == "lstm"
    x = _arrays((rows, T, I) if batch_first else (T, rows, I), 0)
    h0 = _arrays((num_layers * D, rows, proj_size or H), 1)
    c0 = _arrays((num_layers * D, rows, H), 2) if has_c else None
    arr = lambda a: None if a is None else as_array(a)  # noqa: E731
    padded = x.copy()
    if pad_value is not None:
        past = np.arange(T)[None, :] >= np.asarray(lengths)[:, None]  # (rows, T)
        padded[past if batch_first else past.T] = pad_value
    y, hy, cy, ws = rnn.forward_train(w, arr(padded), arr(h0), arr(c0), lengths=lengths)
    y_inf, hy_inf, cy_inf = rnn.forward(w, arr(padded), arr(h0), arr(c0), lengths=lengths)

    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    h0t = torch.tensor(h0, dtype=torch.float64, requires_grad=True)
    c0t = torch.tensor(c0, dtype=torch.float64, requires_grad=True) if has_c else None
    packed = pack_padded_sequence(xt, torch.as_tensor(lengths), batch_first=batch_first, enforce_sorted=False)
    out, states = ref(packed, (h0t, c0t) if has_c else h0t)
    yr, _ = pad_packed_sequence(out, batch_first=batch_first, total_length=T)
    hyr = states[0] if has_c else states
    for got in (y, y_inf):
        assert rel_error(got, yr) < 1e-5
    for got in (hy, hy_inf):
        assert rel_error(got, hyr) < 1e-5
    if has_c:
        assert rel_error(cy, states[1]) < 1e-5 and rel_error(cy_inf, states[1]) < 1e-5

    dy, dhy = _arrays(tuple(y.shape), 3), _arrays(tuple(hy.shape), 4)
    dcy = _arrays(tuple(cy.shape), 5) if has_c else None
    grads = rnn.backward(w, ws, arr(dy), arr(dhy), arr(dcy))
    loss = (yr * torch.from_numpy(dy).double()).sum() + (hyr * torch.from_numpy(dhy).double()).sum()
    if has_c:
        loss = loss + (states[1] * torch.from_numpy(dcy).double()).sum()
    loss.backward()
    expected = {"x": xt.grad, "h0": h0t.grad, **({"c0": c0t.grad} if has_c else {})}
    expected.update({name: p.grad for name, p in ref.named_parameters()})
    for name, e in expected.items():
        assert rel_error(grads[name], e) < 1e-5, name


@pytest.mark.parametrize("cell,num_layers,bidirectional,batch_first", [
    ("lstm", 2, True, False), ("gru", 2, True, True), ("rnn_tanh", 1, True, False), ("rnn_relu", 2, False, False)])
def test_lengths_match_torch_packed_sequences(cell, num_layers, bidirectional, batch_first):
    _check(cell, num_layers, bidirectional, batch_first, [3, 6, 1, 4], T=6)  # unsorted, 1 and T included
    # torch tensors in, fewer rows than the build (padded), lengths as a CPU tensor
    _check(cell, num_layers, bidirectional, batch_first, torch.tensor([2, 5, 5]), T=5, as_array=torch.from_numpy,
           rows=3)
    # NaN and Inf past the lengths reach nothing (the backward's weight gradients had NaN from them)
    _check(cell, num_layers, bidirectional, batch_first, [3, 6, 1, 4], T=6, pad_value=np.nan)
    _check(cell, num_layers, bidirectional, batch_first, [2, 5, 5], T=5, as_array=torch.from_numpy, rows=3,
           pad_value=-np.inf)


def test_all_full_lengths_and_none_are_the_plain_pass():
    rnn = built("gru", 1, True, False, input_size=I, hidden_size=H, batch_size=N, options=VARIABLE)
    plain = built("gru", 1, True, False, input_size=I, hidden_size=H, batch_size=N)
    torch.manual_seed(0)
    params = tvmrnn.params_from_torch(torch_module("gru", I, H, 1, True, False))
    x = _arrays((9, N, I), 0)
    want = plain.forward(plain.pack_weights(params), x)[0]
    w = rnn.pack_weights(params)
    np.testing.assert_allclose(rnn.forward(w, x)[0], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(rnn.forward(w, x, lengths=[9] * N)[0], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("cell", [ex.PEEPHOLE_LSTM, ex.LEAKY_RNN])
def test_custom_cells_with_lengths_equal_each_row_run_alone(cell):
    """A custom cell (with per-unit parameters): each row of a ragged batch gives what that row
    alone gives over its own length, and the batch's weight gradients are the rows' sums."""
    T, lengths = 6, [4, 6, 2]
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, bidirectional=True, batch_size=3, options=VARIABLE)
    alone = tvmrnn.build(cell, input_size=I, hidden_size=H, bidirectional=True, batch_size=1)
    params = ex.reference_params(cell, I, H, bidirectional=True, generator=torch.Generator().manual_seed(0))
    params = {k: v.float().numpy() for k, v in params.items()}
    x, dy = _arrays((T, 3, I), 0), _arrays((T, 3, 2 * H), 1)
    w = rnn.pack_weights(params)
    y, hy, _, ws = rnn.forward_train(w, x, lengths=lengths)
    grads = rnn.backward(w, ws, dy)
    wa, total = alone.pack_weights(params), None
    for n, length in enumerate(lengths):
        ya, hya, _, wsa = alone.forward_train(wa, np.ascontiguousarray(x[:length, n:n + 1]))
        np.testing.assert_allclose(y[:length, n:n + 1], ya, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(hy[:, n:n + 1], hya, rtol=1e-5, atol=1e-6)
        assert not y[length:, n].any()
        ga = alone.backward(wa, wsa, np.ascontiguousarray(dy[:length, n:n + 1]))
        np.testing.assert_allclose(grads["x"][:length, n:n + 1], ga["x"], rtol=1e-4, atol=1e-6)
        assert not grads["x"][length:, n].any()
        ga = {k: v for k, v in ga.items() if k in params}  # the weights' gradients: summed over rows
        total = ga if total is None else {k: total[k] + ga[k] for k in total}
    for name in params:
        np.testing.assert_allclose(grads[name], total[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_bad_lengths_are_refused_and_the_rnn_stays_usable():
    rnn = built("lstm", 1, False, False, input_size=I, hidden_size=H, batch_size=N, options=VARIABLE)
    torch.manual_seed(0)
    w = rnn.pack_weights(tvmrnn.params_from_torch(torch_module("lstm", I, H, 1, False, False)))
    x = _arrays((5, N, I), 0)
    for lengths, error, match in [
            ([5, 6, 1, 1], ValueError, r"lengths: each must be between 1 and T=5; got 1 to 6"),
            ([5, 0, 1, 1], ValueError, "between 1 and T=5"),
            ([5, 5, 5], ValueError, r"lengths: expected one length per batch row, shape \(4,\)"),
            ([1.5, 2, 3, 4], TypeError, "lengths: expected integers"),
            (np.array([5, 2**63, 1, 1], np.uint64), ValueError, r"got 1 to 9223372036854775808"),  # not wrapped
            ([5, np.inf, 1, 1], ValueError, r"got 1.0 to inf"),
            (torch.tensor([5, 5, 5, 5], device="meta"), ValueError, "lengths: expected a CPU tensor")]:
        with pytest.raises(error, match=match):
            rnn.forward(w, x, lengths=lengths)
    plain = built("lstm", 1, False, False, input_size=I, hidden_size=H, batch_size=N)
    with pytest.raises(ValueError, match="lengths: this RNN was built without variable lengths"):
        plain.forward(plain.pack_weights(tvmrnn.params_from_torch(torch_module("lstm", I, H, 1, False, False))),
                      x, lengths=[5] * N)
    y = rnn.forward(w, x, lengths=[5, 4, 3, 2])[0]  # still usable
    assert not y[4:, 1].any() and y[3, 1].any()


@pytest.mark.parametrize("cell,hidden", [("lstm", 48), ("gru", 48), ("lstm", 37)],
                         ids=["lstm", "gru", "lstm-guarded-tiles"])
def test_tasks_whose_rows_have_all_ended_skip_their_gemm_with_the_same_bits(cell, hidden, monkeypatch):
    """A masked CPU step's task tests its rows' mask before its GEMM's reduction loop and skips it
    where none runs (tvmrnn.schedules.ended_rows): the forward steps carry the test on their mask,
    the backward steps on the mask of their GEMM's step (``gemm_mask``), and outputs, states and
    every gradient are the same bits as a build without it, on rows sorted longest first (whole
    row tiles end) and unsorted, in both directions (the reverse one's dh0 comes through a row's
    first real step: a skip on the backward step's own mask got it wrong, v49). At H = 37 the
    tiles are guarded (``cpu.CPU_GUARDED_TILES``: a predicate), which v70 left unskipped. The
    chunks' input projections and input gradients skip rows on their ``(steps, rows)`` masks too,
    and the weight gradients sum over the rows that run (``skip_ended_reduction_rows``)."""
    from tvmrnn.schedules import ended_rows
    T, batch = 23, 40
    torch.manual_seed(3)
    ref = torch_module(cell, I, hidden, 1, True, False)
    builds = []
    for skip in (True, False):
        if not skip:
            monkeypatch.setattr(ended_rows, "skip_ended_rows", lambda func, gemm, mask="mask": func)
            monkeypatch.setattr(ended_rows, "skip_ended_reduction_rows", lambda func, gemm, mask="mask": func)
        builds.append(tvmrnn.build(cell, I, hidden, bidirectional=True, batch_size=batch, options=VARIABLE,
                                   cache=False))
    with_skip = builds[0]
    for name, prefix in (("forward", "recurrent_step"), ("forward_train", "recurrent_step"),
                         ("forward", "input_projection"), ("forward_train", "input_projection"),
                         ("backward", "input_gradient")):  # (the chunks' GEMMs on their (steps, rows) masks: v72)
        prog = with_skip.programs[name]
        steps = [k for k in prog.calls(T) if k.startswith(prefix)]
        assert steps and all("if mask[" in prog.scheduled(k).script() for k in steps), (name, steps)
    sums = [k for k in with_skip.programs["backward"].calls(T) if k.startswith("weight_gradient")]
    assert sums and all("running_rows" in with_skip.programs["backward"].scheduled(k).script() for k in sums), sums
    steps = [k for k in with_skip.programs["backward"].calls(T) if k.startswith("backward_step")]
    assert steps and all("if gemm_mask[" in with_skip.programs["backward"].scheduled(k).script() for k in steps)
    sorted_lengths = np.sort(np.random.default_rng(4).integers(1, T + 1, batch))[::-1].copy()
    for lengths in (sorted_lengths, np.random.default_rng(5).permutation(sorted_lengths)):
        x, dy = _arrays((T, batch, I), 6), _arrays((T, batch, 2 * hidden), 7)
        results = []
        for rnn in builds:
            w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
            y, hy, cy, ws = rnn.forward_train(w, x, lengths=lengths)
            grads = rnn.backward(w, ws, dy)
            results.append([y, hy, cy] + list(rnn.forward(w, x, lengths=lengths)) + [grads[k] for k in sorted(grads)])
        for i, (a, b) in enumerate(zip(*results)):
            assert (a is None and b is None) or np.array_equal(a, b), (i, np.abs(a - b).max(), np.argwhere(a != b)[:5])
