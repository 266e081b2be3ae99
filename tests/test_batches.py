"""Batch sizes: a build for batch 1, and one build running every batch up to its own (padded),
against torch.nn in float64 (test_rnn.py's check). A file of its own: the float64 grid fills
test_rnn.py's worker."""
from __future__ import annotations

import pytest
import torch

from test_rnn import _check


@pytest.mark.parametrize("cell,num_layers,bidirectional", [("lstm", 2, True), ("gru", 1, False)])
def test_batch_of_one_matches_torch(cell, num_layers, bidirectional, rng):
    """A build for batch 1 (serving's latency case): T = 1 and 7 (single steps and a 4-step chunk)."""
    for T in (1, 7):
        _check(cell, num_layers, bidirectional, False, T, rng, batch=1)


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("cell,num_layers,bidirectional,batch_first",
                         [("lstm", 2, True, False), ("gru", 1, False, True), ("rnn_relu", 1, True, True)])
def test_smaller_batches_run_on_one_build(cell, num_layers, bidirectional, batch_first, rows, rng):
    """One build serves every batch from 1 to its batch_size (padded with copies of the first row): outputs,
    states and every gradient match torch at each, and the build is the same object."""
    _check(cell, num_layers, bidirectional, batch_first, 6, rng, batch=5, rows=rows)
    _check(cell, num_layers, bidirectional, batch_first, 6, rng, batch=5, rows=rows,
           as_array=torch.from_numpy, with_states=False)
