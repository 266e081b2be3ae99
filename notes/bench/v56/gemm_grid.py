"""Every block shape x every split of the reduction, for the tiled (SIMT) GEMMs of some builds (v56):
the data to choose the tiled GEMM's default shape and split-K together (``cuda.matmul_shape``,
``cuda.matmul_k_slices``).

The kernels are the tasks of the given sweep configs (``tvmrnn.tune.tasks.extract_tasks``) whose GPU
schedule is the SIMT tiled GEMM. Each candidate (``tiles={"matmul": {rows, cols, k_slices}}``) is
scheduled and compiled in a pool of worker processes (the GPU host's cores), exported, then loaded
and timed one at a time by this process (``time_evaluator``, the median of 7 repeats of 30 runs, a
split-K candidate's two kernels together). Writes one JSON line a candidate and prints, per kernel,
the default's time against the best.

    python notes/bench/v56/gemm_grid.py OUT.jsonl scripts/configs/sweep.json notes/bench/v45/floor.json
    python notes/bench/v56/gemm_grid.py --list --target nvidia/nvidia-h100 x.jsonl scripts/configs/sweep.json
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
from tvmrnn.schedules import apply
from tvmrnn.schedules.common import _gpu_kind, fused_epilogue, uses_tf32
from tvmrnn.schedules.cuda import GPU_MATMUL, GPU_MATMUL_SHAPES, matmul_extents, matmul_k_slices, matmul_shape
from tvmrnn.schedules.split_k import persistent_blocks
from tvmrnn.tune.tasks import extract_tasks

SLICES = (1, 2, 4, 8)
CHUNKS = ("_t32_", "_t256_")
CELL_GATES = "_g4"  # the LSTM's alone (the GRU's are the same GEMMs, 3/4 the columns or rows)  # the all-steps GEMMs of most of a pass (not the short tails)
TARGET = None
KERNELS = {}


def gemm_kernels(configs, target):
    out = []
    for task in extract_tasks(configs, target=target):
        k = task.kernel
        if (k.gemm is None or persistent_blocks(k.func) or uses_tf32(k.func) or not task.calls
                or not any(c in k.name for c in CHUNKS) or (CELL_GATES and not k.name.endswith(CELL_GATES))):
            continue
        sch = s_tir.Schedule(s_tir.renew_defs(k.func))
        if _gpu_kind(sch, k) != "matmul":
            continue
        out.append((k, task.calls, bool(fused_epilogue(sch, k))))
    return out


def candidates(kernel, epilogue, sms):
    rows, cols, red = matmul_extents(kernel)
    default_shape = matmul_shape(rows, cols, sms)
    default_slices = 1 if epilogue else matmul_k_slices(rows, cols, red, default_shape, GPU_MATMUL["k_tile"], sms)
    out = []
    for si, shape in enumerate(GPU_MATMUL_SHAPES):
        for s in (1,) if epilogue else SLICES:
            if s > 1 and (red % s or (red // s) % GPU_MATMUL["k_tile"] or red // s < 64):
                continue
            out.append(dict(shape=si, slices=s, default=shape == default_shape and s == default_slices))
    return (rows, cols, red), out


def _init_worker(target, config_paths):
    """A spawned worker (CUDA cannot be used in a child forked after its parent touched it): the
    same kernels, found again."""
    global TARGET
    warnings.simplefilter("ignore")
    TARGET = tvmrnn.device.resolve(target)
    for k, _, _ in gemm_kernels(_configs(config_paths), TARGET):
        KERNELS[k.name] = k


def _configs(paths):
    configs = []
    for path in paths:
        configs += configs_from(argparse.Namespace(config=path, cells=None, dtype="float32"))
    return configs


def build_one(job):
    name, c, path = job
    kernel = KERNELS[name]
    shape = GPU_MATMUL_SHAPES[c["shape"]]
    try:
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
        apply(sch, kernel, TARGET, matmul=dict(rows=shape[0], cols=shape[1], k_slices=c["slices"]))
        with tvm.transform.PassContext(config={"tirx.disable_cse_tir": True}):
            mod = tvm.compile(tvm.IRModule({"main": sch.mod["main"]}), target=TARGET)
        mod.export_library(path)
        return path, None
    except Exception as err:  # a candidate the template refuses
        return None, f"{type(err).__name__}: {str(err)[:200]}"


def main():
    global TARGET
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("configs", nargs="+")
    p.add_argument("--target", default="cuda")
    p.add_argument("--list", action="store_true", help="count the candidates only (no GPU)")
    p.add_argument("--kernels", nargs="*", help="only kernels whose name contains one of these")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2))
    a = p.parse_args()
    warnings.simplefilter("ignore")
    TARGET = tvmrnn.device.resolve(a.target)
    sms = tvmrnn.device.device_model(TARGET).multiprocessors or 132
    kernels = gemm_kernels(_configs(a.configs), TARGET)
    jobs, meta = [], {}
    tmp = tempfile.mkdtemp()
    if a.kernels:
        kernels = [x for x in kernels if any(s in x[0].name for s in a.kernels)]
    for k, calls, epilogue in kernels:
        KERNELS[k.name] = k
        extents, cands = candidates(k, epilogue, sms)
        meta[k.name] = dict(extents=extents, calls=calls, epilogue=epilogue)
        for i, c in enumerate(cands):
            jobs.append((k.name, c, os.path.join(tmp, f"{k.name}_{i}.so")))
    print(f"{len(kernels)} GEMM kernels, {len(jobs)} candidates", flush=True)
    if a.list:
        for name, m in meta.items():
            print(f"  {name:50s} {m['extents']} calls {m['calls']} epilogue {m['epilogue']}")
        return
    dev = tvm.cuda(0)
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    results = {}
    with ctx.Pool(a.workers, _init_worker, (a.target, a.configs)) as pool, open(a.out, "w") as out:
        for job, (path, err) in zip(jobs, pool.imap(build_one, jobs, chunksize=2)):
            name, c, _ = job
            row = dict(kernel=name, **meta[name], **c, shape_tiles=GPU_MATMUL_SHAPES[c["shape"]])
            if err:
                row["error"] = err
            else:
                try:
                    mod = tvm.runtime.load_module(path)
                    func = KERNELS[name].func
                    rng = np.random.default_rng(0)
                    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in q.shape])
                                               .astype("float32"), device=dev) for q in func.params]
                    timer = mod.time_evaluator("main", dev, number=30, repeat=7)
                    row["us"] = float(np.median(timer(*args).results)) * 1e6
                except Exception as err2:
                    row["error"] = f"{type(err2).__name__}: {str(err2)[:200]}"
                os.remove(path)
            results.setdefault(name, []).append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
    print(f"built and timed in {time.time() - t0:.0f} s", flush=True)
    for name, rows in results.items():
        ok = [r for r in rows if "us" in r]
        if not ok:
            continue
        best = min(ok, key=lambda r: r["us"])
        default = next((r for r in ok if r["default"]), None)
        d = f"{default['us']:8.1f}" if default else "     n/a"
        print(f"{name:50s} {str(meta[name]['extents']):20s} default {d} best {best['us']:8.1f} "
              f"(shape {best['shape']} slices {best['slices']})")


if __name__ == "__main__":
    main()
