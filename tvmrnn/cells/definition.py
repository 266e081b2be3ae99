"""The recurrent cells: each one written once, as TVM expressions of its pointwise gate math.

A cell's ``math`` receives, per hidden unit, scalar TVM expressions for

* ``x[k]``: gate ``k`` of the input projection, ``W_ih[k] x_t + b_ih[k]`` (``x["f"]`` by name also works),
* ``h[k]``: gate ``k`` of the recurrent projection, ``W_hh[k] h_{t-1} + b_hh[k]``,
* ``h_prev`` and ``c_prev``: the previous hidden and cell state of that unit (``c_prev`` is
  ``None`` for cells without a cell state),
* ``p[name]``: the unit's value of each per-unit parameter the cell declares (none for the
  built-in cells),

and returns ``(h_t, c_t)`` (``c_t`` is ``None`` without a cell state). Everything else is
derived from this one function: the fused forward step (recurrent GEMM + gate math), the
values the training forward keeps for the backward, the backward step (by symbolic
differentiation, :mod:`tvmrnn.cells.autodiff`), the weight-gradient GEMMs and the gradients of the
per-unit parameters.

Gate order and parameter shapes follow ``torch.nn.LSTM/GRU/RNN`` so PyTorch weights load as is:
``weight_ih_l[k]`` is ``(G*hidden_size, input_size)`` with the G gates stacked in the order
listed by :attr:`Cell.gates`; each per-unit parameter ``name`` is ``name_l[k]`` (and
``name_l[k]_reverse``), shape ``(hidden_size,)``. The built-in cells below are defined with
:func:`define_cell` exactly as users define theirs; more examples are in :mod:`tvmrnn.cells.examples`.
"""
from __future__ import annotations

import dataclasses
import keyword
import numbers
from dataclasses import dataclass
from typing import Callable

from tvm import tirx

from .autodiff import CellDefinitionError, derive

STANDARD_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


@dataclass(frozen=True)
class Cell:
    """A recurrent cell: its gates (PyTorch order), whether it has a cell state, its math and its
    per-unit parameters. Made by :func:`define_cell`, which checks it.

    ``unit_param_init`` holds ``(name, value)`` for parameters that start at a constant (the
    others start like PyTorch's weights, uniform in ``(-1/sqrt(H), 1/sqrt(H))``). ``num_saved`` is
    how many values per unit and step the training forward keeps; a cell loaded from a package
    (:func:`tvmrnn.load`) carries it in place of its math, which is then None.
    """

    name: str
    gates: tuple[str, ...]
    has_cell_state: bool
    math: Callable | None
    unit_params: tuple[str, ...] = ()
    unit_param_init: tuple[tuple[str, float], ...] = ()
    num_saved: int | None = None

    @property
    def num_gates(self) -> int:
        return len(self.gates)

    @property
    def signature(self) -> dict:
        """Everything about the cell that compiled passes depend on, except its math (JSON-able)."""
        return {"cell": self.name, "gates": list(self.gates), "has_cell_state": self.has_cell_state,
                "unit_params": list(self.unit_params), "num_saved": self.num_saved}


def _identifier(what: str, value) -> str:
    if not isinstance(value, str) or not value.isidentifier() or keyword.iskeyword(value):
        raise CellDefinitionError(f"{what}: expected a Python identifier (letters, digits, _), got {value!r}")
    return value


def _names(what: str, values) -> tuple[str, ...]:
    if isinstance(values, str) or not hasattr(values, "__iter__"):
        raise CellDefinitionError(f"{what}: expected a sequence of names, got {values!r}")
    names = tuple(_identifier(what, v) for v in values)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise CellDefinitionError(f"{what}: names must be distinct, {repeated} repeated")
    return names


def _define(name, gates, cell_state, math, unit_params=(), init=None) -> Cell:
    name = _identifier("name", name)
    if isinstance(gates, numbers.Integral) and not isinstance(gates, bool):
        gates = tuple(f"g{k}" for k in range(int(gates)))
    gates = _names("gates", gates)
    if not gates:
        raise CellDefinitionError("gates: a cell needs at least one gate")
    if not isinstance(cell_state, bool):
        raise CellDefinitionError(f"cell_state: expected bool, got {cell_state!r}")
    if not callable(math):
        raise CellDefinitionError(f"math: expected a function math(x, h, h_prev, c_prev, p), got {math!r}")
    unit_params = _names("unit_params", unit_params)
    clash = [u for u in unit_params if u in STANDARD_PARAMETERS]
    if clash:
        raise CellDefinitionError(f"unit_params: {clash} would clash with the standard parameters "
                                  f"{STANDARD_PARAMETERS}; choose other names")
    init = dict(init or {})
    for key, value in init.items():
        if key not in unit_params:
            raise CellDefinitionError(f"init: {key!r} is not one of unit_params={unit_params}")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise CellDefinitionError(f"init[{key!r}]: expected a number, got {value!r}")
    cell = Cell(name, gates, cell_state, math, unit_params,
                tuple((u, float(init[u])) for u in unit_params if u in init))
    return dataclasses.replace(cell, num_saved=len(derive(cell).saved))  # checks the math now


def define_cell(name: str, *, gates, math: Callable, cell_state: bool = False, unit_params=(),
                init=None) -> Cell:
    r"""Define a recurrent cell by its pointwise math; tvmrnn generates everything else.

    Parameters
    ----------
    name : str
        A Python identifier, not one of the built-in cells' names; it names the kernels,
        tuning tasks and packages.
    gates : sequence of str, or int
        The gates in the order their rows are stacked in ``weight_ih``/``weight_hh``/biases
        (an int G names them ``g0 .. g{G-1}``). Each gate gets an input and a recurrent projection.
    math : callable
        ``math(x, h, h_prev, c_prev, p) -> (h_t, c_t)`` over scalar TVM expressions of one hidden
        unit (see :mod:`tvmrnn.cells`): ``x[k]``/``h[k]`` (or ``x["name"]``) are gate k's input and
        recurrent projections with their biases, ``p[name]`` the unit's value of a per-unit
        parameter. Use ``tirx.sigmoid``, ``tirx.tanh``, ``tirx.exp``, ``tirx.log``, ``tirx.sqrt``,
        ``tirx.max``/``tirx.min``, ``tirx.Select`` and arithmetic. ``c_t`` is None without a
        cell state. Put the equations in its docstring.
    cell_state : bool
        Whether the cell carries a cell state ``c`` besides ``h`` (as the LSTM does).
    unit_params : sequence of str
        Per-unit learned parameters (peephole weights, gains, ...): each is a ``(hidden_size,)``
        parameter ``{name}_l{k}`` (``..._reverse``) per layer and direction.
    init : dict, optional
        ``{unit parameter: constant}`` to start a parameter at (``tvmrnn.torch.CustomRNN``);
        others start uniform in ``(-1/sqrt(H), 1/sqrt(H))`` like PyTorch's weights.

    Returns
    -------
    Cell
        Pass it to :func:`tvmrnn.build` or :class:`tvmrnn.torch.CustomRNN`.

    Raises
    ------
    CellDefinitionError
        Now, not at build time, for math the generator cannot handle, naming the expression: a
        call with no derivative (``floor``, ``round``, a comparison used as a value), a gate or
        parameter that does not exist, wrong outputs, a gate or parameter the math never reads.
    """
    if name in CELLS:
        raise CellDefinitionError(f"name: {name!r} is a built-in cell; choose another name")
    return _define(name, gates, cell_state, math, unit_params, init)


def _sigmoid(e):
    return tirx.sigmoid(e)


def _tanh(e):
    return tirx.tanh(e)


def _lstm(x, h, h_prev, c_prev, p):
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


def _gru(x, h, h_prev, c_prev, p):
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


def _rnn_tanh(x, h, h_prev, c_prev, p):
    r"""Elman RNN with tanh, as ``torch.nn.RNN(nonlinearity="tanh")``:
    :math:`h_t = \tanh(W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh})`."""
    return _tanh(x[0] + h[0]), None


def _rnn_relu(x, h, h_prev, c_prev, p):
    r"""Elman RNN with ReLU, as ``torch.nn.RNN(nonlinearity="relu")``:
    :math:`h_t = \max(0, W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh})`."""
    return tirx.max(x[0] + h[0], tirx.const(0.0, "float32")), None


# Defined like users' cells; define_cell refuses their names.
CELLS: dict[str, Cell] = {
    cell.name: cell
    for cell in (
        _define("lstm", ("i", "f", "g", "o"), True, _lstm),
        _define("gru", ("r", "z", "n"), False, _gru),
        _define("rnn_tanh", ("h",), False, _rnn_tanh),
        _define("rnn_relu", ("h",), False, _rnn_relu),
    )
}


def get_cell(cell: str | Cell) -> Cell:
    """A :class:`Cell` as is, or a built-in one by name (``"lstm"``, ``"gru"``, ``"rnn_tanh"``, ``"rnn_relu"``)."""
    if isinstance(cell, Cell):
        return cell
    if not isinstance(cell, str) or cell not in CELLS:
        raise ValueError(f"cell: unknown cell {cell!r}; expected one of {sorted(CELLS)}")
    return CELLS[cell]
