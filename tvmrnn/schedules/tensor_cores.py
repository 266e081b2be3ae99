"""TF32 tensor-core tiles for the GPU's all-steps GEMMs (``build(..., allow_tf32=True)``) and for
the large forward steps of half builds (``BuildOptions.tensor_core_steps``).

TVM ships tensor intrinsics for ``mma.sync`` on float16, int8 and float8 operands, not on TF32
or bf16; this module registers the ones a TF32 GEMM needs, in the same form (``s_tir.TensorIntrin``: a
description that tensorize matches, an implementation it substitutes), for PTX's
``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32``. Each intrinsic covers a warp's 16 x 16
output tile over 8 steps of the reduction (two ``m16n8k8`` instructions), with the warp's
fragments in TVM's ``warp`` memory scope (a ``[32, local]`` buffer, lane first, that
``LowerWarpMemory`` turns into each thread's registers):

- ``A`` (16 x 8, row-major): lane ``4 g + t`` holds ``A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4]``
- ``B`` (16 x 8 as ``[n, k]``): lane ``4 g + t`` holds ``B[g, t], B[g, t + 4]`` and the same at ``n + 8``
- ``C`` (16 x 16): lane ``4 g + t`` holds ``C[g, 2t], C[g, 2t + 1], C[g + 8, 2t], C[g + 8, 2t + 1]``
  and the same at ``n + 8``

(PTX ISA, "Matrix fragments for mma.m16n8k8" with ``.tf32``). Operands are loaded from shared
memory a float at a time (``ldmatrix`` moves 16-bit elements); they reach the tensor cores as
fp32 bit patterns, whose low 13 mantissa bits the hardware ignores (truncation to TF32, as when
cuBLAS is handed fp32 data with TF32 allowed). Products are summed in fp32.

:func:`gpu_matmul_tf32` is the schedule: the GEMM normalised as :func:`default_schedule.gpu_matmul`
normalises it, block tiles in shared memory, warp tiles of these 16 x 16 fragments, and the
output staged through shared memory so that the fused epilogue writes it with whole warps along
the output's rows.

With half operands (``operands="float16"`` or ``"bfloat16"``) the same tiles hold fp16/bf16 values
and multiply them with ``mma.sync.aligned.m16n8k16`` (intrinsics below: TVM's fp16 ones have no
bf16 twin), each 16 x 16 fragment loaded by one ``ldmatrix.x4``.
"""
from __future__ import annotations

from tvm import s_tir
from tvm.script import tirx as T
from .common import _writes_param, nvcc_unroll, tvmscript_frames_without_source

WARP = 32
SHARED = "shared.dyn"  # the scope of the operand and output tiles
M, N, K = 16, 16, 8  # one intrinsic: a 16 x 16 output tile, 8 reduction steps
A_LOCAL, B_LOCAL, C_LOCAL = M * K // WARP, N * K // WARP, M * N // WARP  # 4, 4, 8 floats a lane


# (row, reduction) of a fragment -> (lane, register) and back, per operand
def a_map(i, k):
    return (i % 8) * 4 + k % 4, i // 8 + (k // 4) * 2


def a_inverse(lane, r):
    return lane // 4 + (r % 2) * 8, lane % 4 + (r // 2) * 4


def b_map(j, k):
    return (j % 8) * 4 + k % 4, (j // 8) * 2 + k // 4


def b_inverse(lane, r):
    return lane // 4 + (r // 2) * 8, lane % 4 + (r % 2) * 4


def c_map(i, j):
    return (i % 8) * 4 + (j % 8) // 2, (j // 8) * 4 + (i // 8) * 2 + j % 2


def c_inverse(lane, r):
    return lane // 4 + ((r // 2) % 2) * 8, (r // 4) * 8 + (lane % 4) * 2 + r % 2


# Half operands (``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}``): a fragment covers 16
# reduction steps. ``A`` (16 x 16): lane ``4 g + t`` holds ``A[g, 2t..2t+1], A[g + 8, 2t..2t+1],
# A[g, 2t+8..2t+9], A[g + 8, 2t+8..2t+9]``; ``B`` (16 x 16 as ``[n, k]``, two n8 halves): lane
# ``4 g + t`` holds ``B[g, 2t..2t+1], B[g, 2t+8..2t+9]``, then the same at ``n + 8``; ``C`` as for
# TF32. The registers are in the order in which ``ldmatrix.x4`` fills them from four 8 x 8
# matrices, so one ``ldmatrix`` loads a fragment.
K_HALF = 16
HALF_LOCAL = 16 * K_HALF // WARP  # 8 halves a lane, A's and B's


def a_map_half(i, k):
    return (i % 8) * 4 + (k % 8) // 2, (k // 8) * 4 + (i // 8) * 2 + k % 2


def b_map_half(j, k):
    return (j % 8) * 4 + (k % 8) // 2, (j // 8) * 4 + (k // 8) * 2 + k % 2


def _ldmatrix_rows(operand: str, reduction_major: bool, lane):
    """The (row, column) of the shared tile whose 8 elements ``lane`` points ``ldmatrix.x4`` at:
    lanes ``8 m .. 8 m + 7`` give the rows of the ``m``-th 8 x 8 matrix, matrices in register
    order (:func:`a_map_half`, :func:`b_map_half`); a reduction-major tile is read transposed."""
    row8, second, upper = lane % 8, (lane // 8) % 2, lane // 16
    # which 8-block of (fragment row, reduction) the m-th matrix is: A: (0,0) (8,0) (0,8) (8,8);
    # B: (0,0) (0,8) (8,0) (8,8)
    rows_block, k_block = (second, upper) if operand == "a" else (upper, second)
    if reduction_major:  # the tile is [k, rows]: its rows are reduction steps
        return row8 + 8 * k_block, 8 * rows_block
    return row8 + 8 * rows_block, 8 * k_block


def _load_desc(dtype: str, k_step: int, local: int, fragment_map, reduction_major: bool):
    """What a fragment load does: shared ``[16, k_step]`` (``[k_step, 16]`` if
    ``reduction_major``) -> a warp fragment laid out by ``fragment_map``."""
    shape = (k_step, 16) if reduction_major else (16, k_step)

    def at(buf, r, k):
        return buf[k, r] if reduction_major else buf[r, k]

    # the block's variables in its shared tile's order, as cache_read makes them
    order = (1, 0) if reduction_major else (0, 1)

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, w: T.handle) -> None:
        A = T.match_buffer(a, shape, dtype, scope=SHARED, offset_factor=1)
        W = T.match_buffer(w, (WARP, local), dtype, scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:shape[0], 0:shape[1]])
            T.writes(W[0:WARP, 0:local])
            for r, k in T.grid(16, k_step):
                with T.sblock("load"):
                    v0, v1 = T.axis.remap("SS", [(r, k)[order[0]], (r, k)[order[1]]])
                    vr, vk = T.meta_var(((v0, v1)[order[0]], (v0, v1)[order[1]]))
                    lane, reg = T.meta_var(fragment_map(vr, vk))
                    W[lane, reg] = at(A, vr, vk)

    return desc


def _ldmatrix_intrin(dtype: str, operand: str, reduction_major: bool):
    """shared ``[16, 16]`` (``[k, rows]`` if ``reduction_major``) half tile -> a warp fragment,
    by one ``ldmatrix.x4`` (``.trans`` for a reduction-major tile)."""
    shape = (K_HALF, 16) if reduction_major else (16, K_HALF)

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, w: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        A = T.match_buffer(a, shape, dtype, scope=SHARED, offset_factor=1, strides=[s0, s1])
        W = T.match_buffer(w, (WARP, HALF_LOCAL), dtype, scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:shape[0], 0:shape[1]])
            T.writes(W[0:WARP, 0:HALF_LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                row, col = T.meta_var(_ldmatrix_rows(operand, reduction_major, tx))
                T.evaluate(T.ptx_legacy.ldmatrix(
                    reduction_major, 4, ".b16", W.data, W.elem_offset + tx * HALF_LOCAL,
                    A.access_ptr("r"), row * s0 + col, dtype=dtype))

    fragment_map = a_map_half if operand == "a" else b_map_half
    return _load_desc(dtype, K_HALF, HALF_LOCAL, fragment_map, reduction_major), impl


def _load_intrin(fragment_map, inverse, local: int, reduction_major: bool):
    """shared ``[16, K]`` (``[K, 16]`` if ``reduction_major``) fp32 tile -> a warp fragment, a
    float at a time."""
    shape = (K, 16) if reduction_major else (16, K)

    def at(buf, r, k):
        return buf[k, r] if reduction_major else buf[r, k]

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, w: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        A = T.match_buffer(a, shape, "float32", scope=SHARED, offset_factor=1, strides=[s0, s1])
        W = T.match_buffer(w, (WARP, local), "float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads(A[0:shape[0], 0:shape[1]])
            T.writes(W[0:WARP, 0:local])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for reg in T.unroll(local):
                    r, k = T.meta_var(inverse(tx, reg))
                    W[tx, reg] = at(A, r, k)

    return _load_desc("float32", K, local, fragment_map, reduction_major), impl


def _fragments(operands: str):
    """``(dtype, reduction steps, A's and B's elements a lane, A's map, B's map)`` of a fragment
    on ``operands`` (:data:`OPERANDS`)."""
    if operands == "tf32":
        return "float32", K, A_LOCAL, B_LOCAL, a_map, b_map
    return operands, K_HALF, HALF_LOCAL, HALF_LOCAL, a_map_half, b_map_half


def _mma_intrin(operands: str):
    """A warp's 16 x 16 x k-step product on ``operands`` (:data:`OPERANDS`): two ``mma.sync``
    (m16n8k8 on TF32, m16n8k16 on a half type), fp32 accumulators. Half operands are widened to
    fp32 in the description, as the scheduled GEMM reads them (``unsafe_set_dtype``'s casts)."""
    is_half = operands != "tf32"
    dtype, k_step, a_local, b_local, a_of, b_of = _fragments(operands)
    shape, ptx = ("m16n8k16", PTX_TYPE[operands]) if is_half else ("m16n8k8", "tf32")

    def widened(v):
        return T.Cast("float32", v) if is_half else v

    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, a_local), dtype, scope="warp", offset_factor=1)
        B = T.match_buffer(b, (WARP, b_local), dtype, scope="warp", offset_factor=1)
        C = T.match_buffer(c, (WARP, C_LOCAL), "float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:C_LOCAL], A[0:WARP, 0:a_local], B[0:WARP, 0:b_local])
            T.writes(C[0:WARP, 0:C_LOCAL])
            for i, j, k in T.grid(M, N, k_step):
                with T.sblock("C"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    lc, rc = T.meta_var(c_map(vi, vj))
                    la, ra = T.meta_var(a_of(vi, vk))
                    lb, rb = T.meta_var(b_of(vj, vk))
                    C[lc, rc] = C[lc, rc] + widened(A[la, ra]) * widened(B[lb, rb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, a_local), dtype, scope="warp", offset_factor=1)
        B = T.match_buffer(b, (WARP, b_local), dtype, scope="warp", offset_factor=1)
        C = T.match_buffer(c, (WARP, C_LOCAL), "float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:C_LOCAL], A[0:WARP, 0:a_local], B[0:WARP, 0:b_local])
            T.writes(C[0:WARP, 0:C_LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for half in T.unroll(2):  # the two 8-column halves of the tile
                    T.evaluate(T.ptx_legacy.mma(
                        shape, "row", "col", ptx, ptx, "fp32",
                        A.data, A.elem_offset + tx * a_local,
                        B.data, B.elem_offset + tx * b_local + half * (b_local // 2),
                        C.data, C.elem_offset + tx * C_LOCAL + half * (C_LOCAL // 2),
                        False, dtype="float32"))

    return desc, impl


def _fill_intrin():
    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, C_LOCAL), "float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:C_LOCAL])
            for i, j in T.grid(M, N):
                with T.sblock("fill"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    lane, reg = T.meta_var(c_map(vi, vj))
                    C[lane, reg] = T.float32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, C_LOCAL), "float32", scope="warp", offset_factor=1)
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:C_LOCAL])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for reg in T.unroll(C_LOCAL):
                    C[tx, reg] = T.float32(0)

    return desc, impl


def _store_intrin():
    """A warp's 16 x 16 accumulator tile -> shared memory."""
    @T.prim_func(s_tir=True)
    def desc(w: T.handle, c: T.handle) -> None:
        W = T.match_buffer(w, (WARP, C_LOCAL), "float32", scope="warp", offset_factor=1)
        C = T.match_buffer(c, (M, N), "float32", scope=SHARED, offset_factor=1)
        with T.sblock("root"):
            T.reads(W[0:WARP, 0:C_LOCAL])
            T.writes(C[0:M, 0:N])
            for i, j in T.grid(M, N):
                with T.sblock("store"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    lane, reg = T.meta_var(c_map(vi, vj))
                    C[vi, vj] = W[lane, reg]

    @T.prim_func(s_tir=True)
    def impl(w: T.handle, c: T.handle) -> None:
        s0 = T.int32()
        s1 = T.int32()
        W = T.match_buffer(w, (WARP, C_LOCAL), "float32", scope="warp", offset_factor=1)
        C = T.match_buffer(c, (M, N), "float32", scope=SHARED, offset_factor=1, strides=[s0, s1])
        with T.sblock("root"):
            T.reads(W[0:WARP, 0:C_LOCAL])
            T.writes(C[0:M, 0:N])
            for tx in T.thread_binding(0, WARP, "threadIdx.x"):
                for reg in T.unroll(C_LOCAL):
                    i, j = T.meta_var(c_inverse(tx, reg))
                    C[i, j] = W[tx, reg]

    return desc, impl


LOAD_A = "tvmrnn_tf32_load_a"
LOAD_A_T = "tvmrnn_tf32_load_a_reduction_major"
LOAD_B = "tvmrnn_tf32_load_b"
LOAD_B_T = "tvmrnn_tf32_load_b_reduction_major"
MMA = "tvmrnn_tf32_mma_m16n16k8"
FILL = "tvmrnn_tf32_fill"
STORE = "tvmrnn_tf32_store_shared"

# The operands a tensor-core GEMM can take: "tf32" (fp32 data, m16n8k8) or a half type whose
# values the copies into shared memory round to (m16n8k16, fragments loaded by ``ldmatrix``).
PTX_TYPE = {"float16": "fp16", "bfloat16": "bf16"}
OPERANDS = ("tf32", *PTX_TYPE)


def _half_names(dtype: str) -> dict:
    return {"a": f"tvmrnn_{dtype}_ldmatrix_a", "a_t": f"tvmrnn_{dtype}_ldmatrix_a_reduction_major",
            "b": f"tvmrnn_{dtype}_ldmatrix_b", "b_t": f"tvmrnn_{dtype}_ldmatrix_b_reduction_major",
            "mma": f"tvmrnn_{dtype}_mma_m16n16k16"}


def _names(operands: str) -> dict:
    if operands == "tf32":
        return {"a": LOAD_A, "a_t": LOAD_A_T, "b": LOAD_B, "b_t": LOAD_B_T, "mma": MMA}
    if operands not in PTX_TYPE:
        raise ValueError(f"tensor-core operands: {operands!r}, not one of {OPERANDS}")
    return _half_names(operands)


_registered = False


def register() -> None:
    """Register the intrinsics with TVM (once per process)."""
    global _registered
    if _registered:
        return
    with tvmscript_frames_without_source():
        _register_all()
    _registered = True


def _register_all() -> None:
    for name, pair in ((LOAD_A, _load_intrin(a_map, a_inverse, A_LOCAL, False)),
                       (LOAD_A_T, _load_intrin(a_map, a_inverse, A_LOCAL, True)),
                       (LOAD_B, _load_intrin(b_map, b_inverse, B_LOCAL, False)),
                       (LOAD_B_T, _load_intrin(b_map, b_inverse, B_LOCAL, True)),
                       (MMA, _mma_intrin("tf32")), (FILL, _fill_intrin()), (STORE, _store_intrin())):
        s_tir.TensorIntrin.register(name, *pair, override=True)
    for dtype in PTX_TYPE:
        names = _half_names(dtype)
        for key, operand, reduction_major in (("a", "a", False), ("a_t", "a", True), ("b", "b", False),
                                              ("b_t", "b", True)):
            s_tir.TensorIntrin.register(names[key], *_ldmatrix_intrin(dtype, operand, reduction_major), override=True)
        s_tir.TensorIntrin.register(names["mma"], *_mma_intrin(dtype), override=True)


def tf32_tiles(sch, main, k_inner, warps=(2, 4), fragments=(4, 2), k_tile: int = 32, pad: int = 4,
               split_k: bool = False, keep: str | None = None, pipeline: bool = False, epilogue: bool = False,
               operands: str = "tf32", stage_pad: int = 0) -> None:
    """Tile the normalised GEMM ``main`` (``C[s, i, j] += A[s, i, k] * B[s, j, k]``) for TF32
    tensor cores.

    A block of ``warps[0] x warps[1]`` warps owns a ``(warps[0] * fragments[0] * 16) x
    (warps[1] * fragments[1] * 16)`` output tile, each warp a ``fragments`` grid of 16 x 16
    tiles (``8 * prod(fragments)`` accumulators a thread). The operands go through shared memory
    ``k_tile`` reduction steps at a time; ``k_inner`` says per operand whether its reduction axis
    is contiguous in global memory: then shared memory keeps it as rows of the reduction (padded
    by ``pad`` floats: the fragment loads' 32 lanes hit 32 banks), else reduction-major (padded by
    ``2 * pad``), so that the copies read and write along the contiguous axis. The accumulators
    go through shared memory too, so that the fused epilogue (``main``'s consumer chain, inlined)
    writes the output with whole warps along its rows. With ``split_k`` (``main`` is the partial
    GEMM of :func:`tvmrnn.schedules.cuda._split_reduction`) the partial results are written
    out as they are and ``keep`` (the block that adds up the slices) is left alone.

    Everything sits in dynamic shared memory (``shared.dyn``): the 128 x 128 tile takes 101 KB,
    more than a block's 48 KB of static shared memory. With ``pipeline`` the operand tiles are
    double-buffered (TIR's software pipeline): the next tile's copies are issued before this
    tile's multiply-adds.

    ``operands`` (:data:`OPERANDS`): "tf32", or a half type: then the copies round the operands to
    it as they write the shared tiles (``unsafe_set_dtype``: half the bytes an operand tile, and
    exact where the values are half already, as a half build's inputs and weights are; a later
    layer's inputs, fp32 in the passes, are rounded), fragments cover 16 reduction steps and
    are loaded by ``ldmatrix``, and the products run as ``mma.m16n8k16`` (twice TF32's rate);
    rows of the shared tiles are padded to an odd multiple of 16 bytes (``pad`` is TF32's).

    ``stage_pad``: floats added to the rows of the accumulators' staging tile (0: none, its rows
    as long as the block tile's, so that a warp's fragment stores meet eight rows in one bank; 4:
    two-way at most; a tuning knob, unmeasured on a GPU: notes v51)."""
    register()
    names = _names(operands)
    half = operands != "tf32"
    _, k_step, _, _, *maps = _fragments(operands)
    (wi, wj), (fi, fj) = warps, fragments
    bm, bn = wi * fi * M, wj * fj * N
    warps_total = wi * wj
    sch.pad_einsum(main, [1, bm, bn, k_tile])
    s, i, j, k = sch.get_loops(main)
    i, i_tc = sch.split(i, [None, M])
    j, j_tc = sch.split(j, [None, N])
    k, k_tc = sch.split(k, [None, k_step])
    sch.reorder(i, j, k, i_tc, j_tc, k_tc)
    outer = sch.blockize(i_tc)
    bi, ty_i, f_i = sch.split(i, [None, wi, fi])
    bj, ty_j, f_j = sch.split(j, [None, wj, fj])
    ko, ki = sch.split(k, [None, k_tile // k_step])
    sch.reorder(s, bi, bj, ty_i, ty_j, ko, ki, f_i, f_j)
    sch.bind(s, "blockIdx.z")
    sch.bind(bi, "blockIdx.y")
    sch.bind(bj, "blockIdx.x")
    ty = sch.fuse(ty_i, ty_j)
    sch.bind(ty, "threadIdx.y")

    def by_threads(loops):
        _, y, x = sch.split(sch.fuse(*loops), [None, warps_total, WARP])
        sch.bind(y, "threadIdx.y")
        sch.bind(x, "threadIdx.x")

    def to_shared(index, contiguous_k):
        copy = sch.cache_read(outer, index, SHARED)
        if half:
            sch.unsafe_set_dtype(copy, 0, operands)
        sch.compute_at(copy, ko, preserve_unit_loops=True)
        m, kk = sch.get_loops(copy)[-2:]
        if not contiguous_k:
            sch.reorder(kk, m)
            sch.transform_layout(copy, ("write", 0), lambda b, m, kk: (b, kk, m))
        by_threads(sch.get_loops(copy)[-2:])
        if half:  # rows of odd multiples of 16 bytes (``ldmatrix``): 8 of them reach all 32 banks
            sch.storage_align(copy, 0, axis=1, factor=16, offset=8)
        else:
            sch.storage_align(copy, 0, axis=1, factor=32, offset=pad if contiguous_k else 2 * pad)
        return copy

    copies = [to_shared(0, k_inner[0]), to_shared(1, k_inner[1])]
    from tvm.s_tir import dlight
    for copy in copies:
        dlight.gpu.matmul.auto_inline_producers(sch, copy)

    def to_warp(index, fragment_map, contiguous_k, intrin):
        frag = sch.cache_read(outer, index, "warp")  # laid out as its shared tile, then as fragments
        sch.compute_at(frag, ki, preserve_unit_loops=True)
        r, kk = sch.get_loops(frag)[-2:]
        if contiguous_k:
            sch.transform_layout(frag, ("write", 0),
                                 lambda b, r, kk: (b, r // 16, kk // k_step, *fragment_map(r % 16, kk % k_step)))
        else:
            r, kk = kk, r
            sch.reorder(r, kk)
            sch.transform_layout(frag, ("write", 0),
                                 lambda b, kk, r: (b, r // 16, kk // k_step, *fragment_map(r % 16, kk % k_step)))
        ro, ri = sch.split(r, [None, 16])
        sch.tensorize(ri, intrin)
        nvcc_unroll(sch, ro)

    to_warp(0, maps[0], k_inner[0], names["a" if k_inner[0] else "a_t"])
    to_warp(1, maps[1], k_inner[1], names["b" if k_inner[1] else "b_t"])

    staged = sch.cache_write(outer, 0, SHARED)
    acc = sch.cache_write(outer, 0, "warp")
    sch.reverse_compute_at(acc, ty, preserve_unit_loops=True)
    sch.reverse_compute_at(staged, bj, preserve_unit_loops=True)
    r, c = sch.get_loops(acc)[-2:]
    ro, ri = sch.split(r, [None, M])
    co, ci = sch.split(c, [None, N])
    sch.reorder(ro, co, ri, ci)
    sch.transform_layout(acc, ("read", 0), lambda b, r, c: (b, r // M, c // N, *c_map(r % M, c % N)))
    if split_k or epilogue:  # the partials, or the step's GEMM, go straight out (the copies out of
        # the padded, reindexed layout inlined)
        params = sch.mod["main"].params
        while True:
            rest = [b for b in sch.get_consumers(staged)
                    if (not _writes_param(sch, b, params) if epilogue else sch.get(b).name_hint != keep)]
            if not rest:
                break
            sch.reverse_compute_inline(rest[0])
    else:
        dlight.gpu.matmul.auto_inline_consumer_chain(sch, staged)
    by_threads(sch.get_loops(staged)[-2:])
    init = _innermost(sch, sch.decompose_reduction(outer, ko))
    sch.tensorize(sch.get_loops(init)[-2], FILL)
    sch.tensorize(ri, STORE)
    if stage_pad:  # (on the tensorized block that writes the tile: tensorize drops an earlier one's)
        sch.storage_align(sch.get_child_blocks(co)[0], 0, axis=1, factor=32, offset=stage_pad)
    sch.tensorize(sch.get_loops(_innermost(sch, outer))[-3], names["mma"])
    for loop in (ki, f_i, f_j, ro, co):
        nvcc_unroll(sch, loop)
    if pipeline:  # under ko: the two copies, then the loop over the tile's fragments
        sch.annotate(ko, "software_pipeline_stage", [0, 0, 1])
        sch.annotate(ko, "software_pipeline_order", [0, 1, 2])


def _innermost(sch, block):
    while sch.get_child_blocks(block):
        block = sch.get_child_blocks(block)[0]
    return block
