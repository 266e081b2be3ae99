"""bf16 dot products on CPUs (tvmrnn.schedules.bf16), building blocks of half precision: a GEMM
tensorized with the AVX512-BF16 intrinsic against NumPy in float64 where this CPU has the
instruction, a target without it refused by name; the AMX tile microkernel compiled for the Xeon,
and run against float64 where the CPU has AMX-BF16."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import te

from tvmrnn.schedules import bf16


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return flag in f.read().split()
    except OSError:
        return False


def _bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, rounded to nearest even."""
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _check_against_float64(lib, M, N, K, rng):
    """``lib``'s C (M, N) = A (M, K) . B, on random bf16 inputs (B packed (K/2, N, 2)), against the
    same bf16 values multiplied in float64."""
    a, b = _bits(rng.standard_normal((M, K))), _bits(rng.standard_normal((K, N)))
    packed = np.ascontiguousarray(b.reshape(K // 2, 2, N).transpose(0, 2, 1))
    dev = tvm.cpu(0)
    out = tvm.runtime.tensor(np.full((M, N), np.nan, np.float32), dev)
    lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(packed, dev), out)
    widen = lambda x: (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    expected = widen(a) @ widen(b)
    # each product is exact in fp32; the sums are fp32's, in another order than float64's
    assert np.abs(out.numpy() - expected).max() <= 1e-6 * K * np.abs(expected).max()


def _gemm(M, N, K, target):
    """C (M, N) fp32 = A (M, K) . B, A's bf16 bits row-major, B's packed (K/2, N, 2)."""
    import tvm.s_tir as s_tir
    A = te.placeholder((M, K), "uint16", name="A")
    B = te.placeholder((K // 2, N, 2), "uint16", name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(bf16.widen(A[i, k]) * bf16.widen(B[k // 2, j, k % 2]), axis=k), name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, B, C]))
    block = sch.get_sblock("C")
    i, j, kk = sch.get_loops(block)
    jo, ji = sch.split(j, [None, 16])
    ko, ki = sch.split(kk, [None, 2])
    sch.reorder(i, jo, ko, ji, ki)
    init = sch.decompose_reduction(block, ko)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(ji, bf16.register())
    return tvm.compile(sch.mod, target=target)


@pytest.mark.skipif(not _cpu_has("avx512_bf16"), reason="this CPU has no AVX512-BF16 (avx512_bf16)")
@pytest.mark.parametrize("M,N,K", [(7, 32, 38), (1, 16, 2), (13, 48, 130)])
def test_bf16_dot_products_match_float64(M, N, K, rng):
    target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4"})  # a CPU LLVM knows to have the instruction
    lib = _gemm(M, N, K, target).jit()
    assert "vdpbf16ps" in lib.inspect_source("asm")
    _check_against_float64(lib, M, N, K, rng)


def test_bf16_needs_the_instruction():
    assert bf16.supports(tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assert not bf16.supports(tvm.target.Target({"kind": "llvm", "mcpu": "znver3"}))
    assert not bf16.supports(tvm.target.Target("nvidia/nvidia-h100"))
    with pytest.raises(ValueError, match="AVX512-BF16 .avx512bf16.; 'znver3' has none"):
        bf16.check_target(tvm.target.Target({"kind": "llvm", "mcpu": "znver3"}))


def _amx_gemm(M, N, K):
    """C (M, N) = A (M, K) . B (K/2, N, 2) in 16 x 16 tiles of the AMX microkernel (M, N multiples
    of 16, K of 32), for the Xeon's target."""
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def gemm(A: T.Buffer((M, K), "uint16"), B: T.Buffer((K // 2, N, 2), "uint16"), C: T.Buffer((M, N), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        with T.attr(0, "pragma_import_llvm", bf16.AMX_TILE_IR):
            for i, j in T.grid(M // 16, N // 16):
                for ii, jj in T.grid(16, 16):
                    C[i * 16 + ii, j * 16 + jj] = T.float32(0)
                T.evaluate(T.call_extern("void", "tvmrnn_amx_bf16_16x16",
                                         T.address_of(C[i * 16, j * 16]), T.int64(N * 4),
                                         T.address_of(A[i * 16, 0]), T.int64(K * 2),
                                         T.address_of(B[0, j * 16, 0]), T.int64(N * 4), T.int64(K // 32)))

    return tvm.compile(tvm.IRModule({"main": gemm}), target=tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))


def test_amx_tiles_compile_for_the_xeon_and_match_float64_where_it_runs(rng):
    """The AMX microkernel compiles to tile instructions for Sapphire Rapids anywhere; on a CPU with
    AMX-BF16 (the GPU machine's Xeon) it runs and matches float64."""
    M, N, K = 32, 48, 96
    lib = _amx_gemm(M, N, K).jit()
    asm = lib.inspect_source("asm")
    assert asm.count("tdpbf16ps") >= 1 and "ldtilecfg" in asm and "tilerelease" in asm
    assert bf16.supports_amx(tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assert not bf16.supports_amx(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    if not (_cpu_has("amx_bf16") and bf16.request_amx()):
        pytest.skip("this CPU (or OS) offers no AMX-BF16: compiled only")
    _check_against_float64(lib, M, N, K, rng)
