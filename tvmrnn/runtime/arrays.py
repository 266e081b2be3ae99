"""Arrays at the boundary: validation, allocation and DLPack hand-over, for NumPy and PyTorch.

Arrays come in as NumPy arrays (CPU) or DLPack-capable tensors (PyTorch, CPU or CUDA); outputs
are allocated in the same framework on the same device and handed to the kernels through
DLPack, so nothing is copied. Every check names the argument and what was expected.
"""
from __future__ import annotations

import mmap
import os
import sys

import numpy as np
import tvm
import tvm_ffi


# CPU kernels load 32- and 64-byte vectors; NumPy's large arrays start 16 bytes past a page
# (glibc's mmap chunk header), so every other AVX2 load and every AVX-512 load of them straddles
# two cache lines: a DS2 LSTM inference with its packed weights there ran 1.3-1.7x slower on the
# Zen 3 dev machine (notes/performance.md v18). PyTorch and TVM align to 64 bytes; so do we.
ALIGNMENT = 64


def _layout(shape, dtype) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(shape as a tuple of ints, dtype, bytes)`` of an array to allocate."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    dtype = np.dtype(dtype)
    return shape, dtype, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize


def aligned_empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised C-contiguous NumPy array whose data starts on a 64-byte boundary."""
    shape, dtype, nbytes = _layout(shape, dtype)
    buf = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -buf.ctypes.data % ALIGNMENT
    return buf[start:start + nbytes].view(dtype).reshape(shape)


# Transparent huge pages for the large arrays a CPU pass keeps: packed weights, the scratch (the
# input projections of all steps) and training workspaces. With 4 KB pages a register tile of the
# K-major weights touches a new page at every step of its reduction (12.8 KB rows for a DS2 LSTM),
# and each core's slice of a 10 MB weight matrix spans all of its 2,500 pages, more than a core's
# second-level TLB holds (notes/performance.md v23). Linux gives 2 MB pages to memory that asks
# for them (``madvise``) where THP is ``madvise`` (the GPU machine's Xeon and the dev machine) or
# ``always``. ``TVMRNN_HUGE_PAGES``: ``auto`` (default: where the kernel offers THP), ``0`` never,
# ``1`` always try.
HUGE_PAGE = 2 << 20
_THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"


def _thp_offered() -> bool:
    try:
        with open(_THP_SETTING) as f:
            setting = f.read()
    except OSError:
        return False
    return "[always]" in setting or "[madvise]" in setting


_OFFERED = None


def huge_pages() -> bool:
    """Whether large CPU arrays that tvmrnn keeps get transparent huge pages (``TVMRNN_HUGE_PAGES``)."""
    global _OFFERED
    mode = os.environ.get("TVMRNN_HUGE_PAGES", "auto")
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"TVMRNN_HUGE_PAGES: expected auto, 0 or 1, got {mode!r}")
    if mode == "0" or not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    if mode == "1":
        return True
    if _OFFERED is None:
        _OFFERED = _thp_offered()
    return _OFFERED


def wants_huge_pages(nbytes: int) -> bool:
    """Whether a CPU array of ``nbytes`` that tvmrnn keeps gets huge pages: 2 MB or more, where
    :func:`huge_pages` says so."""
    return nbytes >= HUGE_PAGE and huge_pages()


def huge_empty(shape, dtype=np.float32) -> np.ndarray:
    """Like :func:`aligned_empty`, in its own anonymous mapping, 2 MB-aligned and advised
    ``MADV_HUGEPAGE`` before its first touch, so that its pages are 2 MB ones where the OS has
    them (it falls back to 4 KB pages silently). The mapping lives as long as the array or a view of it."""
    shape, dtype, nbytes = _layout(shape, dtype)
    size = -(-max(nbytes, 1) // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to align the start
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf = np.frombuffer(mm, np.uint8)
    start = -buf.ctypes.data % HUGE_PAGE
    try:
        mm.madvise(mmap.MADV_HUGEPAGE, start, size - start)
    except OSError:  # a kernel without THP: 4 KB pages
        pass
    return buf[start:start + nbytes].view(dtype).reshape(shape)


_TORCH_TYPES: dict = {}  # type -> whether it is a torch tensor type (a call's inputs are checked often)


def _is_torch(a) -> bool:
    kind = type(a)
    found = _TORCH_TYPES.get(kind)
    if found is None:
        found = _TORCH_TYPES[kind] = kind.__module__.startswith("torch") and hasattr(kind, "is_contiguous")
    return found


class Frame:
    """The framework and device of the caller's arrays: outputs are made like them."""

    def __init__(self, kind: str, device):
        self.kind, self.device = kind, device  # kind: "numpy" or "torch"
        self.device_kind = "cpu" if kind == "numpy" else device.type

    @staticmethod
    def of(name: str, a) -> "Frame":
        if isinstance(a, np.ndarray):
            return Frame("numpy", None)
        if _is_torch(a):
            return Frame("torch", a.device)
        raise TypeError(f"{name}: expected a numpy.ndarray or a torch.Tensor, got {type(a).__name__}")

    def describe(self) -> str:
        return "a NumPy array (CPU)" if self.kind == "numpy" else f"a torch tensor on {self.device}"

    def empty(self, shape, kept: bool = False):
        """An uninitialised float32 array in this frame. ``kept``: an array tvmrnn holds across
        calls (packed weights, scratch, workspaces): on CPUs, 2 MB or more of it gets huge
        pages (:func:`huge_pages`); a torch caller then gets a tensor over that NumPy memory."""
        if kept and self.device_kind == "cpu" and wants_huge_pages(4 * int(np.prod(shape, dtype=np.int64))):
            a = huge_empty(shape)
            if self.kind == "numpy":
                return a
            import torch
            return torch.from_numpy(a)
        if self.kind == "numpy":
            return aligned_empty(shape)
        import torch
        return torch.empty(shape, dtype=torch.float32, device=self.device)

    def zeros(self, shape):
        if self.kind == "numpy":
            a = aligned_empty(shape)
            a.fill(0)
            return a
        import torch
        return torch.zeros(shape, dtype=torch.float32, device=self.device)

    def padded(self, a, axis: int, rows: int, copies: bool = False):
        """``a`` with rows appended along ``axis`` up to ``rows`` (a fresh array): zeros, or with
        ``copies`` copies of its first row (inputs and states: a padding row then computes what the
        first does, finite where it is; a zero row met an Inf weight as 0 x Inf = NaN, which the
        backward's sums over rows spread into the weight gradients as 0 x NaN)."""
        shape = list(a.shape)
        shape[axis] = rows
        n = a.shape[axis]
        out = self.empty(tuple(shape)) if copies else self.zeros(tuple(shape))
        out[(slice(None),) * axis + (slice(0, n),)] = a
        if copies and rows > n:
            out[(slice(None),) * axis + (slice(n, rows),)] = a[(slice(None),) * axis + (slice(0, 1),)]
        return out

    def rows(self, a, axis: int, rows: int):
        """The first ``rows`` rows of ``a`` along ``axis``, as a C-contiguous array."""
        if a.shape[axis] == rows:
            return a
        view = a[(slice(None),) * axis + (slice(0, rows),)]
        return np.ascontiguousarray(view) if self.kind == "numpy" else view.contiguous()

    def check(self, name: str, a, shape) -> None:
        """Raise unless ``a`` is a contiguous float32 array of ``shape`` in this frame."""
        other = Frame.of(name, a)
        if other.kind != self.kind or other.device_kind != self.device_kind or (
                self.kind == "torch" and other.device != self.device):
            raise ValueError(f"{name}: expected {self.describe()} like the other inputs, got {other.describe()}")
        dtype = str(a.dtype)
        if dtype not in ("float32", "torch.float32"):
            raise TypeError(f"{name}: expected dtype float32, got {dtype}")
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(a.shape)}")
        contiguous = a.flags["C_CONTIGUOUS"] if self.kind == "numpy" else a.is_contiguous()
        if not contiguous:
            raise ValueError(f"{name}: expected a C-contiguous array (call .contiguous() / np.ascontiguousarray)")


def to_device(t, device):
    """A small host torch tensor on ``device`` without waiting for the device's queue: through
    pinned memory, non-blocking (PyTorch synchronizes the stream for a copy from pageable memory)."""
    import torch
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def round_to(dtype: str, a: np.ndarray) -> np.ndarray:
    """float32 ``a`` with its values rounded to ``dtype`` (``"float32"``: as it is; ``"bfloat16"``:
    to nearest even, as torch rounds, NaN kept NaN)."""
    if dtype == "float32":
        return a
    if dtype == "float16":
        with np.errstate(over="ignore"):  # beyond float16's range: inf, as torch casts
            return a.astype(np.float16).astype(np.float32)
    bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000))
    nan = np.isnan(a)
    rounded[nan] = (bits[nan] | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


_CASTS: dict = {}


def cpu_cast(a, dtype: str):
    """A contiguous CPU torch tensor ``a`` as a new tensor of ``dtype`` (``"float32"``,
    ``"bfloat16"`` or ``"float16"``; narrowing rounds to nearest even), cast by a TVM kernel on
    TVM's thread pool (compiled once a process for each pair of dtypes). PyTorch's
    own cast of a large tensor is a parallel op whose OpenMP threads then spin on the cores the
    passes need: a bf16 build's casts in and out made a T=50 N=20 H=256 LSTM forward 3x slower
    (5.9 against 2.0 ms on 2 cores, v44)."""
    import torch
    src = str(a.dtype).removeprefix("torch.")
    out = torch.empty(a.shape, dtype=getattr(torch, dtype))
    if a.numel() == 0:
        return out
    key = (src, dtype)
    fn = _CASTS.get(key)
    if fn is None:
        from tvm import s_tir, te
        from ..device import host_target
        n = te.var("n", "int64")
        x = te.placeholder((n,), src, name="src")
        y = te.compute((n,), lambda i: x[i].astype(dtype), name="dst")
        sch = s_tir.Schedule(te.create_prim_func([x, y]))
        outer, _ = sch.split(sch.get_loops(sch.get_sblock("dst"))[0], [None, 8192])
        sch.parallel(outer)
        fn = _CASTS[key] = tvm.compile(sch.mod, target=host_target())["main"]
    fn(to_tvm(a.contiguous().reshape(-1)), to_tvm(out.reshape(-1)))
    return out


def to_tvm(a):
    """Hand an array to TVM through DLPack, without a copy."""
    if isinstance(a, np.ndarray) and not a.flags["WRITEABLE"]:
        a = np.array(a)  # numpy will not export a read-only array through DLPack
    elif _is_torch(a) and a.requires_grad:
        a = a.detach()  # same storage; DLPack refuses tensors that require grad
    return tvm_ffi.from_dlpack(a)
