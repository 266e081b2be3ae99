"""v86: the layer wavefront against the layers one after another on a GPU, per shape ``cell:N:H:I:T:L``
(unidirectional): both builds in one process; their outputs and every gradient compared with each
other and with torch.nn in float64 on the CPU (same inputs); passes timed in turn
(``pass_tuning.compare``, 11 pairs, medians); cuDNN fp32 (TF32 off) after.

    python notes/bench/v86/wave_check.py gru:32:126:126:700:3 lstm:32:126:126:700:3
"""
import importlib.util
import os
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn
from tvmrnn.runtime import pass_tuning

spec = importlib.util.spec_from_file_location("const_ab", os.path.join(os.path.dirname(__file__), "../v78/const_ab.py"))
const_ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(const_ab)


def run(rnn, params, x, h0, dy, dev):
    w = rnn.pack_weights(params)
    y, hy, cy, ws = rnn.forward_train(w, x.to(dev), h0.to(dev))
    y_inf = rnn.forward(w, x.to(dev), h0.to(dev))[0]
    grads = rnn.backward(w, ws, dy.to(dev))
    out = {"y": y, "y_inference": y_inf, "hy": hy, **{"d" + k: v for k, v in grads.items()}}
    return {k: v.double().cpu() for k, v in out.items()}


def main(shapes):
    warnings.simplefilter("ignore")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for shape in shapes:
        cell, n, h, i, T, L = shape.split(":")
        n, h, i, T, L = int(n), int(h), int(i), int(T), int(L)
        t0 = time.perf_counter()
        dev = os.environ.get("DEVICE", "cuda")  # (DEVICE=cpu WAVE=1: a smoke test where no GPU is)
        sizes = dict(input_size=i, hidden_size=h, num_layers=L, batch_size=n, target=None if dev == "cpu" else dev, cache=False)
        wave = tvmrnn.build(cell, **sizes, options={"layer_wavefront": True} if os.environ.get("WAVE") else None)
        plain = tvmrnn.build(cell, **sizes, options={"layer_wavefront": False})
        built = time.perf_counter() - t0
        torch.manual_seed(0)
        ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](i, h, num_layers=L).double()
        params = {k: np.asarray(v, np.float32) for k, v in tvmrnn.params_from_torch(ref).items()}
        x, h0, dy = torch.randn(T, n, i), torch.randn(L, n, h), torch.randn(T, n, h)
        got = {name: run(rnn, params, x, h0, dy, dev) for name, rnn in (("wave", wave), ("plain", plain))}
        xt = x.double().requires_grad_()
        h0t = h0.double().requires_grad_()
        args = (h0t, torch.zeros_like(h0t)) if cell == "lstm" else h0t
        yr, states = ref(xt, args)
        yr.backward(dy.double())
        expected = {"y": yr.detach(), "dx": xt.grad, **{"d" + k: p.grad for k, p in ref.named_parameters()}}

        def err(a, b):
            return float((a - b).norm() / max(float(b.norm()), 1e-30))
        vs_plain = max(err(got["wave"][k], got["plain"][k]) for k in got["plain"])
        vs_torch = max(err(got["wave"][k], expected[k]) for k in expected)
        plain_torch = max(err(got["plain"][k], expected[k]) for k in expected)
        kinds = sorted(k for k in wave.schedules if "step" in k and "_d" in k)
        result = pass_tuning.compare(wave, plain, pass_tuning.PassTimer(T), pairs=11)
        theirs = const_ab.cudnn_ms(cell, n, h, i, T, L, False) if dev == "cuda" else {}
        ours = {k: p["incumbent_ms"] for k, p in result.passes.items()}
        layers = {k: p["candidate_ms"] for k, p in result.passes.items()}
        vs = ", ".join(f"{k}: wavefront {ours[k]:.3f} ms ({theirs[k] / ours[k]:.2f}x cuDNN), layer by layer {layers[k]:.3f} "
                       f"({theirs[k] / layers[k]:.2f}x), cuDNN {theirs[k]:.3f}" for k in ours if k in theirs)
        print(f"{shape}: builds {built:.0f} s; stacked kernels {kinds}; wavefront vs layer by layer {vs_plain:.1e}, "
              f"vs torch float64 {vs_torch:.1e} (layer by layer {plain_torch:.1e}); wavefront -> layer by layer: "
              f"{result.line()}; {vs}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
