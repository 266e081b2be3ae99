"""Exported packages: one shared library per configuration and target, and loading it back.

The library holds every pass (``forward``, ``forward_train``, ``backward``, ``pack_weights``, ``pack_forward``)
and a function ``tvmrnn_metadata`` returning JSON: the configuration, the target (CPU features
or CUDA architecture), the TVM version, the weight layout and each pass's argument signature.
For the cell it records what running needs without the cell's Python math (gates, cell state,
per-unit parameters, how many values the training forward keeps), so a package of a custom
cell loads and runs in a process that never defined the cell.
The file ends, after the ELF image, with the SHA-256 of every byte before it (format 5), and the
metadata carries its own; ``load`` checks both, then reads the metadata, and refuses a damaged
library, or one this machine cannot run, before any of its code runs; it compiles and tunes
nothing itself. (A CUDA package exported where TVM could not compile CUDA, such as a machine
without a GPU, holds the kernels' CUDA source, and TVM's runtime compiles it when it loads the
library: about 100 s for 5 bidirectional layers on the H100 machine, see ``target.shared_kernels``.)
C++ programs use the same two facts (see ``examples/cpp``).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
from typing import TYPE_CHECKING

import tvm
import tvm_ffi

from .. import __version__
from ..device import _cpu_flags, is_arch_of, missing_host_features
from ..schedules import bf16

if TYPE_CHECKING:
    from .rnn import RNN

FORMAT = "tvmrnn-package"
# 2: the cell's per-unit parameters and kept values (custom cells); 3: the backward pass zeroes its
# weight gradients itself (before, the caller did: a loaded format 1 or 2 package still gets that);
# 4: the library holds the SHA-256 of its metadata too (a tampered or damaged package is refused);
# 5: the file ends with the SHA-256 of all of it before that (damaged code is refused too, before
# the dynamic loader runs any of it)
FORMAT_VERSION = 5
READABLE_VERSIONS = (1, 2, 3, 4, 5)  # 1: built-in cells only; they read as before
METADATA_FUNCTION = "tvmrnn_metadata"
_CPU_FEATURES = ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx2", "fma", "avx")


# The last bytes of a package (format 5): this, the file's SHA-256 before it in hex, a newline. The
# dynamic loader maps the ELF segments only, so bytes after them change nothing it loads.
_TRAILER = b"\n#tvmrnn-package-sha256:"
_TRAILER_SIZE = len(_TRAILER) + 64 + 1


class PackageError(ValueError):
    """A library that is not a tvmrnn package, or one this machine or TVM cannot run."""


def metadata(rnn: RNN) -> dict:
    c, t = rnn.config, rnn.target
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "tvmrnn_version": __version__,
        "tvm_version": tvm.__version__,
        **c.cell.signature,  # cell, gates, has_cell_state, unit_params, num_saved
        "unit_param_init": [list(item) for item in c.cell.unit_param_init],  # (a drop-in's start values)
        "input_size": c.input_size, "hidden_size": c.hidden_size, "proj_size": c.proj_size, "num_layers": c.num_layers,
        "bidirectional": c.bidirectional, "batch_size": c.batch_size, "compiled_rows": c.compiled_rows, "batch_first": c.batch_first,
        "packed_units": c.packed_units,
        "dtype": c.options.dtype,  # the passes' inputs, outputs and states (weight gradients: float32)
        "options": c.options.to_dict(),
        "target": str(t), "target_kind": t.kind.name,
        "weight_layout": "one flat float32 buffer of packed_weights_size; per parameter, in PyTorch's order: "
                         "weights (K, H, G) gate-interleaved, biases (H, G) (with weight_panel u > 0: weights in "
                         "gate-blocked column panels (ceil(H / u), K, G, u), biases (ceil(H / u), G, u), the last panel's units past H "
                         "zero, and with packed_units Hp > 0 every weight and bias taking G * Hp rows); then, from "
                         "forward_weights_size on, the "
                         "weights again for the backward, each where its PyTorch offset would be were every weight "
                         "of K inputs Kp wide (padded_inputs [[K, Kp], ...]; else Kp = K): PyTorch's (G, H, K) layout, "
                         "or with backward_weight_panels[K] = v > 0 (ceil(K / v), H, G, v), the features past K "
                         "zero; pack_weights(params, w) makes it from PyTorch's flat layout",
        "padded_inputs": [list(pair) for pair in c.padded_inputs],
        "wave_steps": c.wave_steps,  # the layers as a wavefront (the training workspace's layout)
        "forward_weights_size": c.layout.forward_total,
        "weight_panel": rnn.programs["pack_weights"].weight_panel,
        "backward_weight_panels": {str(k): v for k, v in rnn.programs["pack_weights"].backward_weight_panels.items()},
        "packed_weights_size": c.layout.packed_total,
        "parameters": c.layout.parameter_list(),
        "weights_size": c.layout.total,
        "signatures": rnn.signatures,
        "workspace_arrays": sorted(c.workspace_shapes(1)),
        "schedules": dict(rnn.schedules),
    }
    host = t.host if t.kind.name == "cuda" else t
    meta["cpu"] = {"mcpu": str(host.attrs.get("mcpu", "")),
                   "features": [f for f in _CPU_FEATURES if tvm.target.codegen.llvm_cpu_has_features(f, host)]
                   + (["avx512_bf16"] if c.options.bf16_projections else [])  # (/proc/cpuinfo's names)
                   + (["amx_bf16", "amx_tile"] if c.options.bf16_projections and bf16.supports_amx(host) else [])}
    if t.kind.name == "cuda":
        meta["cuda_arch"] = str(t.attrs["arch"])
        meta["persistent_blocks"] = rnn.persistent_blocks
        meta["allow_tf32"] = rnn.allow_tf32
    return meta


def _metadata_object(meta: dict, workdir: str) -> str:
    """Compile a tiny C++ function returning the metadata JSON; linked into the library."""
    text = json.dumps(meta, sort_keys=True)
    source = os.path.join(workdir, "tvmrnn_metadata.cc")
    with open(source, "w") as f:
        # Twice: as a TVM FFI function (mod["tvmrnn_metadata"]() from Python or C++), and as a plain
        # C function that ctypes can read before TVM loads the library (a CUDA package cannot even
        # be opened by TVM on a machine without CUDA, and we want to say why).
        f.write('#include <tvm/ffi/function.h>\n#include <tvm/ffi/string.h>\n'
                f'static const char* kMetadata = R"TVMRNN({text})TVMRNN";\n'
                f'extern "C" __attribute__((visibility("default"))) const char* {METADATA_FUNCTION}_json() '
                '{ return kMetadata; }\n'
                f'extern "C" __attribute__((visibility("default"))) const char* {METADATA_FUNCTION}_sha256() '
                f'{{ return "{_digest(text)}"; }}\n'
                'static tvm::ffi::String Metadata() { return kMetadata; }\n'
                f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({METADATA_FUNCTION}, Metadata);\n")
    obj = source[:-3] + ".o"
    includes = [f"-I{p}" for p in (tvm_ffi.libinfo.find_include_path(), tvm_ffi.libinfo.find_dlpack_include_path())]
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O1", "-fPIC", "-c", source, "-o", obj, *includes]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"export: compiling the metadata function failed:\n{' '.join(cmd)}\n{done.stderr}")
    return obj


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def cxx_flags() -> list[str]:
    """Compiler and linker flags for a C++ program that loads packages (see examples/cpp)."""
    ffi_lib = tvm_ffi.libinfo.find_libtvm_ffi()
    runtime = os.path.join(os.path.dirname(tvm.__file__), "lib", "libtvm_runtime.so")
    lib_dirs = sorted({os.path.dirname(ffi_lib), os.path.dirname(runtime)})
    return ([f"-I{tvm_ffi.libinfo.find_include_path()}", f"-I{tvm_ffi.libinfo.find_dlpack_include_path()}"]
            # libtvm_runtime provides what compiled kernels call (workspaces, thread pool)
            + [ffi_lib, "-Wl,--no-as-needed", runtime] + [f"-Wl,-rpath,{d}" for d in lib_dirs])


def file_stamp(path: str) -> tuple:
    """``(device, inode, mtime, size)`` of the file at ``path`` (links followed): another file
    written there has another."""
    st = os.stat(os.path.realpath(path))
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def export(rnn: RNN, path: str) -> str:
    """Write ``rnn`` (a built one) as one shared library at ``path``; returns the path."""
    path = os.fspath(path)
    if rnn.executable is None:
        if rnn.package_path is None or not os.path.isfile(rnn.package_path):
            raise ValueError("export: this RNN was loaded from a library that is no longer there; build it again")
        if rnn.package_stamp is not None and file_stamp(rnn.package_path) != rnn.package_stamp:
            raise ValueError(f"export: the library this RNN was loaded from, {rnn.package_path!r}, has been "
                             "replaced since (another file was written there); export the RNN that wrote it, "
                             "or build this one again")
        if os.path.abspath(path) != os.path.abspath(rnn.package_path):
            shutil.copyfile(rnn.package_path, path)
        return path
    with tempfile.TemporaryDirectory() as workdir:
        # TVM picks the format by the suffix (".tar" an archive): a shared library whatever the name
        library = path if path.endswith(".so") else os.path.join(workdir, "package.so")
        rnn.executable.export_library(library, addons=[_metadata_object(metadata(rnn), workdir)])
        _append_checksum(library)
        if library != path:
            shutil.copyfile(library, path)
    return path


def file_sha256(path: str, size: int | None = None) -> str:
    """The SHA-256 of the first ``size`` bytes of ``path`` (None: all of it), in hex."""
    if size is None:
        size = os.path.getsize(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while size > 0:
            block = f.read(min(size, 1 << 20))
            if not block:
                break
            h.update(block)
            size -= len(block)
    return h.hexdigest()


def _append_checksum(path: str) -> None:
    """End the library at ``path`` with the trailer: the SHA-256 of all of it before that."""
    digest = file_sha256(path)
    with open(path, "ab") as f:
        f.write(_TRAILER + digest.encode() + b"\n")


def _checked_contents(path: str, shown: str) -> bool:
    """Whether ``path`` ends with a package's checksum trailer; PackageError where it does and the
    bytes before it do not match it (damaged code or data anywhere in the library)."""
    size = os.path.getsize(path)
    if size < _TRAILER_SIZE:
        return False
    with open(path, "rb") as f:
        f.seek(size - _TRAILER_SIZE)
        tail = f.read(_TRAILER_SIZE)
    if not tail.startswith(_TRAILER) or not tail.endswith(b"\n"):
        return False
    if tail[len(_TRAILER):-1].decode("ascii", "replace") != file_sha256(path, size - _TRAILER_SIZE):
        raise PackageError(f"load: {shown!r}: its contents do not match the checksum the library was written "
                           "with (a damaged or edited package); export it again")
    return True


def _check_elf(path: str, shown: str) -> None:
    """Raise PackageError unless ``path`` is a whole 64-bit ELF file: every segment the loader maps
    and the section table lie inside it. (A truncated library maps past its end, and the first
    touch of that memory is a SIGBUS that kills the process, not an exception.)"""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise PackageError(f"load: {shown!r} is not a 64-bit little-endian shared library")
        phoff, shoff = struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", head, 54)
        if phoff + phnum * phentsize > size or shoff + shnum * shentsize > size:
            raise PackageError(f"load: {shown!r} is truncated ({size} bytes)")
        f.seek(phoff)
        table = f.read(phnum * phentsize)
    for i in range(phnum):
        kind, _, offset, _, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if kind == 1 and offset + filesz > size:  # PT_LOAD
            raise PackageError(f"load: {shown!r} is truncated ({size} bytes; a segment ends at {offset + filesz})")


def read_metadata(path, shown=None) -> dict:
    """The package's metadata, read with ctypes: nothing of TVM's runs. ``shown``: the path its
    errors name (the user's, where ``path`` is a private copy: :func:`tvmrnn.runtime.loader.load`)."""
    path = os.fspath(path)
    shown = os.fspath(shown) if shown is not None else path
    if not os.path.isfile(path):
        raise FileNotFoundError(f"load: no such file {shown!r}")
    _check_elf(path, shown)
    checked = _checked_contents(path, shown)  # before the dynamic loader runs any of it
    try:
        library = ctypes.CDLL(os.path.abspath(path), mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as err:
        raise PackageError(f"load: {shown!r} is not a loadable shared library: {err}") from None
    try:
        function = getattr(library, f"{METADATA_FUNCTION}_json")
        function.restype = ctypes.c_char_p
        text = function().decode()
        meta = json.loads(text)
    except (AttributeError, ValueError):
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PackageError("load: not a tvmrnn package (no tvmrnn metadata in the library)")
    if isinstance(meta.get("format_version"), int) and meta["format_version"] >= 4:
        try:
            function = getattr(library, f"{METADATA_FUNCTION}_sha256")
            function.restype = ctypes.c_char_p
            digest = function().decode()
        except (AttributeError, ValueError):
            digest = None
        if digest != _digest(text):
            raise PackageError(f"load: {shown!r}: its metadata does not match the checksum the library was "
                               "written with (a damaged or edited package); export it again")
    if isinstance(meta.get("format_version"), int) and meta["format_version"] >= 5 and not checked:
        raise PackageError(f"load: {shown!r}: the checksum of its contents is missing from its end (a damaged, "
                           "truncated or stripped package); export it again")
    return meta


def check_machine(meta: dict, device_index: int) -> None:
    """Raise PackageError unless this machine and TVM can run the package."""
    if meta["format_version"] not in READABLE_VERSIONS:
        raise PackageError(f"load: package format {meta['format_version']}, this tvmrnn reads formats "
                           f"{list(READABLE_VERSIONS)}")
    if meta["tvm_version"] != tvm.__version__:
        raise PackageError(f"load: the package was built with TVM {meta['tvm_version']}, "
                           f"this is TVM {tvm.__version__}; rebuild it (tvmrnn-export)")
    flags = _cpu_flags()
    missing = [f for f in meta["cpu"]["features"] if flags and f not in flags]
    if not missing and meta["target_kind"] != "cuda":  # what the target lets its code use (AMX in fp32
        # builds' tiles too, which the metadata's list names only for bf16 builds)
        target = meta["target"]
        missing = missing_host_features(tvm.target.Target(json.loads(target) if target.startswith("{") else target))
    if missing:
        raise PackageError(f"load: the package's CPU code needs {missing} (built for mcpu="
                           f"{meta['cpu']['mcpu']!r}), which this CPU lacks; rebuild it for this machine")
    if meta["target_kind"] == "cuda":
        dev = tvm.cuda(device_index)
        if not dev.exist:
            raise PackageError(f"load: the package is for a CUDA GPU ({meta['cuda_arch']}) and this machine "
                               f"has no CUDA device {device_index}")
        if not is_arch_of(meta["cuda_arch"], dev):
            raise PackageError(f"load: the package is for {meta['cuda_arch']}, GPU {device_index} is "
                               f"sm_{dev.compute_version.replace('.', '')}; rebuild it for this GPU")
        blocks = meta.get("persistent_blocks")
        if blocks and dev.multi_processor_count < blocks:  # its grid barrier would wait forever
            raise PackageError(f"load: the package's persistent kernels run {blocks} blocks that must all be "
                               f"resident, one per SM; GPU {device_index} has {dev.multi_processor_count} SMs; "
                               f"rebuild it on this GPU")
