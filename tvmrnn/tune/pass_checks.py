"""Whole-pass verdicts kept beside the raw logs: ``<log folder>/pass_checks.json``.

A record is timed alone, but ``build`` uses it inside a pass, where caches, launch order and the
kernels around it differ: on the Xeon (notes v19) and on a 2-core EPYC (notes v37) records 5-29%
faster alone made the whole pass 3-7% slower. ``tvmrnn-tune`` therefore measures whole passes after
a search (:mod:`tvmrnn.runtime.pass_tuning`) and writes two kinds of verdict here:

* **records**: a kernel's record checked in the pass against the kernel's default schedule.
  ``"vetoed"`` (the pass was slower with it) makes every reader of records skip it
  (:func:`tvmrnn.tune.records.scheduler`, :class:`~tvmrnn.tune.records.LogIndex`,
  :func:`~tvmrnn.tune.records.distill`), so ``build`` takes the next record, at worst the default;
  ``"kept"`` says it was checked. Records are never deleted from the logs: removing this file (or
  one verdict) undoes the check.
* **options**: the pass-level build choices (:data:`tvmrnn.options.TUNED_FIELDS`: persistence,
  chunk sizes, direction stacking, CPU panels and projections) measured as whole passes for one
  configuration; ``build`` applies them where its options leave those choices to the target.

A record is named by its workload key and a digest of its trace (:func:`record_digest`), so a
verdict holds for the same record in the raw logs and in the shipped records file, and for every
configuration whose build has that workload (a workload fixes the kernel's shapes; the passes
around it may differ, e.g. more layers: delete a verdict to check a record again). An option
verdict is keyed by the cell, sizes, batch and the options tuning does not choose
(:func:`config_key`): a verdict made before a new ``BuildOptions`` field existed no longer matches. The file is
rewritten whole, atomically, under a lock (two tuning processes may finish at once).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time

from ..cells.autodiff import fingerprint
from ..options import TUNED_FIELDS

FILE_NAME = "pass_checks.json"
FORMAT = "tvmrnn-pass-checks"
VERSION = 1
ALL_RECORDS = "*"  # a record digest that vetoes every record of a workload (its default schedule then)


class PassCheckError(ValueError):
    pass


def record_digest(record_json) -> str:
    """A short digest of a MetaSchedule record's trace (its JSON's first item)."""
    trace = record_json[0] if isinstance(record_json, (list, tuple)) and record_json else record_json
    return hashlib.sha256(json.dumps(trace, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def config_key(config) -> str:
    """The key of a configuration's option verdict: its cell (its traced math), sizes and batch,
    and the options that tuning does not choose."""
    # (time_loop_regions, tuned since v73, stays in the key as it was written before, false: a verdict
    # applies only where every tuned field is left to the target, so earlier verdicts keep their keys)
    fixed = {k: v for k, v in config.options.to_dict().items() if k not in TUNED_FIELDS}
    fixed["time_loop_regions"] = False
    parts = [hashlib.sha256(fingerprint(config.cell).encode()).hexdigest()[:16], config.input_size, config.hidden_size,
             config.num_layers, config.bidirectional, config.batch_size, fixed]
    if config.proj_size:  # (keys of configurations without projections as before)
        parts.append({"proj_size": config.proj_size})
    return json.dumps(parts, sort_keys=True, separators=(",", ":"))


def describe(config) -> str:
    return (f"{config.cell.name} I={config.input_size} H={config.hidden_size}"
            f"{f' P={config.proj_size}' if config.proj_size else ''} L={config.num_layers}"
            f"{' bidirectional' if config.bidirectional else ''} N={config.batch_size}"
            f"{'' if config.options.dtype == 'float32' else ' ' + config.options.dtype}")


class PassChecks:
    """The verdicts of one log folder (an empty set where it has no file)."""

    def __init__(self, folder: str | None):
        self.folder = folder
        self.records: list[dict] = []
        self.options: list[dict] = []
        self._veto_map: dict[str, set] | None = None
        path = self.path
        if path is None or not os.path.exists(path):
            return
        try:
            with open(path) as f:
                obj = json.load(f)
        except (OSError, ValueError) as err:
            raise PassCheckError(f"{path}: not readable as JSON ({err}); remove it to drop its verdicts") from None
        if not (isinstance(obj, dict) and obj.get("format") == FORMAT):
            raise PassCheckError(f"{path}: not a tvmrnn pass-checks file (no {FORMAT!r} format)")
        if obj.get("version") != VERSION:
            raise PassCheckError(f"{path}: pass-checks version {obj.get('version')!r}; this tvmrnn reads {VERSION}")
        self.records = [r for r in obj.get("records", []) if isinstance(r, dict)]
        self.options = [o for o in obj.get("options", []) if isinstance(o, dict)]

    @property
    def path(self) -> str | None:
        return os.path.join(self.folder, FILE_NAME) if self.folder else None

    def _vetoes(self) -> dict[str, set]:
        """Workload key -> the digests of its vetoed records (a later "kept" verdict lifts a veto)."""
        if self._veto_map is None:
            latest: dict[tuple, str] = {}
            for r in self.records:
                latest[(str(r.get("workload")), str(r.get("record")))] = r.get("verdict")
            self._veto_map = {}
            for (key, digest), verdict in latest.items():
                if verdict == "vetoed":
                    self._veto_map.setdefault(key, set()).add(digest)
        return self._veto_map

    def vetoed(self, workload_key: str, record_json) -> bool:
        """Whether a whole-pass check vetoed this record of the workload."""
        digests = self._vetoes().get(str(workload_key))
        return bool(digests) and (ALL_RECORDS in digests or record_digest(record_json) in digests)

    def has_vetoes(self, workload_key: str) -> bool:
        return str(workload_key) in self._vetoes()

    def verdict(self, workload_key: str, record_json) -> dict | None:
        """The latest verdict on this record, if it was checked."""
        digest = record_digest(record_json)
        found = [r for r in self.records if r.get("workload") == workload_key and r.get("record") == digest]
        return found[-1] if found else None

    def options_for(self, key: str) -> dict | None:
        """The latest option verdict of a configuration (:func:`config_key`), if any."""
        found = [o for o in self.options if o.get("config") == key]
        return found[-1] if found else None

    # ---- writing ---------------------------------------------------------------------------
    def add_record(self, workload_key: str, record_json, verdict: str, **facts) -> dict:
        """Write a verdict on a record (``record_json`` None: on all the workload's records)."""
        if verdict not in ("vetoed", "kept"):
            raise ValueError(f"verdict: expected 'vetoed' or 'kept', got {verdict!r}")
        digest = ALL_RECORDS if record_json is None else record_digest(record_json)
        entry = {"workload": str(workload_key), "record": digest, "verdict": verdict,
                 "date": time.strftime("%Y-%m-%d %H:%M"), **facts}
        self._write(lambda checks: checks.records.append(entry))
        return entry

    def add_options(self, key: str, options: dict, **facts) -> dict:
        entry = {"config": key, "options": options, "date": time.strftime("%Y-%m-%d %H:%M"), **facts}
        self._write(lambda checks: checks.options.append(entry))
        return entry

    def write_all(self, records: list, options: list) -> None:
        """Replace every verdict (a copy of another folder's, for instance)."""
        self._write(lambda fresh: (setattr(fresh, "records", list(records)), setattr(fresh, "options", list(options))))

    def _write(self, change) -> None:
        """Re-read the file under a lock, apply ``change`` to it, write it whole, atomically."""
        os.makedirs(self.folder, exist_ok=True)
        with _locked(self.path + ".lock"):
            fresh = PassChecks(self.folder)
            change(fresh)
            obj = {"format": FORMAT, "version": VERSION, "records": fresh.records, "options": fresh.options}
            tmp = f"{self.path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump(obj, f, indent=1)
                f.write("\n")
            os.replace(tmp, self.path)
        self.records, self.options, self._veto_map = fresh.records, fresh.options, None


@contextlib.contextmanager
def _locked(path: str):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
