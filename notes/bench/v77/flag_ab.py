"""v77 A/B of a module switch, off against on (FLAG=module.NAME, default
tvmrnn.schedules.cpu.CPU_PADDED_BACKWARD_PANELS: the backward's weight copies in padded panels;
tvmrnn.program.passes.CPU_STAGED_WEIGHT_GRADIENTS: the tail's weight gradients in one call), with
PyTorch's CPU LSTM beside them; training passes (forward + backward through the drop-ins), rounds
interleaved, medians. THREADS (default 2): both sides' threads. Usage: FLAG=... python flag_ab.py
cell:T:N:I:H[:L] ..."""
import importlib
import os

os.environ.setdefault("TVM_NUM_THREADS", os.environ.get("THREADS", "2"))  # before TVM starts its pool
import statistics
import sys
import time

import torch

import tvmrnn.torch as tt


def timed(fn, x, g):
    t0 = time.perf_counter()
    y, _ = fn(x)
    y.backward(g)
    return (time.perf_counter() - t0) * 1e3


def main(spec):
    cell, T, N, I, H, *L = spec.split(":")
    T, N, I, H, L = int(T), int(N), int(I), int(H), int(L[0]) if L else 1
    cls = {"lstm": "LSTM", "gru": "GRU"}[cell]
    torch.manual_seed(0)
    ref = getattr(torch.nn, cls)(I, H, num_layers=L)
    x = torch.randn(T, N, I, requires_grad=True)
    g = torch.randn(T, N, H)
    sides = {}
    module, name = os.environ.get("FLAG", "tvmrnn.schedules.cpu.CPU_PADDED_BACKWARD_PANELS").rsplit(".", 1)
    module = importlib.import_module(module)
    for on in (False, True):
        setattr(module, name, on)
        m = getattr(tt, cls)(I, H, num_layers=L)
        m.load_state_dict(ref.state_dict())
        timed(m, x, g)  # builds
        sides["on" if on else "off"] = m
    sides["torch"] = ref
    ys = {k: m(x)[0] for k, m in sides.items()}
    err = max((ys[k] - ys["torch"]).abs().max().item() for k in ys)
    times = {k: [] for k in sides}
    for _ in range(7):
        for k, m in sides.items():
            times[k].append(timed(m, x, g))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{name} {spec}: training ms off {med['off']:.1f}, on {med['on']:.1f}, torch {med['torch']:.1f}; "
          f"on/off {med['on'] / med['off']:.2f}; vs torch off {med['torch'] / med['off']:.2f}x, "
          f"on {med['torch'] / med['on']:.2f}x; max |y - torch| {err:.1e}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    for spec in sys.argv[1:]:
        main(spec)
