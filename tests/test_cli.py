"""The console commands a user runs: tvmrnn-tune, tvmrnn-export, tvmrnn-bench (help, and tiny configurations)."""
from __future__ import annotations

import json
import os
import subprocess

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


def test_tune_then_distill_on_a_tiny_configuration(tmp_path):
    """One trial of one task, then --distill into a records file that names the task's kernel."""
    args = ["rnn_tanh", "--input-size", "3", "--hidden-size", "4", "--batch-size", "2", "--target", "cpu",
            "--log-dir", str(tmp_path / "logs")]
    run = subprocess.run([*cli("tvmrnn-tune"), *args, "--trials", "1", "--kernels", "recurrent_step_rnn_tanh_infer"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done in" in run.stdout
    out = tmp_path / "records.jsonl"
    run = subprocess.run([*cli("tvmrnn-tune"), *args, "--distill", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["format"] == "tvmrnn-records" and lines[0]["workloads"] == len(lines) - 1 >= 1
    assert "recurrent_step_rnn_tanh_infer_n2_h4" in {line["kernel"] for line in lines[1:]}


def test_bad_arguments_are_refused_with_a_message():
    run = subprocess.run([*cli("tvmrnn-export"), "nosuchcell", "--input-size", "3", "--hidden-size", "4",
                          "--batch-size", "2", "-o", "x.so"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown cell 'nosuchcell'" in run.stderr
    run = subprocess.run([*cli("tvmrnn-tune"), "--rpc-tracker", "h:1"], capture_output=True, text=True)
    assert run.returncode == 2 and "--rpc-tracker and --rpc-key go together" in run.stderr
