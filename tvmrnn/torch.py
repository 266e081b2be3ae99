"""PyTorch drop-ins: ``tvmrnn.torch.LSTM``, ``GRU`` and ``RNN``, and ``CustomRNN`` for custom cells.

Each of the first three subclasses its ``torch.nn`` counterpart, so the constructor, the
parameters (names, shapes, initialisation), ``state_dict``/``load_state_dict`` and ``.to()`` are
PyTorch's own; only ``forward`` changes: it runs tvmrnn's fused passes through a
``torch.autograd.Function`` whose backward is tvmrnn's backward. ``CustomRNN`` is the same for a
cell made by :func:`tvmrnn.define_cell`, with parameters named and initialised the way PyTorch
would (and the cell's per-unit parameters after the four of each layer and direction). Tensors
reach the kernels through DLPack, without copies.

A build runs any batch up to its batch size (padded): each module runs a batch on the smallest
build it has that takes it, builds for a larger batch once (from the on-disk build cache when an
earlier process made it; ``rebuild=False`` refuses instead), or runs on the RNN given as
``package=``. ``bias=False`` passes zero biases; ``dropout`` between layers runs the stack layer
by layer in training (two builds: the first layer's and one the others share), drawing the
same masks from PyTorch's RNG as ``torch.nn`` does. A ``PackedSequence`` runs padded to its
longest row on a variable-lengths build (:class:`tvmrnn.BuildOptions`), rows masked as they end,
and comes back packed as ``torch.nn`` returns it. ``proj_size`` is not supported yet.
"""
from __future__ import annotations

import numbers
import re

import torch
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from .cells.definition import Cell, get_cell
from .options import BuildOptions
from .cells.parameters import Layout
from .runtime.rnn import RNN as _FusedRNN
from .runtime.build import build


class _Fused(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rnn, names, lengths, x, h0, c0, *params):
        w = rnn.pack_weights(dict(zip(names, params)))
        if any(ctx.needs_input_grad[3:]):
            y, hy, cy, ws = rnn.forward_train(w, x, h0, c0, lengths=lengths)
            ctx.rnn, ctx.w, ctx.ws, ctx.names = rnn, w, ws, names
        else:
            y, hy, cy = rnn.forward(w, x, h0, c0, lengths=lengths)
        return (y, hy) if cy is None else (y, hy, cy)

    @staticmethod
    def backward(ctx, dy, dhy, dcy=None):
        has_c = dcy is not None
        grads = ctx.rnn.backward(ctx.w, ctx.ws, dy.contiguous(), dhy.contiguous(),
                                 dcy.contiguous() if has_c else None)
        return (None, None, None, grads["x"], grads["h0"], grads.get("c0")) + tuple(grads[n] for n in ctx.names)


class _Mixin:
    """What the drop-ins share: checks, the builds they run on and ``forward``."""

    _cell: str | Cell

    def _setup(self, package, target, rebuild=True):
        if self.proj_size:
            raise ValueError("proj_size: tvmrnn has no projections yet; use proj_size=0")
        if package is not None and not isinstance(package, _FusedRNN):
            raise TypeError(f"package: expected a tvmrnn RNN (tvmrnn.build or tvmrnn.load), got {type(package).__name__}")
        if not isinstance(rebuild, bool):
            raise TypeError(f"rebuild: expected bool, got {type(rebuild).__name__}")
        self._package, self._target, self._rebuild = package, target, rebuild and package is None
        self._built = {}  # (input_size, num_layers, batch size, device, variable lengths) -> tvmrnn RNN
        self._zero_biases = {}  # (name, device) -> zeros, for bias=False

    def _rnn_for(self, batch_size: int, device: torch.device, layer: int | None = None,
                 ragged: bool = False) -> _FusedRNN:
        """The build to run ``batch_size`` rows on: the smallest one made so far that takes that many
        (a build runs any smaller batch, padded), else a new one for this batch (from the build cache
        when an earlier process made it). ``layer``: a one-layer build for that layer alone (dropout
        between layers runs the stack layer by layer). ``ragged``: a build for rows of different
        lengths (``PackedSequence`` input)."""
        D = 2 if self.bidirectional else 1
        input_size = self.input_size if not layer else D * self.hidden_size
        num_layers = self.num_layers if layer is None else 1
        if self._package is not None:
            pc = self._package.config
            if layer is not None:
                raise ValueError("dropout: a module running on a package (package=) has no per-layer builds for "
                                 "dropout between layers; use dropout=0, or eval()")
            have = dict(input_size=pc.input_size, hidden_size=pc.hidden_size, num_layers=pc.num_layers,
                        bidirectional=pc.bidirectional, batch_first=pc.batch_first)
            need = dict(input_size=input_size, hidden_size=self.hidden_size, num_layers=num_layers,
                        bidirectional=self.bidirectional, batch_first=self.batch_first)
            cell = get_cell(self._cell)
            if have != need or pc.cell.signature != cell.signature:
                raise ValueError(f"package: built for {pc.cell.name} {have}, this module needs {cell.name} {need}")
            if batch_size > pc.batch_size:
                raise ValueError(f"input: a batch of {batch_size} rows; the package runs batches of at most "
                                 f"{pc.batch_size}")
            if ragged and not pc.options.variable_lengths:
                raise ValueError("input: a PackedSequence needs a package built with "
                                 "options=tvmrnn.BuildOptions(variable_lengths=True)")
            return self._package
        fits = [(n, rnn) for (i, l, n, d, r), rnn in self._built.items()
                if (i, l, d, r) == (input_size, num_layers, str(device), ragged) and n >= batch_size]
        if fits:
            return min(fits, key=lambda f: f[0])[1]
        if not self._rebuild and any((i, l, r) == (input_size, num_layers, ragged) for i, l, _, _, r in self._built):
            largest = max(n for i, l, n, _, r in self._built if (i, l, r) == (input_size, num_layers, ragged))
            raise ValueError(f"input: a batch of {batch_size} rows; this module was built for at most {largest} "
                             f"and rebuild=False")
        target = self._target if self._target is not None else ("cuda" if device.type == "cuda" else None)
        rnn = build(self._cell, input_size=input_size, hidden_size=self.hidden_size, num_layers=num_layers,
                    bidirectional=self.bidirectional, batch_size=batch_size, batch_first=self.batch_first,
                    target=target, options=BuildOptions(variable_lengths=True) if ragged else None)
        self._built[(input_size, num_layers, batch_size, str(device), ragged)] = rnn
        return rnn

    def _parameters_of(self, names, layer: int | None):
        """The module's parameters under a build's names (``layer``: a one-layer build's ``_l0``
        names are that layer's); zeros for the biases of a module made with ``bias=False``."""
        params = []
        for name in names:
            own = name if layer is None else re.sub(r"_l0(_reverse)?$", rf"_l{layer}\1", name)
            p = getattr(self, own, None)
            if p is None:  # bias=False: torch.nn has no bias parameters; the kernels add zeros
                p = self._zero_bias(own)
            params.append(p)
        return params

    def _zero_bias(self, name):
        weight = getattr(self, re.sub(r"^bias_(ih|hh)", "weight_hh", name))  # (G * hidden_size, hidden_size)
        key = (name, weight.device)
        if key not in self._zero_biases:
            self._zero_biases[key] = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
        return self._zero_biases[key]

    def forward(self, input, hx=None):
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
        if input.dim() not in (2, 3):
            raise ValueError(f"input: expected a 2-d (unbatched) or 3-d tensor, got shape {tuple(input.shape)}")
        return self._forward_fp32(input, hx)

    def _forward_fp32(self, input, hx, lengths=None):
        """:meth:`_forward` in fp32: tvmrnn's kernels are fp32, so under torch.autocast they run in
        fp32 and return fp32 (a half input is widened), where torch.nn's cuDNN path would run in
        half precision."""
        with torch.autocast(input.device.type, enabled=False):
            return self._forward(input.float() if input.dtype in (torch.float16, torch.bfloat16) else input, hx,
                                 lengths=lengths)

    def _forward_packed(self, packed, hx):
        """A ``PackedSequence`` in, one out (with the input's batch order), as torch.nn: the rows run
        padded to the longest with their lengths (a variable-lengths build), states in the
        caller's row order."""
        padded, lengths = pad_packed_sequence(packed, batch_first=self.batch_first)  # rows in the caller's order
        y, states = self._forward_fp32(padded, hx, lengths=lengths)
        axis = 0 if self.batch_first else 1
        if packed.sorted_indices is not None:  # pack in the input's (sorted) order, as it was
            y = y.index_select(axis, packed.sorted_indices)
            lengths = lengths[packed.sorted_indices.cpu()]
        data = pack_padded_sequence(y, lengths, batch_first=self.batch_first, enforce_sorted=True).data
        return PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices), states

    def _forward(self, input, hx, lengths=None):
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1 if not self.batch_first else 0)
        has_c = get_cell(self._cell).has_cell_state
        h0, c0 = (hx if hx is not None else (None, None)) if has_c else (hx, None)
        if unbatched:
            h0 = h0.unsqueeze(1) if h0 is not None else None
            c0 = c0.unsqueeze(1) if c0 is not None else None
        batch = input.shape[0 if self.batch_first else 1]
        D = 2 if self.bidirectional else 1
        state = (self.num_layers * D, batch, self.hidden_size)
        h0 = h0.float().contiguous() if h0 is not None else input.new_zeros(state)
        if has_c:
            c0 = c0.float().contiguous() if c0 is not None else input.new_zeros(state)
        if self.dropout and self.training and self.num_layers > 1:
            # dropout between layers, as torch.nn does in training: the stack runs layer by layer
            # (one build for the first layer, one shared by the others); eval runs the fused stack
            y, hys, cys = input.contiguous(), [], []
            for k in range(self.num_layers):
                if k:
                    y = torch.nn.functional.dropout(y, self.dropout, training=True)
                rnn = self._rnn_for(batch, input.device, layer=k, ragged=lengths is not None)
                states = slice(k * D, (k + 1) * D)
                out = _Fused.apply(rnn, rnn.config.layout.names, lengths, y, h0[states].contiguous(),
                                   c0[states].contiguous() if has_c else None,
                                   *self._parameters_of(rnn.config.layout.names, k))
                y = out[0]
                hys.append(out[1])
                if has_c:
                    cys.append(out[2])
            out = (y, torch.cat(hys)) + ((torch.cat(cys),) if has_c else ())
        else:
            rnn = self._rnn_for(batch, input.device, ragged=lengths is not None)
            names = rnn.config.layout.names
            out = _Fused.apply(rnn, names, lengths, input.contiguous(), h0, c0, *self._parameters_of(names, None))
        y, hy = out[0], out[1]
        if unbatched:
            y = y.squeeze(1 if not self.batch_first else 0)
            hy = hy.squeeze(1)
            out = (y, hy) + ((out[2].squeeze(1),) if has_c else ())
        return (y, (hy, out[2])) if has_c else (y, hy)


class LSTM(_Mixin, torch.nn.LSTM):
    """``torch.nn.LSTM`` with tvmrnn's fused kernels. ``bias=False`` and ``dropout`` work as in
    torch.nn (dropout between layers runs the stack layer by layer in training; eval runs it
    fused); ``PackedSequence`` inputs too (a variable-lengths build of their own); ``proj_size`` is
    not supported yet. Extra keywords:

    - ``package``: a built or loaded tvmrnn RNN to run on (batches of up to its batch size);
    - ``target``: where to build (default: the input's device);
    - ``rebuild`` (default True): build for a batch larger than any build so far (a smaller
      batch runs on a larger build, padded; builds come from the on-disk build cache when an
      earlier process made them). False: such a batch is a ValueError after the first build.
    """

    _cell = "lstm"

    def __init__(self, *args, package=None, target=None, rebuild=True, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup(package, target, rebuild)


class GRU(_Mixin, torch.nn.GRU):
    """``torch.nn.GRU`` with tvmrnn's fused kernels (see :class:`LSTM` for the extra keywords)."""

    _cell = "gru"

    def __init__(self, *args, package=None, target=None, rebuild=True, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup(package, target, rebuild)


class RNN(_Mixin, torch.nn.RNN):
    """``torch.nn.RNN`` (``nonlinearity="tanh"`` or ``"relu"``) with tvmrnn's fused kernels."""

    def __init__(self, *args, package=None, target=None, rebuild=True, **kwargs):
        super().__init__(*args, **kwargs)
        self._cell = "rnn_" + self.nonlinearity
        self._setup(package, target, rebuild)


class CustomRNN(_Mixin, torch.nn.Module):
    """A multi-layer RNN of a custom cell (:func:`tvmrnn.define_cell`), used like ``torch.nn.LSTM``.

    Parameters
    ----------
    cell : Cell or str
        A cell made by :func:`tvmrnn.define_cell` (or a built-in cell's name); with ``package``,
        also the cell of a loaded package (``tvmrnn.load(path).config.cell``), which has no math.
    input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional
        As for ``torch.nn.LSTM``.
    package, target, rebuild
        As for :class:`LSTM`.

    Parameters are ``weight_ih_l{k}`` ``(G*hidden_size, K)``, ``weight_hh_l{k}``, ``bias_ih_l{k}``,
    ``bias_hh_l{k}`` with the cell's G gates stacked in its order, then each per-unit parameter
    ``{name}_l{k}`` ``(hidden_size,)`` (``_reverse`` for the backward direction). All start uniform
    in ``(-1/sqrt(hidden_size), 1/sqrt(hidden_size))`` as PyTorch's do, except per-unit
    parameters the cell gives an ``init`` for. ``forward(input, hx)`` takes and returns states
    as ``torch.nn.LSTM`` does for cells with a cell state (``hx = (h0, c0)``) and as
    ``torch.nn.GRU`` does otherwise.
    """

    def __init__(self, cell, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, package=None,
                 target=None, rebuild=True, device=None, dtype=None):
        super().__init__()
        self._cell = get_cell(cell)
        if not (isinstance(dropout, numbers.Number) and 0 <= dropout <= 1) or isinstance(dropout, bool):
            raise ValueError(f"dropout: expected a probability in [0, 1], got {dropout!r}")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.bidirectional = bias, batch_first, bidirectional
        self.proj_size, self.dropout = 0, float(dropout)
        self._setup(package, target, rebuild)
        self._layout = Layout.create(input_size, hidden_size, num_layers, 2 if bidirectional else 1,
                                     self._cell.num_gates, self._cell.unit_params)
        for slot in self._layout.slots:
            if not bias and slot.kind in ("bias_ih", "bias_hh"):
                continue
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
                param = getattr(self, slot.name, None)
                if param is None:  # a bias of a module made with bias=False
                    continue
                if slot.kind in init:
                    param.fill_(init[slot.kind])
                else:
                    param.uniform_(-bound, bound)

    def extra_repr(self) -> str:
        return (f"{self._cell.name}, {self.input_size}, {self.hidden_size}, num_layers={self.num_layers}, "
                f"batch_first={self.batch_first}, bidirectional={self.bidirectional}")
