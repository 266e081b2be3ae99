"""PyTorch drop-ins: ``tvmrnn.torch.LSTM``, ``GRU`` and ``RNN``.

Each subclasses its ``torch.nn`` counterpart, so the constructor, the parameters (names, shapes,
initialisation), ``state_dict``/``load_state_dict`` and ``.to()`` are PyTorch's own; only
``forward`` changes: it runs tvmrnn's fused passes through a ``torch.autograd.Function`` whose
backward is tvmrnn's backward. Tensors reach the kernels through DLPack, without copies.

The kernels are built for a fixed batch size: each module builds (or takes, via ``package=``)
one tvmrnn RNN per (batch size, device) it meets, and caches it.
"""
from __future__ import annotations

import torch

from .rnn import RNN as _FusedRNN
from .rnn import build


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rnn, names, x, h0, c0, *params):
        w = rnn.pack_weights(dict(zip(names, params)))
        if any(ctx.needs_input_grad[2:]):
            y, hy, cy, ws = rnn.forward_train(w, x, h0, c0)
            ctx.rnn, ctx.w, ctx.ws, ctx.names = rnn, w, ws, names
        else:
            y, hy, cy = rnn.forward(w, x, h0, c0)
        return (y, hy) if cy is None else (y, hy, cy)

    @staticmethod
    def backward(ctx, dy, dhy, dcy=None):
        has_c = dcy is not None
        grads = ctx.rnn.backward(ctx.w, ctx.ws, dy.contiguous(), dhy.contiguous(),
                                 dcy.contiguous() if has_c else None)
        return (None, None, grads["x"], grads["h0"], grads.get("c0")) + tuple(grads[n] for n in ctx.names)


class _Mixin:
    """What the three drop-ins share: checks, the per-batch-size cache and ``forward``."""

    _cell: str

    def _setup(self, package, target):
        if self.proj_size:
            raise ValueError("proj_size: tvmrnn has no projections; use proj_size=0")
        if not self.bias:
            raise ValueError("bias: tvmrnn needs biases; use bias=True (zero them for none)")
        if self.dropout:
            raise ValueError("dropout: tvmrnn has no inter-layer dropout; use dropout=0")
        if package is not None and not isinstance(package, _FusedRNN):
            raise TypeError(f"package: expected a tvmrnn RNN (tvmrnn.build or tvmrnn.load), got {type(package).__name__}")
        self._package, self._target, self._built = package, target, {}

    def _rnn_for(self, batch_size: int, device: torch.device) -> _FusedRNN:
        c = dict(input_size=self.input_size, hidden_size=self.hidden_size, num_layers=self.num_layers,
                 bidirectional=self.bidirectional, batch_size=batch_size, batch_first=self.batch_first)
        if self._package is not None:
            pc = self._package.config
            have = dict(input_size=pc.input_size, hidden_size=pc.hidden_size, num_layers=pc.num_layers,
                        bidirectional=pc.bidirectional, batch_size=pc.batch_size, batch_first=pc.batch_first)
            if have != c or pc.cell.name != self._cell:
                raise ValueError(f"package: built for {pc.cell.name} {have}, this module needs {self._cell} {c}")
            return self._package
        key = (batch_size, str(device))
        if key not in self._built:
            target = self._target if self._target is not None else ("cuda" if device.type == "cuda" else None)
            self._built[key] = build(self._cell, target=target, **c)
        return self._built[key]

    def forward(self, input, hx=None):
        if isinstance(input, torch.nn.utils.rnn.PackedSequence):
            raise TypeError("input: PackedSequence is not supported by tvmrnn; pad the batch instead")
        if input.dim() not in (2, 3):
            raise ValueError(f"input: expected a 2-d (unbatched) or 3-d tensor, got shape {tuple(input.shape)}")
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1 if not self.batch_first else 0)
        has_c = self._cell == "lstm"
        h0, c0 = (hx if hx is not None else (None, None)) if has_c else (hx, None)
        if unbatched:
            h0 = h0.unsqueeze(1) if h0 is not None else None
            c0 = c0.unsqueeze(1) if c0 is not None else None
        batch = input.shape[0 if self.batch_first else 1]
        rnn = self._rnn_for(batch, input.device)
        state = (self.num_layers * (2 if self.bidirectional else 1), batch, self.hidden_size)
        h0 = h0.contiguous() if h0 is not None else input.new_zeros(state)
        if has_c:
            c0 = c0.contiguous() if c0 is not None else input.new_zeros(state)
        names = rnn.config.layout.names
        params = [getattr(self, n) for n in names]
        out = _Fused.apply(rnn, names, input.contiguous(), h0, c0, *params)
        y, hy = out[0], out[1]
        if unbatched:
            y = y.squeeze(1 if not self.batch_first else 0)
            hy = hy.squeeze(1)
            out = (y, hy) + ((out[2].squeeze(1),) if has_c else ())
        return (y, (hy, out[2])) if has_c else (y, hy)


class LSTM(_Mixin, torch.nn.LSTM):
    """``torch.nn.LSTM`` with tvmrnn's fused kernels. Extra keywords: ``package`` (a built or
    loaded tvmrnn RNN to run on) and ``target`` (where to build; default: the input's device)."""

    _cell = "lstm"

    def __init__(self, *args, package=None, target=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup(package, target)


class GRU(_Mixin, torch.nn.GRU):
    """``torch.nn.GRU`` with tvmrnn's fused kernels (see :class:`LSTM` for the extra keywords)."""

    _cell = "gru"

    def __init__(self, *args, package=None, target=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup(package, target)


class RNN(_Mixin, torch.nn.RNN):
    """``torch.nn.RNN`` (``nonlinearity="tanh"`` or ``"relu"``) with tvmrnn's fused kernels."""

    def __init__(self, *args, package=None, target=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._cell = "rnn_" + self.nonlinearity
        self._setup(package, target)
