"""bf16 dot products on x86 CPUs, with AVX512-BF16 (``vdpbf16ps``) and AMX (``tdpbf16ps``):
building blocks of the half-precision issue. ``build`` uses them for the CPU forwards' GEMMs of a
build with ``BuildOptions.bf16_projections``: the input projections and the recurrent steps, on
weights packed rounded (:func:`cpu_gemm_bf16` and :func:`cpu_step_bf16`, the word-pair intrinsic
:data:`DOT_PAIR_WORDS_PACKED`; on CPUs with AMX, :func:`cpu_gemm_amx` and :func:`cpu_step_amx`).

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

:func:`amx_gemm_ir` is the same route to AMX: a GEMM microkernel as LLVM IR, B packed as above,
with LLVM's tile intrinsics (their tile operands are immediates, so no typed vectors cross TVM's
legalization), tensorized through an intrinsic made per shape (:func:`amx_intrinsic`). Linux lets
a process use AMX's tile data only after it asks (:func:`request_amx`).
"""
from __future__ import annotations

import json
import re

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


AMX_FEATURE = "amx-bf16"

# Tile registers: C's column tiles, one A tile, at least one B tile (the rest cycle through B)
AMX_MAX_COLUMN_TILES = 6

# Rows of more than one tile go through the microkernel two 16-row tiles at a time, the column
# tiles two at a time (C's four tiles, two A tiles, two B tiles): each B tile (a weight tile, from
# L2 or beyond) then feeds two products instead of one. A tile product takes 16 cycles and a B
# tile's load from L2 about as long again, so one B load a product held the tile unit to about
# half its rate (v49's "a quarter"). On this project's 2-core Sapphire Rapids-class VM, one core
# (notes/performance.md v52, ``amx_step.c``): a step's GEMM of 20 rows 1.35-1.45x faster (H = 512,
# 800), of 32 rows 1.3x, a projection's 160 rows 2-3x; a single tile of 16 rows slower (two A loads
# a product pair for one row tile's work), so a last tile of 16 rows or fewer stays single.
AMX_ROW_PAIRS = True


def _row_pairs(col_tiles: int, row_pairs: bool | None) -> bool:
    """Whether the microkernel of ``col_tiles`` column tiles takes rows in pairs: asked for (None:
    :data:`AMX_ROW_PAIRS`) and an even number of column tiles. With an odd number the last column
    tile would go alone, two A loads for two products: the GRU's 3 tiles ran 0.74-0.95x as fast
    as single row tiles (notes/performance.md v52)."""
    return (AMX_ROW_PAIRS if row_pairs is None else row_pairs) and col_tiles % 2 == 0


def amx_kernel_name(col_tiles: int, row_pairs: bool | None = None) -> str:
    """The name of :func:`amx_gemm_ir`'s function."""
    return f"tvmrnn_amx_bf16_n{col_tiles}" + ("_pairs" if _row_pairs(col_tiles, row_pairs) else "")


def amx_gemm_ir(col_tiles: int, row_pairs: bool | None = None) -> str:
    """LLVM IR of ``tvmrnn_amx_bf16_n{col_tiles}(c, ldc, a, lda, b, ldb, m, k2)``: the AMX GEMM
    microkernel. ``C[m, 16 col_tiles] += A[m, 2 k2] . B``, strides in bytes: C fp32, rows ``ldc``
    apart; A bf16, rows ``lda`` apart (k-pairs one to a 32-bit word, :func:`tvmrnn.kernels.bf16_pair`:
    a row of words is a row of bf16); B ``k2`` rows of ``16 col_tiles`` k-pair words (AMX's B
    layout, VNNI's), rows ``ldb`` apart. Any ``m`` (16-row tiles, the last shorter) and ``k2``
    (chunks of 16 pairs, the last shorter: its own tile configuration). A single row tile: C's
    ``col_tiles`` tiles stay loaded over the whole reduction; one A tile; the rest take B tiles
    in turn. With ``row_pairs`` (None: :data:`AMX_ROW_PAIRS`) and an even ``col_tiles`` (the
    function is then named ``..._n{col_tiles}_pairs``), rows of more than one tile go two tiles at
    a time, the column tiles two at a time over the reduction (C tiles 0-3, A tiles 4-5, B tiles 6-7). Tile numbers
    are immediates of LLVM's ``*64`` tile intrinsics (no ``x86_amx`` values cross TVM's legalization)."""
    nt = col_tiles
    pairs_on = _row_pairs(nt, row_pairs)
    if not 1 <= nt <= AMX_MAX_COLUMN_TILES:
        raise ValueError(f"AMX microkernel: 1 to {AMX_MAX_COLUMN_TILES} column tiles, not {nt}")
    a_tile, b_tiles = nt, list(range(nt + 1, 8))
    lines = []
    e = lines.append

    def store_config(tag, tiles):  # tiles: (colsb, rows) per tile register, as IR operands
        e("  call void @llvm.memset.p0.i64(ptr align 64 %cfg, i8 0, i64 64, i1 false)")
        e("  store i8 1, ptr %cfg")  # palette 1
        for t, (colsb, rows) in enumerate(tiles):
            e(f"  %{tag}c{t} = getelementptr inbounds i8, ptr %cfg, i64 {16 + 2 * t}")
            e(f"  store {colsb}, ptr %{tag}c{t}")
            e(f"  %{tag}r{t} = getelementptr inbounds i8, ptr %cfg, i64 {48 + t}")
            e(f"  store {rows}, ptr %{tag}r{t}")
        e("  call void @llvm.x86.ldtilecfg(ptr %cfg)")

    def config(tag, a_colsb, b_rows):
        store_config(tag, [("i16 64", "i8 %h8") if t < nt else (f"i16 {a_colsb}", "i8 %h8") if t == a_tile
                           else ("i16 64", f"i8 {b_rows}") for t in range(8)])

    def c_tiles(op, tag):
        for j in range(nt):
            e(f"  %{tag}{j} = getelementptr inbounds i8, ptr %cr, i64 {64 * j}")
            e(f"  call void @llvm.x86.{op}(i8 {j}, ptr %{tag}{j}, i64 %ldc)")

    def products(tag, a_off, b_row):
        e(f"  %{tag}ap = getelementptr inbounds i8, ptr %ar, i64 {a_off}")
        e(f"  call void @llvm.x86.tileloadd64(i8 {a_tile}, ptr %{tag}ap, i64 %lda)")
        e(f"  %{tag}boff = mul i64 {b_row}, %ldb")
        e(f"  %{tag}bk = getelementptr inbounds i8, ptr %b, i64 %{tag}boff")
        for j in range(nt):
            bt = b_tiles[j % len(b_tiles)]
            e(f"  %{tag}bp{j} = getelementptr inbounds i8, ptr %{tag}bk, i64 {64 * j}")
            e(f"  call void @llvm.x86.tileloadd64(i8 {bt}, ptr %{tag}bp{j}, i64 %ldb)")
            e(f"  call void @llvm.x86.tdpbf16ps(i8 {j}, i8 {a_tile}, i8 {bt})")

    # the pair path: C tile 2 * row + column of the chunk, A tiles 4 + row, B tiles 6 + column
    chunks = [tuple(range(j, min(j + 2, nt))) for j in range(0, nt, 2)]

    def pair_config(tag, a_colsb, b_rows):
        store_config(tag, [("i16 64", "i8 16"), ("i16 64", "i8 16"), ("i16 64", "i8 %h1_8"), ("i16 64", "i8 %h1_8"),
                           (f"i16 {a_colsb}", "i8 16"), (f"i16 {a_colsb}", "i8 %h1_8"),
                           ("i16 64", f"i8 {b_rows}"), ("i16 64", f"i8 {b_rows}")])

    def pair_c(op, tag, chunk):
        for row, base in enumerate(("%pcr", "%pcr1")):
            for col, j in enumerate(chunk):
                e(f"  %{tag}{row}{col} = getelementptr inbounds i8, ptr {base}, i64 {64 * j}")
                e(f"  call void @llvm.x86.{op}(i8 {2 * row + col}, ptr %{tag}{row}{col}, i64 %ldc)")

    def pair_products(tag, k, chunk):
        e(f"  %{tag}aoff = mul i64 {k}, 64")
        for row, base in enumerate(("%par", "%par1")):
            e(f"  %{tag}ap{row} = getelementptr inbounds i8, ptr {base}, i64 %{tag}aoff")
            e(f"  call void @llvm.x86.tileloadd64(i8 {4 + row}, ptr %{tag}ap{row}, i64 %lda)")
        e(f"  %{tag}brow = mul i64 {k}, 16")
        e(f"  %{tag}boff = mul i64 %{tag}brow, %ldb")
        e(f"  %{tag}bk = getelementptr inbounds i8, ptr %b, i64 %{tag}boff")
        for col, j in enumerate(chunk):
            e(f"  %{tag}bp{col} = getelementptr inbounds i8, ptr %{tag}bk, i64 {64 * j}")
            e(f"  call void @llvm.x86.tileloadd64(i8 {6 + col}, ptr %{tag}bp{col}, i64 %ldb)")
        for row in range(2):
            for col in range(len(chunk)):
                e(f"  call void @llvm.x86.tdpbf16ps(i8 {2 * row + col}, i8 {4 + row}, i8 {6 + col})")

    name = amx_kernel_name(nt, pairs_on)
    e(f"define linkonce_odr void @{name}(ptr %c, i64 %ldc, ptr %a, i64 %lda, ptr %b, i64 %ldb, "
      "i64 %m, i64 %k2) #0 {")
    e("entry:")
    e("  %cfg = alloca [64 x i8], align 64")
    e("  %full = udiv i64 %k2, 16")
    e("  %tail = urem i64 %k2, 16")
    e("  %tailb = mul i64 %tail, 4")
    e("  %tailb16 = trunc i64 %tailb to i16")
    e("  %tail8 = trunc i64 %tail to i8")
    e("  %anyfull = icmp sgt i64 %full, 0")
    e("  %anytail = icmp sgt i64 %tail, 0")
    e("  %any = icmp sgt i64 %m, 0")
    e("  br i1 %any, label %rows, label %end")
    e("rows:")
    e("  %r = phi i64 [ 0, %entry ], [ %r1, %store ]" + (", [ %rp1, %pnext ]" if pairs_on else ""))
    e("  %left = sub i64 %m, %r")
    if pairs_on:
        e("  %pairq = icmp sgt i64 %left, 16")
        e("  br i1 %pairq, label %prows, label %srows")
        e("srows:")
    e("  %short = icmp slt i64 %left, 16")
    e("  %h = select i1 %short, i64 %left, i64 16")
    e("  %h8 = trunc i64 %h to i8")
    e("  %croff = mul i64 %r, %ldc")
    e("  %cr = getelementptr inbounds i8, ptr %c, i64 %croff")
    e("  %aroff = mul i64 %r, %lda")
    e("  %ar = getelementptr inbounds i8, ptr %a, i64 %aroff")
    config("f", "64", "16")
    c_tiles("tileloadd64", "lc")
    e("  br i1 %anyfull, label %kloop, label %kdone")
    e("kloop:")
    e("  %k = phi i64 [ 0, %" + ("srows" if pairs_on else "rows") + " ], [ %k1, %kloop ]")
    e("  %kaoff = mul i64 %k, 64")
    e("  %kbrow = mul i64 %k, 16")
    products("s", "%kaoff", "%kbrow")
    e("  %k1 = add i64 %k, 1")
    e("  %more = icmp slt i64 %k1, %full")
    e("  br i1 %more, label %kloop, label %kdone")
    e("kdone:")
    e("  br i1 %anytail, label %ktail, label %store")
    e("ktail:")  # the last, shorter chunk: C out, the tiles reconfigured, C back in
    c_tiles("tilestored64", "tsc")
    config("t", "%tailb16", "%tail8")
    c_tiles("tileloadd64", "tlc")
    e("  %taoff = mul i64 %full, 64")
    e("  %tbrow = mul i64 %full, 16")
    products("t", "%taoff", "%tbrow")
    e("  br label %store")
    e("store:")
    c_tiles("tilestored64", "sc")
    e("  %r1 = add i64 %r, 16")
    e("  %morerows = icmp slt i64 %r1, %m")
    e("  br i1 %morerows, label %rows, label %end")
    if pairs_on:  # two row tiles (the second of h1 rows), the column tiles two at a time
        e("prows:")
        e("  %left1 = sub i64 %left, 16")
        e("  %short1 = icmp slt i64 %left1, 16")
        e("  %h1 = select i1 %short1, i64 %left1, i64 16")
        e("  %h1_8 = trunc i64 %h1 to i8")
        e("  %pcroff = mul i64 %r, %ldc")
        e("  %pcr = getelementptr inbounds i8, ptr %c, i64 %pcroff")
        e("  %pcroff1 = mul i64 16, %ldc")
        e("  %pcr1 = getelementptr inbounds i8, ptr %pcr, i64 %pcroff1")
        e("  %paroff = mul i64 %r, %lda")
        e("  %par = getelementptr inbounds i8, ptr %a, i64 %paroff")
        e("  %paroff1 = mul i64 16, %lda")
        e("  %par1 = getelementptr inbounds i8, ptr %par, i64 %paroff1")
        pair_config("pf", "64", "16")
        for q, chunk in enumerate(chunks):  # each chunk over the full k-chunks, in the block before
            prev = "prows" if q == 0 else f"pdone{q - 1}"
            pair_c("tileloadd64", f"pl{q}_", chunk)
            e(f"  br i1 %anyfull, label %ploop{q}, label %pdone{q}")
            e(f"ploop{q}:")
            e(f"  %pk{q} = phi i64 [ 0, %{prev} ], [ %pk{q}n, %ploop{q} ]")
            pair_products(f"ps{q}_", f"%pk{q}", chunk)
            e(f"  %pk{q}n = add i64 %pk{q}, 1")
            e(f"  %pmore{q} = icmp slt i64 %pk{q}n, %full")
            e(f"  br i1 %pmore{q}, label %ploop{q}, label %pdone{q}")
            e(f"pdone{q}:")
            pair_c("tilestored64", f"psc{q}_", chunk)
        e("  br i1 %anytail, label %ptail, label %pnext")
        e("ptail:")  # the last, shorter chunk of the reduction, for every column chunk
        pair_config("pt", "%tailb16", "%tail8")
        for q, chunk in enumerate(chunks):
            pair_c("tileloadd64", f"ptl{q}_", chunk)
            pair_products(f"pts{q}_", "%full", chunk)
            pair_c("tilestored64", f"pts{q}_c", chunk)
        e("  br label %pnext")
        e("pnext:")
        e("  %rp1 = add i64 %r, 32")
        e("  %pmorerows = icmp slt i64 %rp1, %m")
        e("  br i1 %pmorerows, label %rows, label %end")
    e("end:")
    e("  call void @llvm.x86.tilerelease()")
    e("  ret void")
    e("}")
    for decl in ("void @llvm.memset.p0.i64(ptr, i8, i64, i1)", "void @llvm.x86.ldtilecfg(ptr)",
                 "void @llvm.x86.tileloadd64(i8, ptr, i64)", "void @llvm.x86.tdpbf16ps(i8, i8, i8)",
                 "void @llvm.x86.tilestored64(i8, ptr, i64)", "void @llvm.x86.tilerelease()"):
        e(f"declare {decl}")
    e('attributes #0 = { "target-features"="+amx-tile,+amx-bf16" }')
    return "\n".join(lines) + "\n"


def supports_amx(target) -> bool:
    """Whether an LLVM CPU target has AMX with bf16."""
    return target.kind.name == "llvm" and bool(tvm.target.codegen.target_has_features(AMX_FEATURE, target))


def request_amx() -> bool:
    """Ask Linux for this process's use of AMX tile data (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``; without it the first tile instruction kills the process). True if granted."""
    import ctypes
    import platform
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18
    return libc.syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0


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


def _dot_16x2_intrinsic():
    """``C[16] += dot2(A[2], B[16, 2])`` in bf16 pairs: its description and implementation
    (parsed when first registered, :func:`register_from_trace`)."""
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
            with T.attr(0, "pragma_import_llvm", _LLVM_IR):
                pair = T.reinterpret(A.vload([0], "uint16x2"), dtype="int32")
                a = T.reinterpret(T.broadcast(pair, 16), dtype="int16x32")
                b = T.reinterpret(B.vload([0, 0], dtype="uint16x32"), dtype="int16x32")
                C[T.ramp(T.int32(0), 1, 16)] = T.call_extern("float32x16", "tvmrnn_dpbf16",
                                                             C.vload([0], dtype="float32x16"), a, b)
    return desc, impl


def register() -> str:
    """Register :data:`DOT_16X2` with TVM (once) and return its name, for ``sch.tensorize``."""
    return _register(DOT_16X2, _dot_16x2_intrinsic)


DOT_PAIR_WORDS_PACKED = "tvmrnn_dot_pair_words_packed_bf16"


def _pair_words_intrinsic(state: bool = False):
    """``C[16] += dot2(A, B[16])`` (:func:`tvmrnn.kernels.dot2`) for k-pairs packed one to a
    32-bit word, A's broadcast: its description and implementation, B the packed weights
    themselves (a kernel parameter holding the words as float32). A: a task's rounded inputs
    (uint32, local), or with ``state`` a step's rounded state (:func:`tvmrnn.kernels.bf16_state`'s
    words held as float32, in memory)."""
    a_dtype, a_scope = ("float32", "global") if state else ("uint32", "local")

    @T.prim_func(s_tir=True)
    def desc(A: T.Buffer((1,), a_dtype, offset_factor=1, scope=a_scope, align=4),
             B: T.Buffer((16,), "float32", offset_factor=1, align=4),
             C: T.Buffer((16,), "float32", offset_factor=1, align=4)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:1], B[0:16])
            T.writes(C[0:16])
            for i in T.serial(16):
                with T.sblock("update"):
                    vi = T.axis.spatial(16, i)
                    C[vi] = C[vi] + (T.reinterpret("float32", T.shift_left(T.reinterpret("uint32", A[0]), T.uint32(16)))
                                     * T.reinterpret("float32", T.shift_left(T.reinterpret("uint32", B[vi]),
                                                                             T.uint32(16)))
                                     + T.reinterpret("float32", T.bitwise_and(T.reinterpret("uint32", A[0]),
                                                                              T.uint32(0xFFFF0000)))
                                     * T.reinterpret("float32", T.bitwise_and(T.reinterpret("uint32", B[vi]),
                                                                              T.uint32(0xFFFF0000))))

    @T.prim_func(s_tir=True)
    def impl(A: T.Buffer((1,), a_dtype, offset_factor=1, scope=a_scope, align=4),
             B: T.Buffer((16,), "float32", offset_factor=1, align=4),
             C: T.Buffer((16,), "float32", offset_factor=1, align=4)) -> None:
        with T.sblock("root"):
            T.reads(C[0:16], A[0:1], B[0:16])
            T.writes(C[0:16])
            with T.attr(0, "pragma_import_llvm", _LLVM_IR):
                a = T.reinterpret(T.broadcast(T.reinterpret("uint32", A[0]), 16), dtype="int16x32")
                b = T.reinterpret(B.vload([0], dtype="float32x16"), dtype="int16x32")
                C[T.ramp(T.int32(0), 1, 16)] = T.call_extern("float32x16", "tvmrnn_dpbf16",
                                                             C.vload([0], dtype="float32x16"), a, b)
    return desc, impl


def _register(name: str, make) -> str:
    """Register the tensor intrinsic ``name`` (``make()``: its description and implementation)
    with TVM once, and return the name, for ``sch.tensorize``."""
    from tvm.s_tir import TensorIntrin

    from .common import tvmscript_frames_without_source
    try:
        TensorIntrin.get(name)
    except Exception:  # noqa: BLE001 - not registered yet
        with tvmscript_frames_without_source():
            TensorIntrin.register(name, *make())
    return name


def register_pair_words_packed(state: bool = False) -> str:
    """:data:`DOT_PAIR_WORDS_PACKED`: B the packed weights themselves (a kernel parameter holding
    the words as float32, :func:`tvmrnn.kernels.bf16_weight_pairs`); with ``state``, A a step's
    rounded state (:data:`STATE_SUFFIX`)."""
    return _register(DOT_PAIR_WORDS_PACKED + (STATE_SUFFIX if state else ""), lambda: _pair_words_intrinsic(state))


# an intrinsic whose A is a step's rounded state: words held as float32, in memory
# (:func:`tvmrnn.kernels.bf16_state`), not a task's own rounded inputs (uint32, on its stack)
STATE_SUFFIX = "_state"


# A bf16 projection's rounded inputs (``xb``) sit on the calling thread's stack
# (:func:`tvmrnn.program.sequence.cpu_locals_on_stack`) where they take at most this, shared by
# its tasks; beyond it each task rounds its own row tile (:func:`cpu_gemm_amx`).
STACK_ROUNDED_BYTES = 1 << 20


def is_state_rounding(sch) -> bool:
    """Whether the kernel held by ``sch`` is a bf16 step's state rounding
    (:func:`tvmrnn.kernels.bf16_state`: its one block ``hb``)."""
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))] == ["hb"]


def cpu_round_state(sch, kernel, target, tasks_per_core: int = 1) -> None:
    """:func:`tvmrnn.kernels.bf16_state`'s schedule: one parallel loop over the state's rows (both
    directions' where they run together), ``tasks_per_core`` tasks a core where there are rows
    enough, each row's words in whole vectors (the widest that divides them). One parallel loop
    and nothing else, so that it joins its time loop's parallel region with the step after it (a
    barrier between them). Left to LLVM inside the step, a DS2 LSTM step took 84 us on the Xeon's
    16 cores, vectorised 74 (v44)."""
    from .common import _extent, vector_lanes
    block = sch.get_sblock("hb")
    *rows, words = sch.get_loops(block)
    rows = sch.fuse(*rows) if len(rows) > 1 else rows[0]
    cores = max(1, int(target.attrs.get("num-cores", 0) or 0))
    tasks = min(_extent(sch, rows), cores * tasks_per_core)
    outer, rows = sch.split(rows, [tasks, None])
    sch.parallel(outer)
    lanes = vector_lanes(target)
    width = next(w for w in (lanes, lanes // 2, lanes // 4, 1) if _extent(sch, words) % w == 0)
    if width > 1:
        sch.vectorize(sch.split(words, [None, width])[1])


def is_bf16_step(sch) -> bool:
    """Whether the kernel held by ``sch`` is a bf16 recurrent step (its rounded state ``hb``, an
    input: :func:`tvmrnn.kernels.recurrent_step`)."""
    func = sch.mod["main"]
    return any(p.name == "hb" for p in func.params) and not is_state_rounding(sch)


def cpu_step_bf16(sch, kernel, target, accumulators: int = 24) -> None:
    """The bf16 recurrent step's schedule (:func:`tvmrnn.kernels.recurrent_step` with ``bf16``):
    (its state rounded, pairs in words: ``hb``, :func:`cpu_round_state`'s), as the fp32 step
    (:func:`tvmrnn.schedules.cpu.output_tiles`), a task per (panel of units, tile of rows)
    runs the GEMM for its tile, ``rows x G x u / 16`` vectors summed over the k-pairs with one
    ``vdpbf16ps`` each straight from the packed weights (:data:`DOT_PAIR_WORDS_PACKED`), then the
    gate math on the tile."""
    from .common import _divisor, _gemm_axes, _vectorize, vector_lanes
    from .cpu import output_tiles
    lanes = vector_lanes(target)
    if lanes != 16:
        raise ValueError("bf16 projections need 16-lane (AVX-512) vectors")
    gemm = sch.get_sblock(kernel.gemm)
    output = sch.get_consumers(gemm)[0]
    spatial, _ = _gemm_axes(sch, gemm)
    gates, units = (int(sch.get(l).extent) for l in spatial[-2:])
    batch = int(sch.get(sch.get_loops(output)[-2]).extent)
    rows = _divisor(batch, max(1, accumulators // (gates * units // 16)))
    _, lead, j_inner, _ = output_tiles(sch, gemm, output, units, rows)
    spatial, reduction = _gemm_axes(sch, gemm)
    gn, gp, gg, gu = spatial[len(lead):]
    sch.reorder(*reduction, gn, gp, gg, gu)
    u_out, u_in = sch.split(gu, [None, 16])
    sch.decompose_reduction(gemm, reduction[0])
    sch.tensorize(u_in, register_pair_words_packed(state=True))
    for loop in (gn, gg, u_out):
        sch.unroll(loop)
    _vectorize(sch, j_inner, lanes)


def is_bf16_gemm(sch) -> bool:
    """Whether the kernel held by ``sch`` has the rounded-input stage of a bf16 projection
    (:func:`tvmrnn.kernels.input_projection` with ``bf16``)."""
    return "xb" in {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))}


def _row_tile(steps: int, batch: int, tile_rows: int) -> tuple[int, int]:
    """A projection's row tile of about ``tile_rows`` rows: (steps, rows of the batch)."""
    from .common import _divisor
    per_n = _divisor(batch, tile_rows)
    return (_divisor(steps, max(1, tile_rows // per_n)) if per_n < tile_rows else 1), per_n


def _projection_tiles(sch, kernel, target, tile_rows: int, tasks_per_core: int, panel_blocks: int = 0,
                      xb_per_tile: bool = True):
    """The bf16 projection's loops: row tiles of about ``tile_rows`` rows (of the batch, or of
    several steps where the batch is fewer), grouped into about ``tasks_per_core`` tasks a core
    (``panel_blocks`` > 0: that many blocks of panels, each task a (block of panels, block of row
    tiles); 0: a task per panel). Returns (task, tile, panel loop inside the task or None, t_in,
    n_in, g, u, k2, the GEMM block, the bias block) with ``xb`` local, rounded once a tile (or,
    ``xb_per_tile=False``, once a call before the tasks, in parallel over the rows)."""
    mm, gx, xb = sch.get_sblock(kernel.gemm), sch.get_sblock("gx"), sch.get_sblock("xb")
    t, n, p, g, u, k2 = sch.get_loops(mm)
    steps, batch, panels = (int(sch.get(l).extent) for l in (t, n, p))
    per_t, per_n = _row_tile(steps, batch, tile_rows)
    t_out, t_in = sch.split(t, [None, per_t])
    n_out, n_in = sch.split(n, [None, per_n])
    cores = max(1, int(target.attrs.get("num-cores", 0) or 0))
    p_tasks = panel_blocks or panels
    wanted = max(1, -(-tasks_per_core * cores // p_tasks))
    n_tiles, t_tiles = int(sch.get(n_out).extent), int(sch.get(t_out).extent)
    # the most blocks up to ``wanted`` as a divisor of each axis (batch tiles first on a tie); each
    # split on its own axis (a split of the two fused left bindings that tensorize could not blockize)
    n_blocks, t_blocks = max(((nb, tb) for nb in range(1, min(n_tiles, wanted) + 1) if n_tiles % nb == 0
                              for tb in range(1, min(t_tiles, wanted // nb) + 1) if t_tiles % tb == 0),
                             key=lambda q: (q[0] * q[1], q[0]))
    t_block, t_out = sch.split(t_out, [t_blocks, None])
    n_block, n_out = sch.split(n_out, [n_blocks, None])
    if panel_blocks:
        p_block, p_in = sch.split(p, [panel_blocks, None])
        sch.reorder(p_block, t_block, n_block, t_out, n_out, p_in, t_in, n_in, g, u, k2)
        task = sch.fuse(p_block, t_block, n_block)
    else:
        p_in = None
        sch.reorder(p, t_block, n_block, t_out, n_out, k2, t_in, n_in, g, u)
        task = sch.fuse(p, t_block, n_block)
    tile = sch.fuse(t_out, n_out)
    sch.parallel(task)
    if xb_per_tile:
        sch.compute_at(xb, tile)
    else:  # once a call, before the tasks, in parallel over the rows
        sch.parallel(sch.fuse(*sch.get_loops(xb)[:2]))
    sch.set_scope(xb, 0, "local")
    return task, tile, p_in, t_in, n_in, g, u, k2, mm, gx


def cpu_gemm_bf16(sch, kernel, target, accumulators: int = 24, tasks_per_core: int = 2) -> None:
    """The bf16 projection's schedule: a task per (panel, block of row tiles), run in parallel.
    For each register tile of rows (of the batch, or of several steps where the batch is smaller)
    a task rounds the tile's inputs (``xb``) and sums over the k-pairs ``rows x G x u / 16``
    vectors of 16 columns (at most ``accumulators`` registers) with one ``vdpbf16ps`` each,
    straight from the packed weights (:data:`DOT_PAIR_WORDS_PACKED`), then adds the bias. Row
    tiles are grouped into about ``tasks_per_core`` tasks per core over the panels. Both are
    tuning knobs (:mod:`.knobs`). On a 2-core Zen 4, a 16-step chunk at N=160 K=256 H=384 took
    6.2 ms against the fp32 default's 11.1; at N=20 K=H=800, 4.7 against 7.7 (v40, the weights
    then rounded by each task)."""
    from .common import vector_lanes
    if vector_lanes(target) != 16:
        raise ValueError("bf16 projections need 16-lane (AVX-512) vectors")
    t, n, p, g, u, k2 = sch.get_loops(sch.get_sblock(kernel.gemm))
    gates, units = (int(sch.get(l).extent) for l in (g, u))
    if units % 16:
        raise ValueError(f"{kernel.name}: bf16 projections need panels of a multiple of 16 units")
    rows = max(1, accumulators // (gates * units // 16))
    _, tile, _, t_in, n_in, g, u, k2, mm, gx = _projection_tiles(sch, kernel, target, rows, tasks_per_core)
    u_out, u = sch.split(u, [None, 16])
    sch.reorder(k2, t_in, n_in, g, u_out, u)
    sch.reverse_compute_at(gx, tile, preserve_unit_loops=True)
    sch.vectorize(sch.get_loops(gx)[-1])
    init = sch.decompose_reduction(mm, k2)
    sch.vectorize(sch.get_loops(init)[-1])
    sch.tensorize(u, register_pair_words_packed())
    for loop in (t_in, n_in, g, u_out):
        sch.unroll(loop)


# ---- AMX (tdpbf16ps): the GEMMs of bf16 builds on CPUs with AMX-BF16 ---------------------------
# A tensor intrinsic per shape of the tensorized subtree, named by it (:func:`amx_intrinsic`):
# ``tvmrnn_amx_l{lead}_r{rows}_p{unit}_g{G}_u{units}_k{pairs}``. Its description is the bf16
# GEMM's block as the schedules leave it (rows, an optional unit loop of the weight panel, gates,
# units, k-pairs); its implementation one call of the microkernel (:func:`amx_gemm_ir`) for the
# whole reduction. Records name these intrinsics in their traces: :func:`register_from_trace`.
_AMX_NAME = re.compile(r"tvmrnn_amx_l(\d)_r([\dx]+)_p(\d)_g(\d+)_u(\d+)_k(\d+)(_single)?(_state)?")


def amx_intrinsic(lead: int, rows: tuple, unit_loop: bool, gates: int, units: int, pairs: int,
                  row_pairs: bool | None = None, state: bool = False) -> str:
    """Register (once) and return the AMX intrinsic ``C[rows, G, units] += A[rows, pairs] .
    B[pairs, G, units]``: ``rows`` the extents of the tensorized row loops (a batch tile, or
    steps x batch rows: one call where they are evenly spaced, else a call per step), ``lead``
    leading unit axes of every operand (a direction), ``unit_loop`` a loop of extent 1 after the
    rows (the weight panel's, where the GEMM is computed under its task); B the packed weights
    (k-pair words held as float32, :func:`tvmrnn.kernels.bf16_weight_pairs`). ``row_pairs``: the
    microkernel's (None: :data:`AMX_ROW_PAIRS`; the name ends in ``_single`` without them).
    ``state``: A a step's rounded state (:data:`STATE_SUFFIX`), not a task's rounded inputs."""
    row_pairs = AMX_ROW_PAIRS if row_pairs is None else row_pairs
    name = f"tvmrnn_amx_l{lead}_r{'x'.join(map(str, rows))}_p{int(unit_loop)}_g{gates}_u{units}_k{pairs}" \
        + ("" if row_pairs else "_single") + (STATE_SUFFIX if state else "")
    return _register(name, lambda: _amx_functions(lead, tuple(rows), unit_loop, gates, units, pairs, row_pairs,
                                                  state))


def register_from_trace(trace_json) -> None:
    """Register the intrinsics a record's trace names (before it is replayed): the word-pair and
    pair dot products, and the AMX intrinsics (one per shape). Not at import: each TVMScript
    function takes TVM's parser about 0.5 s (``inspect.stack``), which every ``import tvmrnn``
    (and each measuring or RPC process) would pay."""
    text = json.dumps(trace_json) if not isinstance(trace_json, str) else trace_json
    if DOT_PAIR_WORDS_PACKED + STATE_SUFFIX in text:
        register_pair_words_packed(state=True)
    if re.search(DOT_PAIR_WORDS_PACKED + r"\b", text):
        register_pair_words_packed()
    if DOT_16X2 in text:
        register()
    for m in _AMX_NAME.finditer(text):
        lead, rows, unit, gates, units, pairs, single, state = m.groups()
        amx_intrinsic(int(lead), tuple(int(r) for r in rows.split("x")), unit == "1", int(gates), int(units), int(pairs),
                      row_pairs=not single, state=bool(state))


def _amx_functions(lead, rows, unit_loop, gates, units, pairs, row_pairs, state=False):
    """The description and implementation of :func:`amx_intrinsic`, as TVMScript text: the row
    loops of extent 1 have no block axis (as the scheduled block has none), so the text is made
    for each shape."""
    col_tiles = gates * units // 16
    z = ["0"] * lead
    row_vars = [f"vr{i}" for i, r in enumerate(rows) if r > 1]
    row_idx = [f"vr{i}" if r > 1 else "0" for i, r in enumerate(rows)]
    c_shape = (*([1] * lead), *rows, 1, gates, units)
    a_shape = (*([1] * lead), *rows, pairs)
    b_shape = (*([1] * lead), 1, pairs, gates, units)
    vg = "vg" if gates > 1 else "0"  # (a loop of extent 1 has no block axis)
    c_at = ", ".join([*z, *row_idx, "0", vg, "vu"])
    a_at = ", ".join([*z, *row_idx, "vk"])
    b_at = ", ".join([*z, "0", "vk", vg, "vu"])
    full = lambda shape: ", ".join(f"0:{d}" if d > 1 else "0" for d in shape)  # noqa: E731
    loops = [*(f"r{i}" for i in range(len(rows))), *(["p"] if unit_loop else []), "g", "u", "k"]
    extents = [*rows, *([1] if unit_loop else []), gates, units, pairs]
    spatial = [f"r{i}" for i, r in enumerate(rows) if r > 1]
    word = f'T.reinterpret("uint32", B[{b_at}])'
    a_word = f'T.reinterpret("uint32", A[{a_at}])' if state else f"A[{a_at}]"
    a_form = '"float32", offset_factor=1' if state else '"uint32", offset_factor=1, scope="local"'
    body = (f"C[{c_at}] = C[{c_at}] + (T.reinterpret(\"float32\", {a_word} << T.uint32(16)) * "
            f"T.reinterpret(\"float32\", {word} << T.uint32(16)) + T.reinterpret(\"float32\", {a_word} & "
            f"T.uint32(4294901760)) * T.reinterpret(\"float32\", {word} & T.uint32(4294901760)))")
    regions = f"C[{full(c_shape)}], A[{full(a_shape)}], B[{full(b_shape)}]"
    n_rows = len(rows)
    c_strides = [f"sc{i}" for i in range(lead + n_rows + 1)] + [str(units), "1"]
    a_strides = [f"sa{i}" for i in range(lead + n_rows)] + ["1"]
    b_strides = [f"sb{i}" for i in range(lead + 2)] + [str(units), "1"]
    # the rows' strides: the microkernel takes rows evenly spaced; rows over several steps are where
    # the batch's last row and the next step's first are as far apart as two rows of a step (else a
    # call per step); a row axis of extent 1 has no say
    long_rows = [i for i, r in enumerate(rows) if r > 1] or [n_rows - 1]
    row_c, row_a = f"sc{lead + long_rows[-1]}", f"sa{lead + long_rows[-1]}"
    b_row = f"sb{lead + 1}"
    m = 1
    for r in rows:
        m *= r
    declare = "\n".join(f"    {v} = T.int32()" for v in (*c_strides, *a_strides, *b_strides) if v[0] == "s")

    def call(c_off, a_off, rows_, indent):
        return (f"{indent}T.evaluate(T.call_extern(\"void\", \"{amx_kernel_name(col_tiles, row_pairs)}\", "
                f"C.access_ptr(\"rw\", offset={c_off}), T.int64({row_c}) * 4, A.access_ptr(\"r\", offset={a_off}), "
                f"T.int64({row_a}) * 4, B.access_ptr(\"r\"), T.int64({b_row}) * 4, T.int64({rows_}), T.int64({pairs})))")
    if len(long_rows) == 1:
        calls = call(0, 0, m, " " * 12)
    else:  # (steps, batch) rows
        outer, inner = long_rows
        steps_, per_step = rows[outer], rows[inner]
        sc_o, sa_o = f"sc{lead + outer}", f"sa{lead + outer}"
        calls = "\n".join([
            f"            if {sc_o} == {per_step} * {row_c} and {sa_o} == {per_step} * {row_a}:",
            call(0, 0, m, " " * 16),
            "            else:",
            f"                for s in range({steps_}):",
            call(f"s * {sc_o}", f"s * {sa_o}", per_step, " " * 20)])
    g_var, g_loop = (["vg"], ["g"]) if gates > 1 else ([], [])
    remap = (f'{", ".join([*row_vars, *g_var, "vu", "vk"])} = T.axis.remap("{"S" * (len(row_vars) + len(g_var))}SR", '
             f'[{", ".join([*spatial, *g_loop, "u", "k"])}])')
    src_desc = f"""
@T.prim_func(s_tir=True)
def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
    A = T.match_buffer(a, {a_shape}, {a_form}, align=4)
    B = T.match_buffer(b, {b_shape}, "float32", offset_factor=1, align=4)
    C = T.match_buffer(c, {c_shape}, "float32", offset_factor=1, scope="local", align=4)
    with T.sblock("root"):
        T.reads({regions})
        T.writes(C[{full(c_shape)}])
        for {", ".join(loops)} in T.grid({", ".join(map(str, extents))}):
            with T.sblock("update"):
                {remap}
                {body}
"""
    src_impl = f"""
@T.prim_func(s_tir=True)
def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
{declare}
    A = T.match_buffer(a, {a_shape}, {a_form}, align=4, strides=[{", ".join(a_strides)}])
    B = T.match_buffer(b, {b_shape}, "float32", offset_factor=1, align=4, strides=[{", ".join(b_strides)}])
    C = T.match_buffer(c, {c_shape}, "float32", offset_factor=1, scope="local", align=4, strides=[{", ".join(c_strides)}])
    with T.sblock("root"):
        T.reads({regions})
        T.writes(C[{full(c_shape)}])
        with T.attr(0, "pragma_import_llvm", IR):
{calls}
"""
    from tvm.script import from_source
    desc = from_source(src_desc)
    impl = from_source(src_impl.replace("IR)", repr(amx_gemm_ir(col_tiles, row_pairs)) + ")"))
    return desc, impl


def amx_applies(target, gates: int, units: int, rows: int) -> bool:
    """Whether the AMX microkernel serves a bf16 GEMM: a target with AMX-BF16, the panel's
    columns in whole tiles that fit the tile registers, and more than one row (a single row
    would use 1/16 of each tile product: AVX512-BF16's dot products do as well)."""
    return supports_amx(target) and units % 16 == 0 and 1 <= gates * units // 16 <= AMX_MAX_COLUMN_TILES \
        and rows > 1


def step_amx_applies(sch, kernel, target) -> bool:
    """Whether :func:`cpu_step_amx` serves the bf16 step held by ``sch`` on ``target``."""
    from .common import _gemm_axes
    gemm = sch.get_sblock(kernel.gemm)
    spatial, _ = _gemm_axes(sch, gemm)
    gates, units = (int(sch.get(l).extent) for l in spatial[-2:])
    batch = int(sch.get(sch.get_loops(sch.get_consumers(gemm)[0])[-2]).extent)
    return amx_applies(target, gates, units, batch)


# rows of a recurrent step's AMX task (a divisor of the batch): 2 tiles of 16; where the batch has
# no divisor of at least AMX_MIN_TILE_ROWS up to that, the whole batch (the microkernel takes any
# rows; a row a task read every weight tile once a row)
AMX_STEP_ROWS = 32
AMX_MIN_TILE_ROWS = 8


def cpu_step_amx(sch, kernel, target, rows: int = AMX_STEP_ROWS) -> None:
    """The bf16 recurrent step on AMX: as :func:`cpu_step_bf16` (a task per
    (panel of units, tile of rows), the gate math on the tile), the task's GEMM one call of the
    AMX microkernel over the whole reduction (:func:`amx_intrinsic`), straight from the packed
    weights (a panel's k-pair words are AMX's B layout)."""
    from .common import _gemm_axes, _vectorize, vector_lanes
    from .cpu import output_tiles
    gemm = sch.get_sblock(kernel.gemm)
    output = sch.get_consumers(gemm)[0]
    spatial, reduction = _gemm_axes(sch, gemm)
    gates, units = (int(sch.get(l).extent) for l in spatial[-2:])
    pairs = int(sch.get(reduction[0]).extent)
    batch = int(sch.get(sch.get_loops(output)[-2]).extent)
    # the divisor of the batch up to ``rows`` that leaves the fewest 16-row AMX tiles (the most rows on
    # a tie): a tile's products cost as much whatever its rows (at 48 rows, 16 a task: 3 tiles; 24: 4)
    tile_rows = min((d for d in range(1, min(batch, rows) + 1) if batch % d == 0),
                    key=lambda d: ((batch // d) * -(-d // 16), -d))
    if tile_rows < AMX_MIN_TILE_ROWS:  # a batch without a fair divisor (a prime): all its rows in one tile
        tile_rows = batch
    _, lead, j_inner, _ = output_tiles(sch, gemm, output, units, tile_rows)
    spatial, reduction = _gemm_axes(sch, gemm)
    gn, gp, gg, gu = spatial[len(lead):]
    sch.reorder(gn, gp, gg, gu, *reduction)
    sch.set_scope(gemm, 0, "local")  # the task's tile, on its stack (global: the whole step's, through memory)
    init = sch.decompose_reduction(gemm, gn)
    _vectorize(sch, sch.fuse(*sch.get_loops(init)[-2:]), vector_lanes(target))
    sch.tensorize(gn, amx_intrinsic(len(lead), (tile_rows,), True, gates, units, pairs, state=True))
    _vectorize(sch, j_inner, vector_lanes(target))


def projection_amx_applies(sch, kernel, target) -> bool:
    """Whether :func:`cpu_gemm_amx` serves the bf16 projection held by ``sch`` on ``target``."""
    t, n, p, g, u, k2 = sch.get_loops(sch.get_sblock(kernel.gemm))
    steps, batch, gates, units = (int(sch.get(l).extent) for l in (t, n, g, u))
    return amx_applies(target, gates, units, steps * batch)


# rows of a projection's AMX call (steps x batch), at most: 10 tiles of 16
AMX_PROJECTION_ROWS = 160


def cpu_gemm_amx(sch, kernel, target, tasks_per_core: int = 2, panel_blocks: int = 0) -> None:
    """The bf16 projection on AMX. The inputs are rounded once a call (``xb``, in parallel over
    the rows; where they would take more than :data:`STACK_ROUNDED_BYTES` of the stack, once a row
    tile by each task, for its block of panels); then a task per (block of panels, block of row
    tiles) runs, per panel and row tile, one call of the AMX microkernel over the whole reduction
    (:func:`amx_intrinsic`: rows of several steps stored one after another, up to
    :data:`AMX_PROJECTION_ROWS`), straight from the packed weights, and adds the bias.
    ``panel_blocks`` (0: the fewest that make ``tasks_per_core`` tasks a core with the row tiles).
    On a 2-core SPR-class VM a DS2 LSTM chunk (16 x 20 rows, K = H = 800) took 1.48 ms in tiles
    of 40 rows, 1.03 in tiles of 160 (v43)."""
    from .common import _vectorize, vector_lanes
    t, n, p, g, u, k2 = sch.get_loops(sch.get_sblock(kernel.gemm))
    steps, batch, panels, gates, units = (int(sch.get(l).extent) for l in (t, n, p, g, u))
    pairs = int(sch.get(k2).extent)
    cores = max(1, int(target.attrs.get("num-cores", 0) or 0))
    shared = steps * batch * pairs * 4 <= STACK_ROUNDED_BYTES
    if not panel_blocks:  # the fewest blocks of panels that make the tasks wanted
        per_t, per_n = _row_tile(steps, batch, AMX_PROJECTION_ROWS)
        row_tiles = (steps // per_t) * (batch // per_n)
        wanted = -(-tasks_per_core * cores // row_tiles)
        panel_blocks = next((d for d in range(wanted, panels + 1) if panels % d == 0), panels)
    from .common import _divisor
    blocks = _divisor(panels, panel_blocks)
    _, tile, p_in, t_in, n_in, g, u, k2, mm, gx = _projection_tiles(sch, kernel, target, AMX_PROJECTION_ROWS,
                                                                     tasks_per_core, blocks, xb_per_tile=not shared)
    tr, nr = int(sch.get(t_in).extent), int(sch.get(n_in).extent)
    sch.reverse_compute_at(gx, p_in, preserve_unit_loops=True)
    sch.set_scope(mm, 0, "local")  # the call's tile, on the task's stack
    _vectorize(sch, sch.get_loops(gx)[-1], vector_lanes(target))
    init = sch.decompose_reduction(mm, t_in)
    _vectorize(sch, sch.get_loops(init)[-1], vector_lanes(target))
    sch.tensorize(t_in, amx_intrinsic(0, (tr, nr), False, gates, units, pairs))
