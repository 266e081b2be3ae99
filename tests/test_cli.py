"""The console commands a user runs: tvmrnn-tune, tvmrnn-export, tvmrnn-bench (help, and tiny configurations)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from conftest import cli


@pytest.mark.parametrize("name", ["tvmrnn-tune", "tvmrnn-export", "tvmrnn-bench"])
def test_help(name):
    out = subprocess.run([*cli(name), "--help"], capture_output=True, text=True, check=True).stdout
    assert out.startswith("usage: ") and name.split("-")[1] in out


def test_tune_lists_a_tiny_configurations_tasks(tmp_path):
    """--list shows every task with what the logs and shipped records hold, tuning nothing."""
    env = dict(os.environ, TVMRNN_TUNING_LOGS=str(tmp_path))
    out = subprocess.run([*cli("tvmrnn-tune"), "gru", "--input-size", "3", "--hidden-size", "5", "--batch-size", "2",
                          "--target", "cpu", "--list"], capture_output=True, text=True, check=True, env=env).stdout
    assert "recurrent_step_gru_infer_n2_h5" in out and "(none)" in out
    assert not any(tmp_path.iterdir())  # nothing written


def test_bad_arguments_are_refused_with_a_message():
    run = subprocess.run([*cli("tvmrnn-export"), "nosuchcell", "--input-size", "3", "--hidden-size", "4",
                          "--batch-size", "2", "-o", "x.so"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown cell 'nosuchcell'" in run.stderr
    run = subprocess.run([*cli("tvmrnn-tune"), "--rpc-tracker", "h:1"], capture_output=True, text=True)
    assert run.returncode == 2 and "--rpc-tracker and --rpc-key go together" in run.stderr
    with socket.socket() as s:  # a port nothing listens on: refused at once, not after TVM's minute of retries
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = subprocess.run([*cli("tvmrnn-tune"), "gru", "--input-size", "3", "--hidden-size", "5", "--batch-size", "2",
                          "--target", "cpu", "--rpc-tracker", f"127.0.0.1:{port}", "--rpc-key", "k"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and f"no RPC tracker answers at 127.0.0.1:{port}" in run.stderr, run.stderr[-500:]


@pytest.mark.parametrize("name, args, message", [
    ("tvmrnn-export", ["gru", "--input-size", "3", "--hidden-size", "0", "--batch-size", "2", "-o", "x.so"],
     "argument --hidden-size: expected an integer >= 1, got 0"),
    ("tvmrnn-export", ["gru", "--input-size", "3", "--hidden-size", "4", "--batch-size", "2", "--target", "{bad",
                       "-o", "x.so"], "tvmrnn-export: error: Expecting property name"),
    ("tvmrnn-export", ["nosuchmodule:CELL", "--input-size", "3", "--hidden-size", "4", "--batch-size", "2",
                       "-o", "x.so"], "No module named 'nosuchmodule'"),
    ("tvmrnn-export", ["gru", "--input-size", "3", "--hidden-size", "4", "--batch-size", "2", "-o",
                       "no/such/folder/x.so"], "no such folder"),
    ("tvmrnn-tune", ["gru", "--input-size", "3", "--hidden-size", "-4", "--batch-size", "2", "--list"],
     "argument --hidden-size: expected an integer >= 1, got -4"),
    ("tvmrnn-tune", ["gru", "--input-size", "3", "--hidden-size", "4", "--batch-size", "2", "--target",
                     "notatarget", "--list"], "tvmrnn-tune: error: target: cannot make a TVM target"),
    ("tvmrnn-tune", ["--config", "no_such_config.json", "--list"], "No such file or directory"),
    ("tvmrnn-tune", ["--list"], "tvmrnn-tune: error: give cells and sizes, or --config FILE"),
    ("tvmrnn-tune", ["--config", "{config}", "--list"], "tvmrnn-tune: error: configuration 1: missing hidden_size"),
    ("tvmrnn-bench", ["nosuch"], "cells: unknown ['nosuch']"),
    ("tvmrnn-bench", ["gru", "--reps", "0"], "argument --reps: expected an integer >= 1, got 0"),
    ("tvmrnn-bench", ["gru", "--device", "cpu", "--tf32"], "tvmrnn-bench: error: --tf32 is for --device cuda"),
    ("tvmrnn-bench", ["gru", "--device", "cpu", "--dtype", "float16"], "tvmrnn-bench: error: --dtype float16: CUDA only"),
])
def test_errors_of_use_are_one_line_and_status_2(name, args, message, tmp_path, monkeypatch, capsys):
    """The commands answer a bad size, target, cell module, output folder or file with argparse's
    one-line ``prog: error: ...`` and exit status 2 (tracebacks before, and sizes of 0 or less
    accepted by tvmrnn-tune; its configuration errors exited with status 1). Each command's
    ``main`` in this process, as its console script calls it (a process each took ~4 s of imports;
    test_help and test_bench_on_a_missing_gpu_is_an_error_of_use run the scripts)."""
    import importlib
    (tmp_path / "config.json").write_text('[{"cell": "gru", "input_size": 3, "batch_size": 2}]')
    args = [a.replace("{config}", str(tmp_path / "config.json")) for a in args]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # (main puts the working folder on it, as python -m)
    main = importlib.import_module("tvmrnn.cli." + name.split("-")[1]).main
    with pytest.raises(SystemExit) as exit_:
        main(args)
    stderr = capsys.readouterr().err
    assert exit_.value.code == 2 and message in stderr and "Traceback" not in stderr, stderr[-800:]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_bench_on_a_missing_gpu_is_an_error_of_use(tmp_path):
    """``--device cuda`` where PyTorch sees no GPU: one line and status 2, as other errors of use."""
    run = subprocess.run([*cli("tvmrnn-bench"), "gru", "--device", "cuda"], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120)
    assert run.returncode == 2 and "tvmrnn-bench: error: --device cuda: PyTorch sees no CUDA GPU" in run.stderr, \
        run.stderr[-800:]


def test_whole_passes_run_only_on_the_device_measured(tmp_path):
    """``--passes-only`` times whole passes here: for a GPU target on a machine without one, or
    another CPU's target, it says where to run it instead of crashing."""
    import tvm
    from tvmrnn.device import host_target
    other_cpu = "core2" if str(host_target().attrs.get("mcpu")) != "core2" else "znver4"
    for target in ("nvidia/nvidia-h100", '{"kind": "llvm", "mcpu": "%s", "num-cores": 2}' % other_cpu):
        if target.startswith("nvidia") and tvm.cuda(0).exist:
            continue
        run = subprocess.run([*cli("tvmrnn-tune"), "gru", "--input-size", "3", "--hidden-size", "5", "--batch-size",
                              "2", "--target", target, "--passes-only", "--log-dir", str(tmp_path)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 1 and "must run on that device" in run.stderr and "--passes-only there" in run.stderr


def test_passes_only_writes_verdicts_that_list_and_build_read(tmp_path):
    """``tvmrnn-tune --passes-only`` on this CPU: the options of each configuration measured and
    written to the log folder's pass_checks.json (no search, no records to check); ``--list``
    reads the folder; a configuration whose options set a pass-level choice is said not tuned."""
    import json
    config = tmp_path / "configs.json"
    config.write_text(json.dumps([{"cell": "gru", "input_size": 3, "hidden_size": 5, "batch_size": 2},
                                  {"cell": "rnn_relu", "input_size": 3, "hidden_size": 5, "batch_size": 2,
                                   "options": {"chunk_steps": [4, 1]}}]))
    run = subprocess.run([*cli("tvmrnn-tune"), "--config", str(config), "--target", "cpu", "--passes-only",
                          "--log-dir", str(tmp_path / "logs"), "--pass-pairs", "3", "--pass-length", "8"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "whole passes of gru I=3 H=5 L=1 N=2" in run.stdout and "interleave_projections=False" in run.stdout
    assert "rnn_relu I=3 H=5 L=1 N=2: its options set pass-level choices; not tuned" in run.stdout
    assert run.stdout.count("no records and default options -> as built now: inference") == 2
    verdicts = list((tmp_path / "logs").glob("*/pass_checks.json"))
    assert len(verdicts) == 1 and json.loads(verdicts[0].read_text())["options"][0]["describe"] == "gru I=3 H=5 L=1 N=2"
    listed = subprocess.run([*cli("tvmrnn-tune"), "--config", str(config), "--target", "cpu", "--list",
                             "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0 and "whole pass" in listed.stdout
    bad = subprocess.run([*cli("tvmrnn-tune"), "--config", str(config), "--passes-only", "--pass-pairs", "2"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--pass-pairs must be 3 or more" in bad.stderr


def test_bench_sweeps_shapes_into_one_table(tmp_path):
    """--sweep measures each shape of a config in a process of its own and prints one table of
    ratios with their geometric means; a shape that fails is a row with its error, not a crash."""
    config = tmp_path / "sweep.json"
    config.write_text('[{"cell": "gru", "T": 4, "batch_size": 2, "input_size": 3, "hidden_size": 5},'
                      ' {"cell": "nosuchcell", "T": 4, "batch_size": 2, "input_size": 3, "hidden_size": 5}]')
    out = subprocess.run([*cli("tvmrnn-bench"), "--sweep", str(config), "--reps", "2", "--max-seconds", "1",
                          "--threads", "1", "--json", str(tmp_path / "r.json")],
                         capture_output=True, text=True, check=True).stdout
    table = out[out.index("shape"):]
    assert "gru T=4 N=2 I=3 H=5 L=1" in table and "nosuchcell" in table
    assert "inference: geometric mean" in table and "(1 of 2 shapes)" in table
    assert (tmp_path / "r.json").exists()
    # each shape's line also gives both sides' median times, which ratios alone lose
    assert re.search(r"gru T=4 N=2 .* inference \d+\.\d+ / \d+\.\d+ ms  training \d+\.\d+ / \d+\.\d+ ms", out), out


@pytest.mark.parametrize("module,args", [("torch", ["lstm", "--device", "cpu"]), ("matplotlib", ["--plot", "x.json"])])
def test_bench_without_its_optional_packages_says_what_to_install(module, args):
    """``pip install tvmrnn`` brings neither PyTorch (the other side of every comparison) nor
    matplotlib (``--plot``): the command names what is missing instead of a traceback."""
    import sys
    code = (f"import sys; sys.modules[{module!r}] = None; from tvmrnn.cli.bench import main; main({args!r})")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and f"pip install {module}" in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_bench_dtype_refuses_what_no_build_takes():
    """``--dtype`` times ``build(dtype=)`` against PyTorch in that dtype: float16 on a CPU, or a
    half dtype with ``--tf32``, is refused by name before anything is built."""
    for args, message in ((["--device", "cpu", "--dtype", "float16"], "--dtype float16: CUDA only"),
                          (["--device", "cuda", "--dtype", "bfloat16", "--tf32"], "--dtype bfloat16: not with --tf32")):
        done = subprocess.run([*cli("tvmrnn-bench"), "lstm", *args], capture_output=True, text=True)
        assert done.returncode != 0 and message in done.stderr + done.stdout


@pytest.mark.skipif("avx512_bf16" not in open("/proc/cpuinfo").read(), reason="this CPU has no AVX512-BF16")
def test_bench_dtype_bfloat16_on_the_cpu(tmp_path):
    """``--dtype bfloat16`` on a CPU: the rows against PyTorch's bf16 module and its fp32 one, with
    bf16's errors."""
    out = tmp_path / "r.json"
    done = subprocess.run([*cli("tvmrnn-bench"), "gru", "--device", "cpu", "--threads", "1", "-T", "5", "-N", "3",
                           "--input-size", "16", "--hidden-size", "32", "--reps", "2", "--dtype", "bfloat16",
                           "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["pass_"]: r for r in json.load(open(out))["results"]}
    assert {"inference (bf16 both)", "inference (bf16 vs PyTorch fp32)", "training (bf16 both)"} <= set(rows)
    assert all(r["rel_error"] < 3e-2 for r in rows.values() if "rel_error" in r)
