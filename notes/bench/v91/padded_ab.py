"""``passes.GPU_PADDED_REDUCTION`` off against on (v91: written, not yet run on a GPU), and cuDNN, in
one process on the same inputs, calls in turn (one untimed call of the same side before each):
medians, ratios, and each side's error against PyTorch (fp32, TF32 off), inference and training.

    python notes/bench/v91/padded_ab.py [CELL:T:N:I:H:L ...]   # default: lstm and gru at 300:2:40:947:1

A GPU machine, PYTHONPATH=/opt/tvmsite:$PWD (notes/bench/v91/gpu_run.sh padab)."""
import os
import re
import statistics
import sys
import time

import torch

import tvmrnn
from tvmrnn.program import passes

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
shapes = sys.argv[1:] or ["lstm:300:2:40:947:1", "gru:300:2:40:947:1"]
REPS = 20
STEPS = re.compile(r"(recurrent_step|backward_step|recurrent_backward)_")
DEVICE = os.environ.get("PADAB_DEVICE", "cuda")  # (cpu: a dry run of this script; the switch is GPU-only)
sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)


def rel(a, b):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm())


def run(sides: dict, reps: int) -> dict:
    times = {k: [] for k in sides}
    for fn in sides.values():
        fn()
    sync()
    for i in range(reps):
        for k in (list(sides) if i % 2 == 0 else list(sides)[::-1]):
            sides[k]()
            sync()
            t0 = time.perf_counter()
            sides[k]()
            sync()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


for shape in shapes:
    cell, T, N, I, H, L = shape.split(":")
    T, N, I, H, L = int(T), int(N), int(I), int(H), int(L)
    torch.manual_seed(0)
    ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H, num_layers=L).to(DEVICE)
    builds = {}
    for on in (False, True):
        passes.GPU_PADDED_REDUCTION = on
        t0 = time.perf_counter()
        builds["on" if on else "off"] = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=L, batch_size=N,
                                                     target="cuda" if DEVICE == "cuda" else None, cache=False)
        print(f"{shape}: built {'on' if on else 'off'} in {time.perf_counter() - t0:.1f} s; padded kernels: "
              f"{sorted(n for n in builds['on' if on else 'off'].schedules if STEPS.match(n) and '_r' in n)}", flush=True)
    passes.GPU_PADDED_REDUCTION = False
    ws = {k: r.pack_weights(tvmrnn.params_from_torch(ref)) for k, r in builds.items()}
    x = torch.randn(T, N, I, device=DEVICE)
    dy = torch.randn(T, N, H, device=DEVICE)
    with torch.no_grad():
        y_ref = ref(x)[0]
        errors = {k: rel(builds[k].forward(ws[k], x)[0], y_ref) for k in builds}
    xr = x.clone().requires_grad_(True)
    ref(xr)[0].backward(dy)
    for k, r in builds.items():
        *_, wsp = r.forward_train(ws[k], x)
        g = r.backward(ws[k], wsp, dy)
        errors[k] = (errors[k], rel(g["x"], xr.grad), rel(g["weight_hh_l0"], ref.weight_hh_l0.grad))
    print(f"  errors vs PyTorch fp32 (y, dx, dW_hh): {errors}", flush=True)

    def train(k):
        def f():
            *_, wsp = builds[k].forward_train(ws[k], x)
            return builds[k].backward(ws[k], wsp, dy)
        return f

    def torch_train():
        ref.zero_grad(set_to_none=True)
        xr.grad = None
        ref(xr)[0].backward(dy)
    with torch.no_grad():
        inf = run({"off": lambda: builds["off"].forward(ws["off"], x), "on": lambda: builds["on"].forward(ws["on"], x),
                   "cudnn": lambda: ref(x)}, REPS)
    tr = run({"off": train("off"), "on": train("on"), "cudnn": torch_train}, REPS)
    for name, t in (("inference", inf), ("training", tr)):
        print(f"  {name:9s} ms: off {1e3 * t['off']:8.3f}  on {1e3 * t['on']:8.3f}  cuDNN {1e3 * t['cudnn']:8.3f}   "
              f"on/off speed {t['off'] / t['on']:.2f}x   vs cuDNN: off {t['cudnn'] / t['off']:.2f}x "
              f"on {t['cudnn'] / t['on']:.2f}x", flush=True)
