"""No-hardware codegen checks: the same kernels compile for an H100 (sm_90) and for AVX-512 CPUs."""
from __future__ import annotations

import re
import shutil

import pytest

import tvmrnn

SIZES = dict(input_size=64, hidden_size=64, num_layers=2, bidirectional=True, batch_size=4)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_avx512_code_uses_zmm_registers(cell):
    rnn = tvmrnn.build(cell, **SIZES, target={"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16})
    asm = rnn.executable.mod.inspect_source("asm")
    assert re.search(r"%zmm\d+", asm), "no 512-bit vector registers in the generated assembly"
    assert "forward_train" in asm and "backward" in asm


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_relu"])
def test_cuda_sm90_compiles(cell):
    rnn = tvmrnn.build(cell, **SIZES, target={"kind": "cuda", "arch": "sm_90"})
    device_modules = rnn.executable.mod.imports
    assert [m.kind for m in device_modules] == ["cuda"]
    source = device_modules[0].inspect_source()
    # every per-step kernel of the three passes is a separate __global__ function
    assert source.count("__global__") >= 10
    assert rnn.target.host is not None and rnn.target.host.kind.name == "llvm"
