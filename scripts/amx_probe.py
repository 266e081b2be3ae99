#!/usr/bin/env python3
"""PyTorch's fp32 GEMM and LSTM on this CPU at fp32 and with bf16 allowed (oneDNN on AMX where the
CPU has it), rounds alternating: what reduced-precision GEMMs would buy a CPU LSTM.

    python scripts/amx_probe.py --threads 16

The GEMM is a DS2 input projection (T*N = 6000 rows, 800 inputs, 3200 gate columns), checked
against float64; the LSTM is PyTorch's own (T=300, N=20, I=H=800) inference. notes/performance.md v26.
"""
import argparse
import statistics
import time

import torch


def timed(f, reps):
    f()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--rounds", type=int, default=4)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    x_all, w = torch.randn(6000, 800), torch.randn(800, 3200)
    lstm, x = torch.nn.LSTM(800, 800), torch.randn(300, 20, 800)
    ref = x_all.double() @ w.double()
    modes = {"fp32": ("highest", "ieee"), "bf16 allowed (medium)": ("medium", "bf16")}
    results = {name: [] for name in modes}
    for _ in range(a.rounds):
        for name, (precision, onednn) in modes.items():
            torch.set_float32_matmul_precision(precision)
            try:  # PyTorch's newer switch for oneDNN's fp32 matmuls, where it exists
                torch.backends.mkldnn.matmul.fp32_precision = onednn
            except (AttributeError, RuntimeError):
                pass
            gemm = timed(lambda: x_all @ w, 5)
            with torch.no_grad():
                rnn = timed(lambda: lstm(x), 3)
            err = float(((x_all @ w).double() - ref).abs().max() / ref.abs().max())
            results[name].append((gemm, rnn, err))
    print(f"threads {a.threads}, {a.rounds} rounds, medians")
    for name, rows in results.items():
        gemm = statistics.median(r[0] for r in rows)
        rnn = statistics.median(r[1] for r in rows)
        print(f"{name:24s} GEMM 6000x800x3200 {gemm * 1e3:7.2f} ms ({2 * 6000 * 800 * 3200 / gemm / 1e12:5.2f} TFLOP/s, "
              f"max rel err {max(r[2] for r in rows):.1e})  LSTM DS2 inference {rnn * 1e3:7.2f} ms ({20 / rnn:6.1f} samples/s)")


if __name__ == "__main__":
    main()
