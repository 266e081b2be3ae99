"""The correctness tests on a CUDA GPU with the default GPU schedule (skipped without a GPU).

Inputs are torch CUDA tensors (passed through DLPack); references are torch.nn on the CPU in
float64, so cuDNN plays no part in what counts as right.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm

import tvmrnn
from conftest import I, N, built, torch_module
from test_rnn import CELLS, _check

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and tvm.cuda(0).exist),
                                reason="needs a CUDA GPU visible to both torch and TVM")


def to_cuda(a):
    return torch.from_numpy(np.ascontiguousarray(a)).cuda()


@pytest.mark.parametrize("T", [1, 7, 50])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq_first", "batch_first"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bidir"])
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize("cell", CELLS)
def test_matches_torch_on_cuda(cell, num_layers, bidirectional, batch_first, T, rng):
    _check(cell, num_layers, bidirectional, batch_first, T, rng, target="cuda", as_array=to_cuda)


def test_outputs_are_cuda_tensors_and_numpy_is_refused():
    rnn = built("gru", 1, False, target="cuda")
    torch.manual_seed(0)
    w = rnn.pack_weights(tvmrnn.params_from_torch(torch_module("gru", I, 37, 1, False, False)))
    x = torch.randn(5, N, I, device="cuda")
    y, hy, cy = rnn.forward(w, x)
    assert y.is_cuda and hy.is_cuda and cy is None
    with pytest.raises(ValueError, match="x: this RNN was built for cuda"):
        rnn.forward(w, x.cpu().numpy())
