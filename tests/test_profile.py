"""Where the time goes: the profiler accounts for every kernel a pass runs."""
from __future__ import annotations

import pytest

import tvmrnn
from tvmrnn.runtime.profile import profile


@pytest.mark.parametrize("stacked", [True, False], ids=["directions_stacked", "one_after_the_other"])
def test_profile_counts_every_kernel_call(stacked):
    rnn = tvmrnn.build("gru", input_size=5, hidden_size=8, num_layers=2, bidirectional=True, batch_size=2,
                       options=tvmrnn.BuildOptions(stack_directions=stacked))
    T = 19  # one 16-step chunk of the all-steps GEMMs, then 3 single steps
    forward, backward = profile(rnn, T=T, passes=("forward", "backward"), reps=2)
    # 2 layers x 2 directions: stacked, one time loop per layer runs both directions
    loops, suffix = (2, "_d2") if stacked else (4, "")
    assert forward.steps == T * loops and forward.launches_per_step == 1
    # one launch per backward step: step t's recurrent GEMM with step t-1's gate-math backward;
    # the last step's gate math and the first step's GEMM run alone, outside the time loop
    assert backward.steps == (T - 1) * loops and backward.launches_per_step == 1
    back = {k.name: k.calls for k in backward.kernels}
    assert back[f"backward_step_gru_n2_h8{suffix}"] == (T - 1) * loops
    assert back["pointwise_backward_gru_n2_h8"] == 4 and back["recurrent_backward_n2_h8_g3_direct"] == 4
    calls = {k.name: k.calls for k in forward.kernels}
    assert calls[f"recurrent_step_gru_infer_n2_h8{suffix}"] == T * loops
    assert calls["input_projection_t16_n2_k5_h8_g3"] == 2 and calls["input_projection_t1_n2_k5_h8_g3"] == 3 * 2
    assert all(k.latency_us > 0 for k in forward.kernels + backward.kernels)
    assert forward.measured_ms > 0 and forward.group_ms("recurrent") > 0 and forward.group_ms("input GEMM") > 0
    table = backward.table()
    assert "weight_gradient" in table and "gap" in table
    # every kernel is in a group, and the backward's per-step kernels count as recurrent
    assert {k.group for k in backward.kernels} >= {"input GEMM", "weight grads", "recurrent"}
    assert all(k.group == "recurrent" for k in backward.kernels if k.name.startswith("backward_step"))
    assert backward.group_ms("other") < backward.kernel_ms


def test_persistent_profiles_say_the_loop_is_one_launch():
    """A persistent build's table must not call its barrier time a launch gap."""
    from tvmrnn.runtime.profile import KernelTime, PassProfile
    k = KernelTime("recurrent_step_lstm_infer_n20_h800", "recurrent", 300, 12.0)
    ordinary = PassProfile("forward", 300, 5.0, [k], 300, 1).table()
    persistent = PassProfile("forward", 300, 5.0, [k], 300, 1, persistent=True).table()
    assert "1 kernels per step" in ordinary and "gap 4.7 us per step" in ordinary
    assert "persistent time loops (one launch per loop" in persistent and "kernels per step" not in persistent
    assert "beyond its kernels (steps timed in their loop) 4.7 us per step" in persistent
    looped = KernelTime("recurrent_step_lstm_infer_n20_h800_persistent", "recurrent", 300, 5.0, in_loop=True)
    assert "(a step of its persistent loop)" in PassProfile("forward", 300, 5.0, [looped], 300, 1,
                                                             persistent=True).table()


def test_ncu_source_summary(tmp_path):
    """``scripts/ncu_pass.py --summarise``: Nsight Compute's source-page export (a line naming the
    kernel, then one row per SASS instruction) summed by opcode and stall reason, predicates ignored."""
    import os
    import subprocess
    import sys
    export = tmp_path / "k_sass.csv"
    export.write_text('"Kernel Name","step_kernel",\n'
                      '"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_long_sb"\n'
                      '"0x10","LDS R1, [R2]","100","0","100"\n'
                      '"0x20","@!P0 STS [R3], R1","300","0","300"\n'
                      '"0x30","BAR.SYNC.DEFER_BLOCKING 0x0","600","600","0"\n')
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "ncu_pass.py")
    run = subprocess.run([sys.executable, script, "--summarise", str(export)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    summary = (tmp_path / "k_sass.txt").read_text()
    assert "3 instructions, 1000 stall samples" in summary
    assert "by opcode: BAR.SYNC.DEFER_BLOCKING 60.0%, STS 30.0%, LDS 10.0%" in summary
    assert "by reason: barrier 60.0%, long_sb 40.0%" in summary


def test_random_kernel_arguments_are_sane_as_float32_and_as_bf16_pairs():
    """The random arguments kernels are timed on: read as float32 they are values in [-0.5, 0.5]
    spread over the range, and read as the pairs of bf16 a bf16 build packs into a float32 word
    (:func:`tvmrnn.kernels.bf16_pair`), each half is a finite normal value in that range too (plain
    uniform float32s gave random exponents there: inf, NaN, denormals)."""
    import numpy as np
    import tvm
    from tvmrnn.runtime.profile import random_tensors
    (values,) = random_tensors([(64, 257)], tvm.cpu(0))
    words = np.asarray(values.numpy(), np.float32)
    assert np.abs(words).max() <= 0.5 + 2 ** -8 and words.std() > 0.2
    bits = words.view(np.uint32)
    for half in (bits >> 16, bits & 0xFFFF):
        as_float = (half.astype(np.uint32) << 16).view(np.float32)
        finite_normal = np.isfinite(as_float) & ((np.abs(as_float) >= np.finfo(np.float32).tiny) | (as_float == 0))
        assert finite_normal.all() and np.abs(as_float).max() <= 0.5 + 2 ** -8 and as_float.std() > 0.2


def test_masks_are_timed_with_every_row_running():
    """A variable-lengths build's masks are ones when its kernels and passes are timed (profile,
    pass tuning): with random values every row had ended, and the CPU kernels skipped their GEMMs
    (``tvmrnn.schedules.ended_rows``), so a masked pass timed at a fraction of its cost."""
    import numpy as np
    import tvm
    from tvmrnn.runtime.profile import random_tensors
    mask, gemm_mask, x = random_tensors([(4, 3), (3,), (4, 3)], tvm.cpu(0), ["mask", "gemm_mask", "x"])
    assert (mask.numpy() == 1).all() and (gemm_mask.numpy() == 1).all() and not (x.numpy() == 1).any()
