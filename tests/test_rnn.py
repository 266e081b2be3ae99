"""Forward and backward of every configuration against torch.nn.LSTM/GRU/RNN in float64.

Tolerance: relative error 1e-4. Our kernels compute in float32 and sum at most a few hundred
products per output (K <= 2*37 per GEMM, T*N <= 150 per weight gradient), so rounding stays
near 1e-6; 1e-4 leaves room for the recurrence amplifying it over 50 steps but catches any
wrong index, gate order or missing term, which show up at 1e-2 or more.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import tvmrnn
from conftest import H, I, N, built, grid, rel_error, slow, torch_module

# whole builds at LLVM's own optimisation level, as users get them (tests/conftest.py)
pytestmark = pytest.mark.llvm_optimized

CELLS = ["lstm", "gru", "rnn_tanh", "rnn_relu"]
TOL = 1e-4


def _reference(cell, num_layers, bidirectional, batch_first, hidden=H, seed=0, input_size=I, proj_size=0):
    torch.manual_seed(seed)
    return torch_module(cell, input_size, hidden, num_layers, bidirectional, batch_first, proj_size).double()


def _check(cell, num_layers, bidirectional, batch_first, T, rng, with_states=True, target=None,
           as_array=lambda a: a, hidden=H, tol=TOL, input_size=I, batch=N, rows=None, **build):
    """Run forward, training forward and backward on ``as_array`` inputs; compare with torch.
    ``batch``: the build's batch size; ``rows``: the inputs' (at most ``batch``; default the same).
    ``build``: more arguments of :func:`tvmrnn.build` (``allow_tf32``, ``proj_size``)."""
    rnn = built(cell, num_layers, bidirectional, batch_first, input_size=input_size, hidden_size=hidden,
                batch_size=batch, target=target, **build)
    batch = batch if rows is None else rows
    proj_size = build.get("proj_size", 0)
    ref = _reference(cell, num_layers, bidirectional, batch_first, hidden, input_size=input_size, proj_size=proj_size)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    D = 2 if bidirectional else 1
    has_c = cell == "lstm"
    x = rng.standard_normal((batch, T, input_size) if batch_first else (T, batch, input_size)).astype(np.float32)
    state = (num_layers * D, batch, hidden)
    h_state = (num_layers * D, batch, proj_size or hidden)
    h0 = rng.standard_normal(h_state).astype(np.float32) if with_states else None
    c0 = rng.standard_normal(state).astype(np.float32) if with_states and has_c else None

    arr = lambda a: None if a is None else as_array(a)  # noqa: E731
    y, hy, cy, ws = rnn.forward_train(w, arr(x), arr(h0), arr(c0))
    y_inf, hy_inf, cy_inf = rnn.forward(w, arr(x), arr(h0), arr(c0))

    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    h0t = torch.tensor(h0 if h0 is not None else np.zeros(h_state), dtype=torch.float64, requires_grad=True)
    c0t = torch.tensor(c0 if c0 is not None else np.zeros(state), dtype=torch.float64, requires_grad=True)
    if has_c:
        yr, (hyr, cyr) = ref(xt, (h0t, c0t))
    else:
        yr, hyr = ref(xt, h0t)
    for got in (y, y_inf):
        assert rel_error(got, yr) < tol
    for got in (hy, hy_inf):
        assert rel_error(got, hyr) < tol
    if has_c:
        assert rel_error(cy, cyr) < tol and rel_error(cy_inf, cyr) < tol
    else:
        assert cy is None and cy_inf is None

    dy = rng.standard_normal(y.shape).astype(np.float32)
    dhy = rng.standard_normal(h_state).astype(np.float32)
    dcy = rng.standard_normal(state).astype(np.float32) if has_c else None
    grads = rnn.backward(w, ws, arr(dy), arr(dhy), arr(dcy))
    loss = (yr * torch.from_numpy(dy).double()).sum() + (hyr * torch.from_numpy(dhy).double()).sum()
    if has_c:
        loss = loss + (cyr * torch.from_numpy(dcy).double()).sum()
    loss.backward()
    expected = {"x": xt.grad, "h0": h0t.grad, **({"c0": c0t.grad} if has_c else {})}
    expected.update({name: p.grad for name, p in ref.named_parameters()})
    assert set(grads) == set(expected)
    for name, e in expected.items():
        assert rel_error(grads[name], e) < tol, name


@pytest.mark.parametrize(*grid({"cell": CELLS, "num_layers": [1, 2], "bidirectional": [False, True],
                               "batch_first": [False, True]}, every={"T": [1, 7, 50]},
                              ids={"bidirectional": lambda b: "bidir" if b else "uni",
                                   "batch_first": lambda b: "batch_first" if b else "seq_first"}))
def test_matches_torch(cell, num_layers, bidirectional, batch_first, T, rng):
    """Every cell, layer count, direction count and layout: each pair of settings in the default
    run (8 builds of 32, :func:`conftest.grid`), all with ``--full-grid``; T = 1, 7 and 50 a build."""
    _check(cell, num_layers, bidirectional, batch_first, T, rng)


def test_the_default_grid_holds_every_pair_of_settings():
    """:func:`conftest.covering_rows`, which chooses the default run's configurations: every
    pair of values of any two axes in some row, each value of a single axis, and fewer rows than
    the product where pairs allow it."""
    import itertools

    from conftest import covering_rows
    for axes in ({"cell": CELLS, "layers": [1, 2], "bidirectional": [False, True], "batch_first": [False, True]},
                 {"name": list("abcdefg"), "layers": [1, 2], "bidirectional": [False, True]},
                 {"x": [1, 2, 3], "y": [1, 2, 3], "z": [1, 2, 3]}, {"only": [1, 2, 3]}):
        rows = covering_rows(axes)
        values = list(axes.values())
        assert set(rows) <= set(itertools.product(*values)) and len(set(rows)) == len(rows)
        for i, j in itertools.combinations(range(len(values)), 2):
            assert {(r[i], r[j]) for r in rows} == set(itertools.product(values[i], values[j])), (axes, i, j)
        assert all({r[i] for r in rows} == set(v) for i, v in enumerate(values))
    assert len(covering_rows({"cell": CELLS, "layers": [1, 2], "bidirectional": [False, True],
                              "batch_first": [False, True]})) == 8  # of 32
    assert len(covering_rows({"x": [1, 2, 3], "y": [1, 2, 3], "z": [1, 2, 3]})) < 27


@pytest.mark.parametrize("cell,bidirectional,batch_first", [
    ("lstm", True, False), ("gru", True, True), slow("rnn_tanh", False, False), slow("rnn_relu", True, False)])
def test_three_layers_match_torch(cell, bidirectional, batch_first, rng):
    """A middle layer (inputs from a layer, outputs to one): one case a cell, the Elman ones with
    ``--full-grid`` (a 3-layer build takes 15-35 s on 2 cores; tests/fuzz.py draws more stacks)."""
    for T in (1, 50):
        _check(cell, 3, bidirectional, batch_first, T, rng)


# (2 layers in the configurations other tests build already: a test_matches_torch row, or the
# 2-layer bidirectional seq-first LSTM of the tests below)
_TWO_LAYERS = {"lstm": (True, False), "gru": (True, False), "rnn_tanh": (False, True), "rnn_relu": (True, True)}


@pytest.mark.parametrize("cell", CELLS)
def test_zero_initial_states(cell, rng):
    _check(cell, 2, *_TWO_LAYERS[cell], 5, rng, with_states=False)


def _every_result(rnn, T: int, seed: int) -> list:
    """Inference, training forward and backward of ``rnn`` on random weights, input and output
    gradient drawn from ``seed``: every output and gradient, in a fixed order."""
    local = np.random.default_rng(seed)
    w = rnn.pack_weights({slot.name: local.standard_normal(slot.torch_shape).astype(np.float32) * 0.3
                          for slot in rnn.config.layout.slots})
    x = local.standard_normal((T, N, I)).astype(np.float32)
    y, hy, cy, ws = rnn.forward_train(w, x)
    inference = rnn.forward(w, x)
    grads = rnn.backward(w, ws, local.standard_normal(y.shape).astype(np.float32))
    return [y, hy, cy, *inference, *(grads[k] for k in sorted(grads))]


def _same_bits(results: list, what=None) -> None:
    for a, b in zip(*results):
        assert (a is None and b is None) or np.array_equal(a, b), what


@pytest.mark.parametrize("cell", ["lstm", "gru", slow("rnn_tanh"), slow("rnn_relu"), slow("peephole_lstm")])
def test_stacked_directions_match_one_after_the_other(cell, rng):
    """Both directions in one launch per step (the default) compute what a time loop per direction
    does, bit for bit: same kernels but for the leading direction axis, same reduction order. At
    T = 50 the reverse direction's views sit before the forward's for half the steps (a negative
    direction stride, :class:`tvmrnn.program.sequence.Stacked`)."""
    from tvmrnn.cells.examples import EXAMPLES
    spec = EXAMPLES[cell] if cell in EXAMPLES else cell
    results = []
    for stacked in (True, False):
        rnn = tvmrnn.build(spec, input_size=I, hidden_size=H, num_layers=2, bidirectional=True, batch_size=N,
                           options=tvmrnn.BuildOptions(stack_directions=stacked))
        kernels = set(rnn.programs["backward"].kernels) | set(rnn.programs["forward_train"].kernels)
        assert any(k.endswith("_d2") for k in kernels) == stacked
        results.append(_every_result(rnn, 50, seed=5))
    _same_bits(results)


def test_interleaved_projections_match_projections_first():
    """CPU forwards project each chunk (16 steps; 64 for a few rows) just before its steps, into a one-chunk buffer
    (the reverse direction's chunk is its times in reverse), instead of every step before the
    time loop, and backwards take each chunk's gradients right after its steps (v74): the same
    results bit for bit, inference, training and the backward's input and state gradients (the
    weight gradients sum their chunks in another order: within fp32 rounding), for 2
    bidirectional LSTM layers, both directions in one launch, at a length that ends in 4- and
    1-step chunks and at one shorter than a chunk. (Directions one after the other, a 2-core
    machine's default, are what every other CPU test runs against PyTorch.)"""
    from tvm import target as tvm_target

    from tvmrnn.program.passes import chunk_steps, interleaved_projections
    builds = {}
    for mode in ("auto", "0"):  # the default (None: interleaved on CPUs), and projections first
        options = tvmrnn.BuildOptions(stack_directions=True, interleave_projections=None if mode == "auto" else False)
        builds[mode] = tvmrnn.build("lstm", input_size=I, hidden_size=H, num_layers=2, bidirectional=True, batch_size=N,
                                    options=options)
    for T in (37, 3):
        results = []
        for mode, rnn in builds.items():
            gx = rnn._shapes_of("forward", T)["gx"]
            # (a chunk of the ladder's first size: 64 steps for the 8 rows or fewer here, v75)
            assert gx[1] == (chunk_steps(rnn.target, rnn.config.options, rnn.config.rows)[0] if mode == "auto" else T), (
                mode, gx)
            assert gx[0] == 2  # both directions stacked
            results.append(_every_result(rnn, T, seed=7))
        names = ["y", "hy", "cy", "y", "hy", "cy", *sorted(["x", "h0", "c0", *rnn.config.layout.names])]
        assert len(names) == len(results[0])
        for name, a, b in zip(names, *results):
            if name.startswith(("weight", "bias")):
                assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (T, name)
            else:
                assert np.array_equal(a, b), (T, name)
    assert not interleaved_projections(tvm_target.Target("nvidia/nvidia-h100"), tvmrnn.BuildOptions())
    with pytest.raises(TypeError, match="options.interleave_projections"):
        tvmrnn.BuildOptions(interleave_projections="auto")


def test_packed_weights_are_recycled_once_nothing_refers_to_them():
    """CPU packed weights go back to their RNN when their ``PackedWeights`` is gone (a drop-in packs
    at every call: a fresh buffer's pages were first touched each time), and the next pack takes
    them; never while anything else refers to the array. Results are those of fresh packs. NumPy
    and torch parameters alike; the parameters' joined copy is each thread's own buffer."""
    import gc
    rnn = built("gru", 1, True)
    local = np.random.default_rng(3)

    def params():
        return {slot.name: local.standard_normal(slot.torch_shape).astype(np.float32) for slot in rnn.config.layout.slots}
    x = local.standard_normal((7, N, I)).astype(np.float32)
    first, second = params(), params()
    want = [rnn.forward(rnn.pack_weights(p, zeroed=True), x)[0] for p in (first, second)]  # (zeroed: never pooled)

    def address(w):
        return w.flat.__array_interface__["data"][0]
    w = rnn.pack_weights(first)
    where = address(w)
    assert np.array_equal(rnn.forward(w, x)[0], want[0])
    del w
    gc.collect()
    assert len(rnn._packed_pool._free) == 1  # (a fresh buffer could land at the same address)
    w = rnn.pack_weights(second)
    assert address(w) == where and not rnn._packed_pool._free  # recycled
    assert np.array_equal(rnn.forward(w, x)[0], want[1])
    held = w.flat  # referred to elsewhere: not recycled
    kept = held.tobytes()  # (bits: the layout's padding is whatever memory held, NaN patterns too)
    del w
    gc.collect()
    assert not rnn._packed_pool._free
    w = rnn.pack_weights(first)
    assert address(w) != where and held.tobytes() == kept
    assert np.array_equal(rnn.forward(w, x)[0], want[0])
    torch_w = rnn.pack_weights({k: torch.from_numpy(v) for k, v in second.items()})
    assert np.array_equal(rnn.forward(torch_w, torch.from_numpy(x))[0].numpy(), want[1])


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_forward_only_packs_leave_the_backward_copies_out(cell, rng, monkeypatch):
    """``pack_weights(forward_only=True)`` (the ``pack_forward`` pass) writes what the forwards
    read and nothing else: into a buffer of NaN, the forward and training forward give the same
    bits as a whole pack, the backward's copies stay NaN, and the backward refuses the weights.
    An RNN without the pass (a package made before it) packs whole."""
    from tvmrnn.runtime.arrays import Frame
    from tvmrnn.runtime.rnn import PackedWeights
    rnn = built(cell, 2, True)
    ref = torch_module(cell, I, H, 2, True, False)
    params = tvmrnn.params_from_torch(ref)
    x = rng.standard_normal((7, N, I)).astype(np.float32)
    whole = rnn.pack_weights(params)
    flat = np.concatenate([params[name].ravel() for name in rnn.config.layout.names])
    nan = np.full(rnn.config.layout.packed_total, np.nan, np.float32)
    rnn._run("pack_forward", Frame("numpy", None), 0, {"params": flat, "w": nan})
    assert np.isnan(nan).mean() > 0.3  # the backward's copies: about half the layout
    forward_only = PackedWeights(rnn, nan, forward_only=True)
    for a, b in zip(rnn.forward(whole, x), rnn.forward(forward_only, x)):
        assert b is None or np.array_equal(a, b)
    *outs, ws = rnn.forward_train(forward_only, x)
    *want, _ = rnn.forward_train(whole, x)
    assert all(b is None or np.array_equal(a, b) for a, b in zip(want, outs))
    with pytest.raises(ValueError, match=r"w: packed for the forwards alone"):
        rnn.backward(forward_only, ws, np.ones_like(outs[0]))
    assert rnn.pack_weights(params, forward_only=True).forward_only
    rnn.backward(whole, ws, np.ones_like(outs[0]))  # the workspace itself is a training forward's
    monkeypatch.setattr(rnn, "signatures", {k: v for k, v in rnn.signatures.items() if k != "pack_forward"})
    older = rnn.pack_weights(params, forward_only=True)
    assert not older.forward_only
    grads = rnn.backward(older, ws, np.ones_like(outs[0]))
    assert np.array_equal(grads["weight_hh_l1_reverse"], rnn.backward(whole, ws, np.ones_like(outs[0]))["weight_hh_l1_reverse"])


def test_drop_ins_pack_for_the_forward_alone_where_no_gradient_is_needed(monkeypatch):
    """A drop-in call that needs no gradient (``torch.no_grad``, or nothing requiring one) packs
    the forward's part alone; a training call packs the whole."""
    import tvmrnn.torch as tt
    from tvmrnn.runtime.rnn import RNN
    seen = []
    pack = RNN.pack_weights

    def spy(self, params, zeroed=False, forward_only=False):
        seen.append(forward_only)
        return pack(self, params, zeroed=zeroed, forward_only=forward_only)
    monkeypatch.setattr(RNN, "pack_weights", spy)
    model = tt.GRU(I, H)
    x = torch.randn(5, N, I)
    with torch.no_grad():
        y0 = model(x)[0]
    model.requires_grad_(False)
    y1 = model(x)[0]
    model.requires_grad_(True)
    y2 = model(x)[0]
    y2.sum().backward()
    assert seen == [True, True, False]
    assert torch.equal(y0, y1) and torch.equal(y1, y2.detach())


def test_overlapping_projection_tails_match(monkeypatch):
    """GPU forwards cover the steps left after whole chunks of projections with one chunk of the
    same size that overlaps steps done before (fewer launches; ``Program.chunked``'s
    ``tail_waste``). Forced on here for a CPU build with the projections first: the same bits as
    without, inference, training and the backward, 2 bidirectional LSTM layers, at lengths whose
    tails overlap (21: chunks of 16 at 0 and 5 instead of 16, 4, 1; 30; 37: 16 at 0, 16, 21) and
    do not (3, shorter than a chunk of 4 after none of 16; 16), and the launches counted."""
    from tvmrnn.program import passes
    options = tvmrnn.BuildOptions(stack_directions=True, interleave_projections=False)
    plain = tvmrnn.build("lstm", input_size=I, hidden_size=H, num_layers=2, bidirectional=True, batch_size=N,
                         options=options, tuning_logs=False)
    monkeypatch.setattr(passes, "tail_flops", lambda target: 10**9)
    tails = tvmrnn.build("lstm", input_size=I, hidden_size=H, num_layers=2, bidirectional=True, batch_size=N,
                         options=options, tuning_logs=False, cache=False)

    def projections(rnn, T):
        return sum(n for name, n in rnn.programs["forward"].calls(T).items() if name.startswith("input_projection"))
    for T, before, after in ((21, 3, 2), (30, 6, 2), (37, 4, 3), (3, 3, 3), (16, 1, 1)):  # chunks
        # (each chunk a launch a direction and layer)
        assert (projections(plain, T), projections(tails, T)) == (4 * before, 4 * after), T
        _same_bits([_every_result(rnn, T, seed=7) for rnn in (plain, tails)], T)


def test_projection_tails_replace_short_gemms(monkeypatch):
    """The overlapping tail is also taken where the chunks it saves are GEMMs too short to fill the
    device (``Program.chunked``'s ``tail_rows``: a GEMM counted as max(rows, full) rows, the tail
    taken at half the cover's count or less), whatever it recomputes. Forced on for a CPU build of
    N = 3 rows with ``full`` = 16: a 16-step chunk counts 48, a 4-step or 1-step one 16. T = 31
    (15 steps after a chunk of 16: 3 + 3 chunks, 96 >= 2 x 48) and 47 take a tail; T = 30 (3 + 2
    chunks, 80) and 21 (1 + 1, 32) do not; the same bits as without, every result. With
    ``GPU_INPUT_GRADIENT_TAILS`` the backward's input gradients of the first direction take them
    too, in a cover of their own after the weight gradients' (the second direction's add to dx:
    they keep the plain cover, and run after)."""
    from tvmrnn.program import passes
    options = tvmrnn.BuildOptions(interleave_projections=False)
    sizes = dict(input_size=I, hidden_size=H, num_layers=1, bidirectional=True, batch_size=N, options=options,
                 tuning_logs=False, cache=False)
    plain = tvmrnn.build("gru", **sizes)
    monkeypatch.setattr(passes, "tail_rows", lambda target: 16)
    monkeypatch.setattr(passes, "GPU_INPUT_GRADIENT_TAILS", True)
    tails = tvmrnn.build("gru", **sizes)

    def launches(rnn, T, program, kind):
        return sum(n for name, n in rnn.programs[program].calls(T).items() if name.startswith(kind))
    for T, before, after in ((31, 7, 2), (47, 8, 3), (30, 6, 6), (21, 3, 3)):  # chunks, each a launch a direction
        assert (launches(plain, T, "forward_train", "input_projection"),
                launches(tails, T, "forward_train", "input_projection")) == (2 * before, 2 * after), T
        assert (launches(plain, T, "backward", "input_gradient"),
                launches(tails, T, "backward", "input_gradient")) == (2 * before, before + after), T
        assert launches(plain, T, "backward", "weight_gradient") == launches(tails, T, "backward", "weight_gradient")
    for T in (31, 30):
        _same_bits([_every_result(rnn, T, seed=3) for rnn in (plain, tails)], T)


# sizes with panels narrower than H on AVX2 and AVX-512 alike, forward (G gates) and backward (1)
@pytest.mark.parametrize("cell, hidden", [("lstm", 80), ("gru", 96), ("rnn_relu", 80)])
def test_weights_in_column_panels_match_torch(cell, hidden, rng):
    """CPU forward weights packed in column panels of the tile's units (BLIS's packing; on by
    default for AVX2, forced here so that any CPU runs it): the packed buffer holds them as
    ``(H / u, K, G, u)`` (gate-blocked: one gate of u units side by side), the biases as
    ``(H / u, G, u)``, and 2 bidirectional layers, both directions in one launch (a direction
    axis before the panels), match PyTorch forward and backward, and K-major weights' outputs.
    The backward sums the weight gradients in panels too where the cell's dgh is its dgx (each
    chunk's gate gradients packed once; the GRU keeps rows), and its gradients over chunks of 16,
    4 and 1 steps match the K-major build's, whose weight gradients are summed in rows."""
    from tvmrnn import schedules as default_schedule, kernels
    from tvmrnn.cells.definition import get_cell
    from tvmrnn.device import host_target
    panelled = tvmrnn.BuildOptions(weight_panels=True, stack_directions=True)
    G = get_cell(cell).num_gates
    u = default_schedule.weight_panel(host_target(), G, hidden)
    assert 1 < u < hidden and hidden % u == 0
    rnn = built(cell, 2, True, False, hidden_size=hidden, target=None, options=panelled)  # the build _check uses
    steps = [k for k in rnn.programs["forward"].kernels if k.startswith("recurrent_step")]
    assert steps and all(f"_p{u}_d2" in k for k in steps), steps
    _check(cell, 2, True, False, 7, rng, hidden=hidden, options=panelled)

    ref = _reference(cell, 2, True, False, hidden)
    params = tvmrnn.params_from_torch(ref)
    w = rnn.pack_weights(params)
    slot = rnn.config.layout.slot(1, 1, "weight_hh")
    W = params[slot.name].reshape(G, hidden, hidden)  # PyTorch's (G*H, K) as (G, H, K)
    panels = w.flat[slot.offset:slot.offset + slot.size].reshape(kernels.weight_shape(hidden, hidden, G, u))
    np.testing.assert_array_equal(panels, W.reshape(G, hidden // u, u, hidden).transpose(1, 3, 0, 2))
    bias = rnn.config.layout.slot(1, 1, "bias_hh")
    B = params[bias.name].reshape(G, hidden // u, u)
    np.testing.assert_array_equal(w.flat[bias.offset:bias.offset + bias.size].reshape(kernels.gate_shape(hidden, G, u)),
                                  B.transpose(1, 0, 2))
    ub = default_schedule.weight_panel(host_target(), 1, hidden)  # the backward's copy, in panels of K
    assert 1 < ub < hidden
    back = w.flat[rnn.config.layout.backward_copy(slot):][:slot.size]
    np.testing.assert_array_equal(back.reshape(kernels.backward_weight_shape(G, hidden, hidden, ub)),
                                  W.reshape(G, hidden, hidden // ub, ub).transpose(2, 1, 0, 3))
    assert any(k.startswith("backward_step") and f"_p{ub}" in k for k in rnn.programs["backward"].kernels)
    calls = rnn.programs["backward"].calls(21)
    sums = [k for k in calls if k.startswith("weight_gradient")]
    packs = sum(n for k, n in calls.items() if k.startswith("gradient_panels_"))
    if cell == "gru":  # its dgx and dgh are packed apart, from passes.TWO_GRADIENT_PACKS_MIN_UNITS on
        assert packs == 0 and all(k.startswith("weight_gradient_packed_") for k in sums), sums
    else:
        assert default_schedule.gradient_panel(host_target(), G, hidden) == u
        assert sums and all(k.startswith(f"weight_gradient_panels_p{u}_") for k in sums), sums
        assert packs == 4 * 3, calls  # 3 chunks (16, 4, 1 steps) for each of 4 layer-directions
    k_major = tvmrnn.build(cell, input_size=I, hidden_size=hidden, num_layers=2, bidirectional=True, batch_size=N,
                           options=tvmrnn.BuildOptions(weight_panels=False, stack_directions=True))
    assert not any(re.search(r"_p\d+(_|$)", k) for k in k_major.programs["forward"].kernels)
    assert not any(k.startswith("gradient_panels_") for k in k_major.programs["backward"].kernels)
    x = rng.standard_normal((21, N, I)).astype(np.float32)
    dy = rng.standard_normal((21, N, 2 * hidden)).astype(np.float32)
    wk = k_major.pack_weights(params)
    for got, want in zip(rnn.forward(w, x), k_major.forward(wk, x)):
        if want is not None:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    got = rnn.backward(w, rnn.forward_train(w, x)[3], dy)
    want = k_major.backward(wk, k_major.forward_train(wk, x)[3], dy)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_gradient_panels_follow_the_target():
    """Weight gradients in panels where the forward weights have panels (CPUs), never on GPUs or
    at sizes no tile divides; the GRU's (whose dgh is not its dgx: two packs) from 288 units (v89;
    512 before);
    ``BuildOptions(gradient_panels=False)`` keeps rows."""
    import tvm
    from tvmrnn.tune import tasks
    from tvmrnn.cells.definition import get_cell
    from tvmrnn.schedules.cpu import gradient_panel
    from tvmrnn.program.passes import Config
    for cell, hidden, panels in (("lstm", 96, True), ("rnn_tanh", 96, True), ("gru", 96, False), ("gru", 300, True),
                                 ("gru", 512, True)):
        names = [t.kernel.name for t in tasks.extract_tasks([Config(get_cell(cell), 13, hidden, 1, False, 3, False)])]
        assert any(n.startswith("weight_gradient_panels_") for n in names) == panels, (cell, names)
        assert any(n.startswith("gradient_panels_") for n in names) == panels, (cell, names)
        assert any(n.startswith("weight_gradient_packed_") for n in names) != panels, (cell, names)
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    gpu = tvm.target.Target("nvidia/nvidia-h100")
    assert [gradient_panel(avx512, g, 800) for g in (4, 3, 1)] == [16, 16, 32]
    assert [gradient_panel(avx2, g, 800) for g in (4, 3, 1)] == [4, 8, 16]
    assert gradient_panel(gpu, 4, 800) == 0 and gradient_panel(avx2, 4, 37, weight_panels=False) == 0
    assert gradient_panel(avx2, 4, 37) == 4  # padded panels (the last one), as the forward weights' (v89)
    assert gradient_panel(avx512, 4, 800, False) == 0
    rows = Config(get_cell("lstm"), 13, 96, 1, False, 3, False, tvmrnn.BuildOptions(gradient_panels=False))
    names = [t.kernel.name for t in tasks.extract_tasks([rows])]
    assert not any(n.startswith("gradient_panels_") for n in names), names


def test_weight_panels_follow_the_target():
    """Panels on every CPU by default (AVX2 and AVX-512: measured faster on both), never on GPUs;
    ``BuildOptions(weight_panels=False)`` keeps K-major weights, and so does a size the tile does not divide."""
    import tvm
    from tvmrnn.schedules.cpu import weight_panel
    avx2 = tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    gpu = tvm.target.Target("nvidia/nvidia-h100")
    assert [weight_panel(avx2, g, 800) for g in (4, 3, 1)] == [4, 8, 16]
    assert weight_panel(avx512, 4, 800) == 16 and weight_panel(gpu, 4, 800) == 0
    assert [weight_panel(avx512, g, 800) for g in (3, 1)] == [16, 32]
    assert weight_panel(avx2, 4, 37) == 4  # 37 units: no tile divides them, padded to 40 (cpu.CPU_PADDED_PANELS_AVX2)
    assert weight_panel(avx2, 4, 37, True) == 4 and weight_panel(avx2, 1, 37) == 0  # (plain columns: none)
    assert weight_panel(avx512, 4, 800, True) == 16 and weight_panel(gpu, 4, 800, True) == 0
    assert weight_panel(avx2, 4, 800, False) == 0 and weight_panel(avx512, 4, 800, False) == 0
    with pytest.raises(TypeError, match="options.weight_panels"):
        tvmrnn.BuildOptions(weight_panels="yes")


def test_direction_stacking_follows_the_target():
    """GPUs and CPUs with many cores run both directions in one launch; CPUs with few do not (on
    2 cores it was slower, on 16 faster); ``BuildOptions(stack_directions=...)`` overrides either way."""
    import tvm
    from tvmrnn.program import passes
    auto, off, on = tvmrnn.BuildOptions(), tvmrnn.BuildOptions(stack_directions=False), \
        tvmrnn.BuildOptions(stack_directions=True)

    def cpu(cores):
        return tvm.target.Target({"kind": "llvm", "num-cores": cores})
    assert passes.stack_directions(tvm.target.Target("nvidia/nvidia-h100"), auto)
    assert passes.stack_directions(cpu(16), auto) and passes.stack_directions(cpu(8), auto)
    assert not passes.stack_directions(cpu(2), auto) and not passes.stack_directions(None, auto)
    assert not passes.stack_directions(tvm.target.Target("nvidia/nvidia-h100"), off)
    assert passes.stack_directions(cpu(2), on)


def test_sequence_length_changes_without_rebuilding(rng):
    rnn = built("gru", 2, True)
    compiled = rnn.executable
    for T in (3, 17, 33, 2):  # around the 16-step chunk size, both ways
        _check("gru", 2, True, False, T, rng)
    assert rnn.executable is compiled


def test_weight_gradients_are_deterministic(rng):
    rnn = built("lstm", 2, True)
    w = rnn.pack_weights(tvmrnn.params_from_torch(_reference("lstm", 2, True, False)))
    x = rng.standard_normal((40, N, I)).astype(np.float32)
    _, _, _, ws = rnn.forward_train(w, x)
    dy = rng.standard_normal((40, N, 2 * H)).astype(np.float32)
    first, second = rnn.backward(w, ws, dy), rnn.backward(w, ws, dy)
    for name in first:
        assert np.array_equal(first[name], second[name]), name


def test_torch_tensors_in_give_torch_tensors_out(rng):
    rnn = built("lstm", 1, False)
    ref = _reference("lstm", 1, False, False)
    w = rnn.pack_weights(ref.state_dict())  # a state_dict of tensors is accepted as is
    x = torch.randn(6, N, I, requires_grad=True)  # a leaf that requires grad is read as is
    y, hy, cy, ws = rnn.forward_train(w, x)
    assert all(isinstance(t, torch.Tensor) for t in (y, hy, cy))
    assert ws.x is x  # the workspace keeps the caller's input, not a copy
    yr, _ = ref(x.double())
    assert rel_error(y, yr) < TOL
    grads = rnn.backward(w, ws, torch.ones_like(y))
    assert all(isinstance(g, torch.Tensor) for g in grads.values())


def test_inference_keeps_no_workspace_and_training_reports_it(rng):
    rnn = built("lstm", 2, True)
    w = rnn.pack_weights(tvmrnn.params_from_torch(_reference("lstm", 2, True, False)))
    x = rng.standard_normal((9, N, I)).astype(np.float32)
    assert len(rnn.forward(w, x)) == 3
    ws = rnn.forward_train(w, x)[3]
    # per layer-direction: c (T+1 rows), 4 saved LSTM gate values (tanh(c_t) is recomputed); h
    # (T+1 rows) for the last layer's directions; the inner layer's output (T+2 rows: its h states)
    LD, T = 4, 9
    expected = 4 * (LD * (T + 1) * N * H + LD * T * N * H * 4 + 2 * (T + 1) * N * H + (T + 2) * N * 2 * H)
    assert ws.workspace_bytes == expected


def test_scratch_is_reused_and_results_are_fresh(rng):
    """Temporaries are kept between CPU calls; what a call returns is never reused by the next."""
    rnn = built("lstm", num_layers=2, bidirectional=True)
    ref = torch_module("lstm", I, H, 2, True, False)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x1, x2 = (rng.standard_normal((7, N, I)).astype(np.float32) for _ in range(2))
    y1, _, _ = rnn.forward(w, x1)
    kept = y1.copy()
    y2, _, _, ws = rnn.forward_train(w, x2)
    y3, _, _ = rnn.forward(w, x2)
    assert np.array_equal(y1, kept)  # the second and third calls did not write into the first's output
    assert np.array_equal(y2, y3) and not np.shares_memory(y2, y3)
    _, _, _, ws2 = rnn.forward_train(w, x1)
    assert all(not np.shares_memory(ws.arrays[k], ws2.arrays[k]) for k in ws.arrays)  # workspaces stay apart
    g = rnn.backward(w, ws, np.ones_like(y2))
    g2 = rnn.backward(w, ws, np.ones_like(y2))
    assert all(np.array_equal(g[k], g2[k]) for k in g) and not np.shares_memory(g["x"], g2["x"])


@pytest.mark.parametrize("frame", ["numpy", "torch"])
def test_every_result_is_written_by_the_passes(rng, monkeypatch, frame):
    """Fresh arrays filled with NaN (as recycled memory may hold anything): the passes write every
    element they return or read, including the weight gradients, which the backward zeroes itself
    (the caller no longer does: a torch.zeros before the pass left PyTorch's OpenMP threads
    spinning on its cores). Omitted states are one kept zero array per shape on the CPU, which the
    passes only read."""
    from tvmrnn.runtime.arrays import Frame
    empty = Frame.empty

    def poisoned(self, shape, kept=False):
        a = empty(self, shape, kept)
        a.fill(float("nan")) if self.kind == "numpy" else a.fill_(float("nan"))
        return a
    rnn = built("lstm", 2, True)
    ref = _reference("lstm", 2, True, False)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    as_frame = (lambda a: a) if frame == "numpy" else torch.from_numpy
    x = as_frame(rng.standard_normal((19, N, I)).astype(np.float32))
    dy = as_frame(rng.standard_normal((19, N, 2 * H)).astype(np.float32))
    want_y, _, _, ws = rnn.forward_train(w, x)
    want = rnn.backward(w, ws, dy)
    rnn.free_scratch()  # scratch and workspaces made afresh, poisoned too
    monkeypatch.setattr(Frame, "empty", poisoned)
    y, hy, cy, ws = rnn.forward_train(w, x)
    got = rnn.backward(w, ws, dy)
    for out in (y, hy, cy, *got.values()):
        assert not np.isnan(np.asarray(out)).any()
    assert np.array_equal(np.asarray(y), np.asarray(want_y))
    for name in want:
        assert np.array_equal(np.asarray(got[name]), np.asarray(want[name])), name
    assert len(rnn._zero_states) == 1  # h0, c0 and dhy, dcy: all (L*D, N, H), one kept array
    assert not np.asarray(next(iter(rnn._zero_states.values()))).any()


@pytest.mark.parametrize("frame", ["numpy", "torch"])
def test_workspace_recycled_only_when_nothing_refers_to_it(rng, frame):
    """A dropped workspace's arrays serve the next training forward (no fresh pages to zero), and
    only then: a live workspace, or one whose array (or a view of it) someone still holds, is
    never handed out again, and recycling changes no result."""
    rnn = built("lstm", num_layers=2, bidirectional=True)
    ref = torch_module("lstm", I, H, 2, True, False)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    conv = (lambda a: a) if frame == "numpy" else torch.from_numpy
    x1, x2 = (conv(rng.standard_normal((7, N, I)).astype(np.float32)) for _ in range(2))
    dy = conv(rng.standard_normal((7, N, 2 * H)).astype(np.float32))
    rnn.free_scratch()

    def addresses(ws):
        return {k: a.__array_interface__["data"][0] if frame == "numpy" else a.data_ptr() for k, a in ws.arrays.items()}

    def gradients(ws):
        return {k: np.array(v, copy=True) if frame == "numpy" else v.numpy().copy()
                for k, v in rnn.backward(w, ws, dy).items()}

    def same(g, h):
        return g.keys() == h.keys() and all(np.array_equal(g[k], h[k]) for k in g)

    ws0 = rnn.forward_train(w, x2)[3]
    first = addresses(ws0)
    expected = gradients(ws0)
    del ws0
    ws1 = rnn.forward_train(w, x1)[3]
    assert addresses(ws1) == first  # the dropped workspace came back
    ws2 = rnn.forward_train(w, x2)[3]
    second = addresses(ws2)
    assert all(second[k] != first[k] for k in first)  # ws1 is alive: fresh arrays
    g1 = gradients(ws1)
    assert same(gradients(ws2), expected)
    del ws2
    held = ws1.arrays["hs"][1:]  # a view of one array outlives its workspace
    del ws1
    for _ in range(3):  # the set with a held view never comes back; the other one does
        ws = rnn.forward_train(w, x2)[3]
        assert addresses(ws) == second
        assert same(gradients(ws), expected)
        del ws
    del held
    ws = rnn.forward_train(w, x1)[3]  # the most recently dropped set; the held one was discarded
    assert addresses(ws) == second and same(gradients(ws), g1)


@pytest.mark.parametrize("frame", ["numpy", "torch"])
def test_huge_pages_for_what_we_keep(rng, monkeypatch, frame):
    """With ``TVMRNN_HUGE_PAGES=1`` the arrays tvmrnn keeps across calls and that are 2 MB or
    more (packed weights, the input projections' scratch, recycled training workspaces) start on
    a 2 MB boundary in a mapping of their own, results and gradients are bit-identical to those
    with 4 KB pages (``TVMRNN_HUGE_PAGES=0``) and match PyTorch, recycling still works, and the
    returned outputs stay the caller's framework's own arrays."""
    import mmap as _mmap
    from tvmrnn.runtime.arrays import HUGE_PAGE, huge_empty, huge_pages
    if not hasattr(_mmap, "MADV_HUGEPAGE"):
        pytest.skip("no MADV_HUGEPAGE on this platform")
    T, n, size = 70, 8, 256  # 2.0 MB of packed weights, 2.2 MB of input projections, saved gates 2.2 MB or more
    rnn = built("lstm", input_size=size, hidden_size=size, batch_size=n)
    ref = torch_module("lstm", size, size, 1, False, False)
    params = tvmrnn.params_from_torch(ref)
    conv = (lambda a: a) if frame == "numpy" else torch.from_numpy
    x = conv(rng.standard_normal((T, n, size)).astype(np.float32))
    dy = conv(rng.standard_normal((T, n, size)).astype(np.float32))

    def address(a):
        return a.ctypes.data if isinstance(a, np.ndarray) else a.data_ptr()

    def copied(a):
        return np.array(a if isinstance(a, np.ndarray) else a.numpy(), copy=True)

    def run():
        w = rnn.pack_weights(params)
        y = rnn.forward(w, x)[0]
        ws = rnn.forward_train(w, x)[3]
        grads = {k: copied(v) for k, v in rnn.backward(w, ws, dy).items()}
        big = {k: address(a) for k, a in ws.arrays.items() if 4 * int(np.prod(a.shape)) >= HUGE_PAGE}
        return w, y, big, grads  # the workspace itself is dropped: recycled

    results = {}
    for mode in ("0", "1"):
        monkeypatch.setenv("TVMRNN_HUGE_PAGES", mode)
        rnn.free_scratch()
        results[mode] = run()
    assert huge_pages()
    w, y, big, grads = results["1"]
    assert address(w.flat) % HUGE_PAGE == 0 and 4 * w.flat.shape[0] >= HUGE_PAGE
    assert big and all(a % HUGE_PAGE == 0 for a in big.values())
    scratch = [a for a in rnn._scratch_arrays.values() if 4 * int(np.prod(a.shape)) >= HUGE_PAGE]
    assert scratch and all(address(a) % HUGE_PAGE == 0 for a in scratch)
    assert type(y) is type(x) and (frame == "numpy" or y.untyped_storage().resizable())  # outputs: the framework's own
    np.testing.assert_array_equal(np.asarray(y), np.asarray(results["0"][1]))
    assert all(np.array_equal(grads[k], results["0"][3][k]) for k in grads)
    with torch.no_grad():
        want = ref(torch.as_tensor(np.asarray(x)))[0].numpy()
    assert rel_error(y, want) < TOL
    again = rnn.forward_train(w, x)[3]  # the dropped workspace, huge pages and all, comes back
    assert {k: address(again.arrays[k]) for k in big} == big
    assert all(np.array_equal(copied(v), grads[k]) for k, v in rnn.backward(w, again, dy).items())
    a = huge_empty((3, 5))  # small and odd shapes work too, and outlive their mapping's name
    a[...] = 1.5
    assert a.shape == (3, 5) and a.flags["C_CONTIGUOUS"] and a.flags["WRITEABLE"] and float(a.sum()) == 22.5
    monkeypatch.setenv("TVMRNN_HUGE_PAGES", "maybe")
    with pytest.raises(ValueError, match="TVMRNN_HUGE_PAGES: expected auto, 0 or 1"):
        huge_pages()


def test_a_build_for_a_cpu_this_one_is_not_is_refused_at_its_first_run(monkeypatch):
    """A build for another CPU target (to export it) builds anywhere; run on a CPU without the
    instructions it compiled in, it raises a RuntimeError naming them before any of its code runs
    (never an illegal instruction), and says the same at every later call. (The CPU's flags are
    those of a CPU with AVX2 only, whatever this one has.)"""
    import tvm
    from tvmrnn import device
    from tvmrnn.device import missing_host_features
    monkeypatch.setattr(device, "_cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma", "f16c"})
    avx512 = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512"})
    assert missing_host_features(avx512) == ["avx512f", "avx512bw", "avx512vl", "avx512dq"]
    assert missing_host_features(tvm.target.Target({"kind": "llvm", "mcpu": "haswell"})) == []
    assert missing_host_features(tvm.target.Target("nvidia/nvidia-h100")) == []
    rnn = tvmrnn.build("gru", 5, 7, batch_size=2, target={"kind": "llvm", "mcpu": "skylake-avx512"},
                       tuning_logs=False, cache=False)
    params = tvmrnn.params_from_torch(torch.nn.GRU(5, 7))
    for _ in range(2):  # (packing runs the build's code too)
        with pytest.raises(RuntimeError, match=r"skylake-avx512\) uses avx512f, avx512bw, avx512vl, avx512dq, which this CPU"):
            rnn.pack_weights(params)
    # a bf16 build for AMX builds anywhere; at its first run on a CPU with AMX whose OS refuses the
    # process its tiles, it says so (before a tile instruction would kill the process)
    from tvmrnn.schedules import bf16
    monkeypatch.setattr(device, "_cpu_flags", lambda: {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq",
                                                       "avx512_bf16", "amx_tile", "amx_bf16"})
    monkeypatch.setattr(bf16, "request_amx", lambda: False)
    amx = tvmrnn.build("lstm", 32, 32, batch_size=4, target={"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2},
                       tuning_logs=False, cache=False, options=tvmrnn.BuildOptions(bf16_projections=True))
    with pytest.raises(RuntimeError, match="OS refused this process their use"):
        amx.pack_weights(tvmrnn.params_from_torch(torch.nn.LSTM(32, 32)))
