"""Tensor-expression kernels, each for one step (or one fixed-size chunk of steps), static shapes.

Every kernel that a sequence runs is defined here, from the cell's derivation for the two
pointwise ones and as plain GEMMs for the rest. They are the units that get scheduled (and
tuned): none depends on the sequence length, which the sequence driver (:mod:`tvmrnn.program.sequence`)
supplies by running them in loops over views of whole-sequence buffers.

Layouts (see :mod:`tvmrnn.cells.parameters`): weights are packed K-major and gate-interleaved,
``w[k, j, g]`` for input feature k, hidden unit j, gate g (EcoRNN's layout: one unit's gates
sit side by side, so the fused step finds all gates of a unit together), on CPUs in gate-blocked
column panels ``w[j // u, k, g, j % u]`` (:func:`weight_shape`); gate projections and biases are
``(…, N, H, G)`` and ``(H, G)``, with panels ``(…, N, H / u, G, u)`` and ``(H / u, G, u)``
(:func:`gate_shape`); gradients of weights are produced in PyTorch's ``(G, H, K)`` layout.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

import tvm
import tvm_ffi
from tvm import te, tirx

from .cells.autodiff import Derivation, derive
from .cells.definition import Cell

F32 = "float32"

# The kernels a pass's time loop calls at every step (their names' families; their persistent
# and masked forms share them): :func:`recurrent_step`, :func:`backward_step`, an LSTMP's
# :func:`projection_step` and :func:`projected_recurrent_backward`, a bf16 step's :func:`bf16_state`
STEP_FAMILIES = ("recurrent_step_", "backward_step_", "projection_step_", "projected_recurrent_backward_",
                 "bf16_state_")


def is_step(kernel) -> bool:
    """Whether ``kernel`` is one a time loop calls at every step (:data:`STEP_FAMILIES`)."""
    return kernel.name.startswith(STEP_FAMILIES)


@dataclass(frozen=True)
class Kernel:
    """A per-step kernel: its PrimFunc and the role of each parameter, in order."""

    name: str  # names the workload, e.g. "recurrent_step_lstm_train_n3_h37"
    func: tvm.tirx.PrimFunc
    roles: tuple[str, ...]
    # For a GEMM: its reduction block, and the trailing spatial axes of that block along which the
    # output and the streamed operand are both contiguous (what a CPU schedule vectorises).
    gemm: str | None = None
    columns: tuple[str, ...] = ()
    # Leading axes of every parameter (and of the GEMM's output) that index independent
    # problems, each with its own weights: the direction axis of :func:`_lead`.
    batch: int = 0
    # A masked step's kernel without the mask (variable lengths): where the masked kernel has no
    # tuning record of its own, build replays the unmasked one's (tvmrnn.tune.records.scheduler).
    unmasked: "Kernel | None" = dataclasses.field(default=None, compare=False, repr=False)


def _make(name, inputs: dict, outputs: dict, gemm=None, columns=(), batch=0) -> Kernel:
    func = te.create_prim_func(list(inputs.values()) + list(outputs.values()))
    if "mask" in inputs:
        func = _mask_read_last(func)
    return Kernel(name, func.with_attr("global_symbol", name), tuple(inputs) + tuple(outputs), gemm, tuple(columns),
                  batch)


def _mask_read_last(func):
    """A masked kernel (variable lengths) with the mask last among each block's reads.

    A schedule names a block's operands by their place in its reads (``cache_read``'s
    ``read_buffer_index``). The mask is the first load of a masked expression (a select's
    condition), so it would take the place the unmasked twin gives its first operand: the twin's
    records (:attr:`Kernel.unmasked`) and the templates would stage the mask instead of it. Last,
    it leaves every other operand where the twin has it."""
    def visit(block, mutator):
        block = mutator.default_mutate(block)
        reads = list(block.reads)
        last = [r for r in reads if r.source.name == "mask"]
        if not last or reads[-len(last):] == last:
            return block
        return tvm.s_tir.SBlock(block.iter_vars, [r for r in reads if r.source.name != "mask"] + last, block.writes,
                                block.name_hint, block.body, block.init, block.alloc_buffers, block.match_buffers,
                                block.annotations)
    return func.with_body(tvm_ffi.structural_mutate(func.body, [(tvm.s_tir.SBlock, visit)]))


def _substitute(expr, env: dict):
    """``expr`` with each variable that is a key of ``env`` replaced by its value: the
    derivation's scalar variables by tensor loads, a program's buffers by views
    (:mod:`tvmrnn.program.sequence`)."""
    def replace(v, mutator):
        for var, value in env.items():
            if v.same_as(var):
                return value
        return v
    return tvm_ffi.structural_mutate(expr, [(tvm.ir.Var, replace)])


def _outputs(name, shape, exprs: dict, env_of) -> dict:
    """One multi-output compute (a shared loop nest) for several pointwise results."""
    roles = list(exprs)
    if not roles:
        return {}
    tensors = te.compute(shape, lambda *i: [_substitute(exprs[r], env_of(*i)) for r in roles], name=name,
                         varargs_names=_axis_names(shape[:-2], "n", "j") if len(shape) > 2 else None)
    tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    return dict(zip(roles, tensors))


@lru_cache(maxsize=None)
def derivation(cell: Cell) -> Derivation:
    return derive(cell)


def weight_shape(in_size, hidden, gates, panel: int = 0) -> tuple[int, ...]:
    """The forward weights' shape: K-major ``(K, H, G)``, or in column panels of ``panel`` units,
    each panel's row k gate-blocked, ``(H / panel, K, G, panel)``: gate g of the panel's units side
    by side (the issue's "gate-interleaved, blocked by 16 lanes"; see :func:`gate_shape` and
    :func:`tvmrnn.schedules.cpu.weight_panel`)."""
    if not panel:
        return (in_size, hidden, gates)
    return (panels(hidden, panel), in_size, gates, panel)


def panels(hidden, panel: int) -> int:
    """Column panels of ``panel`` units for ``hidden`` units: the last one padded where ``panel``
    does not divide ``hidden`` (:func:`tvmrnn.schedules.cpu.weight_panel`; its units past
    ``hidden`` hold zero weights and biases, and no kernel reads what they compute)."""
    return -(-hidden // panel)


def _weight_at(w, lead: tuple, k, column: tuple, panel: int):
    """The logical ``w[k, j, g]`` of the weights, whichever their layout, for the column given as
    an index into :func:`gate_shape`'s axes (``(j, g)``, or ``(j // panel, g, j % panel)``)."""
    if panel:
        p, g, u = column
        return w[(*lead, p, k, g, u)]
    return w[(*lead, k, *column)]


def gate_shape(hidden, gates, panel: int = 0) -> tuple[int, ...]:
    """The trailing axes of a tensor with a value per unit and gate (the biases, the input
    projection ``gx``, a step's recurrent projection): ``(H, G)`` gate-interleaved, or with the
    weights' ``panel`` (:func:`weight_shape`) gate-blocked ``(H / panel, G, panel)``, so that a CPU
    vector holds one gate of ``panel`` consecutive units and the fused gate math reads and writes
    whole vectors (gate-interleaved, it gathered each gate lane by lane)."""
    return (panels(hidden, panel), gates, panel) if panel else (hidden, gates)


def gate_axes(panel: int = 0) -> tuple[str, ...]:
    """The names of :func:`gate_shape`'s axes (a kernel's GEMM ``columns``)."""
    return ("p", "g", "u") if panel else ("j", "g")


def gate_index(j, g, panel: int = 0) -> tuple:
    """Unit ``j``, gate ``g`` as an index into :func:`gate_shape`'s axes."""
    return (j // panel, g, j % panel) if panel else (j, g)


def _gates_compute(lead_shape: tuple, hidden, gates, panel, fcompute, name, lead_names):
    """``te.compute`` over ``lead_shape + gate_shape(...)``, ``fcompute(*lead, column)`` given the
    column as an index into :func:`gate_shape`'s axes, the axes named ``lead_names +
    gate_axes(panel)``."""
    ncols = len(gate_axes(panel))

    def body(*i):
        return fcompute(*i[:-ncols], tuple(i[-ncols:]))
    return te.compute(lead_shape + gate_shape(hidden, gates, panel), body, name=name,
                      varargs_names=list(lead_names) + list(gate_axes(panel)))


def backward_weight_shape(gates, hidden, in_size, panel: int = 0) -> tuple[int, ...]:
    """The backward's copy of the weights: PyTorch's ``(G, H, K)``, or in panels of ``panel``
    input features ``(K / panel, H, G, panel)``, so that a tile of ``panel`` outputs ``k``
    reduces over ``(j, g)`` along one contiguous block (:func:`weight_shape`'s idea, for the
    data GEMMs ``dh = dg W_hh`` and ``dx = dg W_ih``); where ``panel`` does not divide K, the last
    panel padded with zeros (:func:`tvmrnn.schedules.cpu.backward_panel`)."""
    if not panel:
        return (gates, hidden, in_size)
    return (panels(in_size, panel), hidden, gates, panel)


def _weight_t_at(w, lead: tuple, g, j, k, panel: int):
    """``W[g, j, k]`` of the backward's weight copy, whichever its layout."""
    return w[(*lead, k // panel, j, g, k % panel)] if panel else w[(*lead, g, j, k)]


def _panel_suffix(panel: int) -> str:
    return f"_p{panel}" if panel else ""


def input_projection(steps, batch, in_size, hidden, gates, panel: int = 0, bf16: bool = False,
                     masked: bool = False) -> Kernel:
    """``gx[t, n, j, g] = sum_k x[t, n, k] w[k, j, g] + b[j, g]`` for a chunk of steps (``w`` in
    column panels of ``panel`` units if given, :func:`weight_shape`; ``b`` and ``gx`` then
    gate-blocked, :func:`gate_shape`).

    ``bf16`` (CPUs with AVX512-BF16, ``BuildOptions.bf16_projections``; panels required): the
    products of ``x`` and ``w`` rounded to bf16 first (nearest even) and summed in fp32, as
    ``vdpbf16ps`` and AMX's ``tdpbf16ps`` do. Operands hold a pair of consecutive k in one 32-bit
    word (:func:`bf16_pair`: the instructions' operand layout; an odd K gets a zero): ``w`` the
    weights packed so, ``(H / panel, ceil(K / 2), G, panel)`` words held as float32
    (:func:`bf16_weight_pairs`, at weight packing), and a stage ``xb[t, n, k2]`` the inputs; the
    GEMM sums ``dot2`` over the pairs (:func:`tvmrnn.schedules.bf16.cpu_gemm_bf16` rounds ``xb``
    per task and tensorizes).

    ``masked`` (a variable-lengths CPU build): a ``mask`` of the chunk's steps and rows, read by
    no expression, with which the scheduled kernel skips the GEMM of row tiles whose rows have all
    ended (:func:`_ended_rows_mask`)."""
    x = te.placeholder((steps, batch, in_size), F32, "x")
    pairs = (in_size + 1) // 2
    w = te.placeholder((hidden // panel, pairs, gates, panel) if bf16 and panel else
                       weight_shape(in_size, hidden, gates, panel), F32, "w")
    b = te.placeholder(gate_shape(hidden, gates, panel), F32, "b")
    name = f"input_projection_t{steps}_n{batch}_k{in_size}_h{hidden}_g{gates}{_panel_suffix(panel)}" + (
        _MASKED if masked else "")  # (then _bf16, as the steps' names have it)
    if bf16:
        if not panel:
            raise ValueError("bf16 projections need the CPU weight panels (BuildOptions.weight_panels)")
        xb = te.compute((steps, batch, pairs), lambda t, n, k2: bf16_pair(
            _operand(lambda k: x[t, n, k], 2 * k2, in_size), _operand(lambda k: x[t, n, k], 2 * k2 + 1, in_size)),
            name="xb")
        k2 = te.reduce_axis((0, pairs), "k2")
        mm = _gates_compute((steps, batch), hidden, gates, panel,
                            lambda t, n, col: te.sum(dot2(xb[t, n, k2], tirx.reinterpret(_U32, w[(col[0], k2, *col[1:])])),
                                                     axis=k2),
                            "matmul", ("t", "n"))
        name += "_bf16"
    else:
        k = te.reduce_axis((0, in_size), "k")
        mm = _gates_compute((steps, batch), hidden, gates, panel,
                            lambda t, n, col: te.sum(x[t, n, k] * _weight_at(w, (), k, col, panel), axis=k), "matmul",
                            ("t", "n"))
    gx = _gates_compute((steps, batch), hidden, gates, panel, lambda t, n, col: mm[(t, n, *col)] + b[col], "gx",
                        ("t", "n"))
    inputs = {"x": x, "w": w, "b": b, **_ended_rows_mask(steps, batch, masked)}
    kernel = _make(name, inputs, {"gx": gx}, gemm="matmul", columns=gate_axes(panel))
    return _with_unmasked(kernel, masked, lambda: input_projection(steps, batch, in_size, hidden, gates, panel, bf16))


def _ended_rows_mask(steps, batch, masked: bool) -> dict:
    """The ``mask`` of a masked all-steps GEMM (a chunk's input projection, input gradient or
    weight gradient, on a CPU with variable lengths): ``(steps, batch)``, 1 while a row runs. No
    expression reads it; :mod:`tvmrnn.schedules.ended_rows` has the scheduled kernel skip the
    products of rows that have ended, whose results the steps discard (the input projection's:
    the masked step keeps the old state) or which are zero (the gradients': an ended row's gate
    gradients are), so every result that is used has the same bits."""
    return {"mask": te.placeholder((steps, batch), F32, "mask")} if masked else {}


_U32 = "uint32"


def _zero_past(load, k, size: int):
    """``load(k)``, 0 where ``k >= size`` (the load's index kept in bounds)."""
    return tirx.if_then_else(k < size, load(tirx.min(k, size - 1)), tirx.const(0, F32))


def _operand(load, k, size: int):
    """``load(k)``, 0 past ``size`` (an odd K's last pair)."""
    return _zero_past(load, k, size) if size % 2 else load(k)


def bf16_bits(v):
    """An fp32 value's nearest bf16 (ties to even), as its 16 bits in the low half of a uint32; a
    NaN becomes bf16's quiet NaN (rounding its bits could carry it into Inf or -0)."""
    u = tirx.reinterpret(_U32, v)
    rounded = (u + tirx.const(0x7FFF, _U32) + ((u >> tirx.const(16, _U32)) & tirx.const(1, _U32))) \
        >> tirx.const(16, _U32)
    is_nan = (u & tirx.const(0x7FFFFFFF, _U32)) > tirx.const(0x7F800000, _U32)
    return tirx.Select(is_nan, tirx.const(0x7FC0, _U32), rounded)


def bf16_pair(lo, hi):
    """Two fp32 values rounded to bf16 and packed in one uint32, ``lo`` in the low half: the
    k-pair that ``vdpbf16ps`` multiplies."""
    return bf16_bits(lo) | (bf16_bits(hi) << tirx.const(16, _U32))


def dot2(a, b):
    """``a.lo * b.lo + a.hi * b.hi`` of two :func:`bf16_pair` words, each product exact in fp32."""
    def lo(w):
        return tirx.reinterpret(F32, w << tirx.const(16, _U32))

    def hi(w):
        return tirx.reinterpret(F32, w & tirx.const(0xFFFF0000, _U32))
    return lo(a) * lo(b) + hi(a) * hi(b)


def recurrent_step(cell: Cell, batch, hidden, train: bool, directions: int = 1, panel: int = 0,
                   masked: bool = False, bf16: bool = False, state_size: int = 0, reduction: int = 0) -> Kernel:
    """The recurrent GEMM fused with the cell's gate math, for one step.

    Outputs h_t twice (into the state and into the layer output), c_t, and for training the
    values the derivation keeps for the backward. With ``directions`` > 1 every parameter gets a
    leading direction axis: one launch runs that many independent steps (both directions of a
    bidirectional layer, each with its own weights), see :func:`_lead`. ``panel``: the weights'
    column panels (:func:`weight_shape`). ``masked``: an input ``mask`` (one value per row, 1 where
    the row's sequence runs at this step, else 0); a row whose mask is 0 keeps its state (h and c
    are h_{t-1} and c_{t-1}, and so is the output: the caller zeroes outputs past each row's
    length, :mod:`tvmrnn.runtime.rnn`). ``bf16`` (CPUs with AVX512-BF16,
    ``BuildOptions.bf16_projections``; panels required): the recurrent projection on bf16
    operands summed in fp32, as the input projection's (:func:`input_projection`): ``w`` holds the
    weights already rounded, k-pairs packed one to a word, ``(H / panel, H / 2, G, panel)`` words
    (:func:`bf16_weight_pairs`: the first half of the fp32 panels' place), and an input ``hb``
    holds ``h_prev`` rounded the same way (:func:`bf16_state`, a kernel of its own that the pass
    runs before the step: both are then one parallel loop each, and a time loop of them one
    parallel region, :meth:`tvmrnn.program.sequence.Program._region_loop`; rounded inside the
    step, on the calling thread before its tasks, each step started and joined the thread pool:
    15.5 us of a 56 us DS2 step on the Xeon's 16 threads, v90).

    ``state_size`` S (an LSTM with projections, :attr:`tvmrnn.program.passes.Config.proj_size`):
    ``h_prev`` has S features and ``w`` S rows (``weight_shape(S, H, G, panel)``), and the step
    outputs the cell's unprojected ``h`` as ``r`` (with ``c`` and the saved values; masked: ``r``
    zero where the row has ended), which :func:`projection_step` projects to the next state. The
    cell may read ``h_prev`` only through its gates (no direct part).

    ``reduction`` (fp32 steps; :func:`tvmrnn.program.passes.step_reduction`): the recurrent GEMM's
    reduction runs over this many indices, more than the state's S, each past S a zero (a guard in
    the product, ``if_then_else``): a GPU split-K schedule splits it evenly where S has no
    divisor near the slices it wants (a prime S left one slice, v91). 0: S.
    """
    d = derivation(cell)
    G = cell.num_gates
    lead = _lead(directions)
    S = state_size or hidden
    if reduction and bf16:
        raise ValueError("reduction: for fp32 steps only (a bf16 step's reduction runs over k-pairs)")
    if state_size and (bf16 or has_direct_part(cell)):
        raise ValueError(f"state_size: a {cell.name} step with a projected state needs fp32 projections and a cell "
                         f"that reads h_prev only through its gates")
    gx = te.placeholder(lead + (batch,) + gate_shape(hidden, G, panel), F32, "gx")
    h_prev = te.placeholder(lead + (batch, S), F32, "h_prev")
    if bf16:
        if not panel or hidden % 2:
            raise ValueError("bf16 projections need the CPU weight panels (BuildOptions.weight_panels)")
        w = te.placeholder(lead + (hidden // panel, hidden // 2, G, panel), F32, "w")
    else:
        w = te.placeholder(lead + weight_shape(S, hidden, G, panel), F32, "w")
    b = te.placeholder(lead + gate_shape(hidden, G, panel), F32, "b")
    inputs = {"gx": gx, "h_prev": h_prev, "w": w, "b": b}
    if cell.has_cell_state:
        inputs["c_prev"] = te.placeholder(lead + (batch, hidden), F32, "c_prev")
    if cell.unit_params:  # the layer-direction's (P, H) block of per-unit parameters
        inputs["unit"] = te.placeholder(lead + (len(cell.unit_params), hidden), F32, "unit")
    if masked:
        inputs["mask"] = te.placeholder(lead + (batch,), F32, "mask")
    if bf16:
        hb = inputs["hb"] = te.placeholder(lead + (batch, hidden // 2), F32, "hb")
        if masked:  # (the mask last, as in the fp32 step)
            inputs["mask"] = inputs.pop("mask")
        k2 = te.reduce_axis((0, hidden // 2), "k2")

        def projection(*i):
            *s, n, col = i
            word = tirx.reinterpret(_U32, w[(*s, col[0], k2, *col[1:])])
            return te.sum(dot2(tirx.reinterpret(_U32, hb[(*s, n, k2)]), word), axis=k2)
    else:
        k, guarded = _padded_axis("k", S, reduction, "an fp32 step of state size {rows}")

        def projection(*i):
            *s, n, col = i  # s: the direction, if any
            return te.sum(guarded(h_prev[(*s, n, k)] * _weight_at(w, tuple(s), k, col, panel)), axis=k)
    gh = _gates_compute(lead + (batch,), hidden, G, panel, projection, "recurrent_projection",
                        _axis_names(lead, "n"))

    def env(*i):
        *s, n, j = i  # s: the direction, if any
        e = {} if state_size else {d.h_prev: h_prev[(*s, n, j)]}
        for g in range(G):
            col = gate_index(j, g, panel)
            e[d.x_gates[g]] = gx[(*s, n, *col)]
            e[d.h_gates[g]] = gh[(*s, n, *col)] + b[(*s, *col)]
        if cell.has_cell_state:
            e[d.c_prev] = inputs["c_prev"][(*s, n, j)]
        e.update({var: inputs["unit"][(*s, p, j)] for p, var in enumerate(d.params)})
        return e

    exprs = {"h": d.h_out, "y": d.h_out}
    if cell.has_cell_state:
        exprs["c"] = d.c_out
    if state_size:
        exprs = {"r": d.h_out, **({"c": d.c_out} if cell.has_cell_state else {})}
    if masked:
        if state_size:
            exprs = {"r": _where_running(d.h_out, tirx.const(0.0, F32))}
        else:
            exprs = {"h": _where_running(d.h_out, d.h_prev), "y": _where_running(d.h_out, d.h_prev)}
        if cell.has_cell_state:
            exprs["c"] = _where_running(d.c_out, d.c_prev)
        base_env = env

        def env(*i):  # noqa: F811 - the same, with the row's mask
            *s, n, _ = i
            return {**base_env(*i), _RUNNING: inputs["mask"][(*s, n)]}
    if train:
        exprs.update({f"saved{i}": e for i, (_, e) in enumerate(d.saved)})
    outputs = _outputs("step", lead + (batch, hidden), exprs, env)
    mode = "train" if train else "infer"
    kernel = _make(f"recurrent_step_{cell.name}_{mode}_n{batch}_h{hidden}{f'_s{S}' if state_size else ''}"
                   f"{_reduction_suffix(reduction, S)}"
                   f"{_panel_suffix(panel)}{_lead_suffix(directions)}{_MASKED if masked else ''}{'_bf16' if bf16 else ''}",
                   inputs, outputs, gemm="recurrent_projection", columns=gate_axes(panel), batch=len(lead))
    return _with_unmasked(kernel, masked, lambda: recurrent_step(cell, batch, hidden, train, directions, panel,
                                                                 bf16=bf16, state_size=state_size, reduction=reduction))


def bf16_state(batch, hidden, directions: int = 1) -> Kernel:
    """A bf16 step's state operand (:func:`recurrent_step`'s ``hb``): ``h_prev`` rounded to bf16,
    each k-pair one word (:func:`bf16_pair`, the bits held in an fp32 tensor), ``directions``
    steps' at once (:func:`_lead`)."""
    if hidden % 2:
        raise ValueError("bf16 projections need the CPU weight panels (BuildOptions.weight_panels)")
    lead = _lead(directions)
    h_prev = te.placeholder(lead + (batch, hidden), F32, "h_prev")
    hb = te.compute(lead + (batch, hidden // 2), lambda *i: tirx.reinterpret(F32, bf16_pair(
        h_prev[(*i[:-1], 2 * i[-1])], h_prev[(*i[:-1], 2 * i[-1] + 1)])), name="hb")
    return _make(f"bf16_state_n{batch}_h{hidden}{_lead_suffix(directions)}", {"h_prev": h_prev}, {"hb": hb},
                 batch=len(lead))


def projection_step(batch, hidden, proj, panel: int = 0, masked: bool = False, directions: int = 1) -> Kernel:
    """An LSTM's projection for one step (torch.nn's ``proj_size``): ``h[n, p] = sum_j r[n, j]
    w_hr[p, j]``, the step's unprojected output ``r`` (:func:`recurrent_step`'s, with
    ``state_size``) times the ``(P, H)`` projection, into the state and the layer output (``h``,
    ``y``). ``w`` is packed as a one-gate weight with H inputs and P units, ``weight_shape(H, P, 1,
    panel)``. ``masked``: a row whose mask is 0 keeps ``h_prev``, as :func:`recurrent_step`'s states.
    ``directions``: as for :func:`recurrent_step`, a leading axis on every parameter."""
    lead = _lead(directions)
    r = te.placeholder(lead + (batch, hidden), F32, "r")
    w = te.placeholder(lead + weight_shape(hidden, proj, 1, panel), F32, "w")
    inputs = {"r": r, "w": w}
    j = te.reduce_axis((0, hidden), "j")

    def product(*i):
        *s, n, col = i  # s: the direction, if any
        return te.sum(r[(*s, n, j)] * _weight_at(w, tuple(s), j, col, panel), axis=j)
    mm = _gates_compute(lead + (batch,), proj, 1, panel, product, "matmul", _axis_names(lead, "n"))
    if masked:
        inputs["h_prev"] = te.placeholder(lead + (batch, proj), F32, "h_prev")
        inputs["mask"] = te.placeholder(lead + (batch,), F32, "mask")

    def out(*i):
        *s, n, p = i
        value = mm[(*s, n, *gate_index(p, 0, panel))]
        if masked:
            value = tirx.Select(inputs["mask"][(*s, n)] > tirx.const(0.5, F32), value, inputs["h_prev"][(*s, n, p)])
        return [value, value]
    h, y = te.compute(lead + (batch, proj), out, name="h", varargs_names=_axis_names(lead, "n", "p"))
    kernel = _make(f"projection_step_n{batch}_h{hidden}_proj{proj}{_panel_suffix(panel)}{_lead_suffix(directions)}"
                   f"{_MASKED if masked else ''}", inputs, {"h": h, "y": y}, gemm="matmul", columns=gate_axes(panel),
                   batch=len(lead))
    return _with_unmasked(kernel, masked, lambda: projection_step(batch, hidden, proj, panel, directions=directions))


# A masked step's mask value for the row (1: the row's sequence runs at this step, 0: it has ended,
# or not begun in the reverse direction): a variable of the gate math's expressions, bound per row.
_RUNNING = tirx.Var("running", "float32")
_MASKED = "_masked"


def _where_running(value, otherwise):
    """``value`` where the row runs at this step, else ``otherwise`` (a select: NaN and Inf in the
    discarded branch stay out, as they do when torch.nn never computes a finished row's step)."""
    return tirx.Select(_RUNNING > tirx.const(0.5, "float32"), value, otherwise)


def _lead(directions: int) -> tuple:
    """The leading axis of a kernel that runs ``directions`` steps at once (none for one).

    Both directions of a bidirectional layer are independent: one launch per step can run
    them side by side (cuDNN does), twice the thread blocks per launch and half the launches.
    The sequence driver binds the axis to a view whose stride is the distance between the two
    directions' buffers at that step (:class:`tvmrnn.program.sequence.Stacked`). To a schedule it is one
    more output row axis, outermost.
    """
    return (directions,) if directions > 1 else ()


def _axis_names(lead: tuple, *names: str) -> list[str]:
    return ["d"] * len(lead) + list(names)


def _padded_axis(name: str, rows: int, reduction: int, what: str):
    """A GEMM's reduce axis over ``rows`` or, padded, over ``reduction`` (0: not padded) indices
    (``what``: the GEMM, for the error, ``{rows}`` where its size goes),
    and ``guarded(product)``: the product, a zero past ``rows`` (a lazy ``if_then_else``: the loads
    past them never run; a schedule cannot drop it, unlike a block predicate, v91)."""
    if reduction and reduction < rows:
        raise ValueError(f"reduction: {reduction} for {what.format(rows=rows)} needs at least {rows}")
    axis = te.reduce_axis((0, reduction or rows), name)
    if not reduction or reduction == rows:
        return axis, lambda product: product
    return axis, lambda product: tirx.if_then_else(axis < rows, product, tirx.const(0.0, F32))


def _reduction_suffix(reduction: int, rows: int) -> str:
    """A padded reduction's part of a kernel's name (``_r`` and its extent; none where it is not)."""
    return f"_r{reduction}" if reduction and reduction != rows else ""


def _lead_suffix(directions: int) -> str:
    return f"_d{directions}" if directions > 1 else ""


def pointwise_backward(cell: Cell, batch, hidden, masked: bool = False) -> Kernel:
    """The derived backward of the gate math for one step.

    Inputs: dy (gradient of this step's output), the carried dh (and dc) from the next step,
    the saved values, and whichever of h_{t-1}, c_{t-1}, h_t, c_t the derivation reads.
    Outputs: the gradient of every gate's input projection (``dgx{g}``) and, when it differs
    (GRU), of its recurrent projection (``dgh{g}``); the direct part of dh_{t-1}; dc_{t-1}; and
    this step's share of each per-unit parameter's gradient (``dp{i}``, per batch row: the
    sequence sums them over steps and rows afterwards, in a fixed order).
    """
    inputs = {"dh": te.placeholder((batch, hidden), F32, "dh")}
    kernel = _pointwise_backward(cell, batch, hidden, (), inputs, lambda n, j: inputs["dh"][n, j],
                                 f"pointwise_backward_{cell.name}_n{batch}_h{hidden}{_MASKED if masked else ''}",
                                 masked=masked)
    return _with_unmasked(kernel, masked, lambda: pointwise_backward(cell, batch, hidden))


def _state_gradient_gemm(lead: tuple, batch, rows, gates, out_size, panel: int, padded: bool = False,
                         reduction: int = 0):
    """The backward's GEMM onto a state's gradient, ``mm[n, k] = sum_{g,j} dgh[n, j, g] w[g, j, k]``
    with ``w`` a ``(G, rows, K)`` weight in PyTorch's layout or its panels
    (:func:`backward_weight_shape`), ``lead`` axes on every operand: ``({"dgh", "w"}, mm)``.
    ``padded``: over every column of the panels, the last one's padding included (zero weights;
    a fused epilogue reads the K real ones), so that each tile is one whole panel. ``reduction``:
    ``j`` runs over that many rows, each past ``rows`` a guarded zero (as :func:`recurrent_step`'s)."""
    j, guarded = _padded_axis("j", rows, reduction, "a state gradient of {rows} rows")
    dgh = te.placeholder(lead + (batch, rows, gates), F32, "dgh")
    w = te.placeholder(lead + backward_weight_shape(gates, rows, out_size, panel), F32, "w")
    if padded and panel:
        out_size = panels(out_size, panel) * panel
    g = te.reduce_axis((0, gates), "g")

    def product(*i):
        *s, n, k = i  # s: the direction, if any
        return te.sum(guarded(dgh[(*s, n, j, g)] * _weight_t_at(w, tuple(s), g, j, k, panel)), axis=[j, g])
    mm = te.compute(lead + (batch, out_size), product, name="matmul", varargs_names=_axis_names(lead, "n", "k"))
    return {"dgh": dgh, "w": w}, mm


def backward_step(cell: Cell, batch, hidden, directions: int = 1, panel: int = 0, masked: bool = False,
                  proj: int = 0, reduction: int = 0) -> Kernel:
    """One launch per backward step: step t's recurrent backward fused with step t-1's pointwise.

    ``dh_{t-1} = dgh_t W_hh (+ the direct part of step t's pointwise)`` is, at each ``(n, unit)``,
    all that step t-1's gate-math backward needs from step t, so that backward runs as the GEMM's
    epilogue, where the GEMM's result sits (cuDNN's backward fuses the same way). Inputs: ``dgh``
    (step t's recurrent-gate gradients), ``w`` (W_hh, PyTorch layout), ``dh_direct_in`` (step t's
    direct part, where the cell has one), ``gemm_mask`` (masked: step t's mask, which the
    expressions do not read: see :mod:`tvmrnn.schedules.ended_rows`), then the pointwise
    backward's inputs for step t-1 except ``dh``. Outputs: the pointwise backward's, for step t-1
    (its ``dh_direct`` may be the same buffer as ``dh_direct_in``: each element is read before it
    is written, by the same thread).
    ``directions``: as for :func:`recurrent_step`, a leading axis on every parameter. ``panel``:
    the weights' panels (:func:`backward_weight_shape`).

    ``proj`` P (an LSTM with projections): the GEMM is the projection's backward instead, ``dr =
    dgh W_hr`` with ``dgh`` the step's ``(N, P, 1)`` gradient of its projected state and ``w`` the
    ``(P, H)`` projection as a one-gate weight (``backward_weight_shape(1, P, H, panel)``), and the
    gate math runs on that ``dr`` (its ``dy`` zeros: the output's gradient is in ``dgh``); the
    recurrent GEMM is :func:`projected_recurrent_backward`'s. ``reduction`` (not with ``proj``):
    the GEMM's units padded to that many, as :func:`recurrent_step`'s.
    """
    lead = _lead(directions)
    rows, gates = (proj, 1) if proj else (hidden, cell.num_gates)
    if reduction and proj:
        raise ValueError("reduction: not for a projection's backward")
    inputs, mm = _state_gradient_gemm(lead, batch, rows, gates, hidden, panel, padded=True, reduction=reduction)
    if has_direct_part(cell, masked) and not proj:
        inputs["dh_direct_in"] = te.placeholder(lead + (batch, hidden), F32, "dh_direct_in")
        carried = lambda *i: mm[i] + inputs["dh_direct_in"][i]  # noqa: E731
    else:
        carried = lambda *i: mm[i]  # noqa: E731
    if masked:  # the mask of the step whose dgh the GEMM reads (read by no expression: CPU schedules
        # skip the GEMM of rows that have all ended there, tvmrnn.schedules.ended_rows)
        inputs["gemm_mask"] = te.placeholder(lead + (batch,), F32, "gemm_mask")
    kernel = _pointwise_backward(cell, batch, hidden, lead, inputs, carried,
                                 f"backward_step_{cell.name}_n{batch}_h{hidden}{f'_proj{proj}' if proj else ''}"
                                 f"{_reduction_suffix(reduction, hidden)}{_panel_suffix(panel)}{_lead_suffix(directions)}{_MASKED if masked else ''}",
                                 gemm="matmul", columns=("k",), masked=masked)
    return _with_unmasked(kernel, masked, lambda: backward_step(cell, batch, hidden, directions, panel, proj=proj,
                                                                reduction=reduction))


def projected_recurrent_backward(batch, hidden, proj, gates, panel: int = 0, masked: bool = False,
                                 last: bool = False, directions: int = 1) -> Kernel:
    """An LSTM with projections' recurrent GEMM backward for one step, ``dh_{t-1}[n, p] = sum_{g,j}
    dgh_t[n, j, g] W_hh[g, j, p]`` (``w``: W_hh's ``(G, H, P)`` copy, :func:`backward_weight_shape`),
    and in its epilogue the next step's (t-1's) gradient of its projected state, ``g = dy_{t-1} +
    dh_{t-1}`` (what :func:`backward_step` with ``proj`` and the gradient of ``W_hr`` read).
    ``masked``: where the GEMM's step has ended for a row (``mask``), ``dh_{t-1}`` is the carried
    ``dh_t`` (``carry``: the state passed through), written as ``carry_next``; where step t-1 has
    (``mask_next``), ``g`` is zero. ``last`` (the first step's GEMM): ``dh_{t-1}`` alone, as ``dh``
    (the gradient of h0). ``directions``: a leading axis on every parameter (:func:`_lead`)."""
    lead = _lead(directions)
    inputs, mm = _state_gradient_gemm(lead, batch, hidden, gates, proj, panel)
    zero, half = tirx.const(0.0, F32), tirx.const(0.5, F32)
    if masked:
        inputs["carry"] = te.placeholder(lead + (batch, proj), F32, "carry")
        inputs["mask"] = te.placeholder(lead + (batch,), F32, "mask")
    if not last:
        inputs["dy"] = te.placeholder(lead + (batch, proj), F32, "dy")
        if masked:
            inputs["mask_next"] = te.placeholder(lead + (batch,), F32, "mask_next")

    def outputs(*i):
        *s, n, k = i
        dh = mm[i]
        if masked:
            dh = tirx.Select(inputs["mask"][(*s, n)] > half, dh, inputs["carry"][i])
        result = [dh] if last or masked else []
        if not last:
            total = inputs["dy"][i] + dh
            result.append(tirx.Select(inputs["mask_next"][(*s, n)] > half, total, zero) if masked else total)
        return result
    roles = ["dh"] if last else (["carry_next", "g"] if masked else ["g"])
    tensors = te.compute(lead + (batch, proj), outputs, name="dh", varargs_names=_axis_names(lead, "n", "k"))
    tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    suffix = ("_last" if last else "") + _panel_suffix(panel) + _lead_suffix(directions) + (_MASKED if masked else "")
    kernel = _make(f"projected_recurrent_backward_n{batch}_h{hidden}_proj{proj}_g{gates}{suffix}", inputs,
                   dict(zip(roles, tensors)), gemm="matmul", columns=("k",), batch=len(lead))
    return _with_unmasked(kernel, masked, lambda: projected_recurrent_backward(batch, hidden, proj, gates, panel,
                                                                              last=last, directions=directions))


def projected_gradient_start(batch, proj, masked: bool = False, directions: int = 1) -> Kernel:
    """The last step's gradient of an LSTM's projected state, ``g = dy + dhy`` (``masked``: zero
    where the row has ended; see :func:`projected_recurrent_backward`)."""
    lead = _lead(directions)
    dy = te.placeholder(lead + (batch, proj), F32, "dy")
    dh = te.placeholder(lead + (batch, proj), F32, "dh")
    inputs = {"dy": dy, "dh": dh}
    if masked:
        inputs["mask"] = te.placeholder(lead + (batch,), F32, "mask")

    def value(*i):
        *s, n, k = i
        total = dy[i] + dh[i]
        return tirx.Select(inputs["mask"][(*s, n)] > tirx.const(0.5, F32), total, tirx.const(0.0, F32)) if masked \
            else total
    g = te.compute(lead + (batch, proj), value, name="g", varargs_names=_axis_names(lead, "n", "k"))
    kernel = _make(f"projected_gradient_start_n{batch}_p{proj}{_lead_suffix(directions)}{_MASKED if masked else ''}",
                   inputs, {"g": g}, batch=len(lead))
    return _with_unmasked(kernel, masked, lambda: projected_gradient_start(batch, proj, directions=directions))


def _with_unmasked(kernel: Kernel, masked: bool, unmasked) -> Kernel:
    """A masked kernel with its unmasked twin (``unmasked()``) attached (:attr:`Kernel.unmasked`)."""
    return dataclasses.replace(kernel, unmasked=unmasked()) if masked else kernel


def has_direct_part(cell: Cell, masked: bool = False) -> bool:
    """Whether a step's backward passes a direct part of dh_{t-1} beside the recurrent GEMM's: the
    cell reads h_{t-1} outside its gates (the GRU), or masked steps (a finished row passes its dh
    on unchanged)."""
    return derivation(cell).grad_h_prev is not None or masked


def _pointwise_backward(cell: Cell, batch, hidden, lead: tuple, inputs: dict, carried, name, gemm=None,
                        columns=(), masked: bool = False) -> Kernel:
    """The gate-math backward's kernel, ``carried(*s, n, j)`` giving the dh that flows back into the
    step (``s``: the ``lead`` axes, see :func:`_lead`). ``masked`` (see :func:`recurrent_step`): a
    row whose mask is 0 at this step gets zero gate and per-unit gradients, and passes the dh
    (without ``dy``: its output was zeroed) and dc it got on to the step before."""
    d = derivation(cell)
    G = cell.num_gates
    shape = (batch, hidden)
    names = {"dy": None}
    if cell.has_cell_state:
        names["dc"] = None
    if d.saved:
        names["saved"] = (batch, hidden, len(d.saved))
    states = [("h_prev", d.h_prev), ("c_prev", d.c_prev), ("h_next", d.h_next), ("c_next", d.c_next)]
    for role, var in states:
        if var is not None and d.backward_uses(var):
            names[role] = None
    if any(d.backward_uses(var) for var in d.params):
        names["unit"] = (len(d.params), hidden)
    if masked:
        names["mask"] = (batch,)
    inputs.update({role: te.placeholder(lead + (s or shape), F32, role) for role, s in names.items()})
    carried_dh = tirx.Var("carried_dh", "float32")  # the dh from the steps after, without dy

    def env(*i):
        *s, n, j = i
        e = {d.dh: inputs["dy"][i] + carried(*i)}
        if d.dc is not None:
            e[d.dc] = inputs["dc"][i]
        for k, (var, _) in enumerate(d.saved):
            e[var] = inputs["saved"][(*s, n, j, k)]
        for role, var in states:
            if role in inputs:
                e[var] = inputs[role][i]
        if "unit" in inputs:
            e.update({var: inputs["unit"][(*s, p, j)] for p, var in enumerate(d.params)})
        if masked:
            e[_RUNNING] = inputs["mask"][(*s, n)]
            e[carried_dh] = carried(*i)
        return e

    exprs = {f"dgx{g}": d.grad_x[g] for g in range(G)}
    if not d.gate_grads_shared:
        exprs.update({f"dgh{g}": d.grad_h[g] for g in range(G)})
    if d.grad_h_prev is not None:
        exprs["dh_direct"] = d.grad_h_prev
    if d.grad_c_prev is not None:
        exprs["dc_prev"] = d.grad_c_prev
    exprs.update({f"dp{i}": grad for i, grad in enumerate(d.grad_params)})
    if masked:
        zero = tirx.const(0.0, "float32")
        exprs = {role: _where_running(e, zero) for role, e in exprs.items()}
        exprs["dh_direct"] = _where_running(d.grad_h_prev if d.grad_h_prev is not None else zero, carried_dh)
        if d.dc is not None:
            exprs["dc_prev"] = _where_running(d.grad_c_prev if d.grad_c_prev is not None else zero, d.dc)
    outputs = _outputs("pointwise_backward", lead + shape, exprs, env)
    return _make(name, inputs, outputs, gemm=gemm, columns=columns, batch=len(lead))


def recurrent_backward(batch, hidden, gates, direct: bool, panel: int = 0, reduction: int = 0) -> Kernel:
    """``dh_{t-1}[n, k] = sum_{g,j} dgh[n, j, g] w[g, j, k]`` (+ the pointwise's direct part).

    ``w`` is W_hh in PyTorch's ``(G, H, K)`` layout (kept beside the packed one, see
    :mod:`tvmrnn.cells.parameters`): the output axis ``k`` is then contiguous in the weights too.
    """
    inputs, mm = _state_gradient_gemm((), batch, hidden, gates, hidden, panel, reduction=reduction)
    if direct:
        inputs["dh_direct"] = te.placeholder((batch, hidden), F32, "dh_direct")
        out = te.compute(mm.shape, lambda n, k: mm[n, k] + inputs["dh_direct"][n, k], name="dh")
    else:
        out = te.compute(mm.shape, lambda n, k: mm[n, k], name="dh")
    suffix = "_direct" if direct else ""
    return _make(f"recurrent_backward_n{batch}_h{hidden}_g{gates}{suffix}{_reduction_suffix(reduction, hidden)}"
                 f"{_panel_suffix(panel)}", inputs, {"dh": out},
                 gemm="matmul", columns=("k",))


def gradient_panels_shape(steps, batch, hidden, gates, panel: int) -> tuple[int, ...]:
    """Gate gradients of a chunk of steps in column panels, ``(H / panel, T, N, panel, G)``: panel
    p holds the ``panel * G`` columns ``(j, g)`` of units ``p * panel ...`` for every row ``(t, n)``,
    so that a weight-gradient tile, which streams those columns along its reduction over ``(t,
    n)``, walks one contiguous block (in ``(T, N, H, G)`` each step of it jumps a 12.8 KB row for a
    DS2 LSTM). :func:`gradient_panels` packs them. Where ``panel`` does not divide H the last panel
    is padded (:func:`panels`), its units past H zero gradients."""
    return (panels(hidden, panel), steps, batch, panel, gates)


def gradient_panels(steps, batch, hidden, gates, panel: int, last: bool = False) -> Kernel:
    """``(T, N, H, G)`` gate gradients -> :func:`gradient_panels_shape`'s panels (a block copy:
    each panel's row is ``panel * G`` consecutive floats of a gradient row), the whole panels
    alone where ``panel`` does not divide H; with ``last``, that last padded panel alone (its
    units past H zeros: a guarded copy, kept apart so that the whole panels' copies stay plain)."""
    src = te.placeholder((steps, batch, hidden, gates), F32, "src")
    whole = hidden // panel
    if last:
        first, width = whole * panel, hidden % panel
        if not width:
            raise ValueError(f"panel: {panel} units divide hidden_size {hidden}: no padded last panel")
        dst = te.compute((1, steps, batch, panel, gates),
                         lambda p, t, n, u, g: _zero_past(lambda v: src[t, n, first + v, g], u, width), name="dst")
        return _make(f"gradient_panel_last_t{steps}_n{batch}_h{hidden}_g{gates}_p{panel}", {"src": src}, {"dst": dst})
    dst = te.compute((whole, steps, batch, panel, gates), lambda p, t, n, u, g: src[t, n, p * panel + u, g],
                     name="dst")
    return _make(f"gradient_panels_t{steps}_n{batch}_h{hidden}_g{gates}_p{panel}", {"src": src}, {"dst": dst})


def input_panels(steps, batch, in_size, rows: int) -> Kernel:
    """A chunk's inputs ``(T, N, K)`` in row panels ``(K / rows, T, N, rows)``, the weight
    gradient's other operand (:func:`weight_gradient`'s ``input_rows``): panel q holds features
    ``q * rows ...`` of every row ``(t, n)`` side by side, so that a register tile of ``rows``
    output rows reads them contiguously along its reduction over ``(t, n)``, where in ``(T, N, K)``
    each step of it jumps K floats (4 KB at K = 1024: every line in the same L1 set)."""
    if in_size % rows:
        raise ValueError(f"rows: {rows} do not divide in_size {in_size}")
    src = te.placeholder((steps, batch, in_size), F32, "src")
    dst = te.compute((in_size // rows, steps, batch, rows), lambda q, t, n, r: src[t, n, q * rows + r], name="dst")
    return _make(f"input_panels_t{steps}_n{batch}_k{in_size}_r{rows}", {"src": src}, {"dst": dst})


def weight_gradient_shape(in_size, hidden, gates, panel: int = 0) -> tuple[int, ...]:
    """A weight gradient as :func:`weight_gradient` sums it on a CPU: ``(K, H, G)``, or in the
    column panels of ``panel`` units ``(H / panel, K, panel, G)``, the last one padded where
    ``panel`` does not divide H (:func:`panels`; its units past H sum zero gradients)."""
    if not panel:
        return (in_size, hidden, gates)
    return (panels(hidden, panel), in_size, panel, gates)


def weight_gradient(steps, batch, in_size, hidden, gates, packed: bool = False, panel: int = 0,
                    input_rows: int = 0, masked: bool = False) -> Kernel:
    """Accumulate ``dw[g, j, k] += sum_{t,n} dg[t, n, j, g] a[t, n, k]`` over a chunk of steps.

    ``dw`` is in PyTorch's layout (row g*H + j), or with ``packed`` in the forward kernels'
    ``(k, j, g)`` (:func:`gate_transpose`'s; :func:`gate_untranspose` brings it back): there the
    gate gradients are the streamed operand, read along their contiguous ``(j, g)``, which CPUs
    run 1.7-2.3x faster (notes/performance.md, v12). With ``panel`` (and ``packed``) the gate
    gradients come in :func:`gradient_panels_shape`'s panels and ``dw`` is summed in
    :func:`weight_gradient_shape`'s, so that a tile (a whole panel of columns) streams one
    contiguous block, as the input projection streams its packed weights: on the GPU machine's
    Xeon 1,706 -> 1,381 us a 16-step DS2 LSTM chunk (16 threads; PyTorch's GEMM 1,243,
    notes/performance.md v25). The caller passes the same buffer as ``acc`` and ``dw``, so the
    running sum stays in place and its order (chunk by chunk, in time order) is fixed: the
    result is bit-identical from run to run. With ``input_rows`` (and ``panel``) the inputs come in
    :func:`input_panels`' row panels too, both operands packed as BLIS packs them; the register
    tile's rows are then the panel's (:func:`tvmrnn.schedules.cpu.input_panel`). ``masked``: as
    for :func:`input_projection`, the products of ended rows (zero gate gradients) left out of the
    sum (:func:`tvmrnn.schedules.ended_rows.skip_ended_reduction_rows`).
    """
    if panel and not packed:
        raise ValueError("weight_gradient: panels are a packed layout (packed=True)")
    if input_rows and not panel:
        raise ValueError("weight_gradient: input panels go with gradient panels (panel=)")
    if input_rows and in_size % input_rows:
        raise ValueError(f"input_rows: {input_rows} do not divide in_size {in_size}")
    a = te.placeholder((in_size // input_rows, steps, batch, input_rows) if input_rows
                       else (steps, batch, in_size), F32, "a")

    def a_at(t, n, k):
        return a[k // input_rows, t, n, k % input_rows] if input_rows else a[t, n, k]
    dg = te.placeholder(gradient_panels_shape(steps, batch, hidden, gates, panel) if panel
                        else (steps, batch, hidden, gates), F32, "dg")
    t = te.reduce_axis((0, steps), "t")
    n = te.reduce_axis((0, batch), "n")
    if panel:
        acc = te.placeholder(weight_gradient_shape(in_size, hidden, gates, panel), F32, "acc")
        mm = te.compute(acc.shape, lambda p, k, u, g: te.sum(a_at(t, n, k) * dg[p, t, n, u, g], axis=[t, n]),
                        name="matmul")
        out = te.compute(acc.shape, lambda p, k, u, g: acc[p, k, u, g] + mm[p, k, u, g], name="dw")
        columns = ("u", "g")
        name = f"weight_gradient_panels_p{panel}" + (f"_r{input_rows}" if input_rows else "")
    elif packed:
        acc = te.placeholder((in_size, hidden, gates), F32, "acc")
        mm = te.compute(acc.shape, lambda k, j, g: te.sum(a[t, n, k] * dg[t, n, j, g], axis=[t, n]),
                        name="matmul")
        out = te.compute(acc.shape, lambda k, j, g: acc[k, j, g] + mm[k, j, g], name="dw")
        columns, name = ("j", "g"), "weight_gradient_packed"
    else:
        acc = te.placeholder((gates, hidden, in_size), F32, "acc")
        mm = te.compute(acc.shape, lambda g, j, k: te.sum(dg[t, n, j, g] * a[t, n, k], axis=[t, n]),
                        name="matmul")
        out = te.compute(acc.shape, lambda g, j, k: acc[g, j, k] + mm[g, j, k], name="dw")
        columns, name = ("k",), "weight_gradient"
    kernel = _make(f"{name}_t{steps}_n{batch}_k{in_size}_h{hidden}_g{gates}{_MASKED if masked else ''}",
                   {"dg": dg, "a": a, "acc": acc, **_ended_rows_mask(steps, batch, masked)}, {"dw": out},
                   gemm="matmul", columns=columns)
    return _with_unmasked(kernel, masked, lambda: weight_gradient(steps, batch, in_size, hidden, gates, packed, panel,
                                                                  input_rows))


def bias_gradient(steps, batch, hidden, gates) -> Kernel:
    """Accumulate ``db[g, j] += sum_{t,n} dg[t, n, j, g]`` over a chunk of steps (in place).

    The sum is formed as ``(j, g)``, the order ``dg`` is laid out in (contiguous, vectorisable),
    and transposed into PyTorch's ``(g, j)`` as it is added.
    """
    dg = te.placeholder((steps, batch, hidden, gates), F32, "dg")
    acc = te.placeholder((gates, hidden), F32, "acc")
    t = te.reduce_axis((0, steps), "t")
    n = te.reduce_axis((0, batch), "n")
    total = te.compute((hidden, gates), lambda j, g: te.sum(dg[t, n, j, g], axis=[t, n]), name="sum")
    out = te.compute(acc.shape, lambda g, j: acc[g, j] + total[j, g], name="db")
    return _make(f"bias_gradient_t{steps}_n{batch}_h{hidden}_g{gates}", {"dg": dg, "acc": acc}, {"db": out},
                 gemm="sum", columns=("j", "g"))


def input_gradient(steps, batch, in_size, hidden, gates, accumulate: bool, panel: int = 0,
                   masked: bool = False, reduction: int = 0) -> Kernel:
    """``dx[t, n, k] (+)= sum_{g,j} dg[t, n, j, g] w[g, j, k]`` for a chunk of steps.

    ``w`` is W_ih in PyTorch's ``(G, H, K)`` layout, as in :func:`recurrent_backward`. With
    ``accumulate`` the caller passes the same buffer as ``acc`` and ``dx`` (the second
    direction of a bidirectional layer adds to what the first wrote). ``masked``: as for
    :func:`input_projection` (an ended row's ``dx`` is zero, or ``acc``). ``reduction``: ``j`` over
    that many units, each past ``hidden`` a guarded zero (as :func:`recurrent_step`'s).
    """
    j, guarded = _padded_axis("j", hidden, reduction, "an input gradient of {rows} units")
    dg = te.placeholder((steps, batch, hidden, gates), F32, "dg")
    w = te.placeholder(backward_weight_shape(gates, hidden, in_size, panel), F32, "w")
    inputs = {"dg": dg, "w": w}
    g = te.reduce_axis((0, gates), "g")
    mm = te.compute((steps, batch, in_size),
                    lambda t, n, k: te.sum(guarded(dg[t, n, j, g] * _weight_t_at(w, (), g, j, k, panel)), axis=[j, g]),
                    name="matmul")
    if accumulate:
        inputs["acc"] = te.placeholder(mm.shape, F32, "acc")
        out = te.compute(mm.shape, lambda t, n, k: inputs["acc"][t, n, k] + mm[t, n, k], name="dx")
    else:
        out = te.compute(mm.shape, lambda t, n, k: mm[t, n, k], name="dx")
    inputs.update(_ended_rows_mask(steps, batch, masked))
    suffix = ("_acc" if accumulate else "") + _panel_suffix(panel) + (_MASKED if masked else "")
    kernel = _make(f"input_gradient_t{steps}_n{batch}_k{in_size}_h{hidden}_g{gates}"
                   f"{_reduction_suffix(reduction, hidden)}{suffix}", inputs, {"dx": out},
                   gemm="matmul", columns=("k",))
    return _with_unmasked(kernel, masked, lambda: input_gradient(steps, batch, in_size, hidden, gates, accumulate,
                                                                 panel, reduction=reduction))


def persistent(kernel: Kernel, max_blocks: int, row_groups: bool = False) -> Kernel:
    """The same step kernel, to be run persistently (:meth:`tvmrnn.program.sequence.Program.loop`): one
    launch for all steps, at most ``max_blocks`` thread blocks (all resident at once), a grid-wide
    barrier between steps. A workload of its own (the limit is an attribute of its function), as
    its schedule differs: fewer, larger blocks.

    ``row_groups``: its blocks are to split the rows only, each with all of a direction's weights
    on chip (:data:`ROW_GROUPS`, the schedules' row tiles at any row count; a name of its own, ``_rows``)."""
    func = kernel.func.with_attr("tvmrnn.persistent_blocks", max_blocks)
    if row_groups:
        func = func.with_attr(ROW_GROUPS, 1)
    twin = persistent(kernel.unmasked, max_blocks, row_groups) if kernel.unmasked is not None else None
    name = f"{kernel.name}_persistent" + ("_rows" if row_groups else "")
    return dataclasses.replace(kernel, name=name, func=func, unmasked=twin)


# The attribute of a persistent step kernel whose blocks split the rows alone (:func:`persistent`)
ROW_GROUPS = "tvmrnn.row_groups"


def row_groups(func) -> bool:
    """Whether a kernel's function is a persistent step of row groups (:func:`persistent`)."""
    return func.attrs is not None and int(func.attrs.get(ROW_GROUPS, 0)) == 1


def tf32(kernel: Kernel, operands: str = "tf32") -> Kernel:
    """The same GEMM kernel, its products on tensor cores (a build with ``allow_tf32``,
    :func:`tvmrnn.schedules.cuda.gpu_matmul_tf32`): on TF32, or with ``operands`` "float16" or
    "bfloat16" on operands rounded to that half type (a half build's forward GEMMs: its inputs
    and weights are half values already; a later layer's input and a step's hidden state are
    rounded, as cuDNN's half path stores them). A workload of its own (the attributes are part of its
    function), so that records tuned for the fp32 schedule never apply to it."""
    func = kernel.func.with_attr("tvmrnn.tf32", 1)
    suffix = "_tf32"
    if operands != "tf32":
        func = func.with_attr("tvmrnn.tensor_core_operands", operands)
        suffix = {"float16": "_f16", "bfloat16": "_bf16"}[operands]
    # a masked step's twin is the unmasked step's form, whose records it replays
    return dataclasses.replace(kernel, name=f"{kernel.name}{suffix}", func=func,
                               unmasked=tf32(kernel.unmasked, operands) if kernel.unmasked is not None else None)


def reads_gradients(kernel: Kernel) -> bool:
    """Whether a GEMM kernel belongs to a backward pass (its gradients' roles are named ``d...``;
    not meaningful for copies, whose output is ``dst``)."""
    return any(role.startswith("d") for role in kernel.roles)


def fill_zero(size) -> Kernel:
    """``dst = 0`` (resets a persistent kernel's grid-barrier counter before its launch)."""
    dst = te.compute((size,), lambda i: tvm.tirx.const(0, F32), name="dst")
    return _make(f"fill_zero_{size}", {}, {"dst": dst})


def copy(rows, cols) -> Kernel:
    """``dst = src`` for a (rows, cols) array: moves states in and out, copies weights."""
    src = te.placeholder((rows, cols), F32, "src")
    dst = te.compute(src.shape, lambda n, j: src[n, j], name="dst")
    return _make(f"copy_{rows}x{cols}", {"src": src}, {"dst": dst})


def copy_steps(*shape) -> Kernel:
    """``dst = src`` for a chunk of steps, ``(steps, rows, ...)``: stages a chunk's gate gradients,
    inputs and mask for a weight gradient over a longer span (the backward's ``staged`` tails,
    :data:`tvmrnn.program.passes.CPU_STAGED_WEIGHT_GRADIENTS`)."""
    src = te.placeholder(tuple(shape), F32, "src")
    dst = te.compute(src.shape, lambda *i: src[i], name="dst")
    return _make(f"copy_steps_{'x'.join(str(d) for d in shape)}", {"src": src}, {"dst": dst})


def gate_transpose(gates, hidden, in_size, panel: int = 0) -> Kernel:
    """Weight packing: PyTorch's ``(G, H, K)`` (rows g*H + j) -> the kernels' ``(K, H, G)``, or
    its gate-blocked column panels ``(H / panel, K, G, panel)`` (:func:`weight_shape`; a bias is
    a weight with K = 1, so it comes out as :func:`gate_shape`'s layout)."""
    src = te.placeholder((gates, hidden, in_size), F32, "src")
    if panel and hidden % panel:  # the last panel padded with zeros
        dst = te.compute(weight_shape(in_size, hidden, gates, panel),
                         lambda p, k, g, u: tirx.if_then_else(
                             p * panel + u < hidden, src[g, tirx.min(p * panel + u, hidden - 1), k],
                             tirx.const(0.0, F32)), name="dst")
    elif panel:
        dst = te.compute(weight_shape(in_size, hidden, gates, panel),
                         lambda p, k, g, u: src[g, p * panel + u, k], name="dst")
    else:
        dst = te.compute((in_size, hidden, gates), lambda k, j, g: src[g, j, k], name="dst")
    return _make(f"gate_transpose_g{gates}_h{hidden}_k{in_size}{_panel_suffix(panel)}", {"src": src}, {"dst": dst})


def bf16_weight_pairs(gates, hidden, in_size, panel: int) -> Kernel:
    """Weight packing for bf16 projections (input and recurrent): PyTorch's ``(G, H, K)`` -> the
    weights rounded to bf16, k-pairs one to a word (:func:`bf16_pair`, an odd K's last pair with
    a zero), in the panels of :func:`weight_shape` with K halved: ``(H / panel, ceil(K / 2), G,
    panel)`` words, held as float32 (:func:`input_projection` and :func:`recurrent_step` with
    ``bf16`` reinterpret them)."""
    src = te.placeholder((gates, hidden, in_size), F32, "src")
    dst = te.compute((hidden // panel, (in_size + 1) // 2, gates, panel), lambda p, k2, g, u: tirx.reinterpret(
        F32, bf16_pair(_operand(lambda k: src[g, p * panel + u, k], 2 * k2, in_size),
                       _operand(lambda k: src[g, p * panel + u, k], 2 * k2 + 1, in_size))), name="dst")
    return _make(f"bf16_weight_pairs_g{gates}_h{hidden}_k{in_size}{_panel_suffix(panel)}", {"src": src}, {"dst": dst})


def weight_panels(gates, hidden, in_size, panel: int) -> Kernel:
    """Weight packing for the backward: PyTorch's ``(G, H, K)`` -> its panels
    ``(ceil(K / panel), H, G, panel)`` (:func:`backward_weight_shape`), zeros past K."""
    src = te.placeholder((gates, hidden, in_size), F32, "src")
    if in_size % panel:
        body = lambda p, j, g, v: tirx.if_then_else(  # noqa: E731
            p * panel + v < in_size, src[g, j, tirx.min(p * panel + v, in_size - 1)], tirx.const(0.0, F32))
    else:
        body = lambda p, j, g, v: src[g, j, p * panel + v]  # noqa: E731
    dst = te.compute(backward_weight_shape(gates, hidden, in_size, panel), body, name="dst")
    return _make(f"weight_panels_g{gates}_h{hidden}_k{in_size}_p{panel}", {"src": src}, {"dst": dst})


def gate_untranspose(gates, hidden, in_size, panel: int = 0) -> Kernel:
    """A packed weight gradient (:func:`weight_gradient`, :func:`weight_gradient_shape`: ``(K, H,
    G)`` or its panels) -> PyTorch's ``(G, H, K)``, into the caller's gradients."""
    src = te.placeholder(weight_gradient_shape(in_size, hidden, gates, panel), F32, "src")
    if panel:
        dst = te.compute((gates, hidden, in_size), lambda g, j, k: src[j // panel, k, j % panel, g], name="dst")
    else:
        dst = te.compute((gates, hidden, in_size), lambda g, j, k: src[k, j, g], name="dst")
    return _make(f"gate_untranspose_g{gates}_h{hidden}_k{in_size}{_panel_suffix(panel)}", {"src": src}, {"dst": dst})
