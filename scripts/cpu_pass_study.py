#!/usr/bin/env python3
"""Whole CPU passes of tvmrnn variants beside PyTorch, interleaved in one process.

    python scripts/cpu_pass_study.py lstm --threads 16 --variants kmajor kmajor-huge panels panels-huge
    THP_MEM_ALLOC_ENABLE=1 python scripts/cpu_pass_study.py lstm --variants panels-huge   # PyTorch on 2 MB pages too

On a shared VM (the GPU machine's Xeon) the same pass moves by 20-40% within minutes, so a variant
timed in a block of its own cannot be compared with one timed later (notes/performance.md v12, v19).
Here every round times PyTorch and each variant in turn (``--reps`` calls each, after a warm-up);
the report gives each one's median over all calls, the range of its rounds' medians, and its ratio
to PyTorch's median. Variants (``--variants``, by name, :data:`VARIANTS`) set how tvmrnn builds
(weight layout, the step's register tile) and how it allocates (huge pages, which needs no
rebuild: builds are shared by the variants that differ only there). Every variant's output is
checked against PyTorch's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# name -> (build environment, the fused step's register tile, allocation environment)
VARIANTS = {
    "kmajor": ({"TVMRNN_WEIGHT_PANELS": "0"}, {}, {"TVMRNN_HUGE_PAGES": "0"}),
    "kmajor-huge": ({"TVMRNN_WEIGHT_PANELS": "0"}, {}, {"TVMRNN_HUGE_PAGES": "1"}),
    "panels": ({"TVMRNN_WEIGHT_PANELS": "1"}, {}, {"TVMRNN_HUGE_PAGES": "0"}),
    "panels-huge": ({"TVMRNN_WEIGHT_PANELS": "1"}, {}, {"TVMRNN_HUGE_PAGES": "1"}),
    # the step's tile 10 rows x 2 vectors or 20 rows x 1 vector (each weight read from L2 2 or 1
    # times a step instead of 4), K-major weights (panels follow the default tile)
    "kmajor-huge-step2": ({"TVMRNN_WEIGHT_PANELS": "0"}, dict(column_vectors=2, accumulators=20),
                          {"TVMRNN_HUGE_PAGES": "1"}),
    "kmajor-huge-step1": ({"TVMRNN_WEIGHT_PANELS": "0"}, dict(column_vectors=1, accumulators=20),
                          {"TVMRNN_HUGE_PAGES": "1"}),
    "default": ({}, {}, {}),
    # each time loop one parallel region, a pool barrier after each kernel (v12's option)
    "region": ({"TVMRNN_TIME_LOOP_REGION": "1"}, {}, {}),
    # weight gradients summed in rows (K, H, G), as before v25's panels
    "grad-rows": ({"TVMRNN_GRADIENT_PANELS": "0"}, {}, {}),
    # every step's input projection before the time loop, as before v26 (the default since runs
    # each chunk's projection just before the chunk's steps)
    "projections-first": ({"TVMRNN_INTERLEAVE": "0"}, {}, {}),
}


def build(cell, config, env, step_tile, target):
    """A build with ``env`` set and the fused steps' CPU tile overridden by ``step_tile``."""
    from unittest import mock

    import tvmrnn
    from tvmrnn import schedules as ds
    original = ds.cpu_gemm

    def cpu_gemm(sch, kernel, target, **tiles):
        if kernel.name.startswith("recurrent_step_"):
            tiles = {**tiles, **step_tile}
        return original(sch, kernel, target, **tiles)
    with mock.patch.dict(os.environ, env), mock.patch.object(ds, "cpu_gemm", cpu_gemm):
        return tvmrnn.build(cell, target=target, tuning_logs=False, **config)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cells", nargs="*", default=["lstm"])
    p.add_argument("--variants", nargs="+", default=["kmajor", "kmajor-huge", "panels", "panels-huge"],
                   choices=sorted(VARIANTS))
    p.add_argument("--threads", type=int, default=None, help="both sides (default: tvmrnn's, the physical cores)")
    p.add_argument("--seq-len", "-T", type=int, default=300)
    p.add_argument("--batch-size", "-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--target", help="a TVM target as JSON (default: this CPU)")
    a = p.parse_args()
    if a.threads:
        os.environ["TVM_NUM_THREADS"] = str(a.threads)
    import json
    import time

    import torch

    import tvmrnn
    from bench import rel, samples, torch_rnn
    threads = int(os.environ["TVM_NUM_THREADS"])
    torch.set_num_threads(threads)
    target = json.loads(a.target) if a.target else None
    T, N, H = a.seq_len, a.batch_size, a.hidden_size
    print(f"threads {threads} (both sides), T={T} N={N} I=H={H}, {a.num_layers} layer(s)"
          f"{' bidirectional' if a.bidirectional else ''}, THP_MEM_ALLOC_ENABLE="
          f"{os.environ.get('THP_MEM_ALLOC_ENABLE', '')!r}, {a.rounds} rounds x {a.reps} calls", flush=True)
    config = dict(input_size=H, hidden_size=H, num_layers=a.num_layers, bidirectional=a.bidirectional, batch_size=N)
    for cell in a.cells:
        torch.manual_seed(0)
        ref = torch_rnn(cell, H, H, a.num_layers, a.bidirectional)
        params = tvmrnn.params_from_torch(ref)
        x = torch.randn(T, N, H)
        dy = torch.randn(T, N, H * (2 if a.bidirectional else 1))
        xr = x.clone().requires_grad_(True)
        with torch.no_grad():
            y_ref = ref(x)[0]

        def torch_train():
            ref.zero_grad(set_to_none=True)
            xr.grad = None
            ref(xr)[0].backward(dy)

        def torch_infer():
            with torch.no_grad():
                ref(x)
        sides = {"pytorch": dict(passes={"inference": torch_infer, "training": torch_train}, alloc={}, err=0.0)}
        builds = {}
        for name in a.variants:
            env, tile, alloc = VARIANTS[name]
            key = (tuple(sorted(env.items())), tuple(sorted(tile.items())))
            if key not in builds:
                t0 = time.perf_counter()
                builds[key] = build(cell, config, env, tile, target)
                print(f"  built {name} in {time.perf_counter() - t0:.0f} s", flush=True)
            rnn = builds[key]
            os.environ.update(alloc)
            w = rnn.pack_weights(params)
            y = rnn.forward(w, x)[0]
            err = rel(y, y_ref)

            def infer(rnn=rnn, w=w):
                rnn.forward(w, x)

            def train(rnn=rnn, w=w):
                rnn.backward(w, rnn.forward_train(w, x)[3], dy)
            sides[name] = dict(passes={"inference": infer, "training": train}, alloc=alloc, err=err, rnn=rnn)
        passes = ["inference"] + ([] if a.no_train else ["training"])
        times = {s: {q: [] for q in passes} for s in sides}
        for r in range(a.rounds):
            for s, side in sides.items():
                os.environ.update(side["alloc"])
                if "rnn" in side:  # scratch and workspaces come back with this side's allocation
                    side["rnn"].free_scratch()
                for q in passes:
                    times[s][q].append(samples(side["passes"][q], lambda: None, a.reps))
        base = {q: statistics.median(t for r in times["pytorch"][q] for t in r) for q in passes}
        for s, side in sides.items():
            line = f"{cell:8s} {s:18s}"
            for q in passes:
                every = [t for r in times[s][q] for t in r]
                ms = 1e3 * statistics.median(every)
                rounds = [1e3 * statistics.median(r) for r in times[s][q]]
                line += (f"  {q} {ms:8.2f} ms ({N / ms * 1e3:6.1f}/s, rounds {min(rounds):.1f}-{max(rounds):.1f},"
                         f" {1e3 * base[q] / ms:4.2f}x PyTorch)")
            print(f"{line}  rel err {side['err']:.1e}", flush=True)


if __name__ == "__main__":
    main()
