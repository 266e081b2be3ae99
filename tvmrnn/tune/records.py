"""TODO"""
from __future__ import annotations

import glob
import json
import os
import warnings
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from ..schedules import fast_math
from tvm import s_tir
from ..schedules import default_schedule
from ..schedules.common import is_gpu
from ..schedules.cuda import tf32_applies
from ..kernels import Kernel, tf32




DEFAULT_LOGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tuning_logs")


class TuningLogError(ValueError):
    """A tuning log that cannot be read: names the file and line."""


class UntunedWarning(UserWarning):
    """Some kernels of a build had no tuning record for the target and use default schedules."""


def target_key(target: tvm.target.Target) -> str:
    """The log folder name of a target: ``cuda-sm_90``, ``llvm-sapphirerapids-16c``.

    ``sm_90a`` (the H100 tag's arch) and ``sm_90`` (what the driver reports) share a folder: the
    tuned kernels use no arch-specific ("a") features.
    """
    if target.kind.name == "cuda":
        return f"cuda-{str(target.attrs['arch']).rstrip('a')}"
    mcpu = str(target.attrs.get("mcpu", "generic"))
    cores = target.attrs.get("num-cores")
    return f"llvm-{mcpu}" + (f"-{int(cores)}c" if cores else "")


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
    """(line number, parsed JSON) of each complete line; a truncated last line is skipped."""
    with open(path, "rb") as f:
        data = f.read()
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
    """Each tuning run's ``(workload file, record file or None)`` in a log folder, in name order."""
    for workload_path in sorted(glob.glob(os.path.join(folder, "*_workload.json"))):
        record_path = workload_path[: -len("_workload.json")] + "_tuning_record.json"
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
                db.commit_tuning_record(ms.database.TuningRecord.from_json(record, workloads[index]))
            except Exception as err:
                raise TuningLogError(f"{record_path}:{number}: not a MetaSchedule tuning record "
                                     f"for a workload of {os.path.basename(workload_path)}: {err}") from None
    return db


class LogIndex:
    """A log folder's records read as JSON lines and parsed only when a kernel asks for them
    (:func:`scheduler`, ``scripts/schedules.py``): parsing a record replays its trace on its
    workload, ~20 ms a record, so loading a whole folder cost a build ~33 s for the H100's 1,598
    records, most of them for kernels the build does not have. Lines that are not JSON, or not
    ``[workload, record]`` pairs, raise :class:`TuningLogError` here; a record that does not
    replay raises it when asked for."""

    def __init__(self, folder: str):
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

    def best(self, kernel: Kernel, top_k: int):
        """The kernel's ``top_k`` fastest measured records, parsed one by one as they are taken."""
        mod = workload(kernel)
        key = self._key(mod)
        entries = self.records.get(key)
        if not entries:
            return
        obj, where = self.workloads[key]
        try:
            logged = ms.database.Workload.from_json(obj)
        except Exception as err:
            raise TuningLogError(f"{where}: not a MetaSchedule workload: {err}") from None
        if not tvm_ffi.structural_equal(logged.mod, mod):  # the same hash, another module
            return
        for _, _, record, where in sorted(entries, key=lambda e: e[:2])[:top_k]:
            try:
                yield ms.database.TuningRecord.from_json(record, logged)
            except Exception as err:
                raise TuningLogError(f"{where}: not a MetaSchedule tuning record: {err}") from None


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


def logs_folder(tuning_logs, target) -> str | None:
    """The folder of tuning logs ``build`` reads for ``target``: its own (:func:`target_key`),
    else, for a CPU, that of a CPU with the same cores and as many of them (:data:`SAME_CORES`)."""
    if tuning_logs is False:
        return None
    root = tuning_logs if tuning_logs is not None else os.environ.get("TVMRNN_TUNING_LOGS", DEFAULT_LOGS)
    key = target_key(target)
    candidates = [key]
    if target.kind.name == "llvm":
        mcpu = str(target.attrs.get("mcpu", "generic"))
        candidates += [key.replace(f"llvm-{mcpu}", f"llvm-{other}", 1) for other in SAME_CORES.get(mcpu, ())]
    for name in candidates:
        folder = os.path.join(root, name)
        if os.path.isdir(folder):
            if name != key and (key, name) not in _reported:
                _reported.add((key, name))
                warnings.warn(f"tvmrnn: no tuning logs for {key}; using those of {name} (the same cores)",
                              UntunedWarning, stacklevel=3)
            return folder
    return None


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
        return block

    tvm_ffi.structural_mutate(func.body, [(tvm.s_tir.SBlock, visit)])
    return all(scope != "global" for scope in scopes)


def scheduler(target: tvm.target.Target, tuning_logs=None, allow_tf32: bool = False):
    """``kernel -> scheduled PrimFunc``: the best logged schedule, else the default one. With
    ``allow_tf32``, the GPU's all-steps GEMMs become TF32 workloads (:func:`kernels.tf32`).

    Returns the function and a dict it fills: kernel name -> "tuned", "default" or "tf32" (a TF32
    kernel's default schedule: none of them has records yet).
    """
    folder = logs_folder(tuning_logs, target)
    logs = LogIndex(folder) if folder else None
    used: dict[str, str] = {}

    def schedule(kernel: Kernel):
        on_tensor_cores = allow_tf32 and tf32_applies(kernel, target)
        if on_tensor_cores:
            kernel = tf32(kernel)
        func = pick(kernel)
        if on_tensor_cores and used[kernel.name] == "default":
            used[kernel.name] = "tf32"
        return func if is_gpu(target) else fast_math.vectorisable(func)

    def pick(kernel: Kernel):
        if logs is not None:
            for record in logs.best(kernel, 16):
                sch = tvm.s_tir.Schedule(workload(kernel))
                record.trace.apply_to_schedule(sch, remove_postproc=False)
                func = sch.mod["main"]
                if embeddable(func, target):
                    used[kernel.name] = "tuned"
                    return func
        used[kernel.name] = "default"
        return default_schedule(kernel, target)

    return schedule, used


def report_untuned(target, used: dict) -> None:
    """Say once per target and set of kernels that default schedules are in use."""
    missing = sorted(k for k, how in used.items() if how == "default")
    key = (target_key(target), tuple(missing))
    if missing and key not in _reported:
        _reported.add(key)
        warnings.warn(f"tvmrnn: {len(missing)} of {len(used)} kernels have no tuning record for "
                      f"{target_key(target)}; they use default schedules (scripts/tune.py tunes them)",
                      UntunedWarning, stacklevel=3)
