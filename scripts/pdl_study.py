#!/usr/bin/env python3
"""Programmatic dependent launch (PDL) on and off, side by side, with cuDNN as the yardstick.

    python scripts/pdl_study.py lstm gru --reps 20
    python scripts/pdl_study.py lstm --num-layers 5 --bidirectional --reps 5

Builds each configuration once per ``--modes`` (``TVMRNN_PDL=0``, ``wait``, ``early``, see ``tvmrnn.device.dependent_launch``),
runs both and cuDNN (PyTorch, TF32 off) on the same weights and inputs in one process, checks that
both builds agree with each other and with cuDNN, and prints the median milliseconds of an
inference forward and of a training step (forward + backward), timed with CUDA events around
the public call, and samples/s ratios against cuDNN. Needs a CUDA GPU (Hopper or later for PDL).
Persistent time loops follow ``TVMRNN_PERSISTENT`` (since v14 the inference forward's, since v21 both forwards', are
persistent by default, a single launch PDL cannot help; v14's study ran before that: set
``TVMRNN_PERSISTENT=0`` to repeat it).
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def timed(torch, fn, reps):
    """Median milliseconds of ``fn`` between CUDA events."""
    from launch_study import timed_call
    return timed_call(torch, fn, reps)[1]


def study(a, cell, torch, tvmrnn):
    from bench import rel, torch_rnn
    T, N, H, L, bidir = a.T, a.N, a.hidden_size, a.num_layers, a.bidirectional
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ref = torch_rnn(cell, H, H, L, bidir).to(dev)
    x = torch.randn(T, N, H, device=dev)
    dy = torch.randn(T, N, H * (2 if bidir else 1), device=dev)
    builds = {}
    for pdl in a.modes:
        os.environ["TVMRNN_PDL"] = pdl
        t0 = time.perf_counter()
        builds[pdl] = tvmrnn.build(cell, input_size=H, hidden_size=H, num_layers=L, bidirectional=bidir,
                                   batch_size=N, target="cuda")
        print(f"{cell} L={L} {'bidir' if bidir else 'uni'} PDL={pdl}: built in {time.perf_counter() - t0:.0f} s",
              flush=True)
    xr = x.clone().requires_grad_(True)
    params = list(ref.parameters())

    def theirs_infer():
        with torch.no_grad():
            return ref(x)[0]

    def theirs_train():
        y = ref(xr)[0]
        return torch.autograd.grad(y, [xr] + params, dy)[0]

    y_ref, dx_ref = theirs_infer(), theirs_train()
    rows = {"cuDNN": (timed(torch, theirs_infer, a.reps), timed(torch, theirs_train, a.reps))}
    outs = {}
    for pdl, rnn in builds.items():
        w = rnn.pack_weights(tvmrnn.params_from_torch(ref))

        def infer(rnn=rnn, w=w):
            return rnn.forward(w, x)[0]

        def train(rnn=rnn, w=w):
            ws = rnn.forward_train(w, x)[3]
            return rnn.backward(w, ws, dy)["x"]

        outs[pdl] = (infer().clone(), train().clone())
        rows[f"PDL={pdl}"] = (timed(torch, infer, a.reps), timed(torch, train, a.reps))
        print(f"  PDL={pdl}: forward rel err vs cuDNN {rel(outs[pdl][0], y_ref):.1e}, dx {rel(outs[pdl][1], dx_ref):.1e}",
              flush=True)
    for m in a.modes[1:]:
        print(f"  PDL={m} vs {a.modes[0]}: forward rel diff {rel(outs[m][0], outs[a.modes[0]][0]):.1e}, "
              f"dx {rel(outs[m][1], outs[a.modes[0]][1]):.1e}")
    base = rows["cuDNN"]
    for name, (inf, tr) in rows.items():
        print(f"  {name:10s} inference {inf:8.3f} ms ({N / inf * 1e3:8.1f} samples/s, {base[0] / inf:5.2f}x cuDNN)   "
              f"training {tr:8.3f} ms ({N / tr * 1e3:8.1f} samples/s, {base[1] / tr:5.2f}x cuDNN)", flush=True)
    off = rows[f"PDL={a.modes[0]}"]
    for m in a.modes[1:]:
        on = rows[f"PDL={m}"]
        print(f"  PDL={m} saves {off[0] - on[0]:.3f} ms of inference ({100 * (1 - on[0] / off[0]):.1f}%), "
              f"{off[1] - on[1]:.3f} ms of training ({100 * (1 - on[1] / off[1]):.1f}%) against PDL={a.modes[0]}",
              flush=True)


def main():
    from bench import study_parser
    p = study_parser(__doc__, reps=20, layers=True)
    p.add_argument("--modes", nargs="+", default=["0", "wait", "early"], help="TVMRNN_PDL values, the first the baseline")
    a = p.parse_args()
    import torch

    import tvmrnn
    if not torch.cuda.is_available():
        sys.exit("pdl_study.py needs a CUDA GPU")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for cell in a.cells:
        study(a, cell, torch, tvmrnn)


if __name__ == "__main__":
    main()
