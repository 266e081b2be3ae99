"""No-hardware codegen checks: the same kernels compile for an H100 (sm_90) and for AVX-512 CPUs."""
from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest

import tvmrnn
from tvmrnn import BuildOptions
from conftest import built, cpu_has, slow
from test_rnn import _check

SIZES = dict(input_size=64, hidden_size=64, num_layers=2, bidirectional=True, batch_size=4)


def _kernel_definitions(source: str) -> list[str]:
    """The ``__global__`` kernels defined in CUDA source (signature and body), not their declarations."""
    return [k for k in source.split("extern \"C\" __global__")[1:] if k.split("\n", 1)[0].rstrip().endswith("{")]


@pytest.mark.parametrize("target", [None, "nvidia/nvidia-h100"])
def test_a_plan_is_what_build_compiles(target):
    """``tvmrnn.plan`` (what many of these tests read: a build's programs and schedules, without
    compiling) gives what ``build`` compiles: the same configuration, the same kernels with the
    same schedules and records, the same TIR for every pass, the same persistent blocks; its
    arguments are checked as ``build``'s are. A GPU plan needs no CUDA compiler."""
    sizes = dict(input_size=13, hidden_size=37, num_layers=2, batch_size=5, target=target, tuning_logs=False,
                 options=BuildOptions(variable_lengths=True))
    plan = tvmrnn.plan("lstm", bidirectional=True, **sizes)
    assert set(plan.programs) == {"forward", "forward_train", "backward", "pack_forward", "pack_weights"} \
        and plan.schedules and set(plan.records) <= set(plan.schedules)
    if target is None or shutil.which("nvcc"):
        rnn = tvmrnn.build("lstm", bidirectional=True, cache=False, **sizes)
        assert (plan.config, plan.target.export(), plan.allow_tf32, plan.persistent_blocks) == (
            rnn.config, rnn.target.export(), rnn.allow_tf32, rnn.persistent_blocks)
        assert (plan.schedules, plan.records) == (rnn.schedules, rnn.records)
        assert {name: p.build().script() for name, p in plan.programs.items()} == {
            name: p.build().script() for name, p in rnn.programs.items()}
    if target is not None:  # the records a plan reports: the shipped H100 records of the DS2 LSTM, every kernel
        import tempfile
        with tempfile.TemporaryDirectory() as no_raw_logs:
            ds2 = tvmrnn.plan("lstm", 800, 800, batch_size=20, target=target, tuning_logs=no_raw_logs)
        tuned = {name for name, how in ds2.schedules.items() if how == "tuned"}
        assert set(ds2.schedules) - tuned == {"copy_4x800"} and set(ds2.records) == tuned  # (the bias copy: none yet)
    with pytest.raises(ValueError, match="hidden_size: expected >= 1, got 0"):
        tvmrnn.plan("lstm", 13, 0, target=target)
    with pytest.raises(ValueError, match="proj_size"):
        tvmrnn.plan("gru", 13, 37, proj_size=5, target=target)
    with pytest.raises(TypeError, match="cache"):
        tvmrnn.plan("lstm", 13, 37, cache=False)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_avx512_code_uses_zmm_registers(cell):
    rnn = tvmrnn.build(cell, **SIZES, target={"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16})
    asm = rnn.executable.mod.inspect_source("asm")
    assert re.search(r"%zmm\d+", asm), "no 512-bit vector registers in the generated assembly"
    assert "forward_train" in asm and "backward" in asm


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", slow("gru"), slow("rnn_relu")])
def test_cuda_sm90_compiles(cell):
    rnn = tvmrnn.build(cell, **SIZES, target={"kind": "cuda", "arch": "sm_90"})
    device_modules = rnn.executable.mod.imports
    assert [m.kind for m in device_modules] == ["cuda"]
    source = device_modules[0].inspect_source()
    # every per-step kernel of the three passes is a separate __global__ function
    assert source.count("__global__") >= 10
    # no tanhf: TVM compiles with --use_fast_math, which makes it tanh.approx.f32 (5e-4 off)
    assert "tanhf(" not in source and "tanh(" not in source
    assert rnn.target.host is not None and rnn.target.host.kind.name == "llvm"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cuda_half_builds_put_the_all_steps_gemms_on_tensor_cores(dtype):
    """A CUDA half build (``dtype=``) compiles with its all-steps GEMMs on tensor cores (``mma``)
    and says so; run against float64 on the GPU machine (``test_half_builds_match_torch_on_cuda``)."""
    rnn = tvmrnn.build("lstm", input_size=19, hidden_size=48, batch_size=5, dtype=dtype, target="nvidia/nvidia-h100",
                       tuning_logs=False, cache=False)
    assert rnn.dtype == dtype and rnn.allow_tf32 and "dtype=" in repr(rnn)
    assert "mma.sync" in rnn.executable.mod.imports[0].inspect_source()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_half_builds_put_large_steps_on_tensor_cores_unless_told_not_to():
    """A half build's forward steps of ``GPU_TF32_STEP_ROWS`` rows and ``GPU_TF32_STEP_WORK``
    multiply-adds or more (here 128 x 1800 x 600) run on the TF32 tiles, their gate math a second
    kernel (``BuildOptions.tensor_core_steps``); the backward's steps (a reduction longer than
    their columns) below 160 rows a direction, ``tensor_core_steps=False`` and fewer rows keep
    them fp32, and the backward steps of 256 rows go TF32 too. Run against float64
    on the GPU machine (``test_half_builds_with_steps_on_tensor_cores_match_torch_on_cuda``)."""
    from tvmrnn.schedules.common import GPU_TF32_STEP_ROWS, GPU_TF32_STEP_WORK
    assert 128 * 1800 * 600 >= GPU_TF32_STEP_WORK and GPU_TF32_STEP_ROWS <= 128

    def steps(batch, **options):
        rnn = tvmrnn.plan("gru", input_size=24, hidden_size=600, batch_size=batch, dtype="float16",
                          target="nvidia/nvidia-h100", tuning_logs=False,
                          options=BuildOptions(chunk_steps=(1,), **options))  # (the steps alone: one GEMM chunk)
        return {k: v for k, v in rnn.schedules.items() if "step" in k}
    on = steps(128)
    assert {v for k, v in on.items() if k.startswith("recurrent_step")} == {"tf32"}
    assert {v for k, v in on.items() if k.startswith("backward_step")} == {"default"}
    assert "tf32" not in steps(128, tensor_core_steps=False).values()
    assert "tf32" not in steps(100).values()
    # per direction: two stacked directions of 128 x 1620 x 540 (2 x 112 M multiply-adds) stay
    # persistent, as one direction does; a backward step on the SIMT tiled GEMM stays there
    bidirectional = tvmrnn.build("gru", input_size=24, hidden_size=540, batch_size=128, bidirectional=True,
                                 dtype="float16", target="nvidia/nvidia-h100", tuning_logs=False, cache=False,
                                 options=BuildOptions(chunk_steps=(1,)))
    assert not any(v == "tf32" for k, v in bidirectional.schedules.items() if "step" in k), bidirectional.schedules
    assert any(k.endswith("_d2_persistent") for k in bidirectional.schedules)
    large = tvmrnn.build("lstm", input_size=24, hidden_size=1024, batch_size=256, dtype="float16",
                         target="nvidia/nvidia-h100", tuning_logs=False, cache=False)
    # the input projections on half operands (``half_operands``), the steps on TF32 tiles; the
    # backward's GEMMs on TF32, its step too (past the SIMT tiled GEMM's rows and outputs)
    assert {k: v for k, v in large.schedules.items() if "step" in k} == {
        "recurrent_step_lstm_infer_n256_h1024_tf32": "tf32", "recurrent_step_lstm_train_n256_h1024_tf32": "tf32",
        "backward_step_lstm_n256_h1024_tf32": "tf32"}
    assert "input_projection_t256_n256_k24_h1024_g4_f16" in large.schedules
    assert "recurrent_backward_n256_h1024_g4_tf32" in large.schedules
    assert not any(k.endswith("_f16") for k in large.schedules if "gradient" in k or "backward" in k)
    source = large.executable.mod.imports[0].inspect_source()
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in source and "ldmatrix.sync.aligned.m8n8.x4" in source


def test_half_operands_follow_the_dtype_unless_told_not_to(monkeypatch):
    """``half_operands``: a bf16 build's input projections take bf16 operands, True its tensor-core
    steps too, False keeps them on TF32, and an fp32 build cannot ask for them."""
    def build(dtype, **options):
        return tvmrnn.build("gru", input_size=40, hidden_size=64, batch_size=8, dtype=dtype, target="nvidia/nvidia-h100",
                            tuning_logs=False, cache=False, options=BuildOptions(**options))
    bf16 = build("bfloat16")
    assert any(k.startswith("input_projection") and k.endswith("_bf16") for k in bf16.schedules), bf16.schedules
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in bf16.executable.mod.imports[0].inspect_source()
    # True: the steps of ``tensor_core_steps`` too (here at any size)
    from tvmrnn.schedules import common
    monkeypatch.setattr(common, "GPU_TF32_STEP_ROWS", 1)
    monkeypatch.setattr(common, "GPU_TF32_STEP_WORK", 1)
    steps = build("bfloat16", half_operands=True, persistent="off")
    assert any(k.startswith("recurrent_step") and k.endswith("_bf16") for k in steps.schedules), steps.schedules
    off = build("float16", half_operands=False)
    assert not any(k.endswith(("_f16", "_bf16")) for k in off.schedules)
    assert any(k.startswith("input_projection") and k.endswith("_tf32") for k in off.schedules)
    with pytest.raises(ValueError, match="half_operands.*half dtype"):
        build("float32", half_operands=True)
    with pytest.raises(ValueError, match="half_operands.*GPU"):
        tvmrnn.build("gru", 8, 16, dtype="bfloat16", options=BuildOptions(half_operands=True), cache=False)


def test_tensor_core_steps_are_refused_where_they_cannot_apply():
    with pytest.raises(ValueError, match="tensor_core_steps.*GPU"):
        tvmrnn.build("gru", 8, 16, options=BuildOptions(tensor_core_steps=True), cache=False)
    with pytest.raises(ValueError, match="tensor_core_steps.*allow_tf32"):
        tvmrnn.build("gru", 8, 16, target="nvidia/nvidia-h100", options=BuildOptions(tensor_core_steps=True), cache=False)
    with pytest.raises(TypeError, match="tensor_core_steps"):
        BuildOptions(tensor_core_steps="yes")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("sizes", [dict(input_size=13, hidden_size=37, batch_size=3),
                                   dict(input_size=13, hidden_size=37, batch_size=100),
                                   dict(input_size=800, hidden_size=800, batch_size=20)], ids=["odd", "batch100", "ds2"])
def test_cuda_default_schedules(sizes):
    """The GPU default: per-step GEMMs split-K with their partial sums in shared memory, every
    global access scalar. Kernels get views at offsets that need not be a multiple of a vector (a
    2-layer peephole LSTM at H = 37 faulted on the H100 with dlight's float2 accesses); vector
    accesses only between shared memory and registers (the all-steps GEMMs' 128-bit loads from
    their shared tiles, ``gpu_matmul``). Batches above the split-K's 64 rows keep their fused
    epilogues in split-K (the tiled GEMM cannot place them)."""
    from tvmrnn.cells.examples import EXAMPLES
    rnn = tvmrnn.build(EXAMPLES["peephole_lstm"], **sizes, num_layers=2, bidirectional=True,
                       target="nvidia/nvidia-h100", tuning_logs=False, options=BuildOptions(persistent="auto"))
    source = rnn.executable.mod.imports[0].inspect_source()
    vector = _vector_buffers(source)
    assert all(ON_CHIP.search(b) for b in vector), f"a global vector access: {vector}"
    kernels = source.split("extern \"C\" __global__")[1:]
    for kernel in kernels:  # static shared memory within what a block may have without opting in
        assert sum(int(n) * 4 for n in re.findall(r"__shared__ [^;]*float \w+\[(\d+)\]", kernel)) <= 48 * 1024
    # the inference pass launches the input projection (shared tiles too), the step, copies
    forward = [k for k in kernels if re.search(r"\bforward_kernel(_\d+)?\(", k.split("{")[0])]
    assert sum("__shared__" in k and "__syncthreads" in k for k in forward) >= 2
    assert set(rnn.schedules.values()) == {"default"}
    # GPU builds run both directions of a layer in one launch per step (passes.stack_directions):
    # each pass's time loops run one step kernel, for both directions (a leading direction axis);
    # by default (persistent="auto") the backward's time loop stays a loop of launches at DS2
    # sizes (51 M multiply-adds a direction's step) and is persistent at small ones
    for name in ("forward", "forward_train", "backward"):
        steps = [k for k in rnn.programs[name].kernels.values()
                 if k.name.startswith(("recurrent_step", "backward_step"))]
        assert len(steps) == 1 and steps[0].batch == 1, (name, [k.name for k in steps])
    assert rnn.programs["backward"].uses_persistent_loops == (sizes["hidden_size"] < 800)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", slow("rnn_tanh")])  # 4 gates and 1 (the GRU's 3 took 22 s more)
def test_cuda_split_k_variants_fit_the_gpu(cell, tmp_path, sampled):
    """Every shape that tuning seeds a per-step GEMM with (a spread of them but with
    ``--full-grid``) compiles for sm_90, is a distinct schedule, and keeps its static shared memory
    within the 48 KB a block may have."""
    import tvm
    import tvm_ffi
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import default_schedule
    from tvmrnn.schedules.variants import variants
    target = tvm.target.Target("nvidia/nvidia-h100")
    G = CELLS[cell].num_gates
    for kernel in (kernels.recurrent_step(CELLS[cell], 20, 800, train=True), kernels.recurrent_backward(20, 800, G, True),
                   kernels.recurrent_step(CELLS[cell], 20, 800, train=True, directions=2),
                   kernels.backward_step(CELLS[cell], 20, 800, directions=2)):
        shapes = variants(kernel, target)
        assert len(shapes) >= 3 and shapes[0] == {}
        hashes = set()
        for tiles in sampled(shapes):
            func = default_schedule(kernel, target, **tiles)
            hashes.add(tvm_ffi.structural_hash(func))
            source = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
            shared = sum(int(n) * 4 for n in re.findall(r"__shared__ [^;]*float \w+\[(\d+)\]", source))
            assert 0 < shared <= 48 * 1024, (kernel.name, tiles, shared)
            if not tiles:  # the default itself through nvcc: it assembles, and nothing spills
                report = _ptxas(source, tmp_path)
                assert " 0 bytes spill stores" in report and "spill stores" in report, report
        assert len(hashes) >= 2, kernel.name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_row_tiles_for_many_rows(tmp_path, sampled):
    """Per-step GEMMs with many rows take row tiles: every listed shape (a spread of them but with
    ``--full-grid``) compiles for sm_90, is a distinct schedule and a point of the template's space
    (the default's knob setting schedules the kernel as the default does), the default assembles
    without spills. Persistent steps of many rows take row tiles too (weights on chip, a block's
    own rows staged each step), and a build at 20 rows keeps split-K's persistent forward."""
    import tvm
    import tvm_ffi
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.tune.records import workload
    from tvmrnn.schedules import apply, default_schedule, knobs
    from tvmrnn.schedules.variants import variants
    from tvmrnn.tune import spaces
    target = tvm.target.Target("nvidia/nvidia-h100")
    # (sizes past the rows and multiply-adds from which row tiles are the default)
    for kernel in (kernels.recurrent_step(CELLS["lstm"], 160, 168, train=True),
                   kernels.recurrent_step(CELLS["gru"], 131, 210, train=False, directions=2),
                   kernels.backward_step(CELLS["gru"], 128, 216)):
        assert knobs.family(kernel, target) == "row_tiles", kernel.name
        shapes = variants(kernel, target)
        hashes = set()
        for tiles in sampled(shapes):
            func = default_schedule(kernel, target, **tiles)
            hashes.add(tvm_ffi.structural_hash(func))
            source = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
            if not tiles:
                report = _ptxas(source, tmp_path)
                assert " 0 bytes spill stores" in report and "spill stores" in report, report
        assert len(hashes) >= 3, kernel.name  # shapes coincide where the sizes have few divisors
        mod = workload(kernel)
        settings = knobs.seeded_settings(kernel, target)
        found = spaces.knob_schedule(mod, kernel, target, settings[0])
        direct = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
        apply(direct, kernel, target)
        assert tvm_ffi.structural_equal(found.mod, direct.mod), kernel.name
        assert all(spaces.knob_schedule(mod, kernel, target, v) is not None for v in settings[1:]), kernel.name
    # persistent: row tiles too, each block's units' weights staged once, its rows each step
    from tvmrnn.schedules import keeps_weights_on_chip
    for kernel in (kernels.recurrent_step(CELLS["lstm"], 128, 184, train=False),
                   kernels.recurrent_step(CELLS["gru"], 130, 216, train=True),
                   kernels.recurrent_step(CELLS["rnn_tanh"], 256, 64, train=False)):
        persistent = kernels.persistent(kernel, 132)
        assert knobs.family(persistent, target) == "row_tiles", kernel.name
        func = default_schedule(persistent, target)
        assert keeps_weights_on_chip(func, persistent), kernel.name
    # ... the last of them a point of the template's space too, its listed variants within the blocks
    mod = workload(persistent)
    settings = knobs.seeded_settings(persistent, target)
    direct = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
    apply(direct, persistent, target)
    assert tvm_ffi.structural_equal(spaces.knob_schedule(mod, persistent, target, settings[0]).mod, direct.mod)
    from tvmrnn.program.sequence import _grid_blocks
    for values in settings[1:]:
        found = spaces.knob_schedule(mod, persistent, target, values)
        assert found is None or (_grid_blocks(found.mod["main"]) or 0) <= 132 \
            or not keeps_weights_on_chip(found.mod["main"], persistent), values
    many = tvmrnn.build("lstm", input_size=16, hidden_size=184, batch_size=128, target=target, cache=False)
    few = tvmrnn.plan("lstm", input_size=16, hidden_size=24, batch_size=20, target=target)
    assert many.programs["forward"].uses_persistent_loops and few.programs["forward"].uses_persistent_loops
    # the backward's time loop too where its step takes row tiles, and where split-K's step is small
    # (common.GPU_BACKWARD_PERSISTENT_WORK: 20 x 24 x 96 multiply-adds here)
    assert many.programs["backward"].uses_persistent_loops and few.programs["backward"].uses_persistent_loops
    assert many.schedules["recurrent_step_lstm_infer_n128_h184_persistent"] == "default"
    source = many.executable.mod.imports[0].inspect_source()
    persistent = [k for k in source.split('extern "C" __global__')[1:] if "wait_until" in k]
    assert len(persistent) == 3  # the inference and training forwards', the backward's
    for kernel in persistent:  # the weights' copy before the time loop, the GEMM on shared memory
        prologue, loop = kernel.split("for (int step = 0; step < ", 1)
        assert re.search(r"buf_dyn_shmem_ptr\)\[.*\] = w_ptr\[", prologue)
        assert not re.search(r"= w_ptr\[", loop.split("__syncthreads", 1)[0])
    report = _ptxas(source, tmp_path)
    assert not re.search(r"[1-9]\d* bytes spill", report), report


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_step_reductions_split_over_blocks(monkeypatch):
    """Per-step GEMMs with a long reduction split it over blocks by default (a partial-sums kernel,
    then the epilogue's kernel), into slices that divide it evenly, more for longer reductions, the
    directions of a two-direction step counted as blocks too; the GRU's forward step (3 gates a
    unit) too, its column blocks shared between the slices; ``block_slices=1`` restores one kernel
    everywhere."""
    import tvm
    from tvm import s_tir
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules.split_k import default_block_slices
    from tvmrnn.schedules import default_schedule
    target = tvm.target.Target("nvidia/nvidia-h100")

    def launches(kernel, **tiles):
        func = default_schedule(kernel, target, **tiles)
        source = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
        return len(set(re.findall(r"__global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(", source)))

    def slices(kernel):
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
        return default_block_slices(sch, kernel, sch.get_sblock(kernel.gemm))

    lstm, gru = CELLS["lstm"], CELLS["gru"]
    backward = slices(kernels.backward_step(lstm, 20, 800))  # a reduction over 4 x 800 gate gradients
    forward = slices(kernels.recurrent_step(lstm, 20, 800, train=False))  # over 800 units
    assert backward > forward > 1 and 3200 % backward == 0 and 800 % forward == 0
    assert slices(kernels.backward_step(lstm, 20, 800, directions=2)) * 2 == backward  # as many blocks in all
    assert 800 % slices(kernels.recurrent_step(gru, 20, 800, train=True)) == 0
    assert slices(kernels.recurrent_step(gru, 20, 800, train=True)) > 1
    assert slices(kernels.recurrent_step(gru, 3, 37, train=True)) == 1  # no even split of 37
    assert slices(kernels.backward_step(lstm, 3, 37)) == 1  # short reductions stay in one block
    for kernel in (kernels.backward_step(lstm, 20, 800), kernels.backward_step(gru, 20, 800, directions=2),
                   kernels.recurrent_step(lstm, 20, 800, train=True)):
        assert launches(kernel) == 2, kernel.name
        assert launches(kernel, block_slices=1) == 1, kernel.name
    gru_step = kernels.recurrent_step(gru, 20, 800, train=False, directions=2)
    assert launches(gru_step) == 2 and launches(gru_step, block_slices=1) == 1
    # 2 directions x 2 slices x 100 column blocks of 8 units (not 200 blocks per slice: 4 units)
    func = default_schedule(gru_step, target)
    source = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
    assert "blockIdx.x) % 100) * 24" in source, "100 blocks of 8 units (24 columns) per direction and slice"
    # a slice count that does not divide the reduction (37) is never used: rfactor would drop the
    # uneven split's predicate and add past the end
    assert launches(kernels.recurrent_step(lstm, 3, 37, train=False), block_slices=4) == 1
    # whole models: the partial sums' global scratch is one pool that the driver allocates once,
    # every call's partial sums a pointer to its start (sequence.Program.scratch_pointers; each
    # launch a function of its own, sequence.GpuKernels)
    from tvmrnn.schedules import split_k
    monkeypatch.setattr(split_k, "GPU_BLOCK_SLICE", 8)  # read by split_k.default_block_slices
    rnn = tvmrnn.plan("lstm", input_size=13, hidden_size=40, num_layers=2, bidirectional=True, batch_size=3,
                      target="nvidia/nvidia-h100", options=BuildOptions(chunk_steps=(1,)))  # (a quicker build)
    kernels_table = rnn.programs["forward"].subroutines  # one table for every pass
    sizes = [math.prod(int(d) for d in shape) for entry in kernels_table._entries.values() if entry
             for shape, _, _ in entry[1]]
    for name in ("forward", "forward_train", "backward"):
        script = rnn.programs[name].build().script()
        pools = re.findall(r"scratch_pool = T.sblock_alloc_buffer\(\((\d+),\)(.*)\)\n", script)
        assert len(pools) == 1 and "scope" not in pools[0][1], name  # global, once per driver
        assert re.search(r'scratch_pool\.data, T\.Cast\("int64", 0\) \* T\.int64\(4\)', script), name
        assert not re.search(r"\w+_rf = T.sblock_alloc_buffer", script), name
        assert max(sizes) <= int(pools[0][0]) < 2 * sum(sizes)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_matmul_variants_fit_the_gpu(tmp_path, sampled):
    """Every shape tuning seeds the all-steps GEMMs with (``gpu_matmul``: block shapes, reduction
    tiles, double-buffering, cp.async stages; a spread of them but with ``--full-grid``) compiles
    for sm_90 within 48 KB of static shared memory (or in dynamic shared memory), reads its shared tiles with 128-bit loads and global
    memory with scalar ones; the default assembles without spilling. Odd sizes (padded tiles) too."""
    import json
    import tvm
    import tvm_ffi
    from tvmrnn import kernels
    from tvmrnn.schedules.variants import variants
    from tvmrnn.program.sequence import compile_module
    from tvmrnn.schedules import default_schedule
    target = tvm.target.Target("nvidia/nvidia-h100")
    for kernel in (kernels.input_projection(256, 20, 800, 800, 4), kernels.weight_gradient(256, 20, 1600, 800, 3),
                   kernels.input_gradient(32, 20, 800, 800, 1, accumulate=True),
                   kernels.input_projection(4, 20, 1600, 800, 4), kernels.input_gradient(4, 20, 800, 800, 3, False),
                   kernels.weight_gradient(7, 5, 13, 37, 4)):
        shapes = variants(kernel, target)
        assert shapes[0] == {} and len({json.dumps(t, sort_keys=True) for t in shapes}) == len(shapes)
        hashes = set()
        for tiles in sampled(shapes):
            func = default_schedule(kernel, target, **tiles)
            hashes.add(tvm_ffi.structural_hash(func))
            source = compile_module(tvm.IRModule({"main": func}), target).mod.imports[0].inspect_source()
            shared = sum(int(n) * 4 for n in re.findall(r"__shared__ [^;]*float \w+\[(\d+)\]", source))
            # (stages past 48 KB in dynamic shared memory, which the build checks against the device)
            assert 0 < shared <= 48 * 1024 or (shared == 0 and "extern __shared__" in source), (kernel.name, tiles)
            vector = _vector_buffers(source)
            assert vector and all(ON_CHIP.search(v) for v in vector), (kernel.name, tiles, vector)
            if not tiles:
                report = _ptxas(source, tmp_path)
                assert " 0 bytes spill stores" in report, report
        assert len(hashes) >= 4, kernel.name
    # the 256-step weight gradient with K = 800 (1.2 waves of 128 x 128 tiles on an H100) is also
    # measured with other tiles and its reduction split over blocks, each such shape two kernels
    kernel = kernels.weight_gradient(256, 20, 800, 800, 4)
    combined = [t["matmul"] for t in variants(kernel, target) if "rows" in t.get("matmul", {}) and "k_slices" in t["matmul"]]
    assert combined and all(t["k_slices"] > 1 for t in combined)
    for tiles in combined:
        source = tvm.compile(tvm.IRModule({"main": default_schedule(kernel, target, matmul=tiles)}),
                             target=target).mod.imports[0].inspect_source()
        assert len(_kernel_definitions(source)) == 2  # the partial GEMM, then the sum of its slices


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_short_chunk_gemms_split_their_reduction_over_blocks():
    """A 4-step chunk's GEMMs (80 rows at DS2 sizes) fill too little of an H100 with output tiles
    alone: by default their reduction is split over blocks (``blockIdx.z``), the partial sums go
    to global memory and a second kernel adds them up with the epilogue; the 256-step chunk's
    GEMM stays one kernel, and ``k_slices=1`` restores it for a short chunk too."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.schedules import default_schedule
    from tvmrnn.schedules.cuda import matmul_k_slices, matmul_shape
    target = tvm.target.Target("nvidia/nvidia-h100")

    def launches(kernel, **tiles):
        func = default_schedule(kernel, target, **tiles)
        source = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
        z = re.findall(r'T\.thread_binding\((\d+), thread="blockIdx\.z"\)', func.script())
        return len(re.findall(r'extern "C" __global__ [^;{]*\{', source)), [int(e) for e in z]

    short = matmul_k_slices(80, 3200, 1600, matmul_shape(80, 3200))  # 4 steps x N = 20 rows
    assert short > 1 and 1600 % short == 0 and (1600 // short) % 16 == 0  # whole 16-long tiles
    assert matmul_k_slices(5120, 3200, 1600, matmul_shape(5120, 3200)) == 1
    assert matmul_k_slices(80, 3200, 13, matmul_shape(80, 3200)) == 1  # too short to split
    assert launches(kernels.input_projection(4, 20, 1600, 800, 4)) == (2, [short])
    assert launches(kernels.input_gradient(4, 20, 1600, 800, 4, accumulate=True)) == (2, [short])
    assert launches(kernels.input_projection(4, 20, 1600, 800, 4), matmul=dict(k_slices=1)) == (1, [1])
    assert launches(kernels.input_projection(256, 20, 1600, 800, 4)) == (1, [1])


def test_cuda_chunks_cover_sequences_with_few_large_gemms():
    """GPU builds of 64 rows or more run the all-steps GEMMs over chunks of 256, 128, 64, 32, 4 and
    1 steps (``passes.GPU_WIDE_CHUNK_STEPS``): a 200-step backward's weight gradients are 128 + 64
    + 2 x 4 steps (four launches, not six of 32 and two of 4), 300 steps 256 + 32 + 3 x 4; a small
    forward's projections cover 200 steps with two overlapping 128-step chunks (its tail
    recomputes 56 steps, less work than the launches it saves), and so do the backward's input
    gradients of the first direction (``passes.GPU_INPUT_GRADIENT_TAILS``, v69; the weight
    gradients sum, so they cannot overlap). 16-63 rows take both ladders' sizes (v78:
    ``passes.GPU_MID_CHUNK_STEPS``), fewer 256, 32, 16, 8, 4 and 1 (v69: 200 steps are 6 x 32 + 8);
    CPU builds 16, 4 and 1."""
    def calls(rnn, program, T, kind):
        return {name.split("_")[2]: n for name, n in rnn.programs[program].calls(T).items()
                if name.startswith(kind) and "_k16_h24_g4" in name and n}
    wide = tvmrnn.plan("lstm", input_size=16, hidden_size=24, batch_size=64, target="nvidia/nvidia-h100",
                       tuning_logs=False)
    assert calls(wide, "backward", 200, "weight_gradient") == {"t128": 1, "t64": 1, "t4": 2}
    assert calls(wide, "backward", 300, "weight_gradient") == {"t256": 1, "t32": 1, "t4": 3}
    assert calls(wide, "backward", 200, "input_gradient") == {"t128": 2}
    assert calls(wide, "backward", 300, "input_gradient") == {"t256": 1, "t64": 1}
    assert calls(wide, "forward", 200, "input_projection") == {"t128": 2}
    mid = tvmrnn.plan("lstm", input_size=16, hidden_size=24, batch_size=63, target="nvidia/nvidia-h100",
                      tuning_logs=False)
    assert calls(mid, "backward", 200, "weight_gradient") == {"t128": 1, "t64": 1, "t8": 1}
    assert calls(mid, "backward", 300, "weight_gradient") == {"t256": 1, "t32": 1, "t8": 1, "t4": 1}
    assert calls(mid, "backward", 237, "weight_gradient") == {"t128": 1, "t64": 1, "t32": 1, "t8": 1, "t4": 1,
                                                              "t1": 1}
    narrow = tvmrnn.plan("lstm", input_size=16, hidden_size=24, batch_size=15, target="nvidia/nvidia-h100",
                         tuning_logs=False)
    assert calls(narrow, "backward", 200, "weight_gradient") == {"t32": 6, "t8": 1}
    assert calls(narrow, "backward", 300, "weight_gradient") == {"t256": 1, "t32": 1, "t8": 1, "t4": 1}
    cpu = tvmrnn.plan("lstm", input_size=16, hidden_size=24, batch_size=64, tuning_logs=False)
    assert calls(cpu, "backward", 200, "input_gradient") == {"t16": 12, "t4": 2}


def test_cuda_matmul_schedules_a_symbolic_step_count():
    """Groundwork for one launch per GEMM whatever the chunk (v60, not used by builds yet): the
    tiled GEMM (``gpu_matmul`` with its block shape given) schedules and compiles a chunk whose
    step count is a variable, rows guarded by predicates and the grid sized at launch; for the
    weight gradient the variable is the reduction's length (unsplit)."""
    import tvm
    from tvm import s_tir, tirx
    from tvmrnn import kernels
    from tvmrnn.schedules.cuda import GPU_MATMUL_SHAPES, gpu_matmul
    target = tvm.target.Target("nvidia/nvidia-h100")
    steps = tirx.Var("steps", "int32")
    for kernel, shape in ((kernels.input_projection(steps, 20, 96, 80, 4), 0),
                          (kernels.input_gradient(steps, 20, 96, 80, 4, accumulate=True), 0),
                          (kernels.weight_gradient(steps, 20, 96, 80, 4), 1)):
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
        rows, cols = GPU_MATMUL_SHAPES[shape]
        gpu_matmul(sch, kernel, rows=rows, cols=cols, k_slices=1)
        func = sch.mod["main"].with_attr("target", target)
        source = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
        assert re.search(r"< \(?steps", source) or re.search(r"\(steps \* 5\)", source), kernel.name
    # what no model chooses for a symbolic step count is a clear error: the block shape, the split
    for kernel, tiles in ((kernels.input_projection(steps, 20, 96, 80, 4), dict(k_slices=1)),
                          (kernels.weight_gradient(steps, 20, 96, 80, 4), dict(rows=rows, cols=cols, k_slices=2))):
        with pytest.raises(s_tir.ScheduleError, match="symbolic"):
            gpu_matmul(s_tir.Schedule(s_tir.renew_defs(kernel.func)), kernel, **tiles)


def test_cuda_tiled_gemm_copies_its_tiles_asynchronously_from_sm_80():
    """The tiled GEMM's default (v61): its shared tiles filled by ``cp.async`` in two stages where
    the device has it (sm_80 on), the next tile's copies in flight during this tile's multiply-adds;
    before sm_80 the plain tile, and a setting that asks for stages there is refused."""
    import tvm
    from tvm import s_tir
    from tvmrnn import kernels
    from tvmrnn.program.sequence import compile_module
    from tvmrnn.schedules import default_schedule
    kernel = kernels.input_projection(32, 20, 96, 80, 4)

    def source(arch, **tiles):
        target = tvm.target.Target({"kind": "cuda", "arch": arch, "host": "llvm"})
        func = default_schedule(kernel, target, **tiles)
        return compile_module(tvm.IRModule({"main": func}), target).mod.imports[0].inspect_source()
    for arch in ("sm_80", "sm_90"):
        text = source(arch)
        assert "cp.async.ca.shared.global" in text and "cp.async.wait_group" in text, arch
    # tvmrnn's pipeline injects the copies itself: the same kernel as TVM's own option, which runs
    # LowerAsyncDMA too (v85: Hexagon's, half of a build's pipeline time)
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": "llvm"})
    with tvm.transform.PassContext(config={"tirx.disable_cse_tir": True, "tirx.use_async_copy": True}):
        theirs = tvm.compile(tvm.IRModule({"main": default_schedule(kernel, target)}), target=target)
    assert theirs.mod.imports[0].inspect_source() == text
    assert "cp.async" not in source("sm_90", matmul=dict(async_stages=0))
    assert "cp.async" not in source("sm_75")
    with pytest.raises(s_tir.ScheduleError, match="sm_80"):
        source("sm_75", matmul=dict(async_stages=2))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell,batch,hidden", [("lstm", 3, 2048), ("gru", 1, 2050), ("rnn_tanh", 5, 2048)])
def test_cuda_wide_launched_steps_keep_8_columns_a_thread(cell, batch, hidden):
    """Launched split-K steps of 2048+ units keep 8 output columns a thread by default
    (``split_k.default_thread_columns``), each kernel the same as with ``thread_columns=8`` and
    compiled by NVCC; 2040 units, and the GEMMs over chunks of steps of 32 rows or fewer (rows of
    steps x batch: the input gradient of 4 steps x 8 rows at 2048 units; more rows take the tiled
    GEMM since v69), keep 4 (each differing from 8)."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.program.sequence import compile_module
    from tvmrnn.schedules import default_schedule, knobs
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": "llvm"})
    cell = CELLS[cell]
    steps = [kernels.recurrent_step(cell, batch, hidden, False), kernels.backward_step(cell, batch, hidden)]
    for kernel in steps:
        assert knobs.family(kernel, target) == "split_k", kernel.name
        func = default_schedule(kernel, target)
        assert func.script() == default_schedule(kernel, target, thread_columns=8).script(), kernel.name
        assert func.script() != default_schedule(kernel, target, thread_columns=4).script(), kernel.name
        compile_module(tvm.IRModule({"main": func}), target)
    narrow = kernels.recurrent_step(cell, batch, 2040, False)
    chunk = kernels.input_gradient(4, 8, 2048, 2048, len(cell.gates), False)
    assert knobs.family(kernels.input_gradient(4, 12, 2048, 2048, len(cell.gates), False), target) == "matmul"  # 48 rows
    for kernel in (narrow, chunk):
        assert knobs.family(kernel, target) == "split_k", kernel.name
        func = default_schedule(kernel, target).script()
        assert func == default_schedule(kernel, target, thread_columns=4).script(), kernel.name
        assert func != default_schedule(kernel, target, thread_columns=8).script(), kernel.name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell,batch,hidden,slices,rule", [("lstm", 256, 1024, 8, 4), ("gru", 257, 1040, 5, 5)])
def test_cuda_large_step_gemm_splits_over_blocks_with_its_epilogue_after(cell, batch, hidden, slices, rule, tmp_path,
                                                                          monkeypatch):
    """A large step's tiled GEMM (a fused epilogue: the step's gate math a kernel of its own) split
    over blocks: the partial GEMM into its slices, a kernel summing them a thread an output (the
    slice loop inside it), then the epilogue kernel. On by default (``GPU_STEP_MATMUL_K_SLICES``):
    the default splits by the rule (the LSTM's backward step at N = 256, H = 1024 in 4; the GRU's
    at N = 257, H = 1040 in 5), the knob offers the splits, and NVCC compiles an explicit one
    without spills. Off: two kernels, no ``k_slices`` knob, an explicit split refused. Run against
    torch on the GPU machine (``test_large_steps_split_over_blocks_match_torch_on_cuda``)."""
    import tvm
    from tvm import s_tir
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.program.sequence import compile_module
    from tvmrnn.schedules import cuda, default_schedule, knobs
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": "llvm"})
    kernel = kernels.backward_step(CELLS[cell], batch, hidden)
    assert knobs.family(kernel, target) == "matmul"

    def source(**tiles):
        func = default_schedule(kernel, target, **tiles)
        return compile_module(tvm.IRModule({"main": func}), target).mod.imports[0].inspect_source()

    def kernel_names(text):
        return set(re.findall(r"void __launch_bounds__\(\d+\) (\w+)\(", text))
    rows, cols, reduction = cuda.matmul_extents(kernel)
    assert cuda.matmul_k_slices(rows, cols, reduction, cuda.matmul_shape(rows, cols)) == rule
    assert len(kernel_names(source())) == 3
    assert slices in cuda.slice_variants(kernel, counts=(1, 2, 4, 5, 8))
    text = source(matmul=dict(k_slices=slices))
    assert len(kernel_names(text)) == 3 and "matmul_rf" in text  # (the slices' partial sums)
    assert "spill" not in _ptxas(text, tmp_path).replace("0 bytes spill", "")
    # the forward step of the same shape is not split by default (its tiles fill more than
    # 1 / GPU_FORWARD_STEP_FILL of the GPU's threads), and is with GPU_FORWARD_STEP_K_SLICES on
    forward = kernels.recurrent_step(CELLS[cell], batch, hidden, True)
    assert knobs.family(forward, target) == "matmul"

    def forward_source():
        func = default_schedule(forward, target)
        return compile_module(tvm.IRModule({"main": func}), target).mod.imports[0].inspect_source()
    assert len(kernel_names(forward_source())) == 2 and cuda.slice_variants(forward)
    monkeypatch.setattr(cuda, "GPU_FORWARD_STEP_K_SLICES", True)
    rows, cols, reduction = cuda.matmul_extents(forward)
    if cuda.matmul_k_slices(rows, cols, reduction, cuda.matmul_shape(rows, cols)) > 1:
        assert len(kernel_names(forward_source())) == 3
    monkeypatch.setattr(cuda, "GPU_STEP_MATMUL_K_SLICES", False)
    assert len(kernel_names(source())) == 2 and cuda.slice_variants(kernel) == []
    with pytest.raises(s_tir.ScheduleError, match="GPU_STEP_MATMUL_K_SLICES"):
        default_schedule(kernel, target, matmul=dict(k_slices=slices))


# the buffers of shared memory and registers in TVM's CUDA source (``x_shared_ptr``, ``x_shared_local_ptr_1``)
ON_CHIP = re.compile(r"(_(shared|local)_ptr(_\d+)?|^buf_dyn_shmem_ptr)$")


def _vector_buffers(source: str) -> list[str]:
    """The buffers CUDA code accesses through ``float2/4/8`` casts; every vector type in the source
    must be such a cast."""
    buffers = []
    for line in (line for line in source.splitlines() if re.search(r"\bfloat[248]\b", line)):
        cast = re.findall(r"\(float[248]\*\)\((?:\(\(float\*\))?(\w+)", line)  # (or merged dynamic shared memory)
        assert len(cast) == len(re.findall(r"\bfloat[248]\b", line)), line
        buffers += cast
    return buffers


def _ptxas(source: str, folder) -> str:
    import subprocess
    path = folder / "kernel.cu"
    path.write_text(source)
    done = subprocess.run(["nvcc", "-arch=sm_90", "-c", "-Xptxas", "-v", str(path), "-o", str(folder / "kernel.o")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stderr


def _launch_flags(rnn, tmp_path) -> tuple[int, int]:
    """(cooperative, programmatic dependent) launch flags in a build's CUDA function table: the
    exported library's device blob lists each kernel's launch parameters by name."""
    path = tmp_path / "rnn.so"
    rnn.executable.export_library(str(path))
    blob = path.read_bytes()
    return blob.count(b"tirx.use_cooperative_launch"), blob.count(b"tirx.use_programtic_dependent_launch")


@pytest.mark.parametrize("mcpu", ["x86-64-v3", "x86-64"])
def test_generic_x86_builds_match_torch(mcpu, rng):
    """AVX2 (8-lane tiles) and baseline x86-64 builds are exact too, whatever this CPU has.

    The CPU GEMM schedule picks its tiles from the target's vector width; the suite's other
    tests build for this machine's CPU (AVX-512 where present), so the 8-lane path is checked here.
    """
    import torch
    from conftest import rel_error, torch_module

    ref = torch_module("gru", 13, 37, 2, True, False).double()
    rnn = tvmrnn.build("gru", input_size=13, hidden_size=37, num_layers=2, bidirectional=True, batch_size=3,
                       target={"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    w = rnn.pack_weights({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.from_numpy(rng.standard_normal((9, 3, 13)))
    y, _, _, ws = rnn.forward_train(w, x.float())
    xr = x.clone().requires_grad_(True)
    y_ref = ref(xr)[0]
    dy = torch.from_numpy(rng.standard_normal(tuple(y_ref.shape)))
    y_ref.backward(dy)
    grads = rnn.backward(w, ws, dy.float())
    assert rel_error(y, y_ref) < 1e-4
    assert rel_error(grads["x"], xr.grad) < 1e-4
    assert rel_error(grads["weight_hh_l1_reverse"], ref.weight_hh_l1_reverse.grad) < 1e-4


@pytest.mark.parametrize("cell,mcpu", [("lstm", None), ("gru", "x86-64-v3")])
def test_weight_gradients_with_both_operands_in_panels_match_torch(cell, mcpu, rng, monkeypatch):
    """At sizes where a CPU backward packs both operands of its weight gradients (the gate
    gradients in column panels, the inputs in row panels: ``schedules.cpu.input_panel``; the
    GRU's dgx and dgh each), a 2-layer bidirectional build's gradients match float64 torch.nn, and
    are the same bits as with the inputs left in rows. Chunks of 4 and 1 steps (T=6), a second
    layer whose inputs are both directions' outputs, and AVX2 code (``mcpu``: its narrower tiles).
    (Small sizes, with the thresholds above which builds take these panels lowered.)"""
    import torch
    from conftest import rel_error, torch_module
    from tvmrnn.program import passes
    from tvmrnn.schedules import cpu
    from tvmrnn.schedules.common import vector_lanes

    monkeypatch.setattr(cpu, "INPUT_PANEL_MIN_FEATURES", 1)
    monkeypatch.setattr(cpu, "INPUT_PANEL_MIN_BATCH", 1)
    monkeypatch.setattr(passes, "TWO_GRADIENT_PACKS_MIN_UNITS", 1)

    I, H = 40, 32  # several panels of units on AVX-512 and on AVX2
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2} if mcpu else None
    ref = torch_module(cell, I, H, 2, True, False).double()
    x = torch.from_numpy(rng.standard_normal((6, 3, I)))
    xr = x.clone().requires_grad_(True)
    y_ref = ref(xr)[0]
    dy = torch.from_numpy(rng.standard_normal(tuple(y_ref.shape)))
    y_ref.backward(dy)
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=2, bidirectional=True, batch_size=3,
                       target=target, cache=False)
    kernels = rnn.programs["backward"].kernels
    assert any(k.startswith("input_panels") for k in kernels), "no input panels at these sizes"
    assert any("_r" in k for k in kernels if k.startswith("weight_gradient_panels")), vector_lanes(rnn.target)
    w = rnn.pack_weights({k: v.float() for k, v in ref.state_dict().items()})
    ws = rnn.forward_train(w, x.float())[-1]
    grads = rnn.backward(w, ws, dy.float())
    assert rel_error(grads["x"], xr.grad) < 1e-5
    for name, p in ref.named_parameters():
        assert rel_error(grads[name], p.grad) < 1e-5, name
    monkeypatch.setattr(cpu, "INPUT_PANEL_MIN_FEATURES", 10**9)
    rows = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=2, bidirectional=True, batch_size=3,
                        target=target, cache=False)
    assert not any(k.startswith("input_panels") for k in rows.programs["backward"].kernels)
    w = rows.pack_weights({k: v.float() for k, v in ref.state_dict().items()})
    plain = rows.backward(w, rows.forward_train(w, x.float())[-1], dy.float())
    for name in grads:
        assert torch.equal(torch.as_tensor(grads[name]), torch.as_tensor(plain[name])), name


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_time_loop_as_one_parallel_region_matches_torch(cell, rng):
    """``time_loop_regions=True``: each CPU time loop is one parallel region with a pool barrier
    after each step's kernel (``sequence.Program._region_loop``), and the passes stay exact,
    with both directions of a layer in one launch and with them apart. Each kernel's parallel
    loop stays in the region and calls a function of one tile (``sequence.Subroutines``, v73).
    (H = 48: whole vectors; at sizes with guarded tiles a loop stays a region a step,
    ``test_cpu_guarded_tiles_run_whole_vectors_and_a_peeled_tail``.)"""
    import torch
    from conftest import rel_error, torch_module
    from tvmrnn.program import passes

    ref = torch_module(cell, 13, 48, 1, True, False).double()
    x = torch.from_numpy(rng.standard_normal((9, 3, 13)))
    xr = x.clone().requires_grad_(True)
    y_ref = ref(xr)[0]
    dy = torch.from_numpy(rng.standard_normal(tuple(y_ref.shape)))
    y_ref.backward(dy)
    for stacked in (True, False):
        options = BuildOptions(time_loop_regions=True, stack_directions=stacked)
        rnn = tvmrnn.build(cell, input_size=13, hidden_size=48, num_layers=1, bidirectional=True, batch_size=3,
                           options=options)
        for name in ("forward", "forward_train", "backward"):
            script = rnn.programs[name].build().script()
            loops = 1 if stacked else 2  # time loops: one, or one per direction
            if passes.interleaved_projections(rnn.target, options):
                # a loop per chunk size: a forward's projection before each, a backward's gradients after
                loops *= len(passes.chunk_steps(rnn.target, options))
            assert script.count("pragma_parallel_launch_point") == loops, (name, stacked)
            assert script.count("pragma_parallel_barrier_when_finish") == loops, (name, stacked)
            assert script.count("for tile in T.parallel") == loops, (name, stacked)  # the kernels' tiles called
        w = rnn.pack_weights({k: v.float() for k, v in ref.state_dict().items()})
        y, _, _ = rnn.forward(w, x.float())
        assert rel_error(y, y_ref) < 1e-5
        y, _, _, ws = rnn.forward_train(w, x.float())
        grads = rnn.backward(w, ws, dy.float())
        assert rel_error(grads["x"], xr.grad) < 1e-5
        for name in ("weight_ih_l0", "weight_hh_l0_reverse", "bias_hh_l0"):
            assert rel_error(grads[name], getattr(ref, name).grad) < 1e-5, name


@pytest.mark.parametrize("packed", [False, True, "input panels"])
def test_cpu_gemm_blocked_for_l1_is_exact(packed, rng):
    """``cpu_gemm``'s L1 blocking (several register tiles a task, the reduction in slices outside
    them) at odd sizes: a weight gradient whose reduction (t, n) and rows do not divide evenly."""
    import numpy as np
    import tvm
    from tvmrnn import schedules as ds, kernels
    from tvmrnn.runtime.profile import time_kernel
    from tvmrnn.device import host_target

    S, N, K, H, G = 3, 5, 36, 36, 4  # 6 row tiles (AVX2 and AVX-512), a 15-row reduction
    panels = packed == "input panels"  # both operands in panels: 4 features, 12 units
    kernel = kernels.weight_gradient(S, N, K, H, G, packed=bool(packed), panel=12 if panels else 0,
                                     input_rows=4 if panels else 0)
    plain, sch = tvm.s_tir.Schedule(kernel.func), tvm.s_tir.Schedule(kernel.func)
    ds.cpu_gemm(plain, kernel, host_target(), row_block=1, red_block=0)
    ds.cpu_gemm(sch, kernel, host_target(), row_block=3, red_block=5)
    extents = [int(sch.get(loop).extent) for loop in sch.get_loops(sch.get_sblock("matmul_update"))]
    plain_extents = [int(plain.get(loop).extent) for loop in plain.get_loops(plain.get_sblock("matmul_update"))]
    assert len(extents) == len(plain_extents) + 1  # the row block's loop; t, n fused and split in 3 x 5
    assert 3 in extents and extents.count(5) >= 1 and N in plain_extents
    results = []
    time_kernel(sch.mod["main"], host_target(), number=1, repeat=1, results=results)
    dg, a, acc, dw = (r.astype(np.float64) for r in results)
    if panels:  # back from (K/4, S, N, 4) and (H/12, S, N, 12, G), the result from (H/12, K, 12, G)
        a = a.transpose(1, 2, 0, 3).reshape(S, N, K)
        dg = dg.transpose(1, 2, 0, 3, 4).reshape(S, N, H, G)
        acc, dw = (v.transpose(1, 0, 2, 3).reshape(K, H, G) for v in (acc, dw))
    if packed:
        want = acc + np.einsum("tnk,tnjg->kjg", a, dg)
    else:
        want = acc + np.einsum("tnjg,tnk->gjk", dg, a)
    assert np.abs(dw - want).max() / np.abs(want).max() < 1e-5


@pytest.mark.parametrize("batch", [1, 3])
def test_cpu_all_steps_gemms_of_few_rows_tile_whole_steps(batch, rng):
    """An all-steps GEMM of few batch rows (rows over t, n) tiles the fused (t, n) rows, whole
    steps a tile (``cpu.CPU_FUSED_ROW_TILES``): at a batch of 1 the register tile had one row (3.7x
    slower alone on a 2-core Zen 5, v66). The input gradient that adds into the buffer it writes (a
    bidirectional layer's second direction) gives what the tile down n alone gives, also where the
    buffers are one."""
    import numpy as np
    import tvm
    from tvmrnn import kernels, schedules as ds
    from tvmrnn.device import host_target
    from tvmrnn.schedules import cpu
    target = host_target()
    T, K, H, G = 16, 74, 37, 4
    for kernel in (kernels.input_projection(T, batch, K, H, G, panel=0),
                   kernels.input_gradient(T, batch, K, H, G, accumulate=True)):
        assert cpu.CPU_FUSED_ROW_TILES  # (the default since v67)
        assert "t_n_fused" in ds.default_schedule(kernel, target).script(), kernel.name
        outs = {}
        for fused in (True, False):
            old = cpu.CPU_FUSED_ROW_TILES
            cpu.CPU_FUSED_ROW_TILES = fused
            try:
                func = ds.default_schedule(kernel, target)
            finally:
                cpu.CPU_FUSED_ROW_TILES = old
            lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target).jit()
            shapes = [[int(d) for d in p.shape] for p in func.params]
            arrays = [np.random.default_rng(1 + i).standard_normal(sh).astype(np.float32) for i, sh in enumerate(shapes)]
            args = [tvm.runtime.tensor(a) for a in arrays]
            if kernel.name.endswith("_acc"):  # acc and dx one buffer
                names = [str(p.name) for p in func.params]
                args[names.index("dx")] = args[names.index("acc")]
            lib["main"](*args)
            outs[fused] = [a.numpy() for a in args]
        for a, b in zip(outs[True], outs[False]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_kernels_inlined_into_a_pass_keep_their_order(cell):
    """A one-unit, one-row bidirectional RNN: no kernel keeps a parallel loop, so LLVM inlines every
    kernel into the passes, where TVM's alias tags (TBAA) once said that one kernel's store into
    ``dh_direct`` and the next one's load from it were unrelated: the reverse direction's dh0 was
    0.40 for torch.nn's 0.15 at T = 1 (v66's fused rows; v67). Each tensor is now one variable in
    every kernel (``sequence.one_alias_root_per_tensor``); every gradient matches torch.nn's in
    float64 at T = 1-5, where the chunk kernels of 4 steps run or not."""
    import numpy as np
    import torch
    from tvmrnn.program import sequence
    assert sequence.ONE_ALIAS_ROOT_PER_TENSOR and sequence.LLVM_TBAA
    torch.manual_seed(0)
    ref = getattr(torch.nn, cell.upper())(1, 1, bidirectional=True).double()
    params = tvmrnn.params_from_torch(ref)
    rnn = tvmrnn.build(cell, 1, 1, batch_size=1, bidirectional=True, cache=False)
    w = rnn.pack_weights({k: v.astype(np.float32) for k, v in params.items()})
    rng = np.random.default_rng(3)
    for T in range(1, 6):
        x = rng.standard_normal((T, 1, 1)).astype(np.float32)
        dy = rng.standard_normal((T, 1, 2)).astype(np.float32)
        dhy = rng.standard_normal((2, 1, 1)).astype(np.float32)
        y, hy, cy, ws = rnn.forward_train(w, x)
        g = rnn.backward(w, ws, dy, dhy, np.zeros((2, 1, 1), np.float32) if cell == "lstm" else None)
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        h0 = torch.zeros(2, 1, 1, dtype=torch.float64, requires_grad=True)
        state = (h0, torch.zeros(2, 1, 1, dtype=torch.float64)) if cell == "lstm" else h0
        yr, out = ref(xt, state)
        hr = out[0] if cell == "lstm" else out
        ((yr * torch.tensor(dy, dtype=torch.float64)).sum() + (hr * torch.tensor(dhy, dtype=torch.float64)).sum()).backward()
        np.testing.assert_allclose(y, yr.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"y T={T}")
        np.testing.assert_allclose(g["h0"], h0.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"dh0 T={T}")
        np.testing.assert_allclose(g["x"], xt.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"dx T={T}")


def test_cpu_transpositions_in_tiles_are_exact():
    """``cpu_transpose``: the weights' packing and the packed weight gradients' way back to
    PyTorch's layout, large enough to be tiled (with and without panels, 3 and 4 gates, a 48-float
    column of 16 units x 3 gates), move every element where NumPy's transposition puts it; tiny
    ones and non-transpositions keep the pointwise rule; the tiles are knobs of their own family."""
    import numpy as np
    import tvm
    from tvmrnn import kernels
    from tvmrnn.schedules import default_schedule, knobs
    from tvmrnn.schedules.cpu import is_transposition
    from tvmrnn.runtime.profile import time_kernel
    from tvmrnn.device import host_target
    target = host_target()
    cases = [(kernels.gate_untranspose(3, 256, 96), lambda s: s.transpose(2, 1, 0)),
             (kernels.gate_untranspose(4, 128, 160, panel=16),  # (H/u, K, u, G) -> (G, H, K)
              lambda s: s.transpose(3, 0, 2, 1).reshape(4, 128, 160)),
             (kernels.gate_transpose(3, 256, 96), lambda s: s.transpose(2, 1, 0)),
             (kernels.gate_transpose(4, 128, 160, panel=16),  # (G, H, K) -> (H/u, K, G, u)
              lambda s: s.reshape(4, 8, 16, 160).transpose(1, 3, 0, 2))]
    for kernel, numpy_way in cases:
        assert is_transposition(kernel, target) and knobs.family(kernel, target) == "cpu_transpose", kernel.name
        for tiles in ({}, {"row_tile": 16, "column_tile": 32}):
            results = []
            time_kernel(default_schedule(kernel, target, **tiles), target, number=1, repeat=1, results=results)
            src, dst = results
            assert np.array_equal(dst, numpy_way(src)), (kernel.name, tiles)
    assert not is_transposition(kernels.gate_untranspose(3, 24, 5), target)  # tiny: the pointwise rule
    assert not is_transposition(kernels.copy(64, 1024), target)
    assert not is_transposition(kernels.gate_transpose(3, 256, 96), tvm.target.Target("nvidia/nvidia-h100"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("mode", ["wait", "early", "off"])
def test_cuda_programmatic_dependent_launch(mode):
    """On sm_90+ every kernel of a pass is launched with PDL (``dependent_launch``, ``wait`` by
    default): each kernel waits (``griddepcontrol.wait``) before it touches memory, so that the
    launch of the next can overlap the tail of the one before; ``early`` also lets dependents
    launch as soon as a kernel's blocks run; ``off`` launches plainly. sm_80 has no PDL and gets none.
    (Every kernel kind, stacked directions and a second layer's, at the default ``wait``; one
    layer for the other modes.)"""
    layers = dict(num_layers=2, bidirectional=True) if mode == "wait" else {}
    rnn = tvmrnn.build("gru", input_size=13, hidden_size=37, batch_size=3, **layers,
                       target="nvidia/nvidia-h100", tuning_logs=False, options=BuildOptions(dependent_launch=mode))
    source = rnn.executable.mod.imports[0].inspect_source()
    kernels = _kernel_definitions(source)
    assert len(kernels) >= (10 if layers else 5)
    waits = [k.count("griddepcontrol_wait()") for k in kernels]
    triggers = [k.count("griddepcontrol_launch_dependents()") for k in kernels]
    if mode == "off":
        assert sum(waits) == 0 and sum(triggers) == 0
    else:  # one wait on every path through each kernel, before its first load
        assert all(w >= 1 for w in waits), f"{waits.count(0)} of {len(kernels)} kernels never wait"
        for kernel in kernels:  # no global buffer (a pointer argument) touched before the wait
            signature, body = kernel.split("{", 1)
            before = body.split("griddepcontrol_wait()")[0]
            touched = [p for p in re.findall(r"\* __restrict__ (\w+)", signature) if re.search(rf"\b{p}\b", before)]
            assert not touched, f"{touched} used before the wait in {signature.strip()}"
        assert (sum(triggers) > 0) == (mode == "early")
    if mode == "wait":
        ampere = tvmrnn.build("gru", input_size=13, hidden_size=37, batch_size=3,
                              target={"kind": "cuda", "arch": "sm_80"}, tuning_logs=False,
                              options=BuildOptions(dependent_launch=mode))
        assert "griddepcontrol" not in ampere.executable.mod.imports[0].inspect_source()


def test_dependent_launch_option():
    """PDL only where the target has it (sm_90+ CUDA), in the mode asked for; a mode that is
    none of off, wait, early is refused when the options are made."""
    from tvmrnn import device
    h100, ampere, cpu = (device.resolve(t) for t in ("nvidia/nvidia-h100", {"kind": "cuda", "arch": "sm_80"}, "llvm"))
    for mode in ("wait", "early"):
        options = BuildOptions(dependent_launch=mode)
        assert device.dependent_launch(h100, options) == mode
        assert device.dependent_launch(ampere, options) is False and device.dependent_launch(cpu, options) is False
    assert device.dependent_launch(h100, BuildOptions(dependent_launch="off")) is False
    with pytest.raises(ValueError, match="options.dependent_launch: expected one of off, wait, early; got 'sometimes'"):
        BuildOptions(dependent_launch="sometimes")


@pytest.mark.parametrize("cell", ["lstm", slow("gru")])
def test_views_as_pointers_match_torch(cell, rng, monkeypatch):
    """Views whose offset is in the data pointer (``sequence._make_view(pointer=True)``, what GPU
    builds with ``shared_kernels=True``, the default, declare) address the same elements: a CPU
    build made to embed its kernels with such views (as builds whose time loops were one parallel
    region did before v73), stacked directions included (a view pair whose stride is the distance
    between them); the passes agree with PyTorch forward and backward."""
    import torch
    from conftest import rel_error, torch_module
    from tvmrnn.program import passes

    monkeypatch.setattr(passes, "kernel_sharing", lambda target, options: (True, None))
    options = BuildOptions(shared_kernels=True, stack_directions=True, time_loop_regions=True)
    ref = torch_module(cell, 13, 37, 2, True, False).double()
    rnn = tvmrnn.build(cell, input_size=13, hidden_size=37, num_layers=2, bidirectional=True, batch_size=3,
                       tuning_logs=False, options=options)
    assert all(p.view_pointers for p in rnn.programs.values())
    assert "handle_add_byte_offset" in str(rnn.programs["backward"].build())
    w = rnn.pack_weights({k: v.float() for k, v in ref.state_dict().items()})
    x = torch.from_numpy(rng.standard_normal((9, 3, 13)))
    y, _, _, ws = rnn.forward_train(w, x.float())
    xr = x.clone().requires_grad_(True)
    y_ref = ref(xr)[0]
    dy = torch.from_numpy(rng.standard_normal(tuple(y_ref.shape)))
    y_ref.backward(dy)
    grads = rnn.backward(w, ws, dy.float())
    assert rel_error(rnn.forward(w, x.float())[0], y_ref) < 1e-4
    assert rel_error(y, y_ref) < 1e-4
    assert rel_error(grads["x"], xr.grad) < 1e-4
    for name in ("weight_ih_l0", "weight_hh_l1_reverse", "bias_hh_l1"):
        assert rel_error(grads[name], getattr(ref, name).grad) < 1e-4, name


def test_a_called_kernels_tile_index_is_bounded():
    """A CPU kernel called once a tile (``sequence.Subroutines``) takes the tile's index as a
    parameter; its body runs under the index's range, so that TVM's analyzer bounds it. Unbounded,
    LowerIntrin's bound of an index into a weight panel (``tile // 4 * 2 // 3 * 89664``) passed
    int32 and the whole build failed: an LSTM backward step at N=20 H=467 on a 16-core target
    ("Literal value 32091995695488 exceeds range of int32", v89; a Xeon held-out-like shape)."""
    target = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16}
    rnn = tvmrnn.build("lstm", 467, 467, batch_size=20, target=target, cache=False, tuning_logs=False)
    called = {gvar.name_hint for gvar in rnn.programs["backward"].subroutines.functions}
    assert "backward_step_lstm_n20_h467_p48_16" in called, called


def test_cpu_kernels_compile_once_and_give_the_same_bits_as_inline(rng):
    """A CPU build calls each kernel as a function of the module (``sequence.Subroutines``), so
    LLVM compiles each parallel loop once, not once per call site (layer, direction, chunk size):
    far fewer outlined loops than with the kernels embedded at each call site
    (``shared_kernels=False``, the build before v31), and the same bits from every pass. (Counted
    with a region a step: with a time loop as one region, the default since v74, each call site
    keeps its parallel loop and calls the kernel's tile, ``test_time_loop_as_one_parallel_region_matches_torch``;
    its bits are checked here too.)"""
    from conftest import built
    called = built("gru", 1, True, True, options=BuildOptions(time_loop_regions=False))
    inline = built("gru", 1, True, True, options=BuildOptions(shared_kernels=False, time_loop_regions=False))
    regions = built("gru", 1, True, True)
    assert all(p.subroutines is not None for p in (*called.programs.values(), *regions.programs.values()))
    assert all(p.subroutines is None for p in inline.programs.values())

    def loops(rnn):
        ir = rnn.executable.mod.inspect_source("ll")
        return len(re.findall(r"^define .*@__tvm_parallel_lambda", ir, re.M))
    assert 0 < 2 * loops(called) < loops(inline), (loops(called), loops(inline))
    params = {s.name: rng.standard_normal(s.torch_shape).astype(np.float32) * 0.3 for s in called.config.layout.slots}
    x = rng.standard_normal((3, 21, 13)).astype(np.float32)  # batch first
    dy = rng.standard_normal((3, 21, 2 * 37)).astype(np.float32)
    out = {}
    for name, rnn in (("called", called), ("inline", inline), ("regions", regions)):
        w = rnn.pack_weights(params)
        y, hy, _, ws = rnn.forward_train(w, x)
        out[name] = [rnn.forward(w, x)[0], y, hy, *rnn.backward(w, ws, dy).values()]
    for other in ("called", "regions"):
        for a, b in zip(out[other], out["inline"]):
            assert np.array_equal(np.asarray(a), np.asarray(b)), other


def _host_kernel_names(rnn) -> set[str]:
    """The kernels the host code launches (by name, as string constants of its LLVM IR)."""
    ir = rnn.executable.mod.inspect_source("ll")
    return set(re.findall(r'c"((?:forward|forward_train|backward|pack_weights)_kernel(?:_\d+)?)\\00"', ir))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_shared_kernels(tmp_path):
    """``shared_kernels=True`` (the default): a GPU build compiles each distinct kernel once and
    launches it from every call site (other layers and directions pass other pointers), at most half
    as many kernels as with ``shared_kernels=False`` (views at offsets compiled in); every kernel the
    host launches is defined, few definitions are the same code, the persistent forwards stay one
    kernel per layer, and nvcc compiles the source."""
    sizes = dict(input_size=24, hidden_size=40, num_layers=2, bidirectional=True, batch_size=4)
    built = {}
    for shared in (False, True):
        rnn = tvmrnn.build("lstm", **sizes, target="nvidia/nvidia-h100", tuning_logs=False,
                           options=BuildOptions(persistent="auto", chunk_steps=(1,), shared_kernels=shared))
        source = rnn.executable.mod.imports[0].inspect_source()
        definitions = _kernel_definitions(source)
        names = [re.match(r"\s*void\s+(?:__launch_bounds__\(\d+\)\s*)?(\w+)", d).group(1) for d in definitions]
        bodies = [d.replace(n, "K", 1) for d, n in zip(definitions, names)]
        launched = _host_kernel_names(rnn)
        assert launched and launched <= set(names), launched - set(names)
        built[shared] = (names, bodies, source)
    (names_off, _, _), (names_on, bodies_on, source_on) = built[False], built[True]
    assert len(names_on) * 2 <= len(names_off), (len(names_on), len(names_off))
    # what stays twice is code whose TIR differs only where CUDA does not show it (the extent a
    # kernel declares for a flat parameter it indexes the same way): 8 of 68 at 3 layers
    assert len(set(bodies_on)) >= 0.8 * len(bodies_on), (len(set(bodies_on)), len(bodies_on))
    # an accumulating kernel's input and output are one view: one pointer, not two __restrict__ ones
    accumulating = 0
    for definition in _kernel_definitions(source_on):
        params = [re.sub(r"_ptr$", "", p) for p in re.findall(r"\*\s*(?:__restrict__\s+)?(\w+)", definition.split("{", 1)[0])]
        for name in params:
            if name.endswith("_acc"):
                accumulating += 1
                tensor = name[:-len("acc")]
                assert [p for p in params if p.startswith(tensor)] == [name], params
    assert accumulating
    _ptxas(source_on, tmp_path)
    # one direction: every pass's time loops are persistent (the backward's small split-K steps
    # too), one kernel per layer and pass (their views stay offsets), launched cooperatively
    # (layer after layer: the default's inference wavefront has a kernel for each set of layers
    # its waves run, tests/test_wavefront.py)
    rnn = tvmrnn.build("lstm", **dict(sizes, bidirectional=False), target="nvidia/nvidia-h100", tuning_logs=False,
                       options=BuildOptions(persistent="auto", chunk_steps=(1,), shared_kernels=True,
                                            layer_wavefront=False))
    definitions = _kernel_definitions(rnn.executable.mod.imports[0].inspect_source())
    assert all(rnn.programs[p].uses_persistent_loops for p in ("forward", "forward_train", "backward"))
    # 4 rows, H = 40: blocks of row groups, a row a block, each holding every weight, whose threads
    # meet at __syncthreads: no grid barrier (common.GPU_ROW_GROUP_STEPS; the backward's step too)
    persistent = [d for d in definitions if "for (int step = 0; step < " in d]
    # (and no cooperative launch: the blocks need not be resident together)
    assert len(persistent) == 6 and rnn.persistent_blocks == 4 and not any("wait_until" in d for d in persistent)
    assert _launch_flags(rnn, tmp_path)[0] == 0
    # with a grid barrier (8 blocks asked for), the 6 persistent kernels are launched cooperatively
    rnn = tvmrnn.build("lstm", **dict(sizes, bidirectional=False), target="nvidia/nvidia-h100", tuning_logs=False,
                       options=BuildOptions(persistent="auto", chunk_steps=(1,), shared_kernels=True,
                                            persistent_blocks=8, layer_wavefront=False))
    assert rnn.persistent_blocks == 8 and _launch_flags(rnn, tmp_path)[0] == 6


def test_cuda_tf32_build_puts_the_all_steps_gemms_on_tensor_cores():
    """``allow_tf32``: the all-steps GEMMs become TF32 workloads (their own kernels, tensor-core
    ``mma.sync``); the per-step kernels stay fp32; without it no TF32 instruction appears. CPU
    builds ignore it; a non-bool is refused."""
    mma = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
    tf32 = tvmrnn.build("gru", 13, 37, num_layers=2, bidirectional=True, batch_size=3,
                        target="nvidia/nvidia-h100", tuning_logs=False, allow_tf32=True)
    assert tf32.allow_tf32 and "allow_tf32=True" in repr(tf32)
    assert mma in tf32.executable.mod.imports[0].inspect_source()
    on_tensor_cores = {k for k, how in tf32.schedules.items() if how == "tf32"}
    assert {k.split("_t")[0] for k in on_tensor_cores} == {"input_projection", "input_gradient", "weight_gradient"}
    assert not any(k.startswith(("recurrent_step", "backward_step")) and k in on_tensor_cores for k in tf32.schedules)
    fp32 = tvmrnn.build("gru", 13, 37, num_layers=1, batch_size=3, target="nvidia/nvidia-h100", tuning_logs=False)
    assert not fp32.allow_tf32 and "tf32" not in fp32.executable.mod.imports[0].inspect_source()
    assert not tvmrnn.build("gru", 13, 37, batch_size=3, tuning_logs=False, allow_tf32=True).allow_tf32
    with pytest.raises(TypeError, match="allow_tf32"):
        tvmrnn.build("gru", 13, 37, batch_size=3, allow_tf32=1)


def test_builds_for_other_gpus_fit_their_shared_memory():
    """Builds for an A100 (sm_80: 108 SMs, 163 KB a block) and an L40S (sm_89: 99 KB) compile here
    within those limits (the build checks every kernel's shared memory against the device model).
    Where a persistent kernel's template asks for more than the device has (the L40S at batch 1,
    H = 800), the build says so and builds without persistent kernels rather than failing."""
    a100 = tvmrnn.build("lstm", input_size=800, hidden_size=800, batch_size=20,
                        target={"kind": "cuda", "arch": "sm_80"}, tuning_logs=False)
    assert a100.persistent_blocks == 108 and a100.config.options.persistent == "auto"
    with pytest.warns(RuntimeWarning, match="does not fit this GPU.*building without persistent kernels"):
        l40s = tvmrnn.build("lstm", input_size=800, hidden_size=800, batch_size=1,
                            target={"kind": "cuda", "arch": "sm_89"}, tuning_logs=False)
    assert l40s.persistent_blocks is None and l40s.config.options.persistent == "off"


def test_persistent_row_tiles_fit_the_device():
    """The persistent row tile keeps within the blocks that may be resident and the shared memory a
    block may have (weights and rows staged), keeps any given knob value, and is None where
    nothing fits (then the time loop runs one launch a step)."""
    from tvmrnn.schedules.row_tiles import persistent_row_tiles
    for rows, units, inner, reduction, problems, blocks, budget in [
            (256, 256, 4, 256, 1, 132, 227 * 1024), (131, 360, 1, 360, 1, 132, 227 * 1024),
            (200, 100, 3, 100, 2, 108, 163 * 1024), (128, 512, 4, 512, 1, 132, 227 * 1024),
            (257, 96, 4, 96, 2, 142, 99 * 1024)]:
        for given in ({}, dict(thread_rows=1), dict(unit_threads=16), dict(row_threads=4)):
            tile = persistent_row_tiles(rows, units, inner, reduction, problems, blocks, budget, **given)
            if tile is None:
                continue
            tr, tu, rt, ut, chunk = tile
            assert problems * -(-rows // (rt * tr)) * -(-units // (ut * tu)) <= blocks, (rows, units, given, tile)
            assert 4 * reduction * ut * tu * inner + 4 * (chunk or reduction) * rt * tr <= budget and rt * ut <= 1024
            assert chunk <= reduction
            assert all(dict(thread_rows=tr, thread_units=tu, row_threads=rt, unit_threads=ut)[k] == v
                       for k, v in given.items())
    assert persistent_row_tiles(256, 256, 4, 256, 1, 132, 227 * 1024) == (4, 1, 4, 32, 0)  # 5.4 us on the H200 (v34)
    # an LSTM backward step at H = 384: 1,536-long rows beside a block's weights do not fit whole,
    # so they are staged in chunks of the reduction, as large as fit (32 KB: 20.5 us a step on the
    # H200, v55; 8 KB chunks were 6% slower in the pass); rows whole where they fit (the GRU's 3H).
    # 256 threads of 2 rows each (row_tiles.BACKWARD_PERSISTENT_THREADS, v83; 128 of 4 before)
    assert persistent_row_tiles(160, 384, 1, 1536, 1, 132, 227 * 1024, backward=True) == (2, 1, 8, 32, 512)
    assert persistent_row_tiles(160, 384, 1, 1536, 1, 132, 227 * 1024) == (4, 1, 4, 32, 512)  # (one gate, forward)
    assert persistent_row_tiles(160, 384, 1, 1152, 1, 132, 227 * 1024).row_chunk == 0
    # nothing fits where a block's weights alone do not (a 99 KB block, an LSTM's 4 x 2048 reduction)
    assert persistent_row_tiles(160, 2048, 1, 8192, 1, 142, 99 * 1024) is None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_backward_steps_of_few_rows_split_their_reduction_in_padded_slices(tmp_path, monkeypatch):
    """A backward step of 32-127 rows and 2^24 multiply-adds or more takes the tiled GEMM
    (``common.GPU_BACKWARD_MATMUL_ROWS``); its reduction of G x H gate gradients, at an odd H no
    multiple of 16, is split over blocks in slices whose last 16-long tile is padded with zeros
    (``cuda.GPU_MATMUL_PADDED_SLICES``: without it, no split, 22 blocks at N = 57, H = 645). Three
    kernels, compiled without spills; the slices of reductions that whole tiles divide unchanged.
    Run against torch on the GPU machine (``test_backward_steps_of_few_rows_on_padded_slices_match_torch_on_cuda``)."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import cuda, default_schedule, knobs
    target = tvm.target.Target("nvidia/nvidia-h100")
    kernel = kernels.backward_step(CELLS["lstm"], 57, 645)
    assert knobs.family(kernel, target) == "matmul"
    rows, cols, reduction = cuda.matmul_extents(kernel)
    shape = cuda.matmul_shape(rows, cols)
    assert (rows, cols, reduction) == (57, 645, 2580)
    assert cuda.matmul_k_slices(rows, cols, reduction, shape) == 1  # no whole tiles
    assert cuda.matmul_k_slices(rows, cols, reduction, shape, padded=True) == 10
    assert cuda.matmul_k_slices(257, 1040, 3120, cuda.matmul_shape(257, 1040), padded=True) == 5  # whole tiles first
    assert cuda.slice_variants(kernel) == [1, 2, 4, 5, 10]  # tuning's counts: those that divide 2580
    default_schedule(kernel, target, matmul=dict(k_slices=4))
    source = tvm.compile(tvm.IRModule({"main": default_schedule(kernel, target)}), target=target).mod.imports[0].inspect_source()
    names = set(re.findall(r"__launch_bounds__\(\d+\) (\w+)\(", source))
    assert len(names) == 3 and "matmul_rf" in source, names
    assert re.search(r"blockIdx\.z", source)
    assert " 0 bytes spill stores" in _ptxas(source, tmp_path)
    monkeypatch.setattr(cuda, "GPU_MATMUL_PADDED_SLICES", False)
    source = tvm.compile(tvm.IRModule({"main": default_schedule(kernel, target)}), target=target).mod.imports[0].inspect_source()
    assert len(set(re.findall(r"__launch_bounds__\(\d+\) (\w+)\(", source))) == 2
    assert cuda.slice_variants(kernel) == []


def test_large_steps_take_the_tiled_gemm_then_their_epilogue(tmp_path, monkeypatch):
    """A step of 128 rows or more past row tiles' units, with 2^18 outputs or more (a backward
    step: 2^16; not persistent), takes the tiled GEMM into a buffer of its own and its epilogue as
    a second kernel (``schedules.common._gpu_kind``): two kernels (three where the rule splits a
    backward step's reduction over blocks), the first with the GEMM's 128-bit shared-memory loads
    and no gate math, compiled without spills; the template's space holds the default, and its listed
    variants build. A step of both directions takes it from 64 rows a direction (128 in all). Fewer
    rows, or a persistent step, keep their templates."""
    import re
    import tvm
    import tvm_ffi
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import apply, cuda, default_schedule, knobs
    from tvmrnn.schedules.variants import variants
    from tvmrnn.tune import spaces
    from tvmrnn.tune.records import workload
    target = tvm.target.Target("nvidia/nvidia-h100")
    for kernel in (kernels.recurrent_step(CELLS["lstm"], 256, 1024, train=True),
                   kernels.recurrent_step(CELLS["gru"], 130, 700, train=False, directions=2, masked=True),
                   kernels.backward_step(CELLS["gru"], 512, 1030),
                   # both directions stacked, 64 rows or more each and 128 in all (v66)
                   kernels.recurrent_step(CELLS["lstm"], 67, 1024, train=False, directions=2),
                   kernels.backward_step(CELLS["gru"], 64, 1024, directions=2)):
        assert knobs.family(kernel, target) == "matmul", kernel.name
        source = tvm.compile(tvm.IRModule({"main": default_schedule(kernel, target)}),
                             target=target).mod.imports[0].inspect_source()
        names = sorted(set(re.findall(r"__launch_bounds__\(\d+\) (\w+)\(", source)))
        rows, cols, reduction = cuda.matmul_extents(kernel)
        split = reduction > cols and cuda.matmul_k_slices(rows, cols, reduction, cuda.matmul_shape(rows, cols)) > 1
        assert len(names) == 2 + split, names  # (a backward step's slices summed by a kernel of their own)
        gemm = source.split(names[0] + "(", 2)[2].split('extern "C"')[0]
        assert "float4" in gemm and "tanhf" not in gemm and "__expf" not in gemm and "expf" not in gemm
        report = _ptxas(source, tmp_path)
        assert " 0 bytes spill stores" in report, report
        shapes = variants(kernel, target)
        assert len(shapes) > 3
        assert any("k_slices" in v.get("matmul", {}) for v in shapes) == bool(cuda.slice_variants(kernel))
        for tiles in shapes[1:4]:
            default_schedule(kernel, target, **tiles)
        mod = workload(kernel)
        direct = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
        apply(direct, kernel, target)
        found = spaces.knob_schedule(mod, kernel, target, knobs.seeded_settings(kernel, target)[0])
        assert tvm_ffi.structural_equal(found.mod, direct.mod), kernel.name
    assert knobs.family(kernels.recurrent_step(CELLS["lstm"], 127, 1024, train=False), target) == "split_k"
    assert knobs.family(kernels.backward_step(CELLS["lstm"], 200, 1024), target) == "matmul"  # 2^16 outputs or more
    # fewer than 128 rows: the tiled GEMM from GPU_BACKWARD_MATMUL_ROWS (32) rows and 2^24 multiply-adds (v78)
    assert knobs.family(kernels.backward_step(CELLS["lstm"], 127, 1024), target) == "matmul"
    assert knobs.family(kernels.backward_step(CELLS["lstm"], 31, 1024), target) == "split_k"
    assert knobs.family(kernels.backward_step(CELLS["lstm"], 32, 360), target) == "split_k"  # 16.6 M
    from tvmrnn.schedules import common
    monkeypatch.setattr(common, "GPU_BACKWARD_MATMUL_ROWS", 10 ** 9)
    assert knobs.family(kernels.backward_step(CELLS["lstm"], 127, 1024), target) == "split_k"
    monkeypatch.undo()
    # stacked directions: 128 rows in all but fewer than GPU_STACKED_MATMUL_ROWS a direction stay split-K,
    # and so does one direction of 64 rows
    assert knobs.family(kernels.recurrent_step(CELLS["lstm"], 63, 2048, train=False, directions=2), target) == "split_k"
    assert knobs.family(kernels.recurrent_step(CELLS["lstm"], 64, 2048, train=False), target) == "split_k"
    # a stacked step's split counts one direction's tiles by default; with
    # cuda.GPU_STEP_SLICES_COUNT_DIRECTIONS each direction takes the slices of a one-direction step
    # of twice the rows

    def grid_z(kernel):  # slices x directions
        script = default_schedule(kernel, target).script()
        return int(re.search(r'T\.thread_binding\((\d+), thread="blockIdx\.z"\)', script).group(1))
    assert not cuda.GPU_STEP_SLICES_COUNT_DIRECTIONS
    one = grid_z(kernels.backward_step(CELLS["lstm"], 128, 1024))
    by_one_direction = grid_z(kernels.backward_step(CELLS["lstm"], 64, 1024, directions=2))
    monkeypatch.setattr(cuda, "GPU_STEP_SLICES_COUNT_DIRECTIONS", True)
    assert one > 1 and grid_z(kernels.backward_step(CELLS["lstm"], 64, 1024, directions=2)) == 2 * one
    assert by_one_direction > 2 * one  # (64 rows a direction: more slices than 128 rows take)
    monkeypatch.setattr(cuda, "GPU_STEP_SLICES_COUNT_DIRECTIONS", False)
    # forward steps from 2^18 outputs: a GRU's at 128 x 3 x 600 (230,400) stays split-K, an Elman's at 200 x 768 too
    assert knobs.family(kernels.recurrent_step(CELLS["gru"], 128, 600, train=False), target) == "split_k"
    assert knobs.family(kernels.recurrent_step(CELLS["rnn_tanh"], 200, 768, train=False), target) == "split_k"
    # split-K at a prime row count: one row a thread, at most 1,024 threads a block (2,056 were refused at
    # launch): a backward step of 257 x 1000 outputs, split-K where the tiled GEMM's threshold is above it
    from tvmrnn.schedules import common
    monkeypatch.setattr(common, "GPU_BACKWARD_STEP_MATMUL_OUTPUTS", 1 << 18)
    prime = kernels.backward_step(CELLS["lstm"], 257, 1000)
    assert knobs.family(prime, target) == "split_k"
    source = tvm.compile(tvm.IRModule({"main": default_schedule(prime, target)}), target=target).mod.imports[0].inspect_source()
    assert max(int(t) for t in re.findall(r"__launch_bounds__\((\d+)\)", source)) <= 1024
    # a large step's loop persistent (split-K's form) below GPU_PERSISTENT_SPLIT_K_ROWS rows, launches from
    # them, and from 128 rows where the launched GEMM is split over blocks (cuda.GPU_FORWARD_STEP_FILL: the
    # GRU's at N = 128, H = 1024 in 4; at H = 784 no count of slices cuts the reduction into 16-long tiles)
    import tvmrnn
    from tvmrnn.schedules import common
    assert common.GPU_PERSISTENT_SPLIT_K_ROWS > 128
    unsplit = tvmrnn.build("gru", input_size=8, hidden_size=784, batch_size=128, target=target, cache=False)
    split = tvmrnn.build("gru", input_size=8, hidden_size=1024, batch_size=128, target=target, cache=False)
    more = tvmrnn.build("lstm", input_size=8, hidden_size=768, batch_size=192, target=target, cache=False)
    assert unsplit.programs["forward"].uses_persistent_loops
    assert not split.programs["forward"].uses_persistent_loops and not more.programs["forward"].uses_persistent_loops
    assert knobs.family(more.programs["forward"].kernels["recurrent_step_lstm_infer_n192_h768"], target) == "matmul"
    for rnn, name, slices in ((split, "recurrent_step_gru_infer_n128_h1024", 4),
                              (more, "recurrent_step_lstm_infer_n192_h768", 1)):
        step = rnn.programs["forward"].kernels[name]
        source = rnn.executable.mod.imports[0].inspect_source()
        assert len(set(re.findall(rf"__launch_bounds__\(\d+\) ({name}\w*)\(", source))) == 2 + (slices > 1), name
        assert f"{name}_persistent" not in rnn.schedules and name in rnn.schedules  # (called kernels only)
        rows, cols, reduction = cuda.matmul_extents(step)
        assert cuda.forward_step_k_slices(rows, cols, reduction, cuda.matmul_shape(rows, cols)) == slices
    # a forward step filling more of the threads, up to 1 / GPU_FORWARD_STEP_LONG_FILL, split in slices of
    # GPU_FORWARD_STEP_LONG_SLICE or longer (v65): the GRU's at N = 256, H = 2048 in 2; the LSTM's at N = 256,
    # H = 1024 (slices of 512) not
    for cell, n, h, slices in (("gru", 256, 2048, 2), ("lstm", 256, 1024, 1), ("lstm", 192, 2048, 2)):
        step = kernels.recurrent_step(CELLS[cell], n, h, train=False)
        rows, cols, reduction = cuda.matmul_extents(step)
        shape = cuda.matmul_shape(rows, cols)
        assert cuda.matmul_k_slices(rows, cols, reduction, shape, fill=cuda.GPU_FORWARD_STEP_FILL) == 1
        assert cuda.forward_step_k_slices(rows, cols, reduction, shape) == slices, (cell, n, h)
        assert common.splits_over_blocks(default_schedule(step, target)) == (slices > 1), (cell, n, h)
    assert "recurrent_step_gru_infer_n128_h784" not in unsplit.schedules  # (scheduled to decide, not called)
    # tuning's tasks are the kernels these builds call
    from tvmrnn.tune.tasks import extract_tasks
    for rnn in (unsplit, split):
        tasks = {t.kernel.name for t in extract_tasks([rnn.config], target=target)}
        assert tasks == {name for p in rnn.programs.values() for name in p.kernels}
    # a persistent form that fit no block count is not listed (both directions' weights at H = 1024)
    both = tvmrnn.plan("gru", input_size=8, hidden_size=1024, batch_size=128, bidirectional=True, target=target)
    assert not both.programs["forward"].uses_persistent_loops
    assert "recurrent_step_gru_infer_n128_h1024_d2" in both.schedules
    assert not any(name.endswith("_persistent") for name in both.schedules) and set(both.records) <= set(both.schedules)
    assert knobs.family(kernels.recurrent_step(CELLS["lstm"], 256, 512, train=False), target) == "row_tiles"
    persistent = kernels.persistent(kernels.recurrent_step(CELLS["lstm"], 256, 1024, train=False), 132)
    assert knobs.family(persistent, target) == "persistent"


def test_a_failed_check_in_a_called_kernel_stops_the_pass(monkeypatch, rng):
    """CPU passes call their kernels as functions (``sequence.Subroutines``); a check that fails
    inside one (TVM's buffer checks, the AMX intrinsic's strides) returns nonzero, and the pass
    raises instead of going on with that kernel's outputs unwritten (it went on, v43)."""
    import tvm
    from tvmrnn.program import sequence
    hoist = sequence._hoist_scratch

    def failing(body, scratch):
        check = tvm.tirx.AssertStmt(tvm.tirx.const(False, "bool"), tvm.ir.StringImm("RuntimeError"),
                                    [tvm.ir.StringImm("injected")])
        return tvm.tirx.SeqStmt([check, hoist(body, scratch)])
    monkeypatch.setattr(sequence, "_hoist_scratch", failing)
    rnn = tvmrnn.build("gru", input_size=6, hidden_size=8, batch_size=2, cache=False, tuning_logs=False,
                       options=BuildOptions(shared_kernels=True))
    import torch
    params = {k: v.numpy() for k, v in torch.nn.GRU(6, 8).state_dict().items()}
    with pytest.raises(RuntimeError, match="a check in kernel .* failed"):
        rnn.pack_weights(params)  # (a pass too: its kernels are called)


def test_tensor_core_staging_rows_take_the_padding_asked_for():
    """``stage_pad`` (the ``matmul_tf32`` template's knob) pads the rows of the accumulators'
    staging tile, where the fragments' stores otherwise meet eight rows in one bank: the
    storage alignment has to sit on the tensorized store (tensorize dropped one set before it,
    which is why the tiles never had it)."""
    import tvm
    from tvm import s_tir
    from tvmrnn import kernels
    from tvmrnn.cells import get_cell
    from tvmrnn.program.sequence import compile_module
    from tvmrnn.schedules import cuda
    kernel = kernels.tf32(kernels.recurrent_step(get_cell("lstm"), 128, 1024, train=False), "float16")
    pitch = {}
    for pad in (0, 4):
        sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
        cuda.gpu_matmul_tf32(sch, kernel, tile=dict(stage_pad=pad))
        source = compile_module(sch.mod, tvm.target.Target("nvidia/nvidia-h100")).mod.imports[0].inspect_source()
        stores = re.findall(r"\(\(float\*\)buf_dyn_shmem_ptr\)\[[^=]*reg[^=]*\] =", source)
        pitch[pad] = {int(p) for s in stores for p in re.findall(r"threadIdx.x\) >> 2\) \* (\d+)", s)}
    assert pitch == {0: {64}, 4: {68}}, pitch


def test_cells_whose_gate_gradients_are_shared_sum_their_bias_gradient_once(rng):
    """Where a cell's input and recurrent GEMMs take the same gate gradients (the LSTM, the Elman
    RNN), b_ih's and b_hh's gradients are one column sum, taken once a chunk and copied at the end
    (``passes.SHARED_BIAS_GRADIENTS``); the GRU's differ (its n gate's) and keep two. Counted on
    both targets, and the gradients matched against torch.nn in float64 (both directions, two
    layers, a chunk ladder of several sizes)."""
    def calls(rnn, T, prefix):
        return sum(n for k, n in rnn.programs["backward"].calls(T).items() if k.startswith(prefix))
    for target in ("llvm", "nvidia/nvidia-h100"):
        kw = dict(target=target, tuning_logs=False)
        lstm = tvmrnn.plan("lstm", 12, 16, batch_size=3, num_layers=2, bidirectional=True, **kw)
        gru = tvmrnn.plan("gru", 12, 16, batch_size=3, **kw)
        lstm_sums, gru_sums = calls(lstm, 21, "bias_gradient"), calls(gru, 21, "bias_gradient")
        assert lstm_sums == 2 * gru_sums > 0, (target, lstm_sums, gru_sums)  # 4 directions x 1 sum; 1 x 2
        assert calls(lstm, 21, "copy_4x16") == 4, target  # (G, H): a copy per direction and layer
    _check("lstm", 2, True, False, 21, rng, hidden=16, input_size=12, batch=3, tol=1e-5)
    _check("rnn_tanh", 1, False, False, 21, rng, hidden=16, input_size=12, batch=3, tol=1e-5)


def test_bias_gradient_reads_along_memory_and_fills_the_gpu():
    """The bias gradient (``db[g, j] += sum dg[t, n, j, g]``) on a GPU: consecutive threads take
    consecutive addresses of ``dg`` (the gates innermost, as it is laid out), and few outputs
    (an LSTM at H = 128: 512) get narrow blocks, enough of them for half the SMs (16 blocks of
    32 columns took 133 us of a 2.3 ms training pass on the H200, v56); many keep 32 columns."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.schedules import default_schedule
    from tvmrnn.schedules.cuda import column_sum_tile
    assert column_sum_tile(3200, 132) == (32, 8) and column_sum_tile(512, 132) == (8, 32)
    assert column_sum_tile(100, 132) == (8, 32) and column_sum_tile(2112, 132) == (32, 8)
    target = tvm.target.Target("nvidia/nvidia-h100")
    for H, blocks, columns in ((128, 64, 8), (800, 100, 32)):
        script = default_schedule(kernels.bias_gradient(32, 16, H, 4), target).script()
        loops = {tag: (var, int(n)) for var, n, tag in
                 re.findall(r"for (\w+) in T.thread_binding\((\d+), thread=\"(\w+\.\w)\"", script)}
        assert loops["blockIdx.x"][1] == blocks and loops["threadIdx.x"][1] == columns
        assert loops["threadIdx.y"][1] == 256 // columns
        g = re.search(r"v_g = T.axis.spatial\(4, ([^\n]*)\)\n", script).group(1)
        # the gate (dg's last index) follows threadIdx.x: g = (... + x) % 4
        assert loops["threadIdx.x"][0] in g and "% 4" in g, g


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell, rows, hidden, gates", [("lstm", 128, 96, 4), ("gru", 130, 128, 3)])
def test_gate_threads_template(cell, rows, hidden, gates, tmp_path):
    """``gpu_row_tiles(gate_threads=True)`` on a persistent step of independent blocks (a row a
    block, every unit's weights on chip): a thread a gate column (G x H threads), each summing
    its one output in a register over the whole reduction, reading its weights one float a
    reduction index (consecutive threads, consecutive addresses); the sums meet in shared memory,
    the gate math runs on H of the threads after a barrier; the step's input projection, cell
    state and hidden state are staged together first. It compiles without spills. A tile it does
    not fit (blocks that split the units: LSTM H = 184, whose gate threads keep their weights in
    registers, test_gate_threads_over_the_rows_of_blocks_that_split_the_units) is refused by name.
    (Gate threads without the weights in registers are the default only at two or more rows a
    block: on the H200 they were faster there and slower alone at one row, v58, v59.)"""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import default_schedule
    target = tvm.target.Target("nvidia/nvidia-h100")
    step = kernels.persistent(kernels.recurrent_step(CELLS[cell], rows, hidden, train=False), 132)
    func = default_schedule(step, target, gate_threads=True, register_weights=False)
    script = func.script()
    assert re.search(r"T.thread_binding\(%d, thread=\"blockIdx.x\", annotations=\{\"tvmrnn.independent_blocks\": 1\}"
                     % rows, script), "a block a row, independent"
    assert set(re.findall(r"T.thread_binding\((\d+), thread=\"threadIdx.x\"", script)) == {str(gates * hidden)}
    assert "recurrent_projection_shared_local = T.sblock_alloc_buffer((%d, %d, %d), scope=\"local\")" % (
        rows, hidden, gates) in script
    source = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
    body = source.split("extern \"C\" __global__")[-1]
    assert "__launch_bounds__(%d)" % (gates * hidden) in body
    assert "if (((int)threadIdx.x) < %d)" % hidden in body  # the gate math on a thread a unit
    report = _ptxas(source, tmp_path)
    assert " 0 bytes spill stores" in report, report
    wide = kernels.persistent(kernels.recurrent_step(CELLS["lstm"], 128, 184, train=False), 132)
    with pytest.raises(tvm.s_tir.ScheduleError, match="gate threads"):
        default_schedule(wide, target, gate_threads=True, register_weights=False)



@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_gate_threads_in_a_backward_step(tmp_path):
    """``gpu_row_tiles(gate_threads=True)`` on a persistent backward step (a row a block), whose
    reduction runs over every gate of each unit: a thread a (unit, gate), G x H threads, each
    summing its gate's H-long share (rfactor) with that share of the weights in registers, loaded
    at the loop's first step only; the partial sums meet in shared memory and the pointwise
    backward's H threads add them up after the barrier. Compiles without spills. The default at
    96 <= H < 128 only: on the H200 its gradients agreed with the plain tile's and its training
    pass was 10-12% faster for the LSTM at N = 128, H = 96 and 112 and the GRU at H = 96, 3%
    slower for the LSTM at H = 64 and the GRU at H = 128 (notes/performance.md v58, v59)."""
    import tvm
    import tvmrnn.schedules as schedules
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    cell, hidden, G = "lstm", 96, 4
    rnn = tvmrnn.build(cell, 24, hidden, batch_size=128, target="nvidia/nvidia-h100", tuning_logs=False, cache=False)
    assert rnn.programs["backward"].uses_persistent_loops  # (the default: no knob asked)
    source = rnn.executable.mod.imports[0].inspect_source()
    kernel = next(d for d in _kernel_definitions(source)
                  if re.match(r"\s*void\s+__launch_bounds__\(%d\)\s+backward_kernel\(" % (G * hidden), d))
    assert "float w_local_ptr[%d];" % hidden in kernel
    loop = kernel.split("if (step == 0) {", 1)
    assert len(loop) == 2 and "w_local_ptr[%d] = w_ptr[" % (hidden - 1) in loop[1].split("}", 1)[0]
    assert "__syncthreads();" in kernel and "matmul_rf_shared" in kernel  # the gates' partial sums
    report = _ptxas(source, tmp_path)
    backward_report = report.split("Compiling entry function 'backward_kernel'", 1)[1].split("Compiling entry", 1)[0]
    assert " 0 bytes spill stores" in backward_report and " 0 bytes stack frame" in backward_report, backward_report
    target = tvm.target.Target("nvidia/nvidia-h100")
    step = kernels.persistent(kernels.backward_step(CELLS[cell], 128, hidden), 132)
    assert "matmul_rf" not in schedules.default_schedule(step, target, gate_threads=False).script()
    for name, h in [("lstm", 64), ("lstm", 95), ("gru", 128)]:  # outside 96 <= H < 128: not the default
        step = kernels.persistent(kernels.backward_step(CELLS[name], 128, h), 132)
        assert "matmul_rf" not in schedules.default_schedule(step, target).script(), (name, h)
    assert "matmul_rf" in schedules.default_schedule(
        kernels.persistent(kernels.backward_step(CELLS["gru"], 128, 112), 132), target).script()
    # the GRU's (3 gates, its dh_prev's direct part an input of the pointwise), the kernel alone
    gru = kernels.persistent(kernels.backward_step(CELLS["gru"], 128, 70), 132)
    source = tvm.compile(tvm.IRModule({"main": schedules.default_schedule(gru, target, gate_threads=True)}),
                         target=target).mod.imports[0].inspect_source()
    assert "__launch_bounds__(210)" in source and "float w_local_ptr[70];" in source
    report = _ptxas(source, tmp_path)
    assert " 0 bytes spill stores" in report and " 0 bytes stack frame" in report, report

@pytest.mark.parametrize("cell, rows, hidden, bidirectional", [
    ("lstm", 128, 120, False), ("lstm", 200, 120, False), ("lstm", 128, 120, True), ("gru", 200, 138, False)])
def test_default_gate_threads_keep_every_pass_persistent(cell, rows, hidden, bidirectional):
    """Where a persistent tile only just fits a block's shared memory, the default takes gate
    threads only if their extra buffers (the gate sums, the staged step inputs) fit too, and a
    backward step takes them only with its weights in registers: otherwise the kernel overflows
    shared memory at build and the build falls back to one launch a step (with a warning) in every
    pass (LSTM N = 200, H = 120: 240,000 bytes, found in review)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rnn = tvmrnn.build(cell, hidden, hidden, batch_size=rows, bidirectional=bidirectional,
                           target="nvidia/nvidia-h100", tuning_logs=False, cache=False)
    assert all(rnn.programs[p].uses_persistent_loops for p in ("forward", "forward_train", "backward"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_gate_threads_over_the_rows_of_blocks_that_split_the_units(tmp_path):
    """The default of a gated forward step whose persistent tile splits the units over blocks (a
    grid barrier a step: LSTM N = 128, H = 128, whose weights do not fit one block): a thread a
    gate column of its block's 32 units (128 threads), that column's 128 weights in registers
    (copied at the loop's first step only), its 4 rows' sums in registers, the hidden state's rows
    read as 4-wide broadcasts from shared memory; no spills. Not independent blocks: the loop
    still meets at its grid barrier. ``gate_threads=False`` gives the plain tile; asked for, the
    GRU's 8 rows a block of 64 units (N = 256, H = 160: 512 (row, unit) pairs on 192 threads) loop
    the epilogue (not the default: at 8 rows a block the LSTM was 19% slower on the H200, v59).
    Asked for where a column's weights do not fit (H = 384), it is refused by name."""
    import tvm
    import tvmrnn.schedules as schedules
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    rnn = tvmrnn.build("lstm", 128, 128, batch_size=128, target="nvidia/nvidia-h100", tuning_logs=False, cache=False)
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops
    source = rnn.executable.mod.imports[0].inspect_source()
    forward = next(d for d in _kernel_definitions(source) if re.match(r"\s*void\s+__launch_bounds__\(128\)\s+forward_kernel\(", d))
    assert "float w_local_ptr[128];" in forward and "grid_barrier" in forward
    first = forward.split("for (int step = 0; step < T; ++step) {", 1)[1].split("if (step == 0) {", 1)
    assert len(first) == 2 and "w_local_ptr[127] = w_ptr[" in first[1].split("}", 1)[0]
    assert not re.search(r"w_local_ptr\[\d+\] = ", first[1].split("}", 1)[1])  # the first step only
    assert "*(float4*)(h_prev_shared_dyn_local_ptr + 12) = *(float4*)(h_prev_shared_dyn_ptr + 384);" in forward
    report = _ptxas(source, tmp_path)
    forward_report = report.split("Compiling entry function 'forward_kernel'", 1)[1].split("Compiling entry", 1)[0]
    assert " 0 bytes spill stores" in forward_report and " 0 bytes stack frame" in forward_report, forward_report
    target = tvm.target.Target("nvidia/nvidia-h100")
    step = kernels.persistent(kernels.recurrent_step(CELLS["lstm"], 128, 128, train=True), 132)
    assert "w_local" not in schedules.default_schedule(step, target, gate_threads=False).script()
    eight = kernels.persistent(kernels.recurrent_step(CELLS["gru"], 256, 160, train=False), 132)
    assert "w_local" not in schedules.default_schedule(eight, target).script()
    func = schedules.default_schedule(eight, target, gate_threads=True)
    body = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
    assert "float w_local_ptr[160];" in body
    # a backward step (its reduction over (j, g)): asked for, a thread a (unit, gate) sums that
    # gate's share over the block's rows with its H weights in registers, the G partial sums added
    # by the pointwise's threads; not a default (not yet timed on a GPU)
    back = kernels.persistent(kernels.backward_step(CELLS["lstm"], 128, 128), 132)
    assert "w_local" not in schedules.default_schedule(back, target).script()
    body = tvm.compile(tvm.IRModule({"main": schedules.default_schedule(back, target, gate_threads=True)}),
                       target=target).mod.imports[0].inspect_source()
    assert "__launch_bounds__(128)" in body and "float w_local_ptr[128];" in body and "matmul_rf_shared_ptr" in body
    with pytest.raises(tvm.s_tir.ScheduleError, match="registers"):  # 384 weights a column: too many
        schedules.default_schedule(kernels.persistent(kernels.recurrent_step(CELLS["lstm"], 160, 384, train=False),
                                                      132), target, gate_threads=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_gate_threads_with_weights_in_registers(tmp_path):
    """The default of a forward step's persistent tile of independent blocks where a thread's
    weights fit (``gpu_row_tiles``' gate threads with ``register_weights``, v58): each thread's
    column of the weights (96 floats at LSTM H = 96) in an array of its own that ptxas keeps in
    registers (no local memory, no spills), copied from global memory at the persistent loop's
    first step only (``if (step == 0)``, sequence.first_step_only); a step reads only the hidden
    state from shared memory. The knob's 0 gives the plain tile back; where a thread's weights would
    not fit its share of the registers (GRU H = 100 at 2 rows a block: 600 threads) the default is
    gate threads reading the weights from shared memory, and asking for registers is refused by name."""
    import tvm
    import tvmrnn.schedules as schedules
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    rnn = tvmrnn.build("lstm", 96, 96, batch_size=128, target="nvidia/nvidia-h100", tuning_logs=False, cache=False)
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops
    source = rnn.executable.mod.imports[0].inspect_source()
    forward = next(d for d in _kernel_definitions(source) if re.match(r"\s*void\s+__launch_bounds__\(384\)\s+forward_kernel\(", d))
    assert "float w_local_ptr[96];" in forward
    loop = forward.split("for (int step = 0; step < T; ++step) {", 1)[1]
    first = loop.split("if (step == 0) {", 1)
    assert len(first) == 2 and "w_local_ptr[95] = w_ptr[" in first[1].split("}", 1)[0]
    stores = re.compile(r"w_local_ptr\[\d+\] = ")
    assert not stores.search(first[0]) and not stores.search(first[1].split("}", 1)[1])  # the first step only
    report = _ptxas(source, tmp_path)
    forward_report = report.split("Compiling entry function 'forward_kernel'", 1)[1].split("Compiling entry", 1)[0]
    assert " 0 bytes spill stores" in forward_report and " 0 bytes stack frame" in forward_report, forward_report
    target = tvm.target.Target("nvidia/nvidia-h100")
    step = kernels.persistent(kernels.recurrent_step(CELLS["lstm"], 128, 96, train=True), 132)
    assert "w_local" in schedules.default_schedule(step, target).script()
    assert "w_local" not in schedules.default_schedule(step, target, gate_threads=False).script()
    target = tvm.target.Target("nvidia/nvidia-h100")
    # two rows a block (GRU N = 256, H = 64: 384 threads): each thread's row is exact, so the
    # block's GEMM covers its own 2 rows, one output a thread, no loop (it once covered 6, three
    # times the work); the default since the H200's A/B of that form (v59: inference 20% faster)
    two_rows = kernels.persistent(kernels.recurrent_step(CELLS["gru"], 256, 64, train=False), 132)
    func = schedules.default_schedule(two_rows, target, gate_threads=True, register_weights=True)
    body = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.imports[0].inspect_source()
    body = body.split("extern \"C\" __global__")[-1]
    assert "__launch_bounds__(384)" in body and "for (" not in body, body[:3000]
    assert "if ((((int)threadIdx.x) % 192) < 64)" in body  # the gate math: 64 threads of each row's 192
    assert "w_local" in schedules.default_schedule(two_rows, target).script()
    assert "w_local" not in schedules.default_schedule(two_rows, target, gate_threads=False).script()
    wide = kernels.persistent(kernels.recurrent_step(CELLS["gru"], 160, 100, train=False), 132)
    script = schedules.default_schedule(wide, target).script()  # 2 rows: gate threads, weights shared
    assert "w_local" not in script and "recurrent_projection_shared_local" in script
    with pytest.raises(tvm.s_tir.ScheduleError, match="registers"):
        schedules.default_schedule(wide, target, gate_threads=True, register_weights=True)


@pytest.mark.parametrize("mcpu,lanes", [("skylake-avx512", 16), ("haswell", 8)])
def test_cpu_tiles_of_odd_hidden_sizes_are_no_wider_than_a_vector(mcpu, lanes, rng):
    """Where no whole number of vectors divides the columns (H = 75: the GRU's gate-interleaved
    steps and projections, the backward's data GEMMs, the RNN), a default tile is at most one
    vector wide (``cpu.CPU_PARTIAL_TILE_VECTORS``): before v69 it was one odd LLVM vector of up to
    4 vectors' floats (45 at H = 75), which ran the GRU at T=40 N=7 H=300 9.5x slower. No float
    vector in the compiled code is wider than the lanes unless it is whole vectors (I = 27: the
    input gradient's 27 columns take 9 on AVX-512, and on AVX2 since v70 whole vectors and a peeled
    3, ``cpu.CPU_GUARDED_TILES``, which needs two vectors' columns); and, where this CPU runs the
    code, the passes match torch.nn in float64."""
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
    for cell in ("gru", "rnn_tanh"):
        rnn = built(cell, 1, False, False, input_size=27, hidden_size=75, batch_size=3, target=target)
        widths = {int(w) for w in re.findall(r"<(\d+) x float>", rnn.executable.mod.inspect_source("ll"))}
        odd = sorted(w for w in widths if w > lanes and w % lanes)
        assert not odd, f"{cell} on {mcpu}: float vectors of {odd} lanes"
    if mcpu == "skylake-avx512" and "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU does not run AVX-512 code")
    _check("gru", 1, False, False, 9, rng, target=target, hidden=75, input_size=27, batch=3)


@pytest.mark.parametrize("mcpu,lanes", [("skylake-avx512", 16), ("haswell", 8)])
def test_cpu_guarded_tiles_run_whole_vectors_and_a_peeled_tail(mcpu, lanes, rng, monkeypatch):
    """Columns that no whole number of vectors divides (H = 129 = 3 x 43; I = 37, a prime) take
    one-vector tiles with the last one peeled to the remainder (``cpu.CPU_GUARDED_TILES``): v69's
    fallback tiles were 3 floats (the backward's data GEMMs at H = 129: LSTM training 0.62x PyTorch)
    and one odd 37-float vector. The compiled code holds lane-wide vectors and none of those; and,
    where this CPU runs it, a 2-layer bidirectional LSTM matches torch.nn in float64, outputs,
    states and every gradient (so the peeled tails cover each column once). Its weight gradients'
    37, 129 and 258 rows take guarded row tiles too (``cpu.CPU_GUARDED_ROWS``, with guarded
    columns: the column tiles in parallel); the GRU of the test above, rows outermost (K = 27).
    (Since v75 an AVX-512 LSTM at H = 129 takes padded 12-unit panels instead,
    ``cpu.CPU_PADDED_PANELS``: off here, the guarded tiles are what this tests.)"""
    import torch
    from tvmrnn.schedules import cpu
    monkeypatch.setattr(cpu, "CPU_PADDED_PANELS", False)
    built.cache_clear()
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
    rnn = built("lstm", 2, True, False, input_size=37, hidden_size=129, batch_size=5, target=target)
    widths = {int(w) for w in re.findall(r"<(\d+) x float>", rnn.executable.mod.inspect_source("ll"))}
    assert lanes in widths and not widths & {3, 12, 37}, f"{mcpu}: float vectors of {sorted(widths)} lanes"
    if mcpu == "skylake-avx512" and "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU does not run AVX-512 code")
    _check("lstm", 2, True, False, 6, rng, target=target, hidden=129, input_size=37, batch=5)
    # time loops as one parallel region: a kernel with guarded tiles joins it since v79, its tile
    # loop given whole (sequence._whole_tiles: the provably whole tiles unguarded, the rest at
    # constant indices); before, LoopPartition would cut its parallel loop at lowering (the barrier
    # on one part) and such loops stayed a region a step. The same bits either way (``rnn``: CPU
    # builds' time loops are regions by default)
    from tvmrnn.program import sequence
    regions = rnn
    assert "pragma_parallel_launch_point" in regions.programs["forward"].build().script()
    monkeypatch.setattr(sequence, "WHOLE_GUARDED_TILES", False)
    per_step = tvmrnn.build("lstm", 37, 129, num_layers=2, bidirectional=True, batch_size=5, target=target,
                            options=BuildOptions(time_loop_regions=True), tuning_logs=False, cache=False)
    assert "pragma_parallel_launch_point" not in per_step.programs["forward"].build().script()
    torch.manual_seed(0)
    params = tvmrnn.params_from_torch(torch.nn.LSTM(37, 129, num_layers=2, bidirectional=True))
    x = rng.standard_normal((6, 5, 37)).astype(np.float32)
    y = regions.forward(regions.pack_weights(params), x)[0]
    assert np.array_equal(y, per_step.forward(per_step.pack_weights(params), x)[0])


@pytest.mark.parametrize("mcpu,lanes", [("skylake-avx512", 16), ("haswell", 8)])
def test_cpu_guarded_tiles_of_gates_that_do_not_divide_the_lanes(mcpu, lanes, monkeypatch, rng):
    """The GRU's 3 gates at a prime H (53) had one-unit tiles, 3 floats (H = 151: inference 3x
    slower than with this rule); since v75 (``cpu.CPU_GUARDED_GATE_TILES``) its gate-interleaved
    GEMMs take guarded tiles of lanes // 3 units, one partial vector (15 floats on AVX-512, 6 on
    AVX2), the last tile peeled. The compiled code holds those vectors (and not without the rule);
    where this CPU runs it, a 2-layer bidirectional GRU matches torch.nn in float64, outputs, states
    and every gradient."""
    from tvmrnn.schedules import cpu
    # (on AVX2 since v81 the GRU's panels are padded and its backward GEMMs take 3-vector tiles:
    # both off here, the guarded gate tiles, still theirs where neither applies, are what this tests)
    monkeypatch.setattr(cpu, "CPU_PADDED_PANELS_AVX2", False)
    monkeypatch.setattr(cpu, "CPU_WIDE_GUARDED_TILES_AVX2", False)
    target = {"kind": "llvm", "mcpu": mcpu, "num-cores": 2}
    tile = lanes // 3 * 3

    def widths(rnn):
        return {int(w) for w in re.findall(r"<(\d+) x float>", rnn.executable.mod.inspect_source("ll"))}
    # (the build _check runs below)
    assert tile in widths(built("gru", 2, True, False, input_size=37, hidden_size=53, batch_size=5, target=target)), \
        f"{mcpu}: no {tile}-float tiles"
    monkeypatch.setattr(cpu, "CPU_GUARDED_GATE_TILES", False)
    assert tile not in widths(tvmrnn.build("gru", 37, 53, num_layers=2, bidirectional=True, batch_size=5, target=target,
                                           tuning_logs=False, cache=False))
    monkeypatch.setattr(cpu, "CPU_GUARDED_GATE_TILES", True)
    if mcpu == "skylake-avx512" and "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU does not run AVX-512 code")
    _check("gru", 2, True, False, 6, rng, target=target, hidden=53, input_size=37, batch=5)


@pytest.mark.parametrize("cell,hidden,tiles,tiles_before", [("lstm", 67, 9, 17), slow("gru", 67, 5, 14),
                                                             ("rnn_tanh", 163, 6, 11)])
def test_cpu_backward_gemms_take_guarded_tiles_of_several_vectors(cell, hidden, tiles, tiles_before, monkeypatch, rng):
    """The backward's weight gradients at an H that no whole vector of units divides had guarded
    tiles of one vector (24 rows x 16 floats: 25 loads for 24 multiply-adds); since v79
    (``cpu.CPU_GUARDED_TILE_VECTORS``, ``cpu.guarded_tile_units``) an AVX-512 GEMM without a fused
    epilogue takes the fewest units that fill two vectors or more (LSTM 8 units, Elman RNN 32 columns,
    GRU 16 units = 3 vectors), the last tile peeled, where that leaves two column tiles a core: its
    parallel loop (the column tiles) says so, and tuning's ``guarded_vectors`` knob (1-4) is offered
    where the rule decides the tile (``cpu.guarded_gemm``), not at whole-vector sizes nor on step
    kernels (an Elman RNN's backward step keeps its tile and its time loops one region each). Where this CPU runs the code, a 2-layer bidirectional
    RNN matches torch.nn in float64, outputs, states and every gradient (the peeled tails cover
    each column once)."""
    from tvmrnn.schedules import cpu
    # (the weight gradients in rows: an LSTM's at such an H are summed in padded panels since v89)
    monkeypatch.setattr(cpu, "CPU_PADDED_GRADIENT_PANELS", False)
    units = cpu.guarded_tile_units
    assert (units(16, 467, 4, 16), units(16, 467, 3, 2), units(16, 467, 1, 2)) == (8, 16, 32)
    assert units(16, 236, 4, 16) == 0  # 30 tiles of 8 units: fewer than two a core of 16
    assert units(16, 467, 5, 2) == 0  # 5 vectors for whole ones
    # AVX2 since v81 (cpu.CPU_WIDE_GUARDED_TILES_AVX2): 2 vectors, the GRU's 3; before, none
    assert (units(8, 467, 4, 2), units(8, 467, 3, 2), units(8, 467, 1, 2)) == (4, 8, 16)
    monkeypatch.setattr(cpu, "CPU_WIDE_GUARDED_TILES_AVX2", False)
    assert units(8, 467, 4, 2) == 0
    monkeypatch.setattr(cpu, "CPU_WIDE_GUARDED_TILES_AVX2", True)
    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}

    def weight_gradient_tiles():
        rnn = tvmrnn.plan(cell, 37, hidden, batch_size=5, target=target, tuning_logs=False)
        program = rnn.programs["backward"]
        found = {re.search(r"T\.parallel\((\d+)", program.scheduled(name).script()).group(1)
                 for name in program.kernels if name.startswith(f"weight_gradient_packed_t16_n5_k{hidden}_")}
        return {int(t) for t in found}
    assert weight_gradient_tiles() == {tiles}
    monkeypatch.setattr(cpu, "CPU_GUARDED_TILE_VECTORS", 1)
    assert weight_gradient_tiles() == {tiles_before}
    monkeypatch.setattr(cpu, "CPU_GUARDED_TILE_VECTORS", 2)
    # tuning's knob of it (1-4 vectors; AUTO the rule), only where the default tile is guarded
    import tvm
    from tvmrnn import schedules
    from tvmrnn.schedules import knobs
    rnn = tvmrnn.plan(cell, 37, hidden, batch_size=5, target=target, tuning_logs=False)
    program = rnn.programs["backward"]
    kernel = next(k for name, k in program.kernels.items() if name.startswith(f"weight_gradient_packed_t16_n5_k{hidden}_"))
    avx512 = tvm.target.Target(target)
    assert "guarded_vectors" in [k.name for k in knobs.knobs(kernel, avx512)]
    whole = tvmrnn.plan(cell, 37, 64, batch_size=5, target=target, tuning_logs=False).programs["backward"]
    assert all("guarded_vectors" not in [k.name for k in knobs.knobs(k, avx512)]
               for name, k in whole.kernels.items() if name.startswith("weight_gradient"))
    parallel = {v: re.search(r"T\.parallel\((\d+)", schedules.default_schedule(kernel, avx512, guarded_vectors=v).script()).group(1)
                for v in (1, 2, 3, 4)}
    assert parallel[1] == str(tiles_before) and parallel[2] == str(tiles)
    # not a step kernel: an Elman RNN's backward step (no fused epilogue; one whole vector at H =
    # 208) keeps its tile, and its time loops stay one parallel region each
    elman = tvmrnn.plan("rnn_tanh", 37, 208, batch_size=5, target=target, tuning_logs=False)
    assert "pragma_parallel_launch_point" in elman.programs["backward"].build().script()
    if "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU does not run AVX-512 code")
    try:  # (its builds are the row layout's: out of the shared cache after)
        _check(cell, 2, True, False, 6, rng, target=target, hidden=hidden, input_size=37, batch=5)
    finally:
        built.cache_clear()


def test_cpu_gate_blocked_tiles_widen_past_four_vectors_where_only_one_divides(monkeypatch, rng):
    """An AVX-512 LSTM at H = 220 (= 4 x 55): of tiles of 1-4 vectors (4-16 units) only the
    one-vector tile divides the units, a register tile of 24 rows x 1 vector (24 broadcasts for
    each weight vector). Since v75 (``cpu.CPU_WIDE_TILE_VECTORS``) it takes 20-unit panels (5
    vectors, 4 rows) where that leaves ``CPU_WIDE_TILE_MIN_TILES`` column tiles (not at H = 100),
    its weight gradients the same panels; the kernels say so in their names (``_p20``), and a
    2-layer bidirectional LSTM matches torch.nn in float64, outputs, states and every gradient."""
    import tvm
    from tvmrnn.schedules import cpu
    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    avx512 = tvm.target.Target(target)
    assert cpu.weight_panel(avx512, 4, 220) == cpu.gradient_panel(avx512, 4, 220) == 20
    assert cpu.weight_panel(avx512, 4, 704) == 16
    assert cpu.weight_panel(avx512, 4, 100) == 8 and cpu.packed_units(avx512, 4, 100) == 104  # (padded panels)
    monkeypatch.setattr(cpu, "CPU_WIDE_TILE_VECTORS", 0)
    assert cpu.weight_panel(avx512, 4, 220) == 16  # (padded panels: 224 units)
    monkeypatch.setattr(cpu, "CPU_WIDE_TILE_VECTORS", 6)
    rnn = tvmrnn.plan("lstm", 37, 220, num_layers=2, bidirectional=True, batch_size=5, target=target,
                      tuning_logs=False)
    names = [name for program in rnn.programs.values() for name in program.kernels]
    assert any(n.startswith("recurrent_step_lstm_infer") and n.endswith("_p20") for n in names), names
    assert any(n.startswith("weight_gradient_panels_p20") for n in names), names
    if "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU does not run AVX-512 code")
    _check("lstm", 2, True, False, 6, rng, target=target, hidden=220, input_size=37, batch=5)


def test_cpu_backward_steps_take_the_tallest_tile_that_fills_the_accumulators(monkeypatch, rng):
    """An AVX-512 LSTM backward step over 24 rows and K = 448 (H = 423 in 64-unit panels): of its register
    tiles 6 rows x 4 vectors and 12 rows x 2 both hold 24 accumulators; since v82
    (``cpu.CPU_TALL_STEP_TILES``) the taller, 2 vectors wide (the step's parallel tiles 14 x 2, not
    7 x 4). At 5 rows the 4-vector tile stays (20 accumulators against 10). On many cores the rows are
    tiled for the cores where the tall tiles are fewer than 3 a core (``cpu.CPU_STEP_TILES_BY_CORES``:
    the least work for the busiest core, tiles of 8 accumulators at least; on 16 cores 6 x 2, 56
    tiles, where 12 x 2 gave 28; at 48 rows the tall tiles are 56 and stay, v83). The same bits."""
    import torch
    import tvm
    from tvmrnn.schedules import cpu, default_schedule

    def tile(columns, rows, lead, cores=2):
        width, accumulators = cpu.step_tile(16, columns, rows, lead, 24, cores)
        return cpu.tile_rows(rows, width, 16, accumulators), width // 16
    assert tile(448, 24, 64) == (12, 2) and tile(448, 20, 64) == (10, 2) and tile(448, 64, 64) == (8, 2)
    assert tile(448, 5, 64) == (5, 4) and tile(448, 1, 64) == (1, 4)
    assert tile(448, 24, 64, cores=16) == (6, 2) and tile(448, 48, 64, cores=16) == (12, 2)  # 56 tiles, 56 tall
    assert tile(256, 12, 64, cores=16) == (6, 2) and tile(256, 12, 64) == (12, 2)  # (2 cores: the same work, taller)
    assert tile(912, 5, 48, cores=16) == (5, 3) and tile(256, 64, 64, cores=16) == (8, 2)
    x, dy = rng.standard_normal((9, 24, 161)).astype("float32"), rng.standard_normal((9, 24, 423)).astype("float32")
    results = {}
    # (tall tiles, cores of the target): the register tile's rows unrolled and the parallel tiles
    for tall, cores, rows, tiles in ((False, 2, 6, 28), (True, 2, 12, 28), (True, 16, 6, 56)):
        monkeypatch.setattr(cpu, "CPU_TALL_STEP_TILES", tall)
        target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": cores}
        rnn = tvmrnn.build("lstm", 161, 423, batch_size=24, target=target, tuning_logs=False, cache=False)
        program = rnn.programs["backward"]
        name = next(n for n in program.kernels if n.startswith("backward_step"))
        script = default_schedule(program.kernels[name], tvm.target.Target(target)).script()
        assert re.findall(r"in T\.parallel\((\d+)", script) == [str(tiles)], (tall, cores, name)
        assert re.search(rf"T\.unroll\({rows}\)", script), (tall, cores, name)
        if "avx512f" in open("/proc/cpuinfo").read():
            torch.manual_seed(0)
            w = rnn.pack_weights(tvmrnn.params_from_torch(torch.nn.LSTM(161, 423)))
            y, *_, ws = rnn.forward_train(w, x)
            results[(tall, cores)] = rnn.backward(w, ws, dy)
    if results:
        first, *others = results.values()
        assert all(np.array_equal(first[k], other[k]) for other in others for k in first)


def test_cpu_lstm_panels_that_do_not_divide_the_units_pad_the_last(monkeypatch, rng, tmp_path):
    """An AVX-512 LSTM whose units no panel of 2-4 vectors divides (H = 4 x 31, 67, 37) had
    one-vector tiles; since v75 (``cpu.CPU_PADDED_PANELS``) its forward GEMMs take the panels that
    pad it least (at most an eighth more units), the padding's weights and biases zero, the gate
    math on the real units alone. The packed buffer grows by the padding (``Layout.packed_units``,
    the PyTorch-layout copy after it); kernels say so in their names; a 2-layer bidirectional LSTM
    matches torch.nn in float64, outputs, states and every gradient; a package of it loads with its
    layout and gives the same bits; and without the rule the build is the old one. (The suite's
    default LSTM, H = 37, runs padded 8-unit panels on AVX-512 machines.) Since v89 the weight
    gradients are summed in the same padded panels, the gate gradients packed with zeros past H."""
    import tvm
    from tvmrnn.schedules import cpu
    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    avx512 = tvm.target.Target(target)
    for h, p, u in ((124, 16, 128), (67, 12, 72), (37, 8, 40), (151, 16, 160), (20, 4, 20), (512, 16, 512)):
        assert (cpu.weight_panel(avx512, 4, h), cpu.packed_units(avx512, 4, h)) == (p, u), h
    hidden, panel, units = 124, 16, 128
    # the weight gradients in the same padded panels (v89, cpu.CPU_PADDED_GRADIENT_PANELS; in rows before)
    assert cpu.gradient_panel(avx512, 4, hidden) == panel
    monkeypatch.setattr(cpu, "CPU_PADDED_GRADIENT_PANELS", False)
    assert cpu.gradient_panel(avx512, 4, hidden) == 0
    monkeypatch.setattr(cpu, "CPU_PADDED_GRADIENT_PANELS", True)
    rnn = built("lstm", 2, True, False, input_size=29, hidden_size=hidden, batch_size=3, target=target)  # (_check's)
    layout = rnn.config.layout
    # per layer and direction 4 (Hp - H) rows more of weight_ih (29 or 2H inputs), weight_hh and 2 biases
    assert rnn.config.packed_units == units and layout.forward_total - layout.total == 8 * (units - hidden) * (
        4 * hidden + 33)
    # (the backward's copies: K = 124 and 2H = 248 inputs in 64-feature panels, padded to 128 and
    # 256 since v77, cpu.CPU_PADDED_BACKWARD_PANELS; 29 inputs as they are)
    assert rnn.config.padded_inputs == ((124, 128), (248, 256))
    assert layout.packed_total == layout.forward_total + layout.total + 4 * hidden * 2 * (4 + 8 + 4)
    names = [n for program in rnn.programs.values() for n in program.kernels]
    assert any(n.startswith("recurrent_step_lstm_infer") and f"_h{hidden}_p{panel}" in n for n in names), names
    # the chunks' gate gradients packed: the whole panels, then the padded last one (its own copy)
    assert any(n.startswith(f"weight_gradient_panels_p{panel}") and f"_h{hidden}_" in n for n in names), names
    assert any(n.startswith("gradient_panels_") and n.endswith(f"_h{hidden}_g4_p{panel}") for n in names), names
    assert any(n.startswith("gradient_panel_last_") and n.endswith(f"_h{hidden}_g4_p{panel}") for n in names), names

    def guarded_rows(plan):  # the 29-input weight gradients' tiles: as tall as they fit, the last peeled
        program = plan.programs["backward"]
        found = [program.scheduled(n).script() for n in program.kernels
                 if n.startswith(f"weight_gradient_panels_p{panel}_t16_") and "_k29_" in n]
        assert found, list(program.kernels)
        return all("pragma_loop_partition_hint" in script for script in found)
    assert guarded_rows(rnn)  # (cpu.CPU_GUARDED_PANEL_ROWS, v89; 29 has no divisor near 6 rows)
    monkeypatch.setattr(cpu, "CPU_GUARDED_PANEL_ROWS", False)
    assert not guarded_rows(tvmrnn.plan("lstm", 29, hidden, 2, True, batch_size=3, target=target, tuning_logs=False))
    monkeypatch.setattr(cpu, "CPU_GUARDED_PANEL_ROWS", True)
    monkeypatch.setattr(cpu, "CPU_PADDED_PANELS", False)
    assert cpu.packed_units(avx512, 4, hidden) == hidden
    monkeypatch.setattr(cpu, "CPU_PADDED_PANELS", True)
    if "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU does not run AVX-512 code")
    _check("lstm", 2, True, False, 7, rng, target=target, hidden=hidden, input_size=29, batch=3)
    import torch
    torch.manual_seed(1)
    params = tvmrnn.params_from_torch(torch.nn.LSTM(29, hidden, num_layers=2, bidirectional=True))
    x = rng.standard_normal((5, 3, 29)).astype(np.float32)
    rnn.export(tmp_path / "padded.so")
    loaded = tvmrnn.load(tmp_path / "padded.so")
    assert loaded.config.packed_units == units
    assert np.array_equal(loaded.forward(loaded.pack_weights(params), x)[0], rnn.forward(rnn.pack_weights(params), x)[0])


def test_cpu_gru_panels_that_do_not_divide_the_units_pad_the_last(rng):
    """The GRU's 3 gates fill whole vectors at 16 units (3 AVX-512 vectors); at any other H its
    forward step ran tiles of 5 units (15 floats, one vector) or one guarded vector. Since v80 its
    panels are padded as the LSTM's (``cpu.CPU_PADDED_PANELS``): 16-unit panels, the last padded
    with zero weights, where that adds at most an eighth more units (not at H = 67). A 2-layer
    bidirectional GRU at H = 100 (112 units) matches torch.nn in float64, outputs, states and
    every gradient."""
    import tvm
    from tvmrnn.schedules import cpu
    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    avx512 = tvm.target.Target(target)
    for h, p, u in ((100, 16, 112), (467, 16, 480), (1082, 16, 1088), (67, 0, 67), (37, 0, 37), (64, 16, 64)):
        assert (cpu.weight_panel(avx512, 3, h), cpu.packed_units(avx512, 3, h)) == (p, u), h
    # custom cells: 5 or 7 gates have no panel of 2-4 whole vectors (none), 6 gates 8 units (3 vectors)
    assert [cpu.weight_panel(avx512, g, 100) for g in (5, 7, 6)] == [0, 0, 8]
    rnn = built("gru", 2, True, input_size=29, hidden_size=100, batch_size=3, target=target)  # (_check's)
    assert rnn.config.packed_units == 112
    names = [n for program in rnn.programs.values() for n in program.kernels]
    assert any(n.startswith("recurrent_step_gru_infer") and "_h100_p16" in n for n in names), names
    if "avx512f" not in open("/proc/cpuinfo").read():
        pytest.skip("this CPU does not run AVX-512 code")
    _check("gru", 2, True, False, 7, rng, target=target, hidden=100, input_size=29, batch=3)


def test_avx2_panels_that_do_not_divide_the_units_pad_the_last(monkeypatch, rng):
    """AVX2 targets pad their weight panels too since v81 (``cpu.CPU_PADDED_PANELS_AVX2``): 2
    vectors of units (the LSTM's 4 units; AVX2's default tile, 16 registers), or 3 (the GRU's 8
    units), the last panel padded where that adds at most an eighth more units. Before, an LSTM at
    H = 2 x odd took 2-unit panels (one-vector tiles: LSTM T=50 N=57 I=40 H=206 2 layers inference
    30.3 -> 14.7 ms on a 2-core Zen 5 running AVX2 code) and the GRU none but at multiples of 8.
    The backward's GEMMs take guarded tiles of 2-3 vectors there (``cpu.CPU_WIDE_GUARDED_TILES_AVX2``;
    one guarded vector before). A 2-layer bidirectional LSTM at H = 67 and GRU at
    H = 45 (68 and 48 units) match torch.nn in float64, outputs, states and every gradient (AVX2
    code: every machine of the suite runs it)."""
    import tvm
    from tvmrnn.schedules import cpu
    target = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
    avx2 = tvm.target.Target(target)
    for gates, h, p, u in ((4, 206, 4, 208), (4, 67, 4, 68), (4, 800, 4, 800), (3, 100, 8, 104), (3, 45, 8, 48),
                           (3, 5, 0, 5), (1, 206, 0, 206), (5, 100, 0, 100)):
        assert (cpu.weight_panel(avx2, gates, h), cpu.packed_units(avx2, gates, h)) == (p, u), (gates, h)
    monkeypatch.setattr(cpu, "CPU_PADDED_PANELS_AVX2", False)
    assert (cpu.weight_panel(avx2, 4, 206), cpu.packed_units(avx2, 3, 100)) == (2, 100)
    monkeypatch.setattr(cpu, "CPU_PADDED_PANELS_AVX2", True)
    # wide guarded tiles for the backward GEMMs: the GRU's 8 units (3 vectors), the LSTM's 4, 16 plain columns
    assert [cpu.guarded_tile_units(8, h, g, 2) for h, g in ((45, 3), (67, 4), (67, 1))] == [8, 4, 16]
    for cell, hidden, units in (("lstm", 67, 68), ("gru", 45, 48)):
        rnn = built(cell, 2, True, input_size=29, hidden_size=hidden, batch_size=3, target=target)
        assert rnn.config.packed_units == units
        _check(cell, 2, True, False, 6, rng, target=target, hidden=hidden, input_size=29, batch=3)


def test_cpu_backward_weight_copies_whose_panels_do_not_divide_k_pad_the_last(monkeypatch, rng, tmp_path):
    """The backward's copy of a weight with K inputs (its data GEMMs, ``dh = dg W_hh`` and ``dx =
    dg W_ih``, tile along K) was PyTorch's ``(G, H, K)`` where no panel of whole vectors divides K;
    since v77 (``cpu.CPU_PADDED_BACKWARD_PANELS``) an AVX-512 build takes the 2-4-vector panels that
    pad K least, the padding zero (``Config.padded_inputs``, ``Layout.backward_copy``): the backward
    step's GEMM runs over whole panels, its gate math on the real units. A 2-layer bidirectional GRU
    (I = 90, H = 123: K = 90 -> 96, 123 -> 128, 2H = 246 -> 256) packs so, names its kernels so,
    matches torch.nn in float64 (every gradient) and loads from a package with its layout; AVX2
    targets and the switch off keep PyTorch's layout."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.schedules import cpu
    target = {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2}
    avx512, avx2 = tvm.target.Target(target), tvm.target.Target({"kind": "llvm", "mcpu": "znver3"})
    for k, panel in ((1220, 64), (1216, 64), (467, 48), (90, 48), (123, 64), (246, 64), (161, 0), (37, 0)):
        assert cpu.backward_panel(avx512, k) == panel, k
    assert cpu.backward_panel(avx2, 1220) == cpu.backward_panel(avx512, 1220, enabled=False) == 0
    monkeypatch.setattr(cpu, "CPU_PADDED_BACKWARD_PANELS", False)
    assert cpu.backward_panel(avx512, 1220) == 0 and cpu.backward_panel(avx512, 1216) == 64
    monkeypatch.setattr(cpu, "CPU_PADDED_BACKWARD_PANELS", True)
    I, H, G = 90, 123, 3
    rnn = built("gru", 2, True, False, input_size=I, hidden_size=H, batch_size=3, target=target)  # (_check's)
    padded = dict(rnn.config.padded_inputs)
    assert padded == {90: 96, 123: 128, 246: 256}
    layout = rnn.config.layout
    extra = sum(s.torch_shape[0] * (padded[s.torch_shape[1]] - s.torch_shape[1])
                for s in layout.slots if len(s.torch_shape) == 2)
    assert extra == G * H * 2 * ((6 + 5) + (10 + 5)) and layout.packed_total == layout.forward_total + layout.total + extra
    names = [n for program in rnn.programs.values() for n in program.kernels]
    assert f"backward_step_gru_n3_h{H}_p64_d2" in names or f"backward_step_gru_n3_h{H}_p64" in names, names
    assert any(n.startswith("weight_panels_g3_h123_k90_p48") for n in names), names
    rnn.export(tmp_path / "padded_backward.so")
    from tvmrnn.runtime import package
    meta = package.read_metadata(tmp_path / "padded_backward.so")
    assert meta["padded_inputs"] == [[90, 96], [123, 128], [246, 256]]
    assert meta["backward_weight_panels"] == {"90": 48, "123": 64, "246": 64}
    if not cpu_has("avx512f"):
        pytest.skip("this CPU does not run AVX-512 code (packing runs the build's kernels)")
    import torch
    torch.manual_seed(2)
    params = tvmrnn.params_from_torch(torch.nn.GRU(I, H, num_layers=2, bidirectional=True))
    w = rnn.pack_weights(params)
    for kind, k in (("weight_ih", 246), ("weight_hh", 123)):
        slot = layout.slot(1, 1, kind)
        W = params[slot.name].reshape(G, H, k)
        back = w.flat[layout.backward_copy(slot):][:G * H * padded[k]]
        want = np.zeros((G, H, padded[k]), np.float32)
        want[:, :, :k] = W
        np.testing.assert_array_equal(back.reshape(kernels.backward_weight_shape(G, H, k, 64)),
                                      want.reshape(G, H, padded[k] // 64, 64).transpose(2, 1, 0, 3))
    loaded = tvmrnn.load(tmp_path / "padded_backward.so")
    assert loaded.config.padded_inputs == rnn.config.padded_inputs
    assert np.array_equal(loaded.pack_weights(params).flat, w.flat)
    _check("gru", 2, True, False, 7, rng, target=target, hidden=H, input_size=I, batch=3)
    _check("lstm", 1, False, False, 5, rng, target=target, hidden=123, input_size=93, batch=1)


def test_cpu_backward_of_few_rows_sums_its_tails_weight_gradients_in_one_call(monkeypatch, rng):
    """A CPU backward of few rows (``passes.CPU_STAGED_WEIGHT_GRADIENTS``) copies the gate gradients,
    inputs and h_{t-1} of the chunks after its 64-step ones into a stage and sums their weight
    gradients in one call over the smallest chunk size that holds them, where they are two chunks
    or more and the calls saved cost more than the span's padding (``CPU_STAGED_PASS_ROWS``): each
    call reads and writes all of dW (from ``CPU_STAGED_MIN_BYTES``, 1 MiB, of the recurrent
    weight: a smaller one stays in cache). Counted per sequence length, and matched against torch.nn in
    float64 where the tail is staged into each span (both directions, two layers; the stacked
    directions' chunks walk time in opposite orders, the unstacked' too; with variable lengths,
    the chunks' masks staged too and NaN past the lengths)."""
    from tvmrnn.program import passes
    monkeypatch.setattr(passes, "CPU_STAGED_MIN_BYTES", 0)  # (H = 33: a dW that stays in cache)

    def weight_calls(rnn, T):
        calls = rnn.programs["backward"].calls(T)
        return ({int(re.search(r"_t(\d+)_", k).group(1)): n for k, n in calls.items()
                 if k.startswith("weight_gradient") and "_k20_" in k and n},
                sum(n for k, n in calls.items() if k.startswith("copy_steps")))
    one = tvmrnn.plan("lstm", 20, 33, batch_size=1, target="llvm", tuning_logs=False)
    assert weight_calls(one, 125) == ({64: 2}, 3 * 7)  # 61 steps of tail: 7 chunks staged, one span
    assert weight_calls(one, 128) == ({64: 2}, 0)
    assert weight_calls(one, 65) == ({64: 1, 1: 1}, 0)  # (one chunk: nothing to save)
    assert weight_calls(one, 66) == ({64: 1, 4: 1}, 3 * 2)
    assert weight_calls(one, 75) == ({64: 1, 16: 1}, 3 * 5)
    assert weight_calls(one, 9) == ({16: 1}, 3 * 3)
    four = tvmrnn.plan("lstm", 20, 33, batch_size=4, target="llvm", tuning_logs=False)
    # 36 steps of tail in 3 chunks: 2 calls saved (64 rows) against 28 x 4 padding rows: as they were
    assert weight_calls(four, 100) == ({64: 1, 16: 2, 4: 1}, 0)
    assert weight_calls(four, 125) == ({64: 2}, 3 * 7)
    monkeypatch.setattr(passes, "CPU_STAGED_WEIGHT_GRADIENTS", False)
    off = tvmrnn.plan("lstm", 20, 33, batch_size=1, target="llvm", tuning_logs=False)
    assert weight_calls(off, 125) == ({64: 1, 16: 3, 4: 3, 1: 1}, 0)
    monkeypatch.setattr(passes, "CPU_STAGED_WEIGHT_GRADIENTS", True)
    monkeypatch.setattr(passes, "CPU_STAGED_MIN_BYTES", 1 << 20)
    assert weight_calls(tvmrnn.plan("lstm", 20, 33, batch_size=1, target="llvm", tuning_logs=False),
                        125)[1] == 0
    monkeypatch.setattr(passes, "CPU_STAGED_MIN_BYTES", 0)
    from conftest import _cache_clear
    _cache_clear()  # (the shared builds: these with the stage)
    for T in (6, 50, 66):  # spans of 16, 64 and 4
        _check("gru", 2, True, False, T, rng, hidden=21, input_size=20, batch=2, tol=1e-5)
    from test_lengths import _check as check_lengths  # staged masks; NaN past the lengths reaches nothing
    check_lengths("lstm", 2, True, False, [50, 12, 3, 49], T=50, hidden=23, pad_value=np.nan)
    _cache_clear()
    _check("lstm", 1, True, True, 70, rng, hidden=19, input_size=20, batch=3, tol=1e-5,
           options=BuildOptions(stack_directions=False))


def test_cpu_copies_along_their_innermost_axis_run_in_whole_vectors(monkeypatch):
    """A CPU copy whose innermost axis is contiguous on both sides and a whole number of vectors
    (``cpu.cpu_copy``: the backward's weight panels, a chunk's staged operands) runs it in
    vectors, the other axes split over the cores (before: one scalar loop over the fused axes,
    the LSTM's backward copies at H = 800 4.6 ms, vectorised 1.15); a padded panel's guarded copy
    takes its panels in turn so that LoopPartition leaves the guard to the last (its LLVM code has
    whole vectors; vectorised under the guard throughout, LLVM got scalar code). Transpositions keep ``cpu_transpose``; a
    copy of odd width or along a strided axis, the generic schedule."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.schedules import cpu, default_schedule
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})

    def vectorised(kernel):
        func = default_schedule(kernel, target)
        return "T.vectorized" in func.script(), func
    assert vectorised(kernels.weight_panels(4, 96, 800, 32))[0]
    assert vectorised(kernels.copy_steps(16, 4, 96))[0]
    guarded, func = vectorised(kernels.weight_panels(4, 96, 1220, 64))
    assert guarded and "pragma_loop_partition_hint" in func.script()
    ir = tvm.compile(tvm.IRModule({"main": func}), target=target).mod.inspect_source("ll")
    assert "<16 x float>" in ir
    assert not vectorised(kernels.copy(3, 37))[0]  # (37: no whole vector; 3 x 37 elements: too few)
    monkeypatch.setattr(cpu, "CPU_VECTOR_COPIES", False)
    assert not vectorised(kernels.weight_panels(4, 96, 800, 32))[0]


@pytest.mark.parametrize("gates,hidden,in_size,panel", [(4, 147, 131, 0), (3, 129, 200, 0), (4, 160, 1471 // 7, 0),
                                                       (4, 150, 181, 30)])
def test_cpu_transpositions_that_no_tile_divides_are_tiled_with_guarded_edges(gates, hidden, in_size, panel, rng,
                                                                              monkeypatch):
    """``cpu.cpu_transpose`` tiles transpositions whose axes no row or column tile divides (the
    backward's packed weight gradients back to PyTorch's layout at an odd H: ``gate_untranspose``),
    the tiles past the ends predicated and cut off the full ones (``CPU_GUARDED_TRANSPOSES``; before,
    the generic schedule read a line of the input per element: 22 ms at H = K = 1471 on the 2-core
    dev VM, 1.8 tiled), and the forward's padded panels (``gate_transpose``'s guarded load). Every
    element lands where numpy's transposition puts it, zeros in the padding."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.schedules import cpu, default_schedule
    # (this CPU's vectors: the kernels run here; an AVX-512 build raised SIGILL on an AVX2 VM)
    if not cpu_has("avx2"):
        pytest.skip("this CPU has no AVX2")
    mcpu = "skylake-avx512" if cpu_has("avx512f") else "haswell"
    target = tvm.target.Target({"kind": "llvm", "mcpu": mcpu, "num-cores": 2})
    kernel = kernels.gate_untranspose(gates, hidden, in_size, panel)
    func = default_schedule(kernel, target)
    script = func.script()
    assert "T.parallel" in script and "pragma_loop_partition_hint" in script
    lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
    shape = kernels.weight_gradient_shape(in_size, hidden, gates, panel)
    src = rng.standard_normal(shape).astype(np.float32)
    dst = tvm.runtime.tensor(np.full((gates, hidden, in_size), np.nan, np.float32))
    lib["main"](tvm.runtime.tensor(src), dst)
    if panel:  # (H / p, K, p, G) -> (G, H, K)
        expected = src.transpose(3, 0, 2, 1).reshape(gates, hidden, in_size)
    else:
        expected = src.transpose(2, 1, 0)
    np.testing.assert_array_equal(dst.numpy(), expected)
    # the forward's padded panels (zeros past the real units: a guarded load) are tiled too
    units = hidden + (hidden % 16 == 0)  # (a hidden size that pads)
    pack = kernels.gate_transpose(gates, units, in_size, 16)
    packed = default_schedule(pack, target)
    assert "T.vectorized" in packed.script()
    weights = rng.standard_normal((gates, units, in_size)).astype(np.float32)
    out = tvm.runtime.tensor(np.full(kernels.weight_shape(in_size, units, gates, 16), np.nan, np.float32))
    tvm.compile(tvm.IRModule({"main": packed}), target=target)["main"](tvm.runtime.tensor(weights), out)
    padded = np.concatenate([weights, np.zeros((gates, -units % 16, in_size), np.float32)], axis=1)
    np.testing.assert_array_equal(out.numpy(), padded.reshape(gates, -1, 16, in_size).transpose(1, 3, 0, 2))
    monkeypatch.setattr(cpu, "CPU_GUARDED_TRANSPOSES", False)
    assert "pragma_loop_partition_hint" not in default_schedule(kernel, target).script()
    assert "T.vectorized" not in default_schedule(pack, target).script()


def test_cpu_guarded_rows_keep_whole_steps_in_a_tile(rng):
    """Guarded row tiles (``cpu.CPU_GUARDED_ROWS``) only where the GEMM has one row axis of its own:
    on fused steps x rows (10-step chunks of 5 rows: a fused tile of 10 rows, 50 in all) a 24-row
    tile would end inside a step, and the second direction's input gradient, which adds to the
    first's in one buffer, added rows of the neighbouring tile twice (dx 0.64 off)."""
    _check("lstm", 1, True, False, 23, rng, hidden=40, input_size=16, batch=5, tol=1e-5,
           options=BuildOptions(chunk_steps=(10, 1), stack_directions=False))


def test_cpu_guarded_rows_leave_l1_blocks_out(monkeypatch, rng):
    """An AVX2 weight gradient over K = 343 rows (dW_hh at H = 7^3: no row tile near the
    accumulators' 6 divides it) takes guarded 6-row tiles; before v82 the weight gradients' L1 blocks
    (``cpu.L1_BLOCKS``: blocks of 7 tiles here) kept them off and its tile was one row tall
    (``cpu.CPU_GUARDED_ROWS_UNBLOCKED``: 2.3x faster alone). The backward gives the same bits."""
    import torch
    import tvm
    from tvmrnn.schedules import cpu, default_schedule
    target = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}
    torch.manual_seed(0)
    params = tvmrnn.params_from_torch(torch.nn.LSTM(161, 343))
    x, dy = rng.standard_normal((5, 8, 161)).astype("float32"), rng.standard_normal((5, 8, 343)).astype("float32")
    results = []
    for unblocked in (False, True):
        monkeypatch.setattr(cpu, "CPU_GUARDED_ROWS_UNBLOCKED", unblocked)
        rnn = tvmrnn.build("lstm", 161, 343, batch_size=8, target=target, tuning_logs=False, cache=False)
        program = rnn.programs["backward"]
        name = next(n for n in program.kernels if n.startswith("weight_gradient") and "_k343_" in n)
        script = default_schedule(program.kernels[name], tvm.target.Target(target)).script()
        assert bool(re.search(r"in T\.unroll\(6\b", script)) == unblocked, name  # (blocked: T.unroll(1))
        w = rnn.pack_weights(params)
        y, *_, ws = rnn.forward_train(w, x)
        results.append(rnn.backward(w, ws, dy))
    assert all(np.array_equal(results[0][k], results[1][k]) for k in results[0])


@pytest.mark.parametrize("cell,layers,bidirectional,stacked", [("lstm", 2, False, None), ("gru", 1, True, False),
                                                               ("rnn_relu", 2, True, True)])
def test_cpu_backward_takes_each_chunks_gradients_after_its_steps(cell, layers, bidirectional, stacked, monkeypatch, rng):
    """A CPU backward (``interleave_projections``, CPUs' default) runs each chunk's weight, bias
    and input gradients right after the chunk's steps, while its gate gradients are in cache
    (v74; stacked directions, which walk time in opposite orders, their input gradients after
    the loop); at a T that takes every chunk size, layer by layer, its outputs
    match torch.nn in float64, as the build with the gradients after all the steps does."""
    import torch
    from conftest import rel_error, torch_module
    from tvmrnn.program import passes

    ref = torch_module(cell, 13, 24, layers, bidirectional, False).double()
    T = 2 * passes.CHUNK_STEPS[0] + 7  # chunks of every size (16, 4, 1)
    x = torch.from_numpy(rng.standard_normal((T, 3, 13)))
    xr = x.clone().requires_grad_(True)
    y_ref = ref(xr)[0]
    dy = torch.from_numpy(rng.standard_normal(tuple(y_ref.shape)))
    y_ref.backward(dy)
    loops = {}
    for chunked in (True, False):
        monkeypatch.setattr(passes, "BACKWARD_CHUNK_GRADIENTS", chunked)
        rnn = tvmrnn.build(cell, input_size=13, hidden_size=24, num_layers=layers, bidirectional=bidirectional,
                           batch_size=3, options=BuildOptions(stack_directions=stacked), cache=False, tuning_logs=False)
        loops[chunked] = str(rnn.programs["backward"].build()).count("for step in")
        # (the profiler's counts: a chunk's step loop has an extent in the chunk's start)
        groups = 1 if not bidirectional or stacked else 2
        assert rnn.programs["backward"].step_counts(T)[0] == layers * groups * (T - 1)
        weight_gradients = sum(n for name, n in rnn.programs["backward"].calls(T).items()
                               if name.startswith("weight_gradient"))
        assert weight_gradients == 2 * layers * (2 if bidirectional else 1) * 6  # chunks: 2 x 16, 4, 3 x 1 steps
        w = rnn.pack_weights({k: v.float() for k, v in ref.state_dict().items()})
        grads = rnn.backward(w, rnn.forward_train(w, x.float())[-1], dy.float())
        assert rel_error(grads["x"], xr.grad) < 1e-5, chunked
        for name, p in ref.named_parameters():
            assert rel_error(grads[name], p.grad) < 1e-5, (chunked, name)
    # a step loop a chunk size and layer (and direction group) where they interleave, else one each
    assert loops[True] > loops[False]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cuda_masked_steps_select_without_branching_on_the_mask(cell, monkeypatch):
    """A variable-lengths build's masked GPU steps pick a running row's new state or an ended row's
    old one with a select, not a branch (``sequence.masked_selects_without_branches``): TVM's
    ``RewriteUnsafeSelect`` made each select that reads memory an if-then-else, so the loads of
    the step's value waited for the mask's load (the masked DS2 step 10% slower on the H100)."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.cells import get_cell
    from tvmrnn.program import sequence
    from tvmrnn.schedules import default_schedule
    target = tvm.target.Target("nvidia/nvidia-h100")
    cell = get_cell(cell)
    steps = [kernels.recurrent_step(cell, 5, 37, train=True, directions=2, masked=True),
             kernels.backward_step(cell, 5, 37, directions=2, masked=True),
             # a persistent step of row tiles compiled alone (the selects' values bound next to
             # the block's allocations: statement-level bindings failed in StorageRewrite there)
             kernels.persistent(kernels.recurrent_step(cell, 128, 256, train=False, masked=True), 132)]

    def sources():
        return [sequence.compile_module(tvm.IRModule({"main": default_schedule(k, target)}), target)
                .mod.imports[0].inspect_source() for k in steps]
    for source in sources():
        assert "masked_value" in source and "condval" not in source
    monkeypatch.setattr(sequence, "MASKED_SELECTS_WITHOUT_BRANCHES", False)  # (the test can fail)
    for source in sources():
        assert "masked_value" not in source and "condval" in source


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_a_padded_step_reduction_computes_the_same_step(cell, rng):
    """``kernels.recurrent_step(reduction=...)`` (and the backward's state-gradient GEMMs'): the GEMM
    over more indices than the state has, each past it a guarded zero, gives the kernel's own
    outputs bit for bit (run on this CPU; its
    GPU use, ``passes.GPU_PADDED_REDUCTION``, is off until run on a GPU: test_cuda.py), a
    reduction below the state is refused, and the GPU rule pads only a state without a divisor
    near split-K's slices, to a multiple of 32."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.cells.definition import get_cell
    from tvmrnn.program import passes
    from tvmrnn.schedules import default_schedule
    target = tvm.target.Target("llvm")
    makers = {"step": lambda r: kernels.recurrent_step(get_cell(cell), 3, 37, True, reduction=r),
              "backward step": lambda r: kernels.backward_step(get_cell(cell), 3, 37, reduction=r),
              "recurrent backward": lambda r: kernels.recurrent_backward(3, 37, 4, False, reduction=r),
              "input gradient": lambda r: kernels.input_gradient(2, 3, 11, 37, 4, True, reduction=r)}
    for what, make in makers.items():
        results = []
        for reduction in (0, 64):
            kernel = make(reduction)
            assert ("_r64" in kernel.name) == bool(reduction), kernel.name
            func = default_schedule(kernel, target)
            lib = tvm.compile(tvm.IRModule({"main": func}), target=target)
            if not results:
                data = [np.random.default_rng(0).standard_normal([int(d) for d in p.shape]).astype(np.float32)
                        for p in func.params]
            arrays = [tvm.runtime.tensor(a.copy()) for a in data]
            lib["main"](*arrays)
            results.append([a.numpy() for a in arrays])
        for role, a, b in zip(kernel.roles, *results):
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: {role}")
    with pytest.raises(ValueError, match="reduction: 30 for an fp32 step of state size 37"):
        kernels.recurrent_step(get_cell(cell), 3, 37, False, reduction=30)
    h100 = tvm.target.Target("nvidia/nvidia-h100")
    config = passes.Config(get_cell(cell), 40, 947, 1, False, 2, False)
    assert passes.step_reduction(h100, config) == 0  # (off by default)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(passes, "GPU_PADDED_REDUCTION", True)
        assert passes.step_reduction(h100, config) == 960  # 947: prime
        assert passes.step_reduction(h100, passes.Config(get_cell(cell), 40, 800, 1, False, 2, False)) == 0
        assert passes.step_reduction(h100, passes.Config(get_cell(cell), 40, 201, 1, False, 2, False)) == 224  # 3 x 67
        assert passes.step_reduction(None, config) == 0  # CPUs: guarded tiles
        assert passes.step_reduction(h100, passes.Config(get_cell(cell), 40, 947, 1, False, 128, False)) == 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_padded_step_reductions_compile_for_the_h100(monkeypatch):
    """With ``passes.GPU_PADDED_REDUCTION``, an LSTM of a prime hidden size (947) at batch 2
    builds for the H100: its forward steps run a reduction of 960 (split-K's blocks of 512
    threads, 64 slices, where 947 left one slice of 8 threads: 135 us a step, v91)."""
    from tvmrnn.program import passes
    monkeypatch.setattr(passes, "GPU_PADDED_REDUCTION", True)
    rnn = tvmrnn.build("lstm", input_size=40, hidden_size=947, batch_size=2, target="nvidia/nvidia-h100", cache=False,
                       tuning_logs=False)
    assert {n for n in rnn.schedules if "_r960" in n} == {
        "recurrent_step_lstm_infer_n2_h947_r960_persistent", "recurrent_step_lstm_train_n2_h947_r960_persistent",
        "backward_step_lstm_n2_h947_r960_persistent", "recurrent_backward_n2_h947_g4_r960",
        # (the input gradients of fewer than 128 rows: those of more may take TF32 tiles)
        *(f"input_gradient_t{t}_n2_k40_h947_g4_r960" for t in (32, 16, 8, 4, 1))}
    source = rnn.executable.mod.imports[0].inspect_source()
    for loop in ("forward_kernel", "forward_train_kernel", "backward_kernel"):  # (without: 8, 8 and 32 threads)
        assert re.search(rf"__launch_bounds__\(512\) {loop}\(", source), loop
    # a stack's layer wavefront (inference) and the steps after its waves: every step padded
    stack = tvmrnn.plan("lstm", 40, 947, num_layers=2, batch_size=2, target="nvidia/nvidia-h100", tuning_logs=False,
                        options=BuildOptions(layer_wavefront=True))
    steps = [n for n in stack.schedules if re.match(r"(recurrent_step|backward_step|recurrent_backward)_", n)]
    assert any("_d2" in n for n in steps) and all("_r960" in n for n in steps), steps
