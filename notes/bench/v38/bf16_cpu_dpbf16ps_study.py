"""AVX512-BF16 dot products (vdpbf16ps) from TVM: bf16 kept as uint16 bits (no bf16 legalization),
the instruction reached through a small LLVM IR function imported into the module."""
import sys, time, numpy as np, tvm
from tvm import te
import tvm.s_tir as s_tir
from tvm.script import tirx as T
from tvm.s_tir import TensorIntrin

LL = """
define linkonce_odr <16 x float> @tvmrnn_dpbf16(<16 x float> %c, <32 x i16> %a, <32 x i16> %b) #0 {
  %ab = bitcast <32 x i16> %a to <32 x bfloat>
  %bb = bitcast <32 x i16> %b to <32 x bfloat>
  %r = call <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float> %c, <32 x bfloat> %ab, <32 x bfloat> %bb)
  ret <16 x float> %r
}
declare <16 x float> @llvm.x86.avx512bf16.dpbf16ps.512(<16 x float>, <32 x bfloat>, <32 x bfloat>)
attributes #0 = { alwaysinline "target-features"="+avx512f,+avx512bf16,+avx512bw,+avx512vl" }
"""


def widen(x):  # bf16 bits (uint16) -> float32
    return T.reinterpret(T.shift_left(T.cast(x, "uint32"), T.uint32(16)), dtype="float32")


@T.prim_func(s_tir=True)
def desc(A: T.Buffer((2,), "uint16", offset_factor=1), B: T.Buffer((16, 2), "uint16", offset_factor=1),
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
def impl(A: T.Buffer((2,), "uint16", offset_factor=1), B: T.Buffer((16, 2), "uint16", offset_factor=1),
         C: T.Buffer((16,), "float32", offset_factor=1)) -> None:
    with T.sblock("root"):
        T.reads(C[0:16], A[0:2], B[0:16, 0:2])
        T.writes(C[0:16])
        with T.attr(0, "pragma_import_llvm", LL):
            a_pair = T.reinterpret(A.vload([0], "uint16x2"), dtype="int32")
            a = T.reinterpret(T.broadcast(a_pair, 16), dtype="int16x32")
            b = T.reinterpret(B.vload([0, 0], dtype="uint16x32"), dtype="int16x32")
            C[T.ramp(T.int32(0), 1, 16)] = T.call_extern("float32x16", "tvmrnn_dpbf16", C.vload([0], dtype="float32x16"), a, b)


TensorIntrin.register("tvmrnn_dot_16x2_bf16", desc, impl)
M, N, K = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})


def bits_to_f32(x):
    return tvm.tirx.reinterpret("float32", x.astype("uint32") << tvm.tirx.const(16, "uint32"))


def gemm(rows=int(__import__("os").environ.get("ROWS", 6))):
    A = te.placeholder((M, K), "uint16", name="A")
    Bp = te.placeholder((K // 2, N, 2), "uint16", name="Bp")  # k pairs interleaved per column
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(bits_to_f32(A[i, k]) * bits_to_f32(Bp[k // 2, j, k % 2]), axis=k), name="C")
    sch = s_tir.Schedule(te.create_prim_func([A, Bp, C]))
    blk = sch.get_sblock("C")
    i, j, kk = sch.get_loops(blk)
    io, ii = sch.split(i, [None, rows])
    jo, ji = sch.split(j, [None, 16])
    ko, ki = sch.split(kk, [None, 2])
    sch.reorder(io, jo, ko, ii, ji, ki)
    sch.parallel(io)
    init = sch.decompose_reduction(blk, ko)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(ji, "tvmrnn_dot_16x2_bf16")
    sch.unroll(ii)
    return tvm.compile(sch.mod, target=target)


def bf16(a):
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


rng = np.random.default_rng(0)
a = rng.standard_normal((M, K)).astype(np.float32); b = rng.standard_normal((K, N)).astype(np.float32)
ab, bb = bf16(a), bf16(b)
fa = (ab.astype(np.uint32) << 16).view(np.float32); fb = (bb.astype(np.uint32) << 16).view(np.float32)
ref = fa.astype(np.float64) @ fb
dev = tvm.cpu(0)
t0 = time.time(); lib = gemm(); tb = time.time() - t0
mod = lib.jit() if hasattr(lib, "jit") else lib
A = tvm.runtime.tensor(ab, dev)
Bp = tvm.runtime.tensor(np.ascontiguousarray(bb.reshape(K // 2, 2, N).transpose(0, 2, 1)), dev)
C = tvm.runtime.tensor(np.zeros((M, N), np.float32), dev)
secs = min(mod.time_evaluator("main", dev, number=20, repeat=5)(A, Bp, C).results)
err = np.abs(C.numpy() - ref).max() / np.abs(ref).max()
asm = mod.inspect_source("asm") if hasattr(mod, "inspect_source") else ""
print(f"bf16 vdpbf16ps build {tb:.2f} s  {secs*1e6:9.1f} us  {2*M*N*K/secs/1e9:7.1f} GFLOP/s  rel err {err:.1e}  "
      f"vdpbf16ps in asm {asm.count('vdpbf16ps')}", flush=True)
