"""Parameter names and the packed weight layout: PyTorch's layout in, the kernels' layout out.

PyTorch keeps, per layer ``l`` and direction (suffix ``_reverse`` for the backward one),
``weight_ih_l{l}`` ``(G*H, K_l)``, ``weight_hh_l{l}`` ``(G*H, H)``, ``bias_ih_l{l}`` and
``bias_hh_l{l}`` ``(G*H,)``, gates stacked in the cell's order; K_0 is the input size and
K_l = D*H above. A cell's per-unit parameters (:attr:`tvmrnn.cells.Cell.unit_params`) follow the
four of each layer and direction, ``{name}_l{l}`` ``(H,)`` each, in the order the cell declares
them, so together they are one ``(P, H)`` block, the same in both layouts. tvmrnn packs all of
them into one flat float32 buffer (as cuDNN does), each weight K-major and gate-interleaved
(``w[k, j, g] = W[g*H + j, k]``; on CPUs in gate-blocked column panels of the GEMM tile's ``u``
units, ``w[j // u, k, g, j % u]``, :func:`tvmrnn.schedules.cpu.weight_panel`), biases ``b[j, g]``
(with panels ``b[j // u, g, j % u]``, :func:`tvmrnn.kernels.gate_shape`); the transposition itself is a compiled
pass (``pack_weights`` in :mod:`tvmrnn.program.passes`), so it runs on the device and ships inside
exported libraries. The packed buffer holds a second copy of the weights in PyTorch's own
``(G, H, K)`` layout after the first part (:meth:`Layout.backward_copy`): the backward's data GEMMs (``dx = dg W``,
``dh = dg W_hh``) produce ``k`` and want it contiguous in the weights (a CPU vectorises along it,
a GPU warp reads it coalesced), as BLAS's transposed GEMM would (on AVX2 CPUs in panels of the
tile's ``u`` features, ``(K / u, H, G, u)``, :func:`tvmrnn.kernels.backward_weight_shape`; where
no such panel divides K, the last one padded with zeros, :func:`tvmrnn.schedules.cpu.backward_panel`). That doubles the weights' memory
(10 MB more for a DS2 LSTM layer), not the workspace. Gradients come back in PyTorch's layout,
also from one flat buffer.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

_GATE_KINDS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


@dataclass(frozen=True)
class Slot:
    """Where one parameter sits in a flat buffer."""

    name: str  # PyTorch parameter name
    layer: int
    direction: int
    kind: str  # "weight_ih", "weight_hh", "bias_ih", "bias_hh", or a per-unit parameter's name
    torch_shape: tuple[int, ...]
    offset: int

    @property
    def size(self) -> int:
        return math.prod(self.torch_shape)


@dataclass(frozen=True)
class Layout:
    """All parameters of a configuration, in PyTorch's order, with their flat offsets."""

    input_size: int
    hidden_size: int
    num_layers: int
    num_directions: int
    num_gates: int
    slots: tuple[Slot, ...]
    total: int
    unit_params: tuple[str, ...] = ()
    proj_size: int = 0
    packed_units: int = 0
    padded_inputs: tuple[tuple[int, int], ...] = ()

    @staticmethod
    def create(input_size, hidden_size, num_layers, num_directions, num_gates, unit_params=(),
               proj_size: int = 0, packed_units: int = 0, padded_inputs=()) -> "Layout":
        """``proj_size`` P (an LSTM with projections, torch.nn's ``proj_size``): the hidden state
        has P features, ``weight_hh`` is ``(G*H, P)``, each layer-direction has ``weight_hr``
        ``(P, H)`` after its biases, and layers above the first take ``D*P`` inputs.
        ``packed_units`` Hp > H (CPU weight panels that do not divide H, padded:
        :func:`tvmrnn.schedules.cpu.weight_panel`): the forward kernels' weights and biases hold Hp
        units each in the packed layout, the padding's zero (0: H).
        ``padded_inputs`` ``((K, Kp), ...)`` (CPU backward panels that do not divide K, padded:
        :func:`tvmrnn.schedules.cpu.backward_panel`): the backward's copy of each weight with K
        inputs holds Kp of them (the second part grows; the padding's zero)."""
        slots, offset = [], 0
        GH = num_gates * hidden_size
        state = proj_size or hidden_size
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else num_directions * state
            for direction in range(num_directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                for kind, shape in (("weight_ih", (GH, in_size)), ("weight_hh", (GH, state)),
                                    ("bias_ih", (GH,)), ("bias_hh", (GH,)),
                                    *((name, (hidden_size,)) for name in unit_params),
                                    *((("weight_hr", (proj_size, hidden_size)),) if proj_size else ())):
                    slot = Slot(kind + suffix, layer, direction, kind, shape, offset)
                    slots.append(slot)
                    offset += slot.size
        units = packed_units if packed_units and packed_units != hidden_size else 0
        padded = tuple(sorted((int(k), int(kp)) for k, kp in dict(padded_inputs).items() if kp != k))
        return Layout(input_size, hidden_size, num_layers, num_directions, num_gates, tuple(slots), offset,
                      tuple(unit_params), proj_size, units, padded)

    def packed_size(self, slot: Slot) -> int:
        """Elements of ``slot`` in the kernels' layout: its PyTorch size, or with ``packed_units``
        a gate weight's or bias's ``G * Hp`` rows."""
        if self.packed_units and slot.kind in _GATE_KINDS:
            return slot.size // self.hidden_size * self.packed_units
        return slot.size

    def _running_offsets(self, size_of) -> tuple[tuple[int, ...], int]:
        """Each slot's offset in a part whose slots take ``size_of(slot)`` elements, and the total."""
        offsets, offset = [], 0
        for s in self.slots:
            offsets.append(offset)
            offset += size_of(s)
        return tuple(offsets), offset

    @functools.cached_property
    def _packed_offsets(self) -> tuple[tuple[int, ...], int]:
        return self._running_offsets(self.packed_size)

    def packed_offset(self, slot: Slot) -> int:
        """Where ``slot`` sits in the packed buffer's first part (the kernels' layout)."""
        return self._packed_offsets[0][self.slots.index(slot)] if self.packed_units else slot.offset

    @property
    def forward_total(self) -> int:
        """Elements of the packed buffer's first part: ``total``, or more with ``packed_units``."""
        return self._packed_offsets[1] if self.packed_units else self.total

    def copy_size(self, slot: Slot) -> int:
        """Elements of ``slot``'s place in the packed buffer's second part: its PyTorch size, or
        for a weight of K inputs padded to Kp (``padded_inputs``) its rows times Kp."""
        if len(slot.torch_shape) == 2 and self.padded_inputs:
            rows, k = slot.torch_shape
            return rows * dict(self.padded_inputs).get(k, k)
        return slot.size

    @functools.cached_property
    def _copy_offsets(self) -> tuple[tuple[int, ...], int]:
        return self._running_offsets(self.copy_size)

    @property
    def packed_total(self) -> int:
        """Elements of the packed buffer: the kernels' layout, then the backward's copies."""
        return self.forward_total + self._copy_offsets[1]

    def backward_copy(self, slot: Slot) -> int:
        """Where the backward's copy of weight ``slot`` (PyTorch's layout or its panels:
        :func:`tvmrnn.kernels.backward_weight_shape`) sits in the packed buffer."""
        return self.forward_total + self._copy_offsets[0][self.slots.index(slot)]

    def parameter_list(self) -> list:
        """``[name, PyTorch shape, offset]`` of each parameter, in order: what a package's metadata
        records, and what ``load`` checks it against."""
        return [[s.name, list(s.torch_shape), s.offset] for s in self.slots]

    def slot(self, layer: int, direction: int, kind: str) -> Slot:
        return next(s for s in self.slots if (s.layer, s.direction, s.kind) == (layer, direction, kind))

    def unit_offset(self, layer: int, direction: int, packed: bool = False) -> int:
        """Where the ``(P, H)`` block of a layer-direction's per-unit parameters starts (in
        PyTorch's layout, or with ``packed`` in the packed buffer's first part)."""
        slot = self.slot(layer, direction, self.unit_params[0])
        return self.packed_offset(slot) if packed else slot.offset

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.slots]

    def check(self, params) -> None:
        """Raise unless ``params`` holds exactly this configuration's parameters, well shaped."""
        if not hasattr(params, "items"):
            raise TypeError(f"params: expected a mapping of PyTorch parameter names to arrays, "
                            f"got {type(params).__name__}")
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError(f"params: missing parameter(s) {missing}; expected {self.names}")
        unknown = sorted(set(params) - set(self.names))
        if unknown:
            raise ValueError(f"params: unexpected parameter(s) {unknown} for this configuration; "
                             f"expected {self.names}")
        for s in self.slots:
            a = params[s.name]
            if not (hasattr(a, "shape") and hasattr(a, "dtype")):
                raise TypeError(f"params[{s.name!r}]: expected a numpy.ndarray or a torch.Tensor, "
                                f"got {type(a).__name__}")
            if tuple(a.shape) != s.torch_shape:
                raise ValueError(f"params[{s.name!r}]: expected shape {s.torch_shape}, got {tuple(a.shape)}")
            if "float" not in str(a.dtype):
                raise TypeError(f"params[{s.name!r}]: expected a floating-point array, got {a.dtype}")

    def split(self, flat):
        """A flat buffer in PyTorch's layout -> {name: view of the right shape} (no copies)."""
        return {s.name: flat[s.offset:s.offset + s.size].reshape(s.torch_shape) for s in self.slots}
