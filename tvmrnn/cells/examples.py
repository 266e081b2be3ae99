"""Example custom cells, each defined with :func:`tvmrnn.define_cell`, with a PyTorch reference.

Every example is a few lines of gate math; tvmrnn fuses, differentiates, tunes and packages it
like the built-in cells. Beside each one sits the same cell written with plain torch ops (a
step function), and :func:`reference_forward` runs any of them over a whole multi-layer,
possibly bidirectional sequence, one step at a time: the per-step PyTorch loop a framework
user would otherwise write. The tests trust it (checked against ``torch.nn.LSTM``/``GRU``/``RNN``
for the built-in cells, and differentiated by autograd); ``tvmrnn-bench --custom`` times it.

PyTorch is imported only by the reference functions, so the cells need no PyTorch.
"""
from __future__ import annotations

from tvm import tirx

from .definition import STANDARD_PARAMETERS, Cell, define_cell, get_cell

ONE = tirx.const(1.0, "float32")


def _peephole_lstm(x, h, h_prev, c_prev, p):
    r"""LSTM with peephole connections (Gers, Schraudolph & Schmidhuber 2002): the gates also
    see the cell state, through per-unit (diagonal) weights ``w_ci``, ``w_cf``, ``w_co``.

    .. math::
        i_t = \sigma(W_{ii} x_t + b_{ii} + W_{hi} h_{t-1} + b_{hi} + w_{ci} \odot c_{t-1}) \\
        f_t = \sigma(W_{if} x_t + b_{if} + W_{hf} h_{t-1} + b_{hf} + w_{cf} \odot c_{t-1}) \\
        g_t = \tanh(W_{ig} x_t + b_{ig} + W_{hg} h_{t-1} + b_{hg}) \\
        c_t = f_t \odot c_{t-1} + i_t \odot g_t \\
        o_t = \sigma(W_{io} x_t + b_{io} + W_{ho} h_{t-1} + b_{ho} + w_{co} \odot c_t) \\
        h_t = o_t \odot \tanh(c_t)
    """
    i = tirx.sigmoid(x[0] + h[0] + p["w_ci"] * c_prev)
    f = tirx.sigmoid(x[1] + h[1] + p["w_cf"] * c_prev)
    g = tirx.tanh(x[2] + h[2])
    c = f * c_prev + i * g
    o = tirx.sigmoid(x[3] + h[3] + p["w_co"] * c)
    return o * tirx.tanh(c), c


def _cifg_lstm(x, h, h_prev, c_prev, p):
    r"""LSTM with coupled input and forget gates (Greff et al. 2017, "LSTM: A Search Space
    Odyssey"): the input gate is ``1 - f_t``, so three gates ``(f, g, o)`` instead of four.

    .. math::
        f_t = \sigma(W_{if} x_t + b_{if} + W_{hf} h_{t-1} + b_{hf}) \\
        g_t = \tanh(W_{ig} x_t + b_{ig} + W_{hg} h_{t-1} + b_{hg}) \\
        o_t = \sigma(W_{io} x_t + b_{io} + W_{ho} h_{t-1} + b_{ho}) \\
        c_t = f_t \odot c_{t-1} + (1 - f_t) \odot g_t \\
        h_t = o_t \odot \tanh(c_t)
    """
    f = tirx.sigmoid(x["f"] + h["f"])
    g = tirx.tanh(x["g"] + h["g"])
    o = tirx.sigmoid(x["o"] + h["o"])
    c = f * c_prev + (ONE - f) * g
    return o * tirx.tanh(c), c


def _mgu(x, h, h_prev, c_prev, p):
    r"""Minimal gated unit (Zhou et al. 2016): one gate ``f`` where the GRU has two. Written in
    the cuDNN/PyTorch "reset after" convention, as ``torch.nn.GRU`` writes its ``r``: ``f``
    scales the recurrent projection ``W_{hn} h_{t-1} + b_{hn}`` (which one GEMM over
    ``h_{t-1}`` computes for all gates at once) rather than ``h_{t-1}`` before it.

    .. math::
        f_t = \sigma(W_{if} x_t + b_{if} + W_{hf} h_{t-1} + b_{hf}) \\
        n_t = \tanh(W_{in} x_t + b_{in} + f_t \odot (W_{hn} h_{t-1} + b_{hn})) \\
        h_t = (1 - f_t) \odot h_{t-1} + f_t \odot n_t
    """
    f = tirx.sigmoid(x[0] + h[0])
    n = tirx.tanh(x[1] + f * h[1])
    return (ONE - f) * h_prev + f * n, None


def _leaky_rnn(x, h, h_prev, c_prev, p):
    r"""Elman RNN of leaky-integrator units (Jaeger et al. 2007), each with its own learned leak
    rate :math:`\alpha = \sigma(\text{leak})`, a per-unit parameter (starts at 0: :math:`\alpha = 1/2`).

    .. math::
        \alpha = \sigma(\text{leak}) \\
        h_t = (1 - \alpha) \odot h_{t-1} + \alpha \odot \tanh(W_{ih} x_t + b_{ih} + W_{hh} h_{t-1} + b_{hh})
    """
    alpha = tirx.sigmoid(p["leak"])
    return (ONE - alpha) * h_prev + alpha * tirx.tanh(x[0] + h[0]), None


PEEPHOLE_LSTM = define_cell("peephole_lstm", gates=("i", "f", "g", "o"), cell_state=True,
                            unit_params=("w_ci", "w_cf", "w_co"), math=_peephole_lstm)
CIFG_LSTM = define_cell("cifg_lstm", gates=("f", "g", "o"), cell_state=True, math=_cifg_lstm)
MGU = define_cell("mgu", gates=("f", "n"), math=_mgu)
LEAKY_RNN = define_cell("leaky_rnn", gates=("h",), unit_params=("leak",), init={"leak": 0.0}, math=_leaky_rnn)

EXAMPLES: dict[str, Cell] = {c.name: c for c in (PEEPHOLE_LSTM, CIFG_LSTM, MGU, LEAKY_RNN)}


# ---- PyTorch references: the same math with torch ops, per step ---------------------------------
# x and h are the per-gate (N, H) blocks of the input and recurrent projections (biases included),
# p maps each per-unit parameter's name to its (H,) tensor. Each returns (h_t, c_t or None).

def _torch_peephole_lstm(x, h, h_prev, c_prev, p):
    import torch
    i = torch.sigmoid(x[0] + h[0] + p["w_ci"] * c_prev)
    f = torch.sigmoid(x[1] + h[1] + p["w_cf"] * c_prev)
    g = torch.tanh(x[2] + h[2])
    c = f * c_prev + i * g
    o = torch.sigmoid(x[3] + h[3] + p["w_co"] * c)
    return o * torch.tanh(c), c


def _torch_cifg_lstm(x, h, h_prev, c_prev, p):
    import torch
    f = torch.sigmoid(x[0] + h[0])
    g = torch.tanh(x[1] + h[1])
    o = torch.sigmoid(x[2] + h[2])
    c = f * c_prev + (1 - f) * g
    return o * torch.tanh(c), c


def _torch_mgu(x, h, h_prev, c_prev, p):
    import torch
    f = torch.sigmoid(x[0] + h[0])
    n = torch.tanh(x[1] + f * h[1])
    return (1 - f) * h_prev + f * n, None


def _torch_leaky_rnn(x, h, h_prev, c_prev, p):
    import torch
    alpha = torch.sigmoid(p["leak"])
    return (1 - alpha) * h_prev + alpha * torch.tanh(x[0] + h[0]), None


def _torch_lstm(x, h, h_prev, c_prev, p):
    import torch
    i, f, g, o = (torch.sigmoid(x[0] + h[0]), torch.sigmoid(x[1] + h[1]), torch.tanh(x[2] + h[2]),
                  torch.sigmoid(x[3] + h[3]))
    c = f * c_prev + i * g
    return o * torch.tanh(c), c


def _torch_gru(x, h, h_prev, c_prev, p):
    import torch
    r, z = torch.sigmoid(x[0] + h[0]), torch.sigmoid(x[1] + h[1])
    n = torch.tanh(x[2] + r * h[2])
    return (1 - z) * n + z * h_prev, None


def _torch_rnn_tanh(x, h, h_prev, c_prev, p):
    import torch
    return torch.tanh(x[0] + h[0]), None


def _torch_rnn_relu(x, h, h_prev, c_prev, p):
    import torch
    return torch.relu(x[0] + h[0]), None


REFERENCE_STEPS = {
    "peephole_lstm": _torch_peephole_lstm, "cifg_lstm": _torch_cifg_lstm, "mgu": _torch_mgu,
    "leaky_rnn": _torch_leaky_rnn,
    # the built-in cells too, so that the loop below is checked against torch.nn itself
    "lstm": _torch_lstm, "gru": _torch_gru, "rnn_tanh": _torch_rnn_tanh, "rnn_relu": _torch_rnn_relu,
}


def reference_forward(cell, params: dict, x, h0=None, c0=None, num_layers: int = 1, bidirectional: bool = False,
                      batch_first: bool = False):
    """A cell over a whole sequence with torch ops, one step at a time (differentiable by autograd).

    Parameters
    ----------
    cell : Cell or str
        One of :data:`EXAMPLES` or a built-in cell (its step function in :data:`REFERENCE_STEPS`).
    params : dict
        ``{PyTorch-style parameter name: tensor}``, as ``tvmrnn.RNN.pack_weights`` takes them.
    x, h0, c0
        As for ``torch.nn.LSTM``: ``(T, N, I)`` (``(N, T, I)`` if batch_first), states
        ``(num_layers * num_directions, N, H)``; None states are zeros.

    Returns
    -------
    (y, hy, cy)
        ``cy`` is None for cells without a cell state.
    """
    import torch
    cell = get_cell(cell)
    step = REFERENCE_STEPS[cell.name]
    G, D = cell.num_gates, 2 if bidirectional else 1
    layer_in = x.transpose(0, 1) if batch_first else x
    T, N = layer_in.shape[:2]
    H = params["weight_hh_l0"].shape[1]
    zeros = layer_in.new_zeros(num_layers * D, N, H)
    h0 = zeros if h0 is None else h0
    c0 = (zeros if c0 is None else c0) if cell.has_cell_state else None
    hy, cy = [], []
    for layer in range(num_layers):
        outputs = []
        for direction in range(D):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            w_ih, w_hh, b_ih, b_hh = (params[kind + suffix] for kind in STANDARD_PARAMETERS)
            p = {name: params[name + suffix] for name in cell.unit_params}
            ld = layer * D + direction
            h, c = h0[ld], (c0[ld] if c0 is not None else None)
            gx = layer_in @ w_ih.T + b_ih  # all steps' input projections at once, as cuDNN does
            ys = [None] * T
            for t in (range(T) if direction == 0 else reversed(range(T))):
                gh = h @ w_hh.T + b_hh
                h, c = step(gx[t].chunk(G, -1), gh.chunk(G, -1), h, c, p)
                ys[t] = h
            outputs.append(torch.stack(ys))
            hy.append(h)
            cy.append(c)
        layer_in = torch.cat(outputs, -1)
    y = layer_in.transpose(0, 1) if batch_first else layer_in
    return y, torch.stack(hy), (torch.stack(cy) if cell.has_cell_state else None)


def reference_params(cell, input_size: int, hidden_size: int, num_layers: int = 1, bidirectional: bool = False,
                     generator=None, dtype=None) -> dict:
    """Random parameters for a cell, PyTorch-named, uniform in (-1/sqrt(H), 1/sqrt(H)) like
    PyTorch's initialisation (per-unit parameters too, so that tests see them vary by unit)."""
    import torch
    from .parameters import Layout
    cell = get_cell(cell)
    layout = Layout.create(input_size, hidden_size, num_layers, 2 if bidirectional else 1, cell.num_gates,
                           cell.unit_params)
    bound = hidden_size ** -0.5
    return {s.name: (torch.rand(s.torch_shape, generator=generator, dtype=dtype or torch.float32) * 2 - 1) * bound
            for s in layout.slots}
