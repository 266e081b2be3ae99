"""The correctness tests on a CUDA GPU with the default GPU schedule (skipped without a GPU).

Inputs are torch CUDA tensors (passed through DLPack); references are torch.nn on the CPU in
float64, so cuDNN plays no part in what counts as right.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import tvm

import tvmrnn
from conftest import H, I, N, built, check_half_build, torch_module
from tvmrnn import BuildOptions
from test_rnn import CELLS, _check

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and tvm.cuda(0).exist),
                                reason="needs a CUDA GPU visible to both torch and TVM")


def to_cuda(a):
    return (a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))).cuda()


def built_as_checked(cell, num_layers, bidirectional, hidden=H, **build):
    """The build ``test_rnn._check(..., target="cuda")`` made: the same arguments, so that
    ``conftest.built``'s cache returns it instead of building again."""
    return built(cell, num_layers, bidirectional, False, input_size=I, hidden_size=hidden, batch_size=N,
                 target="cuda", **build)


# The CPU suite runs the whole grid (test_rnn.py). Here, where every build costs GPU-machine time, a
# subset that still reaches every GPU code path: one and three layers (inner layers read the layer
# below), both directions, batch-first once; T = 1 (the backward's time loop runs zero times),
# 7 (a 4-step chunk of the all-steps GEMMs and single steps) and 50 (32- and 4-step chunks, single
# steps); test_long_sequences reaches the 256-step chunks, and at 64 rows the 128- and 64-step ones.
LAYOUTS = [(1, False, False), (1, True, False), (3, False, False), (3, True, False), (2, True, True)]


@pytest.mark.parametrize("T", [1, 7, 50])
@pytest.mark.parametrize("num_layers,bidirectional,batch_first", LAYOUTS,
                         ids=["1uni", "1bidir", "3uni", "3bidir", "2bidir-batch_first"])
@pytest.mark.parametrize("cell", CELLS)
def test_matches_torch_on_cuda(cell, num_layers, bidirectional, batch_first, T, rng):
    _check(cell, num_layers, bidirectional, batch_first, T, rng, target="cuda", as_array=to_cuda)


@pytest.mark.parametrize("cell,T,batch", [("lstm", 300, N), ("gru", 300, N), ("lstm", 231, 64)])
def test_long_sequences_match_torch_on_cuda(cell, T, batch, rng):
    """300 steps: 256 + 32 + 3 x 4-step chunks. 231 steps at 64 rows (``passes.GPU_WIDE_CHUNK_STEPS``):
    the gradients over 128 + 64 + 32 + 4 + 3 x 1 steps, the projections over two overlapping
    128-step chunks, a 64-step one, or 128 + 64 + 32 + ... (the tail's cost decides)."""
    _check(cell, 1, True, False, T, rng, target="cuda", as_array=to_cuda, batch=batch)


@pytest.mark.parametrize("limits", ["sm_80", "sm_89"], ids=["a100", "l40s"])
@pytest.mark.parametrize("cell,batch,hidden", [("lstm", 20, 512), ("gru", 128, 96)],
                         ids=["persistent_split_k", "row_groups"])
def test_builds_held_to_other_gpus_limits_run_correctly(limits, cell, batch, hidden, rng, monkeypatch):
    """Issue 37's device model: a build for this GPU whose model holds an A100's limits (108 SMs,
    163 KB of shared memory a block) or an L40S's (99 KB a block) takes those block counts and
    budgets (the persistent loops' weights spread over more, smaller slices) and runs correctly
    here, forward and backward against float64. The L40S's 142 SMs are capped at this GPU's: a
    persistent loop's blocks must all be resident for its grid barrier."""
    from tvmrnn import device
    sms = tvm.cuda(0).multi_processor_count
    facts = dict(device.GPU_FACTS[limits], multiprocessors=min(device.GPU_FACTS[limits]["multiprocessors"], sms))
    arch = "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    monkeypatch.setitem(device.GPU_FACTS, arch, facts)
    monkeypatch.setattr(device, "is_arch_of", lambda arch, dev: False)  # the driver's SM count: not read
    built.cache_clear()  # builds are cached by their arguments, which do not say this
    try:
        model = device.device_model(tvm.target.Target("cuda"))
        assert (model.multiprocessors, model.shared_bytes_per_block) == (facts["multiprocessors"],
                                                                         facts["shared_bytes_per_block"])
        _check(cell, 1, True, False, 20, rng, target="cuda", as_array=to_cuda, hidden=hidden, input_size=hidden,
               batch=batch)
        rnn = built(cell, 1, True, False, input_size=hidden, hidden_size=hidden, batch_size=batch, target="cuda")
        # an SM each, except the LSTM's two directions' weights (8 MB), which 99 KB blocks do not hold
        fits = not (limits == "sm_89" and cell == "lstm")
        assert rnn.persistent_blocks == (facts["multiprocessors"] if fits else None)
    finally:
        built.cache_clear()


@pytest.mark.parametrize("cell,layers,bidirectional,batch", [("lstm", 2, False, 2), ("gru", 1, True, 3),
                                                               ("rnn_tanh", 1, False, 1)])
def test_padded_step_reductions_match_torch_on_cuda(cell, layers, bidirectional, batch, rng, monkeypatch):
    """Forward steps whose state size is prime (H = 131) with ``passes.GPU_PADDED_REDUCTION``: the
    GEMM's reduction padded to 160, the products past 131 guarded to zero (written in v91, first
    run here): persistent and launched steps, a wavefront of two layers, both directions in one
    step, batch 1; forward and training against torch.nn."""
    from tvmrnn.program import passes
    monkeypatch.setattr(passes, "GPU_PADDED_REDUCTION", True)
    built.cache_clear()  # builds are cached by their arguments, which do not say this
    try:
        rnn = built(cell, layers, bidirectional, False, input_size=I, hidden_size=131, batch_size=batch, target="cuda")
        steps = [n for n in rnn.schedules if re.match(r"(recurrent_step|backward_step|recurrent_backward)_", n)]
        assert steps and all("_r160" in n for n in steps), steps
        _check(cell, layers, bidirectional, False, 50, rng, target="cuda", as_array=to_cuda, hidden=131, batch=batch)
    finally:
        built.cache_clear()


@pytest.mark.parametrize("cell", CELLS)
def test_reductions_split_over_blocks_match_torch_on_cuda(cell, rng, monkeypatch):
    """Every per-step GEMM's reduction split over blocks (``GPU_BLOCK_SLICE`` made small: the test
    sizes' reductions are short), a partial-sums kernel and the epilogue's kernel per step."""
    from tvmrnn.schedules import split_k
    monkeypatch.setattr(split_k, "GPU_BLOCK_SLICE", 8)  # read by split_k.default_block_slices
    built.cache_clear()  # builds are cached by their arguments, which do not say this
    try:
        _check(cell, 2, True, False, 7, rng, target="cuda", as_array=to_cuda, hidden=40)
    finally:
        built.cache_clear()


@pytest.mark.parametrize("T", [1, 7, 50])
@pytest.mark.parametrize("cell", CELLS)
def test_kernels_per_call_site_match_torch_on_cuda(cell, T, rng):
    """``shared_kernels=False``: a kernel per call site with its view offsets compiled in (the
    default before v20; every other test here runs the default, one compiled kernel per distinct
    code launched with the offsets in its pointers); 3 bidirectional layers (inner layers, both
    directions, every chunk size up to 32 steps) and 1 unidirectional layer (the persistent
    inference forward)."""
    options = BuildOptions(shared_kernels=False)
    _check(cell, 3, True, False, T, rng, target="cuda", as_array=to_cuda, options=options)
    _check(cell, 1, False, False, T, rng, target="cuda", as_array=to_cuda, options=options)
    rnn = built_as_checked(cell, 3, True, options=options)
    assert not any(p.view_pointers for p in rnn.programs.values())


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_relu"])
def test_all_steps_gemms_split_over_blocks_match_torch_on_cuda(cell, rng, monkeypatch):
    """The all-steps GEMMs of short chunks with their reduction split over blocks (``gpu_matmul``'s
    ``k_slices``: a partial GEMM per slice, then the epilogue's kernel), made to split at the test
    sizes: every GEMM that fills less than a quarter of the GPU, in slices of 16 or more. T = 7
    and 50 run 4- and 32-step chunks of the input projection, input and weight gradients."""
    from tvmrnn.schedules import cuda
    monkeypatch.setattr(cuda, "GPU_MATMUL_MIN_SLICE", 16)  # read by cuda.matmul_k_slices
    built.cache_clear()  # builds are cached by their arguments, which do not say this
    try:
        for T in (7, 50):
            _check(cell, 2, True, False, T, rng, target="cuda", as_array=to_cuda, hidden=40)
    finally:
        built.cache_clear()


@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("layers_directions", [(1, False), (2, True)], ids=["1uni", "2bidir"])
@pytest.mark.parametrize("name", ["peephole_lstm", "cifg_lstm", "mgu", "leaky_rnn"])
def test_custom_cells_match_their_references_on_cuda(name, layers_directions, T, rng):
    from test_custom_cells import _check as check_custom
    check_custom(name, *layers_directions, T, rng, target="cuda", as_array=to_cuda)


def test_outputs_are_cuda_tensors_and_numpy_is_refused():
    rnn = built("gru", 1, False, target="cuda")
    torch.manual_seed(0)
    w = rnn.pack_weights(tvmrnn.params_from_torch(torch_module("gru", I, 37, 1, False, False)))
    x = torch.randn(5, N, I, device="cuda")
    y, hy, cy = rnn.forward(w, x)
    assert y.is_cuda and hy.is_cuda and cy is None
    with pytest.raises(ValueError, match="x: this RNN was built for cuda"):
        rnn.forward(w, x.cpu().numpy())


def test_h100_package_in_a_fresh_process_through_the_torch_dropin(tmp_path):
    """Export for nvidia/nvidia-h100, load elsewhere, train-step through tvmrnn.torch.LSTM on CUDA."""
    import os
    import subprocess
    import sys
    path = tmp_path / "lstm_h100.so"
    tvmrnn.build("lstm", input_size=I, hidden_size=37, num_layers=2, bidirectional=True, batch_size=N,
                 target="nvidia/nvidia-h100").export(path)
    script = f"""
import torch, tvmrnn, tvmrnn.torch as tt
torch.backends.cudnn.allow_tf32 = False
rnn = tvmrnn.load({str(path)!r}, device="cuda")
torch.manual_seed(0)
ref = torch.nn.LSTM({I}, 37, 2, bidirectional=True).cuda()
ours = tt.LSTM({I}, 37, 2, bidirectional=True, package=rnn).cuda()
ours.load_state_dict(ref.state_dict())
x = torch.randn(20, {N}, {I}, device="cuda", requires_grad=True)
err = lambda a, b: ((a - b).norm() / b.norm()).item()
y, (h, c) = ours(x); (y.sum() + h.sum() + c.sum()).backward()
gx, gw = x.grad.clone(), ours.weight_hh_l1_reverse.grad
x.grad = None
yr, (hr, cr) = ref(x); (yr.sum() + hr.sum() + cr.sum()).backward()
worst = max(err(y, yr), err(gx, x.grad), err(gw, ref.weight_hh_l1_reverse.grad))
print(f"h100 package via tvmrnn.torch.LSTM vs torch.nn.LSTM (cuDNN): y {{err(y, yr):.1e}}, dx {{err(gx, x.grad):.1e}}, dW {{err(gw, ref.weight_hh_l1_reverse.grad):.1e}}")
assert worst < 1e-4, worst
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(run.stdout)
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize("T", [1, 50])
@pytest.mark.parametrize("cell", CELLS)
def test_persistent_time_loops_match_torch_on_cuda(cell, T, rng):
    """``persistent="all"``: every time loop one launch, blocks meeting at a grid barrier per step
    (the directions of a layer apart, ``stack_directions=False``)."""
    options = BuildOptions(persistent="all", stack_directions=False)
    _check(cell, 2, True, False, T, rng, target="cuda", as_array=to_cuda, options=options)
    rnn = built_as_checked(cell, 2, True, options=options)
    assert all(p.uses_persistent_loops for p in rnn.programs.values() if not p.name.startswith("pack_")), \
        [p.name for p in rnn.programs.values() if not p.uses_persistent_loops]


@pytest.mark.parametrize("T", [1, 50])
@pytest.mark.parametrize("cell", CELLS)
def test_two_direction_persistent_loops_match_torch_on_cuda(cell, T, rng, monkeypatch):
    """``persist_stacked=True``, ``persistent="auto"``: both forwards run both directions of a layer
    in one persistent launch, each block on one direction's units, the hidden state staged in 2
    phases of the reduction (forced here: at these sizes it fits whole); and a one-direction
    layer's persistent loops with the same phases."""
    from tvmrnn import schedules  # PERSISTENT_TILES is read by schedules.apply, in the package itself
    monkeypatch.setattr(schedules, "PERSISTENT_TILES", {**schedules.PERSISTENT_TILES, "row_phases": 2})
    options = BuildOptions(persistent="auto", persist_stacked=True, stack_directions=True)
    built.cache_clear()  # builds are cached by their arguments, which do not say "row_phases"
    try:
        _check(cell, 2, True, False, T, rng, target="cuda", as_array=to_cuda, hidden=40, options=options)
        rnn = built_as_checked(cell, 2, True, hidden=40, options=options)
        assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops
        # one direction, phased
        _check(cell, 1, False, False, T, rng, target="cuda", as_array=to_cuda, hidden=40, options=options)
    finally:
        built.cache_clear()


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_two_direction_persistent_loops_at_ds2_sizes_match_torch_on_cuda(cell, rng):
    """The same at Deep Speech 2 sizes (N = 20, H = 800, 7 steps), where the LSTM's blocks stage
    the hidden state in halves by themselves (``test_codegen_persistent.py`` checks the code):
    forward, training forward and backward against PyTorch in float64."""
    T, n, size = 7, 20, 800
    rnn = tvmrnn.build(cell, input_size=size, hidden_size=size, batch_size=n, bidirectional=True, target="cuda",
                       options=BuildOptions(persistent="auto", persist_stacked=True, stack_directions=True))
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops
    torch.manual_seed(0)
    ref = getattr(torch.nn, cell.upper())(size, size, bidirectional=True).double()
    w = rnn.pack_weights({k: to_cuda(v.detach().float().numpy()) for k, v in ref.state_dict().items()})
    x = rng.standard_normal((T, n, size)).astype(np.float32)
    y, _, _, ws = rnn.forward_train(w, to_cuda(x))
    y_inf = rnn.forward(w, to_cuda(x))[0]
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    yr = ref(xt)[0]
    for got in (y, y_inf):
        got = torch.as_tensor(got).cpu().double()
        assert float((got - yr.detach()).norm() / yr.detach().norm()) < 1e-4
    dy = rng.standard_normal(tuple(yr.shape)).astype(np.float32)
    yr.backward(torch.from_numpy(dy).double())
    grads = rnn.backward(w, ws, to_cuda(dy))
    dx = torch.as_tensor(grads["x"]).cpu().double()
    assert float((dx - xt.grad).norm() / xt.grad.norm()) < 1e-4
    dw = torch.as_tensor(grads["weight_hh_l0_reverse"]).cpu().double()
    assert float((dw - ref.weight_hh_l0_reverse.grad).norm() / ref.weight_hh_l0_reverse.grad.norm()) < 1e-4


def test_package_refuses_a_gpu_with_fewer_sms_than_its_persistent_blocks():
    from tvmrnn.runtime import package
    rnn = tvmrnn.build("gru", input_size=I, hidden_size=37, batch_size=N, target="cuda",
                       options=BuildOptions(persistent="all"))
    meta = package.metadata(rnn)
    assert rnn.persistent_blocks and meta["options"]["persistent"] == "all"
    assert meta["persistent_blocks"] == rnn.persistent_blocks <= tvm.cuda(0).multi_processor_count
    package.check_machine(meta, 0)
    meta["persistent_blocks"] = 10**6
    with pytest.raises(package.PackageError, match="resident"):
        package.check_machine(meta, 0)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_torch_dropin_under_cuda_graphs(cell):
    """``torch.cuda.make_graphed_callables`` captures a tvmrnn module's forward and backward (its
    kernels go to PyTorch's current stream, its buffers come from PyTorch's allocator); replays
    with new inputs match cuDNN, outputs and gradients."""
    import tvmrnn.torch as tt
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    T, H = 9, 37
    ref = getattr(torch.nn, cell.upper())(I, H, 2, bidirectional=True).cuda()
    ours = getattr(tt, cell.upper())(I, H, 2, bidirectional=True).cuda()
    ours.load_state_dict(ref.state_dict())
    sample = torch.randn(T, N, I, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(ours, (sample,))
    err = lambda a, b: float((a - b).detach().norm() / b.detach().norm())
    for _ in range(2):  # each replay reads its own input
        x = torch.randn(T, N, I, device="cuda", requires_grad=True)
        y, state = graphed(x)
        h = state[0] if cell == "lstm" else state
        (y.square().sum() + h.sum()).backward()
        gx, gw = x.grad.clone(), ours.weight_hh_l1_reverse.grad.clone()
        x.grad = None
        ours.zero_grad()
        yr, state_r = ref(x)
        hr = state_r[0] if cell == "lstm" else state_r
        (yr.square().sum() + hr.sum()).backward()
        assert err(y, yr) < 1e-4 and err(h, hr) < 1e-4
        assert err(gx, x.grad) < 1e-4 and err(gw, ref.weight_hh_l1_reverse.grad) < 1e-4
        x.grad = None
        ref.zero_grad()


def test_passes_run_on_torchs_current_stream_with_scratch_of_their_own():
    """The passes' kernels go to PyTorch's current stream (TVM's FFI takes it from the torch
    arguments): on side streams each held back by a long kernel, a forward reads the input that a
    copy on its stream wrote just before it. The two streams' passes then run at the same time,
    each with the scratch it keeps for its own stream (``RNN._scratch``), and both match cuDNN;
    so does a call on the default stream after them."""
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    T, H = 7, 37
    ref = torch.nn.LSTM(I, H).cuda()
    rnn = tvmrnn.build("lstm", I, H, batch_size=N, target="cuda", cache=False, tuning_logs=False)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    inputs = [torch.randn(T, N, I, device="cuda") for _ in range(2)]
    xs = [torch.zeros(T, N, I, device="cuda") for _ in range(2)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    outputs = []
    for stream, x, new in zip(streams, xs, inputs):
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            torch.cuda._sleep(20_000_000)  # ~10 ms of this stream before the copy and the pass
            x.copy_(new)
            outputs.append(rnn.forward(w, x)[0])
    torch.cuda.synchronize()
    outputs.append(rnn.forward(w, inputs[0])[0])
    with torch.no_grad():
        for y, x in zip(outputs, inputs + inputs[:1]):
            yr = ref(x)[0]
            assert float((y - yr).norm() / yr.norm()) < 1e-4


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_persistent_inference_forward_under_a_cuda_graph(cell):
    """The default build's inference forward is a persistent kernel, launched cooperatively: it
    runs under ``torch.no_grad``, is captured into a CUDA graph, and each replay (new input and
    state) matches cuDNN."""
    import tvmrnn.torch as tt
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    T, H = 23, 37
    ref = getattr(torch.nn, cell.upper())(I, H, 2).cuda()
    ours = getattr(tt, cell.upper())(I, H, 2).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(T, N, I, device="cuda")
    with torch.no_grad():
        ours(x)  # build (and warm up) outside the capture
        rnn = next(iter(ours._built.values()))
        assert rnn.programs["forward"].uses_persistent_loops, "the default build has no persistent loop"
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ours(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, _ = ours(x)
        for _ in range(2):
            x.copy_(torch.randn(T, N, I, device="cuda"))
            graph.replay()
            torch.cuda.synchronize()
            yr, _ = ref(x)
            assert float((y - yr).norm() / yr.norm()) < 1e-4


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_tuned_persistent_step_is_used_and_matches_torch_on_cuda(cell, tmp_path, rng):
    """Tuning the persistent steps (the forwards' for inference and training, and the backward's,
    all persistent with ``persistent="auto"``, the default):
    every listed shape measured as a loop of steps in one launch, logged per step; a build then
    takes the fastest and still matches PyTorch."""
    from tvmrnn import schedules
    from tvmrnn.tune import tasks, tuner
    from tvmrnn.cells.definition import CELLS as CELL_DEFS
    from tvmrnn.program.passes import Config
    target = tvm.target.Target("cuda")
    options = BuildOptions(persistent="auto")
    config = Config(CELL_DEFS[cell], I, 37, 1, False, N, False, options)
    results = tuner.tune([config], target, log_dir=str(tmp_path), trials_per_task=1, kernels=["_persistent"])
    # (the backward's step too: split-K steps this small run persistent, v57)
    assert sorted(task.kernel.name.split("_n")[0] for task, _, _ in results) == [
        f"backward_step_{cell}", f"recurrent_step_{cell}_infer", f"recurrent_step_{cell}_train"]
    for task, best, trials in results:
        assert tasks.is_persistent(task.kernel) and 1 < trials <= len(schedules.PERSISTENT_VARIANTS)
        # microseconds a step (a step loop's time divided by its steps): the GRU's step at N = 3,
        # H = 37 took 0.44 us on the H200 (v58)
        assert 0.1 < best < 100, best
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=37, batch_size=N, target="cuda", tuning_logs=str(tmp_path),
                       options=options)
    assert all(rnn.schedules[task.kernel.name] == "tuned" for task, _, _ in results)
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops
    ref = torch_module(cell, I, 37, 1, False, False).double()
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = rng.standard_normal((50, N, I)).astype(np.float32)
    y, hy, _ = rnn.forward(w, to_cuda(x))
    y_ref = ref(torch.from_numpy(x).double())[0]
    assert float((y.cpu().double() - y_ref).norm() / y_ref.norm()) < 1e-5


def test_profile_times_persistent_steps_in_their_loop():
    """``tvmrnn.runtime.profile`` times a persistent loop's step as one step of that loop (weights staged
    once, a grid barrier a step): alone, one launch stages its block's weights every time, which
    made the DS2 LSTM's recurrent share read 111% of its forward pass (v21)."""
    from tvmrnn.runtime.profile import profile
    rnn = tvmrnn.build("lstm", input_size=800, hidden_size=800, batch_size=20, target="cuda",
                       options=BuildOptions(persistent="auto"))
    for p in profile(rnn, T=300, passes=("forward", "forward_train"), reps=3):
        assert p.persistent, p.name
        (step,) = [k for k in p.kernels if k.in_loop]
        assert step.name.endswith("_persistent") and step.calls == 300 and 0.5 < step.latency_us < 50
        assert p.group_ms("recurrent") < 1.05 * p.measured_ms, p.table()
        assert "(a step of its persistent loop)" in p.table()


# TF32 (build(..., allow_tf32=True)): the all-steps GEMMs on tensor cores round their operands to
# 10 mantissa bits, so results differ from float64 by ~1e-3 (fp32 builds: ~1e-6); a wrong fragment
# layout or tile edge gives errors of order 1. The ReLU RNN's gradients grow those roundings
# through its unbounded recurrence: its input gradient was 1.7e-2 off on the H100 (2 layers, 50 steps).
TF32_TOL = 1e-2
TF32_TOL_RELU = 5e-2


@pytest.mark.parametrize("cell", CELLS)
def test_tf32_matches_torch_on_cuda(cell, rng):
    """The test sizes (odd: every tile padded) over 50 steps (32- and 4-step chunks, split-K for
    the short chunks' GEMMs), 2 bidirectional layers."""
    _check(cell, 2, True, False, 50, rng, target="cuda", as_array=to_cuda,
           tol=TF32_TOL_RELU if cell == "rnn_relu" else TF32_TOL, allow_tf32=True)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_tf32_at_larger_sizes_matches_torch_on_cuda(cell, rng):
    """Sizes where the 256-step chunks' GEMMs take the 128 x 128 tiles (5120 rows at N = 20) and
    the weight gradient's reduction runs over thousands of rows."""
    _check(cell, 1, True, False, 300, rng, target="cuda", as_array=to_cuda, tol=TF32_TOL, allow_tf32=True,
           hidden=400, input_size=96, batch=20)


@pytest.mark.parametrize("hidden,bidirectional", [(128, False), (256, False), (160, True)])
def test_persistent_forward_launches_at_mid_sizes_on_cuda(hidden, bidirectional, rng):
    """The persistent forwards at mid sizes, where a block's static partial sums (40 KB) beside
    its dynamic buffers (13-30 KB) passed 48 KB without the kernel opting in: the cooperative
    launch was refused (v22). Every block must be resident."""
    _check("lstm", 1, bidirectional, False, 30, rng, target="cuda", as_array=to_cuda, hidden=hidden,
           input_size=96, batch=20)


def test_tf32_gemm_is_on_tensor_cores_and_rounds_like_tf32():
    """One all-steps GEMM alone against the same kernel unscheduled on the CPU (fp32): with TF32
    its error is TF32's (above fp32's ~1e-7, below 1e-2); its CUDA source has the TF32 mma
    instructions."""
    from tvm import s_tir

    from tvmrnn import schedules, kernels
    from tvmrnn.program.sequence import compile_module
    kernel = kernels.tf32(kernels.input_projection(256, 20, 200, 150, 4))
    sch = s_tir.Schedule(s_tir.renew_defs(kernel.func))
    schedules.apply(sch, kernel, tvm.target.Target("cuda"))
    lib = compile_module(tvm.IRModule({"main": sch.mod["main"].with_attr("global_symbol", "main")}),
                         tvmrnn.device.cuda_target())
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in lib.mod.imports[0].inspect_source()
    rng = np.random.default_rng(0)
    host = [rng.standard_normal([int(s) for s in p.shape]).astype("float32") for p in kernel.func.params]
    args = [tvm.runtime.tensor(h, device=tvm.cuda()) for h in host]
    lib.jit()["main"](*args)
    got = args[-1].numpy()
    ref_args = [tvm.runtime.tensor(h, device=tvm.cpu()) for h in host]
    cpu = tvm.compile(tvm.IRModule({"main": kernels.input_projection(256, 20, 200, 150, 4).func}), target="llvm")
    cpu["main"](*ref_args)
    expected = ref_args[-1].numpy().astype(np.float64)
    err = np.linalg.norm(got - expected) / np.linalg.norm(expected)
    assert 1e-6 < err < 1e-2, err


@pytest.mark.parametrize("cell,input_size,hidden,bidirectional", [
    ("lstm", 800, 800, False), ("gru", 800, 800, True), ("rnn_tanh", 256, 256, False), ("lstm", 64, 64, True),
    ("gru", 1024, 1024, False), ("lstm", 1, 37, False)])
@pytest.mark.parametrize("batch", [1, 2])
def test_batches_of_one_and_two_match_torch_on_cuda(cell, input_size, hidden, bidirectional, batch, rng):
    """Batch 1 (serving's latency case) and 2: a block of the per-step GEMMs then has fewer output
    elements than threads (split_k pads its thread loops, guarded), and a single step's weight
    gradient is a product without a sum (as is the input projection of one feature). Forward,
    training forward and every gradient against torch in float64, 7 steps (4-step and single-step
    chunks) and 300 (a 256-step chunk)."""
    for T in (7, 300):
        _check(cell, 1, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=input_size, batch=batch, tol=1e-4)


@pytest.mark.parametrize("cell,hidden,bidirectional,batch", [
    ("lstm", 96, False, 1), ("gru", 96, False, 2), ("rnn_tanh", 37, False, 3), ("lstm", 256, False, 1),
    ("gru", 64, True, 2)])
@pytest.mark.parametrize("blocks", [1, 8])
def test_capped_persistent_blocks_match_torch_on_cuda(cell, hidden, bidirectional, batch, blocks, rng):
    """``persistent_blocks``: every time loop persistent on at most that many blocks, each owning
    more units; one block meets at ``__syncthreads`` alone (no grid barrier). At H = 256 one block's
    shared memory cannot hold the weights (they are read from global memory). Forward, training
    forward and every gradient against torch in float64."""
    options = BuildOptions(persistent="all", persistent_blocks=blocks)
    for T in (1, 9):
        _check(cell, 1, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=hidden, batch=batch, tol=1e-4, options=options)
    rnn = built(cell, 1, bidirectional, False, input_size=hidden, hidden_size=hidden, batch_size=batch,
                target="cuda", options=options)
    # every pass persistent, except two directions at one block (a block each: launches instead)
    expected = None if bidirectional and blocks == 1 else blocks
    assert rnn.persistent_blocks == expected, rnn.persistent_blocks


@pytest.mark.parametrize("cell,batch,hidden,num_layers,bidirectional,rows", [
    ("lstm", 128, 184, 2, False, None), ("gru", 130, 216, 1, True, None), ("rnn_tanh", 131, 360, 1, False, None),
    ("rnn_relu", 256, 256, 2, True, 200), ("lstm", 192, 150, 1, True, 129), ("lstm", 131, 150, 1, False, None),
    ("gru", 128, 160, 1, False, 100),
    ("lstm", 160, 384, 1, False, None), ("lstm", 131, 390, 1, True, 130)])
def test_many_rows_match_torch_on_cuda(cell, batch, hidden, num_layers, bidirectional, rows, rng):
    """Batches from 128 rows take row tiles (their blocks split the rows and the units, the epilogue
    on each thread's registers), in persistent time loops for every pass (each block's weights in
    shared memory): odd and prime row counts, odd unit counts, both directions in one launch,
    fewer rows than the build's; gated forward steps with a thread a gate column of its block's
    units, its weights in registers, over the block's 4 rows (LSTM N = 131, H = 150; GRU N = 128,
    H = 160). The LSTM's backward steps at H = 384 and 390 (a 4H-long
    reduction) stage their rows a chunk of the reduction at a time beside the weights
    (``row_tiles.PersistentTile.row_chunk``): 131 rows padded to the block's, 1,560 columns in
    chunks of 156."""
    for T in (1, 7):
        _check(cell, num_layers, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=hidden, batch=batch, rows=rows, tol=1e-4)
    if cell == "lstm" and hidden >= 384:  # the chunked rows'
        rnn = built(cell, num_layers, bidirectional, False, input_size=hidden, hidden_size=hidden, batch_size=batch,
                    target="cuda")
        assert all(rnn.programs[p].uses_persistent_loops for p in ("forward", "forward_train", "backward"))
    if (cell, batch, hidden) in (("lstm", 131, 150), ("gru", 128, 160)):  # the cases the form is here for
        rnn = built(cell, num_layers, bidirectional, False, input_size=hidden, hidden_size=hidden, batch_size=batch,
                    target="cuda")
        assert "float w_local_ptr[%d];" % hidden in rnn.executable.mod.imports[0].inspect_source()


@pytest.mark.parametrize("cell,batch,hidden,num_layers,bidirectional", [
    ("gru", 128, 128, 1, False), ("lstm", 256, 64, 1, False), ("lstm", 131, 57, 2, True), ("rnn_tanh", 129, 200, 1, False),
    ("lstm", 128, 100, 1, False), ("gru", 200, 100, 1, False), ("gru", 130, 112, 1, True)])
def test_row_groups_match_torch_on_cuda(cell, batch, hidden, num_layers, bidirectional, rng):
    """Many rows whose direction's weights fit one block: each block owns a group of rows and all
    of their units (``row_tiles.INDEPENDENT_BLOCKS``), so the persistent loops meet at
    ``__syncthreads`` with no grid barrier. Prime rows, units padded to the block's threads (57 of
    64, 100 of 128, 200 of 256), two layers and directions; gate threads (a thread a gate column)
    with the weights in registers (LSTM H = 100, N = 256 H = 64 at two rows a block) or in shared
    memory (GRU N = 200 H = 100, two rows), and in backward steps (H = 100, 112); forward, training forward and every
    gradient against torch.nn in float64, at T = 1 and 9 (each block runs every step alone)."""
    for T in (1, 9):
        _check(cell, num_layers, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=hidden, batch=batch, tol=1e-4)
    rnn = built(cell, num_layers, bidirectional, False, input_size=hidden, hidden_size=hidden, batch_size=batch,
                target="cuda")
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops
    forms = {("lstm", 256, 64): "float w_local_ptr[64];",  # the forms the docstring names: gate threads
             ("lstm", 128, 100): "matmul_rf",  # a backward step's gate threads
             ("gru", 200, 100): "recurrent_projection_shared_local"}  # gate threads, weights in shared memory
    if (cell, batch, hidden) in forms:
        assert forms[cell, batch, hidden] in rnn.executable.mod.imports[0].inspect_source()


@pytest.mark.parametrize("cell,batch,hidden,num_layers,bidirectional,persistent", [
    ("lstm", 130, 520, 1, True, "off"), ("gru", 200, 1000, 2, False, "off"), ("rnn_tanh", 520, 1040, 1, False, "auto"),
    ("lstm", 257, 1040, 1, False, "auto")])
def test_large_steps_take_the_tiled_gemm_on_cuda(cell, batch, hidden, num_layers, bidirectional, persistent, rng):
    """Steps of 128 rows or more past row tiles' units with 2^18 outputs or more (forward: rows x
    gates x units; backward, rows x units: 2^16) take the tiled GEMM into a buffer, then the epilogue as
    a kernel of its own, and their loops stay launches even where the weights would fit on chip.
    Odd rows and units (padded tiles), stacked directions, two layers; forward, training forward
    and every gradient against torch.nn in float64."""
    from tvmrnn.schedules import knobs
    from tvmrnn.schedules.common import GPU_BACKWARD_STEP_MATMUL_OUTPUTS
    options = BuildOptions(persistent=persistent)
    for T in (1, 6):
        _check(cell, num_layers, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=hidden, batch=batch, tol=1e-4, options=options)
    rnn = built(cell, num_layers, bidirectional, False, input_size=hidden, hidden_size=hidden, batch_size=batch,
                target="cuda", options=options)
    families = {k.name: knobs.family(k, rnn.target) for p in rnn.programs.values() for k in p.kernels.values()
                if k.name.startswith(("recurrent_step_", "backward_step_"))}
    assert {f for name, f in families.items() if name.startswith("recurrent_step_")} == {"matmul"}, families
    D = 2 if bidirectional else 1
    backward = "matmul" if D * batch * hidden >= GPU_BACKWARD_STEP_MATMUL_OUTPUTS else "split_k"
    assert {f for name, f in families.items() if name.startswith("backward_step_")} == {backward}, families
    assert not any(p.uses_persistent_loops for p in rnn.programs.values())


@pytest.mark.parametrize("cell,batch,hidden", [("lstm", 160, 576), ("gru", 131, 1040)])
def test_large_steps_split_over_blocks_match_torch_on_cuda(cell, batch, hidden, rng, monkeypatch):
    """A large step's tiled GEMM split over blocks (``cuda.GPU_STEP_MATMUL_K_SLICES``, the default
    since v63), its slices summed by a kernel of their own before the epilogue kernel; backward
    steps from 2^16 outputs on the tiled GEMM, so that the backward's steps split (LSTM N=160
    H=576: forward 2 slices with forward splits on, backward 9; GRU N=131 H=1040, prime rows:
    backward 5). Forward, training forward and every gradient against torch.nn in float64; each
    backward step is three launches, the LSTM's forward step GEMM split too."""
    from tvmrnn.schedules import common, cuda
    monkeypatch.setattr(cuda, "GPU_STEP_MATMUL_K_SLICES", True)
    monkeypatch.setattr(cuda, "GPU_FORWARD_STEP_K_SLICES", True)  # (off by default)
    monkeypatch.setattr(common, "GPU_BACKWARD_STEP_MATMUL_OUTPUTS", 1 << 16)
    options = BuildOptions(persistent="off")
    built.cache_clear()  # builds are cached by their arguments, which do not say this
    try:
        for T in (1, 5):
            _check(cell, 1, False, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
                   input_size=hidden, batch=batch, tol=1e-4, options=options)
        rnn = built(cell, 1, False, False, input_size=hidden, hidden_size=hidden, batch_size=batch, target="cuda",
                    options=options)
        source = rnn.executable.mod.imports[0].inspect_source()
    finally:
        built.cache_clear()
    backward = set(re.findall(r"void __launch_bounds__\(\d+\) (backward_step_\w+)\(", source))
    assert len(backward) == 3, backward
    assert "matmul_rf" in source and ("recurrent_projection_rf" in source) == (cell == "lstm")


@pytest.mark.parametrize("cell,batch,hidden,bidirectional", [("lstm", 57, 645, False), ("gru", 33, 701, True)])
def test_backward_steps_of_few_rows_on_padded_slices_match_torch_on_cuda(cell, batch, hidden, bidirectional, rng):
    """A backward step of 32-127 rows a direction and 2^24 multiply-adds or more takes the tiled GEMM
    (``common.GPU_BACKWARD_MATMUL_ROWS``), its G x H reduction (2580, 2103: no multiple of 16)
    split over blocks in slices whose last tile is padded (``cuda.GPU_MATMUL_PADDED_SLICES``).
    Forward, training forward and every gradient against torch.nn in float64, at several lengths."""
    for T in (1, 6, 37):
        _check(cell, 1, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=29, batch=batch, tol=1e-4)
    rnn = built(cell, 1, bidirectional, False, input_size=29, hidden_size=hidden, batch_size=batch, target="cuda")
    source = rnn.executable.mod.imports[0].inspect_source()
    assert len(set(re.findall(r"void __launch_bounds__\(\d+\) (backward_step_\w+)\(", source))) == 3
    assert "matmul_rf" in source


@pytest.mark.parametrize("batch,hidden,bidirectional", [(48, 160, False), (97, 127, False), (33, 150, True)])
def test_lstm_steps_of_few_rows_on_row_tiles_match_torch_on_cuda(batch, hidden, bidirectional, rng):
    """An LSTM's persistent steps of 32-127 rows a direction at up to 160 units, whose weights do
    not fit one block, take row tiles (``common.GPU_FEW_ROW_TILE_ROWS``, v83: blocks that split the
    units, a grid barrier a step) in place of split-K; both directions stacked keep split-K.
    Forward, training forward and every gradient against torch.nn in float64, at several lengths,
    odd rows and units."""
    from tvmrnn.schedules import knobs
    for T in (1, 6, 37):
        _check("lstm", 1, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=29, batch=batch, tol=1e-4)
    rnn = built("lstm", 1, bidirectional, False, input_size=29, hidden_size=hidden, batch_size=batch, target="cuda")
    for name in ("forward", "forward_train", "backward"):
        program = rnn.programs[name]
        assert program.uses_persistent_loops, name
        steps = [k for k in program.kernels.values() if "step_lstm" in k.name]
        expected = "persistent" if bidirectional else "row_tiles"  # (split-K's persistent form)
        assert steps and all(knobs.family(k, rnn.target) == expected for k in steps), name


@pytest.mark.parametrize("cell,bidirectional", [("gru", False), ("lstm", False), ("gru", True)])
def test_forward_steps_of_128_rows_launched_and_split_match_torch_on_cuda(cell, bidirectional, rng):
    """A large forward step of 128 rows a direction (below ``GPU_PERSISTENT_SPLIT_K_ROWS``) whose
    tiled GEMM fills few of the GPU's threads: launched with its reduction split over blocks
    (``cuda.GPU_FORWARD_STEP_FILL``, v64), not persistent, by default. Forward, training forward and
    every gradient against torch.nn in float64. Both directions of one launch fill twice the
    threads: not split (and launched: both directions' weights do not fit on chip)."""
    from tvmrnn.schedules.common import splits_over_blocks
    _check(cell, 1, bidirectional, False, 5, rng, target="cuda", as_array=to_cuda, hidden=1024, input_size=40,
           batch=128, tol=1e-4)
    rnn = built(cell, 1, bidirectional, False, input_size=40, hidden_size=1024, batch_size=128, target="cuda")
    for name in ("forward", "forward_train"):
        program = rnn.programs[name]
        assert not program.uses_persistent_loops, name
        steps = [k for k in program.kernels.values() if k.name.startswith("recurrent_step_")]
        assert steps and all(splits_over_blocks(program.scheduled(k.name)) != bidirectional for k in steps), name


@pytest.mark.parametrize("cell,batch,hidden", [("lstm", 67, 1024), ("gru", 64, 2048)])
def test_stacked_steps_of_64_rows_a_direction_take_the_tiled_gemm_and_match_torch_on_cuda(cell, batch, hidden, rng):
    """A step of both directions at 64 or more rows a direction and 128 in all, past row tiles'
    units (``common.GPU_STACKED_MATMUL_ROWS``, v66): launched on the tiled GEMM (a batch axis of
    two problems) with its epilogue as a kernel of its own, forward and backward, not persistent
    (both directions' weights do not fit on chip). Forward, training forward and every gradient
    against torch.nn in float64, at odd rows (67)."""
    from tvmrnn.schedules import knobs
    _check(cell, 1, True, False, 4, rng, target="cuda", as_array=to_cuda, hidden=hidden, input_size=40, batch=batch,
           tol=1e-4)
    rnn = built(cell, 1, True, False, input_size=40, hidden_size=hidden, batch_size=batch, target="cuda")
    steps = [k for p in rnn.programs.values() for k in p.kernels.values()
             if k.name.startswith(("recurrent_step_", "backward_step_"))]
    assert {s.name.split("_")[0] for s in steps} == {"recurrent", "backward"}
    assert all(knobs.family(k, rnn.target) == "matmul" for k in steps), [k.name for k in steps]
    assert not any(p.uses_persistent_loops for p in rnn.programs.values())


@pytest.mark.parametrize("cell,batch,hidden", [("lstm", 3, 2048), ("gru", 17, 2050)])
def test_wide_launched_steps_match_torch_on_cuda(cell, batch, hidden, rng):
    """Steps of 2048+ units whose weights stay off chip: launched split-K steps with 8 output
    columns a thread (``split_k.default_thread_columns``, v63), forward, training forward and every
    gradient against torch.nn in float64 at odd rows and units."""
    from tvmrnn.schedules import default_schedule, knobs
    options = BuildOptions(persistent="off")
    _check(cell, 1, False, False, 4, rng, target="cuda", as_array=to_cuda, hidden=hidden, input_size=96, batch=batch,
           tol=1e-4, options=options)
    rnn = built(cell, 1, False, False, input_size=96, hidden_size=hidden, batch_size=batch, target="cuda",
                options=options)
    steps = [k for p in rnn.programs.values() for k in p.kernels.values()
             if k.name.startswith(("recurrent_step_", "backward_step_")) and knobs.family(k, rnn.target) == "split_k"]
    assert steps
    for k in steps:  # the build's default: 8 columns a thread
        assert default_schedule(k, rnn.target).script() == default_schedule(k, rnn.target, thread_columns=8).script()


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_hidden_state_staged_in_phases_matches_torch_on_cuda(cell, rng):
    """A one-direction persistent step whose hidden state (64 rows x 1,024 units, 256 KB) fits whole
    in no block: each block stages it in phases of the reduction (split-K's default since v35),
    forward, training forward and backward against torch.nn in float64."""
    _check(cell, 1, False, False, 5, rng, target="cuda", as_array=to_cuda, hidden=1024, input_size=64, batch=64,
           tol=1e-4)
    rnn = built(cell, 1, False, False, input_size=64, hidden_size=1024, batch_size=64, target="cuda")
    assert rnn.programs["forward"].uses_persistent_loops and rnn.programs["forward_train"].uses_persistent_loops


def test_variable_lengths_at_many_rows_on_cuda():
    """Masked steps of many rows (persistent row tiles in every pass; the LSTM's two directions in
    one launch): 130 rows of lengths 1 to 9 against torch.nn's packed sequences in float64."""
    from test_lengths import I as LI, VARIABLE, _check as check_lengths
    lengths = [(7 * i) % 9 + 1 for i in range(130)]
    for cell, bidirectional, hidden, order in (("lstm", True, 40, 1), ("gru", False, 72, -1)):
        check_lengths(cell, 1, bidirectional, False, lengths[::order], T=9, as_array=to_cuda, target="cuda",
                      hidden=hidden, batch=130)
        rnn = built(cell, 1, bidirectional, False, input_size=LI, hidden_size=hidden, batch_size=130, target="cuda",
                    options=VARIABLE)  # (the same build)
        assert all(rnn.programs[name].uses_persistent_loops for name in ("forward", "forward_train", "backward"))


@pytest.mark.parametrize("rows", [1, 5])
def test_smaller_batches_on_one_build_on_cuda(rows, rng):
    _check("lstm", 2, True, False, 7, rng, target="cuda", as_array=to_cuda, batch=6, rows=rows)


def test_build_cache_on_cuda(tmp_path, monkeypatch, rng):
    """A CUDA build is cached (its package holds the compiled kernels) and the second build loads it."""
    monkeypatch.setenv("TVMRNN_CACHE", "on")
    monkeypatch.setenv("TVMRNN_CACHE_DIR", str(tmp_path))
    args = dict(input_size=I, hidden_size=H, num_layers=2, bidirectional=True, batch_size=N, target="cuda")
    first = tvmrnn.build("gru", **args)
    second = tvmrnn.build("gru", **args)
    assert not first.from_cache and second.from_cache
    ref = torch.nn.GRU(I, H, num_layers=2, bidirectional=True)
    x = to_cuda(rng.standard_normal((5, N, I)).astype(np.float32))
    outs = [r.forward(r.pack_weights(tvmrnn.params_from_torch(ref)), x)[0] for r in (first, second)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


@pytest.mark.parametrize("cell,num_layers,bidirectional,hidden", [
    ("lstm", 2, True, 37), ("gru", 1, True, 256), ("rnn_tanh", 1, False, 64), ("lstm", 1, True, 800)])
def test_variable_lengths_match_torch_packed_on_cuda(cell, num_layers, bidirectional, hidden):
    """Masked steps on the GPU (persistent forwards, stacked directions) against torch.nn's packed
    sequences in float64: outputs, states and every gradient (tests/test_lengths.py's check)."""
    from test_lengths import VARIABLE, _check as check_lengths
    check_lengths(cell, num_layers, bidirectional, False, [3, 9, 1, 6], T=9, as_array=to_cuda, target="cuda",
                  hidden=hidden)
    # NaN past the ends: the inference forward's masked steps compute an ended row's value from it
    # and select the old state (sequence.masked_selects_without_branches); the training forward
    # zeroes the padding in a copy first
    check_lengths(cell, num_layers, bidirectional, False, [3, 9, 1, 6], T=9, as_array=to_cuda, target="cuda",
                  hidden=hidden, pad_value=np.nan)
    check_lengths(cell, num_layers, bidirectional, False, [3, 9, 1, 6], T=9, as_array=to_cuda, target="cuda",
                  hidden=hidden, options=tvmrnn.BuildOptions(variable_lengths=True, persistent="off"))
    assert VARIABLE.variable_lengths


@pytest.mark.parametrize("packed", [False, True])
def test_projections_match_torch_on_cuda(packed):
    """``proj_size`` in the drop-in on the GPU (the fused LSTMP build since v72; before, each layer
    a plain LSTM on W_hh W_hr): outputs, states and every gradient against torch.nn on the CPU in float64,
    2 layers, bidirectional, packed with unsorted lengths or not."""
    import tvmrnn.torch as tt
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    ref = torch.nn.LSTM(13, 37, proj_size=11, num_layers=2, bidirectional=True).double()
    ours = tt.LSTM(13, 37, proj_size=11, num_layers=2, bidirectional=True)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    ours = ours.cuda()
    x, h0, c0 = torch.randn(9, 4, 13), torch.randn(4, 4, 11), torch.randn(4, 4, 37)
    lengths = torch.tensor([3, 9, 1, 6])
    results = []
    for module, device, dtype in ((ours, "cuda", torch.float32), (ref, "cpu", torch.float64)):
        xs, hs, cs = (t.to(device, dtype).requires_grad_() for t in (x, h0, c0))
        inp = pack_padded_sequence(xs, lengths, enforce_sorted=False) if packed else xs
        out, (hy, cy) = module(inp, (hs, cs))
        y = out.data if packed else out
        (y.sin().sum() + (hy * hy).sum() + cy.sum()).backward()
        results.append([t.detach().cpu() for t in (y, hy, cy, xs.grad, hs.grad, cs.grad)]
                       + [p.grad.cpu() for _, p in sorted(module.named_parameters())])
    for a, b in zip(*results):
        assert float((a.double() - b).norm() / b.norm()) < 1e-5


@pytest.mark.parametrize("hidden", [H, 256])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_nan_and_inf_propagate_as_in_torch_on_cuda(cell, hidden):
    """test_numerics.py's checks on the GPU (persistent forwards at H = 256): a NaN or Inf in x, h0,
    c0, a weight, a bias or dy reaches the outputs, states and gradients torch.nn's does, only those."""
    from test_numerics import PLACES, check
    for place in PLACES:
        if not place.startswith("c0") or cell == "lstm":
            check(cell, place, target="cuda", as_array=to_cuda, hidden=hidden)


def test_the_same_bits_on_cuda_whatever_ran_before():
    """test_determinism.py's checks on the GPU: the same inputs, the same bits, across calls of other
    shapes between; a row alone gives the bits it gives in a batch."""
    from test_determinism import check_calls_and_orders, check_rows_alone
    check_calls_and_orders(target="cuda", as_array=to_cuda)
    check_rows_alone(target="cuda", as_array=to_cuda)


@pytest.mark.timeout(1200)
def test_fuzzed_contract_on_cuda():
    """tests/fuzz.py's seeded cases (60 of them, and one per fault) on the GPU, torch CUDA tensors."""
    import fuzz
    fuzz.fuzz_test(target="cuda", device="cuda", examples=60)()


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_torch_compile_with_inductor_on_cuda(cell):
    """A model around a 2-layer bidirectional drop-in, compiled whole (``fullgraph``, inductor,
    Dynamo let into RNN modules): the passes run as tvmrnn's custom ops on the GPU, at two batch
    sizes on one build; loss and gradients as torch.nn's in float64 on the CPU."""
    import tvmrnn.torch as tt
    from test_torch_compile import Model
    torch.manual_seed(0)
    ours = getattr(tt, cell.upper())(I, H, 2, bidirectional=True)
    model = Model(ours).cuda()
    ref = Model(getattr(torch.nn, cell.upper())(I, H, 2, bidirectional=True)).double()
    ref.load_state_dict(model.state_dict())
    torch._dynamo.reset()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = torch.compile(model, fullgraph=True)
        for n in (N, N - 1):
            x = torch.randn(11, n, I)
            loss = compiled(x.cuda())
            loss.backward()
            expected = ref(x.double())
            expected.backward()
            assert abs(loss.item() - expected.item()) <= 1e-5 * abs(expected.item())
            for (name, p), q in zip(model.named_parameters(), ref.parameters()):
                assert float((p.grad.double().cpu() - q.grad).norm() / q.grad.norm()) < 1e-4, name
            model.zero_grad()
            ref.zero_grad()
    assert len(ours._built) == 1


@pytest.mark.parametrize("cls", ["LSTM", "GRU"])
def test_torch_func_grad_over_a_drop_in_on_cuda(cls):
    """``torch.func.grad`` over a CUDA drop-in (its backward runs unwrapped of functorch's levels):
    parameter and input gradients as torch.nn's in float64 on the CPU."""
    import tvmrnn.torch as tt
    torch.manual_seed(0)
    ref = getattr(torch.nn, cls)(5, 7, 2, bidirectional=True).double()
    ours = getattr(tt, cls)(5, 7, 2, bidirectional=True).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(6, 3, 5, dtype=torch.float64)

    def grads(module, device, dtype):
        params = {k: v.detach().to(device, dtype) for k, v in ref.named_parameters()}
        loss = lambda p, x: torch.func.functional_call(module, p, (x,))[0].square().sum()
        return torch.func.grad(loss, argnums=(0, 1))(params, x.to(device, dtype))
    got, want = grads(ours, "cuda", torch.float32), grads(ref, "cpu", torch.float64)
    assert got[1].is_cuda and float((got[1].double().cpu() - want[1]).norm() / want[1].norm()) < 1e-5
    for name in want[0]:
        assert float((got[0][name].double().cpu() - want[0][name]).norm() / want[0][name].norm()) < 1e-5, name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_returns_what_cudnn_returns(dtype):
    """Under CUDA autocast the drop-ins run builds with TF32 all-steps GEMMs (v44; fp32 arrays)
    and return what torch.nn's cuDNN RNNs return there (float16 for every cell, padded or packed,
    under fp16 and bf16 autocast alike: cuDNN's autocast wrapper casts to half), within half's
    errors; gradients reach the fp32 parameters in fp32."""
    import tvmrnn.torch as tt
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    for theirs, kwargs in ((torch.nn.LSTM, {}), (torch.nn.GRU, {"bidirectional": True}), (torch.nn.RNN, {}),
                           (torch.nn.LSTM, {"proj_size": 3})):
        ref = theirs(5, 8, **kwargs).cuda()
        ours = getattr(tt, theirs.__name__)(5, 8, **kwargs).cuda()
        ours.load_state_dict(ref.state_dict())
        x = torch.randn(6, 3, 5, device="cuda")
        y32 = ref(x)[0]
        with torch.autocast("cuda", dtype=dtype):
            for inp in (x, pack_padded_sequence(x, torch.tensor([6, 2, 4]), enforce_sorted=False)):
                (y, states), (yr, states_r) = ours(inp), ref(inp)
                packed = not isinstance(inp, torch.Tensor)
                y, yr = (y.data, yr.data) if packed else (y, yr)
                states = states if isinstance(states, tuple) else (states,)
                states_r = states_r if isinstance(states_r, tuple) else (states_r,)
                assert [t.dtype for t in (y, *states)] == [t.dtype for t in (yr, *states_r)] == [torch.float16] * (1 + len(states))
                if not packed:
                    assert float((y.float() - y32).norm() / y32.norm()) < 1e-2
                    y.float().sum().backward()
                    assert all(p.grad.dtype == torch.float32 for p in ours.parameters())
        # (an LSTMP stays fp32 under CUDA autocast: TF32 with projections has not run; passes.projections_refused)
        tf32 = not kwargs.get("proj_size")
        assert ours._built and all(rnn.allow_tf32 == tf32 for rnn in ours._built.values())


def test_autocast_runs_large_steps_on_tensor_cores_within_half_errors():
    """Under CUDA autocast a drop-in whose forward steps are large (128 rows, 2080 x 520) runs them
    on the TF32 tiles as half builds do (``BuildOptions.tensor_core_steps``); its output and
    gradients stay within half's errors of torch.nn in fp32."""
    import tvmrnn.torch as tt
    torch.manual_seed(0)
    ref = torch.nn.LSTM(32, 520).cuda()
    ours = tt.LSTM(32, 520).cuda()
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 128, 32, device="cuda")
    y32 = ref(x)[0]
    y32.sum().backward()
    with torch.autocast("cuda", dtype=torch.float16):
        y = ours(x)[0]
    y.float().sum().backward()
    assert float((y.float() - y32).norm() / y32.norm()) < 1e-2
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        assert float((p.grad - q.grad).norm() / q.grad.norm()) < 3e-2, name
    # packed rows (masked steps: a variable-lengths build of their own), inference
    from torch.nn.utils.rnn import pack_padded_sequence
    lengths = torch.randint(1, 6, (128,))
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.no_grad():
        y32 = ref(packed)[0].data
        with torch.autocast("cuda", dtype=torch.float16):
            y = ours(packed)[0].data
    assert float((y.float() - y32).norm() / y32.norm()) < 1e-2
    assert len(ours._built) == 2
    for rnn in ours._built.values():
        steps = [k for k in rnn.schedules if k.startswith("recurrent_step")]
        assert steps and all(rnn.schedules[k] == "tf32" for k in steps), rnn.schedules


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cell,I,H,layers,bidirectional", [("lstm", 19, 48, 2, True), ("gru", 33, 37, 1, False),
                                                            ("rnn_tanh", 13, 64, 1, True)])
def test_half_builds_match_torch_on_cuda(dtype, cell, I, H, layers, bidirectional):
    """``tvmrnn.build(dtype="float16" | "bfloat16")`` on the GPU: half tensors in and out, fp32
    weight gradients, errors of half precision against float64 (issue 39, item 1)."""
    check_half_build(cell, I, H, layers, bidirectional, dtype, target="cuda", device="cuda")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_deep_relu_rnn_is_as_close_to_float64_as_cudnn_half(dtype):
    """A 5-layer bidirectional ReLU RNN, where rounding grows (issue 39, item 5), as a half build on
    the GPU: its outputs and every gradient against float64 (on the same half-rounded inputs and
    weights) are about as close as cuDNN's in the same dtype (``tests/test_bf16.py`` holds the CPU's
    bf16 twin). Added in v50, first run in the session after."""
    half = getattr(torch, dtype)
    T, n, I, H, L = 7, 6, 19, 128, 5
    torch.manual_seed(0)
    ref = torch.nn.RNN(I, H, num_layers=L, nonlinearity="relu", bidirectional=True).to(half).double()
    rnn = tvmrnn.build("rnn_relu", input_size=I, hidden_size=H, num_layers=L, bidirectional=True, batch_size=n,
                       dtype=dtype, target="cuda", cache=False, tuning_logs=False)
    w = rnn.pack_weights({k: v.float().cuda() for k, v in ref.state_dict().items()})
    x = torch.randn(T, n, I).to(half)
    dy = torch.randn(T, n, 2 * H).to(half)
    y, _, _, ws = rnn.forward_train(w, x.cuda())
    grads = rnn.backward(w, ws, dy.cuda())
    xr = x.double().requires_grad_()
    yr = ref(xr)[0]
    yr.backward(dy.double())
    theirs_rnn = torch.nn.RNN(I, H, num_layers=L, nonlinearity="relu", bidirectional=True).cuda().to(half)
    theirs_rnn.load_state_dict({k: v.to(half) for k, v in ref.state_dict().items()})
    xh = x.cuda().requires_grad_()
    yh = theirs_rnn(xh)[0]
    yh.backward(dy.cuda())

    def rel(a, b):
        a, b = a.detach().double().cpu(), b.detach().double().cpu()
        return float((a - b).norm() / b.norm())
    ours = [rel(y, yr), rel(grads["x"], xr.grad)]
    theirs = [rel(yh, yr), rel(xh.grad, xr.grad)]
    for (name, p), q in zip(ref.named_parameters(), theirs_rnn.parameters()):
        assert grads[name].dtype == torch.float32, name
        ours.append(rel(grads[name], p.grad))
        theirs.append(rel(q.grad, p.grad))
    assert max(ours) < 0.2, ours
    assert all(o <= 3 * t + 1e-3 for o, t in zip(ours, theirs)), list(zip(ours, theirs))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("cell,I,H,layers,bidirectional,N,n", [("lstm", 40, 515, 2, True, 130, 97),
                                                                ("gru", 24, 600, 1, False, 128, 128),
                                                                ("gru", 24, 600, 1, False, 160, 151)])
def test_half_builds_with_steps_on_tensor_cores_match_torch_on_cuda(dtype, cell, I, H, layers, bidirectional, N, n):
    """Half builds whose forward steps are large enough (``GPU_TF32_STEP_ROWS``, ``_WORK``: 130 x
    2060 x 515 and 128 x 1800 x 600) run them on TF32 tiles, the gate math a kernel of its own,
    one launch each a step (``BuildOptions.tensor_core_steps``), and so do their backward steps
    from 160 rows (``GPU_TF32_BACKWARD_STEPS``): against float64 as the other half builds, at an
    odd hidden size, two bidirectional layers and a run-time batch below the build's."""
    from tvmrnn.schedules.common import GPU_TF32_BACKWARD_ROWS
    rnn = check_half_build(cell, I, H, layers, bidirectional, dtype, target="cuda", device="cuda", N=N, n=n)
    steps = [k for k, how in rnn.schedules.items() if k.startswith("recurrent_step")]
    assert steps and all(rnn.schedules[k] == "tf32" and k.endswith("_tf32") for k in steps), rnn.schedules
    backward = [k for k in rnn.schedules if k.startswith("backward_step")]
    assert backward and all((rnn.schedules[k] == "tf32") == (N >= GPU_TF32_BACKWARD_ROWS) for k in backward), \
        rnn.schedules
    assert any(k.startswith("input_projection") and k.endswith(("_f16", "_bf16")) for k in rnn.schedules)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_builds_with_steps_on_half_operands_match_torch_on_cuda(dtype):
    """``half_operands=True``: the large forward steps on fp16/bf16 ``mma.m16n8k16`` (``ldmatrix``
    fragments; the hidden state rounded to half a step, as cuDNN's), within the half builds'
    bounds against float64 (two bidirectional layers: the second layer's input rounded too)."""
    rnn = check_half_build("lstm", 40, 515, 2, True, dtype, target="cuda", device="cuda", N=130, n=97,
                           options=tvmrnn.BuildOptions(half_operands=True))
    steps = [k for k in rnn.schedules if k.startswith("recurrent_step")]
    assert steps and all(k.endswith({"float16": "_f16", "bfloat16": "_bf16"}[dtype]) for k in steps), rnn.schedules


@pytest.mark.parametrize("cls, batch_first", [("LSTM", False), ("GRU", True)])
def test_packed_sequences_on_cuda_match_torch_without_waiting_for_the_gpu(cls, batch_first):
    """The drop-ins on a PackedSequence (unsorted lengths, initial states, 2 bidirectional layers)
    on the GPU: the packed output, states and every gradient against torch.nn in float64 on the
    CPU; and a second call, forward and backward, makes PyTorch synchronize with the GPU nowhere
    (``torch.cuda.set_sync_debug_mode("error")``; pad_packed_sequence reads the lengths back)."""
    import tvmrnn.torch as tt
    from torch.nn.utils.rnn import pack_padded_sequence
    torch.manual_seed(0)
    kwargs = dict(num_layers=2, bidirectional=True, batch_first=batch_first)
    ref = getattr(torch.nn, cls)(13, 37, **kwargs).double()
    ours = getattr(tt, cls)(13, 37, **kwargs)
    ours.load_state_dict({k: v.float() for k, v in ref.state_dict().items()})
    ours = ours.cuda()
    lengths = torch.tensor([3, 9, 1, 6, 9])
    x = torch.randn(*((5, 9) if batch_first else (9, 5)), 13)
    h0, c0 = torch.randn(4, 5, 37), torch.randn(4, 5, 37)
    results = []
    for module, device, dtype in ((ours, "cuda", torch.float32), (ref, "cpu", torch.float64)):
        xs, hs, cs = (t.to(device, dtype).requires_grad_() for t in (x, h0, c0))
        out, states = module(pack_padded_sequence(xs, lengths, batch_first=batch_first, enforce_sorted=False),
                             (hs, cs) if cls == "LSTM" else hs)
        states = states if cls == "LSTM" else (states,)
        (out.data.pow(2).sum() + sum(s.sum() for s in states)).backward()
        grads = [xs.grad, hs.grad] + ([cs.grad] if cls == "LSTM" else []) + [p.grad for p in module.parameters()]
        results.append([out.data, *states, *grads])
    for a, b in zip(*results):
        assert a.device.type == "cuda"
        assert float((a.double().cpu() - b).norm() / b.norm()) < 1e-4
    xs = x.cuda().requires_grad_()
    packed = pack_padded_sequence(xs, lengths, batch_first=batch_first, enforce_sorted=False)
    hx = (h0.cuda(), c0.cuda()) if cls == "LSTM" else h0.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out, states = ours(packed, hx)
        out.data.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


@pytest.mark.parametrize("T", [1, 7, 50])
def test_projection_builds_match_torch_on_cuda(T, rng):
    """``build(proj_size=)`` for CUDA (passed on the H200 in v72, when ``build`` stopped refusing
    it): the fused LSTMP passes (two launches a step, both directions in each on GPUs) against
    torch.nn in float64, padded and with lengths."""
    import test_lengths
    _check("lstm", 2, True, False, T, rng, target="cuda", as_array=to_cuda, hidden=40, proj_size=17, tol=1e-5)
    if T > 1:
        test_lengths._check("lstm", 2, True, False, [T, 1, T - 1, 2][:4], T=T, as_array=to_cuda, target="cuda",
                            hidden=40, proj_size=17)


@pytest.mark.parametrize("cell,batch,hidden,bidirectional", [
    ("lstm", 13, 90, False), ("gru", 32, 128, True), ("rnn_relu", 5, 200, False), ("lstm", 1, 64, False)])
def test_row_group_steps_of_few_rows_match_torch_on_cuda(cell, batch, hidden, bidirectional, rng):
    """Persistent steps of fewer than 128 rows whose weights fit a block run in blocks of row groups
    (``BuildOptions.row_groups``, on by default; v76): every pass's steps so, each block its own rows,
    no grid barrier. Forward, training forward and every gradient against torch in float64, one
    step (the backward's loop runs zero times) and 9."""
    for T in (1, 9):
        _check(cell, 1, bidirectional, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
               input_size=hidden, batch=batch, tol=1e-4)
    rnn = built(cell, 1, bidirectional, False, input_size=hidden, hidden_size=hidden, batch_size=batch, target="cuda")
    steps = [n for n in rnn.schedules if "_persistent" in n]
    # (the Elman RNN's backward step at H = 200 stages its rows beside 160 KB of weights: split-K)
    rows = [n for n in steps if n.endswith("_persistent_rows")]
    assert len(steps) == 3 and len(rows) == (2 if cell == "rnn_relu" else 3), steps
    assert rnn.persistent_blocks <= (2 if bidirectional else 1) * batch


@pytest.mark.parametrize("cell,batch,hidden,num_layers", [("gru", 5, 37, 3), ("lstm", 32, 126, 2)])
def test_layer_wavefront_matches_torch_on_cuda(cell, batch, hidden, num_layers, rng):
    """Unidirectional stacks run their inference forward as a wavefront by default on GPUs
    (``passes.layer_wavefront``): every layer's steps in one launch, each layer a 64-step chunk
    behind the one below; the training forward and the backward too (``passes.training_wavefront``,
    the default since v88; ``layer_wavefront=True`` the same here). T = 7 runs no wave; 128 and 130
    the waves that start and finish the layers, without and with steps after them (backward:
    64 and 2 steps before them); 300 full waves too (3 layers) and a longer tail. Every pass against torch.nn in float64; then rows of different lengths on the
    masked builds."""
    from test_lengths import VARIABLE, _check as check_lengths
    every = BuildOptions(layer_wavefront=True)
    for options in (None, every):
        for T in (7, 128, 130, 300):
            _check(cell, num_layers, False, False, T, rng, target="cuda", as_array=to_cuda, hidden=hidden,
                   input_size=hidden, batch=batch, tol=1e-4, options=options)
        rnn = built(cell, num_layers, False, False, input_size=hidden, hidden_size=hidden, batch_size=batch,
                    target="cuda", options=options)
        for name, kind in (("forward", "recurrent_step"), ("forward_train", "recurrent_step"), ("backward", "backward_step")):
            steps = [k for k in rnn.programs[name].kernels if k.startswith(kind)]
            assert any(f"_d{num_layers}_" in k for k in steps), (name, steps)
            assert rnn.programs[name].all_step_loops_persistent
        lengths = [130, 200, 64, 199, 1][:batch] + [200] * (batch - 5)
        check_lengths(cell, num_layers, False, False, lengths, T=200, as_array=to_cuda, target="cuda", batch=batch,
                      hidden=hidden, options=VARIABLE if options is None else tvmrnn.BuildOptions(
                          variable_lengths=True, layer_wavefront=True))
