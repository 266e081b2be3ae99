"""A unidirectional stack's passes as a wavefront of its layers (``BuildOptions.layer_wavefront``,
``passes._wavefront_forward``, ``_wavefront_backward``): every layer's steps of a wave in one
launch, layer l one chunk of steps behind layer l-1. Checked on the CPU, where the option forces
it, against torch.nn in float64 (and a custom cell against its own layer-by-layer build),
with short chunks so that every part runs: the waves that start and finish the layers, the full
waves between, the steps left after them, and sequences too short for any wave."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tvmrnn
from tvmrnn.cells import examples as ex
from tvmrnn.cells import get_cell
from tvmrnn.program import passes
from tvmrnn.program.sequence import FlatTensor, Stacked, _view_layout
from conftest import built, rel_error
from test_rnn import _check

I, H, N, L = 13, 37, 3, 3
WAVE = tvmrnn.BuildOptions(layer_wavefront=True)
# chunks of 4 steps: at L = 3 waves need T >= 8; T = 13 runs 2 starting waves, 1 full, 2 finishing
# and 1 step after; T = 9 none full; T = 7 no wave at all; T = 12 no step after the forward's
# waves, and the backward's 4 steps before its waves (T - 1 = 11: 2 chunks, 3 steps: r = 4 at 12)
LENGTHS = (7, 9, 12, 13, 22)


@pytest.fixture
def short_waves(monkeypatch):
    monkeypatch.setattr(passes, "WAVE_STEPS", 4)


def _build(cell, options=WAVE, batch_first=False, hidden=H):
    return tvmrnn.build(cell, input_size=I, hidden_size=hidden, num_layers=L, batch_size=N, batch_first=batch_first,
                        options=options, cache=False)


def _steps(rnn):
    return {k for k in rnn.schedules if k.startswith("recurrent_step") and "infer" in k}


@pytest.mark.parametrize("cell,batch_first", [("lstm", False), ("gru", True)])
def test_wavefront_matches_torch(short_waves, cell, batch_first, rng):
    """Inference, training forward and backward as wavefronts (the training workspace keeps the
    last layer's states beside the others'), against torch.nn in float64."""
    rnn = built(cell, L, False, batch_first, options=WAVE)
    assert rnn.config.wavefront and rnn.config.wave_steps == 4 and "hs" not in rnn.config.workspace_shapes(5)
    for name, kind in (("forward", "recurrent_step"), ("forward_train", "recurrent_step"), ("backward", "backward_step")):
        steps = {k for k in rnn.programs[name].kernels if k.startswith(kind)}
        assert any(k.endswith("_d3") for k in steps) and any(k.endswith("_d2") for k in steps), steps
    for T in LENGTHS:
        _check(cell, L, False, batch_first, T, rng, options=WAVE)


def test_wavefront_with_lengths_and_per_unit_parameters(short_waves):
    """A custom cell with per-unit parameters (they stack with the recurrent weights) on rows of
    different lengths: the same as its layer-by-layer build, and as its reference."""
    options = tvmrnn.BuildOptions(variable_lengths=True)
    cell = ex.PEEPHOLE_LSTM
    wave = _build(cell, options=tvmrnn.BuildOptions(variable_lengths=True, layer_wavefront=True))
    plain = _build(cell, options=options)
    assert wave.config.wave_steps == 4
    assert any(k.endswith("_masked") and "_d3" in k for k in _steps(wave)), _steps(wave)
    assert not any("_d" in k.rsplit("h37", 1)[-1] for k in _steps(plain)), _steps(plain)
    rng = np.random.default_rng(3)
    params = {name: (rng.standard_normal(shape) * 0.3).astype(np.float32)
              for name, shape, _ in wave.config.layout.parameter_list()}
    T = 22
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    lengths = [22, 9, 14]
    outs = [rnn.forward(rnn.pack_weights(params), x, lengths=lengths) for rnn in (wave, plain)]
    for a, b in zip(outs[0], outs[1]):
        assert rel_error(a, b) < 1e-6
    # training: the wavefront's forward and its workspace's backward, against layer after layer
    dy = rng.standard_normal((T, N, H)).astype(np.float32)
    dh = rng.standard_normal((L, N, H)).astype(np.float32)
    grads = []
    for rnn in (wave, plain):
        packed = rnn.pack_weights(params)
        y, hy, cy, ws = rnn.forward_train(packed, x, lengths=lengths)
        assert rel_error(y, outs[0][0]) < 1e-6
        grads.append(rnn.backward(packed, ws, dy, dh, dh))
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert rel_error(grads[0][name], grads[1][name]) < 1e-5, name
    # full lengths against the cell's reference, one step at a time in float64
    y, hy, cy = wave.forward(wave.pack_weights(params), x, lengths=[T] * N)
    with torch.no_grad():
        yr, hyr, cyr = ex.reference_forward(cell, {k: torch.from_numpy(v).double() for k, v in params.items()},
                                            torch.from_numpy(x).double(), num_layers=L)
    assert rel_error(y, yr) < 1e-5 and rel_error(hy, hyr) < 1e-5 and rel_error(cy, cyr) < 1e-5


def test_the_wavefront_is_the_default_where_every_layers_weights_fit_the_chip():
    h100 = tvmrnn.device.resolve("nvidia/nvidia-h100")

    def on(cell="gru", hidden=126, layers=3, bidirectional=False, target=h100, options=tvmrnn.BuildOptions(), proj=0,
           rows=32):
        config = passes.Config(get_cell(cell), hidden, hidden, layers, bidirectional, rows, False, proj_size=proj)
        return passes.layer_wavefront(config, target, options)
    assert on() and on("lstm", 455, 2, rows=8) and on("gru", 256, 3, rows=128) and on("lstm", 128, 2, rows=256)
    assert not on("lstm", 512, 2, rows=64)  # 67 M multiply-adds a step: it keeps the GPU busy alone
    assert not on(layers=1) and not on(bidirectional=True) and not on("lstm", 126, proj=64)
    assert not on("lstm", 1024, 2, rows=1)  # 33 MB of recurrent weights: more than half the H100's shared memory
    assert not on(target=None) and on(target=None, options=WAVE)  # CPUs: only when asked
    assert not on(options=tvmrnn.BuildOptions(layer_wavefront=False))
    assert not on(options=tvmrnn.BuildOptions(layer_wavefront=True, dtype="float16"))  # fp32 kernels only
    # the training passes where the inference forward is one (v88: run and timed on the H100)
    stack = passes.Config(get_cell("gru"), 126, 126, 3, False, 32, False)
    assert passes.training_wavefront(stack, h100, tvmrnn.BuildOptions())
    assert not passes.training_wavefront(stack, None, tvmrnn.BuildOptions()) and passes.training_wavefront(stack, None, WAVE)
    assert not passes.training_wavefront(stack, h100, tvmrnn.BuildOptions(layer_wavefront=False))
    big = passes.Config(get_cell("lstm"), 512, 512, 2, False, 64, False)
    assert not passes.training_wavefront(big, h100, tvmrnn.BuildOptions())


def test_stacked_views_must_be_one_stride_apart():
    """A leading axis over k views: each the same distance from the one before, else no kernel
    could address them with one stride."""
    from tvm import tirx
    flat = FlatTensor("w", 100)
    param = tirx.decl_buffer((3, 4), "float32", "p")
    data, offset, strides = _view_layout(Stacked((flat.piece(0), flat.piece(10), flat.piece(20))), param)
    assert int(strides[0]) == 10 and int(offset) == 0
    with pytest.raises(AssertionError, match="one stride apart"):
        _view_layout(Stacked((flat.piece(0), flat.piece(10), flat.piece(30))), param)
    with pytest.raises(AssertionError, match="a stack of 3 views"):
        _view_layout(Stacked((flat.piece(0), flat.piece(10))), param)


def test_a_wavefront_that_would_not_run_persistent_leaves_no_kernel_behind(monkeypatch):
    """The H100's default makes every pass a wavefront (the training workspace's layout too),
    with its stacked steps persistent; where they would not all run persistent (forced here),
    the layers run one after another in every pass, the training workspace is layer by layer's,
    and the module holds as many CUDA kernels as a build without the wavefront (compiled here,
    not run)."""
    from tvmrnn.program.sequence import Program

    def kernels_of(**build):
        rnn = tvmrnn.build("gru", input_size=I, hidden_size=H, num_layers=L, batch_size=N,
                           target="nvidia/nvidia-h100", cache=False, **build)
        return rnn, rnn.executable.mod.imports[0].inspect_source().count("__global__")
    plain, without = kernels_of(options=tvmrnn.BuildOptions(layer_wavefront=False))
    config = passes.Config(get_cell("gru"), I, H, L, False, N, False)
    assert passes.layer_wavefront(config, tvmrnn.device.resolve("nvidia/nvidia-h100"), tvmrnn.BuildOptions())
    default = tvmrnn.plan("gru", input_size=I, hidden_size=H, num_layers=L, batch_size=N, target="nvidia/nvidia-h100")
    assert default.config.wave_steps == passes.WAVE_STEPS
    for name in ("forward", "forward_train", "backward"):
        assert any(f"_d{L}_" in k for k in default.programs[name].kernels), name
        assert default.programs[name].all_step_loops_persistent, name
    monkeypatch.setattr(Program, "all_step_loops_persistent", property(lambda self: False))
    rnn, fallback = kernels_of()
    for name in ("forward", "forward_train", "backward"):
        assert not any(f"_d{L}_" in k for k in rnn.programs[name].kernels), name
    assert rnn.config.wave_steps == 0 and plain.config.wave_steps == 0
    assert fallback == without
