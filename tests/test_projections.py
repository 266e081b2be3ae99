"""LSTMs with projections (``tvmrnn.build(..., proj_size=P)``, torch.nn's ``proj_size``): the
fused step on a P-wide state and its projection, forward and backward, against torch.nn in
float64 at odd sizes (``test_rnn._check``, ``test_lengths._check``); the gradient of ``W_hr`` by
central differences too; packages; and the sizes and cells it refuses."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tvmrnn
import test_lengths
import test_rnn
from conftest import I, built, rel_error, torch_module


@pytest.mark.parametrize("num_layers,bidirectional,batch_first,hidden,proj,rows", [
    (1, False, False, 37, 11, None),  # odd sizes, P not a whole vector
    (2, True, True, 24, 16, 3),  # a whole vector; fewer rows than the build (padded)
    (3, False, False, 20, 1, None),  # one feature of state
], ids=["1uni-odd", "2bidir-batch_first-padded-rows", "3uni-p1"])
def test_projections_match_torch(num_layers, bidirectional, batch_first, hidden, proj, rows, rng):
    test_rnn._check("lstm", num_layers, bidirectional, batch_first, 7, rng, hidden=hidden, batch=5, rows=rows,
                    proj_size=proj, tol=1e-5)


def test_projections_without_initial_states_match_torch(rng):
    test_rnn._check("lstm", 2, True, False, 5, rng, hidden=19, with_states=False, proj_size=6, tol=1e-5)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_projections_with_lengths_match_torch_packed_sequences(bidirectional):
    """Rows of different lengths: a row that has ended keeps its projected state (the reverse
    direction starts at each row's own last step); NaN past the lengths reaches nothing."""
    for pad in (None, np.nan):
        test_lengths._check("lstm", 2, bidirectional, False, [3, 6, 1, 4], T=6, hidden=21, proj_size=5,
                            pad_value=pad)
    test_lengths._check("lstm", 1, bidirectional, True, torch.tensor([2, 5, 5]), T=5, hidden=21, proj_size=5,
                        as_array=torch.from_numpy, rows=3)
    if bidirectional:  # both directions in one launch a step (CPUs of 8 cores or more by default)
        test_lengths._check("lstm", 2, True, False, [3, 6, 1, 4], T=6, hidden=21, proj_size=5, pad_value=np.nan,
                            options=tvmrnn.BuildOptions(variable_lengths=True, stack_directions=True))


def test_projection_gradient_matches_central_differences():
    """The gradient of ``W_hr`` (and of ``W_hh``, which multiplies the projected state) along a
    random direction, against central differences of the fp32 passes' loss (step 1e-2: the
    loss is smooth and its third derivative small at these sizes)."""
    torch.manual_seed(1)
    ref = torch.nn.LSTM(4, 13, proj_size=5)
    rnn = built("lstm", 1, False, False, input_size=4, hidden_size=13, batch_size=3, proj_size=5)
    params = {k: v.detach().double().numpy() for k, v in ref.state_dict().items()}
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, 3, 4)).astype(np.float32)
    dy = rng.standard_normal((9, 3, 5)).astype(np.float32)

    def loss(p):
        y = rnn.forward(rnn.pack_weights({k: v.astype(np.float32) for k, v in p.items()}), x)[0]
        return float((y.astype(np.float64) * dy).sum())
    w = rnn.pack_weights({k: v.astype(np.float32) for k, v in params.items()})
    grads = rnn.backward(w, rnn.forward_train(w, x)[3], dy)
    for name in ("weight_hr_l0", "weight_hh_l0"):
        v = rng.standard_normal(params[name].shape)
        eps = 1e-2
        plus, minus = dict(params), dict(params)
        plus[name], minus[name] = params[name] + eps * v, params[name] - eps * v
        numeric = (loss(plus) - loss(minus)) / (2 * eps)
        analytic = float((grads[name].astype(np.float64) * v).sum())
        assert abs(numeric - analytic) <= 2e-3 * max(1.0, abs(analytic)), (name, numeric, analytic)


def test_projections_take_fewer_multiply_adds_a_step():
    """The recurrent step's GEMM reduces over the P projected features, and the projection is a
    GEMM of its own (P outputs over H): no H x H recurrence (the drop-in's old reformulation)."""
    rnn = built("lstm", 1, False, False, input_size=I, hidden_size=24, batch_size=5, proj_size=16)
    names = set(rnn.programs["forward"].kernels)
    assert any(n.startswith("recurrent_step_lstm_infer_n5_h24_s16") for n in names), names
    assert any(n.startswith("projection_step_n5_h24_proj16") for n in names), names
    assert rnn.config.layout.slot(0, 0, "weight_hh").torch_shape == (96, 16)
    assert rnn.config.layout.slot(0, 0, "weight_hr").torch_shape == (16, 24)


def test_a_package_with_projections_round_trips(tmp_path, rng):
    rnn = built("lstm", 2, True, False, input_size=I, hidden_size=24, batch_size=5, proj_size=16)
    path = tmp_path / "lstmp.so"
    rnn.export(path)
    loaded = tvmrnn.load(str(path))
    assert loaded.config.proj_size == 16 and loaded.config.layout == rnn.config.layout
    torch.manual_seed(0)
    params = tvmrnn.params_from_torch(torch_module("lstm", I, 24, 2, True, False, proj_size=16))
    x = rng.standard_normal((6, 5, I)).astype(np.float32)
    for a, b in zip(rnn.forward(rnn.pack_weights(params), x), loaded.forward(loaded.pack_weights(params), x)):
        np.testing.assert_array_equal(a, b)
    assert "proj_size=16" in repr(loaded)


@pytest.mark.parametrize("cell,kwargs,match", [
    ("lstm", dict(proj_size=24), r"proj_size: must be smaller than hidden_size \(24\), got 24"),
    ("lstm", dict(proj_size=-1), "proj_size"),
    ("lstm", dict(proj_size=2.5), "proj_size"),
    ("gru", dict(proj_size=8), "proj_size: a gru reads h_\\(t-1\\) outside its gates"),
    ("lstm", dict(proj_size=8, target="nvidia/nvidia-h100", dtype="float16"), "proj_size: projections run in fp32"),
    ("lstm", dict(proj_size=8, target="nvidia/nvidia-h100", allow_tf32=True), "proj_size: with allow_tf32"),
    ("lstm", dict(proj_size=8, options=tvmrnn.BuildOptions(bf16_projections=True)), "proj_size: projections run in fp32"),
])
def test_bad_projections_are_refused(cell, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        tvmrnn.build(cell, input_size=I, hidden_size=24, batch_size=2, cache=False, tuning_logs=False, **kwargs)


@pytest.mark.parametrize("options", [
    tvmrnn.BuildOptions(time_loop_regions=True),  # a time loop as one parallel region: two kernels a step
    tvmrnn.BuildOptions(stack_directions=True),  # both directions' steps in one launch (stacked kernels)
    tvmrnn.BuildOptions(weight_panels=False, gradient_panels=False),
    tvmrnn.BuildOptions(interleave_projections=False, chunk_steps=(3, 1)),
], ids=["regions", "stack", "no-panels", "projections-first-chunks-3-1"])
def test_projections_match_torch_with_other_build_options(options, rng):
    test_rnn._check("lstm", 2, True, False, 7, rng, hidden=40, batch=4, proj_size=17, tol=1e-5, options=options)


def test_a_drop_in_runs_on_a_projection_package():
    """``tvmrnn.torch.LSTM(proj_size=P, package=...)`` runs on a build with the same projections
    (a package of another proj_size is refused, naming it)."""
    import tvmrnn.torch as tt
    rnn = built("lstm", 2, True, False, input_size=I, hidden_size=24, batch_size=5, proj_size=16)
    torch.manual_seed(0)
    ref = torch.nn.LSTM(I, 24, num_layers=2, bidirectional=True, proj_size=16)
    ours = tt.LSTM(I, 24, num_layers=2, bidirectional=True, proj_size=16, package=rnn)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 4, I)
    (y, (h, c)), (yr, (hr, cr)) = ours(x), ref(x)
    assert y.shape == (6, 4, 32) and h.shape == (4, 4, 16) and c.shape == (4, 4, 24)
    for a, b in ((y, yr), (h, hr), (c, cr)):
        assert float((a - b).abs().max()) < 1e-5
    with pytest.raises(ValueError, match="package: built with proj_size=16, this module has proj_size=8"):
        tt.LSTM(I, 24, num_layers=2, bidirectional=True, proj_size=8, package=rnn)


def _gated(x, h, h_prev, c_prev, p):
    """A cell whose gate gradients differ between the input and recurrent sides (the recurrent
    projection of ``n`` is gated by ``f``) and that reads h_(t-1) through its gates alone."""
    from tvm import tirx
    f = tirx.sigmoid(x["f"] + h["f"])
    return f * tirx.tanh(x["n"] + f * h["n"]), None


@pytest.mark.parametrize("cell", ["rnn_tanh", "rnn_relu", "gated"])
def test_projections_of_cells_other_than_the_lstm(cell):
    """Projections are for any cell that reads h_(t-1) through its gates alone: an Elman RNN with
    ``h_t = W_hr act(...)`` (torch.nn has none), and a custom cell whose input- and recurrent-side
    gate gradients differ, against a loop in float64 through autograd, with rows of different
    lengths, forward and every gradient. The Elman RNNs' derived backward reads the cell's own
    output, which with projections is ``r_t``, not the state (v71's first build read the state
    there: NaN); the custom cell's recurrent GEMM takes its recurrent-side gradients (it took the
    input side's: 0.13-0.64 off)."""
    T, N, I, H, P = 6, 3, 5, 11, 4
    G = 2 if cell == "gated" else 1
    kind = tvmrnn.define_cell("gated_proj_test", gates=("f", "n"), math=_gated) if cell == "gated" else cell
    rnn = tvmrnn.build(kind, I, H, batch_size=N, proj_size=P, options=tvmrnn.BuildOptions(variable_lengths=True),
                       cache=False, tuning_logs=False)

    def step(gx, gh):  # the cell's output r_t from its gates' input and recurrent projections (gate-major)
        if cell == "gated":
            f = torch.sigmoid(gx[:, :H] + gh[:, :H])
            return f * torch.tanh(gx[:, H:] + f * gh[:, H:])
        return (torch.tanh if cell == "rnn_tanh" else torch.relu)(gx + gh)
    g = torch.Generator().manual_seed(0)
    shapes = {"weight_ih_l0": (G * H, I), "weight_hh_l0": (G * H, P), "bias_ih_l0": (G * H,), "bias_hh_l0": (G * H,),
              "weight_hr_l0": (P, H)}
    params = {k: (torch.rand(s, generator=g, dtype=torch.float64) - 0.5).requires_grad_() for k, s in shapes.items()}
    x = torch.randn(T, N, I, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(1, N, P, generator=g, dtype=torch.float64, requires_grad=True)
    dy, dhy = torch.randn(T, N, P, generator=g, dtype=torch.float64), torch.randn(1, N, P, generator=g, dtype=torch.float64)
    for lengths in ([T, 2, 4], [T] * N):
        for t in (x, h0, *params.values()):
            t.grad = None
        h, ys = h0[0], []
        for t in range(T):
            r = step(x[t] @ params["weight_ih_l0"].T + params["bias_ih_l0"],
                     h @ params["weight_hh_l0"].T + params["bias_hh_l0"])
            running = (torch.tensor(lengths) > t)[:, None]
            h = torch.where(running, r @ params["weight_hr_l0"].T, h)
            ys.append(torch.where(running, h, torch.zeros_like(h)))
        y = torch.stack(ys)
        ((y * dy).sum() + (h * dhy[0]).sum()).backward()
        w = rnn.pack_weights({k: v.detach().float().numpy() for k, v in params.items()})
        args = (x.detach().float().numpy(), h0.detach().float().numpy())
        got_y, got_h, _, ws = rnn.forward_train(w, *args, lengths=lengths)
        grads = rnn.backward(w, ws, dy.float().numpy(), dhy.float().numpy())
        assert rel_error(got_y, y) < 1e-5 and rel_error(got_h, h[None]) < 1e-5
        for name, want in (("x", x.grad), ("h0", h0.grad), *((k, v.grad) for k, v in params.items())):
            assert rel_error(grads[name], want) < 1e-5, (lengths, name)


def test_masked_projection_kernels_have_unmasked_twins():
    """A variable-lengths LSTMP's masked kernels each carry their unmasked twin (the kernel the
    fixed-length build has), whose records build replays where the masked one has none
    (``Kernel.unmasked``, ``tvmrnn.tune.records.scheduler``)."""
    from tvmrnn.program.passes import Config
    from tvmrnn.tune import tasks
    from tvmrnn.cells import CELLS

    def kernels(variable_lengths):
        options = tvmrnn.BuildOptions(variable_lengths=variable_lengths)
        config = Config(CELLS["lstm"], 12, 40, 1, True, 5, False, options, proj_size=9)
        return {t.kernel.name: t.kernel for t in tasks.extract_tasks([config])}
    plain, masked = kernels(False), kernels(True)
    projected = [k for name, k in masked.items() if name.startswith("projected_")]
    assert {k.name.split("_n")[0] for k in projected} == {"projected_recurrent_backward", "projected_gradient_start"}
    for kernel in masked.values():
        if "_masked" in kernel.name:
            assert kernel.unmasked is not None and kernel.unmasked.name in plain, kernel.name
            assert kernel.unmasked.roles == plain[kernel.unmasked.name].roles, kernel.name


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_a_cuda_projection_build_compiles_without_a_gpu():
    """A CUDA LSTMP build (bidirectional, variable lengths) compiles here, as the drop-in builds
    it on a GPU (``tests/test_cuda.py`` runs it there against torch.nn: v72, the H200)."""
    rnn = tvmrnn.build("lstm", input_size=I, hidden_size=40, num_layers=2, bidirectional=True, batch_size=3,
                       proj_size=17, target="nvidia/nvidia-h100", cache=False, tuning_logs=False,
                       options=tvmrnn.BuildOptions(variable_lengths=True))
    assert rnn.config.proj_size == 17 and rnn.config.state_size == 17
    calls = rnn.programs["forward"].calls(9)
    assert any(k.startswith("projection_step") for k in calls), calls
