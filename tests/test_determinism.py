"""Determinism: on one machine and one build, the same inputs give bit-identical outputs and
gradients, whatever ran before, in whatever order, in whichever process, with however many CPU
threads; a row's outputs do not depend on the other rows of its batch. (test_cuda.py checks the GPU.)"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import tvmrnn
from conftest import H, I, N, built, torch_module

# whole builds at LLVM's own optimisation level, as users get them (tests/conftest.py)
pytestmark = pytest.mark.llvm_optimized

TESTS = os.path.dirname(os.path.abspath(__file__))


def _inputs(cell, T, rows, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, rows, I)).astype(np.float32)
    h0 = rng.standard_normal((4, rows, H)).astype(np.float32)
    dy = rng.standard_normal((T, rows, 2 * H)).astype(np.float32)
    return x, h0, dy


def digest(cell="lstm", target=None, as_array=lambda a: a, T=23, rows=N, seed=0) -> str:
    """SHA-256 of everything a 2-layer bidirectional build returns for one input: the forward's
    and the training forward's outputs and states, and every gradient."""
    rnn = built(cell, 2, True, target=target)
    torch.manual_seed(0)
    w = rnn.pack_weights({k: as_array(v) for k, v in
                          tvmrnn.params_from_torch(torch_module(cell, I, H, 2, True, False)).items()})
    x, h0, dy = (as_array(a) for a in _inputs(cell, T, rows, seed))
    out = list(rnn.forward(w, x, h0))
    y, hy, cy, ws = rnn.forward_train(w, x, h0)
    grads = rnn.backward(w, ws, dy)
    out += [y, hy, cy] + [grads[k] for k in sorted(grads)]
    h = hashlib.sha256()
    for a in out:
        if a is not None:
            h.update(np.ascontiguousarray(a.detach().cpu() if hasattr(a, "detach") else a).tobytes())
    return h.hexdigest()


def check_calls_and_orders(target=None, as_array=lambda a: a):
    for cell in ("lstm", "gru"):
        first = digest(cell, target, as_array)
        digest(cell, target, as_array, T=57, rows=1, seed=1)  # other lengths, batches, values between
        digest(cell, target, as_array, T=2, rows=N, seed=2)
        assert digest(cell, target, as_array) == first, cell


def check_rows_alone(target=None, as_array=lambda a: a):
    """A row's outputs and states are the same bits alone as in a full batch (rows are independent:
    padding is exact, and nothing sums across rows in a forward)."""
    rnn = built("gru", 2, True, target=target)
    torch.manual_seed(0)
    w = rnn.pack_weights({k: as_array(v) for k, v in
                          tvmrnn.params_from_torch(torch_module("gru", I, H, 2, True, False)).items()})
    x, h0, _ = _inputs("gru", 31, N, 3)
    full = [np.asarray(a.cpu() if hasattr(a, "cpu") else a) for a in rnn.forward(w, as_array(x), as_array(h0))[:2]]
    for r in range(N):
        alone = rnn.forward(w, as_array(np.ascontiguousarray(x[:, r:r + 1])),
                            as_array(np.ascontiguousarray(h0[:, r:r + 1])))[:2]
        for got, want in zip(alone, full):
            assert np.array_equal(np.asarray(got.cpu() if hasattr(got, "cpu") else got), want[:, r:r + 1]), r


def test_same_inputs_give_the_same_bits_whatever_ran_before():
    check_calls_and_orders()


def test_a_row_gives_the_same_bits_alone_and_in_a_batch():
    check_rows_alone()


def test_the_same_bits_in_other_processes_and_with_other_thread_counts(tmp_path):
    """CPU kernels split work across threads by output, never a sum: 1 and 3 threads and a second
    process give this process's bits (the first other process compiles the builds afresh, the
    second loads that process's builds from the build cache)."""
    here = digest("lstm") + digest("gru")
    code = (f"import os, sys; sys.path.insert(0, {TESTS!r}); import test_determinism as d; "
            "os.environ['TVMRNN_CACHE'] = 'on'; "  # importing the tests' conftest turned it off
            "print(d.digest('lstm') + d.digest('gru'))")
    for threads in ("1", "3"):
        env = dict(os.environ, TVM_NUM_THREADS=threads, OMP_NUM_THREADS=threads, TVMRNN_CACHE_DIR=str(tmp_path))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=TESTS)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split()[-1] == here, f"{threads} threads"
