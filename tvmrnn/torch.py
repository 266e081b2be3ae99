"""PyTorch drop-ins: ``tvmrnn.torch.LSTM``, ``GRU`` and ``RNN``, and ``CustomRNN`` for custom cells.

Each of the first three subclasses its ``torch.nn`` counterpart, so the constructor, the
parameters (names, shapes, initialisation), ``state_dict``/``load_state_dict`` and ``.to()`` are
PyTorch's own; only ``forward`` changes: it runs tvmrnn's fused passes through a
``torch.autograd.Function`` whose backward is tvmrnn's backward. ``CustomRNN`` is the same for a
cell made by :func:`tvmrnn.define_cell`, with parameters named and initialised the way PyTorch
would (and the cell's per-unit parameters after the four of each layer and direction). Tensors
reach the kernels through DLPack, without copies.

The kernels are built for a fixed batch size: each module builds (or takes, via ``package=``)
one tvmrnn RNN per (batch size, device) it meets, and caches it.
"""
from __future__ import annotations

import torch

from .cells.definition import Cell, get_cell
from .cells.parameters import Layout
from .runtime.rnn import RNN as _FusedRNN
from .runtime.rnn import build


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
    """What the drop-ins share: checks, the per-batch-size cache and ``forward``."""

    _cell: str | Cell

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
            cell = get_cell(self._cell)
            if have != c or pc.cell.signature != cell.signature:
                raise ValueError(f"package: built for {pc.cell.name} {have}, this module needs {cell.name} {c}")
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
        has_c = get_cell(self._cell).has_cell_state
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


class CustomRNN(_Mixin, torch.nn.Module):
    """A multi-layer RNN of a custom cell (:func:`tvmrnn.define_cell`), used like ``torch.nn.LSTM``.

    Parameters
    ----------
    cell : Cell or str
        A cell made by :func:`tvmrnn.define_cell` (or a built-in cell's name); with ``package``,
        also the cell of a loaded package (``tvmrnn.load(path).config.cell``), which has no math.
    input_size, hidden_size, num_layers, bias, batch_first, bidirectional
        As for ``torch.nn.LSTM`` (``bias`` must stay True).
    package, target
        As for :class:`LSTM`: a built or loaded tvmrnn RNN to run on, or where to build.

    Parameters are ``weight_ih_l{k}`` ``(G*hidden_size, K)``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` with the cell's G gates stacked in its order, then each per-unit parameter
    ``{name}_l{k}`` ``(hidden_size,)`` (``_reverse`` for the backward direction). All start uniform
    in ``(-1/sqrt(hidden_size), 1/sqrt(hidden_size))`` as PyTorch's do, except per-unit
    parameters the cell gives an ``init`` for. ``forward(input, hx)`` takes and returns states
    as ``torch.nn.LSTM`` does for cells with a cell state (``hx = (h0, c0)``) and as
    ``torch.nn.GRU`` does otherwise.
    """

    def __init__(self, cell, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, bidirectional: bool = False, package=None, target=None,
                 device=None, dtype=None):
        super().__init__()
        self._cell = get_cell(cell)
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.bidirectional = bias, batch_first, bidirectional
        self.proj_size, self.dropout = 0, 0.0  # what _setup checks; tvmrnn has neither
        self._setup(package, target)
        self._layout = Layout.create(input_size, hidden_size, num_layers, 2 if bidirectional else 1,
                                     self._cell.num_gates, self._cell.unit_params)
        for slot in self._layout.slots:
            self.register_parameter(slot.name, torch.nn.Parameter(torch.empty(slot.torch_shape, device=device,
                                                                              dtype=dtype)))
        self.reset_parameters()

    @property
    def cell(self) -> Cell:
        return self._cell

    def reset_parameters(self) -> None:
        bound = self.hidden_size ** -0.5
        init = dict(self._cell.unit_param_init)
        with torch.no_grad():
            for slot in self._layout.slots:
                param = getattr(self, slot.name)
                if slot.kind in init:
                    param.fill_(init[slot.kind])
                else:
                    param.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        return (f"{self._cell.name}, {self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, bidirectional={self.bidirectional}")
