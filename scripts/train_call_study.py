#!/usr/bin/env python3
"""Where a public CPU training call spends its time beyond its two passes, timed in turn.

    TVM_NUM_THREADS=16 python scripts/train_call_study.py lstm --reps 5 --rounds 4

On the GPU machine's Xeon, ``bench.py``'s LSTM training call (``forward_train`` then ``backward``,
PyTorch tensors in and out) took 224 ms while ``--profile`` timed its two passes at 56 + 105 ms in
the same process (notes/performance.md v25). Timed here, round after round in one process, on the
same weights, input and output gradient (medians over ``--reps`` calls a round, and the range of
the rounds' medians):

- ``bare``: ``module["forward_train"]`` then ``module["backward"]``, every argument made once
  (the large ones on huge pages where tvmrnn's own arrays get them, as ``profile`` does); the
  backward reads the forward's workspace;
- ``public``: ``rnn.forward_train(w, x)`` then ``rnn.backward(w, ws, dy)``, what ``bench.py`` times;
- ``bare forward_train`` and ``bare backward`` alone;
- ``bare, torch outputs``: the same with the outputs handed back (``y``, ``dx``, ``dw``) PyTorch
  allocations (4 KB pages), made once;
- ``bare, fresh torch outputs``: PyTorch allocations made at every call (their pages touched first
  by the passes);
- ``bare, torch op before``: a PyTorch parallel op (``torch.zeros``) before each pass, as the public
  calls make (PyTorch's OpenMP threads may spin on the cores TVM's pool then needs);
- ``public forward_train`` alone, and ``public backward`` alone (on a workspace made before);
- ``torch``: PyTorch's training step as ``bench.py`` times it, for scale;
- the pieces the public calls add: ``dw = zeros(...)`` (the weight gradients' buffer, zeroed: the
  backward accumulates in place) and fresh outputs of the sizes handed back.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    from bench import samples, study_parser, torch_rnn
    p = study_parser(__doc__, reps=5, layers=True)
    p.add_argument("--threads", type=int, default=None, help="both sides (default: tvmrnn's, the physical cores)")
    a = p.parse_args()
    if a.threads:
        os.environ["TVM_NUM_THREADS"] = str(a.threads)
    import torch

    import tvmrnn
    from tvmrnn.runtime.profile import _random_tensors
    from tvmrnn.runtime.rnn import to_tvm
    import tvm
    torch.set_num_threads(int(os.environ.get("TVM_NUM_THREADS") or torch.get_num_threads()))
    T, N, I, H, L = a.T, a.N, a.hidden_size, a.hidden_size, a.num_layers
    print(f"threads {os.environ.get('TVM_NUM_THREADS')}, T={T} N={N} I=H={H}, {L} layer(s), "
          f"{a.rounds} rounds x {a.reps} calls", flush=True)
    for cell in a.cells:
        rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=L, bidirectional=a.bidirectional,
                           batch_size=N)
        ref = torch_rnn(cell, I, H, L, a.bidirectional)
        w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
        x = torch.randn(T, N, I)
        D = 2 if a.bidirectional else 1
        dy = torch.randn(T, N, D * H)

        # bare: every argument once; the forward's workspace and outputs are the backward's inputs
        shapes = {prog: rnn.shapes(prog, T) for prog in ("forward_train", "backward")}
        given = {"x": to_tvm(x), "w": to_tvm(w.flat), "dy": to_tvm(dy)}
        made = {}
        for prog in shapes:
            for name, shape in shapes[prog].items():
                if name not in given and name not in made:
                    made[name] = _random_tensors([list(shape)], tvm.cpu(0))[0]
        made.update(given)
        fwd, bwd = rnn.module["forward_train"], rnn.module["backward"]
        fargs = [made[n] for n in shapes["forward_train"]]
        bargs = [made[n] for n in shapes["backward"]]
        zero = torch.zeros(made["dw"].shape)
        total = rnn.config.layout.total

        def bare():
            fwd(*fargs)
            made["dw"].copyfrom(zero.numpy())  # the backward accumulates into dw: zeroed as the public call does
            bwd(*bargs)

        def bare_forward():
            fwd(*fargs)

        def bare_backward():
            made["dw"].copyfrom(zero.numpy())
            bwd(*bargs)

        # the same, the outputs handed back (y, dx, dw) PyTorch's own allocations, as the public call's
        outs = {n: to_tvm(torch.empty(tuple(made[n].shape))) for n in ("y", "dx", "dw")}
        fargs_t = [outs.get(n, made[n]) for n in shapes["forward_train"]]
        bargs_t = [outs.get(n, made[n]) for n in shapes["backward"]]

        def bare_torch_outputs():
            fwd(*fargs_t)
            outs["dw"].copyfrom(zero.numpy())
            bwd(*bargs_t)

        def bare_fresh_outputs():  # fresh PyTorch outputs at every call, as the public call's (no torch op)
            fresh = {n: to_tvm(torch.empty(tuple(made[n].shape))) for n in ("y", "dx", "dw")}
            fwd(*[fresh.get(n, made[n]) for n in shapes["forward_train"]])
            fresh["dw"].copyfrom(zero.numpy())
            bwd(*[fresh.get(n, made[n]) for n in shapes["backward"]])

        def bare_after_torch_op():  # a PyTorch parallel op (OpenMP) just before each pass
            torch.zeros(total)
            fwd(*fargs)
            made["dw"].copyfrom(torch.zeros(total).numpy())
            bwd(*bargs)

        def public():
            y, hy, cy, ws = rnn.forward_train(w, x)
            return rnn.backward(w, ws, dy)

        ws_kept = rnn.forward_train(w, x)[3]
        xr = x.clone().requires_grad_(True)

        def torch_train():
            ref.zero_grad(set_to_none=True)
            xr.grad = None
            ref(xr)[0].backward(dy)

        variants = {
            "bare (both passes)": bare,
            "bare forward_train": bare_forward,
            "bare backward": bare_backward,
            "bare, torch outputs": bare_torch_outputs,
            "bare, fresh torch outputs": bare_fresh_outputs,
            "bare, torch op before": bare_after_torch_op,
            "public (both calls)": public,
            "public forward_train": lambda: rnn.forward_train(w, x),
            "public backward": lambda: rnn.backward(w, ws_kept, dy),
            "torch training step": torch_train,
            "torch.zeros(dw)": lambda: torch.zeros(total),
            "torch.empty(y)+fill": lambda: torch.empty(T, N, D * H).fill_(1.0),
        }
        for fn in variants.values():
            fn()
        times = {k: [] for k in variants}
        for _ in range(a.rounds):
            for name, fn in variants.items():
                times[name].append(statistics.median(samples(fn, lambda: None, a.reps)))
        for name, t in times.items():
            print(f"{cell:8s} {name:24s} {1e3 * statistics.median(t):9.2f} ms  "
                  f"(rounds {1e3 * min(t):.2f}-{1e3 * max(t):.2f})", flush=True)


if __name__ == "__main__":
    main()
