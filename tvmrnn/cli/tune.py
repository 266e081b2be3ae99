"""tvmrnn-tune: tune tvmrnn's kernels for this machine (or remote ones) with MetaSchedule.

    tvmrnn-tune lstm gru --input-size 800 --hidden-size 800 --batch-size 20 --trials 64
    tvmrnn-tune --config scripts/configs/ds2.json --trials 32 --max-tasks 8
    tvmrnn-tune --config scripts/configs/ds2.json --target cpu --kernels recurrent_step
    tvmrnn-tune --config scripts/configs/ds2.json --target nvidia/nvidia-h100 --list
    tvmrnn-tune --config scripts/configs/ds2.json --target nvidia/nvidia-h100 --distill

Without --target it tunes for this machine's GPU if the driver reports one (its compute
capability), else for this CPU (LLVM's host detection, AVX-512 where the CPU has it). Records
go to <log-dir>/<target>/, one new pair of files per run; re-running resumes, counting the
trials already logged, and a killed run keeps everything measured before it died. ``build``
reads the same folder, so what this tunes is used by the next build. Ends with each task's best
latency and how much of a training step it accounts for.

--list shows each task with what the raw logs and the shipped records hold for it. --distill
writes the target's compact records file (the package's shipped records, tvmrnn/records/) from
its raw logs; --compress xz-compresses the raw logs of finished runs (the repository keeps its
histories so), which every reader of the logs reads as they are.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import lzma
import os
import shutil
import sys
import time

import tvmrnn
from tvmrnn import device as targets
from tvmrnn.cells import find_cell
from tvmrnn.cli import positive_int, usage_errors
from tvmrnn.options import BuildOptions, use_cpu_threads
from tvmrnn.program.passes import Config, projections_refused
from tvmrnn.runtime.build import with_compiled_rows
from tvmrnn.tune import records, tasks

SIZE_KEYS = ("input_size", "hidden_size", "num_layers", "bidirectional", "batch_size")


def detect_target(name: str | None):
    if name in (None, "auto"):
        import tvm
        return targets.cuda_target() if tvm.cuda(0).exist else targets.host_target()
    if name == "cpu":
        return targets.host_target()
    return targets.resolve(json.loads(name) if name.startswith("{") else name)


def configs_from(args) -> list[Config]:
    """The configurations the command line and ``--config`` name; ValueError for a bad one (an error of
    use: status 2)."""
    entries = []
    if args.config:
        with open(args.config) as f:
            entries = json.load(f)
        if not isinstance(entries, list):
            raise ValueError(f"{args.config}: expected a JSON list of configurations")
    if args.cells:
        entries.append({"cell": args.cells, "input_size": args.input_size, "hidden_size": args.hidden_size,
                        "num_layers": args.num_layers, "bidirectional": args.bidirectional,
                        "batch_size": args.batch_size, "proj_size": getattr(args, "proj_size", 0)})
    if not entries:
        raise ValueError("give cells and sizes, or --config FILE")
    configs = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise ValueError(f"configuration {i + 1}: expected a JSON object (cell, sizes), got {e!r}")
        missing = [k for k in ("cell", "input_size", "hidden_size", "batch_size") if e.get(k) is None]
        if missing:
            raise ValueError(f"configuration {i + 1}: missing {', '.join(missing)}")
        for cell in e["cell"] if isinstance(e["cell"], list) else [e["cell"]]:
            try:
                sizes = [int(e["input_size"]), int(e["hidden_size"]), int(e.get("num_layers", 1)), int(e["batch_size"])]
                if min(sizes) < 1:
                    raise ValueError(f"sizes must be 1 or more, got input_size, hidden_size, num_layers, "
                                     f"batch_size = {sizes}")
                fields = dict(e.get("options", {}))
                dtype = getattr(args, "dtype", "float32")
                if dtype != "float32":  # --dtype: every configuration that names none
                    fields.setdefault("dtype", dtype)
                options = BuildOptions.from_dict(fields)
                input_size, hidden_size, num_layers, batch_size = sizes
                proj_size = int(e.get("proj_size") or 0)
                if proj_size < 0:
                    raise ValueError(f"proj_size must be 0 (none) or more, got {proj_size}")
                configs.append(Config(find_cell(cell), input_size, hidden_size, num_layers,
                                      bool(e.get("bidirectional", False)), batch_size, False, options,
                                      proj_size=proj_size))
            except (TypeError, ValueError) as err:
                raise ValueError(f"configuration {i + 1}: {err}") from None
    return configs


def table(results, out=print):
    rows = [(t.kernel.name, t.calls, trials, best) for t, best, trials in results]
    total = sum(calls * best for _, calls, _, best in rows if best)
    out(f"\n{'task':48s} {'runs/step':>9s} {'trials':>6s} {'best (us)':>10s} {'share':>6s}")
    for name, calls, trials, best in rows:
        share = f"{100 * calls * best / total:5.1f}%" if best and total else "     -"
        out(f"{name:48s} {calls:9d} {trials:6d} {best if best else float('nan'):10.1f} {share}")
    if total:
        out(f"tuned kernels' time per training step + inference pass at T={tasks.REFERENCE_LENGTH}: "
            f"{total / 1e3:.2f} ms (kernel time only: no launch gaps)")


def _printer():
    """Lines above the progress bar on a terminal (tqdm.write), else plain prints."""
    if sys.stderr.isatty():
        from tqdm import tqdm
        return tqdm.write
    return lambda line: print(line, flush=True)


def as_built(configs, target, log_dir) -> list[Config]:
    """The configurations with the pass-level options a whole-pass stage chose for them, as
    ``build`` applies them: the search and --list then see the kernels a build will have."""
    return [with_compiled_rows(dataclasses.replace(c, options=records.tuned_options(c, target, log_dir, c.options)),
                               target) for c in configs]


def list_tasks(configs, target, a, folder):
    """Each task with its raw-log trials and best time, and the shipped record's time and origin."""
    logs = records.LogIndex(folder) if os.path.isdir(folder) else None
    path = records.records_file(target)
    shipped = records.RecordDatabase(path) if path else None
    print(f"raw logs: {folder if logs else folder + ' (none)'}; shipped records: {path or '(none for this target)'}")
    print(f"\n{'task':52s} {'runs/step':>9s} {'trials':>6s} {'logs (us)':>10s} {'origin':>8s} "
          f"{'shipped (us)':>12s} {'origin':>8s} whole pass")
    for t in tasks.select_tasks(configs, target, a.kernels or None, a.max_tasks):
        key = records.workload_key(t.kernel)
        fastest = (logs.fastest(key) or [None])[0] if logs else None
        logged = fastest[0] if fastest else None
        logged_origin = records.record_origin(fastest[1], records.seeded_traces(t.kernel, target)) if fastest else "-"
        entry = shipped.entries.get(key) if shipped else None
        best = next((r for r in entry["records"] if not (logs and logs.checks.vetoed(key, r["record"]))), None) \
            if entry else None
        trials = (logs.counts.get(key, 0) if logs else 0) or (entry.get("trials", 0) if entry else 0)
        print(f"{t.kernel.name:52s} {t.calls:9d} {trials:6d} "
              f"{logged * 1e6 if logged else float('nan'):10.1f} {logged_origin:>8s} "
              f"{best['us'] if best else float('nan'):12.1f} "
              f"{(best.get('origin') or 'unknown') if best else '-':>8s} {_pass_verdicts(logs, key, fastest, logged_origin)}")


def _pass_verdicts(logs, key, fastest, origin) -> str:
    """What the whole-pass checks said: the logs' best record kept (or unchecked; a default
    schedule is what records are checked against), and how many of the workload's were vetoed."""
    if logs is None:
        return "-"
    vetoed = len(logs.fastest(key, vetoed=True)) - len(logs.fastest(key))
    verdict = logs.checks.verdict(key, fastest[1]) if fastest else None
    said = verdict["verdict"] if verdict else "-" if not fastest or origin == "default" else "unchecked"
    return said + (f", {vetoed} vetoed" if vetoed else "")


def compress(folder):
    """xz-compress the plain JSON files of finished runs in ``folder`` (a run is finished once no
    process writes it: give this only folders no tuning run is using). The whole-pass verdicts
    (``pass_checks.json``) stay as they are: they are rewritten, and read only plain."""
    paths = glob.glob(os.path.join(folder, "*_workload.json")) + glob.glob(os.path.join(folder, "*_tuning_record.json"))
    for path in sorted(paths):
        with open(path, "rb") as src, lzma.open(path + ".xz.tmp", "wb", preset=9 | lzma.PRESET_EXTREME) as dst:
            shutil.copyfileobj(src, dst)
        os.replace(path + ".xz.tmp", path + ".xz")
        os.remove(path)
        print(f"compressed {path} -> {path}.xz")


@usage_errors("tvmrnn-tune")
def main(argv=None):
    p = argparse.ArgumentParser(prog="tvmrnn-tune", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("cells", nargs="*", help=f"cells to tune: {', '.join(sorted(tvmrnn.CELLS))}, an example "
                                            f"custom cell (tvmrnn.cells.examples) or module:attribute")
    p.add_argument("--input-size", type=positive_int)
    p.add_argument("--hidden-size", type=positive_int)
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--proj-size", type=positive_int, default=0, help="the LSTM's projections (tvmrnn.build(proj_size=))")
    p.add_argument("--num-layers", type=positive_int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="the builds' dtype (tvmrnn.build(dtype=); with --config, for entries whose options name "
                        "none): a half build tunes the kernels it runs (TF32 tiles on GPUs, bf16 GEMMs on CPUs)")
    p.add_argument("--config", help="a JSON list of {cell (name or list), input_size, hidden_size, batch_size, "
                                    "num_layers, bidirectional, options (BuildOptions fields)}")
    p.add_argument("--target", help='"cpu", "cuda", a tag ("nvidia/nvidia-h100") or a JSON target dict; '
                                    "default: this machine's GPU, else its CPU")
    p.add_argument("--trials", type=positive_int, default=64, help="trials per task, counting those already logged")
    p.add_argument("--log-dir", default=None, help="folder of per-target raw logs; default: TVMRNN_TUNING_LOGS, "
                                                   "else the repository's tuning_logs/ in a source checkout, else "
                                                   "~/.local/share/tvmrnn/tuning_logs (build reads the same)")
    p.add_argument("--kernels", nargs="*", help="only tasks whose name contains one of these")
    p.add_argument("--max-tasks", type=positive_int, help="only the N tasks with the largest share of a training step "
                                                 "(measured where the log has them, else estimated from FLOPs)")
    p.add_argument("--warm-start-from", help="another log folder (other target or shapes) to seed new tasks from")
    p.add_argument("--no-default-seed", action="store_true",
                   help="do not measure each new task's default schedule first (it becomes a record, so a "
                        "tuned schedule is never slower than the default)")
    p.add_argument("--reseed-defaults", action="store_true",
                   help="measure the default schedule (and its other shapes) again on every selected task, "
                        "also those with records: after the default schedule changed (nothing is removed)")
    p.add_argument("--rpc-tracker", help="HOST:PORT of a TVM RPC tracker (python -m tvm.exec.rpc_tracker): "
                        "candidates are measured on all its free servers under --rpc-key at once (one a GPU: "
                        "python -m tvmrnn.tune.rpc_server, see CONTRIBUTING.md)")
    p.add_argument("--rpc-key", help="the device key the RPC servers registered with")
    p.add_argument("--trials-per-iter", type=positive_int, default=16)
    p.add_argument("--space", choices=("template", "generic"), default="template",
                   help="what the search explores: each kernel's schedule template over its knobs (default), "
                        "or MetaSchedule's own rules")
    p.add_argument("--population", type=positive_int, default=64, help="the evolutionary search's population per task")
    p.add_argument("--seed", type=int, default=1, help="the search's random seed")
    p.add_argument("--no-pass-check", action="store_true",
                   help="after tuning, do not measure whole passes (by default each configuration's pass-level "
                        "options are tuned and each record that is not a default schedule is checked in the "
                        "pass: one that slows it is vetoed; verdicts in <log folder>/pass_checks.json)")
    p.add_argument("--passes-only", action="store_true",
                   help="only the whole-pass stage, on the records logged so far (on the device measured)")
    p.add_argument("--pass-pairs", type=int, default=15, help="interleaved pairs per whole-pass comparison")
    p.add_argument("--pass-length", type=int, default=100, help="the sequence length whole passes are timed at")
    p.add_argument("--list", action="store_true", help="list the tasks and what the logs and shipped records hold; "
                                                       "tune nothing")
    p.add_argument("--distill", nargs="?", const="", metavar="OUT",
                   help="write the target's compact records file from its raw logs (default OUT: the package's "
                        "tvmrnn/records/<target>.jsonl); the configurations name its workloads; tune nothing")
    p.add_argument("--compress", action="store_true", help="xz-compress the target's raw log files; tune nothing")
    a = p.parse_args(argv)
    if bool(a.rpc_tracker) != bool(a.rpc_key):
        p.error("--rpc-tracker and --rpc-key go together")
    if a.pass_pairs < 3 or a.pass_length < 1:
        p.error("--pass-pairs must be 3 or more, --pass-length 1 or more")
    target = detect_target(a.target)
    log_dir = records.logs_root(a.log_dir)
    folder = os.path.join(log_dir, records.target_key(target))
    if a.compress:
        return compress(folder)
    # --distill names the workloads of the configurations given, if any; tuning and --list need some
    configs = [] if a.distill is not None and not (a.cells or a.config) else configs_from(a)
    for c in configs:
        refused = projections_refused(c, target)
        if refused:
            raise ValueError(f"proj_size: {refused}")
    if a.distill is not None:
        if not os.path.isdir(folder):
            raise ValueError(f"--distill: no raw logs in {folder}")
        kernels = [t.kernel for t in tasks.extract_tasks(configs, target=target)] if configs else []
        out = a.distill or os.path.join(records.RECORDS_DIR, records.target_key(target) + ".jsonl")
        records.distill(folder, target, out, kernels, made_by="tvmrnn-tune --distill", out=print)
        return
    print(f"target {target.export()} -> {folder}")
    if a.list:
        return list_tasks(as_built(configs, target, log_dir), target, a, folder)
    out = _printer()
    if a.passes_only:
        return tune_passes(configs, target, log_dir, a, out)
    from tvmrnn.tune import tuner  # the tuning loop: MetaSchedule's builders, runners and search
    runner = None  # local measurements
    if a.rpc_tracker:  # made here, once, so that a tracker that does not answer is a usage error
        try:
            runner = tuner.default_runner(target, a.rpc_tracker, a.rpc_key, out=out)
        except (RuntimeError, ValueError) as e:
            p.error(str(e))
    if target.kind.name == "llvm":
        use_cpu_threads(BuildOptions())  # measure with the threads a build will run with
    start = time.time()
    try:
        results = tuner.tune(as_built(configs, target, log_dir), target, log_dir=log_dir, trials_per_task=a.trials, kernels=a.kernels,
                             max_tasks=a.max_tasks, runner=runner,
                             num_trials_per_iter=a.trials_per_iter, warm_start_from=a.warm_start_from, seed=a.seed,
                             seed_default=not a.no_default_seed, reseed_defaults=a.reseed_defaults,
                             space=a.space, population=a.population, out=out, progress_bar=sys.stderr.isatty())
    except KeyboardInterrupt:
        print(f"\ninterrupted: every record measured so far is in {folder}; run again to resume")
        raise SystemExit(130)
    table(results)
    print(f"searched in {time.time() - start:.0f} s; logs in {folder}")
    if a.no_pass_check:
        return
    if a.rpc_tracker:
        print("\nwhole-pass checks skipped: the candidates were measured remotely. On the device, run this "
              "command again with --passes-only.")
        return
    tune_passes(configs, target, log_dir, a, out)
    print(f"done in {time.time() - start:.0f} s")


def tune_passes(configs, target, log_dir, a, out):
    """The whole-pass stage (:mod:`tvmrnn.runtime.pass_tuning`) on this machine's device."""
    from tvmrnn.runtime import cache, pass_tuning
    here = cache.runnable_here(target)
    if here:  # another CPU's code may not run on this one; another GPU's timings are not its own
        local = targets.host_target() if target.kind.name == "llvm" else targets.cuda_target()
        # (a CPU with the same cores counts: LLVM has named the GPU machine's Xeon both ways)
        here = records.target_key(target) in records.same_cores(local)
    if not here:
        raise SystemExit(f"whole passes for {records.target_key(target)} must run on that device; run "
                         f"tvmrnn-tune --passes-only there")
    print(f"\nwhole passes (T={a.pass_length}, {a.pass_pairs} interleaved pairs a comparison):")
    pass_tuning.tune_passes(configs, target, log_dir, pass_tuning.PassTimer(a.pass_length), a.pass_pairs,
                            kernels=a.kernels, out=out)
    print(f"verdicts in {os.path.join(pass_tuning.log_folder(log_dir, target), 'pass_checks.json')}")


if __name__ == "__main__":
    main()
