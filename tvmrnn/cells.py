"""The recurrent cells: each one written once, as TVM expressions of its pointwise gate math.

A cell's ``math`` receives, per hidden unit, scalar TVM expressions for

* ``x[k]``: gate ``k`` of the input projection, ``W_ih[k] x_t + b_ih[k]``,
* ``h[k]``: gate ``k`` of the recurrent projection, ``W_hh[k] h_{t-1} + b_hh[k]``,
* ``h_prev`` and ``c_prev``: the previous hidden and cell state of that unit (``c_prev`` is
  ``None`` for cells without a cell state),

and returns ``(h_t, c_t)`` (``c_t`` is ``None`` without a cell state). Everything else is
derived from this one function: the fused forward step (recurrent GEMM + gate math), the
values the training forward keeps for the backward, the backward step (by symbolic
differentiation, :mod:`tvmrnn.autodiff`), and the weight-gradient GEMMs.

Gate order and parameter shapes follow ``torch.nn.LSTM/GRU/RNN`` so PyTorch weights load as is:
``weight_ih_l[k]`` is ``(G*hidden_size, input_size)`` with the G gates stacked in the order
listed by :attr:`Cell.gates`. Adding a cell means adding one :class:`Cell` here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tvm import tirx


@dataclass(frozen=True)
class Cell:
    """A recurrent cell: its gates (PyTorch order), whether it has a cell state, and its math."""

    name: str
    gates: tuple[str, ...]
    has_cell_state: bool
    math: Callable

    @property
    def num_gates(self) -> int:
        return len(self.gates)


def _sigmoid(e):
    return tirx.sigmoid(e)


def _tanh(e):
    return tirx.tanh(e)


def _lstm(x, h, h_prev, c_prev):
    r"""Long short-term memory (Hochreiter & Schmidhuber 1997), as ``torch.nn.LSTM``.

    .. math::
        i_t = \sigma(W_{ii} x_t + b_{ii} + W_{hi} h_{t-1} + b_{hi}) \\
        f_t = \sigma(W_{if} x_t + b_{if} + W_{hf} h_{t-1} + b_{hf}) \\
        g_t = \tanh(W_{ig} x_t + b_{ig} + W_{hg} h_{t-1} + b_{hg}) \\
        o_t = \sigma(W_{io} x_t + b_{io} + W_{ho} h_{t-1} + b_{ho}) \\
        c_t = f_t \odot c_{t-1} + i_t \odot g_t \\
        h_t = o_t \odot \tanh(c_t)
    """
    i = _sigmoid(x[0] + h[0])
    f = _sigmoid(x[1] + h[1])
    g = _tanh(x[2] + h[2])
    o = _sigmoid(x[3] + h[3])
    c = f * c_prev + i * g
    return o * _tanh(c), c


def _gru(x, h, h_prev, c_prev):
    r"""Gated recurrent unit (Cho et al. 2014), cuDNN/PyTorch convention, as ``torch.nn.GRU``.

    .. math::
        r_t = \sigma(W_{ir} x_t + b_{ir} + W_{hr} h_{t-1} + b_{hr}) \\
        z_t = \sigma(W_{iz} x_t + b_{iz} + W_{hz} h_{t-1} + b_{hz}) \\
        n_t = \tanh(W_{in} x_t + b_{in} + r_t \odot (W_{hn} h_{t-1} + b_{hn})) \\
        h_t = (1 - z_t) \odot n_t + z_t \odot h_{t-1}
    """
    r = _sigmoid(x[0] + h[0])
    z = _sigmoid(x[1] + h[1])
    n = _tanh(x[2] + r * h[2])
    one = tirx.const(1.0, "float32")
    return (one - z) * n + z * h_prev, None


def _rnn_tanh(x, h, h_prev, c_prev):
    r"""Elman RNN with tanh, as ``torch.nn.RNN(nonlinearity="tanh")``:
    :math:`h_t = \tanh(W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh})`."""
    return _tanh(x[0] + h[0]), None


def _rnn_relu(x, h, h_prev, c_prev):
    r"""Elman RNN with ReLU, as ``torch.nn.RNN(nonlinearity="relu")``:
    :math:`h_t = \max(0, W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh})`."""
    return tirx.max(x[0] + h[0], tirx.const(0.0, "float32")), None


CELLS: dict[str, Cell] = {
    cell.name: cell
    for cell in (
        Cell("lstm", ("i", "f", "g", "o"), True, _lstm),
        Cell("gru", ("r", "z", "n"), False, _gru),
        Cell("rnn_tanh", ("h",), False, _rnn_tanh),
        Cell("rnn_relu", ("h",), False, _rnn_relu),
    )
}


def get_cell(cell: str | Cell) -> Cell:
    """Look a cell up by name (``"lstm"``, ``"gru"``, ``"rnn_tanh"``, ``"rnn_relu"``)."""
    if isinstance(cell, Cell):
        return cell
    if not isinstance(cell, str) or cell not in CELLS:
        raise ValueError(f"cell: unknown cell {cell!r}; expected one of {sorted(CELLS)}")
    return CELLS[cell]
