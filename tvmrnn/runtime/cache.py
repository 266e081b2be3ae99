"""The on-disk build cache: a build that was made once, by any process, loads in a second.

Every entry is an exported package (:mod:`.package`), named by a key that covers everything that
decides a build: the cell's definition (its traced math, not only its name), the sizes, the
target with its device model, the build options, the tuning records the build can read (the
shipped records file's contents and the raw logs' file names, sizes and times), the TVM version
and tvmrnn's own source. A change to any of them is a new key, never a stale hit.

- Where: ``$TVMRNN_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvmrnn``, else ``~/.cache/tvmrnn``.
- Off: ``TVMRNN_CACHE=off`` in the environment, or ``tvmrnn.build(..., cache=False)``.
- Several processes at once (DDP ranks building the same RNN): an exclusive ``flock`` on the
  entry's lock file; one process builds, the others wait for it and then load its result. A
  package is written beside the entry and renamed into place, so no reader sees half a file.
- A truncated or corrupt entry (checked against the SHA-256 digest written with it, before the
  library is opened) is reported (:class:`CacheWarning`), removed and rebuilt.
- Only builds this machine can run are cached (CPU builds, CUDA builds where a GPU is present):
  a package is not loadable elsewhere.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import warnings

import tvm

from .. import __version__
from ..cells.autodiff import fingerprint
from .package import file_sha256

_SOURCE = pathlib.Path(__file__).resolve().parent.parent  # the tvmrnn package


class CacheWarning(UserWarning):
    """A cache entry could not be used (it is rebuilt) or written (the build is still returned)."""


def cache_off() -> bool:
    return os.environ.get("TVMRNN_CACHE", "").strip().lower() in ("off", "0", "false", "no")


def cache_dir() -> pathlib.Path:
    """The cache's folder (not created here)."""
    explicit = os.environ.get("TVMRNN_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "tvmrnn"


_source_digest: str | None = None


def source_digest() -> str:
    """A digest of tvmrnn's Python source: a build made by other code is another build."""
    global _source_digest
    if _source_digest is None:
        h = hashlib.sha256()
        for path in sorted(_SOURCE.rglob("*.py")):
            h.update(str(path.relative_to(_SOURCE)).encode())
            h.update(path.read_bytes())
        _source_digest = h.hexdigest()
    return _source_digest


def records_state(target, tuning_logs) -> dict:
    """What the build's tuning records are: the shipped file's digest, the raw logs' listing."""
    from ..tune.records import logs_folder, records_file, records_off
    state: dict = {}
    if records_off(tuning_logs):
        return {"off": True}
    shipped = records_file(target)
    if shipped:
        state["shipped"] = file_sha256(shipped)
    folder = logs_folder(tuning_logs, target)
    if folder and os.path.isdir(folder):
        listing = []
        for root, _, files in os.walk(folder):
            for name in sorted(files):
                path = os.path.join(root, name)
                st = os.stat(path)
                listing.append([os.path.relpath(path, folder), st.st_size, st.st_mtime_ns])
        state["logs"] = [os.path.abspath(folder), sorted(listing)]
    return state


def build_key(config, target, options, allow_tf32: bool, tuning_logs) -> str:
    """The cache key of a build (a hex digest)."""
    from ..device import device_model
    parts = {
        "tvmrnn": [__version__, source_digest()], "tvm": tvm.__version__,
        "cell": fingerprint(config.cell),
        "sizes": [config.input_size, config.hidden_size, config.num_layers, config.bidirectional,
                  config.batch_size, config.rows, config.batch_first, config.proj_size],
        "target": str(target), "device": repr(device_model(target)),
        "options": options.to_dict(), "allow_tf32": allow_tf32,
        "records": records_state(target, tuning_logs),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def runnable_here(target) -> bool:
    """Whether a package for ``target`` loads on this machine (what the cache may hold)."""
    if target.kind.name != "cuda":
        return True
    try:
        return bool(tvm.cuda(0).exist)
    except Exception:  # noqa: BLE001 - no CUDA runtime at all
        return False


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    """An exclusive lock on ``path`` for the block; none, with a warning, where the lock file
    cannot be opened (a read-only shared cache: its entries are read without a lock, and a new
    entry fails to write with a warning of its own)."""
    import fcntl
    try:
        f = open(path, "a+")
    except OSError as err:
        warnings.warn(f"tvmrnn cache: cannot lock {path} ({err}); using the cache without a lock", CacheWarning,
                      stacklevel=4)
        yield
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        yield


def cached_build(key: str, make, load):
    """``load(path)`` of the entry ``key``, else ``make()`` (an RNN), exported there and returned.

    Returns ``(rnn, hit)``. Errors in writing the cache are warnings: the build stands."""
    folder = cache_dir() / key[:2]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        warnings.warn(f"tvmrnn cache: cannot create {folder} ({err}); building without the cache", CacheWarning,
                      stacklevel=3)
        return make(), False
    entry, digest = folder / f"{key}.so", folder / f"{key}.sha256"
    with _locked(folder / f"{key}.lock"):
        if entry.exists():
            try:
                # the digest written with the entry first: a damaged library can crash the loader
                if not digest.exists() or digest.read_text().strip() != file_sha256(str(entry)):
                    raise ValueError("its contents do not match the digest written with it")
                return load(str(entry)), True
            except Exception as err:  # noqa: BLE001 - whatever is wrong with it, it is rebuilt
                warnings.warn(f"tvmrnn cache: entry {entry} is unusable ({type(err).__name__}: {err}); "
                              f"rebuilding it", CacheWarning, stacklevel=3)
                with contextlib.suppress(OSError):
                    entry.unlink()
        rnn = make()
        partial = folder / f"{key}.{os.getpid()}.tmp.so"
        try:
            rnn.export(str(partial))
            digest.write_text(file_sha256(str(partial)) + "\n")
            os.replace(partial, entry)
            rnn.package_path = str(entry)
        except Exception as err:  # noqa: BLE001 - a full disk must not fail the build
            warnings.warn(f"tvmrnn cache: could not write {entry} ({type(err).__name__}: {err})", CacheWarning,
                          stacklevel=3)
            with contextlib.suppress(OSError):
                partial.unlink()
        return rnn, False


def clear() -> int:
    """Remove every cache entry; returns how many were removed."""
    root = cache_dir()
    removed = 0
    if root.is_dir():
        for path in [*root.glob("*/*.so"), *root.glob("*/*.sha256")]:
            with contextlib.suppress(OSError):
                path.unlink()
                removed += path.suffix == ".so"
    return removed
