"""Packed sequences on the drop-ins: tvmrnn packed, tvmrnn padded to T, and torch.nn (cuDNN) packed.

One process, the same inputs, calls interleaved; a training step is forward + backward of a sum
over the outputs. Lengths are spread uniformly over [T/2, T] (seeded). Also the first build's time,
cold (an empty build cache) and from the cache (a second module in this process).

    python scripts/bench_packed.py --device cuda            # DS2: T=300 N=20 I=H=800, bidirectional
    python scripts/bench_packed.py --device cpu -T 20 -N 4 --size 32 --reps 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("cells", nargs="*", default=["lstm", "gru"])
    p.add_argument("--device", default="cuda")
    p.add_argument("-T", type=int, default=300)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--size", type=int, default=800)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--json")
    a = p.parse_args()
    os.environ["TVMRNN_CACHE_DIR"] = tempfile.mkdtemp(prefix="tvmrnn-cache-")  # cold, then warm
    os.environ.pop("TVMRNN_CACHE", None)
    import torch
    from torch.nn.utils.rnn import pack_padded_sequence
    import tvmrnn.torch as tt
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(a.T // 2, a.T + 1, (a.N,), generator=g)
    lengths[0] = a.T
    rows = []
    for cell in a.cells:
        torch.manual_seed(0)
        kwargs = dict(num_layers=a.num_layers, bidirectional=True)
        ref = getattr(torch.nn, cell.upper())(a.size, a.size, **kwargs).to(dev)
        ours = getattr(tt, cell.upper())(a.size, a.size, **kwargs).to(dev)
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(a.T, a.N, a.size, generator=g).to(dev)

        def packed():
            return pack_padded_sequence(x, lengths, enforce_sorted=False)
        t0 = time.perf_counter()
        ours(packed())
        sync()
        cold = time.perf_counter() - t0
        again = getattr(tt, cell.upper())(a.size, a.size, **kwargs).to(dev)
        again.load_state_dict(ref.state_dict())
        t0 = time.perf_counter()
        again(packed())
        sync()
        cached = time.perf_counter() - t0
        ours(x)  # the padded build, outside the timing

        sides = {"tvmrnn packed": lambda: ours(packed())[0].data, "tvmrnn padded": lambda: ours(x)[0],
                 "cuDNN packed" if dev.type == "cuda" else "torch packed": lambda: ref(packed())[0].data}
        check = (sides["tvmrnn packed"]() - list(sides.values())[2]()).abs().max().item()
        times = {k: [] for k in sides}
        for _ in range(a.reps):
            for name, run in sides.items():
                for p_ in list(ours.parameters()) + list(ref.parameters()):
                    p_.grad = None
                sync()
                t0 = time.perf_counter()
                run().sum().backward()
                sync()
                times[name].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        base = list(med)[2]
        row = dict(cell=cell, T=a.T, N=a.N, size=a.size, layers=a.num_layers, lengths=lengths.tolist(),
                   training_step_ms=med, vs_torch_packed={k: med[base] / v for k, v in med.items()},
                   max_abs_diff=check, first_build_cold_s=cold, first_build_cached_s=cached)
        rows.append(row)
        print(f"{cell}: " + ", ".join(f"{k} {v:.2f} ms ({med[base] / v:.2f}x)" for k, v in med.items())
              + f"; |diff| {check:.1e}; first step cold {cold:.1f} s, from the cache {cached:.2f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
