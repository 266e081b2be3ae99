"""Persistent GPU time loops in generated CUDA (nvcc, no GPU needed): weight-stationary steps, their
options and modes, cooperative launches, two-direction loops. Split from ``test_codegen.py`` so that
CI's two workers (``--dist loadfile``) share the code-generation tests evenly."""
from __future__ import annotations

import re
import shutil

import pytest

import tvmrnn
from test_codegen import _kernel_definitions, _launch_flags, _ptxas
from tvmrnn import BuildOptions
from tvmrnn.device import multiprocessors
from conftest import slow

H100 = "nvidia/nvidia-h100"

# These tests read the time loops' kernels, which the all-steps GEMMs' chunk sizes do not change:
# their builds take one-step chunks (one GEMM kernel of each kind instead of four), which halves a
# build here (DS2 GRU, persistent="all": 3.6 -> 1.7 s). test_codegen.py checks the default chunks.
STEPS = dict(chunk_steps=(1,))


def _sms() -> int:
    """The SMs of the GPU the H100 target's persistent kernels are sized for (one block per SM)."""
    import tvm
    sms = multiprocessors(tvm.target.Target(H100))
    assert sms
    return sms


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
def test_cuda_persistent_time_loops(cell, tmp_path):
    """``persistent="all"``: each time loop is one launch with the loop inside the kernel, at
    most one block per SM, a grid barrier per step; nvcc assembles it unspilled."""
    rnn = tvmrnn.build(cell, input_size=800, hidden_size=800, batch_size=20, target=H100, tuning_logs=False,
                       options=BuildOptions(persistent="all", **STEPS))
    source = rnn.executable.mod.imports[0].inspect_source()
    kernels = source.split("extern \"C\" __global__")[1:]
    persistent = [k for k in kernels if "for (int step = 0; step < " in k]
    # the forward's and training forward's steps, the backward's fused steps
    assert len(persistent) == 3
    for kernel in persistent:
        assert "wait_until" in kernel and "atomic_add" in kernel
        blocks = int(re.search(r"\(step \* (\d+)\) \+ \1", kernel).group(1))
        assert 1 < blocks <= _sms()
        # weight-stationary: the block's slice of the weights is copied into shared memory once,
        # before the time loop, and the loop multiplies by it there, never by the weights in
        # global memory (which the loop reads only for the biases)
        prologue, loop = kernel.split("for (int step = 0; step < ", 1)
        shared = r"(\(\(float\*\)buf_dyn_shmem_ptr\)|w_shared_dyn_ptr)\["  # merged or alone
        assert "extern __shared__" in prologue and re.search(shared + r".*\] = w_ptr\[", prologue)
        assert not re.search(r"\* w_ptr\[", loop) and re.search(r"\* " + shared, loop)
    report = _ptxas(source, tmp_path)
    assert "spill stores" in report and not re.search(r"[1-9]\d* bytes spill", report)
    assert all(rnn.programs[name].uses_persistent_loops for name in ("forward", "forward_train", "backward"))
    from tvmrnn.runtime.package import metadata  # a package says how many SMs it needs (checked at load)
    assert rnn.persistent_blocks == _sms() and metadata(rnn)["persistent_blocks"] == rnn.persistent_blocks
    assert metadata(rnn)["options"]["persistent"] == "all"



@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh"])
@pytest.mark.parametrize("sizes", [dict(input_size=800, hidden_size=800, batch_size=20),
                                   dict(input_size=13, hidden_size=37, batch_size=3)], ids=["ds2", "odd"])
def test_cuda_persistent_step_options(cell, sizes, monkeypatch):
    """The persistent step's shapes (``schedules.PERSISTENT_TILES``; ``vector_k=4`` the default only
    for LSTM steps of 128+ rows, not these): ``stage_epilogue`` copies the step's input
    projection into shared memory at the top of each step, so the epilogue no longer reads it from
    global memory; ``vector_k`` loads the GEMM's operands from shared memory as vectors where the
    reduction splits evenly (at DS2 sizes), scalars elsewhere; ``row_vector`` copies the hidden state
    in float4s where its size is a multiple of 4 threads' vectors. Both compile at odd sizes too (a
    one-element bias slice is left in global memory: TVM's shared-memory merge fails on it)."""
    from tvmrnn import schedules  # PERSISTENT_TILES is read by schedules.apply, in the package itself
    monkeypatch.setattr(schedules, "PERSISTENT_TILES",
                        {**schedules.PERSISTENT_TILES, "vector_k": 4, "stage_epilogue": True, "row_vector": 4})
    rnn = tvmrnn.build(cell, **sizes, target=H100, tuning_logs=False,
                       options=BuildOptions(persistent="forward", **STEPS))
    source = rnn.executable.mod.imports[0].inspect_source()
    persistent = [k for k in _kernel_definitions(source) if "for (int step = 0; step < " in k]
    assert len(persistent) == 1  # the inference forward's
    _, loop = persistent[0].split("for (int step = 0; step < ", 1)
    assert re.search(r"buf_dyn_shmem_ptr\)\[[^;]*\] = gx_ptr\[", loop), "the input projection is not staged"
    assert not re.search(r"[^=] [-+*(] *gx_ptr\[|\(gx_ptr\[", loop), "the epilogue reads gx from global memory"
    # vector loads from shared memory into registers (the merged buffer typed float or float4)
    vectors = re.findall(r"= (\*\(float[24]\*\)\(\(\(float\*\)|\(\(float[24]\*\))buf_dyn_shmem_ptr\)", loop)
    assert bool(vectors) == (sizes["hidden_size"] == 800)
    # row_vector: the hidden state's per-step copy in float4s where its size allows (20 x 800, not 3 x 37)
    assert bool(re.search(r"= \*\(float4\*\)\(h_state_ptr \+", loop)) == (sizes["hidden_size"] == 800)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_two_direction_persistent_steps_stage_hidden_state_in_phases(tmp_path):
    """The default options (``persistent="auto"``, ``persist_stacked=True``; DS2 sizes, 1
    bidirectional layer): the inference and training forwards each run both directions in one persistent,
    cooperative launch, a block per slice of one direction's units. An LSTM block's weights (13
    units, 166 KB) and partial sums leave no room for the direction's whole 64 KB hidden state, so
    the reduction runs in phases, each staging its part of h_prev between two barriers; within
    227 KB of shared memory, unspilled. The backward (split-K at 20 rows) stays per-step. (The GRU's blocks, 3 gates,
    stage the whole state; ``persist_stacked=False`` keeps stacked loops per-step:
    ``test_cuda_persistence_skips_two_direction_steps``.)"""
    cell = "lstm"
    sizes = dict(input_size=800, hidden_size=800, batch_size=20, bidirectional=True)
    rnn = tvmrnn.build(cell, **sizes, target=H100, tuning_logs=False, options=BuildOptions(persistent="auto", **STEPS))
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops
    assert not rnn.programs["backward"].uses_persistent_loops
    source = rnn.executable.mod.imports[0].inspect_source()
    persistent = [k for k in _kernel_definitions(source) if "for (int step = 0; step < " in k]
    assert len(persistent) == 2
    for kernel in persistent:
        prologue, loop = kernel.split("for (int step = 0; step < ", 1)
        blocks = int(re.search(r"\(step \* (\d+)\) \+ \1", kernel).group(1))
        assert 1 < blocks <= _sms()
        # both directions' weights in one launch: each block picks its direction's by its index
        assert re.search(r"\(\(int\)blockIdx\.x\) / \d+\) \* \d+\)", prologue)
        phased = re.search(r"for \(int (ax\d+) = 0; \1 < (\d+); \+\+\1\) \{\s*__syncthreads\(\);\s*"
                           r"\(\(float\*\)buf_dyn_shmem_ptr\)\[[^;]*\] = (h_state|hs)_ptr\[", loop)
        assert phased and int(phased.group(2)) == 2, "the LSTM's hidden state is not staged in phases"
    report = _ptxas(source, tmp_path)
    assert not re.search(r"[1-9]\d* bytes spill", report)
    smem = [int(b) for b in re.findall(r"(\d+) bytes smem", report)]
    assert smem and max(smem) <= 48 * 1024  # static; the dynamic part is checked at launch
    assert _launch_flags(rnn, tmp_path)[0] == 2


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_one_direction_persistent_step_stages_a_large_hidden_state_in_phases(tmp_path):
    """One direction, N = 64, H = 1,024 (GRU): a block's weights (8 units, 96 KB) and partial sums
    leave no room for the whole 256 KB hidden state, so the default step stages it in phases of the
    reduction (before v35 it read it from L2 in every thread: 85 us a step against 24 on the H100),
    unspilled, within the device's shared memory."""
    rnn = tvmrnn.build("gru", input_size=64, hidden_size=1024, batch_size=64, target=H100, tuning_logs=False,
                       options=BuildOptions(persistent="forward", **STEPS))
    assert rnn.programs["forward"].uses_persistent_loops
    source = rnn.executable.mod.imports[0].inspect_source()
    persistent = [k for k in _kernel_definitions(source) if "for (int step = 0; step < " in k]
    assert len(persistent) == 1  # the inference forward's step
    for kernel in persistent:
        loop = kernel.split("for (int step = 0; step < ", 1)[1]
        phased = re.search(r"for \(int (ax\d+) = 0; \1 < (\d+); \+\+\1\) \{\s*__syncthreads\(\);\s*"
                           r"\(\(float\*\)buf_dyn_shmem_ptr\)\[[^;]*\] = (h_state|hs)_ptr\[", loop)
        assert phased and int(phased.group(2)) > 1, "the hidden state is not staged in phases"
    report = _ptxas(source, tmp_path)
    assert not re.search(r"[1-9]\d* bytes spill", report)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_cuda_persistent_step_reads_hidden_state_without_bank_conflicts(cell):
    """The default persistent step (DS2 sizes): a thread's row group is the outer part of its index
    (``groups_outer``), so every thread of a warp reads the same rows of the staged hidden state
    (its row-group offset, 10 rows x 800 words, is ``threadIdx.x / K`` with K >= 32: whole warps),
    at consecutive reduction indices; with the slice outermost, one warp held both row groups,
    800-word rows in the same banks (notes/performance.md v16). The epilogue's inputs are staged."""
    rnn = tvmrnn.build(cell, input_size=800, hidden_size=800, batch_size=20, target=H100, tuning_logs=False,
                       options=BuildOptions(persistent="forward", **STEPS))
    source = rnn.executable.mod.imports[0].inspect_source()
    persistent = [k for k in _kernel_definitions(source) if "for (int step = 0; step < " in k]
    assert len(persistent) == 1
    _, loop = persistent[0].split("for (int step = 0; step < ", 1)
    groups = re.findall(r"\(\(int\)threadIdx\.x\) / (\d+)\) \* 8000\)", loop)
    assert groups and all(int(g) >= 32 for g in groups), groups
    assert not re.search(r"threadIdx\.x\) % \d+\) / \d+\) \* 8000\)", loop)  # the v15 order
    assert re.search(r"buf_dyn_shmem_ptr\)\[[^;]*\] = gx_ptr\[", loop), "the input projection is not staged"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_persistent_loops_take_at_most_the_blocks_asked_for():
    """``persistent_blocks`` caps a persistent kernel's grid (each block then owns more columns):
    at batch 1, H = 96, the forward step's grid barrier spans 8 blocks instead of one per column
    group; a build says so in ``rnn.persistent_blocks`` and its package metadata."""
    def grids(rnn):
        source = rnn.executable.mod.imports[0].inspect_source()
        return [int(re.search(r"\(step \* (\d+)\) \+ \1", k).group(1))
                for k in source.split("extern \"C\" __global__")[1:] if "for (int step = 0; step < " in k]

    sizes = dict(input_size=96, hidden_size=96, batch_size=1, target=H100, tuning_logs=False)
    capped = tvmrnn.build("lstm", options=BuildOptions(persistent_blocks=8, **STEPS), **sizes)
    assert capped.persistent_blocks == 8 and grids(capped) and all(b <= 8 for b in grids(capped))
    wide = tvmrnn.build("lstm", options=BuildOptions(persistent_blocks=_sms(), **STEPS), **sizes)
    assert wide.persistent_blocks == _sms() and max(grids(wide)) > 8
    # left to the target, a step of one row whose weights fit a block takes one block
    # (device.small_step_blocks)
    assert tvmrnn.build("lstm", options=BuildOptions(**STEPS), **sizes).persistent_blocks == 1
    from tvmrnn.runtime.package import metadata
    assert metadata(capped)["options"]["persistent_blocks"] == 8
    # one block: the grid barrier is the block's own __syncthreads, no atomics, no polling
    single = tvmrnn.build("lstm", options=BuildOptions(persistent_blocks=1, **STEPS), **sizes)
    source = single.executable.mod.imports[0].inspect_source()
    loops = [k for k in source.split("extern \"C\" __global__")[1:] if "for (int step = 0; step < " in k]
    assert loops and single.programs["forward"].uses_persistent_loops
    assert not any("atomic_add" in k or "wait_until" in k or "blockIdx" in k for k in loops)
    assert all("__syncthreads()" in k.split("for (int step = 0; step < ", 1)[1] for k in loops)
    # one block whose shared memory cannot hold the weights (H = 256: 1 MB), which it reads from
    # global memory at every step: still one launch a loop (nothing hoisted before it)
    off_chip = tvmrnn.plan("lstm", options=BuildOptions(persistent="all", persistent_blocks=1, **STEPS),
                           **dict(sizes, input_size=256, hidden_size=256))
    assert off_chip.persistent_blocks == 1 and off_chip.programs["forward"].uses_persistent_loops
    from tvmrnn.schedules import keeps_weights_on_chip
    step = next(k for n, k in off_chip.programs["forward"].kernels.items() if n.endswith("_persistent"))
    assert not keeps_weights_on_chip(off_chip.programs["forward"]._scheduled[step.name], step)
    with pytest.raises(ValueError, match="options.persistent_blocks: expected None or a positive int, got 0"):
        BuildOptions(persistent_blocks=0)


def test_persistent_options(monkeypatch):
    """A GPU target whose SM count is known gets one block per SM for its persistent loops; none
    with ``persistent="off"``, on CPUs, or where the SMs are unknown. ``TVMRNN_PERSISTENT`` (its
    old values too) sets only the default: options given explicitly never read it."""
    from tvmrnn import device
    h100 = device.resolve(H100)
    assert device.persistent_blocks(h100, BuildOptions(persistent="forward")) == _sms()
    assert device.persistent_blocks(h100, BuildOptions(persistent="off")) is None
    everything = BuildOptions(persistent="all")
    assert device.persistent_blocks(device.resolve(None), everything) is None  # CPUs: none
    assert device.persistent_blocks(device.resolve({"kind": "cuda", "arch": "sm_75"}), everything) is None
    monkeypatch.delenv("TVMRNN_PERSISTENT", raising=False)
    assert BuildOptions().persistent == "auto"
    for value, mode in (("1", "all"), ("0", "off"), ("train", "auto"), ("forward", "forward")):
        monkeypatch.setenv("TVMRNN_PERSISTENT", value)
        assert BuildOptions().persistent == mode, value
    monkeypatch.setenv("TVMRNN_PERSISTENT", "sometimes")
    with pytest.raises(ValueError, match="TVMRNN_PERSISTENT"):
        BuildOptions()
    assert BuildOptions(persistent="off").persistent == "off"
    with pytest.raises(ValueError, match="options.persistent: expected one of auto, forward, all, off; got 'x'"):
        BuildOptions(persistent="x")
    with pytest.raises(TypeError, match="options.persist_stacked"):  # a dict of options, checked by build
        tvmrnn.build("gru", 4, 4, target=H100, tuning_logs=False,
                     options={"persistent": "off", "persist_stacked": "yes"})


def test_small_steps_take_fewer_persistent_blocks_from_the_device_model():
    """At batch 8 or less the persistent loops take about three times the fewest blocks whose
    shared memory holds a direction's recurrent weights (one where one block does), from the
    device model's shared memory per block; at 9-64 rows a block per 4 units too; more rows, or
    that many blocks reaching the SM count, one per SM; ``options.persistent_blocks`` overrides it."""
    from tvmrnn import device
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.program.passes import Config

    def blocks(target, cell, hidden, batch, bidirectional=False, **options):
        config = Config(CELLS[cell], hidden, hidden, 1, bidirectional, batch, False)
        return device.persistent_blocks(device.resolve(target), BuildOptions(**options), config)

    assert blocks(H100, "lstm", 96, 1) == 1 and blocks(H100, "gru", 96, 8) == 1  # 147 and 111 KB: one block
    assert blocks(H100, "lstm", 96, 1, bidirectional=True) == 2  # a block a direction
    assert blocks(H100, "lstm", 128, 2) == 8  # 256 KB: 2 blocks hold it, 3 x 2 -> 8
    assert blocks(H100, "lstm", 256, 4) == blocks(H100, "gru", 256, 1) == 16
    assert blocks(H100, "lstm", 512, 1) == 64
    assert blocks(H100, "lstm", 1024, 1) == _sms()  # 16 MB: every SM's share
    # 9-64 rows: a block per 4 units (device.FEW_ROWS_UNITS), to the nearest power of two, at least
    # the count above; one per SM where that passes half the SMs; more rows: one per SM
    assert blocks(H100, "lstm", 96, 9) == 32 and blocks(H100, "lstm", 128, 16) == 32
    assert blocks(H100, "lstm", 256, 24) == blocks(H100, "lstm", 320, 12) == 64
    assert blocks(H100, "lstm", 800, 20) == blocks(H100, "lstm", 200, 16, bidirectional=True) == _sms()
    assert blocks(H100, "lstm", 96, 65) == blocks(H100, "lstm", 64, 128) == _sms()
    assert blocks(H100, "lstm", 96, 1, persistent_blocks=32) == 32
    assert blocks(H100, "lstm", 96, 1, persistent="off") is None
    # the device model's shared memory decides: an L40S's 99 KB per block does not hold H = 96's
    l40s = {"kind": "cuda", "arch": "sm_89"}
    assert blocks(l40s, "gru", 96, 1) == 8 and blocks(l40s, "lstm", 256, 1) == 32
    assert device.persistent_blocks(device.resolve(H100), BuildOptions()) == _sms()  # no configuration
    # where the rule's count cannot keep the weights on chip beside the staged rows and partial
    # sums, a loop tries twice as many blocks, and so on up to one per SM
    h100 = device.resolve(H100)
    caps = device.persistent_block_caps(h100, BuildOptions(), Config(CELLS["gru"], 128, 128, 1, False, 8, False))
    assert caps == (1, 2, 4, 8, 16, 32, 64, 128, _sms())
    assert device.persistent_block_caps(h100, BuildOptions(persistent_blocks=1), None) == (1,)
    assert device.persistent_block_caps(h100, BuildOptions(), Config(CELLS["lstm"], 96, 96, 1, False, 64, False)) \
        == (32, 64, 128, _sms())
    assert device.persistent_block_caps(h100, BuildOptions(), Config(CELLS["lstm"], 96, 96, 1, False, 65, False)) \
        == (_sms(),)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_small_steps_that_do_not_fit_one_block_take_more():
    """GRU N=8 H=128: one block holds its 192 KB of weights but not beside 8 staged rows and the
    partial sums, so the forwards' persistent loops take 2 blocks (rnn.persistent_blocks says so),
    not launches a step; with 1 block asked for, no retry: launches (the backward's split-K step,
    whose block holds its weights and fewer partial sums, stays persistent in its one block)."""
    sizes = dict(input_size=128, hidden_size=128, batch_size=8, target=H100, tuning_logs=False, cache=False)
    # (split-K's blocks: by default these steps take blocks of row groups, a row a block)
    rnn = tvmrnn.build("gru", options=BuildOptions(row_groups=False, **STEPS), **sizes)
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward"].blocks_used == 2
    # the backward's step (8 x 128 x 384 multiply-adds) in 4 blocks, not 1 that would hold its weights
    # (common.GPU_BACKWARD_BLOCK_WORK); the package needs the most any loop takes
    assert rnn.programs["backward"].blocks_used == 4 and rnn.persistent_blocks == 4
    one = tvmrnn.build("gru", options=BuildOptions(persistent_blocks=1, **STEPS), **sizes)
    assert not one.programs["forward"].uses_persistent_loops
    assert one.persistent_blocks == (1 if one.programs["backward"].uses_persistent_loops else None)


def test_launch_flags_keep_dynamic_shared_memory_last():
    from tvmrnn.program.sequence import with_launch_flag
    assert with_launch_flag(["blockIdx.x", "threadIdx.x", "tirx.use_programtic_dependent_launch",
                             "tirx.use_dyn_shared_memory"], "tirx.use_cooperative_launch") == [
        "blockIdx.x", "threadIdx.x", "tirx.use_programtic_dependent_launch", "tirx.use_cooperative_launch",
        "tirx.use_dyn_shared_memory"]
    assert with_launch_flag(["blockIdx.x"], "f") == ["blockIdx.x", "f"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell", ["lstm", slow("gru"), slow("rnn_relu")])
def test_cuda_persistent_forward_by_default_launched_cooperatively(cell, tmp_path):
    """By default (``persistent="auto"``; PDL ``wait``) both forwards' time loops (inference and
    training) are persistent where the step's weights fit in the SMs' shared memory, the backward's
    (split-K at 20 rows) are per-step launches, and the persistent kernels alone
    are launched cooperatively (all blocks resident, or an error at launch: never a hang);
    where the weights do not fit (H = 3072: 38 MB for a one-gate cell, 151 MB for an LSTM, against
    132 x 227 KB) the loop keeps per-step launches."""
    rnn = tvmrnn.build(cell, input_size=800, hidden_size=800, num_layers=2, batch_size=20, target=H100,
                       tuning_logs=False, options=BuildOptions(persistent="auto"))
    assert rnn.programs["forward"].uses_persistent_loops and rnn.persistent_blocks == _sms()
    assert rnn.programs["forward_train"].uses_persistent_loops
    assert not rnn.programs["backward"].uses_persistent_loops
    source = rnn.executable.mod.imports[0].inspect_source()
    kernels = _kernel_definitions(source)
    persistent = [k for k in kernels if "wait_until" in k]
    assert len(persistent) == 4  # one per layer and forward
    cooperative, dependent = _launch_flags(rnn, tmp_path)
    assert cooperative == len(persistent) and dependent == len(kernels)
    big = tvmrnn.build(cell, input_size=64, hidden_size=3072, batch_size=20, target=H100, tuning_logs=False,
                       options=BuildOptions(persistent="auto", **STEPS))
    assert not big.programs["forward"].uses_persistent_loops and big.persistent_blocks is None
    assert _launch_flags(big, tmp_path)[0] == 0
    plain = tvmrnn.build(cell, input_size=800, hidden_size=800, batch_size=20, target=H100, tuning_logs=False,
                         options=BuildOptions(persistent="off", **STEPS))
    assert plain.persistent_blocks is None and _launch_flags(plain, tmp_path)[0] == 0


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_persistent_inference_forward_only():
    """``persistent="forward"``: the inference forward's time loop is one persistent launch
    (weights in shared memory); the training passes keep their per-step launches."""
    rnn = tvmrnn.build("lstm", input_size=800, hidden_size=800, batch_size=20, target=H100, tuning_logs=False,
                       options=BuildOptions(persistent="forward", **STEPS))
    source = rnn.executable.mod.imports[0].inspect_source()
    kernels = source.split("extern \"C\" __global__")[1:]
    persistent = [re.search(r"void (?:__launch_bounds__\(\d+\) )?(\w+)\(", k).group(1) for k in kernels if "for (int step = 0; step < " in k]
    assert len(persistent) == 1 and persistent[0].startswith("forward_kernel"), persistent
    assert rnn.programs["forward"].uses_persistent_loops
    assert not rnn.programs["forward_train"].uses_persistent_loops
    assert not rnn.programs["backward"].uses_persistent_loops
    assert rnn.persistent_blocks == _sms()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_persistence_skips_two_direction_steps():
    """``persist_stacked=False``: both directions of a layer in one launch per step stay a host
    loop of launches under ``persistent`` (the default before v21, when staging the hidden
    state in phases made them faster persistent); with the directions apart
    (``stack_directions=False``), each direction's loop is persistent. By default the stacked
    loop is persistent too."""

    def persistent_kernels(rnn):
        source = rnn.executable.mod.imports[0].inspect_source()
        return [k for k in source.split("extern \"C\" __global__")[1:] if "for (int step = 0; step < " in k]

    build = dict(input_size=24, hidden_size=40, num_layers=2, bidirectional=True, batch_size=3,
                 target=H100, tuning_logs=False)
    stacked = tvmrnn.build("rnn_tanh", **build,
                           options=BuildOptions(persistent="forward", persist_stacked=False, **STEPS))
    assert not persistent_kernels(stacked) and not stacked.programs["forward"].uses_persistent_loops
    assert stacked.persistent_blocks is None  # so its package asks for no resident grid
    apart = tvmrnn.build("rnn_tanh", **build, options=BuildOptions(persistent="forward", persist_stacked=False,
                                                                    stack_directions=False, **STEPS))
    assert apart.programs["forward"].uses_persistent_loops
    assert len(persistent_kernels(apart)) == 4  # 2 layers x 2 directions
    # 3 rows: a block a launch, a launch a direction (device.small_step_blocks); 132 blocks where asked
    assert apart.persistent_blocks == 1
    default = tvmrnn.build("rnn_tanh", **build, options=BuildOptions(persistent="forward", **STEPS))
    assert default.programs["forward"].uses_persistent_loops
    assert len(persistent_kernels(default)) == 2  # a layer's two directions in one kernel
    assert default.persistent_blocks == 2
    every_sm = tvmrnn.build("rnn_tanh", **build, options=BuildOptions(persistent="forward", persistent_blocks=_sms(),
                                                                       **STEPS))
    assert len(persistent_kernels(every_sm)) == 2 and every_sm.persistent_blocks == _sms()


@pytest.mark.parametrize("hidden,bidirectional", [(128, False), (160, True)])
def test_cuda_persistent_steps_keep_all_their_shared_memory_dynamic(hidden, bidirectional):
    """A persistent step whose staged weights and hidden state are dynamic shared memory keeps its
    partial sums there too. TVM's runtime opts a kernel into more than 48 KB of shared memory only
    when its dynamic part alone passes 48 KB; 40 KB of static partial sums beside 13 KB of dynamic
    buffers (H = 128, N = 20) was refused at launch on the H100 (v22)."""
    rnn = tvmrnn.build("lstm", 96, hidden, bidirectional=bidirectional, batch_size=20, target=H100,
                       tuning_logs=False, options=BuildOptions(persistent="auto", **STEPS))
    persistent = [k for k in _kernel_definitions(rnn.executable.mod.imports[0].inspect_source())
                  if "grid_barrier" in k.split("\n", 1)[0]]
    assert persistent
    for kernel in persistent:
        if "buf_dyn_shmem" in kernel:
            static = re.findall(r"^\s*__shared__ .*?\[(\d+)\];", kernel, re.M)
            assert sum(int(n) for n in static) * 4 <= 1024, (kernel.split("(", 1)[0], static)


def _kernel_with_shared(static_floats: int, dynamic_floats: int):
    """A one-block CUDA kernel that stages ``a`` through a static and a dynamic shared buffer."""
    from tvm.script import tirx as T
    n = max(static_floats, dynamic_floats)

    @T.prim_func(s_tir=True)
    def main(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        for bx in T.thread_binding(1, thread="blockIdx.x"):
            for tx in T.thread_binding(128, thread="threadIdx.x"):
                with T.sblock("root_kernel"):
                    s = T.sblock_alloc_buffer((static_floats,), "float32", scope="shared")
                    d = T.sblock_alloc_buffer((dynamic_floats,), "float32", scope="shared.dyn")
                    for i in range(static_floats // 128):
                        with T.sblock("load_s"):
                            s[i * 128 + tx] = a[i * 128 + tx]
                    for i in range(dynamic_floats // 128):
                        with T.sblock("load_d"):
                            d[i * 128 + tx] = a[i * 128 + tx]
                    for i in range(n // 128):
                        with T.sblock("store"):
                            b[i * 128 + tx] = s[(i * 128 + tx) % static_floats] + d[(i * 128 + tx) % dynamic_floats]
    return main


def test_cuda_kernels_refused_at_build_when_their_shared_memory_would_be_refused_at_launch():
    """A CUDA kernel whose static and dynamic shared memory together pass 48 KB while the dynamic
    part alone does not is refused when it is compiled, naming the kernel and its bytes: TVM's
    runtime would not opt it in past 48 KB and every launch would fail (v22's persistent step at
    H = 128 did, on the H100). Under 48 KB in all, or with the dynamic part past 48 KB (opted in),
    it compiles; so does every default build (the tests above build them)."""
    import tvm
    from tvmrnn.program.sequence import compile_module, shared_memory_bytes
    target = tvm.target.Target("nvidia/nvidia-h100")

    def build(static_floats, dynamic_floats):
        return compile_module(tvm.IRModule({"main": _kernel_with_shared(static_floats, dynamic_floats)}), target)

    with pytest.raises(tvmrnn.SharedMemoryError, match=r"kernel main\w*: 40960 bytes of static and 12800 bytes of dynamic"):
        build(10240, 3200)  # v22's sizes: 40 KB of partial sums beside 12.5 KB of dynamic buffers
    build(10240, 1280)  # 45 KB in all
    build(1280, 15360)  # 60 KB dynamic: TVM opts it in
    assert shared_memory_bytes(_kernel_with_shared(256, 512)) == (1024, 2048)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("cell,batch,hidden,bidirectional,independent", [
    ("gru", 128, 128, False, True), ("lstm", 256, 64, False, True), ("lstm", 131, 57, True, True),
    ("rnn_tanh", 129, 200, False, True), ("lstm", 128, 128, False, False)])
def test_cuda_row_groups_meet_without_a_grid_barrier(cell, batch, hidden, bidirectional, independent):
    """Persistent row tiles whose blocks each own all units of their rows (the direction's weights
    fit a block: GRU H=128's 192 KB, not the LSTM's 256 KB) read only what their own block wrote:
    their time loops meet at ``__syncthreads`` alone (no counter to wait on, no cooperative
    launch, no reset), every pass. Where a block holds part of the units, the grid barrier stays."""
    rnn = tvmrnn.build(cell, input_size=hidden, hidden_size=hidden, batch_size=batch, bidirectional=bidirectional,
                       target=H100, tuning_logs=False, options=BuildOptions(**STEPS))
    assert all(rnn.programs[name].uses_persistent_loops for name in ("forward", "forward_train"))
    source = rnn.executable.mod.imports[0].inspect_source()
    loops = [k for k in _kernel_definitions(source) if "for (int step = 0; step < " in k]
    assert loops
    for kernel in loops:
        assert ("wait_until" in kernel) != independent and ("grid_barrier" in kernel) != independent
        assert "__syncthreads" in kernel


def test_row_group_tiles_wherever_the_weights_fit():
    """The persistent row-tile rule (no GPU needed): a tile whose blocks own all the units of their
    rows wherever the direction's weights fit a block, else a tile with a grid barrier. Given knob
    values are kept."""
    from tvmrnn.device import GPU_FACTS
    from tvmrnn.schedules.row_tiles import persistent_row_tiles
    budget = GPU_FACTS["sm_90"]["shared_bytes_per_block"]

    def tile(rows, units, inner, problems=1, **given):
        return persistent_row_tiles(rows, units, inner, units, problems, 132, budget, **given)

    for rows, units, inner in ((128, 128, 3), (256, 64, 4), (131, 57, 4), (128, 100, 4), (192, 96, 3)):
        for problems in (1, 2):
            tr, tu, rt, ut, _ = tile(rows, units, inner, problems)
            assert ut * tu >= units and rt * ut <= 1024, (rows, units, inner, problems)  # all the units
            assert problems * -(-rows // (tr * rt)) <= 132
            assert 4 * units * (units * inner + tr * rt) <= budget
    # the LSTM's 256 KB at H=128 fit no block: units split over blocks, with a barrier
    tr, tu, rt, ut, _ = tile(128, 128, 4)
    assert ut * tu < 128
    # an Elman RNN at H=200: its independent tile (256 threads, one row), though it reads 4/3 the
    # shared memory a step of a barrier tile with two rows a thread (0.47 against 0.61 ms on the H200)
    chosen = tile(128, 200, 1)
    assert chosen[3] * chosen[1] >= 200
    given = tile(128, 128, 3, thread_rows=2, unit_threads=32)  # a tuning candidate's knobs are kept
    assert given[0] == 2 and given[3] == 32


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_backward_rows_staged_in_chunks_beside_the_weights(tmp_path):
    """An LSTM's backward step at N = 160, H = 384 (H200 v55): a block's weights (32 units x 1,536
    columns, 192 KB) and its 16 rows of ``dgh`` whole (96 KB) do not fit 227 KB together, so the
    rows are staged 512 columns at a time (3 chunks a step, 32 KB) while
    the weights stay in dynamic shared memory for every step: the backward's time loop is
    persistent (it was one launch a step: 38.8 against 20.5 us a step), compiled unspilled."""
    rnn = tvmrnn.build("lstm", input_size=256, hidden_size=384, batch_size=160, target=H100, tuning_logs=False,
                       cache=False)
    assert all(rnn.programs[p].uses_persistent_loops for p in ("forward", "forward_train", "backward"))
    source = rnn.executable.mod.imports[0].inspect_source()
    loops = [k for k in _kernel_definitions(source) if "for (int step = 0; step < " in k and "dgx_ptr" in k]
    assert len(loops) == 1
    before, loop = loops[0].split("for (int step = 0; step < ", 1)
    assert "__shared__ alignas" not in before  # all dynamic: TVM opts in past 48 KB for that alone
    # 3 chunks a step, each copied by the block's 256 threads (16 rows x 512 columns: 32 loads each;
    # row_tiles.BACKWARD_PERSISTENT_THREADS, v83: 128 threads of 4 rows each before)
    chunks = re.search(r"for \(int \w+ = 0; \w+ < 3; \+\+\w+\) \{\s*__syncthreads\(\);(.*?)__syncthreads", loop, re.S)
    assert chunks and chunks.group(1).count("= dgx_ptr[") == 32
    assert "__launch_bounds__(256)" in loops[0]
    assert "w_ptr[" in before and "w_ptr[" not in loop  # the weights' copy hoisted out of the time loop
    report = _ptxas(source, tmp_path)
    assert "spill" in report and not re.search(r"[1-9]\d* bytes spill", report)


def test_row_chunk_knob_stages_rows_in_chunks_of_its_value():
    """The persistent row tiles' ``row_chunk`` knob (tuning's choice of how a block stages its
    rows): AUTO keeps the rule (whole where they fit: the GRU's backward at H = 384; else the
    largest chunk: the LSTM's, 512 columns), a value stages that many columns at a time whether or
    not the rows fit whole. Only persistent steps have it. Read in TIR (no GPU, no compile)."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import default_schedule, knobs
    from tvmrnn.schedules.common import _divisor
    target = tvm.target.Target(H100)

    def chunk_loops(func):  # the extents of the serial loops around a copy of the rows into shared memory
        lines = func.script().splitlines()
        found = []
        for i, line in enumerate(lines):
            if 'with T.sblock("dgh_shared' in line:
                loops = [re.match(r"\s*for \w+ in range\((\d+)\):", x) for x in lines[max(0, i - 8):i]]
                found += [int(m.group(1)) for m in loops if m]
        return found

    for cell, auto in (("lstm", 3), ("gru", None)):
        step = kernels.persistent(kernels.backward_step(CELLS[cell], 160, 384), 132)
        found = {k.name: k for k in knobs.knobs(step, target)}
        assert found["row_chunk"].default == knobs.AUTO
        G = CELLS[cell].num_gates
        values = knobs.defaults(tuple(found.values()))
        rule = chunk_loops(default_schedule(step, target, **knobs.tiles_of(step, target, values)))
        assert (rule == [auto]) if auto else not rule, (cell, rule)
        given = chunk_loops(default_schedule(step, target, **knobs.tiles_of(step, target, {**values, "row_chunk": 128})))
        assert given == [384 // _divisor(384, 128 // G)], (cell, given)  # chunks of whole units (all G gates)
    assert "row_chunk" not in {k.name for k in knobs.knobs(kernels.backward_step(CELLS["lstm"], 160, 384), target)}


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_steps_of_few_rows_take_blocks_of_row_groups(tmp_path):
    """A persistent step of fewer than 128 rows whose direction's weights fit one block (the LSTM at
    N = 13, H = 90: 130 KB of the H100's 227) runs in blocks that split the rows alone (here a row a
    block: 13 blocks), each holding every weight on chip, with no grid barrier (no atomics, no
    polling), in every pass (``BuildOptions.row_groups``, common.GPU_ROW_GROUP_STEPS). Where the
    weights do not fit a block (H = 128: 262 KB), on a device whose blocks have less shared memory
    (an L40S, 99 KB), with ``row_groups=False`` or with a block count asked for, the steps keep
    split-K's blocks and grid barrier, as many as device.small_step_blocks gives 9-64 rows (a block
    per 4 units, to the nearest power of two)."""
    sizes = dict(input_size=90, hidden_size=90, batch_size=13, target=H100, tuning_logs=False)

    def steps(rnn):
        return sorted(n for n in rnn.schedules if "_persistent" in n)

    def loops(rnn):
        source = rnn.executable.mod.imports[0].inspect_source()
        return [k for k in source.split("extern \"C\" __global__")[1:] if "for (int step = 0; step < " in k]

    rows = tvmrnn.build("lstm", options=BuildOptions(**STEPS), **sizes)
    assert [n.split("_n13")[0] for n in steps(rows)] == ["backward_step_lstm", "recurrent_step_lstm_infer",
                                                        "recurrent_step_lstm_train"]
    assert all(n.endswith("_persistent_rows") for n in steps(rows)) and rows.persistent_blocks == 13
    assert all(rows.programs[p].uses_persistent_loops for p in ("forward", "forward_train", "backward"))
    assert len(loops(rows)) == 3 and not any("atomic_add" in k or "wait_until" in k for k in loops(rows))
    assert all(re.search(r"\(\(int\)blockIdx\.x\) \* 90\)", k) for k in loops(rows))  # a block's own row
    report = _ptxas(rows.executable.mod.imports[0].inspect_source(), tmp_path)
    assert "spill stores" in report and not re.search(r"[1-9]\d* bytes spill", report)

    for options, other in [(dict(row_groups=False), {}), (dict(persistent_blocks=16), {}),
                           ({}, dict(input_size=128, hidden_size=128, batch_size=16)),
                           ({}, dict(target={"kind": "cuda", "arch": "sm_89"}))]:
        split = tvmrnn.build("lstm", options=BuildOptions(**STEPS, **options), **dict(sizes, **other))
        assert steps(split) and not any(n.endswith("_rows") for n in steps(split)), (options, other)
        assert all("atomic_add" in k for k in loops(split)), (options, other)
        H, arch = split.config.hidden_size, other.get("target")
        expected = 16 if arch else {90: 16, 128: 32}[H]  # (sm_89: 142 SMs, the same rule)
        assert split.persistent_blocks == expected, (options, other, split.persistent_blocks)
    with pytest.raises(TypeError, match="options.row_groups: expected None, True or False"):
        BuildOptions(row_groups=1)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_cuda_lstm_steps_of_few_rows_take_row_tiles_where_their_weights_pass_a_block(tmp_path):
    """An LSTM's persistent steps of 32-127 rows a direction at up to 160 units whose weights do not
    fit one block (N = 48, H = 160: 410 KB) take row tiles (common.GPU_FEW_ROW_TILE_ROWS, v83: on
    the H100 training 2.58 -> 1.99 ms at T = 200): blocks that split the units and meet at a grid
    barrier, every pass persistent, compiled unspilled. Split-K stays below 32 rows, past 160
    units (H = 200: inference 19% slower on row tiles), for the GRU (3 gates: 6-30% slower) and for
    both directions stacked (not measured)."""
    import tvm
    from tvmrnn import kernels
    from tvmrnn.cells.definition import CELLS
    from tvmrnn.schedules import knobs
    target = tvm.target.Target(H100)
    rnn = tvmrnn.build("lstm", input_size=40, hidden_size=160, batch_size=48, target=H100, tuning_logs=False,
                       cache=False, options=BuildOptions(**STEPS))
    steps = {k.name: knobs.family(k, target) for p in rnn.programs.values() for k in p.kernels.values()
             if k.name.endswith("_persistent")}
    assert set(steps.values()) == {"row_tiles"} and len(steps) == 3, steps
    assert all(rnn.programs[p].uses_persistent_loops for p in ("forward", "forward_train", "backward"))
    source = rnn.executable.mod.imports[0].inspect_source()
    loops = [k for k in _kernel_definitions(source) if "for (int step = 0; step < " in k]
    assert len(loops) == 3 and all("atomic_add" in k for k in loops)  # the units split: a grid barrier
    report = _ptxas(source, tmp_path)
    assert "spill stores" in report and not re.search(r"[1-9]\d* bytes spill", report)
    for cell, batch, hidden in [("lstm", 24, 160), ("lstm", 32, 200), ("gru", 48, 160), ("lstm", 32, 126)]:
        for step in (kernels.recurrent_step(CELLS[cell], batch, hidden, train=True),
                     kernels.backward_step(CELLS[cell], batch, hidden)):
            expected = "row_tiles" if (cell, hidden) == ("lstm", 126) else "persistent"  # (split-K's persistent form)
            assert knobs.family(kernels.persistent(step, 132), target) == expected, (cell, batch, hidden, step.name)
    stacked = kernels.recurrent_step(CELLS["lstm"], 48, 160, train=True, directions=2)  # (not measured)
    assert knobs.family(kernels.persistent(stacked, 132), target) == "persistent"
    # weights that fit one block: row groups where they are on, else split-K (not this rule)
    assert knobs.family(kernels.persistent(kernels.recurrent_step(CELLS["lstm"], 48, 90, train=True), 16),
                        target) == "persistent"
