"""fp32 vs bf16-input GEMM (fp32 accumulate) on this CPU through TVM's LLVM codegen: what a plain
schedule gets, before any tensor intrinsic. C[m, n] = sum_k A[m, k] * B[k, n]."""
import sys, time, numpy as np, tvm
from tvm import te
import tvm.s_tir as s_tir

M, N, K = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
target = tvm.target.Target({"kind": "llvm", "mcpu": "znver4", "num-cores": 2})

def gemm(dtype):
    A = te.placeholder((M, K), dtype, name="A")
    B = te.placeholder((K, N), dtype, name="B")
    k = te.reduce_axis((0, K), name="k")
    C = te.compute((M, N), lambda i, j: te.sum(A[i, k].astype("float32") * B[k, j].astype("float32"), axis=k), name="C")
    f = te.create_prim_func([A, B, C])
    sch = s_tir.Schedule(f)
    blk = sch.get_sblock("C")
    i, j, kk = sch.get_loops(blk)
    io, ii = sch.split(i, [None, 6])
    jo, ji = sch.split(j, [None, 32])
    ko, ki = sch.split(kk, [None, 4])
    sch.reorder(io, jo, ko, ki, ii, ji)
    sch.parallel(io)
    sch.vectorize(ji)
    sch.unroll(ii)
    sch.unroll(ki)
    sch.decompose_reduction(blk, ko)
    return tvm.compile(sch.mod, target=target)

def bf16(a):  # round to nearest even, as uint16
    u = a.astype(np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

rng = np.random.default_rng(0)
a = rng.standard_normal((M, K)).astype(np.float32); b = rng.standard_normal((K, N)).astype(np.float32)
dev = tvm.cpu(0)
for dtype in ("float32", "bfloat16"):
    t0 = time.time(); lib = gemm(dtype); tb = time.time() - t0
    if dtype == "float32":
        A, B = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)
        ref = a.astype(np.float64) @ b
    else:
        A = tvm.runtime.empty((M, K), "bfloat16", dev); A.copyfrom(bf16(a))
        B = tvm.runtime.empty((K, N), "bfloat16", dev); B.copyfrom(bf16(b))
        fa = (bf16(a).astype(np.uint32) << 16).view(np.float32); fb = (bf16(b).astype(np.uint32) << 16).view(np.float32)
        ref = fa.astype(np.float64) @ fb
    C = tvm.runtime.tensor(np.zeros((M, N), np.float32), dev)
    mod = lib.jit() if hasattr(lib, "jit") else lib
    ev = mod.time_evaluator("main", dev, number=20, repeat=5)
    secs = min(ev(A, B, C).results)
    err = np.abs(C.numpy() - ref).max() / np.abs(ref).max()
    asm = mod.inspect_source("asm") if hasattr(mod, "inspect_source") else ""
    print(f"{dtype:9s} build {tb:.2f} s  {secs*1e6:9.1f} us  {2*M*N*K/secs/1e9:7.1f} GFLOP/s  rel err {err:.1e}  "
          f"vdpbf16ps {asm.count('vdpbf16ps')}  vfmadd {asm.count('vfmadd')}  vpslld {asm.count('vpslld')} vpmovzxwd {asm.count('vpmovzxwd')}", flush=True)
