"""Shared fixtures: PyTorch references in float64 and a cache of built RNNs (builds take ~1 s)."""
from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest
import torch

import tvmrnn

# Odd sizes on purpose: nothing divides evenly into vector widths, chunks or thread blocks.
I, H, N = 13, 37, 3


def torch_module(cell, input_size, hidden_size, num_layers, bidirectional, batch_first):
    kwargs = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    if cell == "lstm":
        return torch.nn.LSTM(input_size, hidden_size, **kwargs)
    if cell == "gru":
        return torch.nn.GRU(input_size, hidden_size, **kwargs)
    return torch.nn.RNN(input_size, hidden_size, nonlinearity=cell[4:], **kwargs)


@functools.lru_cache(maxsize=None)
def built(cell, num_layers=1, bidirectional=False, batch_first=False, input_size=I, hidden_size=H, batch_size=N,
          target=None, allow_tf32=False, options=None):
    """A build shared by the tests that ask for the same one (``options``: a tvmrnn.BuildOptions, hashable)."""
    return tvmrnn.build(cell, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                        bidirectional=bidirectional, batch_size=batch_size, batch_first=batch_first, target=target,
                        allow_tf32=allow_tf32, options=options)


def cli(name: str) -> list[str]:
    """The command line that runs one of tvmrnn's console commands (``tvmrnn-tune``, ...): the
    installed script beside this Python, else its module."""
    script = os.path.join(os.path.dirname(sys.executable), name)
    return [script] if os.path.exists(script) else [sys.executable, "-m", "tvmrnn.cli." + name.split("-", 1)[1]]


def rel_error(actual, expected) -> float:
    """||a - e|| / ||e||, computed in float64."""
    a = np.asarray(actual.detach().cpu() if hasattr(actual, "detach") else actual, np.float64)
    e = np.asarray(expected.detach().cpu() if hasattr(expected, "detach") else expected, np.float64)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert np.all(np.isfinite(a)), "non-finite values"
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


# Tests use default schedules unless they say otherwise: the committed logs are for other machines.
os.environ["TVMRNN_TUNING_LOGS"] = "off"


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
