"""The drop-ins inside torch.compile'd models: the passes as torch.library custom ops
(``tvmrnn::forward``, ``tvmrnn::forward_train``, ``tvmrnn::backward``) where Dynamo traces the
module, one graph break around it where it does not (torch.nn's RNN modules, unless
``torch._dynamo.config.allow_rnn``), the same results as torch.nn in float64 either way."""
from __future__ import annotations

import pytest
import torch
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

import tvmrnn.torch as tt
from conftest import I, H, N, built, rel_error


class Model(torch.nn.Module):
    """An RNN and a head, as a training script would compile them."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn
        self.head = torch.nn.Linear(rnn.hidden_size * (2 if rnn.bidirectional else 1), 3)

    def forward(self, x):
        y, state = self.rnn(x)
        h = state[0] if isinstance(state, tuple) else state
        return self.head(y).log_softmax(-1).mean() + h.square().mean()


def _pair(ours):
    torch.manual_seed(0)
    model = Model(ours)
    ref = Model({tt.LSTM: torch.nn.LSTM, tt.GRU: torch.nn.GRU}[type(ours)](
        ours.input_size, ours.hidden_size, num_layers=ours.num_layers, bidirectional=ours.bidirectional,
        dropout=ours.dropout))
    ref.load_state_dict(model.state_dict())
    return model, ref.double()


def _recording_backend():
    """aot_eager that keeps the text of every forward and backward graph it compiles."""
    graphs = []

    def record(gm, _inputs):
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)

    return aot_autograd(fw_compiler=record, bw_compiler=record), graphs


def _check_step(model, ref, compiled, x):
    loss = compiled(x)
    loss.backward()
    expected = ref(x.double())
    expected.backward()
    assert abs(loss.item() - expected.item()) <= 1e-5 * abs(expected.item())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel_error(p.grad, q.grad) < 1e-4, name
    model.zero_grad()
    ref.zero_grad()


@pytest.mark.parametrize("allow_rnn", [False, True])
def test_compiled_model_trains_like_torch(allow_rnn):
    """A 2-layer bidirectional LSTM and a head, compiled: losses and every gradient as torch.nn's in
    float64, at two batch sizes on one build (the op picks the build at run time). With Dynamo let
    into RNN modules, the whole model is one graph (``fullgraph``) whose forward holds
    ``tvmrnn::forward_train`` and whose backward holds ``tvmrnn::backward``; without, the module
    runs between two graphs, as torch.nn's LSTM does."""
    ours = tt.LSTM(I, H, num_layers=2, bidirectional=True, package=built("lstm", 2, True))
    model, ref = _pair(ours)
    backend, graphs = _recording_backend()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=allow_rnn):
        compiled = torch.compile(model, backend=backend, fullgraph=allow_rnn)
        for n in (N, N - 1, N):
            _check_step(model, ref, compiled, torch.randn(9, n, I))
        with torch.no_grad():  # the inference op
            x = torch.randn(5, N, I)
            assert rel_error(compiled(x), ref(x.double())) < 1e-5
    text = "\n".join(graphs)
    assert ("tvmrnn.forward_train" in text and "tvmrnn.backward" in text and "tvmrnn.forward." in text) == allow_rnn


def test_compiled_layer_by_layer_dropout_with_inductor():
    """Dropout between layers runs the stack as one-layer ops (layer 1's own parameters); p = 1
    makes it deterministic, so torch.nn in float64 is the reference. Inductor (torch.compile's
    default backend) compiles around the ops, whose workspace sizes it cannot know in advance."""
    ours = tt.GRU(4, 5, num_layers=2, bidirectional=True, dropout=1.0)
    model, ref = _pair(ours)
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = torch.compile(model, fullgraph=True)
        _check_step(model, ref, compiled, torch.randn(6, 2, 4))
    assert len(ours._built) == 2  # layer 0's build and the one layer 1 runs on


def test_custom_ops_pass_torch_opcheck():
    """torch.library.opcheck: the schemas, the fake (meta) implementations against the real ones,
    and the autograd registration, under AOT dispatch too."""
    ours = tt.GRU(I, H, package=built("gru", 1, False))
    x, h0 = torch.randn(4, N, I), torch.randn(1, N, H)
    params = [p.detach().clone() for p in ours.parameters()]
    torch.library.opcheck(torch.ops.tvmrnn.forward.default, (ours._handle, -1, x, h0, None, None, False, params))
    params = [p.requires_grad_() for p in params]  # the training forward has the backward op as its gradient
    torch.library.opcheck(torch.ops.tvmrnn.forward_train.default,
                          (ours._handle, -1, x.requires_grad_(), h0.requires_grad_(), None, None, False, params))


def test_an_op_outliving_its_module_says_so():
    ours = tt.GRU(I, H, package=built("gru", 1, False))
    handle = ours._handle
    del ours
    import gc
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer exists"):
        torch.ops.tvmrnn.forward(handle, -1, torch.randn(2, N, I), torch.zeros(1, N, H), None, None, False, [])


class ProjModel(Model):
    def __init__(self, rnn):
        torch.nn.Module.__init__(self)
        self.rnn = rnn
        self.head = torch.nn.Linear(rnn.proj_size * (2 if rnn.bidirectional else 1), 3)


@pytest.mark.parametrize("allow_rnn", [False, True])
def test_compiled_model_with_projections_trains_like_torch(allow_rnn):
    """``proj_size`` under torch.compile on a CPU: the fused LSTMP build through the custom ops, the
    whole model one graph where Dynamo traces RNN modules (``fullgraph``); losses and every
    gradient as torch.nn's in float64, at two batch sizes. (On a GPU each layer runs eagerly, a
    graph break around it: tests/test_cuda.py.)"""
    torch.manual_seed(0)
    model = ProjModel(tt.LSTM(5, 8, proj_size=3, num_layers=2, bidirectional=True))
    ref = ProjModel(torch.nn.LSTM(5, 8, proj_size=3, num_layers=2, bidirectional=True))
    ref.load_state_dict(model.state_dict())
    ref = ref.double()
    backend, graphs = _recording_backend()
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=allow_rnn):
        compiled = torch.compile(model, backend=backend, fullgraph=allow_rnn)
        for n in (3, 2):
            _check_step(model, ref, compiled, torch.randn(6, n, 5))
    text = "\n".join(graphs)
    assert ("tvmrnn.forward_train" in text and "tvmrnn.backward" in text) == allow_rnn


def test_traced_model_runs_the_custom_ops_like_torch():
    """``torch.jit.trace`` of a model with a drop-in records the custom ops (before v74 it failed:
    the traced batch size was a tensor), and the traced model then takes other lengths and batch
    sizes, with gradients, as torch.nn in float64 does; a graph that outlives its module raises.
    The trace's own check passes (it runs the model again under no_grad: the op chosen by grad
    mode made another graph), and a model traced under no_grad trains."""
    model, ref = _pair(tt.GRU(I, H, num_layers=2, bidirectional=True))
    torch.manual_seed(1)
    traced = torch.jit.trace(model, (torch.randn(5, N, I),))
    assert "tvmrnn::forward_train" in str(traced.inlined_graph)
    with torch.no_grad():
        traced_quietly = torch.jit.trace(model, (torch.randn(5, N, I),))
    _check_step(model, ref, traced_quietly, torch.randn(6, N, I))
    for T, rows in ((5, N), (9, N + 2), (3, 1)):
        _check_step(model, ref, traced, torch.randn(T, rows, I))
    with torch.no_grad():
        x = torch.randn(4, N, I)
        assert rel_error(traced(x), ref(x.double())) < 1e-5
    del model
    import gc
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer exists"):
        traced(torch.randn(5, N, I))
