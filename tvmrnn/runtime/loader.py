"""Loading an exported package (:mod:`.package`) back into an :class:`~tvmrnn.runtime.rnn.RNN`."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile

import tvm

from ..cells.definition import CELLS, Cell, get_cell
from ..options import BuildOptions
from ..program.passes import Config
from .package import PackageError, check_machine, file_stamp, read_metadata
from .rnn import RNN
from .threads import prepare_cpu_threads


def _check_layout(meta: dict, config: Config) -> None:
    """Raise ValueError unless the metadata's weight layout is the one its sizes make."""
    layout = config.layout
    if meta.get("packed_weights_size", layout.packed_total) != layout.packed_total or meta.get(
            "weights_size", layout.total) != layout.total:
        raise ValueError(f"packed_weights_size {meta.get('packed_weights_size')} and weights_size "
                         f"{meta.get('weights_size')}, where the sizes make {layout.packed_total} and {layout.total}")
    if "parameters" in meta and meta["parameters"] != layout.parameter_list():
        raise ValueError("the parameter list is not the one the sizes make")


def _cell_of(meta: dict) -> Cell:
    """The package's cell: the built-in one of that name, else one that carries no math."""
    name = meta["cell"]
    if meta["format_version"] == 1:  # built-in cells only, no per-unit parameters
        return get_cell(name)
    builtin = CELLS.get(name)
    if builtin is not None and builtin.signature == {k: meta[k] for k in builtin.signature}:
        return builtin
    return Cell(name, tuple(meta["gates"]), meta["has_cell_state"], None, tuple(meta["unit_params"]),
                num_saved=meta["num_saved"],
                unit_param_init=tuple((str(name), float(value)) for name, value in meta.get("unit_param_init", ())))


_OPENED: dict = {}  # real path -> (device, inode, mtime, size) of the file this process opened there


@contextlib.contextmanager
def _openable(path: str):
    """``(a path to open path's library by, the file's stamp (:func:`file_stamp`; None where there
    is no file))``. The path: itself, or a private copy named ``.so`` where TVM
    would not load it under its own name (it picks its loader by the suffix: ``model.tvmrnn`` or
    ``model`` failed) or where this process opened another file at that path before (the dynamic
    loader hands back the library it has open under a name: a package exported again over it
    loaded as the old one). The copy is removed once loaded (the mapping stays)."""
    if not os.path.isfile(path):
        yield path, None  # (read_metadata names what is wrong)
        return
    real = os.path.realpath(path)
    stamp = file_stamp(real)
    if real.endswith(".so") and _OPENED.setdefault(real, stamp) == stamp:
        yield path, stamp
        return
    fd, copy = tempfile.mkstemp(suffix=".so", prefix="tvmrnn-package-")
    os.close(fd)
    try:
        shutil.copyfile(real, copy)
        yield copy, stamp
    finally:
        with contextlib.suppress(OSError):
            os.unlink(copy)


def load(path, device=None) -> RNN:
    """Load an exported package. ``device``: None, ``"cpu"``, ``"cuda"`` or ``"cuda:1"``.

    The returned object has the same ``pack_weights / forward / forward_train / backward``
    contract as :func:`tvmrnn.build`.
    """
    path = os.fspath(path)
    device_index = 0
    if device is not None:
        kind, _, index = str(device).partition(":")
        if kind not in ("cpu", "cuda") or not (index.isdigit() or index == ""):
            raise ValueError(f"device: expected None, 'cpu', 'cuda' or 'cuda:N', got {device!r}")
        device_index = int(index or 0)
    with _openable(path) as (opened, stamp):
        return _load(path, opened, device, device_index, stamp)


def _load(path: str, opened: str, device, device_index: int, stamp=None) -> RNN:
    """:func:`load` of ``path``'s library, opened by the path ``opened`` (``stamp``: the file's
    :func:`file_stamp` as found)."""
    meta = read_metadata(opened, shown=path)
    if device is not None and str(device).partition(":")[0] != ("cuda" if meta["target_kind"] == "cuda" else "cpu"):
        raise PackageError(f"load: the package is for {meta['target_kind']}, not device {device!r}")
    check_machine(meta, device_index)
    try:
        options = BuildOptions.from_dict(meta["options"]) if "options" in meta else BuildOptions(persistent="auto")
    except (TypeError, ValueError) as err:
        raise PackageError(f"load: the package's build options do not read ({err}); rebuild it") from None
    if meta["target_kind"] != "cuda":
        prepare_cpu_threads(dataclasses.replace(options, threads=None))  # this machine's cores, not the builder's
    try:
        config = Config(_cell_of(meta), meta["input_size"], meta["hidden_size"], meta["num_layers"],
                        meta["bidirectional"], meta["batch_size"], meta["batch_first"], options,
                        int(meta.get("compiled_rows", 0)),  # (packages before v67: none)
                        proj_size=int(meta.get("proj_size", 0)),  # (before v71: none)
                        packed_units=int(meta.get("packed_units", 0)),  # (before v75: none)
                        padded_inputs=tuple((int(k), int(kp)) for k, kp in meta.get("padded_inputs", ())),  # (v77)
                        wave_steps=int(meta.get("wave_steps", 0)))  # (v86)
        _check_layout(meta, config)
    except (KeyError, TypeError, ValueError) as err:
        raise PackageError(f"load: {path!r}: its metadata does not describe a configuration ({err!s}); "
                           "export it again") from None
    module = tvm.runtime.load_module(opened)
    missing = [name for name in meta["signatures"] if not module.implements_function(name, True)]
    if missing:
        raise PackageError(f"load: {path!r}: the library lacks the passes its metadata names: {missing}")
    target = tvm.target.Target(json.loads(meta["target"]) if meta["target"].startswith("{") else meta["target"])
    rnn = RNN(config, target, module, meta["signatures"], device_index=device_index)
    rnn.persistent_blocks = meta.get("persistent_blocks")
    rnn.allow_tf32 = bool(meta.get("allow_tf32", False))
    rnn.backward_zeroes_dw = meta["format_version"] >= 3
    rnn.schedules = dict(meta.get("schedules", {}))
    rnn.package_path = os.path.abspath(path)
    rnn.package_stamp = stamp
    return rnn
