"""bf16 dot products on CPUs (tvmrnn.schedules.bf16), building blocks of half precision: a GEMM
tensorized with the AVX512-BF16 intrinsic against NumPy in float64 where this CPU has the
instruction, a target without it refused by name; the AMX tile microkernel compiled for the Xeon,
and run against float64 where the CPU has AMX-BF16."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import tvm
from tvm import te

import tvmrnn
from conftest import check_half_build, cpu_has as _cpu_has
from tvmrnn.schedules import bf16


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


def _amx_gemm(M, col_tiles, K, row_pairs=None):
    """C (M, 16 col_tiles) = A (M, K) . B (K/2, N, 2): one call of the AMX microkernel (any M and
    even K: a short last row tile and k-chunk), for the Xeon's target."""
    from tvm.script import tirx as T
    N, K2 = 16 * col_tiles, K // 2

    @T.prim_func(s_tir=True)
    def gemm(A: T.Buffer((M, K), "uint16"), B: T.Buffer((K2, N, 2), "uint16"), C: T.Buffer((M, N), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        with T.attr(0, "pragma_import_llvm", bf16.amx_gemm_ir(col_tiles, row_pairs)):
            for i, j in T.grid(M, N):
                C[i, j] = T.float32(0)
            T.evaluate(T.call_extern("void", bf16.amx_kernel_name(col_tiles, row_pairs), T.address_of(C[0, 0]), T.int64(N * 4),
                                     T.address_of(A[0, 0]), T.int64(K * 2), T.address_of(B[0, 0, 0]), T.int64(N * 4),
                                     T.int64(M), T.int64(K2)))

    return tvm.compile(tvm.IRModule({"main": gemm}), target=tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))


def _amx_runs() -> bool:
    return _cpu_has("amx_bf16") and bf16.request_amx()


@pytest.mark.parametrize("row_pairs", [True, False], ids=["pairs", "single"])
@pytest.mark.parametrize("M,col_tiles,K", [(32, 3, 96), (37, 4, 830), (1, 1, 2), (16, 6, 64), (20, 2, 30),
                                           (81, 6, 34), (17, 4, 64)])
def test_amx_microkernel_compiles_for_the_xeon_and_matches_float64_where_it_runs(M, col_tiles, K, row_pairs, rng):
    """The AMX microkernel compiles to tile instructions for Sapphire Rapids anywhere; on a CPU with
    AMX-BF16 it runs and matches float64: rows past a whole tile, a last k-chunk of 15 pairs, one
    row and one pair, six column tiles; with row pairs (``AMX_ROW_PAIRS``, an even number of column
    tiles) also a pair whose second tile is short, a reduction shorter than a k-chunk, pairs then a
    single last tile (81 rows), and one row past a tile."""
    assert bf16.amx_kernel_name(col_tiles, row_pairs).endswith("_pairs") == (row_pairs and col_tiles % 2 == 0)
    lib = _amx_gemm(M, col_tiles, K, row_pairs).jit()
    asm = lib.inspect_source("asm")
    assert asm.count("tdpbf16ps") >= 1 and "ldtilecfg" in asm and "tilerelease" in asm
    assert bf16.supports_amx(tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids"}))
    assert not bf16.supports_amx(tvm.target.Target({"kind": "llvm", "mcpu": "znver4"}))
    if not _amx_runs():
        pytest.skip("this CPU (or OS) offers no AMX-BF16: compiled only")
    _check_against_float64(lib, M, 16 * col_tiles, K, rng)


# ---- bf16 input projections (BuildOptions.bf16_projections) -----------------------------------
ZEN4 = {"kind": "llvm", "mcpu": "znver4", "num-cores": 2}
SPR = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
needs_bf16 = pytest.mark.skipif(not _cpu_has("avx512_bf16"), reason="this CPU has no AVX512-BF16 (avx512_bf16)")


def _rounded(a: np.ndarray) -> np.ndarray:
    """float32 -> its nearest bf16 (ties to even), as float64."""
    return (_bits(a).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


@pytest.mark.parametrize("amx", [False, True], ids=["avx512bf16", "amx"])
@pytest.mark.parametrize("steps,batch,K,H,G", [(4, 1, 13, 32, 4), (3, 7, 40, 48, 3), (2, 5, 9, 128, 1),
                                               (16, 3, 64, 32, 4), (5, 33, 101, 64, 3)])
def test_bf16_projection_kernel_matches_float64(steps, batch, K, H, G, amx, rng):
    """The bf16 projection kernel (its default schedule, tensorized: AVX512-BF16 for Zen 4, AMX
    for Sapphire Rapids), weights packed by the build's packing kernel, against float64 products
    of the same bf16-rounded operands, at odd K (a zero-padded last pair), one row, 16-unit and
    64-unit panels, rows of several steps in one AMX call; a NaN in one input row makes that
    row's outputs NaN and no other's."""
    from tvmrnn import kernels
    from tvmrnn.schedules import default_schedule, weight_panel
    if not amx and not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    target = tvm.target.Target(SPR if amx else ZEN4)
    panel = weight_panel(target, G, H)
    assert panel and panel % 16 == 0
    kernel = kernels.input_projection(steps, batch, K, H, G, panel=panel, bf16=True)
    lib = tvm.compile(tvm.IRModule({"main": default_schedule(kernel, target)}), target=target).jit()
    assert ("tdpbf16ps" if amx else "vdpbf16ps") in lib.inspect_source("asm")
    x = rng.standard_normal((steps, batch, K)).astype(np.float32)
    w = rng.standard_normal((G, H, K)).astype(np.float32)  # PyTorch's layout, packed by the build's kernel
    b = rng.standard_normal(kernels.gate_shape(H, G, panel)).astype(np.float32)
    x[-1, -1, K // 2] = np.nan
    if amx and not _amx_runs():
        pytest.skip("this CPU (or OS) offers no AMX-BF16: compiled only")
    dev = tvm.cpu(0)
    pack = tvm.compile(tvm.IRModule({"main": default_schedule(kernels.bf16_weight_pairs(G, H, K, panel), target)}),
                       target=target).jit()
    packed = tvm.runtime.tensor(np.zeros((H // panel, (K + 1) // 2, G, panel), np.float32), dev)
    pack["main"](tvm.runtime.tensor(w, dev), packed)
    out = tvm.runtime.tensor(np.zeros((steps, batch, *kernels.gate_shape(H, G, panel)), np.float32), dev)
    lib["main"](tvm.runtime.tensor(x, dev), packed, tvm.runtime.tensor(b, dev), out)
    expected = np.einsum("tnk,ghk->tnhg", _rounded(x), _rounded(w))
    expected = expected.reshape(steps, batch, H // panel, panel, G).transpose(0, 1, 2, 4, 3) + b
    got = out.numpy()
    assert np.isnan(got[-1, -1]).all() and not np.isnan(got.reshape(steps * batch, -1)[:-1]).any()
    got, expected = got.reshape(steps * batch, -1)[:-1], expected.reshape(steps * batch, -1)[:-1]
    assert np.abs(got - expected).max() <= 1e-6 * K * np.abs(expected).max()


@pytest.mark.parametrize("target", ["host", "amx"])
@pytest.mark.parametrize("cell,num_layers,bidirectional,options", [
    ("lstm", 2, True, {}), ("lstm", 1, True, {"stack_directions": True}), ("gru", 1, False, {}),
    ("rnn_tanh", 1, False, {"variable_lengths": True})])
def test_bf16_projection_builds_match_torch(cell, num_layers, bidirectional, options, target, rng):
    """A build with ``bf16_projections`` runs its input projections and every step's recurrent
    projection on the bf16 kernels (this CPU's; and AMX's tiles for Sapphire Rapids, where this
    CPU has them) and matches torch.nn in float64 to bf16's rounding (about 1e-3; fp32 builds:
    1e-7): outputs, states and, through the fp32 backward, every gradient; both directions in
    one step (a leading axis), variable lengths (masked steps) too."""
    import torch
    import tvmrnn
    if target == "amx" and not _amx_runs():
        pytest.skip("this CPU (or OS) offers no AMX-BF16")
    if target == "host" and not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    host = tvmrnn.device.host_target()
    if target == "host" and _amx_runs() and (str(host.attrs.get("mcpu")), int(host.attrs.get("num-cores", 0))) == (
            SPR["mcpu"], SPR["num-cores"]):
        pytest.skip("this host's target is the amx case's: the same build")
    torch.manual_seed(0)
    I, H, N, T = 21, 32 if cell != "rnn_tanh" else 128, 3, 11
    ref = getattr(torch.nn, cell.split("_")[0].upper())(I, H, num_layers=num_layers,
                                                        bidirectional=bidirectional).double()
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=num_layers, bidirectional=bidirectional,
                       batch_size=N, options=tvmrnn.BuildOptions(bf16_projections=True, **options), cache=False,
                       target=SPR if target == "amx" else None)
    for family in ("input_projection_", "recurrent_step_"):
        assert any(n.startswith(family) and n.endswith("_bf16") for n in rnn.schedules), rnn.schedules
    w = rnn.pack_weights({k: v.float().numpy() for k, v in ref.state_dict().items()})
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    lengths = [T, 4, 7] if options.get("variable_lengths") else None
    y, hy, *_ = rnn.forward(w, x, lengths=lengths)
    xr = torch.from_numpy(x).double().requires_grad_()
    if lengths:
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
        out, hr = ref(pack_padded_sequence(xr, lengths, enforce_sorted=False))
        yr = pad_packed_sequence(out, total_length=T)[0]
    else:
        yr, hr = ref(xr)
    hr = hr[0] if isinstance(hr, tuple) else hr
    error = float(np.linalg.norm(y - yr.detach().numpy()) / np.linalg.norm(yr.detach().numpy()))
    assert 1e-5 < error < 1e-2  # bf16's rounding shows, within its bounds
    assert np.linalg.norm(hy - hr.detach().numpy()) / np.linalg.norm(hr.detach().numpy()) < 1e-2
    y2, _, *rest = rnn.forward_train(w, x, lengths=lengths)
    np.testing.assert_array_equal(y2, y)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    grads = rnn.backward(w, rest[-1], dy=dy)
    yr.backward(torch.from_numpy(dy).double())
    assert np.linalg.norm(grads["x"] - xr.grad.numpy()) / np.linalg.norm(xr.grad.numpy()) < 2e-2
    for name, p in ref.named_parameters():
        assert np.linalg.norm(grads[name] - p.grad.numpy()) / np.linalg.norm(p.grad.numpy()) < 2e-2, name


@pytest.mark.parametrize("target", ["avx512bf16", "amx"])
def test_bf16_time_loops_are_one_parallel_region(target, rng):
    """A bf16 step reads its state rounded by a kernel of its own (``kernels.bf16_state``), run
    before it: both are one parallel loop each, so each time loop of a bf16 forward is one
    parallel region with a barrier after each of the two (``sequence.Program._region_loop``; with
    the rounding inside the step, on the calling thread, every step started and joined the
    thread pool, v90), the AMX step's C tile on each tile function's stack. The same bits as the
    passes with a region a step, both directions in one step and apart, a batch of one row too."""
    if target == "amx" and not _amx_runs():
        pytest.skip("this CPU (or OS) offers no AMX-BF16")
    if target == "avx512bf16" and not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    import torch
    torch.manual_seed(0)
    ref = torch.nn.LSTM(13, 48, bidirectional=True)
    params = {k: v.numpy() for k, v in ref.state_dict().items()}
    for stacked, N in ((True, 20), (False, 3), (True, 1)):
        x = rng.standard_normal((9, N, 13)).astype(np.float32)
        got = {}
        for regions in (True, False):
            options = tvmrnn.BuildOptions(bf16_projections=True, time_loop_regions=regions, stack_directions=stacked)
            rnn = tvmrnn.build("lstm", input_size=13, hidden_size=48, bidirectional=True, batch_size=N,
                               options=options, cache=False, tuning_logs=False, target=SPR if target == "amx" else ZEN4)
            if regions:
                if target == "amx" and N > 1:  # the step on AMX tiles (its C tile local to each task)
                    from tvmrnn import kernels
                    from tvmrnn.cells.definition import get_cell
                    from tvmrnn.schedules import default_schedule
                    step = kernels.recurrent_step(get_cell("lstm"), N, 48, False, directions=2 if stacked else 1,
                                                  panel=16, bf16=True)
                    assert "tvmrnn_amx_" in default_schedule(step, rnn.target).script()
                for name in ("forward", "forward_train"):
                    script = rnn.programs[name].build().script()
                    loops = script.count("pragma_parallel_launch_point")  # a time loop a chunk size
                    assert loops >= (1 if stacked else 2) and loops % (1 if stacked else 2) == 0, (name, stacked, N)
                    # a barrier after the rounding and after the step
                    assert script.count("pragma_parallel_barrier_when_finish") == 2 * loops, (name, stacked, N)
            w = rnn.pack_weights(params)
            got[regions] = (rnn.forward(w, x), rnn.forward_train(w, x)[:3])
        for a, b in zip(_arrays(got[True]), _arrays(got[False])):
            np.testing.assert_array_equal(a, b)
        y = got[True][0][0]
        yr = ref(torch.from_numpy(x))[0].detach().numpy()
        assert np.linalg.norm(y - yr) / np.linalg.norm(yr) < 1e-2


def _arrays(nested):
    """The arrays of nested tuples, in order."""
    if isinstance(nested, (tuple, list)):
        return [a for item in nested for a in _arrays(item)]
    return [np.asarray(nested)]


@needs_bf16
def test_weights_packed_for_fp32_are_refused_by_a_bf16_build(rng):
    """The bf16 build packs its recurrent weights rounded, in pairs: weights packed by an fp32
    build of the same sizes (or the other way round) are a ValueError, not wrong numbers."""
    import torch
    import tvmrnn
    params = {k: v.numpy() for k, v in torch.nn.GRU(8, 32).state_dict().items()}
    builds = [tvmrnn.build("gru", input_size=8, hidden_size=32, batch_size=2,
                           options=tvmrnn.BuildOptions(bf16_projections=on), cache=False) for on in (False, True)]
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    for a, b in (builds, builds[::-1]):
        with pytest.raises(ValueError, match="w: these weights were packed for a different configuration"):
            b.forward(a.pack_weights(params), x)
        assert b.forward(b.pack_weights(params), x)[0].shape == (3, 2, 32)


def test_bf16_projections_refused_where_they_cannot_run():
    """A clear ValueError at build, before compiling: a CPU without AVX512-BF16, a GPU, a hidden
    size without 16-unit weight panels; and the option itself is a bool."""
    import tvmrnn
    on = tvmrnn.BuildOptions(bf16_projections=True)
    sizes = dict(input_size=8, hidden_size=32, batch_size=2, options=on, cache=False)
    with pytest.raises(ValueError, match="AVX512-BF16 .avx512bf16.; 'znver3' has none"):
        tvmrnn.build("lstm", target={"kind": "llvm", "mcpu": "znver3"}, **sizes)
    with pytest.raises(ValueError, match="bf16_projections: CPUs only"):
        tvmrnn.build("lstm", target="nvidia/nvidia-h100", **sizes)
    with pytest.raises(ValueError, match="panels of a multiple of 16 units.*hidden_size 37 of a 4-gate cell gets 8-unit"):
        tvmrnn.build("lstm", target=ZEN4, **dict(sizes, hidden_size=37))
    with pytest.raises(ValueError, match="panels of a multiple of 16 units.*hidden_size 36 of a 4-gate cell gets 12-unit"):
        tvmrnn.build("lstm", target=ZEN4, **dict(sizes, hidden_size=36))
    with pytest.raises(ValueError, match="panels of a multiple of 16 units.*hidden_size 37 of a 3-gate cell gets no panels"):
        tvmrnn.build("gru", target=ZEN4, **dict(sizes, hidden_size=37))
    with pytest.raises(ValueError, match="panels that divide the hidden size: hidden_size 124 takes 16-unit panels"):
        tvmrnn.build("lstm", target=ZEN4, **dict(sizes, hidden_size=124))  # (padded: cpu.CPU_PADDED_PANELS)
    # a large state is not refused: a step's rounded state is a tensor of the pass (kernels.bf16_state),
    # not the calling thread's stack (until v91: refused over 1 MB)
    from tvmrnn.cells.definition import get_cell
    from tvmrnn.program.passes import Config, bf16_projections_refused
    large = Config(get_cell("lstm"), 1024, 1024, 1, True, 4096, False, options=on)
    assert bf16_projections_refused(tvm.target.Target(ZEN4), large) is None
    with pytest.raises(TypeError, match="options.bf16_projections: expected True or False"):
        tvmrnn.BuildOptions(bf16_projections="yes")


@needs_bf16
def test_bf16_build_exports_and_loads_with_its_choice(rng, tmp_path):
    """A package of a bf16 build records the choice (its options), packs its own weights rounded,
    and gives the build's results bit for bit; weights packed by an fp32 build are refused."""
    import torch
    import tvmrnn
    params = {k: v.numpy() for k, v in torch.nn.LSTM(10, 32).state_dict().items()}
    rnn = tvmrnn.build("lstm", input_size=10, hidden_size=32, batch_size=2,
                       options=tvmrnn.BuildOptions(bf16_projections=True), cache=False)
    path = rnn.export(tmp_path / "lstm_bf16.so")
    loaded = tvmrnn.load(path)
    assert loaded.config.options.bf16_projections
    x = rng.standard_normal((5, 2, 10)).astype(np.float32)
    np.testing.assert_array_equal(loaded.forward(loaded.pack_weights(params), x)[0],
                                  rnn.forward(rnn.pack_weights(params), x)[0])
    fp32 = tvmrnn.build("lstm", input_size=10, hidden_size=32, batch_size=2, cache=False)
    with pytest.raises(ValueError, match="packed for a different configuration"):
        loaded.forward(fp32.pack_weights(params), x)


@pytest.mark.parametrize("cores", [16, 64])
def test_bf16_builds_for_many_cores(cores):
    """The bf16 projection's tasks split the batch's row tiles, then the steps', one axis at a
    time: a split of the two fused left bindings that tensorize could not take (an Emerald Rapids
    Xeon's 16 cores at LSTM N=160 I=256 H=384, v41). Builds only (the target need not be this CPU)."""
    target = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": cores}
    for cell, N, I, H in (("lstm", 160, 256, 384), ("gru", 20, 800, 800), ("lstm", 1, 48, 64), ("rnn_tanh", 7, 33, 256)):
        tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, target=target, tuning_logs=False,
                     options=tvmrnn.BuildOptions(bf16_projections=True))


def test_host_target_follows_the_features_the_cpu_reports():
    """A VM may report an older CPU model than its features (LLVM named a KVM guest with AMX
    ``rocketlake``): the host target takes the oldest CPU LLVM knows with the bf16 features the
    kernel reports, and drops AMX where LLVM's CPU has it and the kernel does not report it."""
    from tvmrnn.device import _with_reported_features
    amx = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert _with_reported_features("rocketlake", amx) == "sapphirerapids"
    assert _with_reported_features("rocketlake", {"avx512f", "avx512_bf16"}) == "cooperlake"
    assert _with_reported_features("sapphirerapids", {"avx512f", "avx512_bf16"}) == "cooperlake"
    assert _with_reported_features("sapphirerapids", amx) == "sapphirerapids"
    assert _with_reported_features("znver4", {"avx512f", "avx512_bf16"}) == "znver4"
    assert _with_reported_features("skylake-avx512", {"avx512f"}) == "skylake-avx512"


@pytest.mark.parametrize("shared_kernels", [True, False])
def test_amx_builds_at_a_prime_batch_match_torch(shared_kernels, rng):
    """A prime batch takes one row a step in the AMX projection's tiles: its rows then run over
    steps, the row stride the step's (a build at N=257 gave wrong outputs where the kernel's buffer
    kept its full shape, v43); both with kernels called as functions and inline."""
    import torch
    import tvmrnn
    if not _amx_runs():
        pytest.skip("this CPU (or OS) offers no AMX-BF16")
    torch.manual_seed(0)
    ref = torch.nn.LSTM(24, 32).double()
    rnn = tvmrnn.build("lstm", input_size=24, hidden_size=32, batch_size=257, target=SPR, cache=False,
                       tuning_logs=False, options=tvmrnn.BuildOptions(bf16_projections=True,
                                                                      shared_kernels=shared_kernels))
    x = rng.standard_normal((6, 257, 24)).astype(np.float32)
    y, hy, cy = rnn.forward(rnn.pack_weights({k: v.float().numpy() for k, v in ref.state_dict().items()}), x)
    yr = ref(torch.from_numpy(x).double())[0].detach().numpy()
    assert np.linalg.norm(y - yr) / np.linalg.norm(yr) < 1e-2


@pytest.mark.parametrize("target", ["host", "amx"])
def test_bf16_deep_relu_rnn_is_as_close_to_float64_as_torch_bf16(target, rng):
    """A 5-layer bidirectional ReLU RNN, where rounding grows (each layer's rounded inputs move
    pre-activations across ReLU's kink, which changes the gradients' paths): the bf16 build's
    outputs and gradients against float64 are about as close as PyTorch's own CPU bf16 autocast
    (outputs ~3e-3 relative, both; gradients 4e-2 to 1.4e-1, both; fp32 builds: ~1e-6)."""
    import torch
    import tvmrnn
    if target == "amx" and not _amx_runs():
        pytest.skip("this CPU (or OS) offers no AMX-BF16")
    if target == "host" and not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    T, N, I, H, L = 7, 6, 19, 128, 5
    torch.manual_seed(0)
    ref = torch.nn.RNN(I, H, num_layers=L, nonlinearity="relu", bidirectional=True).double()
    rnn = tvmrnn.build("rnn_relu", input_size=I, hidden_size=H, num_layers=L, bidirectional=True, batch_size=N,
                       cache=False, tuning_logs=False, target=SPR if target == "amx" else None,
                       options=tvmrnn.BuildOptions(bf16_projections=True))
    w = rnn.pack_weights({k: v.float().numpy() for k, v in ref.state_dict().items()})
    x = rng.standard_normal((T, N, I)).astype(np.float32)
    dy = rng.standard_normal((T, N, 2 * H)).astype(np.float32)
    y, _, *rest = rnn.forward_train(w, x)
    grads = rnn.backward(w, rest[-1], dy=dy)
    xr = torch.from_numpy(x).double().requires_grad_()
    yr = ref(xr)[0]
    yr.backward(torch.from_numpy(dy).double())
    half = torch.nn.RNN(I, H, num_layers=L, nonlinearity="relu", bidirectional=True)
    half.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    xh = torch.from_numpy(x).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yh = half(xh)[0]
    yh.float().backward(torch.from_numpy(dy))

    def rel(a, b):
        return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))
    ours = [rel(y, yr.detach().numpy()), rel(grads["x"], xr.grad.numpy())]
    theirs = [rel(yh.detach().float().numpy(), yr.detach().numpy()), rel(xh.grad.numpy(), xr.grad.numpy())]
    for (name, p), (_, q) in zip(ref.named_parameters(), half.named_parameters()):
        ours.append(rel(grads[name], p.grad.numpy()))
        theirs.append(rel(q.grad.numpy(), p.grad.numpy()))
    assert max(ours) < 0.2, ours
    assert all(o <= 3 * t + 1e-3 for o, t in zip(ours, theirs)), list(zip(ours, theirs))


# ---- tvmrnn.build(dtype="bfloat16"): bf16 arrays in and out (issue 39, item 1) ------------------------------
@pytest.mark.parametrize("cell,I,H,layers,bidirectional", [
    ("lstm", 19, 48, 2, True),     # bf16 GEMMs (16-unit weight panels)
    ("gru", 33, 64, 1, False),
    ("rnn_relu", 13, 37, 1, True),  # no panels at H = 37: fp32 GEMMs on the rounded inputs and weights
])
def test_bfloat16_builds_match_torch_in_float64(cell, I, H, layers, bidirectional, rng):
    """A ``dtype="bfloat16"`` build takes and returns bf16 tensors (the states and the input and
    state gradients too), and fp32 weight gradients; against torch.nn in float64 on the same
    bf16-rounded inputs and weights its errors are bf16's (a few 1e-3 relative), at a batch
    smaller than the build's, forward and every gradient."""
    import torch
    if not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    check_half_build(cell, I, H, layers, bidirectional, "bfloat16", target=None, device="cpu")


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_bfloat16_builds_at_batch_one_match_torch_in_float64(cell):
    """A bf16 build for one row (the serving case), forward and every gradient."""
    if not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    check_half_build(cell, 11, 32, 1, True, "bfloat16", target=None, device="cpu", N=1, n=1)


@functools.lru_cache(maxsize=None)
def _bf16_lstm(input_size: int, hidden_size: int, batch_size: int):
    """A bidirectional bf16 LSTM build, shared by the tests that ask for the same sizes."""
    return tvmrnn.build("lstm", input_size=input_size, hidden_size=hidden_size, bidirectional=True,
                        batch_size=batch_size, dtype="bfloat16", cache=False, tuning_logs=False)


@pytest.mark.parametrize("place", ["x", "h0", "c0", "weight", "inf", "dy"])
def test_nan_and_inf_through_a_bfloat16_build_reach_what_they_reach_in_torch(place):
    """test_numerics' cases through a bf16 LSTM build (bf16 inputs, states and output gradient,
    rounded from the fp32 case; weights packed rounded): NaN and Inf reach exactly the outputs,
    states and gradients they reach in torch.nn (fp32), through the casts, the rounding and the
    bf16 GEMMs."""
    import torch
    from test_numerics import _case, _nan_pattern_matches, _torch_side
    if not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    hidden = 32  # 16-unit panels: the bf16 GEMMs, not the fp32 fallback
    ref, params, x, h0, c0, dy = _case("lstm", place, hidden)
    want, want_grads = _torch_side("lstm", ref, params, x, h0, c0, dy)
    rnn = _bf16_lstm(x.shape[2], hidden, x.shape[1])  # (one build for every place)

    def bf16(a):
        return torch.from_numpy(a).bfloat16()
    w = rnn.pack_weights(params)
    y, hy, cy = rnn.forward(w, bf16(x), bf16(h0), bf16(c0))
    _nan_pattern_matches(place, {"y": y.float(), "hy": hy.float(), "cy": cy.float()}, want, "forward")
    y, hy, cy, ws = rnn.forward_train(w, bf16(x), bf16(h0), bf16(c0))
    _nan_pattern_matches(place, {"y": y.float(), "hy": hy.float(), "cy": cy.float()}, want, "forward_train")
    grads = rnn.backward(w, ws, bf16(dy))
    _nan_pattern_matches(place, {k: v.float() for k, v in grads.items()}, want_grads, "backward")


def test_bfloat16_build_contract(tmp_path):
    """What a bf16 build refuses, by name: other dtypes of input, NumPy arrays (NumPy has no
    bfloat16), weights packed by an fp32 build, float16 on a CPU, an unknown dtype, a CPU without
    AVX512-BF16, a dtype that disagrees with the options; and its package keeps the dtype."""
    import torch
    if not _cpu_has("avx512_bf16"):
        pytest.skip("this CPU has no AVX512-BF16 (avx512_bf16)")
    rnn = tvmrnn.build("gru", input_size=8, hidden_size=32, batch_size=2, dtype=torch.bfloat16, cache=False,
                       tuning_logs=False)
    params = {k: v for k, v in torch.nn.GRU(8, 32).state_dict().items()}
    w = rnn.pack_weights(params)
    x = torch.randn(3, 2, 8)
    with pytest.raises(TypeError, match="x: this RNN was built for dtype bfloat16 .* got float32"):
        rnn.forward(w, x)
    with pytest.raises(TypeError, match="NumPy has no bfloat16"):
        rnn.forward(w, x.numpy())
    with pytest.raises(TypeError, match="h0: this RNN was built for dtype bfloat16"):
        rnn.forward(w, x.bfloat16(), h0=torch.zeros(1, 2, 32))
    fp32 = tvmrnn.build("gru", input_size=8, hidden_size=32, batch_size=2, cache=False, tuning_logs=False)
    with pytest.raises(ValueError, match="packed for a different configuration"):
        rnn.forward(fp32.pack_weights(params), x.bfloat16())
    y = rnn.forward(w, x.bfloat16())[0]  # still usable after the errors
    loaded = tvmrnn.load(rnn.export(tmp_path / "gru_bf16.so"))
    assert loaded.dtype == "bfloat16"
    from tvmrnn.runtime.package import read_metadata
    assert read_metadata(tmp_path / "gru_bf16.so")["dtype"] == "bfloat16"  # (it said float32 before v67)
    assert torch.equal(loaded.forward(loaded.pack_weights(params), x.bfloat16())[0], y)
    with pytest.raises(ValueError, match="'float16' builds need a CUDA target"):
        tvmrnn.build("gru", input_size=8, hidden_size=32, dtype="float16", cache=False)
    with pytest.raises(ValueError, match="dtype: expected one of float32, bfloat16, float16; got 'int8'"):
        tvmrnn.build("gru", input_size=8, hidden_size=32, dtype="int8", cache=False)
    with pytest.raises(ValueError, match="dtype='bfloat16': target: bf16 dot products need .*'znver3' has none"):
        tvmrnn.build("gru", input_size=8, hidden_size=32, dtype="bfloat16", cache=False,
                     target={"kind": "llvm", "mcpu": "znver3"})
    with pytest.raises(ValueError, match="disagrees with options.dtype='float16'"):
        tvmrnn.build("gru", input_size=8, hidden_size=32, dtype="bfloat16", cache=False,
                     options=tvmrnn.BuildOptions(dtype="float16"))
    with pytest.raises(ValueError, match="options.dtype: expected one of"):
        tvmrnn.BuildOptions(dtype="double")


def test_round_to_bfloat16_matches_torch():
    """Weights are packed rounded as torch rounds to bf16 (nearest even; NaN, Inf kept)."""
    import torch
    from tvmrnn.runtime.arrays import round_to
    a = np.concatenate([np.random.default_rng(0).standard_normal(1000).astype(np.float32) * 1e3,
                        np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.00390625, 1.01171875, 3.4e38], np.float32)])
    expected = torch.from_numpy(a).bfloat16().float().numpy()
    np.testing.assert_array_equal(round_to("bfloat16", a), expected)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(round_to("float16", a), a.astype(np.float16).astype(np.float32))


def test_timing_an_amx_kernel_alone_asks_for_amx_first():
    """``profile.time_kernel`` on an AMX kernel, in a process that built nothing: it asks the OS
    for AMX first (a tile instruction before that is SIGILL, which killed the process)."""
    import subprocess
    import sys
    if not _amx_runs():
        pytest.skip("this CPU (or OS) offers no AMX-BF16")
    code = ("import tvm\nfrom tvmrnn import kernels\nfrom tvmrnn.cells.definition import get_cell\n"
            "from tvmrnn.schedules import default_schedule\nfrom tvmrnn.runtime.profile import time_kernel\n"
            f"t = tvm.target.Target({SPR!r})\n"
            "k = kernels.recurrent_step(get_cell('gru'), 20, 64, train=False, panel=16, bf16=True)\n"
            "print('us', time_kernel(default_schedule(k, t), t, number=2, repeat=2))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "us " in done.stdout, done.stderr[-2000:]


def test_packing_torch_cpu_parameters_matches_numpy():
    """CPU torch parameters are packed through NumPy (no torch.cat: its OpenMP threads spin on the
    passes' cores), half ones widened on TVM's threads: the same packed bits as NumPy's float32
    parameters, for an fp32 build and (rounded) a bf16 one."""
    import torch
    ref = torch.nn.GRU(8, 32)
    builds = [tvmrnn.build("gru", input_size=8, hidden_size=32, batch_size=2, cache=False, tuning_logs=False)]
    if _cpu_has("avx512_bf16"):
        builds.append(tvmrnn.build("gru", input_size=8, hidden_size=32, batch_size=2, dtype="bfloat16", cache=False,
                                   tuning_logs=False))
    for rnn in builds:
        for params in (dict(ref.state_dict()), {k: v.bfloat16() for k, v in ref.state_dict().items()}):
            as_numpy = {k: v.float().numpy() for k, v in params.items()}
            got = rnn.pack_weights(params, zeroed=True).flat
            expected = rnn.pack_weights(as_numpy, zeroed=True).flat
            np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))
