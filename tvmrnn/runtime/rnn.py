"""The object ``tvmrnn.build`` returns: pack weights, run forward, training forward, backward.

An :class:`RNN` needs only a compiled module, its :class:`~tvmrnn.program.passes.Config` and, for each
pass, the names and shapes (affine in T) of its arguments. ``build`` (:mod:`.build`) gets those by
compiling; ``tvmrnn.load`` reads them from an exported library without compiling anything.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
import threading
import warnings
import weakref

import numpy as np
import tvm

from . import package
from .arrays import Frame, cpu_cast, round_to, to_device, to_tvm
from ..device import missing_host_features
from ..program.passes import Config

_INT32_MAX = 2**31 - 1
PASSES = ("forward", "forward_train", "backward", "pack_weights", "pack_forward")


def consecutive_views(values):
    """The float32 torch tensor of ``values`` laid end to end, where they are contiguous float32
    views of one storage one right after another (a drop-in's flattened parameters:
    ``tvmrnn.torch``'s ``flatten_parameters``), else None: packing then reads them in place
    instead of joining them into one buffer first (a single-threaded copy of every weight at every
    call: 4.6 ms of a 12 ms ``pack_forward`` at LSTM I=1024 H=1220 on a 2-core Zen 5, v78)."""
    import torch
    first = values[0] if values else None
    if not isinstance(first, torch.Tensor):
        return None
    storage = first.untyped_storage().data_ptr()
    address = first.data_ptr()
    for v in values:
        if (not isinstance(v, torch.Tensor) or v.dtype != torch.float32 or not v.is_contiguous()
                or v.device != first.device or v.data_ptr() != address
                or v.untyped_storage().data_ptr() != storage):
            return None
        address += 4 * v.numel()
    base = first.detach()
    total = (address - first.data_ptr()) // 4
    if base.untyped_storage().nbytes() < 4 * (base.storage_offset() + total):
        return None
    return base.as_strided((total,), (1,))

class PackedWeights:
    """All parameters of one configuration in the kernels' layout, on the target's device."""

    def __init__(self, owner: "RNN", flat, forward_only: bool = False):
        self.owner = owner
        self._arrays = {"w": flat}  # (held in a dict alone, so that recycling can tell it is unshared)
        self.forward_only = forward_only  # packed for the forwards alone (the backward refuses them)

    @property
    def flat(self):
        return self._arrays["w"]

    @property
    def nbytes(self) -> int:
        return self.owner.config.layout.packed_total * 4


class Workspace:
    """What the training forward keeps for the backward (cuDNN's "reserve space").

    Holds references to the input ``x`` and to the states, saved gate values and inner layer
    outputs of every step; :meth:`RNN.backward` reads them instead of recomputing.
    """

    def __init__(self, owner: "RNN", frame: Frame, T: int, x, arrays: dict, batch: int | None = None):
        self.owner, self.frame, self.T, self.x, self.arrays = owner, frame, T, x, arrays
        self.batch = owner.config.rows if batch is None else batch  # the caller's rows (x: padded)
        self.mask = None  # variable-lengths builds: the step mask of the forward (the backward's too)

    @property
    def workspace_bytes(self) -> int:
        return sum(int(np.prod(a.shape)) * 4 for a in self.arrays.values())


class _WorkspacePool:
    """Training workspaces of CPU passes, recycled once nothing refers to them any more.

    A fresh workspace costs the OS's zeroing of every page at its first touch: on the dev machine
    a DS2 LSTM's training forward took 279 ms with a fresh 110 MB workspace and 190 ms with every
    buffer reused, in one run (on GPUs PyTorch's caching allocator already recycles memory). When a
    :class:`Workspace` is garbage-collected its arrays come here, unless something else still
    refers to one of them (a reference, a NumPy view or a torch view of it: such an array is
    never handed out again); the next training forward of the same shapes takes them. At most
    ``capacity`` sets are kept (a PyTorch training loop holds two workspaces at a time: the
    previous step's graph is freed only after the next forward).
    """

    def __init__(self, capacity: int = 2):
        self.capacity = capacity
        self._free: list = []  # [(key, arrays)], most recent last
        self._lock = threading.Lock()

    def take(self, key):
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                if self._free[i][0] == key:
                    return self._free.pop(i)[1]
        return None

    def give_back(self, key, arrays: dict) -> None:
        if not all(_unshared(arrays, name) for name in arrays):
            return
        with self._lock:
            self._free.append((key, arrays))
            del self._free[:-self.capacity]

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


# The largest GPU scratch array a call keeps for the next call on its thread and stream (RNN._scratch).
HELD_GPU_SCRATCH_BYTES = 1 << 20


def _unshared(arrays: dict, name: str) -> bool:
    """Whether ``arrays[name]`` is referred to by that dict alone (no other reference, no view)."""
    if sys.getrefcount(arrays[name]) != 2:  # the dict's reference and getrefcount's argument
        return False
    a = arrays[name]
    if isinstance(a, np.ndarray):
        # A NumPy view refers to the array that owns the memory. Ours are views themselves (of
        # the 64-byte-aligned buffer, arrays.aligned_empty), so a view of one refers to that
        # buffer, not to the array: the buffer must have no reference but the array's.
        return a.base is None or sys.getrefcount(a.base) == 2  # a.base's and getrefcount's argument
    try:  # a torch view shares the storage, not the tensor object
        import torch
        return torch._C._storage_Use_Count(a.untyped_storage()._cdata) == 2  # a's and this call's
    except (AttributeError, ImportError):  # no way to tell here: never recycle
        return False


def _allow_amx(config: Config, target) -> None:
    """A bf16 build for a CPU with AMX runs tile instructions, which Linux lets a process use
    only after it asks (:func:`tvmrnn.schedules.bf16.request_amx`): ask, or say why it cannot run."""
    from ..schedules import bf16
    if target.kind.name != "llvm" or not config.options.bf16_projections or not bf16.supports_amx(target):
        return
    if not bf16.request_amx():
        raise RuntimeError("tvmrnn: this bf16 build uses AMX tiles (its target has amx-bf16), and the OS refused this "
                           "process their use (arch_prctl ARCH_REQ_XCOMP_PERM); build for a target without AMX")


def _linked(executable) -> tvm.runtime.Module:
    """``executable`` linked into a shared library and loaded, for builds at an LLVM level below 3
    (``TVMRNN_LLVM_OPT_LEVEL``): TVM's JIT generates machine code at LLVM's highest level whatever
    the target says (``LLVMModuleNode::InitMCJIT``/``InitORCJIT``), 1.2 s for a small LSTM's
    module, where the object file at -O0 took 0.35 s (the library's file may go: it stays mapped)."""
    try:
        with tempfile.TemporaryDirectory(prefix="tvmrnn-link-") as workdir:
            path = os.path.join(workdir, "passes.so")
            executable.export_library(path)
            return tvm.runtime.load_module(path)
    except Exception as err:  # noqa: BLE001 (no C++ compiler, a noexec temp folder: the JIT still runs it)
        warnings.warn(f"tvmrnn: linking the build failed ({type(err).__name__}: {str(err)[:200]}); "
                      f"running it through TVM's JIT instead", RuntimeWarning, stacklevel=3)
        return executable.jit()


class RNN:
    """A built (or loaded) RNN. Arrays are float32 (a half build's: its ``dtype``, the weight
    gradients float32), seq-first ``(T, N, ·)`` unless ``batch_first``.

    NumPy arrays in give NumPy arrays out; torch tensors (CPU or CUDA) give torch tensors on the
    same device, without copies.
    """

    def __init__(self, config: Config, target: tvm.target.Target, module, signatures: dict,
                 executable=None, device_index: int = 0):
        # (module None: the executable linked into a shared library at first use, _linked)
        self.config, self.target, self._module = config, target, module
        self._link_lock = threading.Lock()
        self._host_checked = False  # (whether this CPU can run it: checked before it first runs)
        self.signatures = signatures  # {pass: [[argument name, [[a, b] per dim: a*T + b]], ...]}
        self.executable = executable  # the compiled Executable, when built here
        self.programs = {}  # pass name -> Program, when built here (a loaded package has none)
        self.schedules: dict = {}  # kernel name -> "tuned", "default", "tf32" or "unmasked record"
        self.records: dict = {}  # kernel name -> the record it took, when built here (tune.records.scheduler)
        self.package_path: str | None = None  # the package this RNN was loaded from (or cached to)
        self.package_stamp: tuple | None = None  # that file's (device, inode, mtime, size) when loaded
        self.from_cache = False  # whether tvmrnn.build took it from the build cache
        self._scratch_arrays: dict = {}
        self._zero_states: dict = {}  # CPU: one read-only zero state per shape (_zeros)
        # whether the backward pass zeroes dw itself (packages of format 1 and 2 expect the caller to)
        self.backward_zeroes_dw = True
        # per call, the same few sequence lengths come again: their shapes, size checks and the
        # passes' functions are looked up once (recomputing them took ~0.6 ms a call on the H100
        # machine's host, with the GPU idle meanwhile)
        self._shapes: dict = {}
        self._checked_lengths: set = set()
        self._functions: dict = {}
        self._workspaces = _WorkspacePool()
        # CPU packed weights, recycled as workspaces are (a drop-in packs at every call: a fresh
        # buffer's pages were touched for the first time each time), and each thread's buffer for
        # the parameters joined before packing (notes/performance.md v45)
        self._packed_pool = _WorkspacePool()
        self._joined = threading.local()
        # GPU: the thread blocks of its persistent kernels, which need that many SMs (None: none)
        self.persistent_blocks: int | None = None
        self.allow_tf32 = False  # GEMMs over all steps on TF32 tensor cores (build's allow_tf32)
        self.device_kind = "cuda" if target.kind.name == "cuda" else "cpu"
        self.device_index = device_index if self.device_kind == "cuda" else 0

    @property
    def module(self):
        """The compiled passes (a ``tvm.runtime.Module``). Before a CPU build first runs, this CPU
        must have the instructions its target compiled in (else a clear error, not an illegal
        instruction), and a bf16 build that runs AMX tiles asks the OS for them
        (:func:`_allow_amx`): at the first run, not at the build, so that a build for another CPU
        (to export) works anywhere."""
        if not self._host_checked:
            missing = missing_host_features(self.target)
            if missing:
                mcpu = self.target.attrs.get("mcpu", "")
                raise RuntimeError(f"tvmrnn: this build's target ({mcpu or self.target}) uses {', '.join(missing)}, "
                                   f"which this CPU does not have; build for this CPU (target=None) to run here, "
                                   f"or run the build (or its export) on a CPU that has them")
            _allow_amx(self.config, self.target)
            self._host_checked = True
        if self._module is None:
            with self._link_lock:
                if self._module is None:
                    self._module = _linked(self.executable)
        return self._module

    def __repr__(self):
        c = self.config
        return (f"tvmrnn.RNN({c.cell.name!r}, input_size={c.input_size}, hidden_size={c.hidden_size}, "
                + (f"proj_size={c.proj_size}, " if c.proj_size else "")
                + f"num_layers={c.num_layers}, bidirectional={c.bidirectional}, batch_size={c.batch_size}, "
                f"batch_first={c.batch_first}, target={self.target.kind.name!r}"
                + (f", dtype={self.dtype!r}" if self.dtype != "float32" else "")
                + (", allow_tf32=True)" if self.allow_tf32 else ")"))

    @property
    def dtype(self) -> str:
        """The dtype of the passes' inputs, outputs and states (``BuildOptions.dtype``)."""
        return self.config.options.dtype

    # ---- a half build's boundary: its arrays in its dtype, the passes' in float32 -------------
    def _in(self, name: str, a):
        """``a`` (an input, state or output gradient of this build's dtype) as float32 for the
        passes; None stays None. A float32 build takes its arrays as they are."""
        if a is None or self.dtype == "float32":
            return a
        got = str(getattr(a, "dtype", type(a).__name__)).removeprefix("torch.")
        if got != self.dtype:
            hint = " (NumPy has no bfloat16: pass torch tensors)" if self.dtype == "bfloat16" and isinstance(a, np.ndarray) else ""
            raise TypeError(f"{name}: this RNN was built for dtype {self.dtype} (tvmrnn.build(dtype=...)); "
                            f"got {got}{hint}")
        if isinstance(a, np.ndarray):
            return a.astype(np.float32)
        return cpu_cast(a, "float32") if a.device.type == "cpu" else a.float()

    def _out(self, a):
        """A float32 result of the passes in this build's dtype."""
        if a is None or self.dtype == "float32":
            return a
        if isinstance(a, np.ndarray):
            return a.astype(np.float16)
        if a.device.type == "cpu":
            return cpu_cast(a, self.dtype)
        import torch
        return a.to(getattr(torch, self.dtype))

    def export(self, path) -> str:
        """Write one shared library with every pass and its metadata (see :mod:`tvmrnn.runtime.package`)."""
        return package.export(self, path)

    def shapes(self, program: str, T: int) -> dict:
        """The shape of every argument of a pass, for sequence length T (a fresh dict)."""
        return dict(self._shapes_of(program, T))

    def _shapes_of(self, program: str, T: int) -> dict:
        key = (program, T)
        held = self._shapes.get(key)
        if held is None:
            held = {name: tuple(a * T + b for a, b in dims) for name, dims in self.signatures[program]}
            if len(self._shapes) > 256:  # many lengths (a varying T): keep the table bounded
                self._shapes.clear()
            self._shapes[key] = held
        return held

    def _function(self, program: str):
        fn = self._functions.get(program)
        if fn is None:
            fn = self._functions[program] = self.module[program]
        return fn

    def _run(self, program: str, frame: Frame, T: int, arrays: dict, results=(), kept=()) -> None:
        """Call a pass with its named arrays. Arrays it needs beyond those are made here: fresh
        ones for the names in ``results`` (handed back to the caller; those also in ``kept`` are
        held across calls, e.g. recycled workspaces: huge pages on CPUs), scratch for the rest."""
        args = []
        for name, shape in self._shapes_of(program, T).items():
            if name not in arrays:
                arrays[name] = (frame.empty(shape, kept=name in kept) if name in results
                                else self._scratch(frame, program, name, shape))
            a = arrays[name]
            # torch tensors go as they are (TVM's FFI takes them through DLPack, faster than a
            # conversion here); NumPy arrays through to_tvm (a read-only one needs a copy)
            args.append(to_tvm(a) if isinstance(a, np.ndarray) else a)
        # A torch CUDA tensor among the arguments makes TVM's FFI launch the call's kernels on
        # PyTorch's current stream of its device, in PyTorch's order (the FFI reads the stream
        # through PyTorch's DLPack exchange API and sets it for the call, as
        # ``tvm_ffi.use_torch_stream`` does; that context cost 6 us a call on the H200 host, v55)
        self._function(program)(*args)

    def _scratch(self, frame: Frame, program: str, name: str, shape):
        """A temporary of a pass (e.g. the input projections of a chunk of steps, 4 MB for a DS2 LSTM),
        kept from call to call on the CPU: a fresh one costs the OS's zeroing of every page at
        first touch, which was a fifth of a DS2 LSTM inference on the dev machine (cuDNN asks
        for the same thing as its workspace). Per thread, so concurrent calls from several
        threads stay apart.

        On GPUs a small one (up to :data:`HELD_GPU_SCRATCH_BYTES`) is kept per thread and stream:
        the calls of one thread on one stream run in the stream's order, so each finds it free,
        and a ``torch.empty`` is 2-3 us of a short pass's host time (v56). Larger ones come from
        PyTorch's caching allocator at each call (their passes are long, and held they would be
        memory that the training step's other tensors cannot reuse), as does everything while a
        CUDA graph is captured (a graph keeps the addresses it captured)."""
        if frame.device_kind != "cpu":
            if frame.device_kind != "cuda" or 4 * math.prod(shape) > HELD_GPU_SCRATCH_BYTES:
                return frame.empty(shape)
            import torch
            if torch.cuda.is_current_stream_capturing():
                return frame.empty(shape)
            index = frame.device.index if frame.device.index is not None else torch.cuda.current_device()
            key = (threading.get_ident(), index, torch._C._cuda_getCurrentRawStream(index), program, name)
        else:
            key = (threading.get_ident(), frame.kind, program, name)
        held = self._scratch_arrays.get(key)
        if held is None or tuple(held.shape) != tuple(shape):
            held = self._scratch_arrays[key] = frame.empty(shape, kept=True)
        return held

    def free_scratch(self) -> None:
        """Drop the temporaries and recycled workspaces kept between calls (they come back at the
        next call)."""
        self._scratch_arrays.clear()
        self._zero_states.clear()
        self._workspaces.clear()
        self._packed_pool.clear()
        self._joined = threading.local()

    # ---- weights ----------------------------------------------------------------------------
    def pack_weights(self, params, zeroed: bool = False, forward_only: bool = False) -> PackedWeights:
        """PyTorch-named parameters (numpy arrays or tensors) -> the kernels' packed layout.

        Torch tensors already on this RNN's device are packed there, without a trip to the host.
        ``zeroed``: the layout's padding (never read) is zeros rather than whatever memory held
        (for callers that compare or hash the packed buffer, such as torch's op checks).
        ``forward_only``: for ``forward`` and ``forward_train`` alone, without the copies only the
        backward reads (about half the packing's work; :meth:`backward` refuses these weights).
        A package made before this option packs them whole.
        """
        if self.device_kind == "cuda" and not tvm.cuda(self.device_index).exist:
            raise ValueError(f"pack_weights: this RNN is built for CUDA (device {self.device_index}) and this machine "
                             "has no such GPU; a build made without a GPU serves export() alone")
        program = "pack_forward" if forward_only and "pack_forward" in self.signatures else "pack_weights"
        layout = self.config.layout
        layout.check(params)
        values = [params[name] for name in layout.names]
        frame = Frame.of("params", values[0])
        on_device = all(hasattr(v, "detach") for v in values) and self._accepts(frame)
        in_place = (consecutive_views(values) if on_device and frame.device_kind == "cpu" and self.dtype == "float32"
                    else None)  # (on GPUs torch.cat joins them: one copy kernel)
        if in_place is not None:  # one buffer already (a drop-in's flattened parameters): no copy
            flat = in_place
        elif on_device and frame.device_kind == "cpu":
            # joined by NumPy on this thread: torch.cat is a parallel op whose OpenMP threads then
            # spin on the cores the passes need (a drop-in's per-call packing took 11 ms of a
            # 4 ms LSTM forward, v44); half parameters widened on TVM's threads
            import torch
            parts = []
            for v in values:
                v = v.detach()
                if v.dtype in (torch.bfloat16, torch.float16):
                    v = cpu_cast(v.contiguous(), "float32")
                elif v.dtype != torch.float32:
                    v = v.float()
                parts.append(v.reshape(-1).numpy())
            joined = getattr(self._joined, "buffer", None)
            if joined is None or joined.shape[0] != layout.total:
                joined = self._joined.buffer = np.empty(layout.total, np.float32)
            flat = torch.from_numpy(round_to(self.dtype, np.concatenate(parts, out=joined)))
        elif on_device:
            import torch
            half = None if self.dtype == "float32" else getattr(torch, self.dtype)  # a half build's rounding
            flat = torch.cat([(v.detach().reshape(-1) if half is None else v.detach().reshape(-1).to(half))
                              .to(torch.float32) for v in values])
        else:
            frame = Frame("numpy", None)
            flat = round_to(self.dtype, np.concatenate(
                [np.asarray(v.detach().cpu().float() if hasattr(v, "detach") else v, np.float32).ravel()
                 for v in values]))
            if self.device_kind == "cuda":
                flat = tvm.runtime.tensor(flat, device=tvm.cuda(self.device_index))
                packed = tvm.runtime.empty((layout.packed_total,), "float32", device=tvm.cuda(self.device_index))
                self._function(program)(flat, packed)
                return PackedWeights(self, packed, forward_only=program == "pack_forward")
        recycle = not zeroed and frame.device_kind == "cpu"
        key = (frame.kind, str(frame.device))
        packed = (self._packed_pool.take(key) or {}).get("w") if recycle else None
        if packed is None:
            packed = frame.zeros((layout.packed_total,)) if zeroed else frame.empty((layout.packed_total,), kept=True)
        self._run(program, frame, 0, {"params": flat, "w": packed})
        w = PackedWeights(self, packed, forward_only=program == "pack_forward")
        if recycle:  # back to the pool when w is gone, unless its array is referred to elsewhere
            weakref.finalize(w, self._packed_pool.give_back, key, w._arrays).atexit = False
        return w

    def _check_weights(self, w):
        if not isinstance(w, PackedWeights):
            raise TypeError(f"w: expected the result of pack_weights, got {type(w).__name__}")
        if w.owner is self:
            return w.flat
        mine, theirs = self.config, w.owner.config  # the build options matter where they change the layout
        if (dataclasses.replace(theirs, options=mine.options) != mine
                or theirs.options.weight_panels != mine.options.weight_panels
                or theirs.options.bf16_projections != mine.options.bf16_projections
                or theirs.options.dtype != mine.options.dtype):
            raise ValueError("w: these weights were packed for a different configuration")
        return w.flat

    # ---- validation -------------------------------------------------------------------------
    def _accepts(self, frame: Frame) -> bool:
        index = frame.device.index if frame.kind == "torch" and frame.device.index is not None else 0
        return frame.device_kind == self.device_kind and index == self.device_index

    def _frame_and_length(self, name, x, features):
        """The frame, the sequence length and the batch (rows) of the input ``x``."""
        frame = Frame.of(name, x)
        if not self._accepts(frame):
            raise ValueError(f"{name}: this RNN was built for {self.target.kind.name} "
                             f"({self.device_kind}:{self.device_index}); got {frame.describe()}")
        c = self.config
        if len(x.shape) != 3:
            raise ValueError(f"{name}: expected a 3-d array {c.seq_shape('T', features)}, got shape {tuple(x.shape)}")
        T = int(x.shape[1] if c.batch_first else x.shape[0])
        n = int(x.shape[0] if c.batch_first else x.shape[1])
        if T < 1:
            raise ValueError(f"{name}: the sequence length T must be >= 1, got {T}")
        if not 1 <= n <= c.batch_size:
            raise ValueError(f"{name}: a batch of {n} rows; this RNN was built for batches of 1 to {c.batch_size} "
                             f"(tvmrnn.build's batch_size is the largest)")
        frame.check(name, x, self._seq_shape(T, features, n))
        if T not in self._checked_lengths:
            largest = max(int(np.prod(s)) for p in self.signatures for s in self._shapes_of(p, T).values())
            if largest > _INT32_MAX:
                raise ValueError(f"{name}: T={T} makes buffers of over 2**31 elements (32-bit indexing); "
                                 f"split the sequence")
            if len(self._checked_lengths) > 256:
                self._checked_lengths.clear()
            self._checked_lengths.add(T)
        return frame, T, n

    def _seq_shape(self, T, features, n):
        return (n, T, features) if self.config.batch_first else (T, n, features)

    @property
    def _batch_axis(self) -> int:
        return 0 if self.config.batch_first else 1

    def _zeros(self, frame, shape):
        """Zero states for an omitted ``h0``, ``c0``, ``dhy`` or ``dcy`` (the passes only read
        them): one array per shape and device is kept and handed to every call. On a CPU a fresh
        ``torch.zeros`` of 16,000 floats or more is a parallel PyTorch op, whose OpenMP threads
        then spin on the cores the passes' kernels need (notes/performance.md v25); on a GPU it
        is a launch a state, which a batch-1 pass of 100 us notices (not while a CUDA graph is
        captured: a tensor zeroed by a captured op is zero only when the graph runs)."""
        if frame.device_kind == "cuda":
            import torch
            if torch.cuda.is_current_stream_capturing():
                return frame.zeros(shape)
        key = (frame.kind, str(frame.device), tuple(shape))
        held = self._zero_states.get(key)
        if held is None:
            held = self._zero_states[key] = frame.zeros(shape)
        return held

    def _state(self, frame, name, value, needed=True, n=None):
        """A state argument checked for ``n`` rows and padded to the build's batch (zeros if None)."""
        c = self.config
        n = c.rows if n is None else n
        shape = (c.num_layers * c.num_directions, c.rows, c.state_size if name in ("h0", "dhy") else c.hidden_size)
        if value is None:
            return self._zeros(frame, shape) if needed else None
        if not needed:
            raise ValueError(f"{name}: a {c.cell.name} has no cell state; pass {name}=None")
        frame.check(name, value, (shape[0], n, shape[2]))
        return value if n == c.rows else frame.padded(value, 1, c.rows, copies=name in ("h0", "c0"))

    # ---- passes -----------------------------------------------------------------------------
    def _mask(self, frame, T: int, n: int, lengths):
        """The (T, N) step mask of a variable-lengths build from ``lengths`` (None: every row runs
        all T steps), and whether any row is shorter than T. Rows past ``n`` (padding) never run."""
        c = self.config
        if lengths is not None and not c.options.variable_lengths:
            raise ValueError("lengths: this RNN was built without variable lengths; build it with "
                             "options=tvmrnn.BuildOptions(variable_lengths=True)")
        if not c.options.variable_lengths:
            return None, False
        if lengths is None:
            values = np.full(n, T, np.int64)
        else:
            if hasattr(lengths, "device") and hasattr(lengths, "cpu"):  # a torch tensor
                if lengths.device.type != "cpu" and not (frame.kind == "torch" and lengths.device == frame.device):
                    raise ValueError(f"lengths: expected a CPU tensor or one on x's device ({frame.describe()}), "
                                     f"got a tensor on {lengths.device}")
                lengths = lengths.detach().cpu().numpy()
            values = np.asarray(lengths)
            if values.dtype.kind not in "iu" and not (values.dtype.kind == "f" and np.all(values == np.round(values))):
                raise TypeError(f"lengths: expected integers, got dtype {values.dtype}")
            if values.shape != (n,):
                raise ValueError(f"lengths: expected one length per batch row, shape ({n},); got shape {values.shape}")
            if values.size and (values.min() < 1 or values.max() > T):  # (before the cast, which would wrap 2^63)
                raise ValueError(f"lengths: each must be between 1 and T={T}; got {values.min()} to {values.max()}")
            values = values.astype(np.int64)
        mask = np.zeros((T, c.rows), np.float32)
        mask[:, :n] = np.arange(T)[:, None] < values[None, :]
        if frame.kind == "torch":
            import torch
            held = torch.from_numpy(mask)
            return (to_device(held, frame.device) if frame.device_kind != "cpu" else held), bool((values < T).any())
        return mask, bool((values < T).any())

    def _zero_finished(self, frame, y, mask):
        """Zero the outputs of the steps where a row no longer runs (its sequence ended)."""
        m = mask == 0
        m = m.T if self.config.batch_first else m
        if frame.kind == "numpy":
            y[m] = 0
        else:
            y.masked_fill_(m[:, :, None], 0)

    def _zeroed_padding(self, frame, x, mask, n: int):
        """A copy of ``x`` (its ``n`` rows) with zeros past each row's length."""
        x = x.copy() if frame.kind == "numpy" else x.clone()
        self._zero_finished(frame, x, mask[:, :n])
        return x

    def _forward(self, w, x, h0, c0, train, lengths=None, given=None, padding_zeroed=False):
        """``given`` (training): the workspace's arrays, given by the caller (views of one buffer
        of its own: the PyTorch custom ops, :mod:`tvmrnn.torch`), instead of fresh or recycled ones.
        ``padding_zeroed``: the caller's ``x`` is zero past each row's length already (the
        drop-ins' padded sequences), else a training forward of ragged rows zeroes it in a copy."""
        c = self.config
        wflat = self._check_weights(w)
        x, h0, c0 = self._in("x", x), self._in("h0", h0), self._in("c0", c0)
        frame, T, n = self._frame_and_length("x", x, c.input_size)
        mask, ragged = self._mask(frame, T, n, lengths)
        if train and ragged and not padding_zeroed:
            # the backward's weight gradients sum every step's inputs times its gate gradients,
            # zero past a row's length: a NaN or Inf there would make NaN of them (0 x NaN), where
            # torch.nn's packed run never reads the padding
            x = self._zeroed_padding(frame, x, mask, n)
        if n < c.rows:  # rows are independent: the build's batch, the padding's rows copies of the first
            x = frame.padded(x, self._batch_axis, c.rows, copies=True)
        arrays = {"x": x, "h0": self._state(frame, "h0", h0, n=n), "w": wflat}
        if mask is not None:
            arrays["mask"] = mask
        if c.cell.has_cell_state:
            arrays["c0"] = self._state(frame, "c0", c0, n=n)
        else:
            self._state(frame, "c0", c0, needed=False)
        workspace = c.workspace_shapes(T) if train else {}
        results = {"y", "hy", "cy", *workspace}
        key = (frame.kind, str(frame.device), T)
        recycle = train and frame.device_kind == "cpu" and given is None
        if given is not None:
            arrays.update(given)
        elif recycle:
            arrays.update(self._workspaces.take(key) or {})  # every element is written before it is read
        self._run("forward_train" if train else "forward", frame, T, arrays, results,
                  kept=workspace if recycle else ())
        outputs = (arrays["y"], arrays["hy"], arrays.get("cy"))
        if ragged:
            self._zero_finished(frame, outputs[0], mask)
        if n < c.rows:
            outputs = (frame.rows(outputs[0], self._batch_axis, n), frame.rows(outputs[1], 1, n),
                       None if outputs[2] is None else frame.rows(outputs[2], 1, n))
        outputs = tuple(self._out(o) for o in outputs)
        if not train:
            return outputs
        kept = {k: arrays[k] for k in workspace}
        ws = Workspace(self, frame, T, x, kept, batch=n)
        ws.mask = mask
        if recycle:
            weakref.finalize(ws, self._workspaces.give_back, key, kept).atexit = False
        return outputs + (ws,)

    def forward(self, w, x, h0=None, c0=None, lengths=None):
        """Inference forward. Returns ``(y, hy, cy)``; ``cy`` is None for cells without a cell state.

        ``x``: ``(T, N, input_size)`` (``(N, T, ·)`` if batch_first); ``h0``/``c0``:
        ``(num_layers * num_directions, N, hidden_size)`` (``h0``: ``proj_size`` wide where the LSTM
        has projections) or None for zeros. N is any batch from 1
        to the build's ``batch_size``: a smaller batch runs padded to it with copies of its first row (exact, since
        rows are independent; it costs what the full batch costs, plus the copies in and out).
        ``lengths`` (builds with ``BuildOptions(variable_lengths=True)``): each row's length, 1 to
        T (a list, NumPy array or CPU tensor), as ``torch.nn`` runs a packed sequence: outputs past
        a row's length are zero, ``hy``/``cy`` are its states at its own last step, and the reverse
        direction starts there.
        """
        return self._forward(w, x, h0, c0, train=False, lengths=lengths)

    def forward_train(self, w, x, h0=None, c0=None, lengths=None):
        """Training forward: ``(y, hy, cy, ws)``, ``ws`` being what :meth:`backward` needs (it
        keeps ``lengths``: the backward takes none). With ``lengths``, ``x`` past each row's length
        is never read: the workspace keeps a copy with zeros there, where some row ends early."""
        return self._forward(w, x, h0, c0, train=True, lengths=lengths)

    def backward(self, w, ws: Workspace, dy, dhy=None, dcy=None) -> dict:
        """Gradients from a training forward's workspace and the gradients of its outputs.

        Returns ``{"x", "h0", "c0" (cells with a cell state), and every parameter name}``,
        per-unit parameters included.
        """
        c = self.config
        wflat = self._check_weights(w)
        if w.forward_only:
            raise ValueError("w: packed for the forwards alone (pack_weights(..., forward_only=True)); the backward "
                             "needs pack_weights(params)")
        if not isinstance(ws, Workspace) or ws.owner is not self:
            raise TypeError("ws: expected the workspace returned by this RNN's forward_train")
        frame, T, n = ws.frame, ws.T, ws.batch
        dy, dhy, dcy = self._in("dy", dy), self._in("dhy", dhy), self._in("dcy", dcy)
        frame.check("dy", dy, self._seq_shape(T, c.num_directions * c.state_size, n))
        if n < c.rows:  # the padding's rows get zero gradients: they add nothing to dw (their states finite
            # where the first row's are: Frame.padded's copies)
            dy = frame.padded(dy, self._batch_axis, c.rows)
        arrays = {"dy": dy, "dhy": self._state(frame, "dhy", dhy, n=n), "w": wflat, "x": ws.x, **ws.arrays}
        if ws.mask is not None:
            arrays["mask"] = ws.mask
        if not self.backward_zeroes_dw:  # an older package's pass accumulates into a zeroed dw
            arrays["dw"] = frame.zeros((c.layout.total,))
        if c.cell.has_cell_state:
            arrays["dcy"] = self._state(frame, "dcy", dcy, n=n)
        else:
            self._state(frame, "dcy", dcy, needed=False)
        # dw: zeroed by the pass itself (its first kernel), not by a PyTorch op before it
        self._run("backward", frame, T, arrays, results={"dx", "dh0", "dc0", "dw"})
        # the input and state gradients in the build's dtype, the weights' in fp32 (master weights)
        grads = {"x": self._out(frame.rows(arrays["dx"], self._batch_axis, n)),
                 "h0": self._out(frame.rows(arrays["dh0"], 1, n))}
        if c.cell.has_cell_state:
            grads["c0"] = self._out(frame.rows(arrays["dc0"], 1, n))
        grads.update(c.layout.split(arrays["dw"]))
        return grads
