#!/usr/bin/env python3
"""One pass of an RNN under Nsight Compute: what each of its kernels waits on.

    python scripts/ncu_pass.py lstm --pass forward --out ncu_lstm          # needs ncu and a CUDA GPU
    python scripts/ncu_pass.py lstm --pass forward --options '{"persistent": "off"}' --out ncu_lstm_per_step

Builds the configuration (Deep Speech 2 sizes by default; ``--options`` sets ``tvmrnn.BuildOptions``
fields), runs the pass twice, then once more under ``ncu`` (the
profiled range is that one call: ``cudaProfilerStart``/``Stop``), and prints, per kernel, its time,
issue slots used, shared-memory load instructions against the wavefronts they took (bank
conflicts replay a load), the FMA pipe's use and the warps' main stall reasons. ``OUT.csv`` holds
every collected metric (``ncu --page raw``), ``OUT.txt`` the table. ``--kernels N`` profiles only the
first N kernels of the call (the default, 12, covers a 1-layer forward; a pass with per-step launches
has thousands).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys


METRICS = ["gpu__time_duration.sum", "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active",
           "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__inst_executed_op_shared_ld.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
           "smsp__inst_executed_op_shared_st.sum", "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
           "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
           "smsp__inst_executed_op_global_ld.sum", "lts__t_bytes.sum", "dram__bytes.sum"]
STALLS = "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"


def run_pass(a):
    import numpy as np
    import torch
    import tvmrnn
    H, N, T = a.hidden_size, a.N, a.T
    rnn = tvmrnn.build(a.cell, input_size=H, hidden_size=H, num_layers=a.num_layers, bidirectional=a.bidirectional,
                       batch_size=N, target="cuda", tuning_logs=False,
                       options=tvmrnn.BuildOptions.from_dict(a.options))
    torch.manual_seed(0)
    from tvmrnn.cli.bench import torch_rnn
    w = rnn.pack_weights(tvmrnn.params_from_torch(torch_rnn(a.cell, H, H, a.num_layers, a.bidirectional).cuda()))
    x = torch.randn(T, N, H, device="cuda")
    if a.pass_ == "forward":
        call = lambda: rnn.forward(w, x)
    else:
        out = rnn.forward_train(w, x)
        dy = torch.randn_like(out[0])
        call = (lambda: rnn.forward_train(w, x)) if a.pass_ == "forward_train" else (lambda: rnn.backward(w, out[-1], dy))
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def table(rows) -> str:
    def num(row, name):
        try:
            return float(row.get(name, "nan").replace(",", ""))
        except ValueError:
            return float("nan")
    lines = []
    for i, row in enumerate(rows):
        ld, ld_wave = num(row, METRICS[7]), num(row, METRICS[8])
        st, st_wave = num(row, METRICS[9]), num(row, METRICS[10])
        stalls = sorted(((num(row, k), k) for k in row if k.startswith("smsp__average_warps_issue_stalled_")),
                        reverse=True)[:4]
        stall_text = ", ".join(f"{k.split('stalled_')[1].split('_per_issue')[0]} {v:.2f}" for v, k in stalls if v == v)
        lines.append(
            f"{i:3d} {row.get('Kernel Name', '?')[:28]:28s} {num(row, METRICS[0]) / 1e3:10.1f} us  grid {row.get(METRICS[1], '?')}"
            f" x {row.get(METRICS[2], '?')}  regs {row.get(METRICS[3], '?')}  warps {num(row, METRICS[4]):.0f}%"
            f"  issue {num(row, METRICS[5]):.0f}%  fma {num(row, METRICS[6]):.0f}%  shared-ld {ld:.3g} instr /"
            f" {ld_wave:.3g} wavefronts ({ld_wave / ld if ld else 0:.2f}x)  shared-st {st:.3g} / {st_wave:.3g}"
            f"  shared pipe {num(row, METRICS[11]):.0f}%  L2 {num(row, METRICS[13]) / 1e6:.1f} MB"
            f"  DRAM {num(row, METRICS[14]) / 1e6:.1f} MB\n      stalls per issue: {stall_text}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cell", default="lstm", nargs="?")
    p.add_argument("--pass", dest="pass_", choices=["forward", "forward_train", "backward"], default="forward")
    p.add_argument("-T", type=int, default=300)
    p.add_argument("-N", type=int, default=20)
    p.add_argument("--hidden-size", type=int, default=800)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--options", type=json.loads, default={}, help="tvmrnn.BuildOptions fields, as JSON")
    p.add_argument("--kernels", type=int, default=16, help="profile N kernels of the call")
    p.add_argument("--skip", type=int, default=0, help="after skipping its first SKIP kernels")
    p.add_argument("--out", default="ncu_pass", help="OUT.csv, OUT.txt")
    p.add_argument("--source", action="store_true",
                   help="also sample where the warps stall, per SASS instruction (OUT.ncu-rep, OUT_sass.csv, "
                        "OUT_sass.txt: the instructions and opcodes with the most samples); use with one kernel")
    p.add_argument("--summarise", metavar="SASS_CSV", help="only summarise an OUT_sass.csv made before (no GPU)")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)  # the profiled process
    a = p.parse_args()
    if a.summarise:
        summarise_sass(a.summarise, a.summarise.replace(".csv", "") + ".txt")
        return
    if a.inner:
        run_pass(a)
        return
    for metrics in (METRICS + [STALLS], METRICS[:1] + METRICS[7:9] + [STALLS]):  # then the few that matter most
        cmd = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--launch-count", str(a.kernels),
               "--launch-skip", str(a.skip), "--cache-control", "none",
               "--metrics", ",".join(metrics), "--csv", "--page", "raw", "--print-units", "base",
               sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--inner"]
        print(" ".join(cmd), flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True)
        text = done.stdout
        start = text.find('"ID"')
        if done.returncode == 0 and start >= 0:
            break
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
    else:
        raise SystemExit(f"ncu failed (exit {done.returncode})")
    with open(a.out + ".csv", "w") as f:
        f.write(text[start:])
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # the units row has no ID
    summary = f"{a.cell} {a.pass_} L={a.num_layers}{' bi' if a.bidirectional else ''} options {a.options}\n" + table(rows)
    with open(a.out + ".txt", "w") as f:
        f.write(summary + "\n")
    print(summary)
    if a.source:
        source_stalls(a)


def source_stalls(a):
    """Stall samples per SASS instruction of the profiled kernels (Nsight Compute's source page)."""
    inner = [sys.executable, os.path.abspath(__file__), *[x for x in sys.argv[1:] if x != "--source"], "--inner"]
    cmd = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--launch-count", str(a.kernels),
           "--launch-skip", str(a.skip), "--cache-control", "none", "--section", "SourceCounters",
           "--section", "WarpStateStats", "-f", "-o", a.out, *inner]
    print(" ".join(cmd), flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout[-3000:] + done.stderr[-3000:])
        return
    export = subprocess.run(["ncu", "-i", a.out + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                            capture_output=True, text=True)
    start = export.stdout.find('"')
    if export.returncode or start < 0:
        sys.stderr.write(export.stdout[-3000:] + export.stderr[-3000:])
        return
    with open(a.out + "_sass.csv", "w") as f:
        f.write(export.stdout[start:])
    summarise_sass(a.out + "_sass.csv", a.out + "_sass.txt")


def summarise_sass(path: str, out: str) -> None:
    """The stall samples of a source-page export (``OUT_sass.csv``): by opcode, by stall reason, and
    the instructions with the most, written to ``out`` and printed."""
    with open(path) as f:
        text = f.read()
    start = text.find('"Address"')  # after a line naming the kernel
    rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("Address", "").startswith("0x")]
    if not rows:
        print(f"{path}: no instructions")
        return
    sampled = next((k for k in rows[0] if k and k.startswith("Warp Stall Sampling (All")), None)
    code = next((k for k in rows[0] if k and k.strip() in ("Source", "SASS")), None)
    if not sampled or not code:
        print("source page columns:", list(rows[0]))
        return

    def samples(row, column=None):
        try:
            return float((row.get(column or sampled) or "0").replace(",", "") or 0)
        except ValueError:
            return 0.0
    total = sum(samples(r) for r in rows) or 1.0
    by_op = {}
    for r in rows:
        op = (r[code].split() or ["?"])[0]
        op = op if not op.startswith("@") else (r[code].split() + ["?", "?"])[1]
        by_op[op] = by_op.get(op, 0.0) + samples(r)
    reasons = {k: sum(samples(r, k) for r in rows) for k in rows[0]
                if k and k.startswith("stall_") and not k.endswith("(Not Issued)")}
    lines = [f"{path}: {len(rows)} instructions, {total:.0f} stall samples",
             "by opcode: " + ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in sorted(by_op.items(), key=lambda x: -x[1])[:14]),
             "by reason: " + ", ".join(f"{k[6:]} {100 * n / total:.1f}%" for k, n in sorted(reasons.items(), key=lambda x: -x[1])[:10]),
             "instructions with the most samples (#index in the kernel's SASS):"]
    top = sorted(enumerate(rows), key=lambda x: -samples(x[1]))[:30]
    lines += [f"  #{i:5d} {100 * samples(r) / total:5.1f}%  {r[code][:90]}" for i, r in top]
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
