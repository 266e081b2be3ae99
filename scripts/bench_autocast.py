"""Mixed-precision training with the drop-ins: tvmrnn against torch.nn (cuDNN), both under autocast.

The training-use issue's model: a stack of bidirectional LSTM (or GRU) layers, a linear head,
cross-entropy and Adam, at Deep Speech 2 sizes by default. Each side trains its own copy from the
same weights on the same batches, calls interleaved in one process; ``--dtype float16`` uses a
``GradScaler`` on both sides, as fp16 training does. Prints the median time of a training step
(forward, backward, optimizer step) under autocast and in fp32, and the largest loss difference
between the two sides over the timed steps.

    python scripts/bench_autocast.py --device cuda                       # 2 layers, fp16
    python scripts/bench_autocast.py --device cuda --dtype bfloat16 gru
    python scripts/bench_autocast.py --device cpu --dtype bfloat16 -T 20 -N 4 --size 32 --reps 3
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cells", nargs="*", default=["lstm"], help="lstm, gru (default: lstm)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    p.add_argument("-T", type=int, default=300)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--size", type=int, default=800)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--classes", type=int, default=29)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--json")
    a = p.parse_args()
    if set(a.cells) - {"lstm", "gru"}:
        p.error(f"cells: lstm or gru, not {sorted(set(a.cells) - {'lstm', 'gru'})}")
    import torch
    import tvmrnn.torch as tt
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # fp32 rows: fp32
    dev = torch.device(a.device)
    half = getattr(torch, a.dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    for cell in a.cells:
        torch.manual_seed(0)
        kwargs = dict(num_layers=a.num_layers, bidirectional=True)
        rnn = getattr(torch.nn, cell.upper())(a.size, a.size, **kwargs)
        head = torch.nn.Linear(2 * a.size, a.classes)
        ours_rnn = getattr(tt, cell.upper())(a.size, a.size, **kwargs)
        ours_rnn.load_state_dict(rnn.state_dict())
        g = torch.Generator().manual_seed(1)
        batches = [(torch.randn(a.T, a.N, a.size, generator=g).to(dev),
                    torch.randint(0, a.classes, (a.T * a.N,), generator=g).to(dev)) for _ in range(4)]

        def side(module, autocast: bool):
            model = torch.nn.ModuleDict({"rnn": copy.deepcopy(module), "head": copy.deepcopy(head)}).to(dev)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
            scaler = torch.amp.GradScaler(dev.type, enabled=autocast and half == torch.float16)

            def step(i):
                x, target = batches[i % len(batches)]
                ctx = torch.autocast(dev.type, dtype=half) if autocast else contextlib.nullcontext()
                with ctx:
                    y = model["rnn"](x)[0]
                    loss = torch.nn.functional.cross_entropy(model["head"](y).reshape(-1, a.classes).float(), target)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                return loss.detach()
            return step

        sides = {f"tvmrnn {a.dtype}": side(ours_rnn, True), f"torch.nn {a.dtype}": side(rnn, True),
                 "tvmrnn fp32": side(ours_rnn, False), "torch.nn fp32": side(rnn, False)}
        t0 = time.perf_counter()
        for run in sides.values():  # builds, cuDNN's plans, the optimizers' state
            run(0)
        sync()
        warm_s = time.perf_counter() - t0
        times = {k: [] for k in sides}
        losses = {k: [] for k in sides}
        for i in range(1, a.reps + 1):
            for name, run in sides.items():
                sync()
                t0 = time.perf_counter()
                losses[name].append(float(run(i)))
                sync()
                times[name].append(time.perf_counter() - t0)
        med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
        names = list(sides)
        loss_diff = {f"{names[0]} vs {names[1]}": max(abs(u - v) for u, v in zip(losses[names[0]], losses[names[1]])),
                     f"{names[2]} vs {names[3]}": max(abs(u - v) for u, v in zip(losses[names[2]], losses[names[3]]))}
        row = dict(cell=cell, dtype=a.dtype, T=a.T, N=a.N, size=a.size, layers=a.num_layers, step_ms=med,
                   ratio_autocast=med[names[1]] / med[names[0]], ratio_fp32=med[names[3]] / med[names[2]],
                   max_loss_diff=loss_diff, first_steps_s=warm_s, last_losses={k: v[-1] for k, v in losses.items()})
        rows.append(row)
        print(f"{cell} {a.num_layers} layers bidirectional, T={a.T} N={a.N} I=H={a.size}, training step (median ms): "
              + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
              + f"; torch.nn / tvmrnn: {a.dtype} {row['ratio_autocast']:.2f}x, fp32 {row['ratio_fp32']:.2f}x; "
              + "largest loss difference " + ", ".join(f"{k} {v:.1e}" for k, v in loss_diff.items()), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                       "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
