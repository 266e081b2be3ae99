"""Tuning with MetaSchedule: tasks from a build's kernels, logs per target, schedules from logs.

* :func:`extract_tasks` turns every kernel a configuration uses into one MetaSchedule task;
  kernels with the same name have the same workload (the name encodes every shape), so a
  kernel shared by layers, directions or passes is tuned once. Each task is weighted by how
  often it runs in one training step at a reference sequence length.
* Logs live in one folder per target (:func:`target_key`). A tuning run never touches existing
  files: it appends to a new pair of MetaSchedule JSON files of its own (``<run>_workload.json``,
  ``<run>_tuning_record.json``). Reading tolerates a truncated last line (a killed run) and
  stops with the file and line of anything else that does not parse.
* :func:`scheduler` gives ``build`` the best logged schedule of each kernel, or the default one.
"""
from __future__ import annotations

import functools
import glob
import json
import os
import time
import warnings
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from . import fast_math, spaces
from .default_schedule import apply as default_schedule_apply
from .default_schedule import default_schedule, is_gpu, persistent_blocks, tf32_applies
from .default_schedule import variants as default_variants
from .kernels import Kernel, tf32
from .passes import all_programs
from .sequence import STEP_LOOP_STEPS, step_loop
from .target import persistent_blocks as target_persistent_blocks

REFERENCE_LENGTH = 300  # Deep Speech 2's T: the sequence length task weights are counted at
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


def workload(kernel: Kernel) -> tvm.IRModule:
    """The module MetaSchedule tunes and looks up for a kernel (one definition for both).

    A fresh copy each time: ``s_tir.Schedule`` edits the statements of the module it is given
    in place, and they would otherwise be shared with ``kernel.func``.
    """
    func = tvm.s_tir.renew_defs(spaces.prepare(kernel))
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


@derived_object
class LogDatabase(ms.database.PyDatabase):
    """What MetaSchedule tunes against: all old records (read-only) + this run's new file pair."""

    def __init__(self, folder: str):
        super().__init__()
        os.makedirs(folder, exist_ok=True)
        self.memory = load_records(folder)
        self.folder, self._writer = folder, None

    @property
    def writer(self):
        """This run's own pair of files, created at its first record (reruns with nothing to do add none)."""
        if self._writer is None:
            run = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
            self._writer = ms.database.JSONDatabase(os.path.join(self.folder, f"{run}_workload.json"),
                                                    os.path.join(self.folder, f"{run}_tuning_record.json"))
        return self._writer

    def has_workload(self, mod):
        return self.memory.has_workload(mod)

    def commit_workload(self, mod):
        self.writer.commit_workload(mod)
        return self.memory.commit_workload(mod)

    def commit_tuning_record(self, record):
        self.writer.commit_workload(record.workload.mod)
        self.writer.commit_tuning_record(record)
        self.memory.commit_tuning_record(record)

    def get_top_k(self, workload, top_k):
        return self.memory.get_top_k(workload, top_k)

    def get_all_tuning_records(self):
        return self.memory.get_all_tuning_records()

    def __len__(self):
        return len(self.memory)


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


# ---- tasks ------------------------------------------------------------------------------------
@dataclass
class Task:
    kernel: Kernel
    calls: int  # runs per training step (forward_train + backward) and inference forward, at REFERENCE_LENGTH

    @functools.cached_property
    def flops(self) -> float:
        """Floating-point operations of one call (TVM's estimate from the kernel's loops)."""
        try:
            return float(tvm.s_tir.analysis.estimate_tir_flops(workload(self.kernel)))
        except Exception:  # an estimate only: a kernel it cannot read ranks by its calls alone
            return 0.0


def rank_tasks(tasks: list[Task], db=None) -> list[Task]:
    """Tasks by their share of a training step, largest first: where trials should go.

    A task the log has measured counts its calls x best latency; one it has not, its calls x its
    FLOPs at the rate (FLOP/s) of the measured tasks together, or with none measured its calls x
    FLOPs alone. Per-step kernels run hundreds of times, each all-steps GEMM a few times but
    hundreds of times longer, so the count of calls alone ranks the GEMMs far too low.
    """
    measured = {id(t): best_latency_us(db, t.kernel) if db is not None else None for t in tasks}
    done = [t for t in tasks if measured[id(t)] and t.flops]
    # FLOP per us over the measured tasks together: the big GEMMs' rate, which is what the
    # unmeasured tasks with many FLOPs (GEMMs of other shapes) are likely to run at
    rate = sum(t.flops for t in done) / sum(measured[id(t)] for t in done) if done else None

    def cost(t):
        if measured[id(t)]:
            return t.calls * measured[id(t)]
        if rate:
            return t.calls * max(t.flops / rate, 1.0)  # at least a microsecond a call
        return t.calls * max(t.flops, 1.0)

    return sorted(tasks, key=lambda t: -cost(t))


def select_tasks(configs, target, kernels=None, max_tasks=None, db=None) -> list[Task]:
    """The tasks of ``configs`` on ``target`` that :func:`tune` works on, in its order: those whose
    name contains one of ``kernels`` (None: all), ranked by :func:`rank_tasks`, the first ``max_tasks``."""
    tasks = [t for t in extract_tasks(configs, target=target)
             if kernels is None or any(k in t.kernel.name for k in kernels)]
    return rank_tasks(tasks, db)[:max_tasks]


def extract_tasks(configs, length: int = REFERENCE_LENGTH, target=None) -> list[Task]:
    """One task per distinct kernel over all ``configs``, weighted by runs per step at ``length``.

    ``target`` picks the programs as build does (``passes.all_programs``: chunk sizes, direction
    stacking, and on GPUs the persistent time loops, whose step kernel is a task of its own:
    :func:`is_persistent`).
    """
    tasks: dict[str, Task] = {}
    target = tvm.target.Target(target) if isinstance(target, (str, dict)) else target
    blocks = target_persistent_blocks(target) if target is not None and is_gpu(target) else None

    def schedule(kernel):  # a persistent loop is decided by its step's schedule (weights on chip)
        return default_schedule(kernel, target) if persistent_blocks(kernel.func) else kernel.func

    for config in configs:
        for program in all_programs(config, schedule, target, blocks):
            for name, count in program.calls(length).items():
                task = tasks.setdefault(name, Task(program.kernels[name], 0))
                task.calls += count
    return sorted(tasks.values(), key=lambda t: -t.calls)


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
    root block: the driver allocates those once, at its top (:class:`tvmrnn.sequence.Program`).
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


# ---- tuning -----------------------------------------------------------------------------------
def import_tensor_intrinsics() -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (which ``ms.TuneContext`` imports on first use) fast.

    Its modules define ~500 TVMScript functions at import time; each ``@T.prim_func`` walks the
    caller's frames with ``inspect``, which looks up each frame's module. For the import
    machinery's frames (``<frozen importlib._bootstrap>``: no file on disk) that lookup misses
    ``inspect``'s file-to-module cache and scans all of ``sys.modules`` every time: with PyTorch
    loaded, 141 s of a 156 s tiny tuning run on the 2-core dev machine (v17 saw 74 s without it).
    Entering those two frozen modules in the cache (``inspect.modulesbyfile``, where ``inspect``
    itself would put a module with a file) makes the lookup a dictionary hit; the frame records the
    parser gets are the same (their file name, and no source lines: frozen modules have none)."""
    import importlib
    import inspect
    import sys
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    for name in ("importlib._bootstrap", "importlib._bootstrap_external"):
        inspect.modulesbyfile.setdefault(f"<frozen {name}>", name)
    importlib.import_module("tvm.s_tir.tensor_intrin")


@derived_object
class PoolBuilder(ms.builder.PyBuilder):
    """MetaSchedule's LocalBuilder, but keeping its worker processes from batch to batch.

    LocalBuilder starts a fresh pool for every batch; each worker imports TVM, which on the GPU
    machine takes longer than compiling the batch (45 s for 8 candidates that compile in 1.5 s
    each). This pool is recycled every ``recycle`` batches instead (LocalBuilder's reason for
    restarting is a slow leak in long-lived workers). And a worker builds as MetaSchedule's
    ``default_build`` does, but without first importing ``tvm.s_tir.tensor_intrin``: registering
    TVM's tensor intrinsics took 74 s on the 2-core dev machine (TVM itself 5 s), and a candidate
    arrives tensorised already (none of our spaces uses them).
    """

    def __init__(self, max_workers: int, timeout_sec: float, recycle: int = 25):
        super().__init__()
        self.max_workers, self.timeout_sec, self.recycle = max_workers, timeout_sec, recycle
        self._pool, self._batches = None, 0

    def build(self, build_inputs):
        from tvm.support.popen_pool import PopenPoolExecutor, StatusKind
        from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func

        if self._pool is None or self._batches >= self.recycle:
            if self._pool is not None:
                self._pool.shutdown()
            self._pool, self._batches = PopenPoolExecutor(max_workers=self.max_workers,
                                                          timeout=self.timeout_sec), 0
        self._batches += 1
        def build(mod, target, _params):  # pickled by value: the worker needs only TVM
            from tvm.driver import build as tvm_build
            from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
            return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)

        results = []
        for r in self._pool.map_with_error_catching(
                lambda x: _worker_func(build, *x),
                [(None, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]):
            if r.status == StatusKind.COMPLETE:
                results.append(ms.builder.BuilderResult(r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                results.append(ms.builder.BuilderResult(None, f"build timed out after {self.timeout_sec} s"))
            else:
                results.append(ms.builder.BuilderResult(None, f"build failed: {r.value}"))
        return results


def default_builder(target) -> ms.builder.Builder:
    """Builder workers and timeouts that fit the machine: on 2 cores the defaults time out."""
    cores = os.cpu_count() or 1
    workers = max(1, cores - 4) if cores > 8 else max(1, cores // 2)
    return PoolBuilder(max_workers=workers, timeout_sec=120 if cores <= 4 else 60)


def is_persistent(kernel: Kernel) -> bool:
    """A persistent time loop's step kernel (:func:`tvmrnn.kernels.persistent`). Its task measures
    a candidate as that loop runs it, :data:`tvmrnn.sequence.STEP_LOOP_STEPS` steps in one launch
    (:class:`StepLoopBuilder`), and logs the time per step; its design space is the default
    schedule's listed shapes (:data:`tvmrnn.default_schedule.PERSISTENT_VARIANTS`), all of which
    :func:`seed_defaults` measures: MetaSchedule's own rules do not keep weights in shared memory
    across steps, which is what makes such a loop fast."""
    return persistent_blocks(kernel.func) is not None


class StepLoops:
    """The steps of a step loop, and the artifacts a :class:`StepLoopBuilder` built as such loops,
    for the :class:`PerStepRunner` that runs them."""

    def __init__(self, steps: int = STEP_LOOP_STEPS):
        self.steps = steps
        self.artifacts: set[str] = set()


@derived_object
class StepLoopBuilder(ms.builder.PyBuilder):
    """Builds a persistent step kernel's candidate as :func:`tvmrnn.sequence.step_loop` (its steps
    in one launch, with the kernel's own parameters, so MetaSchedule's runners call it like any
    candidate); every other candidate as it is. ``inner`` does the building."""

    def __init__(self, inner, loops: StepLoops):
        super().__init__()
        self.inner, self.loops = inner, loops

    def build(self, build_inputs):
        results: list = [None] * len(build_inputs)
        todo, looped = [], set()
        for i, b in enumerate(build_inputs):
            func = b.mod["main"]
            if persistent_blocks(func) is None:
                todo.append((i, b))
                continue
            try:
                loop = step_loop(func, b.target, self.loops.steps).with_attr("global_symbol", "main")
            except ValueError as err:
                results[i] = ms.builder.BuilderResult(None, str(err))
                continue
            looped.add(i)
            todo.append((i, ms.builder.BuilderInput(tvm.IRModule({"main": loop}), b.target, b.params)))
        for (i, _), r in zip(todo, self.inner.build([b for _, b in todo]) if todo else []):
            results[i] = r
            if i in looped and r.error_msg is None:
                self.loops.artifacts.add(str(r.artifact_path))
        return results


@derived_object
class _PerStepFuture(ms.runner.PyRunnerFuture):
    def __init__(self, inner, steps: int):
        super().__init__()
        self.inner, self.steps = inner, steps

    def done(self) -> bool:
        return self.inner.done()

    def result(self):
        r = self.inner.result()
        if r.run_secs is None:
            return r
        return ms.runner.RunnerResult([tvm.tirx.FloatImm("float64", float(s) / self.steps) for s in r.run_secs],
                                      r.error_msg)


@derived_object
class PerStepRunner(ms.runner.PyRunner):
    """Runs candidates with ``inner``; a step loop's times (:class:`StepLoopBuilder`) are divided by
    its steps, so a persistent task logs seconds per step, as the per-step kernels' tasks do."""

    def __init__(self, inner, loops: StepLoops):
        super().__init__()
        self.inner, self.loops = inner, loops

    def run(self, runner_inputs):
        futures = self.inner.run(runner_inputs)
        return [_PerStepFuture(f, self.loops.steps) if str(r.artifact_path) in self.loops.artifacts else f
                for r, f in zip(runner_inputs, futures)]


def default_runner(target, rpc_tracker: str | None = None, rpc_key: str | None = None):
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20 if is_gpu(target) else 40,
                                          enable_cpu_cache_flush=False)
    if rpc_tracker:
        host, _, port = rpc_tracker.rpartition(":")
        config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=rpc_key,
                                     session_timeout_sec=120)
        return ms.runner.RPCRunner(config, evaluator_config=evaluator)
    return ms.runner.LocalRunner(timeout_sec=60, evaluator_config=evaluator)


@derived_object
class _Progress(ms.measure_callback.PyMeasureCallback):
    """One line per measured batch: task, trials, best latency so far, ETA."""

    def __init__(self, names, budgets, out):
        self.names, self.budgets, self.out = names, budgets, out
        self.done = [0] * len(names)
        self.best = [float("inf")] * len(names)
        self.start = time.time()

    def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
        self.done[task_id] += len(runner_results)
        for r in runner_results:
            if r.run_secs:
                us = 1e6 * sum(float(s) for s in r.run_secs) / len(r.run_secs)
                self.best[task_id] = min(self.best[task_id], us)
        total, left = sum(self.budgets), sum(self.budgets) - sum(self.done)
        elapsed = time.time() - self.start
        eta = elapsed / max(sum(self.done), 1) * max(left, 0)
        best = f"{self.best[task_id]:.1f} us" if self.best[task_id] < float("inf") else "-"
        self.out(f"[{sum(self.done)}/{total} trials, ETA {eta:.0f} s] task {task_id + 1}/{len(self.names)} "
                 f"{self.names[task_id]}: {self.done[task_id]}/{self.budgets[task_id]} trials, best {best}")


# ---- warm start -------------------------------------------------------------------------------
def _transfer(trace, mod, target, postprocs):
    """``trace`` (tuned for another shape or target) replayed on ``mod``, or None.

    Tile sizes that do not fit the new extents are re-sampled; everything else (the structure,
    thread bindings, unrolling, vector widths) is kept.
    """
    def decide(inst, inputs, attrs, decision):
        if inst.kind.name == "SamplePerfectTile" and decision is not None:
            extent = sch.get(inputs[0]).extent
            product = 1
            for f in decision:
                product *= int(f)
            if not isinstance(extent, tvm.tirx.IntImm) or product != int(extent.value):
                return None
        return decision

    sch = tvm.s_tir.Schedule(mod, seed=1)
    try:
        trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=decide)
        sch.enter_postproc()
        if not all(p.apply(sch) for p in postprocs):
            return None
    except Exception:  # the trace names blocks or loops this workload does not have
        return None
    return sch


def _measure(db, mod, candidates, target, builder, runner, times: list | None = None) -> list[str]:
    """Build and run scheduled ``candidates`` of workload ``mod``; commit a record for each (run
    times, or none for a failure). Returns the error messages; ``times`` gets each candidate's
    mean time in us (None where it failed)."""
    built = builder.build([ms.builder.BuilderInput(c.mod, target) for c in candidates])
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ok = [(c, b) for c, b in zip(candidates, built) if b.error_msg is None]
    results = [r.result() for r in runner.run([
        ms.runner.RunnerInput(b.artifact_path, "cuda" if is_gpu(target) else "cpu", args_info) for _, b in ok])]
    token = db.commit_workload(mod)
    measured = {}
    for (c, _), r in zip(ok, results):
        secs = [float(x) for x in r.run_secs] if r.error_msg is None else None
        db.commit_tuning_record(ms.database.TuningRecord(c.trace, token, secs, target, args_info))
        measured[id(c)] = 1e6 * sum(secs) / len(secs) if secs else None
    if times is not None:
        times.extend(measured.get(id(c)) for c in candidates)
    return [b.error_msg for b in built if b.error_msg] + [r.error_msg for r in results if r.error_msg]


def seed_defaults(db, tasks, target, builder, runner, out=print) -> int:
    """Measure the default schedule of every task in ``tasks`` (``tune`` passes the new ones), as
    a record like any other: the search starts from it, and ``build`` never takes a tuned record slower than the
    default it would otherwise use. Where the default has other shapes worth trying
    (:func:`tvmrnn.default_schedule.variants`: the GPU split-K's threads and tile), those are measured
    too. Returns the number of measurements."""
    measured = 0
    for task in tasks:
        mod = workload(task.kernel)
        candidates, seen, labels = [], set(), []
        for tiles in default_variants(task.kernel, target):  # the default first, then its other shapes
            sch = tvm.s_tir.Schedule(mod)
            default_schedule_apply(sch, task.kernel, target, **tiles)
            key = tvm_ffi.structural_hash(sch.mod)
            if key not in seen:  # shapes that come out the same at these sizes are measured once
                seen.add(key)
                candidates.append(sch)
                labels.append(" ".join(f"{k}={v}" for k, v in tiles.items()) or "default")
        times = []
        errors = _measure(db, mod, candidates, target, builder, runner, times)
        measured += len(candidates)
        best = best_latency_us(db.memory, task.kernel)
        shapes = (f" (best of {len(candidates)} shapes: " + ", ".join(
            f"{s} {t:.1f}" if t else f"{s} failed" for s, t in zip(labels, times)) + ")") if len(candidates) > 1 else ""
        out(f"task {task.kernel.name}: default schedule {best:.1f} us{shapes}" if best else
            f"task {task.kernel.name}: default schedule failed to run: {errors[0].strip().splitlines()[-1]}"
            if errors else f"task {task.kernel.name}: default schedule has no measurement")
    return measured


def warm_start(db, tasks, target, source: str, builder, runner, per_task: int = 8, out=print) -> int:
    """Measure, for every task without records, the best schedules logged in ``source`` (a log
    folder for another target or other shapes) that replay on it; the search then starts from
    them. Returns the number of measurements."""
    source_db = load_records(source)
    ranked = sorted((r for r in source_db.get_all_tuning_records() if r.run_secs),
                    key=lambda r: sum(float(s) for s in r.run_secs) / len(r.run_secs))
    measured = 0
    for task in tasks:
        mod = workload(task.kernel)
        if records_of(db.memory, task.kernel):
            continue
        import_tensor_intrinsics()
        context = ms.TuneContext(mod, target=target, space_generator=spaces.space_generator(task.kernel, target),
                                 search_strategy="evolutionary", task_name=task.kernel.name, num_threads=1)
        postprocs = context.space_generator.postprocs
        candidates, seen = [], set()
        for record in ranked:
            sch = _transfer(record.trace, mod, target, postprocs)
            if sch is None:
                continue
            key = str(sch.trace.simplified(remove_postproc=True))
            if key not in seen:
                seen.add(key)
                candidates.append(sch)
            if len(candidates) >= per_task:
                break
        if not candidates:
            continue
        errors = _measure(db, mod, candidates, target, builder, runner)
        measured += len(candidates)
        best = best_latency_us(db.memory, task.kernel)
        out(f"task {task.kernel.name}: warm start measured {len(candidates)} schedules from {source}, "
            f"best {best:.1f} us" if best else f"task {task.kernel.name}: warm start found nothing that runs"
            + (f" (first error: {errors[0].strip().splitlines()[-1]})" if errors else ""))
    return measured


def tune(configs, target, log_dir: str = DEFAULT_LOGS, trials_per_task: int = 64, kernels=None,
         rpc_tracker=None, rpc_key=None, builder=None, runner=None, out=print, num_trials_per_iter=16,
         warm_start_from: str | None = None, max_tasks: int | None = None, seed: int = 1,
         seed_default: bool = True, reseed_defaults: bool = False):
    """Tune every kernel of ``configs`` for ``target`` up to ``trials_per_task`` trials each.

    Resumes: trials already in the log count, so a rerun only measures what is missing, and a
    finished task is skipped. ``kernels`` (names or substrings) restricts the tasks, ``max_tasks``
    keeps the heaviest ones (largest share of a training step, :func:`rank_tasks`). ``warm_start_from`` (another log
    folder) seeds tasks that have no records with that folder's best schedules; ``seed_default``
    first measures each new task's default schedule (one trial of its budget); ``reseed_defaults``
    measures it (and its other shapes) on every selected task, also those with records, after the
    default schedule changed: the faster records win, none is removed. Returns
    ``[(task, best latency in us or None, trials)]``.
    """
    folder = os.path.join(log_dir, target_key(target))
    db = LogDatabase(folder)
    tasks = select_tasks(configs, target, kernels, max_tasks, db.memory)
    loops = StepLoops()
    builder = StepLoopBuilder(builder or default_builder(target), loops)
    runner = PerStepRunner(runner or default_runner(target, rpc_tracker, rpc_key), loops)
    new = [t for t in tasks if not records_of(db.memory, t.kernel)]
    if warm_start_from:
        warm_start(db, [t for t in new if not is_persistent(t.kernel)], target, warm_start_from, builder, runner,
                   out=out)
    if seed_default or reseed_defaults:
        seed_defaults(db, tasks if reseed_defaults else new, target, builder, runner, out=out)
    todo = [(t, trials_per_task - len(records_of(db.memory, t.kernel))) for t in tasks]
    todo = [(t, n) for t, n in todo if n > 0 and not is_persistent(t.kernel)]
    for t in tasks:
        if is_persistent(t.kernel):
            out(f"task {t.kernel.name}: a persistent step, its space is the default's shapes: "
                f"{len(records_of(db.memory, t.kernel))} measured")
        elif all(t is not u for u, _ in todo):
            out(f"task {t.kernel.name}: {len(records_of(db.memory, t.kernel))} trials logged already, skipped")
    if todo:
        import_tensor_intrinsics()
        contexts = [ms.TuneContext(workload(t.kernel), target=target,
                                   space_generator=spaces.space_generator(t.kernel, target),
                                   search_strategy="evolutionary", task_name=t.kernel.name, rand_state=seed + i,
                                   num_threads="physical")
                    for i, (t, _) in enumerate(todo)]
        progress = _Progress([t.kernel.name for t, _ in todo], [n for _, n in todo], out)
        with tempfile_dir() as work_dir:
            ms.tune_tasks(tasks=contexts, task_weights=[float(t.calls) for t, _ in todo], work_dir=work_dir,
                          max_trials_global=sum(n for _, n in todo), max_trials_per_task=max(n for _, n in todo),
                          num_trials_per_iter=num_trials_per_iter,
                          builder=builder, runner=runner,
                          database=db, cost_model="xgb",
                          measure_callbacks=ms.measure_callback.MeasureCallback.create("default") + [progress])
    return [(t, best_latency_us(db.memory, t.kernel), len(records_of(db.memory, t.kernel))) for t in tasks]


def tempfile_dir():
    import tempfile
    return tempfile.TemporaryDirectory(prefix="tvmrnn-tune-")
