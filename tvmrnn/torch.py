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
and comes back packed as ``torch.nn`` returns it. ``proj_size`` (the LSTM's projections) runs on
fused LSTMP builds (``tvmrnn.build``'s ``proj_size``; in fp32 on GPUs, also under autocast).

Under ``torch.compile``: Dynamo leaves modules that are ``torch.nn`` RNNs (ours subclass them) out
of its graphs unless ``torch._dynamo.config.allow_rnn`` is set, so by default the model's graph
breaks around the module, which runs eagerly as a whole (as ``torch.nn.LSTM`` does; never step by
step). With ``allow_rnn`` the passes join the graph as the custom ops ``tvmrnn::forward``,
``tvmrnn::forward_train`` and ``tvmrnn::backward`` (``fullgraph=True`` works; one compiled graph
serves every batch size, the op choosing the build at run time). tvmrnn never sets that switch
itself: it is process-wide, and lets Dynamo into ``torch.nn``'s own RNN modules too.
"""
from __future__ import annotations

import copy
import functools
import itertools
import json
import math
import numbers
import re
import threading
import weakref
from typing import Optional

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence

from .cells.definition import Cell, get_cell
from .options import BuildOptions
from .cells.parameters import Layout
from .runtime.rnn import RNN as _FusedRNN, PackedWeights, Workspace
from .runtime.build import build
from .runtime.arrays import Frame, cpu_cast, to_device
from .runtime.loader import load


class _CpuCast(torch.autograd.Function):
    """A CPU tensor cast on TVM's threads (:func:`tvmrnn.runtime.arrays.cpu_cast`), its gradient
    cast back: PyTorch's own cast is a parallel op whose OpenMP threads then spin on the cores the
    passes need (a bf16 module's casts in and out cost more than its LSTM forward, v44)."""
    @staticmethod
    def forward(ctx, a, dtype: str):
        ctx.src = str(a.dtype).removeprefix("torch.")
        return cpu_cast(a.contiguous(), dtype)

    @staticmethod
    def backward(ctx, g):
        return cpu_cast(g.contiguous(), ctx.src), None


def _cast(a, dtype: torch.dtype):
    """``a.to(dtype)``, on TVM's threads for CPU casts between float32 and half outside compiled graphs."""
    if a.dtype == dtype:
        return a
    if (a.device.type == "cpu" and not torch.compiler.is_compiling()
            and {a.dtype, dtype} <= {torch.float32, torch.float16, torch.bfloat16}):
        return _CpuCast.apply(a, str(dtype).removeprefix("torch."))
    return a.to(dtype)


def _checked_batch_sizes(packed) -> np.ndarray:
    """A ``PackedSequence``'s ``batch_sizes`` as NumPy, or a ValueError naming what is wrong with
    them: each step's rows, from the first step's (the batch) down to at least 1, adding up to the
    rows of its data. ``pack_padded_sequence`` with a length longer than the padded sequence
    given to it makes one that does not (torch.nn then fails inside its kernel)."""
    sizes = packed.batch_sizes
    if sizes.device.type != "cpu" or sizes.dim() != 1 or sizes.dtype != torch.int64:
        raise ValueError(f"input: a PackedSequence's batch_sizes must be a 1-d int64 CPU tensor, as "
                         f"pack_padded_sequence makes it; got {tuple(sizes.shape)} {sizes.dtype} on {sizes.device}")
    sizes = sizes.numpy()
    if sizes.size == 0 or sizes.min() < 1 or np.any(np.diff(sizes) > 0):
        raise ValueError(f"input: a PackedSequence's batch_sizes must be positive and non-increasing "
                         f"(the rows still running at each step); got {sizes.tolist()}")
    rows = int(sizes.sum())
    if packed.data.dim() < 1 or packed.data.shape[0] != rows:
        raise ValueError(f"input: a PackedSequence whose batch_sizes add up to {rows} rows, but its data has "
                         f"{packed.data.shape[0] if packed.data.dim() else 0}: were the lengths given to "
                         f"pack_padded_sequence longer than the padded sequence?")
    return sizes


def _packed_places(sizes, batch_first: bool, device) -> torch.Tensor:
    """Each row of a PackedSequence's ``data`` (``sizes``: its ``batch_sizes``): its row in the
    padded batch, flattened: ``t * N + b`` (``b * T + t`` batch first), ``b`` in the packed order."""
    T, N = len(sizes), int(sizes[0])
    steps = np.repeat(np.arange(T), sizes)
    rows = np.arange(steps.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return to_device(torch.from_numpy(rows * T + steps if batch_first else steps * N + rows), device)


class _Unpack(torch.autograd.Function):
    """Packed rows into their padded places (zeros elsewhere); the gradient gathers them back."""
    @staticmethod
    def forward(ctx, data, index, rows: int):
        ctx.save_for_backward(index)
        return data.new_zeros((rows, *data.shape[1:])).index_copy_(0, index, data)

    @staticmethod
    def backward(ctx, grad):
        index, = ctx.saved_tensors
        return grad.index_select(0, index), None, None


class _Pack(torch.autograd.Function):
    """The padded rows that a PackedSequence holds; the gradient puts them back (zeros elsewhere).
    Each place is taken once, so both ways are exact, deterministic copies."""
    @staticmethod
    def forward(ctx, padded, index):
        ctx.save_for_backward(index)
        ctx.rows = padded.shape[0]
        return padded.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        index, = ctx.saved_tensors
        return grad.new_zeros((ctx.rows, *grad.shape[1:])).index_copy_(0, index, grad), None


def _rows_of(states, order, n: int):
    """States (a tensor, or a tuple of them) with their batch rows in ``order`` (None: as they
    are), as torch.nn permutes a packed input's states; what does not have ``n`` rows is left for
    the shape checks after."""
    if order is None or states is None:
        return states
    if isinstance(states, (tuple, list)):
        return type(states)(_rows_of(s, order, n) for s in states)
    if isinstance(states, torch.Tensor) and states.dim() == 3 and states.shape[1] == n:
        return states.index_select(1, order.to(states.device))
    return states


def _unwrapped(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``t``, or under ``torch.func.grad`` the plain tensor its wrapper holds: the kernels read
    memory (DLPack), which a wrapper has none of. Raises where that would lose a derivative or a
    batch: ``t`` tracked by an outer grad level too (``grad`` of ``grad``: a second derivative,
    which cuDNN's RNNs refuse as well; unwrapped, the outer level would take the gradients for
    constants and give zeros), or batched (``vmap``, ``jacrev``, ``jacfwd``, ``hessian``: torch.nn's
    RNNs have no batching rule either)."""
    functorch = torch._C._functorch
    outer = False
    while t is not None and functorch.is_functorch_wrapped_tensor(t):
        if functorch.is_batchedtensor(t):
            raise RuntimeError("tvmrnn: vmap, jacrev, jacfwd and hessian over a tvmrnn.torch module are not supported "
                               "(nor over torch.nn's RNNs: aten::lstm has no batching rule); torch.func.grad is")
        if outer and functorch.is_gradtrackingtensor(t) and t.requires_grad:
            raise RuntimeError("tvmrnn: a second derivative through a tvmrnn.torch module (torch.func.grad of "
                               "torch.func.grad) is not supported, as through cuDNN's RNNs")
        outer = True
        t = functorch.get_unwrapped(t)
    return t


def _requires_grad(*tensors) -> bool:
    """Whether any of ``tensors`` (None for an absent state) requires a gradient: a pass then runs
    the training forward (in grad mode)."""
    return any(t is not None and t.requires_grad for t in tensors)


class _Fused(torch.autograd.Function):
    """A fused stack's (or layer's) forward in autograd: the training forward where ``train``
    (the caller's grad mode, and an input or parameter that requires a gradient), else the
    inference forward, on weights packed for it alone. Outputs ``(y, hy, cy or None, saved)``:
    ``saved`` (the packed weights and the workspace the backward reads; None in inference) is
    for :meth:`setup_context` alone. Forward and context apart (``setup_context``), so that
    ``torch.func.grad`` (one level: :func:`_unwrapped`) takes the drop-ins."""
    @staticmethod
    def forward(rnn, names, lengths, train, x, h0, c0, *params):
        w = rnn.pack_weights(dict(zip(names, params)), forward_only=not train)  # inference: no backward copies
        if train:
            # (the drop-ins' inputs are zero past each row's length: no copy that zeroes them)
            y, hy, cy, ws = rnn._forward(w, x, h0, c0, train=True, lengths=lengths, padding_zeroed=True)
            return y, hy, cy, (w, ws)
        y, hy, cy = rnn.forward(w, x, h0, c0, lengths=lengths)
        return y, hy, cy, None

    @staticmethod
    def setup_context(ctx, inputs, output):
        rnn, names, _, train, x, h0, c0, *params = inputs
        if train:
            ctx.rnn, (ctx.w, ctx.ws), ctx.names = rnn, output[3], names
            # saved for autograd's checks alone (the workspace holds what the backward reads): an
            # input or parameter changed in place before the backward, or a second backward without
            # retain_graph, raises as torch.nn's does, instead of a gradient of other values
            ctx.save_for_backward(x, h0, c0, *params)

    @staticmethod
    @torch.autograd.function.once_differentiable  # (as cuDNN's RNNs: no double backward; a gradient
    # taken with create_graph=True raises when differentiated again, instead of silently not
    # requiring grad)
    def backward(ctx, dy, dhy, dcy, _saved):
        saved = ctx.saved_tensors  # (raises where a saved tensor changed in place, or was freed by a backward)
        # under torch.func.grad the gradients come wrapped, and tensors made inside would be too:
        # plain ones in, and allocated, for the kernels (_unwrapped refuses a second grad level, whose
        # inputs or gradients are tracked by an outer one, and vmap's batches)
        for t in saved:
            _unwrapped(t)
        dy, dhy, dcy = (_unwrapped(t) for t in (dy, dhy, dcy))
        with torch._C._DisableFuncTorch():
            grads = ctx.rnn.backward(ctx.w, ctx.ws, dy.contiguous(), dhy.contiguous(),
                                     dcy.contiguous() if dcy is not None else None)
        return (None, None, None, None, grads["x"], grads["h0"], grads.get("c0")) + tuple(grads[n] for n in ctx.names)


# ---- torch.compile: the passes as torch.library custom ops ---------------------------------
# Under torch.compile the drop-ins call these ops instead of :class:`_Fused`, so that Dynamo puts
# one node per pass in the graph (no graph break, no fallback per step). Each op names its module by
# a handle (an int: ops take no Python objects) and picks, at run time, the build for the batch it
# gets (building it then if needed, as in eager mode), so a compiled graph serves every batch size.
# The fake (meta) implementations give the outputs' shapes from the module's sizes alone; the
# training forward's workspace and packed weights are each one flat buffer whose size depends on
# the build (its padded batch), so their fake sizes are data-dependent. Eager mode keeps
# :class:`_Fused`, which recycles CPU workspaces (the ops' buffers belong to autograd).
_MODULES: "weakref.WeakValueDictionary[int, _Mixin]" = weakref.WeakValueDictionary()
_HANDLES = itertools.count(1)


def _module(handle: int) -> "_Mixin":
    module = _MODULES.get(handle)
    if module is None:
        raise RuntimeError(f"tvmrnn: the module of handle {handle} no longer exists (a compiled, traced or "
                           f"exported graph outlived the tvmrnn.torch module it was made from: such graphs run in "
                           f"the process that made them; elsewhere, load the module's RNN from a package: RNN.export, package=)")
    return module


def _op_rnn(handle: int, x: torch.Tensor, layer: int, ragged: bool) -> _FusedRNN:
    module = _module(handle)
    return module._rnn_for(x.shape[0 if module.batch_first else 1], x.device, layer=None if layer < 0 else layer,
                           ragged=ragged, bf16=False)  # (compiled graphs run fp32 builds)


def _workspace_views(rnn: _FusedRNN, T: int, flat: torch.Tensor) -> dict:
    views, offset = {}, 0
    for name, shape in rnn.config.workspace_shapes(T).items():
        size = math.prod(shape)
        views[name] = flat[offset:offset + size].view(shape)
        offset += size
    return views


def _no_c(c: Optional[torch.Tensor], hy: torch.Tensor) -> torch.Tensor:
    return c if c is not None else hy.new_empty(0)  # ops return tensors: an empty one for "no cell state"


@torch.library.custom_op("tvmrnn::forward", mutates_args=())
def _forward_op(handle: int, layer: int, x: torch.Tensor, h0: torch.Tensor, c0: Optional[torch.Tensor],
                lengths: Optional[torch.Tensor], ragged: bool,
                params: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rnn = _op_rnn(handle, x, layer, ragged)
    w = rnn.pack_weights(dict(zip(rnn.config.layout.names, params)), forward_only=True)
    y, hy, cy = rnn.forward(w, x, h0, c0, lengths=lengths)
    return y, hy, _no_c(cy, hy)


@torch.library.custom_op("tvmrnn::forward_train", mutates_args=())
def _forward_train_op(handle: int, layer: int, x: torch.Tensor, h0: torch.Tensor, c0: Optional[torch.Tensor],
                      lengths: Optional[torch.Tensor], ragged: bool, params: list[torch.Tensor]
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, hy, cy, packed weights, workspace)``: the last two for the backward."""
    rnn = _op_rnn(handle, x, layer, ragged)
    w = rnn.pack_weights(dict(zip(rnn.config.layout.names, params)), zeroed=True)  # an output: no stray bits
    T = x.shape[1 if rnn.config.batch_first else 0]
    flat = x.new_empty(sum(math.prod(s) for s in rnn.config.workspace_shapes(T).values()), dtype=torch.float32)
    y, hy, cy, _ = rnn._forward(w, x, h0, c0, train=True, lengths=lengths, given=_workspace_views(rnn, T, flat),
                                padding_zeroed=True)
    return y, hy, _no_c(cy, hy), w.flat, flat


@torch.library.custom_op("tvmrnn::backward", mutates_args=())
def _backward_op(handle: int, layer: int, x: torch.Tensor, lengths: Optional[torch.Tensor], ragged: bool,
                 packed: torch.Tensor, workspace: torch.Tensor, dy: torch.Tensor, dhy: torch.Tensor,
                 dcy: Optional[torch.Tensor]) -> list[torch.Tensor]:
    """``[dx, dh0, dc0 (cells with a cell state), then each parameter's gradient in the build's order]``."""
    rnn = _op_rnn(handle, x, layer, ragged)
    c = rnn.config
    frame = Frame.of("x", x)
    T, n = x.shape[1 if c.batch_first else 0], x.shape[rnn._batch_axis]
    ws = Workspace(rnn, frame, T, x if n == c.rows else frame.padded(x, rnn._batch_axis, c.rows, copies=True),
                   _workspace_views(rnn, T, workspace), batch=n)
    ws.mask = rnn._mask(frame, T, n, lengths)[0]
    grads = rnn.backward(PackedWeights(rnn, packed), ws, dy.contiguous(), dhy.contiguous(),
                         dcy.contiguous() if dcy is not None else None)
    # the parameters' gradients are views of one buffer; an op's outputs may not alias each other
    return ([grads["x"], grads["h0"]] + ([grads["c0"]] if "c0" in grads else [])
            + [grads[k].clone() for k in c.layout.names])


def _fake_outputs(handle: int, layer: int, x: torch.Tensor):
    module = _module(handle)
    D = 2 if module.bidirectional else 1
    L = module.num_layers if layer < 0 else 1
    state = (L * D, x.shape[0 if module.batch_first else 1], module.hidden_size)
    h_state = state[:2] + (module.proj_size or module.hidden_size,)
    y = x.new_empty(x.shape[:2] + (D * h_state[2],))
    hy = x.new_empty(h_state)
    return y, hy, (x.new_empty(state) if module._has_cell_state else x.new_empty(0))


@_forward_op.register_fake
def _(handle, layer, x, h0, c0, lengths, ragged, params):
    return _fake_outputs(handle, layer, x)


@_forward_train_op.register_fake
def _(handle, layer, x, h0, c0, lengths, ragged, params):
    ctx = torch.library.get_ctx()  # the build's padded batch decides these sizes
    return _fake_outputs(handle, layer, x) + (x.new_empty(ctx.new_dynamic_size()), x.new_empty(ctx.new_dynamic_size()))


@_backward_op.register_fake
def _(handle, layer, x, lengths, ragged, packed, workspace, dy, dhy, dcy):
    module = _module(handle)
    grads = [torch.empty_like(x), torch.empty_like(dhy)] + ([torch.empty_like(dcy)] if module._has_cell_state else [])
    return grads + [x.new_empty(s.torch_shape) for s in module._op_layout.slots if layer < 0 or s.layer == layer]


def _setup_context(ctx, inputs, output):
    handle, layer, x, h0, c0, lengths, ragged, params = inputs
    ctx.handle, ctx.layer, ctx.ragged, ctx.has_c = handle, layer, ragged, c0 is not None
    ctx.save_for_backward(x, lengths, output[3], output[4])


def _backward(ctx, dy, dhy, dcy, _packed, _workspace):
    x, lengths, packed, workspace = ctx.saved_tensors
    grads = torch.ops.tvmrnn.backward(ctx.handle, ctx.layer, x, lengths, ctx.ragged, packed, workspace, dy, dhy,
                                      dcy if ctx.has_c else None)
    k = 3 if ctx.has_c else 2
    return (None, None, grads[0], grads[1], grads[2] if ctx.has_c else None, None, None, list(grads[k:]))


_forward_train_op.register_autograd(_backward, setup_context=_setup_context)


@functools.lru_cache(maxsize=None)
def _cpu_bf16_pays(target=None) -> bool:
    """Whether CPU builds for ``target`` (a module's ``target=``; None: this machine) should take
    bf16 projections where a build can (``BuildOptions.bf16_projections``; what else each build
    needs, :func:`tvmrnn.program.passes.bf16_projections_refused`, :meth:`_Mixin._rnn_for` asks):
    AVX512-BF16 where it is faster than the fp32 build (``DeviceModel.bf16_dot_pays``: AMD's Zen 4
    and later, CPUs with AMX); for this machine, also whether its CPU reports the instruction (a
    VM may hide it from a CPU LLVM knows to have it); for a target with AMX, whether the OS lets
    this process use its tiles (else fp32, rather than a build that cannot run)."""
    from .device import _cpu_flags, device_model, host_target, resolve
    from .schedules import bf16
    if target is None:
        if "avx512_bf16" not in _cpu_flags():
            return False
        target = host_target()
    else:
        target = resolve(json.loads(target) if isinstance(target, str) and target.startswith("{") else target)
        if target.kind.name != "llvm":
            return False
    if bf16.supports_amx(target) and not bf16.request_amx():  # AMX code the OS would not let run: fp32
        return False
    return bf16.supports(target) and device_model(target).bf16_dot_pays


@functools.lru_cache(maxsize=1024)
def _bf16_refused(cell, target, input_size, hidden_size, num_layers, bidirectional, batch_size,
                  batch_first) -> str | None:
    """Why a CPU build of these sizes for ``target`` (a module's, as :func:`_hashable` keys it;
    None: this machine) cannot take ``BuildOptions.bf16_projections``, or None: the rule ``build``
    itself applies (:func:`tvmrnn.program.passes.bf16_projections_refused`)."""
    from .device import host_target, resolve
    from .program.passes import Config, bf16_projections_refused
    config = Config(get_cell(cell), input_size, hidden_size, num_layers, bidirectional, batch_size, batch_first,
                    BuildOptions(bf16_projections=True))
    target = host_target() if target is None else resolve(json.loads(target) if target.startswith("{") else target)
    return bf16_projections_refused(target, config)


# Whether the drop-in forward running in this thread asks for bf16 builds (set by
# _Mixin._forward_fp32 for its duration: per thread, as several threads may call one module)
_PRECISION = threading.local()


def _hashable(target):
    """A module's ``target=`` as a cache key (a dict as its JSON)."""
    return json.dumps(target, sort_keys=True) if isinstance(target, dict) else target


class _Mixin:
    """What the drop-ins share: checks, the builds they run on and ``forward``."""

    _cell: str | Cell

    def _setup(self, package, target, rebuild=True):
        if package is not None and not isinstance(package, _FusedRNN):
            raise TypeError(f"package: expected a tvmrnn RNN (tvmrnn.build or tvmrnn.load), got {type(package).__name__}")
        if package is not None and package.config.proj_size != self.proj_size:
            raise ValueError(f"package: built with proj_size={package.config.proj_size}, this module has "
                             f"proj_size={self.proj_size}")
        if not isinstance(rebuild, bool):
            raise TypeError(f"rebuild: expected bool, got {type(rebuild).__name__}")
        self._package, self._target, self._rebuild = package, target, rebuild and package is None
        self._built = {}  # (input_size, num_layers, batch size, device, variable lengths, bf16, batch_first) -> RNN
        self._zero_biases = {}  # (name, device) -> zeros, for bias=False
        # what torch.compile's path needs without a build (the custom ops above): a handle for the
        # ops, the whole stack's parameter layout and a one-layer build's parameter names
        cell = get_cell(self._cell)
        self._has_cell_state = cell.has_cell_state
        D = 2 if self.bidirectional else 1
        self._op_layout = Layout.create(self.input_size, self.hidden_size, self.num_layers, D, cell.num_gates,
                                        cell.unit_params, self.proj_size)
        self._op_layer_names = Layout.create(D * (self.proj_size or self.hidden_size), self.hidden_size, 1, D,
                                             cell.num_gates, cell.unit_params, self.proj_size).names
        self._op_names = self._op_layout.names
        self._register()

    def flatten_parameters(self) -> None:
        """As ``torch.nn``'s (cuDNN's flat weights on CUDA); on other devices the parameters become
        consecutive views of one float32 buffer in the kernels' order, so that packing them at
        every call reads them in place instead of joining them into one buffer first
        (``runtime.rnn.consecutive_views``). Called at construction and after ``.to()`` and the
        like; a parameter replaced later (``p.data = ...``) just makes packing copy again."""
        base = getattr(super(), "flatten_parameters", None)
        if base is not None:
            base()
        names = getattr(self, "_op_names", None)
        params = [getattr(self, n, None) for n in names or ()]
        if not params or not all(isinstance(p, torch.nn.Parameter) for p in params):
            return  # (before _setup; bias=False: zeros stand in for the biases)
        first = params[0]
        if (first.device.type == "cuda" or any(p.dtype != torch.float32 or p.device != first.device for p in params)
                or any(p.is_meta or p.is_shared() for p in params)):
            return  # (shared memory: share_memory()'s storages are the point, Hogwild's)
        from .runtime.rnn import consecutive_views
        if consecutive_views(params) is not None:
            return
        with torch.no_grad():
            flat = torch.empty(sum(p.numel() for p in params), dtype=torch.float32, device=first.device)
            offset = 0
            for p in params:
                view = flat[offset:offset + p.numel()].view(p.shape)
                view.copy_(p)
                p.data = view
                offset += p.numel()

    # Copies and pickles. A build is compiled code (TVM's modules neither copy nor pickle) and holds
    # no parameters: a deep copy (EMA, SWA) shares its original's builds; a pickled module
    # (torch.save of a whole model) keeps none and builds again when it runs (from the build cache
    # where one is on), or reloads its package from the file it came from.
    def __deepcopy__(self, memo):
        for rnn in [*self._built.values(), self._package]:
            if rnn is not None:
                memo[id(rnn)] = rnn
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update({k: copy.deepcopy(v, memo) for k, v in self.__dict__.items() if k != "_handle"})
        new._register()
        new.flatten_parameters()  # (each parameter was copied on its own)
        return new

    def __getstate__(self):
        state = dict(super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__)
        package = state.pop("_package", None)
        if package is not None and package.package_path is None:
            raise TypeError("pickle: this module runs on an RNN built in this process (package=); export it "
                            "(rnn.export(path)) and pass tvmrnn.load(path), whose file a pickle can name")
        state["_package_path"] = (package.package_path, f"{package.device_kind}:{package.device_index}") \
            if package is not None else None
        state["_built"], state["_zero_biases"] = {}, {}
        state.pop("_handle", None)
        return state

    def __setstate__(self, state):
        state = dict(state)
        found = state.pop("_package_path", None)
        super().__setstate__(state)
        self._package = load(found[0], device=found[1]) if found else None
        self._register()
        self.flatten_parameters()

    def _register(self) -> None:
        """A handle of its own for the custom ops (:data:`_MODULES`)."""
        if not getattr(_Mixin._run_eager, "_tvmrnn_disabled", False):
            # wrapped here, when the first module is made, not at import: torch.compiler.disable
            # imports torch._dynamo, which sets TORCHINDUCTOR_CACHE_DIR in the environment
            eager = torch.compiler.disable(_Mixin._run_eager)
            eager._tvmrnn_disabled = True
            _Mixin._run_eager = eager
        self._handle = next(_HANDLES)
        _MODULES[self._handle] = self

    def _rnn_for(self, batch_size: int, device: torch.device, layer: int | None = None,
                 ragged: bool = False, input_size: int | None = None, bf16: bool | None = None) -> _FusedRNN:
        """The build to run ``batch_size`` rows on: the smallest one made so far that takes that many
        (a build runs any smaller batch, padded), else a new one for this batch (from the build cache
        when an earlier process made it). ``layer``: a one-layer build for that layer alone (dropout
        between layers runs the stack layer by layer). ``ragged``: a build for rows of different
        lengths (``PackedSequence`` input). ``input_size``: the layer's, where it is not the
        module's own. ``bf16``: a half-precision build (None: what
        :meth:`_forward_fp32` asked for in this thread, where torch.nn would compute in half): on
        a CPU bf16 projections, on a GPU TF32 all-steps GEMMs (``allow_tf32``) and large steps
        (``BuildOptions.tensor_core_steps``, as half builds run them); a preference: with
        ``rebuild=False`` an fp32 build that fits serves."""
        bf16 = bool(getattr(_PRECISION, "bf16", False)) if bf16 is None else bf16
        D = 2 if self.bidirectional else 1
        if input_size is None:
            input_size = self.input_size if not layer else D * (self.proj_size or self.hidden_size)
        num_layers = self.num_layers if layer is None else 1
        proj_size = self.proj_size  # (fused into the build: the LSTMP step and its projection)
        if self._package is not None:
            pc = self._package.config
            if layer is not None:
                raise ValueError("dropout: a module running on a package (package=) has no per-layer builds for "
                                 "dropout between layers; use dropout=0, or eval()")
            have = dict(input_size=pc.input_size, hidden_size=pc.hidden_size, num_layers=pc.num_layers,
                        bidirectional=pc.bidirectional, batch_first=pc.batch_first, proj_size=pc.proj_size)
            need = dict(input_size=input_size, hidden_size=self.hidden_size, num_layers=num_layers,
                        bidirectional=self.bidirectional, batch_first=self.batch_first, proj_size=self.proj_size)
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
        sizes = dict(input_size=input_size, hidden_size=self.hidden_size, num_layers=num_layers,
                     bidirectional=self.bidirectional, batch_size=batch_size, batch_first=self.batch_first)
        if bf16 and (proj_size or (device.type != "cuda" and _bf16_refused(self._cell, _hashable(self._target),
                                                                             **sizes))):
            # a build that cannot take bf16 projections (no 16-unit panels that divide the hidden
            # size) or, with projections, any half-precision GEMMs: the fp32 build, which fp32
            # calls share
            bf16 = False

        def fitting(precision):
            return [(n, rnn) for (i, l, n, d, r, h, b), rnn in self._built.items()
                    if (i, l, d, r, h, b) == (input_size, num_layers, str(device), ragged, precision, self.batch_first)
                    and n >= batch_size]
        fits = fitting(bf16) or (fitting(False) if bf16 and not self._rebuild else [])  # bf16 is a preference
        if fits:
            return min(fits, key=lambda f: f[0])[1]
        mine = (input_size, num_layers, ragged, self.batch_first)  # (batch_first: torch.nn reads it every call)
        if not self._rebuild and any((i, l, r, b) == mine for i, l, _, _, r, _, b in self._built):
            largest = max(n for i, l, n, _, r, _, b in self._built if (i, l, r, b) == mine)
            raise ValueError(f"input: a batch of {batch_size} rows; this module was built for at most {largest} "
                             f"and rebuild=False")
        if self._target is not None:
            target = self._target
        else:  # the input's GPU (DDP: each rank its own; the build cache holds one entry for all)
            target = f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}" \
                if device.type == "cuda" else None
        # where cuDNN computes in half: TF32 GEMMs, large steps too (not with projections, bf16
        # False above: their CUDA kernels have run in fp32 alone, notes/performance.md v72)
        half_gpu = bf16 and device.type == "cuda"
        rnn = build(self._cell, **sizes, proj_size=proj_size, target=target, allow_tf32=half_gpu,
                    options=BuildOptions(variable_lengths=ragged, bf16_projections=bf16 and device.type != "cuda",
                                         tensor_core_steps=True if half_gpu else None))
        self._built[(input_size, num_layers, batch_size, str(device), ragged, bf16, self.batch_first)] = rnn
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
        if torch.compiler.is_compiling():  # a constant of the graph
            return weight.new_zeros(weight.shape[0])
        key = (name, weight.device)
        if key not in self._zero_biases:
            self._zero_biases[key] = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
        return self._zero_biases[key]

    def forward(self, input, hx=None):
        data = input.data if isinstance(input, PackedSequence) else input
        if isinstance(data, torch.Tensor):
            param = next(self.parameters(), None)
            if data.dtype == torch.float64 or (param is not None and param.dtype == torch.float64):
                return self._torch_nn_forward(input, hx, "float64")
            if data.device.type == "meta":  # shapes alone (deferred initialisation, shape inference)
                return self._torch_nn_forward(input, hx, "the meta device")
            if data.dim() == 3 and data.shape[0 if self.batch_first else 1] == 0 and data.shape[
                    1 if self.batch_first else 0] > 0:
                return self._torch_nn_forward(input, hx, "an empty batch")
        if isinstance(data, torch.Tensor) and data.is_floating_point():
            self._check_state_dtypes(data, hx)
        if isinstance(input, PackedSequence):
            return self._forward_packed(input, hx)
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input: expected a torch.Tensor, got {type(input).__name__}")
        if input.dim() not in (2, 3):
            raise ValueError(f"input: expected a 2-d (unbatched) or 3-d tensor, got shape {tuple(input.shape)}")
        return self._forward_fp32(input, hx)

    @staticmethod
    def _check_state_dtypes(data, hx) -> None:
        """An initial state of another dtype than the input's is a TypeError, as torch.nn refuses
        it, except under autocast for the input's device (which casts both)."""
        if hx is None or torch.is_autocast_enabled(data.device.type):
            return
        for name, t in zip(("h0", "c0"), hx if isinstance(hx, (tuple, list)) else (hx,)):
            if isinstance(t, torch.Tensor) and t.dtype != data.dtype:
                raise TypeError(f"hx: {name} is {t.dtype} but the input is {data.dtype}; give the initial "
                                f"states the input's dtype")

    def _torch_nn_forward(self, input, hx, why: str):
        """What tvmrnn's fp32 kernels do not run, by torch.nn's own implementation of this module
        (float64 modules or inputs, empty batches, meta tensors, a projected LSTM's non-finite
        bidirectional h0 or recurrent weights; a module of a custom cell has none: for it outputs
        of the right shapes, without a value, where the batch is empty or on the meta device)."""
        base = next((c for c in type(self).__mro__ if c.__module__.startswith("torch.nn.")
                     and issubclass(c, torch.nn.RNNBase) and c is not torch.nn.RNNBase), None)
        if base is None:
            if why == "float64":
                raise TypeError(f"input: a {type(self).__name__} runs in float32 (float16 and bfloat16 "
                                "through it), not float64; call module.float()")
            return self._shapes_alone(input)
        return base.forward(self, input, hx)

    def _shapes_alone(self, input):
        """Zero outputs of the shapes ``input`` gives (a custom cell's module at an empty batch, as
        torch.nn's give, or on the meta device)."""
        if isinstance(input, PackedSequence):
            raise ValueError("input: a PackedSequence of an empty batch or on the meta device; "
                             "a custom cell's module runs padded tensors there")
        D = 2 if self.bidirectional else 1
        unbatched = input.dim() == 2
        x = input.unsqueeze(0 if self.batch_first else 1) if unbatched else input
        T, N = (x.shape[1], x.shape[0]) if self.batch_first else (x.shape[0], x.shape[1])
        y = x.new_zeros((N, T, D * self.hidden_size) if self.batch_first else (T, N, D * self.hidden_size))
        h = x.new_zeros((self.num_layers * D, N, self.hidden_size))
        if unbatched:
            y, h = y.squeeze(0 if self.batch_first else 1), h.squeeze(1)
        return (y, (h, h.clone())) if self._has_cell_state else (y, h)

    def _result_dtypes(self, input, packed: bool) -> tuple[torch.dtype, torch.dtype]:
        """The dtypes of torch.nn's outputs for ``input`` (of ``y`` and ``h``, then of ``c``): where
        autocast is on for the input's device, as PyTorch 2.13 casts RNNs there (on CUDA every
        cuDNN RNN in float16, whatever the autocast dtype: its autocast wrapper,
        ``aten/src/ATen/cudnn/AutocastRNN.cpp``, casts to half, so bf16 autocast returns float16;
        without cuDNN the autocast dtype; on CPUs the Elman RNNs and the padded LSTM, an LSTM
        with projections's ``y`` and ``h`` but not its ``c``, neither the GRU nor a packed LSTM);
        else the input's own. Custom cells follow the LSTM."""
        kind, own = input.device.type, input.dtype
        if not (input.is_floating_point() and torch.is_autocast_enabled(kind)):
            return own, own
        low = torch.get_autocast_dtype(kind)
        if kind == "cuda" and torch.backends.cudnn.is_available() and torch.backends.cudnn.enabled:
            return torch.float16, torch.float16
        if kind != "cpu":
            return low, low
        if isinstance(self, torch.nn.GRU):
            return own, own
        if isinstance(self, torch.nn.LSTM) and self.proj_size:
            return low, own
        if isinstance(self, torch.nn.LSTM) and packed:
            return own, own
        return low, low

    def _forward_fp32(self, input, hx, lengths=None, packed: bool = False):
        """:meth:`_forward` in fp32 arrays: a half input (or module) and torch.autocast's half
        precision run fp32 builds with half-precision GEMMs where they pay (CPU bf16 projections;
        CUDA TF32 all-steps GEMMs), else fp32 ones; the results come back in the dtype
        torch.nn's module would return (:meth:`_result_dtypes`), so the layers after it see what
        they would see after torch.nn's."""
        dtype, c_dtype = self._result_dtypes(input, packed)
        # where torch.nn computes in bf16 on a CPU: a bf16 input (module), or bf16 autocast (which
        # runs every RNN's GEMMs in bf16 there, also where it returns fp32: the GRU, packed input)
        kind = input.device.type
        in_bf16 = input.dtype == torch.bfloat16 or (input.is_floating_point() and torch.is_autocast_enabled(kind)
                                                    and torch.get_autocast_dtype(kind) == torch.bfloat16)
        # (whether this batch's build can take them, _rnn_for decides: an fp32 build where not)
        bf16 = (in_bf16 and kind == "cpu" and self._package is None and not torch.compiler.is_compiling()
                and _cpu_bf16_pays(_hashable(self._target)))
        # where cuDNN computes in half (a half input or module, CUDA autocast): the all-steps GEMMs
        # on TF32 tensor cores (allow_tf32: errors ~1e-3, within half's; 8-24% faster at DS2, v44),
        # and the steps of 128+ rows (tensor_core_steps: 1.3-1.8x faster inference, v50)
        half = (kind == "cuda" and self._package is None and not torch.compiler.is_compiling() and input.is_floating_point()
                and (input.dtype in (torch.float16, torch.bfloat16)
                     or (torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) in (torch.float16, torch.bfloat16))))
        previous = getattr(_PRECISION, "bf16", False)
        _PRECISION.bf16 = bf16 or half
        try:
            with torch.autocast(input.device.type, enabled=False):
                y, states = self._forward(_cast(input, torch.float32) if input.dtype in (torch.float16, torch.bfloat16)
                                          else input, hx, lengths=lengths)
        finally:
            _PRECISION.bf16 = previous
        if isinstance(states, tuple):
            return _cast(y, dtype), (_cast(states[0], dtype), _cast(states[1], c_dtype))
        return _cast(y, dtype), _cast(states, dtype)

    def _forward_packed(self, packed, hx):
        """A ``PackedSequence`` in, one out, as torch.nn. The rows run in the packed order (longest
        first), padded to the longest with their lengths (a variable-lengths build); the states
        come in and go out in the caller's order (``sorted_indices``, ``unsorted_indices``, on the
        GPU). The lengths and the packed rows' places follow from ``batch_sizes``, which
        PackedSequence keeps on the host: one gather in, one out, and no wait for the GPU
        (``pad_packed_sequence`` copies a step at a time, and reads the lengths back)."""
        sizes = _checked_batch_sizes(packed)
        T, N = len(sizes), int(sizes[0])
        lengths = torch.from_numpy((sizes[None, :] > np.arange(N)[:, None]).sum(axis=1))  # sorted rows'
        data = packed.data
        index = _packed_places(sizes, self.batch_first, data.device)
        padded = _Unpack.apply(data, index, T * N).view(*((N, T) if self.batch_first else (T, N)), *data.shape[1:])
        y, states = self._forward_fp32(padded, _rows_of(hx, packed.sorted_indices, N), lengths=lengths, packed=True)
        data = _Pack.apply(y.reshape(T * N, *y.shape[2:]), index)
        return (PackedSequence(data, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices),
                _rows_of(states, packed.unsorted_indices, N))

    def _run(self, layer: int | None, lengths, x, h0, c0):
        """The fused stack (``layer`` None) or one layer of it on ``x``: ``(y, hy[, cy])``. Eager:
        through :class:`_Fused`; under torch.compile, through the custom ops (one graph node a pass)."""
        ragged = lengths is not None
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            names = self._op_names if layer is None else self._op_layer_names
            params = self._parameters_of(names, layer)
            index = -1 if layer is None else layer
            # a trace is one graph for every grad mode (torch.jit.trace's check runs it again under
            # no_grad, and a model traced under no_grad may train): the training forward wherever
            # anything requires a gradient
            if (torch.is_grad_enabled() or torch.jit.is_tracing()) and _requires_grad(x, h0, c0, *params):
                out = torch.ops.tvmrnn.forward_train(self._handle, index, x, h0, c0, lengths, ragged, params)[:3]
            else:
                out = torch.ops.tvmrnn.forward(self._handle, index, x, h0, c0, lengths, ragged, params)
            return out if self._has_cell_state else out[:2]
        return self._run_eager(layer, lengths, x, h0, c0)

    def _run_eager(self, layer: int | None, lengths, x, h0, c0):
        # never traced (wrapped in torch.compiler.disable by _register): where Dynamo does not trace
        # the module (torch.nn's RNN modules are left out of graphs unless
        # torch._dynamo.config.allow_rnn), it would otherwise trace the frames below
        rnn = self._rnn_for(x.shape[0 if self.batch_first else 1], x.device, layer=layer, ragged=lengths is not None)
        names = rnn.config.layout.names
        params = self._parameters_of(names, layer)
        train = torch.is_grad_enabled() and _requires_grad(x, h0, c0, *params)
        y, hy, cy, _ = _Fused.apply(rnn, names, lengths, train, x, h0, c0, *params)
        return (y, hy) if cy is None else (y, hy, cy)

    def _dropout(self, y, lengths):
        """Dropout of a layer's output ``y`` before the next layer, with torch.nn's masks: over the
        whole padded output, or (``lengths``: a PackedSequence's sorted rows, padded) over its
        packed rows, time-major in the packed order these rows run in, as torch.nn draws them for
        a PackedSequence (the same seed, the same masks, and the RNG left where torch.nn leaves it)."""
        if lengths is None:  # (time-major, as torch.nn draws them, also where the module is batch_first)
            if not self.batch_first:
                return torch.nn.functional.dropout(y, self.dropout, training=True)
            dropped = torch.nn.functional.dropout(y.transpose(0, 1).contiguous(), self.dropout, training=True)
            return dropped.transpose(0, 1).contiguous()
        T, N = (y.shape[1], y.shape[0]) if self.batch_first else (y.shape[0], y.shape[1])
        sizes = (np.asarray(lengths)[None, :] > np.arange(T)[:, None]).sum(axis=1)  # its batch_sizes
        index = _packed_places(sizes, self.batch_first, y.device)
        data = torch.nn.functional.dropout(_Pack.apply(y.reshape(T * N, -1), index), self.dropout, training=True)
        return _Unpack.apply(data, index, T * N).view(y.shape)

    def _forward(self, input, hx, lengths=None):
        unbatched = input.dim() == 2
        if unbatched:
            input = input.unsqueeze(1 if not self.batch_first else 0)
        has_c = self._has_cell_state
        if has_c and hx is not None and not (isinstance(hx, (tuple, list)) and len(hx) == 2
                                             and all(isinstance(t, torch.Tensor) for t in hx)):
            raise TypeError(f"hx: expected a tuple (h0, c0) of tensors for a cell with a cell state, "
                            f"got {type(hx).__name__}")
        if not has_c and hx is not None and not isinstance(hx, torch.Tensor):
            raise TypeError(f"hx: expected a tensor h0 (this cell has no cell state), got {type(hx).__name__}")
        h0, c0 = (hx if hx is not None else (None, None)) if has_c else (hx, None)
        if unbatched:
            for name, t in (("h0", h0), ("c0", c0)):
                if t is not None and t.dim() != 2:
                    raise ValueError(f"hx: for an unbatched 2-d input, {name} must be 2-d too (layers x directions, "
                                     f"features), got shape {tuple(t.shape)}")
            h0 = h0.unsqueeze(1) if h0 is not None else None
            c0 = c0.unsqueeze(1) if c0 is not None else None
        batch = input.shape[0 if self.batch_first else 1]
        D = 2 if self.bidirectional else 1
        state = (self.num_layers * D, batch, self.hidden_size)
        h_state = (self.num_layers * D, batch, self.proj_size or self.hidden_size)
        h0 = h0.float().contiguous() if h0 is not None else input.new_zeros(h_state)
        if has_c:
            c0 = c0.float().contiguous() if c0 is not None else input.new_zeros(state)
        if self.proj_size:
            for name, t, shape in (("h0", h0, h_state), ("c0", c0, state)):
                if tuple(t.shape) != shape:
                    raise ValueError(f"{name}: expected shape {shape} (layers x directions, batch, "
                                     f"{'proj_size' if name == 'h0' else 'hidden_size'}), got {tuple(t.shape)}")
        dropout = self.dropout and self.training
        if dropout and self.num_layers > 1:
            # layer by layer: dropout between layers as torch.nn does in training (one build for the
            # first layer, one shared by the others; eval runs the fused stack)
            y, hys, cys = input.contiguous(), [], []
            for k in range(self.num_layers):
                if k and dropout:
                    y = self._dropout(y, lengths)
                states = slice(k * D, (k + 1) * D)
                out = self._run(k, lengths, y, h0[states].contiguous(), c0[states].contiguous() if has_c else None)
                y = out[0]
                hys.append(out[1])
                if has_c:
                    cys.append(out[2])
            out = (y, torch.cat(hys)) + ((torch.cat(cys),) if has_c else ())
        else:
            out = self._run(None, lengths, input.contiguous(), h0, c0)
        y, hy = out[0], out[1]
        if unbatched:
            y = y.squeeze(1 if not self.batch_first else 0)
            hy = hy.squeeze(1)
            out = (y, hy) + ((out[2].squeeze(1),) if has_c else ())
        return (y, (hy, out[2])) if has_c else (y, hy)


class LSTM(_Mixin, torch.nn.LSTM):
    """``torch.nn.LSTM`` with tvmrnn's fused kernels. ``bias=False`` and ``dropout`` work as in
    torch.nn (dropout between layers runs the stack layer by layer in training; eval runs it
    fused); ``PackedSequence`` inputs too (a variable-lengths build of their own); ``proj_size``
    too (a fused LSTMP build, ``tvmrnn.build``'s ``proj_size``). Extra keywords:

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
        self.flatten_parameters()


class GRU(_Mixin, torch.nn.GRU):
    """``torch.nn.GRU`` with tvmrnn's fused kernels (see :class:`LSTM` for the extra keywords)."""

    _cell = "gru"

    def __init__(self, *args, package=None, target=None, rebuild=True, **kwargs):
        super().__init__(*args, **kwargs)
        self._setup(package, target, rebuild)
        self.flatten_parameters()


class RNN(_Mixin, torch.nn.RNN):
    """``torch.nn.RNN`` (``nonlinearity="tanh"`` or ``"relu"``) with tvmrnn's fused kernels."""

    def __init__(self, *args, package=None, target=None, rebuild=True, **kwargs):
        super().__init__(*args, **kwargs)
        self._cell = "rnn_" + self.nonlinearity
        self._setup(package, target, rebuild)
        self.flatten_parameters()


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
        self.flatten_parameters()

    def _apply(self, fn, recurse=True):
        ret = super()._apply(fn, recurse)
        self.flatten_parameters()  # (as torch.nn.RNNBase's: .to(), .cpu(), .float() give new storages)
        return ret

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
