"""Persistent time loops' block counts at small steps on the GPU (v76): each shape built with the
default block count and with ``persistent_blocks`` = each cap, all in one process, cuDNN beside them;
inference and training passes timed in turn (``pass_tuning.PassTimer``, rounds interleaved over all
builds), medians printed in ms. Shapes ``cell:N:H:I:T``.

    python notes/bench/v76/block_sweep.py lstm:13:90:90:100 gru:16:128:128:100
    CAPS=1,4,16 python notes/bench/v76/block_sweep.py lstm:13:90:90:100
"""
import os
import statistics
import sys
import time
import warnings

import torch

import tvmrnn
from tvmrnn.runtime import pass_tuning

ROUNDS = int(os.environ.get("ROUNDS", 9))
CAPS = [None] + [int(c) for c in os.environ.get("CAPS", "1,2,4,8,16,32,64").split(",")]


def cudnn_timer(cell, N, H, I, T):
    ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H).cuda()
    x = torch.randn(T, N, I, device="cuda")
    xr = x.clone().requires_grad_(True)
    dy = torch.randn(T, N, H, device="cuda")

    def inference():
        with torch.no_grad():
            ref(x)

    def training():
        ref.zero_grad(set_to_none=True)
        xr.grad = None
        ref(xr)[0].backward(dy)
    calls = {}

    def timer(kind):
        fn = inference if kind == "inference" else training
        if kind not in calls:
            fn(); torch.cuda.synchronize()
            t0 = time.perf_counter(); fn(); torch.cuda.synchronize()
            calls[kind] = max(1, min(64, int(2e-3 / max(time.perf_counter() - t0, 1e-7)) + 1))
        t0 = time.perf_counter()
        for _ in range(calls[kind]):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / calls[kind]
    return timer


def main(shapes):
    warnings.simplefilter("ignore")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for shape in shapes:
        cell, N, H, I, T = shape.split(":")
        N, H, I, T = int(N), int(H), int(I), int(T)
        t0 = time.perf_counter()
        builds = []
        for cap in CAPS:
            options = {"persistent_blocks": cap} if cap else None
            try:
                rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, target=os.environ.get("TARGET", "cuda"), tuning_logs=False,
                                   cache=False, options=options)
            except Exception as e:  # noqa: BLE001 (a cap a build refuses: said, not fatal)
                print(f"  {shape} cap {cap}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            persistent = "".join(p[0] for p in ("forward", "forward_train", "backward")
                                 if rnn.programs[p].uses_persistent_loops) if hasattr(rnn, "programs") else "?"
            builds.append((cap, rnn, f"{rnn.persistent_blocks}{'/' + persistent if persistent else ''}"))
        build_s = time.perf_counter() - t0
        if os.environ.get("DRY"):  # builds only (here: no GPU)
            print(shape, f"{build_s:.0f} s", [(cap, used) for cap, _, used in builds], flush=True)
            continue
        timer = pass_tuning.PassTimer(T)
        theirs = cudnn_timer(cell, N, H, I, T)
        times = {(k, i): [] for k in ("inference", "training") for i in range(len(builds) + 1)}
        for kind in ("inference", "training"):
            theirs(kind)
            for _, rnn, _ in builds:
                timer(rnn, kind)
            for _ in range(ROUNDS):
                times[(kind, 0)].append(theirs(kind))
                for i, (_, rnn, _) in enumerate(builds, 1):
                    times[(kind, i)].append(timer(rnn, kind))
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        parts = [f"cudnn {med[('inference', 0)]:.3f}/{med[('training', 0)]:.3f}"]
        best = min(range(1, len(builds) + 1), key=lambda i: med[("inference", i)])
        for i, (cap, _, used) in enumerate(builds, 1):
            mark = "*" if i == best else ""
            parts.append(f"b={cap}({used}) {med[('inference', i)]:.3f}/{med[('training', i)]:.3f}{mark}")
        print(f"{shape} ({len(builds)} builds {build_s:.0f} s) " + "; ".join(parts), flush=True)
        for _, rnn, _ in builds:
            timer.forget(rnn)
        del builds
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
