"""tvmrnn.torch.LSTM/GRU/RNN: drop-ins for torch.nn's, trained side by side with them."""
from __future__ import annotations

import json
from unittest import mock

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

import tvmrnn
import tvmrnn.torch as tt
from conftest import H, I, N, built, cpu_has, rel_error


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
    assert ours(torch.randn(4, 2, 13))[0].shape == (4, 2, 37)  # a smaller batch runs on it, padded
    with pytest.raises(ValueError, match="input: a batch of 5 rows; the package runs batches of at most 3"):
        ours(torch.randn(4, 5, 13))
    with pytest.raises(ValueError, match="package: built for gru"):
        tt.GRU(13, 36, package=rnn)(torch.randn(4, 3, 13))


def test_unsupported_options_are_refused():
    with pytest.raises(TypeError, match="rebuild: expected bool"):
        tt.LSTM(5, 7, rebuild="no")


@pytest.mark.parametrize("kwargs, packed, states", [
    (dict(), False, True), (dict(num_layers=2, bidirectional=True), False, True),
    (dict(num_layers=3, batch_first=True, bidirectional=True, bias=False), False, True),
    (dict(num_layers=2, bidirectional=True), True, True), (dict(batch_first=True), True, True),
    (dict(num_layers=2, bidirectional=True), True, False)],
    ids=["1uni", "2bidir", "3bidir-batch_first-nobias", "2bidir-packed", "1uni-batch_first-packed",
         "2bidir-packed-no-states"])
def test_projections_match_torch(kwargs, packed, states):
    """``proj_size`` (LSTMP): outputs, both final states and the gradients of the input, of h0 and
    c0 and of every parameter (``weight_hr`` included) against torch.nn in float64, at odd sizes,
    with initial states, and packed (unsorted lengths: the reverse direction starts at each
    row's own last step, where its h0 enters)."""
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    ref = torch.nn.LSTM(5, 9, proj_size=4, **kwargs).double()
    ours = tt.LSTM(5, 9, proj_size=4, **kwargs)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    batch_first = kwargs.get("batch_first", False)
    D, L = 2 if kwargs.get("bidirectional") else 1, kwargs.get("num_layers", 1)
    x = torch.randn((5, 7, 5) if batch_first else (7, 5, 5))
    h0, c0 = torch.randn(L * D, 5, 4), torch.randn(L * D, 5, 9)
    lengths = torch.tensor([3, 7, 1, 5, 6])
    results = []
    for module, dtype in ((ours, torch.float32), (ref, torch.float64)):
        module.zero_grad()
        xs, hs, cs = (t.clone().to(dtype).requires_grad_() for t in (x, h0, c0))
        inp = pack_padded_sequence(xs, lengths, batch_first=batch_first, enforce_sorted=False) if packed else xs
        out, (hy, cy) = module(inp, (hs, cs) if states else None)  # none: zeros, the input not widened
        y = out.data if packed else out
        (y.sin().sum() + (hy * hy).sum() + cy.sum()).backward()
        results.append((y, hy, cy, xs.grad, hs.grad, cs.grad, {n: p.grad for n, p in module.named_parameters()}))
    ours_out, ref_out = results
    assert ours_out[0].shape == ref_out[0].shape and ours_out[1].shape == (L * D, 5, 4)
    for name, a, b in zip(("y", "hy", "cy", "dx", "dh0", "dc0")[:6 if states else 4], ours_out, ref_out):
        assert rel_error(a, b) < 1e-5, name
    assert set(ours_out[6]) == set(ref_out[6]) and any("weight_hr" in n for n in ref_out[6])
    for name in ref_out[6]:
        assert rel_error(ours_out[6][name], ref_out[6][name]) < 1e-5, name


def test_projections_with_dropout_and_default_states_match_torch():
    """``proj_size`` with ``dropout`` in training: the same masks as torch.nn (drawn on the
    projected outputs between layers); no initial states given (zeros); eval, and a 2-d
    (unbatched) input."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(6, 9, num_layers=3, dropout=0.4, proj_size=5).double()
    ours = tt.LSTM(6, 9, num_layers=3, dropout=0.4, proj_size=5)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    errors = _side_by_side(ours, ref, torch.randn(7, 4, 6), seed=3)
    assert max(errors.values()) < 1e-5, errors
    ours.eval()
    ref.eval()
    x = torch.randn(7, 6)
    (y, (h, c)), (yr, (hr, cr)) = ours(x), ref(x.double())
    assert y.shape == (7, 5) and h.shape == (3, 5) and c.shape == (3, 9)
    assert rel_error(y, yr) < 1e-5 and rel_error(h, hr) < 1e-5 and rel_error(c, cr) < 1e-5


@pytest.mark.parametrize("where", ["x", "h0", "c0", "weight_hh_l0", "weight_hr_l1"])
def test_projections_propagate_nan_and_inf_as_torch(where):
    """A NaN or Inf in x, h0, c0, W_hh or W_hr of a bidirectional LSTM with projections reaches the
    same outputs and states as in torch.nn (the fused LSTMP build, on every device since v72)."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(5, 8, proj_size=3, num_layers=2, bidirectional=True)
    ours = tt.LSTM(5, 8, proj_size=3, num_layers=2, bidirectional=True)
    ours.load_state_dict(ref.state_dict())
    for bad in (float("nan"), float("inf")):
        x, h0, c0 = torch.randn(6, 3, 5), torch.randn(4, 3, 3), torch.randn(4, 3, 8)
        if where.startswith("weight"):
            for module in (ours, ref):
                with torch.no_grad():
                    getattr(module, where)[1, 2] = bad
        else:
            {"x": x[2, 1], "h0": h0[1, 2], "c0": c0[0, 0]}[where][0] = bad
        (y, (h, c)), (yr, (hr, cr)) = ours(x, (h0, c0)), ref(x, (h0, c0))
        for a, b in ((y, yr), (h, hr), (c, cr)):
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isinf(), b.isinf()), (where, bad)
            finite = a.isfinite()
            assert rel_error(a[finite], b[finite]) < 1e-5


def test_bad_projection_inputs_are_refused_and_the_module_stays_usable():
    with pytest.raises(ValueError, match="proj_size has to be smaller than hidden_size"):  # torch.nn's own check
        tt.LSTM(5, 7, proj_size=7)
    with pytest.raises(ValueError, match="proj_size"):
        tt.GRU(5, 7, proj_size=3)
    with pytest.raises(ValueError, match="package: built with proj_size=0, this module has proj_size=3"):
        tt.LSTM(13, 37, proj_size=3, package=built("lstm", 1, False))
    rnn = tt.LSTM(5, 7, proj_size=3, num_layers=2)
    x = torch.randn(4, 2, 5)
    with pytest.raises(ValueError, match=r"h0: expected shape \(2, 2, 3\)"):
        rnn(x, (torch.zeros(2, 2, 7), torch.zeros(2, 2, 7)))  # h0 of hidden_size, not proj_size
    with pytest.raises(ValueError, match=r"c0: expected shape \(2, 2, 7\)"):
        rnn(x, (torch.zeros(2, 2, 3), torch.zeros(2, 2, 3)))
    y, (h, c) = rnn(x)
    assert y.shape == (4, 2, 3) and h.shape == (2, 2, 3) and c.shape == (2, 2, 7)


@pytest.mark.parametrize("cls, theirs, kwargs, enforce_sorted", [
    (tt.LSTM, torch.nn.LSTM, dict(num_layers=2, bidirectional=True), False),
    (tt.GRU, torch.nn.GRU, dict(batch_first=True, bidirectional=True), True),
    (tt.RNN, torch.nn.RNN, dict(nonlinearity="relu", num_layers=2), False)])
def test_packed_sequences_match_torch(cls, theirs, kwargs, enforce_sorted):
    """pack_padded_sequence in, PackedSequence out: the same data, batch sizes and orders as
    torch.nn, states in the caller's row order, and the same gradients (of the input's data, the
    initial states and every parameter)."""
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    ref = theirs(5, 8, **kwargs).double()
    ours = cls(5, 8, **kwargs)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    batch_first = kwargs.get("batch_first", False)
    lengths = torch.tensor([7, 5, 5, 2, 1] if enforce_sorted else [3, 7, 1, 5, 5])
    x = torch.randn((5, 7, 5) if batch_first else (7, 5, 5))
    D, L = 2 if kwargs.get("bidirectional") else 1, kwargs.get("num_layers", 1)
    h0 = torch.randn(L * D, 5, 8)
    results = []
    for module, dtype in ((ours, torch.float32), (ref, torch.float64)):
        module.zero_grad()
        xs, hs = x.clone().to(dtype).requires_grad_(), h0.clone().to(dtype).requires_grad_()
        packed = pack_padded_sequence(xs, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
        hx = (hs, torch.zeros_like(hs)) if cls is tt.LSTM else hs
        out, states = module(packed, hx)
        hy = states[0] if cls is tt.LSTM else states
        (out.data.sum() + (hy * hy).sum()).backward()
        results.append((out, hy, xs.grad, hs.grad, {n: p.grad for n, p in module.named_parameters()}))
    (out, hy, dx, dh0, grads), (out_r, hy_r, dx_r, dh0_r, grads_r) = results
    assert torch.equal(out.batch_sizes, out_r.batch_sizes)
    for a, b in ((out.sorted_indices, out_r.sorted_indices), (out.unsorted_indices, out_r.unsorted_indices)):
        assert (a is None and b is None) or torch.equal(a, b)
    assert rel_error(out.data, out_r.data) < 1e-5 and rel_error(hy, hy_r) < 1e-5
    assert rel_error(dx, dx_r) < 1e-5 and rel_error(dh0, dh0_r) < 1e-5
    for name in grads_r:
        assert rel_error(grads[name], grads_r[name]) < 1e-5, name
    assert any(k[4] for k in ours._built)  # a variable-lengths build


def _side_by_side(ours, theirs, x, seed=0):
    """Forward and backward of both modules (theirs in float64) from the same RNG state; the
    outputs' and every parameter gradient's relative errors."""
    ours.zero_grad()
    theirs.zero_grad()
    torch.manual_seed(seed)
    y, _ = ours(x)
    torch.manual_seed(seed)
    yr, _ = theirs(x.double())
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed + 1))
    y.backward(dy)
    yr.backward(dy.double())
    errors = {"y": rel_error(y, yr)}
    for name, p in theirs.named_parameters():
        errors[name] = rel_error(getattr(ours, name).grad, p.grad)
    return errors


@pytest.mark.parametrize("cls, theirs, batch_first", [(tt.LSTM, torch.nn.LSTM, False), (tt.GRU, torch.nn.GRU, True)])
def test_dropout_between_layers_matches_torch(cls, theirs, batch_first):
    """dropout= in training: the same masks as torch.nn from the same seed (both draw them with
    F.dropout's RNG, layer by layer, on the time-major output also where the module is
    batch_first: drawn on the batch-major one they differed), outputs and gradients equal; eval
    runs the fused stack."""
    torch.manual_seed(0)
    ref = theirs(6, 9, num_layers=3, dropout=0.4, batch_first=batch_first).double()
    ours = cls(6, 9, num_layers=3, dropout=0.4, batch_first=batch_first)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn(7, 4, 6)
    errors = _side_by_side(ours, ref, x, seed=3)
    assert max(errors.values()) < 1e-5, errors
    assert {k[0:2] for k in ours._built} == {(6, 1), (9, 1)}  # layer 0, and one build for layers 1 and 2
    ours.eval()
    ref.eval()
    assert rel_error(ours(x)[0], ref(x.double())[0]) < 1e-5
    assert (6, 3) in {k[0:2] for k in ours._built}  # the fused stack


@pytest.mark.parametrize("cls, theirs, kwargs", [(tt.GRU, torch.nn.GRU, {}), (tt.LSTM, torch.nn.LSTM, dict(
    bidirectional=True, batch_first=True))])
def test_dropout_between_layers_of_packed_sequences_matches_torch(cls, theirs, kwargs):
    """dropout= on a PackedSequence (unsorted, rows of different lengths): torch.nn draws the masks
    over the packed rows, so the drop-ins do too; the same seed gives the same outputs and
    gradients, and leaves the RNG where torch.nn leaves it (they differed before, by 0.4)."""
    torch.manual_seed(0)
    ref = theirs(5, 8, num_layers=3, dropout=0.5, **kwargs).double()
    ours = cls(5, 8, num_layers=3, dropout=0.5, **kwargs)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.randn((4, 6, 5) if kwargs.get("batch_first") else (6, 4, 5))
    lengths = torch.tensor([3, 6, 2, 5])
    results = []
    for module, dtype in ((ours, torch.float32), (ref, torch.float64)):
        xs = x.detach().to(dtype).requires_grad_()
        packed = pack_padded_sequence(xs, lengths, batch_first=kwargs.get("batch_first", False), enforce_sorted=False)
        torch.manual_seed(7)
        out, _ = module(packed)
        after = torch.rand(3)
        out.data.pow(2).sum().backward()
        results.append((out.data, after, xs.grad, {n: p.grad for n, p in module.named_parameters()}))
    (y, after, dx, grads), (y_r, after_r, dx_r, grads_r) = results
    assert torch.equal(after, after_r)
    assert rel_error(y, y_r) < 1e-5 and rel_error(dx, dx_r) < 1e-5
    for name in grads_r:
        assert rel_error(grads[name], grads_r[name]) < 1e-5, name


@pytest.mark.parametrize("cls, theirs, kwargs", [
    (tt.LSTM, torch.nn.LSTM, dict(num_layers=2)), (tt.GRU, torch.nn.GRU, dict(bidirectional=True)),
    (tt.RNN, torch.nn.RNN, dict(nonlinearity="relu"))])
def test_bias_false_matches_torch(cls, theirs, kwargs):
    torch.manual_seed(0)
    ref = theirs(5, 8, bias=False, **kwargs).double()
    ours = cls(5, 8, bias=False, **kwargs)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    assert not any("bias" in name for name, _ in ours.named_parameters())
    errors = _side_by_side(ours, ref, torch.randn(6, 3, 5))
    assert max(errors.values()) < 1e-5, errors


def test_custom_rnn_takes_bias_false_and_dropout():
    ours = tt.CustomRNN("gru", 5, 8, num_layers=2, bias=False, dropout=0.3)
    ref = torch.nn.GRU(5, 8, num_layers=2, bias=False, dropout=0.3).double()
    assert sorted(n for n, _ in ours.named_parameters()) == sorted(n for n, _ in ref.named_parameters())
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    errors = _side_by_side(ours, ref, torch.randn(6, 3, 5), seed=5)
    assert max(errors.values()) < 1e-5, errors
    with pytest.raises(ValueError, match="dropout: expected a probability"):
        tt.CustomRNN("gru", 5, 8, dropout=2)


def test_a_batch_of_short_cpu_tiles_builds_a_few_rows_more():
    """On a CPU a batch whose register tiles would be one row (7 rows of an LSTM with 16-unit
    panels) gets kernels for 8 and runs padded (``schedules.cpu.padded_batch``, ``config.rows``:
    2x faster at H = 512); the build still takes batches of at most 7, and the outputs and
    gradients match torch.nn."""
    from tvmrnn.device import host_target
    from tvmrnn.schedules.cpu import padded_batch
    assert padded_batch(7, 4, 64, host_target()) == 8 and padded_batch(6, 4, 64, host_target()) == 6
    torch.manual_seed(0)
    ref = torch.nn.LSTM(5, 64).double()
    ours = tt.LSTM(5, 64)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    for batch in (7, 3):
        errors = _side_by_side(ours, ref, torch.randn(4, batch, 5))
        assert max(errors.values()) < 1e-5, (batch, errors)
    assert [k[2] for k in ours._built] == [7]
    rnn = next(iter(ours._built.values()))
    assert (rnn.config.batch_size, rnn.config.rows) == (7, 8)


def test_batches_whose_tiles_leave_the_fma_units_idle_build_a_few_rows_more():
    """Beyond one- or two-row tiles, a batch pads (up to an eighth more rows) where its steps'
    register tiles would hold fewer accumulators than keep the FMA units busy (the device model's
    ``busy_accumulators``) and a few rows more fill them: an AVX-512 LSTM at H = 200 takes tiles
    of 2 vectors, so 129 rows (3-row tiles, 6 accumulators) run as 130 (10-row tiles; on a
    2-core Zen 5, inference 21.5 -> 16.7 ms, notes v74), where a full tile stays as it is and a
    batch too small to fill one is not padded (the same time, more rows)."""
    import tvm
    from tvmrnn.schedules.cpu import padded_batch
    spr = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16})
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "znver3", "num-cores": 16})
    assert [padded_batch(n, 4, 200, spr) for n in (129, 57, 37, 128, 60, 1, 3, 20)] == [130, 60, 40, 128, 60, 1, 3, 20]
    # v67's short tiles; 4 vectors: 3 rows fill 12, but the backward's GEMMs of 2-vector tiles
    # would have 3 rows too (v80: padded_batch weighs them): 129 -> 130
    assert [padded_batch(n, 4, 512, spr) for n in (7, 13, 14, 129, 20)] == [8, 15, 15, 130, 20]
    assert [padded_batch(n, 3, 292, spr) for n in (129, 57, 20, 64)] == [130, 60, 20, 64]  # (the GRU's padded panels)
    assert [padded_batch(n, 4, 256, avx2) for n in (9, 27, 8, 1)] == [10, 28, 8, 1]


def test_smaller_batches_reuse_a_build_and_larger_ones_build_once():
    """A batch up to a build's size runs on it (padded): a training loop's short last batch and a
    batch-1 evaluation do not build again; a larger batch builds once, and with rebuild=False it
    is an error instead."""
    torch.manual_seed(0)
    ref = torch.nn.LSTM(5, 8).double()
    ours = tt.LSTM(5, 8)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    for batch in (6, 4, 1, 6):
        errors = _side_by_side(ours, ref, torch.randn(3, batch, 5))
        assert max(errors.values()) < 1e-5, (batch, errors)
    assert [k[2] for k in ours._built] == [6]
    ours(torch.randn(3, 9, 5))
    assert sorted(k[2] for k in ours._built) == [6, 9]
    ours(torch.randn(3, 7, 5))  # the smallest build that takes 7 rows: 9
    assert sorted(k[2] for k in ours._built) == [6, 9]
    fixed = tt.LSTM(5, 8, rebuild=False)
    fixed(torch.randn(3, 4, 5))
    fixed(torch.randn(3, 2, 5))
    with pytest.raises(ValueError, match="a batch of 5 rows; this module was built for at most 4 and rebuild=False"):
        fixed(torch.randn(3, 5, 5))


@pytest.mark.parametrize("theirs,kwargs", [(torch.nn.LSTM, {}), (torch.nn.GRU, {}), (torch.nn.RNN, {}),
                                           (torch.nn.LSTM, {"proj_size": 3})])
def test_autocast_and_half_modules_return_what_torch_nn_returns(theirs, kwargs):
    """Under torch.autocast the drop-in runs its fp32 kernels (a half input is widened) and returns
    the dtype torch.nn's module returns there (PyTorch's CPU autocast casts the padded LSTM and
    Elman RNNs and the padded LSTM to bf16, not the GRU nor a packed LSTM), so the layers after it get what they would
    get; a module made half (``module.bfloat16()``) returns half, with gradients back to its half
    parameters. The values are the fp32 ones, rounded."""
    torch.manual_seed(0)
    ref = theirs(5, 8, **kwargs)
    ours = getattr(tt, theirs.__name__)(5, 8, **kwargs)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 5)
    y32 = ref(x)[0]
    packed = pack_padded_sequence(x, [4, 2, 3], enforce_sorted=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for inp in (x, x.bfloat16(), packed):
            if theirs is torch.nn.GRU and inp is not packed and inp.dtype == torch.bfloat16:
                continue  # torch.nn's GRU is not autocast on CPUs: a bf16 input meets fp32 weights (an error)
            y, states = ours(inp)
            try:
                yr, states_r = ref(inp)
            except RuntimeError as err:  # PyTorch's own bf16 LSTM through oneDNN, on a CPU without AVX512-BF16
                if "primitive descriptor" not in str(err):
                    raise
                pytest.skip(f"torch.nn's own {theirs.__name__} does not run under CPU bf16 autocast here: {err}")
            y, yr = (y.data, yr.data) if inp is packed else (y, yr)
            assert y.dtype == yr.dtype, (inp is packed, inp.dtype if inp is not packed else None)
            for s, sr in zip(states if isinstance(states, tuple) else (states,),
                             states_r if isinstance(states_r, tuple) else (states_r,)):
                assert s.dtype == sr.dtype
            if inp is x:
                assert rel_error(y.float(), y32) < 1e-2  # fp32 kernels, the result rounded (bf16: 2^-9)
    half, half_ref = ours.bfloat16(), ref.bfloat16()
    yh = half(x.bfloat16())[0]
    assert yh.dtype == half_ref(x.bfloat16())[0].dtype == torch.bfloat16
    yh.float().sum().backward()
    assert all(p.grad is not None and p.grad.dtype == torch.bfloat16 for p in half.parameters())
    assert rel_error(yh.float(), y32) < 3e-2  # bf16 parameters against fp32 ones


def test_gradients_taken_with_create_graph_match_and_a_second_derivative_is_refused():
    """A gradient taken with ``create_graph=True`` (a gradient penalty's first step) matches
    torch.nn's; differentiating it again raises, as through cuDNN's RNNs, rather than the
    gradient silently not requiring grad (then "element 0 of tensors does not require grad")."""
    torch.manual_seed(0)
    ref = torch.nn.GRU(5, 7, 2, bidirectional=True)
    ours = tt.GRU(5, 7, 2, bidirectional=True)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3, 5, requires_grad=True)
    g, = torch.autograd.grad(ours(x)[0].square().sum(), x, create_graph=True)
    gr, = torch.autograd.grad(ref(x)[0].square().sum(), x, create_graph=True)
    assert rel_error(g, gr) < 1e-5
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()
    assert rel_error(ours(x)[0], ref(x)[0]) < 1e-5  # still usable


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_torch_func_grad_over_a_drop_in_matches_torch_nn(cls):
    """``torch.func.grad`` (functorch's transforms, e.g. over ``functional_call``) takes the
    drop-ins as it takes torch.nn's RNNs: the same gradients, of the parameters and of the input.
    ``vmap`` and ``jacrev`` raise, as over torch.nn's (no batching rule for aten::lstm either), and
    so does ``grad`` of ``grad`` (no second derivative, as through cuDNN's RNNs)."""
    torch.manual_seed(0)
    ref = getattr(torch.nn, cls)(5, 7, 2, bidirectional=True)
    ours = getattr(tt, cls)(5, 7, 2, bidirectional=True)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3, 5)
    params = {k: v.detach() for k, v in ref.named_parameters()}

    def loss(module):
        return lambda p, x: torch.func.functional_call(module, p, (x,))[0].square().sum()
    got, want = torch.func.grad(loss(ours), argnums=(0, 1))(params, x), torch.func.grad(loss(ref), argnums=(0, 1))(params, x)
    assert rel_error(got[1], want[1]) < 1e-5
    for name in params:
        assert rel_error(got[0][name], want[0][name]) < 1e-5, name
    with pytest.raises(RuntimeError, match="vmap"):
        torch.func.vmap(lambda x: ours(x)[0])(torch.randn(2, 6, 3, 5))
    with pytest.raises(RuntimeError, match="jacrev"):
        torch.func.jacrev(lambda x: ours(x)[0])(x)
    # a second derivative raises (unwrapped, the outer level took the gradients for constants: zeros)
    with pytest.raises(RuntimeError, match="second derivative"):
        torch.func.grad(lambda x: torch.func.grad(loss(ours), argnums=1)(params, x).square().sum())(x)
    assert rel_error(ours(x)[0], ref(x)[0]) < 1e-5  # still usable


def test_malformed_packed_sequences_are_a_clear_error_and_the_module_stays_usable():
    """A PackedSequence whose batch_sizes do not describe its data (``pack_padded_sequence`` given a
    length longer than the padded sequence; batch sizes that grow, or are zero; batch_sizes not on
    the host) is refused with a ValueError saying so, not an IndexError from inside the module."""
    from torch.nn.utils.rnn import PackedSequence
    torch.manual_seed(0)
    ours = tt.LSTM(5, 7)
    x = torch.randn(6, 3, 5)
    with pytest.raises(ValueError, match="add up to 15 rows, but its data has 14"):
        ours(pack_padded_sequence(x, torch.tensor([7, 6, 2]), enforce_sorted=False))
    good = pack_padded_sequence(x, torch.tensor([6, 4, 2]))
    for sizes in ([1, 2, 3, 3, 1, 1, 1], [3, 3, 0, 3, 3]):
        with pytest.raises(ValueError, match="positive and non-increasing"):
            ours(PackedSequence(good.data[:sum(sizes)], torch.tensor(sizes)))
    with pytest.raises(ValueError, match="1-d int64 CPU tensor"):
        ours(PackedSequence(good.data, good.batch_sizes.to(torch.int32)))
    ref = torch.nn.LSTM(5, 7)
    ref.load_state_dict(ours.state_dict())
    assert rel_error(ours(good)[0].data, ref(good)[0].data) < 1e-5


@pytest.mark.parametrize("theirs", [torch.nn.LSTM, torch.nn.GRU])
def test_float64_modules_and_empty_batches_behave_as_torch_nn(theirs):
    """What the fp32 kernels do not run goes to torch.nn's own implementation: a float64 module
    (exact, gradients too) and a batch of no rows (empty outputs, a backward that works); a
    custom cell's module, which has no torch.nn implementation, returns empty outputs and
    refuses float64 with a TypeError."""
    torch.manual_seed(0)
    ref = theirs(5, 8, num_layers=2).double()
    ours = getattr(tt, theirs.__name__)(5, 8, num_layers=2).double()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3, 5, dtype=torch.float64, requires_grad=True)
    y, yr = ours(x)[0], ref(x)[0]
    assert y.dtype == torch.float64 and torch.equal(y, yr)
    (gx,) = torch.autograd.grad(y.sum(), x)
    (gr,) = torch.autograd.grad(yr.sum(), x)
    assert torch.equal(gx, gr)
    ours.float()
    empty = torch.randn(0, 6, 5, requires_grad=True)
    ours.batch_first = ref.batch_first = True
    y, states = ours(empty)
    yr, states_r = ref.float()(empty)
    assert y.shape == yr.shape == (0, 6, 8)
    assert (states[0] if isinstance(states, tuple) else states).shape == (2, 0, 8)
    y.sum().backward()
    assert empty.grad.shape == empty.shape
    custom = tt.CustomRNN("gru", 5, 8)
    ye, he = custom(torch.randn(6, 0, 5))
    assert ye.shape == (6, 0, 8) and he.shape == (1, 0, 8)
    with pytest.raises(TypeError, match="runs in float32.*module.float"):
        custom.double()(torch.randn(6, 2, 5, dtype=torch.float64))
    # the meta device (deferred initialisation, shape inference): shapes as torch.nn's
    meta = getattr(tt, theirs.__name__)(5, 8, num_layers=2, bidirectional=True, device="meta")
    y, states = meta(torch.randn(6, 3, 5, device="meta"))
    assert y.shape == (6, 3, 16) and y.device.type == "meta"
    assert (states[0] if isinstance(states, tuple) else states).shape == (4, 3, 8)
    ye, he = tt.CustomRNN("gru", 5, 8).to("meta")(torch.randn(6, 5, device="meta"))  # (unbatched)
    assert ye.shape == (6, 8) and he.shape == (1, 8) and ye.device.type == "meta"


def test_deepcopy_and_pickle(tmp_path):
    """``copy.deepcopy`` (EMA, SWA) gives a module with its own parameters that shares the builds;
    ``torch.save`` of a whole model keeps no build (the copy builds again, or reloads its package
    from its file); a module on an RNN built in this process says how to make it picklable."""
    import copy
    import io
    torch.manual_seed(0)
    ours = tt.GRU(I, H, package=built("gru", 1, False))
    x = torch.randn(4, N, I)
    y = ours(x)[0]
    twin = copy.deepcopy(ours)
    assert twin._package is ours._package and twin._handle != ours._handle and torch.equal(twin(x)[0], y)
    with torch.no_grad():
        twin.weight_hh_l0.add_(1.0)
    assert torch.equal(ours(x)[0], y) and not torch.equal(twin(x)[0], y)
    with pytest.raises(TypeError, match="pickle: this module runs on an RNN built in this process"):
        torch.save(ours, io.BytesIO())
    path = str(tmp_path / "gru.so")
    ours._package.export(path)
    on_file = tt.GRU(I, H, package=tvmrnn.load(path))
    on_file.load_state_dict(ours.state_dict())
    buffer = io.BytesIO()
    torch.save(on_file, buffer)
    buffer.seek(0)
    back = torch.load(buffer, weights_only=False)
    assert back._package.package_path == path and torch.equal(back(x)[0], y)


def test_bad_states_are_a_clear_error():
    """hx of the wrong kind (a tensor for an LSTM, a tuple for a GRU) is a TypeError naming hx, and
    the module runs afterwards."""
    lstm, gru = tt.LSTM(5, 8), tt.GRU(5, 8)
    x, h = torch.randn(4, 3, 5), torch.zeros(1, 3, 8)
    with pytest.raises(TypeError, match=r"hx: expected a tuple \(h0, c0\)"):
        lstm(x, h)
    with pytest.raises(TypeError, match="hx: expected a tensor h0"):
        gru(x, (h,))
    assert lstm(x, (h, h))[0].shape == gru(x, h)[0].shape == (4, 3, 8)
    # initial states of another dtype than the input's: torch.nn refuses them, so do the drop-ins
    for bad in (h.double(), h.long()):
        with pytest.raises(TypeError, match="hx: h0 is torch"):
            gru(x, bad)
        with pytest.raises(TypeError, match="hx: c0 is torch"):
            lstm(x, (h, bad))
    assert lstm(x, (h, h))[0].shape == gru(x, h)[0].shape == (4, 3, 8)


@pytest.mark.parametrize("cls", [tt.LSTM, tt.GRU])
def test_autograd_checks_what_the_backward_depends_on_as_torch_nn_does(cls):
    """A training forward's input, initial states and parameters are saved for autograd's checks,
    as torch.nn saves them: one changed in place before the backward is a RuntimeError (a gradient of
    other values before), a second backward without ``retain_graph`` too (it doubled the gradients
    before); with ``retain_graph`` the second backward runs and adds the same gradients again."""
    torch.manual_seed(0)
    ours = cls(5, 8, num_layers=2)
    theirs = getattr(torch.nn, cls.__name__)(5, 8, num_layers=2)
    theirs.load_state_dict(ours.state_dict())
    x0 = torch.randn(6, 3, 5)
    h0 = torch.randn(2, 3, 8)
    hx = (h0, torch.randn(2, 3, 8)) if cls is tt.LSTM else h0
    for module in (theirs, ours):
        for change in ("x", "h0", "weight"):
            x, h = x0.clone(), (tuple(t.clone() for t in hx) if isinstance(hx, tuple) else hx.clone())
            y, _ = module(x, h)
            with torch.no_grad():
                {"x": x, "h0": h[0] if isinstance(h, tuple) else h, "weight": module.weight_hh_l1}[change].mul_(1.0)
            with pytest.raises(RuntimeError, match="modified by an inplace operation"):
                y.sum().backward()
            module.zero_grad()
        y, _ = module(x0, hx)
        y.sum().backward()
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            y.sum().backward()
        module.zero_grad()
        y, _ = module(x0, hx)
        y.sum().backward(retain_graph=True)
        once = module.weight_ih_l0.grad.clone()
        y.sum().backward()
        torch.testing.assert_close(module.weight_ih_l0.grad, 2 * once)
        module.zero_grad()
    y, _ = ours(x0, hx)
    y.sum().backward()  # (usable afterwards)
    ref, _ = theirs(x0, hx)
    ref.sum().backward()
    assert rel_error(ours.weight_hh_l0.grad, theirs.weight_hh_l0.grad) < 1e-5


def test_cpu_bf16_autocast_runs_bf16_projections_where_the_cpu_has_them():
    """Where torch.nn computes in bf16 on a CPU (under bf16 autocast every RNN's GEMMs, the GRU's
    too though it returns fp32; a bf16 module), the drop-in takes a build with bf16 projections
    if this CPU has AVX512-BF16 where it pays (and the hidden size 16-unit panels: the rule
    ``build`` applies), else its fp32 build, which fp32 calls then share. Either way the result is
    within bf16's rounding of torch.nn's fp32 one."""
    from tvmrnn.torch import _cpu_bf16_pays
    torch.manual_seed(0)
    for theirs, H in ((torch.nn.LSTM, 32), (torch.nn.GRU, 32), (torch.nn.LSTM, 20)):
        ref = theirs(12, H)
        ours = getattr(tt, theirs.__name__)(12, H)
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(7, 3, 12)
        y32 = ref(x)[0]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = ours(x)[0]
        expected = _cpu_bf16_pays() and H % 16 == 0
        assert [k[5] for k in ours._built] == [expected], (theirs.__name__, H)
        assert [rnn.config.options.bf16_projections for rnn in ours._built.values()] == [expected]
        assert rel_error(y.float(), y32) < 1e-2
        y.float().sum().backward()  # training through it: the fp32 backward
        assert ours.weight_ih_l0.grad is not None
        assert rel_error(ours(x)[0], y32) < 1e-5  # outside autocast: the fp32 build
        assert len(ours._built) == 1 + expected  # (refused: the one fp32 build served both)


def test_bf16_preference_is_per_thread_and_yields_to_rebuild_false():
    """The drop-in's choice of a bf16 build is per call and thread: a thread running under bf16
    autocast never hands another thread's fp32 call a bf16 build; with ``rebuild=False`` an fp32
    build that fits serves an autocast call; a module's own CPU ``target=`` without AVX512-BF16
    keeps fp32 builds under autocast (no error)."""
    import threading
    torch.manual_seed(0)
    ref = torch.nn.LSTM(8, 32)
    ours = tt.LSTM(8, 32)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 3, 8)
    y32 = ref(x)[0].detach()
    errors = []

    def fp32_calls():
        for _ in range(40):
            with torch.no_grad():
                if rel_error(ours(x)[0], y32) > 1e-5:
                    errors.append("fp32 call got a bf16 result")

    def bf16_calls():
        for _ in range(40):
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                ours(x)
    threads = [threading.Thread(target=fp32_calls), threading.Thread(target=bf16_calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    fixed = tt.GRU(8, 32, rebuild=False)
    fixed(torch.randn(5, 4, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fixed(torch.randn(5, 2, 8))[0].shape == (5, 2, 32)
    # AVX512-BF16 without the gain (Intel's Xeons without AMX: the dot products no faster than fp32
    # FMAs, so the rounding makes the bf16 build slower) keeps fp32; AMD's Zen 4 and later, and
    # Xeons with AMX (whose tiles run the GEMMs), take bf16
    from tvmrnn.torch import _bf16_refused, _cpu_bf16_pays
    from tvmrnn.schedules import bf16
    assert not _cpu_bf16_pays(json.dumps({"kind": "llvm", "mcpu": "cooperlake", "num-cores": 16}))
    spr = json.dumps({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16})
    with mock.patch.object(bf16, "request_amx", lambda: True):  # (as on a host with AMX: this one need not have it)
        assert _cpu_bf16_pays.__wrapped__(spr)
    assert _cpu_bf16_pays(json.dumps({"kind": "llvm", "mcpu": "znver4", "num-cores": 16}))
    # where the OS refuses AMX's tiles, the AMX target keeps fp32 (its bf16 build could not run)
    refused = mock.patch.object(bf16, "request_amx", lambda: False)
    with refused:
        assert not _cpu_bf16_pays.__wrapped__(spr)
    # what a build of given sizes refuses, by build's own rule (panels; a large state is no reason)
    sizes = dict(input_size=8, num_layers=1, bidirectional=True, batch_first=False)
    assert _bf16_refused("lstm", spr, hidden_size=32, batch_size=4, **sizes) is None
    assert "column panels" in _bf16_refused("lstm", spr, hidden_size=20, batch_size=4, **sizes)
    assert _bf16_refused("lstm", spr, hidden_size=2048, batch_size=256, **sizes) is None
    other = tt.GRU(8, 32, target={"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if cpu_has("avx512f"):
            other(torch.randn(5, 2, 8))
        else:  # (an AVX-512 build on a CPU without it: refused by name at its first run, not a crash)
            with pytest.raises(RuntimeError, match="avx512f.*which this CPU does not have"):
                other(torch.randn(5, 2, 8))
    assert [k[5] for k in other._built] == [False]


def test_parameters_are_one_buffer_that_packing_reads_in_place(monkeypatch):
    """On the CPU a drop-in's parameters are consecutive views of one float32 buffer in the
    kernels' order (``flatten_parameters``: at construction, after ``load_state_dict``, ``.to()``,
    deepcopy and optimizer steps), so that packing them at every call reads them in place
    (``runtime.rnn.consecutive_views``) rather than joining them first. A parameter replaced with
    ``p.data = ...`` makes packing join them again, with the same results; bias=False (zeros stand
    in) too. Outputs and gradients match torch.nn either way."""
    import copy

    import numpy as np

    from tvmrnn.runtime.rnn import consecutive_views

    def flat(m):
        return consecutive_views([getattr(m, n, None) for n in m._op_names]) is not None

    theirs = torch.nn.LSTM(I, H, num_layers=2, bidirectional=True)
    ours = tt.LSTM(I, H, num_layers=2, bidirectional=True)
    assert flat(ours) and flat(tt.GRU(I, H)) and flat(tt.RNN(I, H, nonlinearity="relu"))
    assert flat(tt.CustomRNN("lstm", I, H, num_layers=2))
    ours.load_state_dict(theirs.state_dict())
    assert flat(ours) and flat(copy.deepcopy(ours))
    assert flat(ours.double().float())  # new storages, flattened again
    joins = []
    concatenate = np.concatenate
    monkeypatch.setattr(np, "concatenate", lambda *a, **k: joins.append(1) or concatenate(*a, **k))
    x = torch.randn(7, N, I, dtype=torch.float64)

    def step(module):
        module.zero_grad()
        y, (hy, cy) = module(x.to(module.weight_ih_l0.dtype))
        (y.sum() + hy.sum() + cy.sum()).backward()
        return y.double(), {n: p.grad.double() for n, p in module.named_parameters()}
    torch.optim.SGD(ours.parameters(), lr=0.1).step()  # (no gradients yet: nothing moves)
    y, grads = step(ours)
    assert not joins and flat(ours)
    torch.optim.SGD(ours.parameters(), lr=0.1).step()
    assert flat(ours)
    theirs.load_state_dict(ours.state_dict())
    y, grads = step(ours)
    y_ref, grads_ref = step(theirs.double())
    assert rel_error(y, y_ref) < 1e-5 and all(rel_error(grads[n], grads_ref[n]) < 1e-4 for n in grads)
    ours.weight_hh_l1.data = ours.weight_hh_l1.data.clone()  # its own storage now: joined again
    assert not flat(ours)
    y2, grads2 = step(ours)
    assert joins and rel_error(y2, y_ref) < 1e-5 and all(rel_error(grads2[n], grads_ref[n]) < 1e-4 for n in grads)
    assert not flat(tt.LSTM(I, H, bias=False))
    shared = tt.GRU(I, H).share_memory()  # (Hogwild: each parameter's storage shared, left as it is)
    assert all(p.is_shared() for p in shared.parameters())
    # a layer by layer run (dropout in training) packs each layer from the middle of the buffer:
    # layer 1 starts 660 bytes in (4-byte aligned only)
    odd, theirs = tt.GRU(4, 5, num_layers=2, dropout=0.5), torch.nn.GRU(4, 5, num_layers=2, dropout=0.5)
    theirs.load_state_dict(odd.state_dict())
    assert flat(odd) and (odd.weight_ih_l1.data_ptr() - odd.weight_ih_l0.data_ptr()) % 16
    x = torch.randn(7, 3, 4)
    odd(x)[0].sum().backward()
    odd.eval(), theirs.eval()
    assert rel_error(odd(x)[0].detach(), theirs(x)[0].detach()) < 1e-5


def test_batch_first_changed_after_a_call_is_read_again():
    """torch.nn reads ``batch_first`` at every call; a drop-in whose ``batch_first`` changes after
    its first call builds for the new layout instead of running the old build on it (at T == N
    that gave wrong outputs silently)."""
    torch.manual_seed(0)
    ours, ref = tt.GRU(5, 8), torch.nn.GRU(5, 8)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(4, 4, 5)
    ours(x)
    ours.batch_first = ref.batch_first = True
    for a, b in zip(ours(x), ref(x)):
        assert rel_error(a, b) < 1e-5
    x = torch.randn(3, 6, 5)  # (N, T, F) now
    assert rel_error(ours(x)[0], ref(x)[0]) < 1e-5


def test_an_unbatched_input_with_a_batched_state_names_the_shape_given():
    """An unbatched (2-d) input takes 2-d states, as torch.nn; a 3-d h0 is a ValueError naming the
    shape the caller passed (it named the shape after unsqueezing, (1, 1, 1, 8))."""
    ours = tt.GRU(5, 8)
    with pytest.raises(ValueError, match=r"h0 must be 2-d too .*got shape \(1, 1, 8\)"):
        ours(torch.randn(6, 5), torch.zeros(1, 1, 8))
    y, h = ours(torch.randn(6, 5), torch.zeros(1, 8))
    assert y.shape == (6, 8) and h.shape == (1, 8)
