"""The console commands a user runs: tvmrnn-tune, tvmrnn-export, tvmrnn-bench (help, and tiny configurations)."""
from __future__ import annotations

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


def test_bad_arguments_are_refused_with_a_message():
    run = subprocess.run([*cli("tvmrnn-export"), "nosuchcell", "--input-size", "3", "--hidden-size", "4",
                          "--batch-size", "2", "-o", "x.so"], capture_output=True, text=True)
    assert run.returncode == 2 and "unknown cell 'nosuchcell'" in run.stderr
    run = subprocess.run([*cli("tvmrnn-tune"), "--rpc-tracker", "h:1"], capture_output=True, text=True)
    assert run.returncode == 2 and "--rpc-tracker and --rpc-key go together" in run.stderr
