"""Tuning records: what ``build`` reads, and the raw MetaSchedule logs they come from.

Two sources, both per target (:func:`target_key`), and ``build`` takes each kernel's fastest
record from either (:func:`scheduler`):

* **Shipped records** (:class:`RecordDatabase`): ``tvmrnn/records/<target>.jsonl``, package data
  that a wheel installs. One line per tuned workload, keyed by MetaSchedule's structural hash of
  the workload: the fastest record that the sequence driver can embed, its measured time, how many
  trials the logs hold, and the kernel's name where it was known. Made from raw logs by
  :func:`distill` (``tvmrnn-tune --distill``); a file says at its top how it was made.
* **Raw logs** (:class:`LogIndex`): folders of MetaSchedule ``JSONDatabase`` files, one pair per
  tuning run (``<run>_workload.json``, ``<run>_tuning_record.json``), plain or xz-compressed
  (``.json.xz``, as the repository keeps its full histories). A tuning run never touches existing
  files. Reading tolerates a truncated last line (a killed run) and stops with the file and line
  of anything else that does not parse. :func:`logs_folder` says where they are: the
  ``tuning_logs=`` argument, else ``TVMRNN_TUNING_LOGS``, else :func:`default_logs_root`.

The workload of a kernel (:func:`workload`) is defined here once, for tuning and lookup alike.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import glob
import json
import lzma
import os
import time
import warnings

import tvm
import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.schedule import Trace

from ..device import llvm_opt_level
from ..kernels import Kernel, reads_gradients, tf32
from ..schedules import apply, default_schedule, ended_rows, fast_math
from ..schedules.variants import variants
from ..schedules.knobs import VALUES_BEFORE, knob_values_json, seeded_settings
from ..schedules.common import is_gpu
from ..schedules.cuda import tf32_applies
from ..program.passes import GPU_CHUNK_STEPS, GPU_MID_CHUNK_STEPS, GPU_SHORT_CHUNK_STEPS, chunk_steps
from ..program.sequence import SHARED_WITHOUT_OPT_IN, shared_memory_bytes, shared_memory_problem
from ..options import TUNED_FIELDS, BuildOptions, left_to_target
from .pass_checks import PassChecks, config_key

# the shipped records: package data (pyproject.toml's package-data), one file per target
RECORDS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "records")
RECORDS_FORMAT = "tvmrnn-records"
RECORDS_VERSION = 1
# the repository's full tuning histories, when tvmrnn runs from a source checkout
_SOURCE_LOGS = os.path.join(os.path.dirname(RECORDS_DIR), os.pardir, "tuning_logs")
OFF = ("off", "none", "0")  # TVMRNN_TUNING_LOGS values that turn every record off


def default_logs_root() -> str:
    """Where tuning writes, and ``build`` reads, raw logs when neither ``tuning_logs=`` nor
    ``TVMRNN_TUNING_LOGS`` says: the repository's ``tuning_logs/`` in a source checkout (next to
    ``pyproject.toml``), else ``$XDG_DATA_HOME/tvmrnn/tuning_logs`` (``~/.local/share/...``)."""
    source = os.path.normpath(_SOURCE_LOGS)
    if os.path.isdir(source) and os.path.exists(os.path.join(os.path.dirname(source), "pyproject.toml")):
        return source
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "tvmrnn", "tuning_logs")


class TuningLogError(ValueError):
    """A tuning log that cannot be read: names the file and line."""


class UntunedWarning(UserWarning):
    """Some kernels of a build had no tuning record for the target and use default schedules."""


def target_key(target: tvm.target.Target, with_level: bool = True) -> str:
    """The log folder name of a target: ``cuda-sm_90``, ``llvm-sapphirerapids-16c``.

    ``sm_90a`` (the H100 tag's arch) and ``sm_90`` (what the driver reports) share a folder: the
    tuned kernels use no arch-specific ("a") features.
    """
    if target.kind.name == "cuda":
        return f"cuda-{str(target.attrs['arch']).rstrip('a')}"
    mcpu = str(target.attrs.get("mcpu", "generic"))
    cores = target.attrs.get("num-cores")
    level = llvm_opt_level(target) if with_level else None
    # (code at a lower LLVM level, TVMRNN_LLVM_OPT_LEVEL, runs slower: its timings go apart,
    # ``llvm-...-O0``; its builds read the top level's records too, _folder_names; ``with_level``
    # False: the top level's key)
    return f"llvm-{mcpu}" + (f"-{int(cores)}c" if cores else "") + (f"-O{level}" if level is not None and level < 3 else "")


def is_fused_step(kernel: Kernel) -> bool:
    return kernel.name.startswith("recurrent_step_")


def has_fused_epilogue(kernel: Kernel) -> bool:
    """A GEMM whose result feeds several sibling output blocks in one launch (the forward step's
    gate math, the backward step's gate-math backward)."""
    return is_fused_step(kernel) or kernel.name.startswith("backward_step_")


def prepare(kernel: Kernel) -> tvm.tirx.PrimFunc:
    """The kernel as tuned (and looked up): a fused epilogue's output blocks marked not to be
    inlined, so that MetaSchedule's default rules keep the kernel correct."""
    if not has_fused_epilogue(kernel):
        return kernel.func
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))  # Schedule edits its input in place
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint != kernel.gemm:
            sch.annotate(block, "meta_schedule.inline_rule", "disable")
    return sch.mod["main"]


def workload(kernel: Kernel) -> tvm.IRModule:
    """The module MetaSchedule tunes and looks up for a kernel (one definition for both).

    A fresh copy each time: ``s_tir.Schedule`` edits the statements of the module it is given
    in place, and they would otherwise be shared with ``kernel.func``.
    """
    func = tvm.s_tir.renew_defs(prepare(kernel))
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


# ---- logs -----------------------------------------------------------------------------------
def _read_lines(path: str):
    """(line number, parsed JSON) of each complete line of a plain or xz-compressed file; a
    truncated last line is skipped."""
    opener = lzma.open if path.endswith(".xz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (lzma.LZMAError, EOFError) as err:
        raise TuningLogError(f"{path}: not a readable xz file: {err}") from None
    lines = data.split(b"\n")
    complete = data.endswith(b"\n") or not data
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except ValueError as err:
            if number == len(lines) and not complete:
                warnings.warn(f"{path}:{number}: skipping a truncated last line (an interrupted run)")
                return
            raise TuningLogError(f"{path}:{number}: not a JSON line: {err}") from None


def _log_runs(folder: str):
    """Each tuning run's ``(workload file, record file or None)`` in a log folder, in name order
    (plain ``.json`` or compressed ``.json.xz``)."""
    paths = glob.glob(os.path.join(folder, "*_workload.json")) + glob.glob(os.path.join(folder, "*_workload.json.xz"))
    for workload_path in sorted(paths):
        suffix = ".json.xz" if workload_path.endswith(".xz") else ".json"
        record_path = workload_path[: -len("_workload" + suffix)] + "_tuning_record" + suffix
        yield workload_path, record_path if os.path.exists(record_path) else None


def load_records(folder: str) -> ms.database.MemoryDatabase:
    """Every workload and tuning record in a log folder, in memory (the files stay as they are).
    Parsing a record replays its trace on its workload (~20 ms a record): what only needs a
    kernel's best records reads the folder with :class:`LogIndex` instead."""
    db = ms.database.MemoryDatabase()
    for workload_path, record_path in _log_runs(folder):
        workloads = []
        for number, obj in _read_lines(workload_path):
            try:
                workloads.append(db.commit_workload(ms.database.Workload.from_json(obj).mod))
            except Exception as err:
                raise TuningLogError(f"{workload_path}:{number}: not a MetaSchedule workload: {err}") from None
        if record_path is None:
            continue
        for number, obj in _read_lines(record_path):
            try:
                index, record = obj
                db.commit_tuning_record(record_from_json(record, workloads[index]))
            except Exception as err:
                raise TuningLogError(f"{record_path}:{number}: not a MetaSchedule tuning record "
                                     f"for a workload of {os.path.basename(workload_path)}: {err}") from None
    return db


class LogIndex:
    """A log folder's records read as JSON lines and parsed only when a kernel asks for them
    (:func:`scheduler`, ``tvmrnn-tune --list``): parsing a record replays its trace on its
    workload, ~20 ms a record, so loading a whole folder cost a build ~33 s for the H100's 1,598
    records, most of them for kernels the build does not have. Lines that are not JSON, or not
    ``[workload, record]`` pairs, raise :class:`TuningLogError` here; a record that does not
    replay raises it when asked for. Records that a whole-pass check vetoed (the folder's
    :class:`~tvmrnn.tune.pass_checks.PassChecks`) are skipped wherever the fastest are asked for."""

    def __init__(self, folder: str):
        self.checks = PassChecks(folder)
        self.workloads: dict[str, tuple] = {}  # workload key -> (its JSON, where)
        self.records: dict[str, list] = {}  # workload key -> [(mean s, order, record JSON, where)], measured ones
        self.counts: dict[str, int] = {}  # workload key -> how many records the logs hold, failed runs too
        for workload_path, record_path in _log_runs(folder):
            keys = []
            for number, obj in _read_lines(workload_path):
                if not (isinstance(obj, list) and len(obj) == 2):
                    raise TuningLogError(f"{workload_path}:{number}: not a MetaSchedule workload")
                keys.append(str(obj[0]))
                self.workloads.setdefault(keys[-1], (obj, f"{workload_path}:{number}"))
            if record_path is None:
                continue
            for number, obj in _read_lines(record_path):
                where = f"{record_path}:{number}"
                try:
                    index, record = obj
                    key = keys[index]
                    secs = [float(x) for x in record[1] or ()]
                except Exception as err:
                    raise TuningLogError(f"{where}: not a MetaSchedule tuning record "
                                         f"for a workload of {os.path.basename(workload_path)}: {err}") from None
                self.counts[key] = self.counts.get(key, 0) + 1
                if secs and not all(x > 1e9 for x in secs):  # measured (MetaSchedule's top-k skips the rest)
                    entries = self.records.setdefault(key, [])
                    entries.append((sum(secs) / len(secs), len(entries), record, where))

    @staticmethod
    def _key(mod: tvm.IRModule) -> str:
        """A workload's structural hash, as the logs write it."""
        return str(ms.database.Workload(mod).as_json()[0])

    def trials(self, kernel: Kernel) -> int:
        """How many records the logs hold for the kernel's workload (failed runs too)."""
        return self.counts.get(self._key(workload(kernel)), 0)

    def logged_workload(self, key: str) -> ms.database.Workload:
        """The workload the logs hold under ``key``, parsed."""
        obj, where = self.workloads[key]
        try:
            return ms.database.Workload.from_json(obj)
        except Exception as err:
            raise TuningLogError(f"{where}: not a MetaSchedule workload: {err}") from None

    def fastest(self, key: str, vetoed: bool = False) -> list[tuple[float, object, str]]:
        """``(mean seconds, record JSON, where)`` of a workload's measured records, fastest first;
        those a whole-pass check vetoed only with ``vetoed=True``."""
        skip = not vetoed and self.checks.has_vetoes(key)
        return [(secs, record, where) for secs, _, record, where in sorted(self.records.get(key, ()), key=lambda e: e[:2])
                if not (skip and self.checks.vetoed(key, record))]

    def candidates(self, mod: tvm.IRModule, key: str, top_k: int) -> list[tuple[float, str, object, object]]:
        """``(mean seconds, where, parse, record JSON)`` of the ``top_k`` fastest measured records of
        the workload ``mod`` (whose key is ``key``); ``parse()`` replays one (~20 ms), so only what
        is taken is."""
        fastest = self.fastest(key)[:top_k]
        if not fastest:
            return []
        logged = self.logged_workload(key)
        if not tvm_ffi.structural_equal(logged.mod, mod):  # the same hash, another module
            return []
        return [(secs, where, lambda r=record, w=where: _parse(r, logged, w), record) for secs, record, where in fastest]

    def best(self, kernel: Kernel, top_k: int):
        """The kernel's ``top_k`` fastest measured records, parsed one by one as they are taken."""
        mod = workload(kernel)
        for _, _, parse, _ in self.candidates(mod, self._key(mod), top_k):
            yield parse()


_INDEX: list = []  # [(folder, its files' stamp, LogIndex)]: the last folder cached_index read


def cached_index(folder: str) -> LogIndex:
    """The folder's :class:`LogIndex`, read once in a process while its files stay as they are
    (the same names, files, sizes and modification times; a tuning run appending records or a
    pass check changes them, and the next call reads the folder again). Builds read through it:
    reading the H100's logs took ~1 s of every build for that target (its workloads' JSON), as
    much as a small build's kernels. One folder is held (the H100's index: ~90 MB; pass tuning
    builds from a temporary mirror a candidate, which replaces it). Read-only use: the index is
    shared (:func:`scheduler` hands out copies of its records)."""
    folder = os.path.abspath(folder)
    try:
        stamp = tuple(sorted((e.name, e.inode(), e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(folder)))
    except OSError:
        return LogIndex(folder)  # (LogIndex says what is wrong with it)
    if not (_INDEX and _INDEX[0][:2] == (folder, stamp)):
        _INDEX[:] = [(folder, stamp, LogIndex(folder))]
    return _INDEX[0][2]


def records_of(db, kernel: Kernel) -> list:
    mod = workload(kernel)
    if not db.has_workload(mod):
        return []
    return [r for r in db.get_all_tuning_records() if tvm_ffi.structural_equal(r.workload.mod, mod)]


def best_latency_us(db, kernel: Kernel) -> float | None:
    mod = workload(kernel)
    if not db.has_workload(mod):
        return None
    top = db.get_top_k(db.commit_workload(mod), 1)
    if not top or not top[0].run_secs:
        return None
    secs = [float(s) for s in top[0].run_secs]
    return 1e6 * sum(secs) / len(secs)


# ---- schedules for build ----------------------------------------------------------------------
_reported: set = set()


# CPUs whose cores are the same for our kernels (ISA, vector units, caches per core): records
# tuned on one serve the other where it has none of its own. LLVM detected the GPU machine's
# Xeon as ``sapphirerapids`` on 2026-11-23 and as ``emeraldrapids`` on 2026-11-24 (Emerald Rapids
# is Sapphire Rapids' refresh: the same AVX-512/AMX cores, 2 MB of L2 each).
SAME_CORES = {"sapphirerapids": ("emeraldrapids",), "emeraldrapids": ("sapphirerapids",)}


def _folder_names(target) -> list[str]:
    """The per-target folder (or file) names whose records serve ``target``, first found first: its
    own (:func:`target_key`), a lower LLVM level's then the top level's (``llvm-x-O0``, ``llvm-x``),
    then, for a CPU, those of CPUs with the same cores and as many of them (:data:`SAME_CORES`, the
    top level's)."""
    key = target_key(target)
    top = target_key(target, with_level=False)  # a lower LLVM level's builds: records are schedules, good at any level
    names = [key] + ([top] if top != key else [])
    if target.kind.name == "llvm":
        mcpu = str(target.attrs.get("mcpu", "generic"))
        names += [top.replace(f"llvm-{mcpu}", f"llvm-{other}", 1) for other in SAME_CORES.get(mcpu, ())]
    return names


def same_cores(target) -> list[str]:
    """The target keys whose records serve ``target`` (:func:`_folder_names`): its own, and those of
    CPUs with the same cores."""
    return _folder_names(target)


def _warn_borrowed(target, name: str, what: str) -> None:
    """Said once: ``target`` takes records of another CPU's folder ``name`` (not its own, nor, at a
    lower LLVM level, its top level's)."""
    key = target_key(target)
    if name not in (key, target_key(target, with_level=False)) and (key, name) not in _reported:
        _reported.add((key, name))
        warnings.warn(f"tvmrnn: no {what} for {key}; using those of {name} (the same cores)",
                      UntunedWarning, stacklevel=4)


def records_off(tuning_logs) -> bool:
    """Whether a build uses no records at all: ``tuning_logs=False``, or ``TVMRNN_TUNING_LOGS=off``."""
    if tuning_logs is False:
        return True
    return tuning_logs is None and os.environ.get("TVMRNN_TUNING_LOGS", "").lower() in OFF


def logs_root(tuning_logs=None) -> str:
    """The folder of per-target raw log folders: ``tuning_logs``, else ``TVMRNN_TUNING_LOGS``, else
    :func:`default_logs_root`."""
    if tuning_logs not in (None, False):
        if not isinstance(tuning_logs, (str, os.PathLike)):
            raise TypeError(f"tuning_logs: expected None, False or a folder (str or path), got "
                            f"{type(tuning_logs).__name__}")
        return os.fspath(tuning_logs)
    value = os.environ.get("TVMRNN_TUNING_LOGS", "")
    return value if value and value.lower() not in OFF else default_logs_root()


def logs_folder(tuning_logs, target) -> str | None:
    """The folder of raw tuning logs ``build`` reads for ``target`` (see :func:`_folder_names`), or None."""
    if records_off(tuning_logs):
        return None
    root = logs_root(tuning_logs)
    for name in _folder_names(target):
        folder = os.path.join(root, name)
        if os.path.isdir(folder):
            _warn_borrowed(target, name, "tuning logs")
            return folder
    return None


def records_file(target, records_dir: str = RECORDS_DIR) -> str | None:
    """The shipped records file for ``target`` (see :func:`_folder_names`), or None."""
    for name in _folder_names(target):
        path = os.path.join(records_dir, name + ".jsonl")
        if os.path.exists(path):
            _warn_borrowed(target, name, "shipped records")
            return path
    return None


def tuned_options(config, target, tuning_logs, options):
    """``options`` with the pass-level choices that a whole-pass tuning measured best for
    ``config`` on ``target``, where ``options`` leave all of them to the target
    (:func:`tvmrnn.options.left_to_target`); else ``options`` as they are. The verdict comes from
    the log folder's :class:`~tvmrnn.tune.pass_checks.PassChecks`, else from the shipped records
    file's header (``pass_options``, written by :func:`distill`). With records on, a GPU build keeps
    the chunk ladder its shipped records serve (:func:`records_ladder`) where ``options`` leave it."""
    if records_off(tuning_logs):
        return options
    if not left_to_target(options):
        return records_ladder(config, target, options)
    key = config_key(config)
    folder = logs_folder(tuning_logs, target)
    verdict = PassChecks(folder).options_for(key) if folder else None
    where = os.path.join(folder, "pass_checks.json") if verdict is not None else None
    if verdict is None:
        path = records_file(target)
        verdict = _records_header(path).get("pass_options", {}).get(key) if path else None
        where = path
    if verdict and verdict.get("options"):
        try:
            options = with_tuned_fields(options, verdict["options"])
        except (TypeError, ValueError) as err:
            raise TuningLogError(f"{where}: options of {verdict.get('describe')}: {err}") from None
    return records_ladder(config, target, options)


def records_ladder(config, target, options):
    """``options`` with the GPU chunk ladder that the shipped records were tuned for, where they hold
    this configuration's 4-step input projection and neither its 16- nor its 8-step one: a few-row
    batch's default ladder (``passes.GPU_CHUNK_STEPS``; from 16 rows ``GPU_MID_CHUNK_STEPS``, v78)
    has had 16- and 8-step chunks since v69, and
    the records made before (the Deep Speech 2 sizes, N = 20) serve ``passes.GPU_SHORT_CHUNK_STEPS``,
    so those builds keep every kernel tuned rather than run two chunk sizes on default schedules."""
    path = records_file(target) if is_gpu(target) and options.chunk_steps is None else None
    if path is None or chunk_steps(target, options, config.batch_size) not in (GPU_CHUNK_STEPS, GPU_MID_CHUNK_STEPS):
        return options
    stat = os.stat(path)
    names = _recorded_kernels(path, stat.st_size, stat.st_mtime_ns)
    n, i, h, g = config.batch_size, config.input_size, config.hidden_size, config.cell.num_gates

    def recorded(steps):
        return f"input_projection_t{steps}_n{n}_k{i}_h{h}_g{g}" in names
    if recorded(4) and not recorded(16) and not recorded(8):
        return dataclasses.replace(options, chunk_steps=GPU_SHORT_CHUNK_STEPS)
    return options


@functools.lru_cache(maxsize=8)
def _recorded_kernels(path: str, size: int, mtime_ns: int) -> frozenset:
    """The kernel names of a records file's workloads, read once per file version (``size`` and
    ``mtime_ns`` key it): :func:`records_ladder` asks at every few-row GPU build, cache hits included,
    and parsing the shipped file takes 15-130 ms."""
    return frozenset(entry.get("kernel") for entry in RecordDatabase(path).entries.values())


def with_tuned_fields(options, fields: dict):
    """``options`` with the pass-level fields of an options verdict (``fields``: JSON values, as
    ``pass_checks.json`` holds them) in place of its own; the verdict's other keys are ignored."""
    fields = {k: v for k, v in fields.items() if k in TUNED_FIELDS}
    chosen = BuildOptions.from_dict(fields)
    return dataclasses.replace(options, **{k: getattr(chosen, k) for k in fields})


def _records_header(path: str) -> dict:
    """A shipped records file's first line (:class:`RecordDatabase` reads the whole file)."""
    for number, obj in _read_lines(path):
        return obj if isinstance(obj, dict) else {}
    return {}


def workload_key(kernel: Kernel) -> str:
    """The kernel's workload as records are keyed: MetaSchedule's structural hash of :func:`workload`."""
    return LogIndex._key(workload(kernel))


class RecordDatabase:
    """A compact records file (``tvmrnn/records/<target>.jsonl``, made by :func:`distill`).

    Its first line is a header (format, version, target, how it was made); each other line is one
    workload: ``{"workload": key, "kernel": name or null, "trials": n, "records": [{"us": mean
    microseconds, "origin": "default" | "variant" | "searched" | "fixed" (:func:`record_origin`), "record": MetaSchedule's
    record JSON}, ...]}``, fastest first. A record is replayed on the kernel's own workload
    (:func:`workload`), which hashes to the key."""

    def __init__(self, path: str):
        self.path = path
        self.header: dict = {}
        self.entries: dict[str, dict] = {}
        for number, obj in _read_lines(path):
            where = f"{path}:{number}"
            if number == 1:
                if not (isinstance(obj, dict) and obj.get("format") == RECORDS_FORMAT):
                    raise TuningLogError(f"{where}: not a tvmrnn records file (no {RECORDS_FORMAT!r} header)")
                if obj.get("version") != RECORDS_VERSION:
                    raise TuningLogError(f"{where}: records format version {obj.get('version')!r}; this tvmrnn reads "
                                         f"{RECORDS_VERSION}")
                self.header = obj
                continue
            try:
                self.entries[str(obj["workload"])] = {**obj, "where": where}
            except (TypeError, KeyError):
                raise TuningLogError(f"{where}: not a workload line (no 'workload' key)") from None

    def candidates(self, key: str) -> list[tuple[float, str, object]]:
        """``(mean seconds, where, record JSON)`` of a workload's records, fastest first."""
        entry = self.entries.get(key)
        if not entry:
            return []
        return [(float(r["us"]) * 1e-6, f"{entry['where']} #{i}", r["record"]) for i, r in enumerate(entry["records"])]



def record_from_json(record_json, logged: ms.database.Workload) -> ms.database.TuningRecord:
    """A tuning record from its JSON (``[trace, run_secs, target, args_info]``), its trace replayed
    on a fresh copy of the workload. MetaSchedule's ``TuningRecord.from_json`` replays it on the
    workload's own module, which TVM's schedule edits in place where nothing else refers to its
    statements: a template-space trace (its decisions annotated on the root block) left the loops
    it made there, and every later record of that workload failed to replay."""
    trace_json, run_secs, target, args = record_json
    from ..schedules import bf16, tensor_cores
    text = json.dumps(trace_json)
    bf16.register_from_trace(text)  # the AMX intrinsics it names (one per shape)
    if any(f"tvmrnn_{kind}_" in text for kind in tensor_cores.OPERANDS):  # the tensor-core tiles'
        tensor_cores.register()  # (registered when first used)
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(logged.mod["main"])}))
    Trace.apply_json_to_schedule(trace_json, sch)
    return ms.database.TuningRecord(sch.trace, logged, [float(x) for x in run_secs] if run_secs is not None else None,
                                    tvm.target.Target(target), [ms.arg_info.ArgInfo.from_json(a) for a in args])


def _parse(record_json, logged: ms.database.Workload, where: str):
    try:
        return record_from_json(record_json, logged)
    except Exception as err:
        raise TuningLogError(f"{where}: not a MetaSchedule tuning record: {err}") from None


def replay(record, mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    """The workload ``mod`` scheduled by a record's trace, on a fresh copy of it (``s_tir.Schedule``
    edits the statements of the module it is given in place)."""
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod["main"]


def distill(folder: str, target, out_path: str, kernels=(), keep: int = 1, made_by: str = "",
            out=None) -> dict:
    """Write the compact records file ``out_path`` from the raw logs in ``folder``: each workload's
    ``keep`` fastest records that the sequence driver can embed (:func:`embeddable`; every CPU
    record is), with the trial count, and the kernel name for workloads of ``kernels`` (the
    kernels whose workloads the logs may hold: names make ``tvmrnn-tune --list`` readable).
    Workloads whose records all fail are left out, and so are records a whole-pass check vetoed;
    the header carries the folder's pass-level option verdicts (``pass_options``, by
    configuration). The file is rewritten whole, atomically.

    Returns ``{"workloads": n, "records": n, "trials": n}``."""
    logs = LogIndex(folder)
    target = tvm.target.Target(target) if isinstance(target, (str, dict)) else target
    named = {}
    for kernel in kernels:
        named.setdefault(workload_key(kernel), kernel)
    lines, kept = [], 0
    for key in sorted(logs.records):
        logged = logs.logged_workload(key)
        seeded = seeded_traces(named[key], target) if key in named else None
        chosen = []
        for secs, record_json, where in logs.fastest(key):
            if len(chosen) == keep:
                break
            if is_gpu(target) and not embeddable(replay(_parse(record_json, logged, where), logged.mod), target):
                continue
            chosen.append({"us": round(secs * 1e6, 3), "origin": record_origin(record_json, seeded), "record": record_json})
        if chosen:
            kept += len(chosen)
            lines.append({"workload": key, "kernel": named[key].name if key in named else None,
                          "trials": logs.counts.get(key, 0),
                          "records": chosen})
    header = {"format": RECORDS_FORMAT, "version": RECORDS_VERSION, "target": target_key(target),
              "made": time.strftime("%Y-%m-%d"), "made_by": made_by or "tvmrnn-tune --distill",
              "from": os.path.basename(os.path.normpath(folder)), "runs": len(list(_log_runs(folder))),
              "workloads": len(lines), "records": kept}
    chosen = {}  # each configuration's latest option verdict (tvmrnn.runtime.pass_tuning), for tuned_options
    for verdict in logs.checks.options:
        chosen[verdict["config"]] = {"options": verdict.get("options", {}), "describe": verdict.get("describe")}
    if chosen:
        header["pass_options"] = chosen
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + f".tmp{os.getpid()}"
    with open(tmp, "w") as f:
        for obj in [header, *lines]:
            f.write(json.dumps(obj, separators=(",", ":")) + "\n")
    os.replace(tmp, out_path)
    if out:
        out(f"{out_path}: {len(lines)} workloads, {kept} records from {header['runs']} runs in {folder}")
    return {"workloads": len(lines), "records": kept, "trials": sum(logs.counts.values())}


ORIGINS = ("default", "variant", "searched", "fixed")


def _instructions(record_json) -> list:
    """A MetaSchedule record's trace instructions (its JSON: ``[[instructions, decisions], ...]``)."""
    try:
        return list(record_json[0][0])
    except (TypeError, IndexError, KeyError):
        return []


def seeded_traces(kernel: Kernel, target) -> tuple[list, list]:
    """What :func:`record_origin` compares a record with: the trace instructions (as JSON) of the
    kernel's default schedule and of each listed variant applied directly (as tuning seeded tasks
    before the template spaces), and the knob settings tuning seeds its template space with
    (:func:`tvmrnn.schedules.knobs.seeded_settings`), the default first in each."""
    traces = []
    for tiles in variants(kernel, target):
        sch = tvm.s_tir.Schedule(workload(kernel))
        try:
            apply(sch, kernel, target, **tiles)
        except Exception:  # noqa: BLE001 - a variant that does not apply to this kernel seeds nothing
            traces.append(None)
            continue
        traces.append(_plain(sch.trace.as_json())[0])
    return traces, seeded_settings(kernel, target)


def _plain(obj):
    """A trace's JSON (TVM arrays, integers and strings) as plain Python values."""
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if isinstance(obj, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return obj.value
    if isinstance(obj, dict) or hasattr(obj, "items"):
        return {str(k): _plain(v) for k, v in obj.items()}
    if hasattr(obj, "__iter__"):
        return [_plain(v) for v in obj]
    return str(obj)


def record_origin(record_json, seeded: tuple | None = None) -> str:
    """Where a record came from. A template-space record (its trace decides knob values,
    :mod:`tvmrnn.schedules.knobs`) is ``default`` or ``variant`` where its setting is the default's
    or a listed variant's, ``fixed`` where it is one of those but for a knob added since whose
    AUTO changed the schedule (:data:`tvmrnn.schedules.knobs.VALUES_BEFORE`; also where that knob's
    rule happens to keep the old tile), else ``searched``. Another record is ``searched`` where its trace samples
    decisions (MetaSchedule's own rules made it), ``default`` or ``variant`` where its trace is
    today's default schedule's or a listed variant's, else ``fixed`` (an older default or variant).
    ``seeded`` (:func:`seeded_traces`): today's plain traces and knob settings, default first; without it
    (a workload whose kernel is not named) a record is ``searched`` or ``fixed`` by its trace alone."""
    traces, settings = seeded if seeded is not None else ([], None)
    values = knob_values_json(record_json[0]) if isinstance(record_json, list) and record_json else None
    if values is not None:
        if settings is None:
            return "fixed"
        # a knob added since the record was made has its default there (each new knob's default is
        # the schedule as it was: stage_pad, v51), or the value that was (VALUES_BEFORE): a record
        # that is today's default or a variant but for such a knob is an older one
        made = {k: v for k, v in VALUES_BEFORE.items() if k in settings[0] and k not in values}
        values = {**settings[0], **values}
        for i, setting in enumerate(settings):
            if setting == {**values, **made}:
                return "default" if i == 0 else "variant"
        if made and values in settings:
            return "fixed"
        return "searched"
    instructions = _instructions(record_json)
    if any(str(inst[0]).startswith("Sample") for inst in instructions if inst):
        return "searched"
    mine = _normal(instructions)
    for i, trace in enumerate(traces):
        if trace is not None and _normal(trace) == mine:
            return "default" if i == 0 else "variant"
    return "fixed"


def _normal(value):
    """A trace's JSON in one spelling: a log's ``1``/``0`` and a fresh trace's ``True``/``False``
    alike, and embedded JSON (index maps) compact whatever its indentation."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value[:1] in "{[":
        try:
            return json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
        except ValueError:
            return value
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


def embeddable(func, target) -> bool:
    """Whether the sequence driver can run this scheduled kernel at every step.

    On a GPU an intermediate in global memory (the partial sums of a reduction split over
    blocks, or MetaSchedule's two-launch schedules of the fused step) must be allocated by the
    root block: the driver allocates those once, at its top (:class:`tvmrnn.program.sequence.Program`).
    One allocated deeper would not lower inside the driver's loops, so ``build`` takes the best
    record without one.
    """
    if not is_gpu(target):
        return True
    scopes = []

    def visit(block, mutator):
        if block.name_hint != "root":
            scopes.extend(b.scope() for b in block.alloc_buffers)
        return mutator.default_mutate(block)  # and the blocks inside it (a callback's result is not descended into)

    tvm_ffi.structural_mutate(func.body, [(tvm.s_tir.SBlock, visit)])
    # and whose launch would not fail for its shared memory (a searched persistent step with 50 KB
    # of static shared memory ran in its step loop, and failed the build's check)
    return all(scope != "global" for scope in scopes) and shared_memory_problem(
        func, target, _shared_bytes_when_lowered(func, target)) is None


def _shared_bytes_when_lowered(func, target) -> tuple[int, int]:
    """``(static, dynamic)`` shared memory bytes a scheduled kernel will have once lowered: its
    buffers cut to the regions used (a shared tile is declared over the whole operand until
    then), and where that comes near the limits, counted after TVM's TIR pipeline (padded rows,
    double buffers of a software pipeline: a searched tiled GEMM came to 51,200 bytes of static
    shared memory so, against 49,152 before them)."""
    from tvm.s_tir import transform as st
    mod = tvm.transform.Sequential([st.LowerCrossThreadReduction(), st.LowerInitBlock(),
                                    st.PlanAndUpdateBufferAllocationLocation(), st.ConvertBlocksToOpaque(),
                                    st.CompactBufferAllocation()])(tvm.IRModule({"main": s_tir.renew_defs(func)}))
    static, dynamic = shared_memory_bytes(mod["main"])  # (passes edit a function nothing else holds in place: copies)
    if static + dynamic < SHARED_WITHOUT_OPT_IN // 2:
        return static, dynamic
    base, _, _ = tvm.tirx.get_tir_pipeline("s_tir")
    target = tvm.target.Target(target)
    if target.host is None:  # (without one, the kernel stays in a device-only "main" that MakePackedAPI
        # skips, and on targets without fp8, sm_80's, FP8StorageLegalize then raised: the check refused
        # every large-shared-memory candidate there; the host does not change the device's bytes)
        target = tvm.target.Target(target, host="llvm")
    with target:
        lowered = base(tvm.IRModule({"main": s_tir.renew_defs(func).with_attr("target", target)}))
    # (a target with a host splits the kernel out of "main": the largest of the module's functions)
    return max((shared_memory_bytes(f) for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)),
               key=sum)


def as_built(kernel: Kernel, target, allow_tf32: bool, tf32_steps: bool, operands: tuple = ("tf32", "tf32")) -> Kernel:
    """The kernel a build with these choices schedules for ``kernel``: its tensor-core workload
    (:func:`kernels.tf32`) where it runs on tensor cores (:func:`tvmrnn.schedules.cuda.tf32_applies`),
    else ``kernel``. A forward kernel's operands are ``operands[0]`` for a GEMM over all steps,
    ``operands[1]`` for a step (:attr:`BuildOptions.tensor_core_operands`), a backward kernel's
    TF32. :func:`scheduler` and tuning's tasks (:func:`tvmrnn.tune.tasks.extract_tasks`) ask it."""
    use = tf32_applies(kernel, target, steps=tf32_steps) if allow_tf32 else None
    if use is None:
        return kernel
    if reads_gradients(kernel):
        return tf32(kernel)
    return tf32(kernel, operands[1] if use == "step" else operands[0])


def scheduler(target: tvm.target.Target, tuning_logs=None, allow_tf32: bool = False, tf32_steps: bool = False,
              operands: tuple = ("tf32", "tf32")):
    """``kernel -> scheduled PrimFunc``: the fastest record of the kernel's workload among the raw
    logs (:func:`logs_folder`) and the shipped records (:func:`records_file`) that the driver can
    embed and that no whole-pass check vetoed (:mod:`.pass_checks`), else the default schedule.
    With ``allow_tf32``, the GPU's all-steps GEMMs become tensor-core workloads (:func:`kernels.tf32`;
    ``operands`` as :func:`as_built`),
    and with ``tf32_steps`` too (``BuildOptions.tensor_core_steps``) the large steps launched one
    a step (:func:`tvmrnn.schedules.cuda.tf32_applies`).

    Returns the function and two dicts it fills: kernel name -> "tuned", "default", "tf32" (a tensor-core
    kernel's default schedule, where it has no record) or "unmasked record" (a masked step
    of a variable-lengths build, scheduled by its unmasked twin's record: :attr:`Kernel.unmasked`);
    and kernel name -> the record used (``{"workload": key, "where": file and line, "record":
    its JSON}``), for the kernels that took one.
    """
    folder = logs_folder(tuning_logs, target)
    logs = cached_index(folder) if folder else None
    checks = logs.checks if logs is not None else PassChecks(None)
    path = None if records_off(tuning_logs) else records_file(target)
    shipped = RecordDatabase(path) if path else None
    used: dict[str, str] = {}
    picked: dict[str, dict] = {}

    def schedule(kernel: Kernel):
        built = as_built(kernel, target, allow_tf32, tf32_steps, operands)
        on_tensor_cores, kernel = built is not kernel, built
        func = pick(kernel)
        if on_tensor_cores and used[kernel.name] == "default":
            used[kernel.name] = "tf32"
        if is_gpu(target):
            return fast_math.nan_propagating(fast_math.accurate_tanh(func))
        if kernel.name.startswith(("recurrent_step", "projection_step", "projected_recurrent_backward",
                                   "input_projection", "input_gradient")):
            # a masked step's tasks skip their GEMM where all their rows have ended (or had, at the
            # step whose gate gradients the recurrent backward reads: zeros there); so do a masked
            # chunk's input projection and input gradient (kernels._ended_rows_mask)
            func = ended_rows.skip_ended_rows(func, kernel.gemm)
        elif kernel.name.startswith("backward_step"):  # ... where all their rows had ended at the GEMM's step
            func = ended_rows.skip_ended_rows(func, kernel.gemm, mask="gemm_mask")
        elif kernel.name.startswith("weight_gradient"):  # a masked chunk's: its ended rows' products (zero)
            func = ended_rows.skip_ended_reduction_rows(func, kernel.gemm)
        return fast_math.vectorisable(fast_math.nan_propagating(func))

    def candidates(mod):
        key = LogIndex._key(mod)
        found = []
        if logs is not None:
            found += [(secs, where, parse, key, record_json)
                      for secs, where, parse, record_json in logs.candidates(mod, key, 16)]
        if shipped is not None:
            own = ms.database.Workload(mod)
            vetoes = checks.has_vetoes(key)
            found += [(secs, where, lambda j=record_json, w=where: _parse(j, own, w), key, record_json)
                      for secs, where, record_json in shipped.candidates(key)
                      if not (vetoes and checks.vetoed(key, record_json))]
        return sorted(found, key=lambda c: c[0])  # raw logs give at most 16

    def take(kernel, how, func, key, where, record_json):
        used[kernel.name] = how
        # (a copy: the JSON is the log index's, which later builds of this process read: cached_index)
        picked[kernel.name] = {"workload": key, "where": where, "record": copy.deepcopy(record_json)}
        return func

    def pick(kernel: Kernel):
        if logs is not None or shipped is not None:
            mod = workload(kernel)
            for _, where, parse, key, record_json in candidates(mod):
                func = replay(parse(), mod)
                if embeddable(func, target):
                    return take(kernel, "tuned", func, key, where, record_json)
            # a masked step (variable lengths) without records of its own: its unmasked twin's,
            # replayed on it (the same blocks; the mask only changes the epilogue's expressions)
            if kernel.unmasked is not None:
                for _, where, parse, key, record_json in candidates(workload(kernel.unmasked)):
                    try:
                        func = replay(parse(), mod)
                    except Exception:  # noqa: BLE001 - a trace that does not fit this kernel: the next
                        continue
                    if embeddable(func, target):
                        return take(kernel, "unmasked record", func, key, where, record_json)
        used[kernel.name] = "default"
        return default_schedule(kernel, target)

    return schedule, used, picked


def report_untuned(target, used: dict) -> None:
    """Say once per target and set of kernels that default schedules are in use."""
    missing = sorted(k for k, how in used.items() if how in ("default", "tf32"))
    key = (target_key(target), tuple(missing))
    if missing and key not in _reported:
        _reported.add(key)
        warnings.warn(f"tvmrnn: {len(missing)} of {len(used)} kernels have no tuning record for "
                      f"{target_key(target)}; they use default schedules (tvmrnn-tune tunes them)",
                      UntunedWarning, stacklevel=3)
