"""The tiled (SIMT) GEMM with its shared-memory tiles filled by ``cp.async`` in a multi-stage
software pipeline (``gpu_matmul(async_stages=)``), against the default (no pipeline), kernel by
kernel (v61).

The kernels are the SIMT-GEMM tasks of the given sweep configs whose names contain one of
``--kernels``. Each variant is scheduled and compiled in a pool of worker processes, then every
variant of a kernel is timed in rounds (``time_evaluator``, 20 runs a round, the variants
interleaved round by round, the median over rounds), on the same inputs, and its outputs are
compared with the default's. One JSON line a variant.

    python notes/bench/v61/gemm_async.py OUT.jsonl scripts/configs/sweep_large.json --kernels n256_h1024
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time
import warnings

os.environ.setdefault("TVMRNN_CACHE", "off")

import numpy as np
import tvm
from tvm import s_tir

import tvmrnn
from tvmrnn.cli.tune import configs_from
from tvmrnn.program.sequence import compile_module
from tvmrnn.schedules import apply
from tvmrnn.schedules.common import _gpu_kind, uses_tf32
from tvmrnn.schedules.cuda import matmul_extents
from tvmrnn.schedules.split_k import persistent_blocks
from tvmrnn.tune.tasks import extract_tasks

VARIANTS = {
    "default": {},
    "async2": dict(async_stages=2),
    "async3": dict(async_stages=3),
    "async4": dict(async_stages=4),
    "async3_k8": dict(async_stages=3, k_tile=8),
    "async4_k8": dict(async_stages=4, k_tile=8),
    "async2_k32": dict(async_stages=2, k_tile=32),
    "sync2": dict(pipeline=True),
}
TARGET = None
KERNELS = {}


def gemm_kernels(configs, target, wanted):
    out = []
    for task in extract_tasks(configs, target=target):
        k = task.kernel
        if k.gemm is None or persistent_blocks(k.func) or uses_tf32(k.func) or not task.calls:
            continue
        if wanted and not any(w in k.name for w in wanted):
            continue
        if _gpu_kind(s_tir.Schedule(s_tir.renew_defs(k.func)), k) != "matmul":
            continue
        out.append((k, task.calls))
    return out


def _configs(paths):
    configs = []
    for path in paths:
        configs += configs_from(argparse.Namespace(config=path, cells=None, dtype="float32"))
    return configs


def _init_worker(target, config_paths, wanted):
    global TARGET
    warnings.simplefilter("ignore")
    TARGET = tvmrnn.device.resolve(target)
    for k, _ in gemm_kernels(_configs(config_paths), TARGET, wanted):
        KERNELS[k.name] = k


def build_one(job):
    name, variant, path = job
    kernel = KERNELS[name]
    try:
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
        apply(sch, kernel, TARGET, matmul=dict(VARIANTS[variant]))
        mod = compile_module(tvm.IRModule({"main": sch.mod["main"]}), TARGET)
        mod.export_library(path)
        return path, None
    except Exception as err:  # a variant the template or the device refuses
        return None, f"{type(err).__name__}: {str(err)[:300]}"


def main():
    global TARGET
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("configs", nargs="+")
    p.add_argument("--target", default="cuda")
    p.add_argument("--kernels", nargs="*", default=[])
    p.add_argument("--variants", nargs="*", default=list(VARIANTS))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    p.add_argument("--compile-only", action="store_true", help="build every variant, time none (no GPU)")
    a = p.parse_args()
    warnings.simplefilter("ignore")
    TARGET = tvmrnn.device.resolve(a.target)
    kernels = gemm_kernels(_configs(a.configs), TARGET, a.kernels)
    tmp = tempfile.mkdtemp()
    jobs = [(k.name, v, os.path.join(tmp, f"{k.name}_{v}.so")) for k, _ in kernels for v in a.variants]
    for k, _ in kernels:
        KERNELS[k.name] = k
    print(f"{len(kernels)} kernels, {len(jobs)} variants", flush=True)
    t0 = time.time()
    built = {}
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(a.workers, _init_worker, (a.target, a.configs, a.kernels)) as pool:
        for job, (path, err) in zip(jobs, pool.imap(build_one, jobs)):
            built[job[:2]] = (path, err)
            if err:
                print(f"  {job[0]} {job[1]}: {err}", flush=True)
    print(f"built in {time.time() - t0:.0f} s", flush=True)
    if a.compile_only:
        return
    dev = tvm.cuda(0)
    with open(a.out, "w") as out:
        for k, calls in kernels:
            func = k.func
            rng = np.random.default_rng(0)
            host = [rng.standard_normal([int(d) for d in q.shape]).astype("float32") for q in func.params]
            rows, cols, red = matmul_extents(k)
            flops = 2.0 * rows * cols * red
            mods, results, args = {}, {}, {}
            for v in a.variants:
                path, err = built[(k.name, v)]
                if err:
                    results[v] = dict(error=err)
                    continue
                mods[v] = tvm.runtime.load_module(path)
                args[v] = [tvm.runtime.tensor(h, device=dev) for h in host]
                mods[v]["main"](*args[v])
                dev.sync()
            times = {v: [] for v in mods}
            for _ in range(a.rounds):
                for v in mods:
                    timer = mods[v].time_evaluator("main", dev, number=20, repeat=1)
                    times[v].append(timer(*args[v]).mean)
            ref = [x.numpy() for x in args["default"]] if "default" in args else None
            for v in a.variants:
                row = dict(kernel=k.name, extents=[rows, cols, red], calls=calls, variant=v, **results.get(v, {}))
                if v in times:
                    us = float(np.median(times[v])) * 1e6
                    row.update(us=us, tflops=flops / us * 1e-6)
                    if ref is not None:  # the outputs (timing reran the kernel: outputs are overwritten, not accumulated)
                        got = [x.numpy() for x in args[v]]
                        row["max_rel_diff"] = max(float(np.abs(g - r).max() / (np.abs(r).max() + 1e-30))
                                                  for g, r in zip(got, ref))
                out.write(json.dumps(row) + "\n")
                out.flush()
            line = " ".join(f"{v} {np.median(times[v]) * 1e6:8.1f}" for v in times)
            best = min(times, key=lambda v: np.median(times[v]))
            print(f"{k.name:48s} {rows}x{cols}x{red} {line}  best {best}", flush=True)


if __name__ == "__main__":
    main()
