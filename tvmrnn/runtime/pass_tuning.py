"""Whole-pass tuning: what a kernel timed alone cannot tell, measured on whole passes.

``tvmrnn-tune`` runs this after its search (and ``tvmrnn-tune --passes-only`` alone). For each
configuration it does two things, both by building the configuration's passes and timing them
against each other, calls interleaved (:func:`compare`):

1. **Pass-level options** (:func:`tune_options`): the choices that are not one kernel's
   (:data:`tvmrnn.options.TUNED_FIELDS`: persistence and its block count, chunk sizes, direction
   stacking, CPU panels, per-chunk projections and time loops as one parallel region), tried one at a time from the target's defaults; a change is kept
   where the pass is faster with it beyond the measurements' noise, and the changes kept are then
   compared together against the defaults once more (unless that confirms them, the defaults
   stay: one of several tries can look faster by chance). The winner is written to the
   log folder's ``pass_checks.json`` and ``build`` applies it (:func:`tvmrnn.tune.records.tuned_options`).
2. **Records** (:func:`check_records`): every kernel whose build takes a record other than its
   default schedule is timed in the pass against the same pass with that kernel on its default.
   A record that makes the pass slower is vetoed: ``build`` then takes the kernel's next record
   (checked in turn), at worst the default. On a 2-core EPYC two searched GEMM records, 5% and 17%
   faster alone, made the pass 3.5% slower each (notes v37).

A verdict compares two passes' medians over ``pairs`` interleaved pairs: each pass is the
inference forward, or a training forward and backward, at sequence length ``T`` on random inputs;
a pass kind's difference counts where its median ratio is off 1 by more than 1% and than twice
its standard error, and the candidate is faster where one kind is faster and none slower
(:class:`Comparison`; the 1% is 2% for options). Where it does
not, the incumbent stays: the defaults for options, the record for records (it was faster alone).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shutil
import statistics
import tempfile
import time
import warnings

import tvm

from ..device import FEW_ROWS_BATCH, multiprocessors
from ..options import BuildOptions, left_to_target
from ..program.passes import (GPU_CHUNK_STEPS, GPU_SHORT_CHUNK_STEPS, GPU_WIDE_CHUNK_STEPS, chunk_steps,
                              layer_wavefront, loop_block_caps, stack_directions)
from ..schedules import common
from ..schedules.common import is_gpu
from ..tune import records
from ..tune.pass_checks import FILE_NAME, PassChecks, config_key, describe
from ..tune.tasks import extract_tasks
from ..cells.definition import CELLS
from .build import build
from .cache import runnable_here
from .profile import pass_arguments

PASS_KINDS = {"inference": ("forward",), "training": ("forward_train", "backward")}
# a difference smaller than this share of a pass is not acted on, however steady: 1% for a record
# (vetoed where the pass is 1% slower with it), 2% for an option (the defaults were measured on
# real machines; one of several tries can look 1% faster by chance)
RECORD_EFFECT, OPTION_EFFECT = 0.01, 0.02


@dataclasses.dataclass
class Comparison:
    """Two builds' passes timed in turn: per pass kind, the incumbent's and the candidate's median
    seconds, the median of the per-pair ratios (candidate / incumbent) and its standard error."""

    passes: dict  # kind -> {"incumbent_ms", "candidate_ms", "ratio", "error"}
    pairs: int
    min_effect: float = RECORD_EFFECT

    @property
    def ratio(self) -> float:
        """The candidate's time over the incumbent's: the geometric mean over pass kinds."""
        return math.exp(statistics.fmean(math.log(p["ratio"]) for p in self.passes.values()))

    @property
    def threshold(self) -> float:
        error = math.sqrt(sum(p["error"] ** 2 for p in self.passes.values())) / len(self.passes)
        return max(self.min_effect, 2 * error)

    def kind_verdict(self, kind: str) -> str:
        p = self.passes[kind]
        threshold = max(self.min_effect, 2 * p["error"])
        if p["ratio"] < 1 - threshold:
            return "faster"
        return "slower" if p["ratio"] > 1 + threshold else "same"

    @property
    def verdict(self) -> str:
        """``"faster"`` (the candidate), ``"slower"`` or ``"same"``: a pass kind faster beyond its
        threshold and none slower beyond its own (a kernel of the training passes alone changes
        only those); where one kind is faster and another slower, the geometric mean decides."""
        kinds = {self.kind_verdict(kind) for kind in self.passes}
        # a kind within its noise but worse than the threshold's 1% (or 2%) is not "the same" for
        # a candidate to win on the others (a GRU at batch 1 on the H100: training 23% slower,
        # noise +-17%, notes v38)
        if kinds == {"faster", "same"} and any(p["ratio"] > 1 + self.min_effect for p in self.passes.values()):
            kinds = {"faster", "slower"}
        if {"faster", "slower"} <= kinds:
            if self.ratio < 1 - self.threshold:
                return "faster"
            return "slower" if self.ratio > 1 + self.threshold else "same"
        return "faster" if "faster" in kinds else "slower" if "slower" in kinds else "same"

    def summary(self) -> dict:
        return {"ratio": round(self.ratio, 4), "threshold": round(self.threshold, 4), "pairs": self.pairs,
                **{kind: {k: round(v, 4) for k, v in p.items()} for kind, p in self.passes.items()}}

    def line(self) -> str:
        parts = [f"{kind} {p['incumbent_ms']:.3f} -> {p['candidate_ms']:.3f} ms" for kind, p in self.passes.items()]
        return f"{'; '.join(parts)}; ratio {self.ratio:.3f} (+-{self.threshold:.3f}): {self.verdict}"


class PassTimer:
    """``timer(rnn, kind) -> seconds`` of one pass of a built RNN: ``"inference"`` (the forward) or
    ``"training"`` (forward_train then backward), at sequence length ``T``, on random inputs made
    once per RNN (the passes' compiled functions called directly, as :mod:`.profile` does). A pass
    shorter than ``min_sample_s`` is run that many times more per sample, each call waited for
    (latencies, not a pipelined throughput), and the mean returned: a 0.2 ms pass timed alone
    moved 10-25% from call to call on the H100 (notes v38)."""

    def __init__(self, T: int = 100, min_sample_s: float = 2e-3):
        self.T, self.min_sample_s = T, min_sample_s
        self._runs: dict = {}

    def __call__(self, rnn, kind: str) -> float:
        run = self._runs.get(id(rnn))
        if run is None or run[0] is not rnn:
            run = self._runs[id(rnn)] = (rnn, self._prepare(rnn))
        prepared = run[1]
        calls = prepared["calls"].get(kind)
        if calls is None:  # the first call of a kind (a warm-up in compare) sizes its samples
            once = self._once(prepared, kind)
            calls = prepared["calls"][kind] = max(1, min(64, math.ceil(self.min_sample_s / max(once, 1e-7))))
        t0 = time.perf_counter()
        for _ in range(calls):
            self._once(prepared, kind)
        return (time.perf_counter() - t0) / calls

    @staticmethod
    def _once(prepared, kind) -> float:
        t0 = time.perf_counter()
        for fn, args in prepared[kind]:
            fn(*args)
        prepared["sync"]()
        return time.perf_counter() - t0

    def _prepare(self, rnn) -> dict:
        dev = tvm.cuda(rnn.device_index) if is_gpu(rnn.target) else tvm.cpu(0)
        prepared = {"sync": dev.sync, "calls": {}}
        for kind, names in PASS_KINDS.items():
            prepared[kind] = [(rnn.module[name], pass_arguments(rnn, name, self.T, dev)) for name in names]
        return prepared

    def forget(self, rnn) -> None:
        """Drop an RNN's inputs (GPU memory) once it is no longer compared."""
        self._runs.pop(id(rnn), None)


def compare(incumbent, candidate, timer, pairs: int = 15, lead_in: int = 1,
            min_effect: float = RECORD_EFFECT) -> Comparison:
    """Both builds' passes timed in turn (incumbent, candidate, incumbent, ...), each pass kind after
    a warm-up of each; ``lead_in`` untimed calls of the same build before each timed one, so each
    timed call follows its own kind (tvmrnn.cli.bench.interleaved says why)."""
    passes = {}
    for kind in PASS_KINDS:
        timer(incumbent, kind)
        timer(candidate, kind)
        times = ([], [])
        for _ in range(pairs):
            for rnn, out in zip((incumbent, candidate), times):
                for _ in range(lead_in):
                    timer(rnn, kind)
                out.append(timer(rnn, kind))
        ratios = [b / a for a, b in zip(*times)]
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        # the median's standard error from the interquartile range (1.349 sigma for a normal spread)
        error = 1.2533 * (q3 - q1) / 1.349 / math.sqrt(len(ratios))
        passes[kind] = {"incumbent_ms": 1e3 * statistics.median(times[0]),
                        "candidate_ms": 1e3 * statistics.median(times[1]),
                        "ratio": statistics.median(ratios), "error": error}
    return Comparison(passes, pairs, min_effect)


# ---- the builds compared ----------------------------------------------------------------------
def log_folder(tuning_logs, target) -> str:
    """The log folder whose ``pass_checks.json`` the verdicts go to (created if need be)."""
    return records.logs_folder(tuning_logs, target) or os.path.join(records.logs_root(tuning_logs),
                                                                    records.target_key(target))


@contextlib.contextmanager
def _mirror(folder: str, vetoes=(), options: bool = False, defaults_for=None):
    """A temporary logs root whose target folder shows ``folder``'s logs (links) and its record
    verdicts plus ``vetoes`` (``(workload key, record JSON or None for all its records)``), and its
    option verdicts only with ``options``; with ``defaults_for`` (a configuration) a verdict of no
    options for it, so that neither the folder's nor the shipped records' options apply to it: the
    builds this module compares, the real verdicts untouched."""
    root = tempfile.mkdtemp(prefix="tvmrnn-pass-")
    try:
        mirror = os.path.join(root, os.path.basename(os.path.normpath(folder)))
        os.makedirs(mirror)
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if not name.startswith(FILE_NAME):
                    os.symlink(os.path.abspath(os.path.join(folder, name)), os.path.join(mirror, name))
        checks, copy = PassChecks(folder), PassChecks(mirror)
        copy.write_all(checks.records, checks.options if options else [])
        if defaults_for is not None:
            copy.add_options(config_key(defaults_for), {}, transient=True)
        for key, record_json in vetoes:
            copy.add_record(key, record_json, "vetoed", transient=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _mirrored_build(config, target, folder, vetoes=()):
    """``config`` built as ``build`` would from ``folder`` (its verdicts too), plus ``vetoes``."""
    with _mirror(folder, vetoes, options=True) as root:
        return _build(config, target, root)


def _build(config, target, tuning_logs, options=None, cache: bool = False):
    with warnings.catch_warnings():  # untuned kernels: tuning said so already
        warnings.simplefilter("ignore", records.UntunedWarning)
        return build(config.cell, config.input_size, config.hidden_size, config.num_layers, config.bidirectional,
                     config.batch_size, target=target, tuning_logs=tuning_logs,
                     options=config.options if options is None else options, cache=cache, proj_size=config.proj_size)


@contextlib.contextmanager
def _own_build_cache():
    """A build cache of the stage's own (``TVMRNN_CACHE_DIR``) while it lasts: its builds neither
    read nor fill the user's."""
    path, before = tempfile.mkdtemp(prefix="tvmrnn-pass-cache-"), os.environ.get("TVMRNN_CACHE_DIR")
    os.environ["TVMRNN_CACHE_DIR"] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop("TVMRNN_CACHE_DIR", None)
        else:
            os.environ["TVMRNN_CACHE_DIR"] = before
        shutil.rmtree(path, ignore_errors=True)


def _prebuild(config, target, builds, processes, cache, out) -> None:
    """Build ``config`` for each ``(tuning logs, options)`` of ``builds`` in ``processes`` spawned
    processes at once, into the build cache ``cache``. A build that fails here fails again when
    timed, and is said there."""
    import multiprocessing
    jobs = [(config.cell.name, config.input_size, config.hidden_size, config.num_layers, config.bidirectional,
             config.batch_size, target.export(), logs, options.to_dict(), cache, config.proj_size)
            for logs, options in builds]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(min(processes, len(jobs))) as pool:
        pool.starmap(_build_into_cache, jobs)
    out(f"  {len(jobs)} builds, {min(processes, len(jobs))} at once: {time.perf_counter() - started:.0f} s")


def _build_into_cache(cell, input_size, hidden_size, num_layers, bidirectional, batch_size, target, tuning_logs,
                      options, cache, proj_size=0) -> None:
    """One job of :func:`_prebuild` (in a process of its own)."""
    os.environ["TVMRNN_CACHE_DIR"] = cache
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            build(cell, input_size, hidden_size, num_layers, bidirectional, batch_size, target=tvm.target.Target(target),
                  tuning_logs=tuning_logs, options=options, cache=True, proj_size=proj_size)
    except Exception:  # noqa: BLE001 - the timed build will fail the same way, and say so
        pass


def option_candidates(config, target) -> list[tuple[str, object]]:
    """The pass-level changes :func:`tune_options` tries, one at a time, from the target's defaults."""
    gpu = is_gpu(target)
    found = [("persistent", value) for value in ("off", "forward", "all")] if gpu else []
    # the persistent loops' block count around the target's choice for a step of few rows
    # (tvmrnn.device.small_step_blocks, from the H100's best at batch 1-8, notes v38-v39, and 9-64,
    # v76): half and twice it, and one a SM; a step of many rows has the work for every SM
    if gpu and config.batch_size <= FEW_ROWS_BATCH:
        sms = multiprocessors(target)
        caps = loop_block_caps(config, target)
        chosen = caps[0] if caps else None
        if sms and chosen:
            found += [("persistent_blocks", blocks) for blocks in sorted({max(1, chosen // 2), min(sms, 2 * chosen), sms})
                      if blocks != chosen]
    # persistent steps of row groups (on by default where they apply, common.GPU_ROW_GROUP_STEPS):
    # without them, split-K's blocks and grid barrier
    gates = getattr(config.cell, "num_gates", None) or 1
    if (gpu and common.GPU_ROW_GROUP_STEPS and config.batch_size < common.GPU_ROW_TILE_ROWS
            and 4 * gates * config.hidden_size ** 2 <= common.ROW_GROUP_MAX_WEIGHT_BYTES):
        found.append(("row_groups", False))
    if config.bidirectional:
        found.append(("stack_directions", not stack_directions(target, config.options)))
    elif gpu and layer_wavefront(config, target, config.options):
        # where the passes are a wavefront by default: one even where its stacked steps would not
        # all run persistent, and none (elsewhere a stack's steps fill the GPU, or its weights do
        # not fit it: passes.WAVE_WEIGHT_SHARE, WAVE_MAX_STEP_WORK)
        found += [("layer_wavefront", True), ("layer_wavefront", False)]
    if not gpu:
        found += [("interleave_projections", False), ("weight_panels", False), ("gradient_panels", False),
                  ("time_loop_regions", False)]
    # on GPUs the other ladder than the batch's default (passes.chunk_steps), and one of short chunks;
    # for a batch on the few-row default ladder, the one without its 16- and 8-step chunks too
    # (passes.GPU_SHORT_CHUNK_STEPS: fewer kernels)
    other = GPU_CHUNK_STEPS if chunk_steps(target, BuildOptions(), config.batch_size) != GPU_CHUNK_STEPS \
        else GPU_WIDE_CHUNK_STEPS
    short = (GPU_SHORT_CHUNK_STEPS,) if other == GPU_WIDE_CHUNK_STEPS else ()
    if short and records.records_ladder(config, target, config.options).chunk_steps == GPU_SHORT_CHUNK_STEPS:
        short = (GPU_CHUNK_STEPS,)  # the shipped records' ladder is what builds take: try the few-row default
    found += [("chunk_steps", steps) for steps in ((other, *short, (64, 8, 1)) if gpu else ((32, 8, 1), (8, 1)))]
    return found


def build_processes() -> int:
    """Processes that build a configuration's option candidates at once before they are timed:
    half this machine's cores (a 5-layer GPU build takes a minute or more, mostly one core's
    work), none on 3 or fewer."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores // 2 if cores > 3 else 0


def tune_options(config, target, tuning_logs=None, timer=None, pairs: int = 15, candidates=None,
                 out=print, processes: int | None = None) -> dict | None:
    """Measure the pass-level options of ``config`` (:func:`option_candidates`, or ``candidates``)
    as whole passes, keep each change that makes the passes faster, and write the verdict to the log
    folder's ``pass_checks.json`` (``build`` applies it). A configuration whose options set any of
    them is left as it is (None). With ``processes`` (default :func:`build_processes`) above 1, the
    defaults and each candidate are first built that many at once, into a build cache of the
    stage's own, which the timed builds then load. Returns the verdict written."""
    if not left_to_target(config.options):
        out(f"{describe(config)}: its options set pass-level choices; not tuned")
        return None
    timer = timer or PassTimer()
    folder = log_folder(tuning_logs, target)
    candidates = option_candidates(config, target) if candidates is None else list(candidates)
    tried, chosen, confirmed = [], {}, None
    with _mirror(folder, defaults_for=config) as root, _own_build_cache() as cache:
        processes = build_processes() if processes is None else processes
        if processes > 1 and CELLS.get(config.cell.name) is config.cell and runnable_here(target):
            sets = [config.options] + [dataclasses.replace(config.options, **{n: v}) for n, v in candidates]
            _prebuild(config, target, [(root, options) for options in sets], processes, cache, out)
        defaults = incumbent = _build(config, target, root, cache=True)
        for name, value in candidates:
            options = dataclasses.replace(config.options, **{**chosen, name: value})
            try:
                candidate = _build(config, target, root, options, cache=True)
            except Exception as err:  # noqa: BLE001 - a choice this configuration cannot build is not a winner
                out(f"  {name}={value!r}: does not build ({type(err).__name__}: {str(err)[:120]})")
                tried.append({"option": name, "value": _plain(value), "verdict": "does not build"})
                continue
            result = compare(incumbent, candidate, timer, pairs, min_effect=OPTION_EFFECT)
            out(f"  {name}={value!r}: {result.line()}")
            tried.append({"option": name, "value": _plain(value), **result.summary(), "verdict": result.verdict})
            if result.verdict == "faster":
                chosen[name] = value
                if incumbent is not defaults:
                    _forget(timer, incumbent)
                incumbent = candidate
            else:
                _forget(timer, candidate)
        if chosen:
            # confirmed against the defaults in a comparison of its own: of several tries one may
            # have looked faster by chance (on a 2-core VM two 2-3% "gains" came to 1.01x so)
            confirmed = compare(defaults, incumbent, timer, pairs, min_effect=OPTION_EFFECT)
            out(f"  together, against the defaults: {confirmed.line()}")
            _forget(timer, incumbent)
        _forget(timer, defaults)
    kept = chosen if confirmed is not None and confirmed.verdict == "faster" else {}
    verdict = PassChecks(folder).add_options(
        config_key(config), {k: _plain(v) for k, v in kept.items()}, describe=describe(config), tried=tried,
        confirmed={**confirmed.summary(), "verdict": confirmed.verdict, "options": {k: _plain(v) for k, v in chosen.items()}}
        if confirmed is not None else None, length=getattr(timer, "T", None))
    if kept:
        out(f"{describe(config)}: {kept} (the passes took {confirmed.ratio:.3f}x the defaults' time)")
    else:
        out(f"{describe(config)}: defaults kept ({'not confirmed against them' if chosen else 'nothing faster'})")
    return verdict


def check_records(config, target, tuning_logs=None, timer=None, pairs: int = 15, kernels=None,
                  out=print, max_per_kernel: int = 3, processes: int | None = None) -> list[dict]:
    """Time each record that a build of ``config`` takes, other than a kernel's default schedule, in
    the whole passes against the kernel's default; veto it where the passes are slower with it
    (the kernel's next record is then checked, up to ``max_per_kernel``). Records with a verdict
    already are not measured again. ``kernels``: only kernels whose name contains one of these.
    With ``processes`` (default :func:`build_processes`) above 1, the builds with each kernel on
    its default are made that many at once first. Returns the verdicts written."""
    return _check_records(config, target, tuning_logs, timer, pairs, kernels, out, max_per_kernel, processes)[0]


def _check_records(config, target, tuning_logs, timer, pairs, kernels, out, max_per_kernel=3, processes=None,
                   default_options: bool = False):
    """:func:`check_records`, returning also the last build: the one ``build`` now makes (with
    ``default_options``: in the target's default options, whatever options verdict there is)."""
    timer = timer or PassTimer()
    folder = log_folder(tuning_logs, target)
    written = []

    def mirror(vetoes=()):  # the folder's logs and verdicts (not its options, with default_options)
        return _mirror(folder, vetoes, options=not default_options, defaults_for=config if default_options else None)

    def mirrored(vetoes=()):
        with mirror(vetoes) as root:
            return _build(config, target, root)
    base = mirrored()
    # the kernels of the options the build took (a tuned chunk size names other GEMMs)
    known = {t.kernel.name: t.kernel for t in extract_tasks([base.config], target=target)}

    def unchecked(name):  # the record the kernel takes, where it is to be checked: (key, JSON, origin)
        taken = base.records.get(name)
        if taken is None or (kernels and not any(k in name for k in kernels)):
            return None
        kernel = known.get(name)
        origin = records.record_origin(taken["record"], records.seeded_traces(kernel, target) if kernel else None)
        if origin == "default" or PassChecks(folder).verdict(taken["workload"], taken["record"]) is not None:
            return None
        return taken["workload"], taken["record"], origin

    with contextlib.ExitStack() as stack:
        cache = stack.enter_context(_own_build_cache())
        first = {}  # kernel -> its record to check; kernels sharing a workload (and record) checked once
        for name in sorted(base.records):
            found = unchecked(name)
            if found and all(found[0] != key for key, _, _ in first.values()):
                first[name] = found
        # each kernel's build on its default, over a mirror that lives through the checks
        roots = {name: stack.enter_context(mirror([(key, None)])) for name, (key, _, _) in first.items()}
        processes = build_processes() if processes is None else processes
        if processes > 1 and len(roots) > 1 and CELLS.get(config.cell.name) is config.cell and runnable_here(target):
            _prebuild(config, target, [(root, config.options) for root in roots.values()], processes, cache, out)
        for name in first:
            for attempt in range(max_per_kernel):
                found = unchecked(name)
                if found is None:
                    break
                key, record_json, origin = found
                where = re.sub(r"^.*?/tvmrnn-pass-[^/]+/[^/]+", lambda _: folder, base.records[name]["where"])
                try:
                    if attempt == 0:
                        without = _build(config, target, roots[name], cache=True)  # the kernel on its default
                    else:
                        without = mirrored(vetoes=[(key, None)])
                except Exception as err:  # noqa: BLE001 - said, and the next kernel checked
                    out(f"  {name}: the build with it on its default failed ({type(err).__name__}: "
                        f"{str(err)[:120]}); not checked")
                    break
                result = compare(base, without, timer, pairs)
                _forget(timer, without)
                vetoed = result.verdict == "faster"
                out(f"  {name} ({origin} record, {where}): with it -> on its default: {result.line()}"
                    f"{' -> vetoed' if vetoed else ''}")
                written.append(PassChecks(folder).add_record(
                    key, record_json, "vetoed" if vetoed else "kept", kernel=name, origin=origin, where=where,
                    config=describe(config), **result.summary(), length=getattr(timer, "T", None)))
                if not vetoed:
                    break
                if attempt == max_per_kernel - 1:  # that many in a row: the folder's others are not tried
                    # one by one (vetoed by digest: records a later search adds are still checked)
                    rest = [record for _, record, _ in records.LogIndex(folder).fastest(key)]
                    for record in rest:
                        written.append(PassChecks(folder).add_record(
                            key, record, "vetoed", kernel=name, config=describe(config), length=getattr(timer, "T", None),
                            reason=f"{max_per_kernel} of the kernel's records in a row slowed the pass"))
                    out(f"  {name}: {max_per_kernel} records in a row vetoed; its {len(rest)} other logged records "
                        "vetoed with them")
                _forget(timer, base)
                base = mirrored()  # with the veto: the kernel's next record
    _forget(timer, base)
    return written, base


def tune_passes(configs, target, tuning_logs=None, timer=None, pairs: int = 15, kernels=None,
                out=print, candidates=None) -> list[Comparison]:
    """For each configuration, :func:`check_records` in the target's default options (those
    :func:`tune_options` measures from, whatever an earlier run chose), so that the options are
    measured on a build whose records hold in the pass; :func:`tune_options` (over
    ``candidates``, default :func:`option_candidates`); :func:`check_records` again (the records
    of kernels the options chosen bring); then what it all comes to: the build ``build`` now makes
    against one with no record and the target's defaults (:func:`tuned_gain`). Where that build is
    slower, the options tuned are retracted (the defaults written as the verdict, the options kept
    in it as ``retracted``), the records checked again in the default options, and the build
    compared once more: options chosen around records that slow the pass (v53: a slow searched
    bf16 projection, then ``weight_panels=False`` to avoid it, 2x slower in all) never stand.
    Returns the last comparison of each configuration."""
    timer = timer or PassTimer()
    gains = []
    for config in configs:
        out(f"whole passes of {describe(config)} on {records.target_key(target)}:")
        _check_records(config, target, tuning_logs, timer, pairs, kernels, out, default_options=True)
        verdict = tune_options(config, target, tuning_logs, timer, pairs, candidates=candidates, out=out)
        _, built = _check_records(config, target, tuning_logs, timer, pairs, kernels, out)
        gain = tuned_gain(config, target, tuning_logs, timer, pairs, tuned=built)
        out(f"{describe(config)}, no records and default options -> as built now: {gain.line()}")
        if gain.verdict == "slower":
            gain = _retract_options(config, target, tuning_logs, timer, pairs, kernels, out, gain, verdict)
        gains.append(gain)
    return gains


def _retract_options(config, target, tuning_logs, timer, pairs, kernels, out, gain, taken) -> Comparison:
    """:func:`tune_passes`'s answer to a build slower than no records and default options: the
    options verdict ``taken`` that :func:`tune_options` wrote in this run (None where the
    configuration sets the options itself) is retracted and the records checked again; then the
    build with the options is timed against it once more, and where the options are faster after
    all (the records were what slowed it), they are written back (``restored``)."""
    folder = log_folder(tuning_logs, target)
    key = config_key(config)
    if taken and taken.get("options"):
        PassChecks(folder).add_options(key, {}, describe=describe(config), retracted=taken["options"],
                                       reason=f"as built with them, the passes took {gain.ratio:.3f}x the time of "
                                              "no records and default options", length=getattr(timer, "T", None))
        out(f"  options {taken['options']} retracted: the build with them is slower; records checked again "
            "in the default options")
        _, built = _check_records(config, target, tuning_logs, timer, pairs, kernels, out)
        # the retraction stands only if it helped: the same records with the options again
        restored = _build_with(config, target, folder, taken["options"])
        back = compare(built, restored, timer, pairs)
        if back.verdict == "faster":
            PassChecks(folder).add_options(key, taken["options"], describe=describe(config), restored=True,
                                           reason=f"with the records as checked again, the options took "
                                                  f"{back.ratio:.3f}x the passes' time without them",
                                           length=getattr(timer, "T", None))
            out(f"  options {taken['options']} restored: without them -> with them: {back.line()}")
            built, restored = restored, built  # (the build that build now makes)
        _forget(timer, restored)
        gain = tuned_gain(config, target, tuning_logs, timer, pairs, tuned=built)
        out(f"{describe(config)}, no records and default options -> as built now: {gain.line()}")
    if gain.verdict == "slower":
        out(f"WARNING: {describe(config)} still builds slower than with no records and default options: "
            "`tvmrnn-tune --list` shows the records it takes; TVMRNN_TUNING_LOGS=off builds without them")
    return gain


def _build_with(config, target, folder, options: dict):
    """``config`` built from ``folder``'s records and record verdicts in ``options`` (an options
    verdict's fields) over its own, whatever options verdict the folder holds."""
    with _mirror(folder, defaults_for=config) as root:
        return _build(config, target, root, records.with_tuned_fields(config.options, options))


def tuned_gain(config, target, tuning_logs=None, timer=None, pairs: int = 15, tuned=None) -> Comparison:
    """``config`` built with no record and the target's default options, against the build that
    ``build`` makes from ``tuning_logs`` (records, verdicts, tuned options; ``tuned``, where the
    caller has it already), timed in turn."""
    timer = timer or PassTimer()
    plain = _build(config, target, False)
    tuned = tuned or _mirrored_build(config, target, log_folder(tuning_logs, target))
    try:
        return compare(plain, tuned, timer, pairs)
    finally:
        _forget(timer, plain)
        _forget(timer, tuned)


def _forget(timer, rnn) -> None:
    if hasattr(timer, "forget"):
        timer.forget(rnn)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value
