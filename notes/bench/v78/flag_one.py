"""v78: one side of a CPU switch A/B per process (schedules of one kernel name can share a compiled
form within a process: notes v75): FLAG=module.NAME VALUE=literal python flag_one.py cell:T:N:I:H[:L];
training passes through the drop-in and PyTorch's, interleaved, medians of 7 (THREADS, default 2)."""
import ast
import importlib
import os
import statistics
import sys
import time

os.environ.setdefault("TVM_NUM_THREADS", os.environ.get("THREADS", "2"))
import torch  # noqa: E402

import tvmrnn.torch as tt  # noqa: E402


def timed(fn, x, g):
    t0 = time.perf_counter()
    y, _ = fn(x)
    y.backward(g)
    return (time.perf_counter() - t0) * 1e3


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    module, name = os.environ["FLAG"].rsplit(".", 1)
    setattr(importlib.import_module(module), name, ast.literal_eval(os.environ["VALUE"]))
    for spec in sys.argv[1:]:
        cell, T, N, I, H, *L = spec.split(":")
        T, N, I, H, L = int(T), int(N), int(I), int(H), int(L[0]) if L else 1
        cls = {"lstm": "LSTM", "gru": "GRU"}[cell]
        torch.manual_seed(0)
        ref = getattr(torch.nn, cls)(I, H, num_layers=L)
        ours = getattr(tt, cls)(I, H, num_layers=L)
        ours.load_state_dict(ref.state_dict())
        x, g = torch.randn(T, N, I, requires_grad=True), torch.randn(T, N, H)
        timed(ours, x, g)
        times = {"ours": [], "torch": []}
        for _ in range(7):
            times["ours"].append(timed(ours, x, g))
            times["torch"].append(timed(ref, x, g))
        a, b = statistics.median(times["ours"]), statistics.median(times["torch"])
        print(f"{name}={os.environ['VALUE']} {spec}: training ms tvmrnn {a:.1f}, torch {b:.1f}, {b / a:.2f}x", flush=True)
