"""TVM 0.27: an uneven split of a reduction keeps its predicate through rfactor (the rfactor
block's ``T.where(k_0 * 16 + k_1 < 947)``), and compute_at of that block drops it (the block then
reads past the reduction's end and adds it in). Why split-K's slices stay divisors of the
reduction (v91: a prime H = 947 gets one slice, 8 threads a block at N = 2).

    python notes/bench/v91/rfactor_predicate.py   # prints 1 / 1 / 0 predicates"""
import tvm
from tvm import te, s_tir
K = 947
A = te.placeholder((2, K), "float32", "A")
W = te.placeholder((K, 8), "float32", "W")
k = te.reduce_axis((0, K), "k")
C = te.compute((2, 8), lambda n, j: te.sum(A[n, k] * W[k, j], axis=k), name="C")
D = te.compute((2, 8), lambda n, j: C[n, j] * 2.0, name="D")
f = te.create_prim_func([A, W, D])
sch = s_tir.Schedule(f)
b = sch.get_sblock("C")
n, j, kk = sch.get_loops(b)
ko, ki = sch.split(kk, [None, 16])
rf = sch.rfactor(ki, 0)
print("after rfactor has where:", "T.where" in sch.mod.script())
d = sch.get_sblock("D")
dn, dj = sch.get_loops(d)
bo, bi = sch.split(dj, [None, 4])
sch.bind(bo, "blockIdx.x")
sch.compute_at(b, bo, preserve_unit_loops=True)
print("after compute_at C:", sch.mod.script().count("T.where"))
sch.compute_at(rf, bo, preserve_unit_loops=True)
print("after compute_at rf:", sch.mod.script().count("T.where"))
print(sch.mod.script())
