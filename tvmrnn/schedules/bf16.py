"""bf16 dot products on x86 CPUs with AVX512-BF16 (``vdpbf16ps``): a building block of the half-
precision issue (not yet used by ``build``: no kernel takes bf16 operands so far).

``vdpbf16ps`` multiplies pairs of bf16 values and adds both products to an fp32 accumulator, 16
lanes at a time: ``c[i] += a[2i] b[2i] + a[2i+1] b[2i+1]``, twice the multiply-adds of an fp32 FMA
per instruction. TVM 0.27 cannot reach it directly: its CPU pipeline rewrites bf16 arithmetic
into fp32 (``BF16ComputeLegalize``) and bf16 buffers into uint16 (``BF16StorageLegalize``), so an
``llvm.x86.avx512bf16.dpbf16ps.512`` call got ``<32 x i16>`` operands where LLVM wants ``<32 x
bfloat>`` (a verifier error), and skipping those passes crashed its code generator. So here:

* bf16 values travel as their bits in ``uint16`` buffers (no legalization applies), widened to fp32
  where a kernel needs them (:func:`widen`: the bits shifted into a float's upper half, exact);
* the instruction is reached through a small LLVM IR function, imported into the module
  (``pragma_import_llvm``), that bitcasts ``<32 x i16>`` to ``<32 x bfloat>`` and calls the
  intrinsic; it is inlined (``alwaysinline``), so the loop holds bare ``vdpbf16ps`` instructions.

:data:`DOT_16X2` is the tensor intrinsic: ``C[16] += A[2] . B[16, 2]`` with A's pair broadcast,
B's 16 columns each a k-pair (the operand packed ``(K/2, N, 2)``, as VNNI's int8 layouts are).
On a 2-core AMD EPYC (Zen 4), a 120 x 512 x 512 GEMM tensorized with it, naively scheduled,
ran at 162 GFLOP/s against 110 for the same schedule in fp32 and 97 for bf16 widened to fp32
FMAs (notes/performance.md v38); the products are exact in fp32 and summed in fp32.
"""
from __future__ import annotations

import tvm
from tvm.script import tirx as T

DOT_16X2 = "tvmrnn_dot_16x2_bf16"
FEATURE = "avx512bf16"  # LLVM's name of the CPU feature

# the instruction behind the intrinsic: bitcasts the operands' bits to bf16 vectors, calls LLVM's
# intrinsic; linkonce_odr, so that every tensorized call site may import it again
_LLVM_IR = """
define linkonce_odr <16 x float> @tvmrnn_dpbf16(<16 x float> %c, <32 x i16> %a, <32 x i16> %b) #0 {
  %ab = bitcast <32 x i16> %a to <32 x bfloat>
  %bb = bitcast <32 x i16> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %ab, <32 x bfloat> %bb)
  ret <16 x float> %r
}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
attributes #0 = { alwaysinline "target-features"="+avx512f,+avx512bw,+avx512vl,+avx512bf16" }
"""


def widen(bits):
    """A bf16 value held as its ``uint16`` bits, as the fp32 value it is (exact)."""
    return tvm.tirx.reinterpret("float32", bits.astype("uint32") << tvm.tirx.const(16, "uint32"))


def supports(target) -> bool:
    """Whether an LLVM CPU target has AVX512-BF16."""
    return target.kind.name == "llvm" and bool(tvm.target.codegen.target_has_features(FEATURE, target))


def check_target(target) -> None:
    """A clear error for a target without the instruction (rather than an illegal instruction at run time)."""
    if not supports(target):
        mcpu = target.attrs.get("mcpu", "generic") if target.kind.name == "llvm" else target.kind.name
        raise ValueError(f"target: bf16 dot products need a CPU with AVX512-BF16 ({FEATURE}); {mcpu!r} has none")


@T.prim_func(s_tir=True)
def _dot_16x2_desc(A: T.Buffer((2,), "uint16", offset_factor=1), B: T.Buffer((16, 2), "uint16", offset_factor=1),
                   C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:2], B[0:16, 0:2])
        T.writes(C[0:16])
        for i in T.serial(0, 16):
            for k in T.serial(0, 2):
                with T.sblock("update"):
                    vi, vk = T.axis.remap("SR", [i, k])
                    C[vi] = C[vi] + T.reinterpret(T.shift_left(T.cast(A[vk], "uint32"), T.uint32(16)), dtype="float32") \
                        * T.reinterpret(T.shift_left(T.cast(B[vi, vk], "uint32"), T.uint32(16)), dtype="float32")


@T.prim_func(s_tir=True)
def _dot_16x2_impl(A: T.Buffer((2,), "uint16", offset_factor=1), B: T.Buffer((16, 2), "uint16", offset_factor=1),
                   C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:2], B[0:16, 0:2])
        T.writes(C[0:16])
        with T.attr(0, "pragma_import_llvm", _LLVM_IR):
            pair = T.reinterpret(A.vload([0], "uint16x2"), dtype="int32")
            a = T.reinterpret(T.broadcast(pair, 16), dtype="int16x32")
            b = T.reinterpret(B.vload([0, 0], dtype="uint16x32"), dtype="int16x32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_extern("float32x16", "tvmrnn_dpbf16",
                                                         C.vload([0], dtype="float32x16"), a, b)


def register() -> str:
    """Register :data:`DOT_16X2` with TVM (once) and return its name, for ``sch.tensorize``."""
    from tvm.s_tir import TensorIntrin
    try:
        TensorIntrin.get(DOT_16X2)
    except Exception:  # noqa: BLE001 - not registered yet
        TensorIntrin.register(DOT_16X2, _dot_16x2_desc, _dot_16x2_impl)
    return DOT_16X2
