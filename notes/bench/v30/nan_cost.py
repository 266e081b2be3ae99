"""What NaN/Inf propagation costs the CPU passes (issue 40): each cell built twice in one process,
as shipped and with the NaN handling taken out (the fast exp without its NaN/overflow selects, and
no nan_propagating rewrite), timed alternately on the same inputs; the two must agree on finite
inputs. python nan_cost.py [T N I H [VARIANTS [CELLS]]] (default DS2: 300 20 800 800; VARIANTS: the
builds in order, comma-separated, each "safe" or "plain", default "safe,plain"; CELLS default
"lstm,gru,rnn_relu")."""
import statistics
import sys
import time

import numpy as np
import torch

import tvmrnn
from tvm import tirx
from tvmrnn.schedules import fast_math as fm

T, N, I, H = (int(v) for v in sys.argv[1:5]) if len(sys.argv) > 4 else (300, 20, 800, 800)
VARIANTS = sys.argv[5].split(",") if len(sys.argv) > 5 else ["safe", "plain"]
CELLS = sys.argv[6].split(",") if len(sys.argv) > 6 else ["lstm", "gru", "rnn_relu"]


def exp_without_nan_checks(x):  # fast_exp as it was before issue 40: the clamp alone
    def clamped(v):
        v = tirx.max(tirx.min(v, fm._c(fm._EXP_LIMIT)), fm._c(-fm._EXP_LIMIT))

        def reduced(n):
            def poly(r):
                p = fm._c(fm._POLY[0])
                for coef in fm._POLY[1:]:
                    p = p * r + fm._c(coef)
                scale = tirx.reinterpret("float32", tirx.shift_left(n.astype("int32") + 127, 23))
                return (p * r * r + r + fm._c(1.0)) * scale
            return fm._let(v - n * fm._c(fm._LN2_HIGH) - n * fm._c(fm._LN2_LOW), poly)
        return fm._let(tirx.floor(v * fm._c(fm._LOG2E) + fm._c(0.5)), reduced)
    return fm._let(x, clamped)


def build(cell, plain):
    saved = fm.fast_exp, dict(fm._REWRITES), fm.nan_propagating
    if plain:
        fm.fast_exp = fm._REWRITES["tirx.exp"] = exp_without_nan_checks
        fm.nan_propagating = lambda func: func
    try:
        return tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, target=tvmrnn.device.host_target())
    finally:
        fm.fast_exp, fm.nan_propagating = saved[0], saved[2]
        fm._REWRITES.clear()
        fm._REWRITES.update(saved[1])


def main():
    print(f"T={T} N={N} I={I} H={H}; torch threads {torch.get_num_threads()}; builds in order {VARIANTS}")
    names = [f"{v}{i}" for i, v in enumerate(VARIANTS)]
    for cell in CELLS:
        rnns = {name: build(cell, v == "plain") for name, v in zip(names, VARIANTS)}
        torch.manual_seed(0)
        module = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(cell) or (
            lambda i, h: torch.nn.RNN(i, h, nonlinearity="relu"))
        params = tvmrnn.params_from_torch(module(I, H))
        rng = np.random.default_rng(0)
        x = rng.standard_normal((T, N, I)).astype(np.float32)
        dy = rng.standard_normal((T, N, H)).astype(np.float32)
        ws = {k: r.pack_weights(params) for k, r in rnns.items()}
        outs = [r.forward(ws[k], x)[0] for k, r in rnns.items()]
        agree = max(float(np.abs(o - outs[0]).max()) for o in outs)
        times = {(k, p): [] for k in rnns for p in ("inference", "training")}
        for _ in range(7):
            for k, r in rnns.items():
                t0 = time.perf_counter()
                r.forward(ws[k], x)
                t1 = time.perf_counter()
                y, _, _, w = r.forward_train(ws[k], x)
                r.backward(ws[k], w, dy)
                t2 = time.perf_counter()
                times[(k, "inference")].append(t1 - t0)
                times[(k, "training")].append(t2 - t1)
        for p in ("inference", "training"):
            rates = "  ".join(f"{k} {N / statistics.median(times[(k, p)]):8.1f}" for k in rnns)
            print(f"{cell:9s} {p:9s} samples/s: {rates}  (max |diff| {agree:.1e})", flush=True)


main()
