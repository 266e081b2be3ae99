"""The tuning loop: MetaSchedule's evolutionary search with the XGBoost cost model over a build's
tasks, with our builders and runners (a persistent step measured as its time loop runs it,
:mod:`.step_loop`), each new task seeded with the default schedule and its listed variants, warm
starts from other logs, and a database that appends each run's records to files of its own
(:class:`LogDatabase`). ``build`` never imports this module."""
from __future__ import annotations

import os
import statistics
import time
import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object
from . import spaces
from ..options import BuildOptions, use_cpu_threads
from ..schedules import apply as default_schedule_apply, bf16
from ..schedules.common import is_gpu
from ..schedules.split_k import persistent_blocks
from ..schedules.variants import variants as default_variants
from ..schedules.knobs import seeded_settings
from .step_loop import STEP_LOOP_STEPS, step_loop

from .records import LogIndex, default_logs_root, best_latency_us, load_records, records_of, target_key, workload
from .tasks import is_persistent, select_tasks


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


# ---- tuning -----------------------------------------------------------------------------------
# TVM's tensor-intrinsic modules a target's generic rules can use (``tvm.s_tir.tensor_intrin``'s
# submodules): its package imports all of them, the CUDA ones alone 16 of the 22 s a tiny CPU
# tuning run spent importing them on the 2-core dev VM (v58)
INTRINSIC_MODULES = {"cuda": ("cuda",), "llvm": ("x86",)}


def import_tensor_intrinsics(target=None) -> None:
    """Import ``tvm.s_tir.tensor_intrin`` (which ``ms.TuneContext`` imports on first use) fast:
    for a ``target`` of :data:`INTRINSIC_MODULES`, only its kind's submodules, under a package
    module that stands in for the whole (so ``TuneContext``'s import finds it); else all of them.

    Its modules define ~250 TVMScript functions at import time; each ``@T.prim_func`` walks the
    caller's frames with ``inspect``, which looks up each frame's module. For the import
    machinery's frames (``<frozen importlib._bootstrap>``: no file on disk) that lookup misses
    ``inspect``'s file-to-module cache and scans all of ``sys.modules`` every time: with PyTorch
    loaded, 141 s of a 156 s tiny tuning run on the 2-core dev machine (v17 saw 74 s without it).
    Entering those two frozen modules in the cache (``inspect.modulesbyfile``, where ``inspect``
    itself would put a module with a file) makes the lookup a dictionary hit; the frame records the
    parser gets are the same (their file name, and no source lines: frozen modules have none)."""
    import importlib
    import inspect
    import os
    import sys
    import types
    name = "tvm.s_tir.tensor_intrin"
    loaded = sys.modules.get(name)
    if loaded is not None and not getattr(loaded, "tvmrnn_placeholder", False) \
            and getattr(loaded, "tvmrnn_parts", None) is None:
        return  # the whole package
    wanted = _intrinsic_parts(target)
    for module in ("importlib._bootstrap", "importlib._bootstrap_external"):
        inspect.modulesbyfile.setdefault(f"<frozen {module}>", module)
    # and every other frame below us without a file (``<frozen runpy>`` under ``python -m``,
    # ``<string>`` in a pytest-xdist worker or ``python -c``): each missed too, the whole tiny
    # tuning run's import was still 39 of 45 s on the dev VM (v33), now a few seconds
    frame = sys._getframe()
    while frame is not None:
        file, module = frame.f_code.co_filename, frame.f_globals.get("__name__")
        if file.startswith("<") and module in sys.modules:
            inspect.modulesbyfile.setdefault(file, module)
        frame = frame.f_back
    if wanted is None:
        sys.modules.pop(name, None)  # skip_tensor_intrinsics's placeholder, or a part
        importlib.import_module(name)
        return
    if loaded is None or getattr(loaded, "tvmrnn_placeholder", False):
        from tvm import s_tir
        loaded = types.ModuleType(name)
        loaded.__path__ = [os.path.join(os.path.dirname(s_tir.__file__), "tensor_intrin")]
        loaded.tvmrnn_parts = set()
        sys.modules[name] = loaded
    for part in wanted:
        if part not in loaded.tvmrnn_parts:
            importlib.import_module(f"{name}.{part}")
            loaded.tvmrnn_parts.add(part)


def _intrinsic_parts(target) -> tuple[str, ...] | None:
    """The submodules of ``tvm.s_tir.tensor_intrin`` a target's generic rules can use
    (:data:`INTRINSIC_MODULES`), or None: all of them (no target, or a CPU that is not x86)."""
    import platform
    if target is None:
        return None
    target = tvm.target.Target(target)
    if target.kind.name == "llvm":
        triple = str(target.attrs.get("mtriple", "") or platform.machine())
        if not triple.startswith(("x86_64", "i686", "i386", "amd64", "AMD64")):
            return None
    return INTRINSIC_MODULES.get(target.kind.name)


def skip_tensor_intrinsics() -> None:
    """Let ``ms.TuneContext`` go without ``tvm.s_tir.tensor_intrin`` where nothing will use TVM's
    intrinsics: template spaces have no MetaSchedule rules (the TF32 templates register their own,
    :mod:`tvmrnn.schedules.tensor_cores`). Parsing its ~250 TVMScript functions took 8 s of a
    2-task search's 24 s on the 2-core dev machine, paid again by each search process
    (:func:`_per_device`). A placeholder stands in the module table; a later real import
    (a generic space's rules) replaces it."""
    import sys
    import types
    name = "tvm.s_tir.tensor_intrin"
    if name not in sys.modules:
        placeholder = types.ModuleType(name)
        placeholder.__path__ = []  # a package, as the real one is
        placeholder.tvmrnn_placeholder = True
        sys.modules[name] = placeholder


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
            import tvm
            from tvm.driver import build as tvm_build
            from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
            # GPU kernels without TIR's CSE, as builds compile them (program.sequence.compile_module):
            # it hides the lane of the tensor-core kernels' warp stores from LowerWarpMemory, and
            # every TF32 candidate failed (notes v51)
            # (cp.async where a schedule asks for it: through TVM's own option here, whose
            # LowerAsyncDMA builds leave out for its time; the kernels are the same, notes v85)
            gpu = target.kind.name == "cuda"
            with tvm.transform.PassContext(config={"tirx.disable_cse_tir": gpu, "tirx.use_async_copy": gpu}):
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


def default_builder(target, processes: int = 1) -> ms.builder.Builder:
    """Builder workers and timeouts that fit the machine: on 2 cores the defaults time out.
    ``processes``: how many searches share the machine (:func:`_per_device`), each getting its
    share of the workers."""
    cores = os.cpu_count() or 1
    workers = max(1, cores - 4) if cores > 8 else max(1, cores // 2)
    return PoolBuilder(max_workers=max(1, workers // processes), timeout_sec=120 if cores <= 4 else 60)


def _measuring(builder, runner):
    """``builder`` and ``runner`` wrapped to build and run a persistent step's candidates as its
    time loop runs them (:class:`StepLoopBuilder`, :class:`PerStepRunner`)."""
    loops = StepLoops()
    return StepLoopBuilder(builder, loops), PerStepRunner(runner, loops)


class StepLoops:
    """The steps of a step loop, and the artifacts a :class:`StepLoopBuilder` built as such loops,
    for the :class:`PerStepRunner` that runs them."""

    def __init__(self, steps: int = STEP_LOOP_STEPS):
        self.steps = steps
        self.artifacts: set[str] = set()


@derived_object
class StepLoopBuilder(ms.builder.PyBuilder):
    """Builds a persistent step kernel's candidate as :func:`tvmrnn.tune.step_loop.step_loop` (its steps
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


def rpc_devices(rpc_tracker: str, rpc_key: str) -> int:
    """How many RPC servers (devices) under ``rpc_key`` the tracker at ``HOST:PORT`` has free now;
    a clear error where it cannot be reached or has none."""
    import socket
    from tvm import rpc
    host, _, port = rpc_tracker.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"rpc_tracker: expected HOST:PORT, got {rpc_tracker!r}")
    try:  # TVM's connect_tracker retries for a minute; a tracker that is not there is said at once
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise RuntimeError(f"rpc_tracker: no RPC tracker answers at {rpc_tracker} ({e})") from None
    try:
        queues = rpc.connect_tracker(host, int(port)).summary()["queue_info"]
    except Exception as e:  # TVM raises RuntimeError / TVMError for a tracker that is not there
        raise RuntimeError(f"rpc_tracker: no RPC tracker answers at {rpc_tracker} ({e})") from None
    free = int(queues.get(rpc_key, {}).get("free", 0))
    if free < 1:
        raise RuntimeError(f"rpc_key: the tracker at {rpc_tracker} has no free server under {rpc_key!r} "
                           f"(it has {sorted(queues) or 'none'})")
    return free


def allow_amx() -> None:
    """The measuring process's initializer: ask Linux for AMX tile data
    (:func:`tvmrnn.schedules.bf16.request_amx`), as ``build``'s callers do. Without it a bf16
    kernel's AMX microkernel dies at its first tile instruction, so every AMX candidate, the
    default schedule among them, "failed to run", and the search logged only the slower
    vdpbf16ps ones (v53: a DS2 bf16 projection's best 3.06 ms against the AMX default's 0.5)."""
    from ..schedules import bf16
    bf16.request_amx()


def default_runner(target, rpc_tracker: str | None = None, rpc_key: str | None = None, out=None,
                   workers: int | None = None):
    """MetaSchedule's runner: local, or through an RPC tracker with one measuring worker per free
    server under ``rpc_key`` (MetaSchedule's RPCRunner measures on one at a time by default), so
    that N devices (a server per GPU) measure a batch of candidates N at a time; ``workers`` sets
    the number instead (a search of its own a device: :func:`tune`)."""
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20 if is_gpu(target) else 40,
                                          enable_cpu_cache_flush=False)
    if rpc_tracker:
        devices = workers or rpc_devices(rpc_tracker, rpc_key)
        if out is not None:
            out(f"measuring on {devices} RPC device{'s' if devices > 1 else ''} ({rpc_key!r} at {rpc_tracker})")
        host, _, port = rpc_tracker.rpartition(":")
        config = ms.runner.RPCConfig(tracker_host=host, tracker_port=int(port), tracker_key=rpc_key,
                                     session_timeout_sec=120)
        runner = ms.runner.RPCRunner(config, evaluator_config=evaluator, max_workers=devices)
        runner.devices, runner.rpc = devices, (rpc_tracker, rpc_key)
        return runner
    # (only where the target has AMX: the initializer imports tvmrnn into every measuring process)
    return ms.runner.LocalRunner(timeout_sec=60, evaluator_config=evaluator,
                                 initializer=allow_amx if bf16.supports_amx(target) else None)


@derived_object
class _Progress(ms.measure_callback.PyMeasureCallback):
    """One line per measured batch (task, trials, best latency so far, ETA) to ``out``, and with
    ``bar`` a tqdm bar of all trials (``tvmrnn-tune`` on a terminal)."""

    def __init__(self, names, budgets, out, bar: bool = False, devices: int = 1):
        self.names, self.budgets, self.out = names, budgets, out
        self.on = f" on {devices} devices" if devices > 1 else ""
        self.done = [0] * len(names)
        self.best = [float("inf")] * len(names)
        self.start = time.time()
        self.bar = None
        if bar:
            from tqdm import tqdm
            self.bar = tqdm(total=sum(budgets), unit="trial", desc="tuning" + self.on, dynamic_ncols=True)

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
        if self.bar is not None:
            self.bar.update(len(runner_results))
            self.bar.set_postfix_str(f"{self.names[task_id]}: best {best}")
        self.out(f"[{sum(self.done)}/{total} trials{self.on}, ETA {eta:.0f} s] task {task_id + 1}/{len(self.names)} "
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


def _measure(db, mod, candidates, target, builder, runner, times: list | None = None, rounds: int = 1,
             commit: bool = True) -> list[str]:
    """Build and run scheduled ``candidates`` of workload ``mod``; commit a record for each run
    (run times, or none for a failure) unless ``commit`` is False. ``rounds`` > 1: each built once,
    then run in turn that many times (c0, c1, c0, c1, ...: :func:`confirm_best`). Returns the
    error messages; ``times`` gets each run's mean time in us, in that order (None where it failed)."""
    built = builder.build([ms.builder.BuilderInput(c.mod, target) for c in candidates])
    args_info = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    ok = [(i, c, b) for i, (c, b) in enumerate(zip(candidates, built)) if b.error_msg is None]
    runs = [(r * len(candidates) + i, c, b) for r in range(rounds) for i, c, b in ok]
    results = [r.result() for r in runner.run([
        ms.runner.RunnerInput(b.artifact_path, "cuda" if is_gpu(target) else "cpu", args_info) for _, _, b in runs])]
    token = db.commit_workload(mod) if commit else None
    measured = {}  # by position: a candidate runs several times (rounds)
    for (i, c, _), r in zip(runs, results):
        secs = [float(x) for x in r.run_secs] if r.error_msg is None else None
        if commit:
            db.commit_tuning_record(ms.database.TuningRecord(c.trace, token, secs, target, args_info))
        measured[i] = 1e6 * sum(secs) / len(secs) if secs else None
    if times is not None:
        times.extend(measured.get(i) for i in range(rounds * len(candidates)))
    return [b.error_msg for b in built if b.error_msg] + [r.error_msg for r in results if r.error_msg]


def _seeds(task, target, space: str) -> tuple[list, list[str]]:
    """The scheduled candidates :func:`seed_defaults` measures for a task, with their labels: in
    the template space, the default's knob setting and each listed variant's (their traces hold the
    decisions, so the search mutates them); else the default and its variants applied directly."""
    mod = workload(task.kernel)
    if spaces.is_template_space(task.kernel, target, space):
        found = [(spaces.knob_schedule(mod, task.kernel, target, values), values)
                 for values in seeded_settings(task.kernel, target)]
        default = found[0][1]
        return [sch for sch, _ in found if sch is not None], [
            " ".join(f"{k}={v}" for k, v in values.items() if v != default[k]) or "default"
            for sch, values in found if sch is not None]
    candidates, labels = [], []
    for tiles in default_variants(task.kernel, target):  # the default first, then its other shapes
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
        try:
            default_schedule_apply(sch, task.kernel, target, **tiles)
        except Exception:  # noqa: BLE001 - a variant that does not apply to this kernel
            continue
        candidates.append(sch)
        labels.append(" ".join(f"{k}={v}" for k, v in tiles.items()) or "default")
    return candidates, labels


def seed_defaults(db, tasks, target, builder, runner, out=print, space: str = "template") -> int:
    """Measure the default schedule of every task in ``tasks`` (``tune`` passes the new ones), as
    a record like any other: the search starts from it, and ``build`` never takes a tuned record
    slower than the default it would otherwise use. Where the default has other shapes worth
    trying (:func:`tvmrnn.schedules.variants`: the GPU split-K's threads and tile), those are
    measured too. Returns the number of measurements."""
    measured = 0
    for task in tasks:
        mod = workload(task.kernel)
        candidates, labels, seen = [], [], set()
        for sch, label in zip(*_seeds(task, target, space)):
            key = tvm_ffi.structural_hash(sch.mod)
            if key not in seen:  # shapes that come out the same at these sizes are measured once
                seen.add(key)
                candidates.append(sch)
                labels.append(label)
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
        import_tensor_intrinsics(target)
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


def tune(configs, target, log_dir: str | None = None, trials_per_task: int = 64, kernels=None,
         rpc_tracker=None, rpc_key=None, builder=None, runner=None, out=print, num_trials_per_iter=16,
         warm_start_from: str | None = None, max_tasks: int | None = None, seed: int = 1,
         seed_default: bool = True, reseed_defaults: bool = False, progress_bar: bool = False,
         space: str = "template", population: int = 64):
    """Tune every kernel of ``configs`` for ``target`` up to ``trials_per_task`` trials each.

    Resumes: trials already in the log count, so a rerun only measures what is missing, and a
    finished task is skipped. ``kernels`` (names or substrings) restricts the tasks, ``max_tasks``
    keeps the heaviest ones (largest share of a training step, :func:`rank_tasks`). ``warm_start_from`` (another log
    folder) seeds tasks that have no records with that folder's best schedules; ``seed_default``
    first measures each new task's default schedule (one trial of its budget); ``reseed_defaults``
    measures it (and its other shapes) on every selected task, also those with records, after the
    default schedule changed: the faster records win, none is removed. ``log_dir``: the folder of
    per-target log folders (None: :func:`tvmrnn.tune.records.default_logs_root`, which ``build``
    reads too). ``space``: ``"template"`` searches each kernel's schedule template over its knobs
    (:mod:`.spaces`), ``"generic"`` MetaSchedule's own rules. ``population``: the evolutionary
    search's population (a template space has hundreds to thousands of points, and making a
    candidate runs the template in Python, ~5-50 ms). With an RPC tracker that has several free
    servers under the key and at least :data:`SPLIT_TASKS_PER_DEVICE` tasks with work left a server,
    the tasks are split over one search process a server (:func:`_per_device`); fewer are searched
    in one process, measured on all the servers at once. Returns
    ``[(task, best latency in us or None, trials)]``.
    """
    if space not in spaces.SPACES:
        raise ValueError(f"space must be one of {spaces.SPACES}, not {space!r}")
    folder = os.path.join(log_dir if log_dir is not None else default_logs_root(), target_key(target))
    if not is_gpu(target):
        use_cpu_threads(BuildOptions())  # candidates are measured with the threads a build runs with
    db = LogDatabase(folder)
    tasks = select_tasks(configs, target, kernels, max_tasks, db.memory)
    own_builder = builder is None
    builder, runner = _measuring(builder or default_builder(target),
                                 runner or default_runner(target, rpc_tracker, rpc_key, out=out))
    prepare = dict(trials_per_task=trials_per_task, warm_start_from=warm_start_from, seed_default=seed_default,
                   reseed_defaults=reseed_defaults)
    search = dict(space=space, population=population, num_trials_per_iter=num_trials_per_iter)
    seeded = [(seed + i, t) for i, t in enumerate(tasks)]  # each task's search seed
    devices, rpc = getattr(runner.inner, "devices", 1), getattr(runner.inner, "rpc", None)
    pending = [(s, t, max(1, trials_per_task - len(records_of(db.memory, t.kernel)))) for s, t in seeded
               if _has_work(t, db.memory, trials_per_task, seed_default, reseed_defaults)]
    # one search process a device where each gets 2+ tasks: on two H100s, 6 tasks took 131 s split
    # against 161 s in one search, 2 tasks 120 s split against 103 s (each process's start, and the
    # builder's workers divided between processes, cost more than the host work they overlap; v38)
    if devices > 1 and rpc is not None and own_builder and len(pending) >= SPLIT_TASKS_PER_DEVICE * devices:
        for _, t in seeded:
            if all(t is not u for _, u, _ in pending):
                out(f"task {t.kernel.name}: {len(records_of(db.memory, t.kernel))} trials logged already, skipped")
        _per_device(pending, target, folder, rpc, devices, out=out, prepare=prepare, search=search)
        db.memory = load_records(folder)  # what the processes logged
    else:
        _prepare_and_search(seeded, target, db, builder, runner, out=out, progress_bar=progress_bar, devices=devices,
                            **prepare, **search)
    try:
        index = LogIndex(folder)  # the best as build takes it: vetoed records skipped (confirm_best, pass checks)
    except Exception as err:  # noqa: BLE001 - a damaged file: build will say so; the logged best here
        out(f"the logs' best could not be read with their verdicts ({err})")
        index = None

    def best_us(t):
        if index is None:
            return best_latency_us(db.memory, t.kernel)
        fastest = index.fastest(LogIndex._key(workload(t.kernel)))
        return 1e6 * fastest[0][0] if fastest else None
    return [(t, best_us(t), len(records_of(db.memory, t.kernel))) for t in tasks]


def _has_work(task, memory, trials_per_task, seed_default, reseed_defaults) -> bool:
    logged = len(records_of(memory, task.kernel))
    return reseed_defaults or (seed_default and not logged) or logged < trials_per_task


def _prepare_and_search(seeded, target, db, builder, runner, out, trials_per_task, warm_start_from, seed_default,
                        reseed_defaults, space, population, num_trials_per_iter, progress_bar=False, devices=1):
    """:func:`tune`'s work on ``seeded`` (``[(search seed, task)]``): warm start and seed the new
    tasks, then search every task with trials left."""
    tasks = [t for _, t in seeded]
    new = [t for t in tasks if not records_of(db.memory, t.kernel)]
    if warm_start_from:
        warm_start(db, [t for t in new if not is_persistent(t.kernel)], target, warm_start_from, builder, runner,
                   out=out)
    if seed_default or reseed_defaults:
        seed_defaults(db, tasks if reseed_defaults else new, target, builder, runner, out=out, space=space)
    # a task with no measured record (its default did not run here, in this run or an earlier one
    # whose failure is logged) is not searched: a searched record could then be slower than the
    # default ``build`` would use, with nothing measured to say so
    unmeasured = {id(t) for t in tasks if best_latency_us(db.memory, t.kernel) is None
                  and (records_of(db.memory, t.kernel) or seed_default or reseed_defaults)}
    # a persistent step is searched in its template space only: MetaSchedule's own rules do not
    # keep weights in shared memory across steps, which is what makes such a loop fast
    searchable = lambda t: spaces.is_template_space(t.kernel, target, space) or not is_persistent(t.kernel)  # noqa: E731
    todo = [(s, t, trials_per_task - len(records_of(db.memory, t.kernel))) for s, t in seeded]
    todo = [(s, t, n) for s, t, n in todo if n > 0 and searchable(t) and id(t) not in unmeasured]
    for t in tasks:
        if id(t) in unmeasured:
            out(f"task {t.kernel.name}: not searched, since its default schedule did not run here (the error "
                "above): a searched record could not be compared with it")
        elif not searchable(t):
            out(f"task {t.kernel.name}: a persistent step, its space is the default's shapes: "
                f"{len(records_of(db.memory, t.kernel))} measured")
        elif all(t is not u for _, u, _ in todo):
            out(f"task {t.kernel.name}: {len(records_of(db.memory, t.kernel))} trials logged already, skipped")
    if todo:
        _search(todo, target, db, builder, runner, out=out, space=space, population=population,
                num_trials_per_iter=num_trials_per_iter, progress_bar=progress_bar, devices=devices)
        if CONFIRM_ROUNDS:
            confirm_best(db, [t for _, t, _ in todo], target, builder, runner, out=out, space=space)


# Interleaved rounds in which :func:`confirm_best` measures a task's best record against its
# default again (0: off), the records it tries a task at most, and the margin a searched record
# must win by. Each candidate of a search is measured once, in its own moment: on the 2-core dev VM
# a default measured while the VM was slow logged 180.9 us, the same schedule 95.1 later, and four
# of its "wins" of 1.45-2.0x were 0.78-1.00x measured again interleaved (notes/performance.md v82).
CONFIRM_ROUNDS = 3
CONFIRM_TRIES = 3
CONFIRM_MARGIN = 0.02


def confirm_best(db, tasks, target, builder, runner, out=print, space: str = "template") -> None:
    """After a search: each task's fastest logged record, where the search made it (not the
    default or a listed variant), is measured again against the default, interleaved (record,
    default, record, ... ``CONFIRM_ROUNDS`` times each, built once, in one runner call; a local runner runs its
    inputs in order, an RPC runner over several devices may spread them). The times go into the
    verdict, not the logs (as records they would count as trials of the task's budget). Where it
    is not faster by :data:`CONFIRM_MARGIN` (medians), or no longer
    runs, a verdict in ``pass_checks.json`` vetoes it (``build``, ``--list`` and the whole-pass
    checks skip it) and the next fastest is tried, up to :data:`CONFIRM_TRIES`. A record that
    wins is only said to (no verdict: the whole-pass check still checks it)."""
    from .pass_checks import PassChecks, record_digest
    from .records import TuningLogError, record_origin, seeded_traces
    checks = PassChecks(db.folder)
    try:  # the logs as build reads them (their JSON, vetoed records skipped); this call's vetoes: ``tried``
        index = LogIndex(db.folder)
    except TuningLogError as err:  # (another tuning process's files, half written)
        out(f"the best records not measured again ({err})")
        return
    for task in tasks:
        mod = workload(task.kernel)
        key = LogIndex._key(mod)
        seeds, labels = _seeds(task, target, space)
        if not seeds or labels[0] != "default":
            continue
        default, seeded, tried = seeds[0], seeded_traces(task.kernel, target), set()
        for _ in range(CONFIRM_TRIES):
            found = [c for c in index.candidates(mod, key, CONFIRM_TRIES + len(tried))
                     if record_digest(c[3]) not in tried]
            if not found:
                break
            logged_secs, _, parse, record_json = found[0]
            tried.add(record_digest(record_json))
            if record_origin(record_json, seeded) != "searched":
                break  # the default (or a listed variant of it) is the fastest
            facts = dict(kernel=task.kernel.name, check="kernel", logged_us=round(1e6 * logged_secs, 2))
            try:
                candidate = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
                parse().trace.apply_to_schedule(candidate, remove_postproc=False)
            except (TuningLogError, tvm.error.TVMError) as err:  # build cannot take it either
                checks.add_record(key, record_json, "vetoed", error=str(err)[-300:], **facts)
                continue
            times = []
            _measure(db, mod, [candidate, default], target, builder, runner, times, rounds=CONFIRM_ROUNDS, commit=False)
            ours, theirs = [t for t in times[0::2] if t is not None], [t for t in times[1::2] if t is not None]
            if not theirs:
                break  # the default did not run: nothing to compare with
            if not ours:
                checks.add_record(key, record_json, "vetoed", error="failed to run", **facts)
                out(f"task {task.kernel.name}: its best record failed to run when measured again: vetoed")
                continue
            ours, theirs = statistics.median(ours), statistics.median(theirs)
            facts.update(rounds=CONFIRM_ROUNDS, candidate_us=round(ours, 2), default_us=round(theirs, 2))
            if ours < theirs * (1 - CONFIRM_MARGIN):
                out(f"task {task.kernel.name}: its best record measured again against the default, interleaved: "
                    f"{ours:.1f} against {theirs:.1f} us ({theirs / ours:.2f}x)")
                break
            checks.add_record(key, record_json, "vetoed", **facts)
            out(f"task {task.kernel.name}: its best record (logged {1e6 * logged_secs:.1f} us) measured again "
                f"against the default, interleaved: {ours:.1f} against {theirs:.1f} us, not faster: vetoed")


def _search(todo, target, db, builder, runner, out, space, population, num_trials_per_iter, progress_bar=False,
            devices=1):
    """MetaSchedule's task scheduler over ``todo`` (``[(seed, task, trials)]``): the evolutionary
    search with the XGBoost cost model in each task's space, the records into ``db``."""
    generators = [spaces.space_generator(t.kernel, target, space) for _, t, _ in todo]
    if all(spaces.is_template_space(t.kernel, target, space) for _, t, _ in todo):
        skip_tensor_intrinsics()
    else:
        import_tensor_intrinsics(target)
    contexts = [ms.TuneContext(workload(t.kernel), target=target,
                               space_generator=generator,
                               search_strategy=ms.search_strategy.EvolutionarySearch(
                                   population_size=population, init_min_unmeasured=min(50, population // 2),
                                   genetic_num_iters=3),
                               task_name=t.kernel.name, rand_state=seed,
                               num_threads="physical")
                for (seed, t, _), generator in zip(todo, generators)]
    progress = _Progress([t.kernel.name for _, t, _ in todo], [n for _, _, n in todo], out, bar=progress_bar,
                         devices=devices)
    # (weights at least 1: a kernel the reference length does not run, such as a 128-step chunk's
    # GEMM at T = 300, still gets the trials it was given)
    with tempfile_dir() as work_dir:
        ms.tune_tasks(tasks=contexts, task_weights=[float(max(t.calls, 1)) for _, t, _ in todo], work_dir=work_dir,
                      max_trials_global=sum(n for _, _, n in todo), max_trials_per_task=max(n for _, _, n in todo),
                      num_trials_per_iter=num_trials_per_iter,
                      builder=builder, runner=runner,
                      database=db, cost_model="xgb",
                      measure_callbacks=ms.measure_callback.MeasureCallback.create("default") + [progress])
    if progress.bar is not None:
        progress.bar.close()


SPLIT_TASKS_PER_DEVICE = 2  # tasks with work left per device before tune splits them over processes


def _split(todo, parts: int) -> list[list]:
    """``todo`` in ``parts`` groups of about equal trials (the largest task first, each to the
    group with the fewest so far)."""
    groups, loads = [[] for _ in range(parts)], [0] * parts
    for item in sorted(todo, key=lambda item: -item[2]):
        j = loads.index(min(loads))
        groups[j].append(item)
        loads[j] += item[2]
    return [g for g in groups if g]


def _per_device(pending, target, folder, rpc, devices, out, prepare, search):
    """The tasks split over one process per device, each seeding its tasks and searching them on
    its own, measuring through the tracker on (about) one device. A search is mostly host work:
    the template spaces run in Python (one thread a process) and the builder compiles each batch;
    with one search, a second GPU saved only the measuring (11% on two H100s, notes v37). Each
    process appends its own pair of log files to ``folder`` (:class:`LogDatabase`); their lines
    come to ``out``, tagged. ``pending``: ``[(search seed, task, trials left)]``."""
    import multiprocessing
    import queue
    groups = [[(s, t) for s, t, _ in g] for g in _split(pending, min(devices, len(pending)))]
    out(f"tuning {len(pending)} tasks as {len(groups)} searches at once, one a device")
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with TVM's and XGBoost's threads
    lines = ctx.Queue()
    procs = []
    for i, group in enumerate(groups):
        share = devices // len(groups) + (1 if i < devices % len(groups) else 0)
        procs.append(ctx.Process(target=_one_device, daemon=True,
                                 args=(i + 1, group, target.export(), folder, rpc, share, len(groups), lines,
                                       {**prepare, **search})))
    for p in procs:
        p.start()
    errors = []
    try:
        while True:
            try:
                kind, label, text = lines.get(timeout=0.5)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            if kind == "error":
                errors.append(f"search {label}: {text}")
            else:
                out(f"[search {label}] {text}")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    failed = [i + 1 for i, p in enumerate(procs) if p.exitcode != 0]
    if errors or failed:
        raise RuntimeError("a tuning process failed (the records measured so far are in the logs): "
                           + ("\n".join(errors) or f"searches {failed} exited with {[procs[i - 1].exitcode for i in failed]}"))


def _one_device(label, seeded, target, folder, rpc, workers, processes, lines, work):
    """One process of :func:`_per_device`."""
    try:
        target = tvm.target.Target(target)
        if not is_gpu(target):
            use_cpu_threads(BuildOptions())
        builder, runner = _measuring(default_builder(target, processes),
                                     default_runner(target, *rpc, workers=workers))
        _prepare_and_search(seeded, target, LogDatabase(folder), builder, runner, devices=workers,
                            out=lambda text: lines.put(("line", label, text)), **work)
    except BaseException as e:  # noqa: BLE001 - to the parent, which names it
        import traceback
        lines.put(("error", label, "".join(traceback.format_exception(e))[-3000:]))
        raise SystemExit(1)


def tempfile_dir():
    import tempfile
    return tempfile.TemporaryDirectory(prefix="tvmrnn-tune-")
