"""MetaSchedule tuning on this CPU, in seconds: records, resume, use by build, damaged logs, RPC."""
from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest
import torch
import tvm
import tvm_ffi

import tvmrnn
from tvmrnn.tune import records, tasks, tuner
from tvmrnn.cells.definition import CELLS
from tvmrnn.program.passes import Config
from tvmrnn.schedules.common import is_gpu
from conftest import cpu_has as _cpu_has, rel_error, torch_module

CONFIG = Config(CELLS["rnn_tanh"], 4, 8, 1, False, 2, False)
STEP = "recurrent_step_rnn_tanh_infer_n2_h8"


def _tune(log_dir, trials=4, kernels=(STEP,), **kwargs):
    """A tiny run in MetaSchedule's own space: the step's template space has only a few distinct
    schedules at these sizes (test_template_search_beats_or_matches_the_default searches one)."""
    kwargs.setdefault("space", "generic")
    lines = []
    results = tuner.tune([CONFIG], tvmrnn.device.host_target(), log_dir=str(log_dir), trials_per_task=trials,
                          kernels=list(kernels), num_trials_per_iter=4, out=lines.append, **kwargs)
    return results, lines


@pytest.fixture(scope="module")
def tuned_logs(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("logs")
    results, lines = _tune(log_dir)
    return log_dir, results, lines


def test_tiny_tuning_run_writes_records(tuned_logs):
    log_dir, results, lines = tuned_logs
    (task, best_us, trials), = results
    assert task.kernel.name == STEP and trials >= 4 and best_us is not None and best_us > 0
    assert any("trials" in line and "ETA" in line for line in lines)  # progress was shown
    # the default schedule was measured first, so the best record is never worse than it
    default_us = [float(l.split("default schedule ")[1].split()[0]) for l in lines if "default schedule" in l]
    assert len(default_us) == 1 and best_us <= default_us[0] + 0.05  # printed to 0.1 us
    folder = os.path.join(log_dir, records.target_key(tvmrnn.device.host_target()))
    assert glob.glob(os.path.join(folder, "*_tuning_record.json"))


def test_the_log_index_serves_the_best_records_and_counts_all(tuned_logs):
    """``LogIndex`` parses only the records asked for (parsing replays a trace, ~20 ms a record):
    its best are the fully loaded database's, in order, and it counts every record, as
    ``schedules.py`` prints."""
    log_dir, results, _ = tuned_logs
    (task, _, trials), = results
    folder = os.path.join(log_dir, records.target_key(tvmrnn.device.host_target()))
    every, logs = records.load_records(folder), records.LogIndex(folder)
    assert len(records.records_of(every, task.kernel)) == trials == logs.trials(task.kernel)
    # (without the records the tuning run's confirm_best vetoed: it vetoes by timing, and under
    # load it may veto the best; the vetoes name the logs' JSON, so they are matched by trace)
    key = records.LogIndex._key(records.workload(task.kernel))
    logged = logs.logged_workload(key)
    vetoed = {str(records._parse(record, logged, where).trace) for _, record, where in logs.fastest(key, vetoed=True)
              if logs.checks.vetoed(key, record)}
    expected = [r for r in every.get_top_k(every.commit_workload(records.workload(task.kernel)), trials)
                if str(r.trace) not in vetoed][:3]
    kept = list(logs.best(task.kernel, 3))
    assert [str(r.trace) for r in kept] == [str(r.trace) for r in expected]
    assert [list(map(float, r.run_secs)) for r in kept] == [list(map(float, r.run_secs)) for r in expected]
    assert len(list(logs.best(task.kernel, 1))) == 1


def test_rerun_resumes_without_repeating_trials(tuned_logs):
    log_dir, _, _ = tuned_logs
    folder = os.path.join(log_dir, records.target_key(tvmrnn.device.host_target()))
    before = sorted(glob.glob(os.path.join(folder, "*")))
    results, lines = _tune(log_dir)
    assert results[0][2] == tuned_logs[1][0][2]  # same number of trials: none repeated
    assert any("skipped" in line for line in lines)
    assert sorted(glob.glob(os.path.join(folder, "*"))) == before  # no new files, none rewritten


def test_build_uses_the_log_and_still_matches_torch(tuned_logs, rng):
    log_dir, _, _ = tuned_logs
    rnn = tvmrnn.build("rnn_tanh", input_size=4, hidden_size=8, batch_size=2, tuning_logs=str(log_dir))
    assert rnn.schedules[STEP] == "tuned"
    assert rnn.schedules["copy_2x8"] == "default"
    torch.manual_seed(0)
    ref = torch_module("rnn_tanh", 4, 8, 1, False, False).double()
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = rng.standard_normal((30, 2, 4)).astype(np.float32)
    y, hy, _ = rnn.forward(w, x)
    assert rel_error(y, ref(torch.from_numpy(x).double())[0]) < 1e-4


def test_masked_steps_take_their_unmasked_twins_records(tuned_logs, rng):
    """A variable-lengths build's masked step (a workload of its own, with no record) is scheduled
    by the unmasked step's record, and the build still matches torch.nn on rows of other lengths."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
    log_dir, _, _ = tuned_logs
    rnn = tvmrnn.build("rnn_tanh", input_size=4, hidden_size=8, batch_size=2, tuning_logs=str(log_dir),
                       options=tvmrnn.BuildOptions(variable_lengths=True))
    assert rnn.schedules[STEP + "_masked"] == "unmasked record"
    torch.manual_seed(0)
    ref = torch_module("rnn_tanh", 4, 8, 1, False, False).double()
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x, lengths = rng.standard_normal((30, 2, 4)).astype(np.float32), [17, 30]
    y, hy, _ = rnn.forward(w, x, lengths=lengths)
    out, hr = ref(pack_padded_sequence(torch.from_numpy(x).double(), torch.tensor(lengths), enforce_sorted=False))
    assert rel_error(y, pad_packed_sequence(out, total_length=30)[0]) < 1e-4 and rel_error(hy, hr) < 1e-4


def test_tuning_a_gate_blocked_lstm_step(tmp_path, rng):
    """The fused step's search space on gate-blocked weight panels (``(H / u, K, G, u)``, every
    CPU's default where a panel divides H): its candidates build and run, and the build with the
    tuned record matches PyTorch. H = 32 holds more than one panel on AVX2 (4 units) and AVX-512 (16)."""
    config = Config(CELLS["lstm"], 4, 32, 1, False, 2, False)
    steps = [t.kernel.name for t in tasks.extract_tasks([config])
             if t.kernel.name.startswith("recurrent_step_lstm_infer")]
    assert len(steps) == 1 and re.search(r"_p\d+$", steps[0]), steps
    results = tuner.tune([config], tvmrnn.device.host_target(), log_dir=str(tmp_path), trials_per_task=4,
                          kernels=steps, num_trials_per_iter=4, out=lambda line: None, space="generic")
    assert results[0][0].kernel.name == steps[0] and results[0][2] >= 4
    rnn = tvmrnn.build("lstm", input_size=4, hidden_size=32, batch_size=2, tuning_logs=str(tmp_path))
    assert rnn.schedules[steps[0]] == "tuned"
    torch.manual_seed(0)
    ref = torch_module("lstm", 4, 32, 1, False, False).double()
    x = rng.standard_normal((11, 2, 4)).astype(np.float32)
    y, _, _ = rnn.forward(rnn.pack_weights(tvmrnn.params_from_torch(ref)), x)
    assert rel_error(y, ref(torch.from_numpy(x).double())[0]) < 1e-4


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_sampled_cpu_steps_on_gate_blocked_panels_match_the_default(cell, rng):
    """Schedules sampled from the fused step's CPU space (their units whole panels) compute what
    the default schedule does, output for output."""
    from tvm import s_tir

    from tvmrnn import schedules as default_schedule, kernels
    from tvmrnn.tune import spaces
    from tvmrnn.cells.definition import get_cell
    from tvmrnn.program.sequence import compile_module
    target = tvmrnn.device.host_target()
    kernel = kernels.recurrent_step(get_cell(cell), 4, 32, False, panel=8)
    inputs = [rng.uniform(-1, 1, [int(d) for d in p.shape]).astype("float32") for p in kernel.func.params]
    outputs = [i for i, role in enumerate(kernel.roles) if role in ("h", "y", "c")]

    def run(func):
        lib = compile_module(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target).jit()
        arrays = [tvm.runtime.tensor(x.copy()) for x in inputs]
        lib["main"](*arrays)
        return [arrays[i].numpy() for i in outputs]
    want = run(default_schedule.default_schedule(kernel, target))
    assert all(not np.array_equal(w, inputs[i]) for w, i in zip(want, outputs))
    for seed in range(1, 4):
        sch = s_tir.Schedule(records.prepare(kernel), seed=seed)
        spaces.fused_step_space(target)(sch)
        for got, w in zip(run(sch.mod["main"]), want):
            np.testing.assert_allclose(got, w, rtol=1e-6, atol=1e-6)


def test_a_task_whose_default_does_not_run_is_not_searched(tmp_path, monkeypatch):
    """Where the default schedule cannot be measured here, no searched record may take its place:
    ``build`` would take the record, slower or not, with nothing measured to say which. (v53: the
    runner's process had no AMX permission, every AMX candidate died, and a DS2 bf16 projection's
    vdpbf16ps record at 3.06 ms replaced the AMX default's 0.5 ms; the pass ran 2x slower.)"""
    monkeypatch.setattr(tuner, "seed_defaults", lambda *args, **kwargs: 0)  # as if the default failed to run
    results, lines = _tune(tmp_path, trials=4)
    (task, best_us, trials), = results
    assert best_us is None and trials == 0
    assert any(task.kernel.name in line and "not searched" in line for line in lines), lines


def test_measurements_in_rounds_are_kept_in_order(tmp_path):
    """``tuner._measure(..., rounds=3)`` builds each candidate once and runs them in turn three
    times (``confirm_best``'s interleaved rounds: record, default, record, ...), each run its own
    time in that order (keyed by candidate, every round had taken the last round's time)."""
    from types import SimpleNamespace
    from tvmrnn.tune import spaces
    from tvmrnn.schedules import knobs
    target = tvmrnn.device.host_target()
    task = tasks.select_tasks([CONFIG], target, [STEP], None, None)[0]
    mod = records.workload(task.kernel)
    a = spaces.knob_schedule(mod, task.kernel, target, knobs.defaults(knobs.knobs(task.kernel, target)))
    calls = []

    class Builder:
        def build(self, inputs):
            calls.append(len(inputs))
            return [SimpleNamespace(error_msg=None, artifact_path=f"a{i}") for i in range(len(inputs))]

    class Runner:
        def run(self, inputs):
            calls.append([str(x.artifact_path) for x in inputs])
            return [SimpleNamespace(result=lambda i=i: SimpleNamespace(run_secs=[(i + 1) * 1e-6], error_msg=None))
                    for i in range(len(inputs))]
    times = []
    tuner._measure(tuner.LogDatabase(str(tmp_path)), mod, [a, a], target, Builder(), Runner(), times, rounds=3)
    assert [round(t) for t in times] == [1, 2, 3, 4, 5, 6]
    assert calls == [2, ["a0", "a1"] * 3]


def test_a_best_record_not_faster_measured_again_is_vetoed(tmp_path):
    """After a search the tuner measures each task's best record against its default again,
    interleaved (``tuner.confirm_best``): a record logged fast but slower in fact (here a
    1-vector, 6-accumulator tile logged at 1 ns, as a candidate measured in a fast moment of a
    noisy machine could be) gets a "vetoed" verdict, and the log's fastest is the default again."""
    from tvm.s_tir import meta_schedule as ms
    from tvmrnn.schedules import knobs
    from tvmrnn.tune import pass_checks, spaces
    target = tvmrnn.device.host_target()
    config = Config(CELLS["lstm"], 64, 64, 1, False, 8, False)
    (task, _, _), = tuner.tune([config], target, log_dir=str(tmp_path), trials_per_task=1,
                               kernels=["input_projection_t16"], out=lambda line: None)
    folder = os.path.join(tmp_path, records.target_key(target))
    db = tuner.LogDatabase(folder)
    mod = records.workload(task.kernel)
    slow = {**knobs.defaults(knobs.knobs(task.kernel, target)), "accumulators": 6, "column_vectors": 1}
    sch = spaces.knob_schedule(mod, task.kernel, target, slow)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    db.commit_tuning_record(ms.database.TuningRecord(sch.trace, db.commit_workload(mod), [1e-9], target, args))
    key = records.LogIndex._key(mod)
    assert records.LogIndex(folder).fastest(key)[0][0] == 1e-9
    lines = []
    builder, runner = tuner._measuring(tuner.default_builder(target), tuner.default_runner(target))
    tuner.confirm_best(db, [task], target, builder, runner, out=lines.append)
    assert any("not faster: vetoed" in line for line in lines), lines
    verdicts = pass_checks.PassChecks(folder).records
    assert [v["verdict"] for v in verdicts if v.get("check") == "kernel"][:1] == ["vetoed"], verdicts
    assert records.LogIndex(folder).fastest(key)[0][0] > 1e-9  # the faked record is skipped


@pytest.mark.skipif(not _cpu_has("amx_bf16"), reason="needs a CPU with AMX-BF16")
def test_the_tuner_measures_amx_kernels(tmp_path):
    """The tuner's measuring process asks for AMX as ``build``'s callers do: a bf16 projection's
    AMX default is measured (not "failed to run"), and every logged candidate calling the AMX
    microkernel ran (without the request each died at its first tile instruction, v53)."""
    from tvmrnn.schedules import bf16
    target = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": os.cpu_count() or 1})
    config = Config(CELLS["lstm"], 32, 32, 1, False, 20, False, tvmrnn.BuildOptions(dtype="bfloat16"))
    lines = []
    (task, best_us, trials), = tuner.tune([config], target, log_dir=str(tmp_path), trials_per_task=2,
                                          kernels=["input_projection_t16"], num_trials_per_iter=2, out=lines.append)
    assert task.kernel.name.endswith("_bf16") and bf16.projection_amx_applies(
        tvm.s_tir.Schedule(tvm.s_tir.renew_defs(task.kernel.func)), task.kernel, target)
    default = [line for line in lines if "default schedule" in line]
    assert default and "failed" not in default[0], lines
    assert trials >= 1 and best_us is not None
    logged = records.load_records(os.path.join(tmp_path, records.target_key(target))).get_all_tuning_records()
    amx = [r for r in logged if "tvmrnn_amx_" in str(r.trace)]
    assert amx and all(r.run_secs is not None and max(float(t) for t in r.run_secs) < 1 for r in amx), \
        [(str(r.trace)[:80], r.run_secs) for r in amx]


def test_untuned_build_says_so_once(tmp_path):
    with pytest.warns(records.UntunedWarning, match="have no tuning record"):
        tvmrnn.build("gru", input_size=3, hidden_size=5, batch_size=2, tuning_logs=str(tmp_path))


def test_a_cpu_with_the_same_cores_uses_the_others_logs(tuned_logs, tmp_path):
    """Logs tuned on a sapphirerapids serve an emeraldrapids with as many cores (LLVM named the GPU
    machine's Xeon each way on different days), said once; its own logs come first."""
    import tvm
    src = os.path.join(tuned_logs[0], records.target_key(tvmrnn.device.host_target()))
    shutil.copytree(src, tmp_path / "llvm-sapphirerapids-2c")
    spr = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
    emr = dict(spr, mcpu="emeraldrapids")
    # (the suite's builds are at LLVM -O0, TVMRNN_LLVM_OPT_LEVEL: their key says so)
    with pytest.warns(records.UntunedWarning, match="no tuning logs for llvm-emeraldrapids-2c(-O0)?; using those of "
                                                   "llvm-sapphirerapids-2c"):
        rnn = tvmrnn.plan("rnn_tanh", input_size=4, hidden_size=8, batch_size=2, target=emr,
                          tuning_logs=str(tmp_path))
    assert rnn.schedules[STEP] == "tuned"
    assert records.logs_folder(str(tmp_path), tvm.target.Target(dict(emr, **{"num-cores": 4}))) is None
    assert records.logs_folder(str(tmp_path), tvm.target.Target(dict(spr, mcpu="znver5"))) is None
    os.makedirs(tmp_path / "llvm-emeraldrapids-2c")
    assert records.logs_folder(str(tmp_path), tvm.target.Target(emr)).endswith("llvm-emeraldrapids-2c")


def test_timings_at_a_lower_llvm_level_are_logged_apart(tmp_path):
    """Code at a lower LLVM level (TVMRNN_LLVM_OPT_LEVEL) runs slower, so tuning under it logs to a
    folder of its own (its timings would rank schedules against the top level's wrongly); its
    builds read the top level's logs and records too (they are schedules, good at any level),
    without the warning of borrowed ones."""
    import tvm
    spr = {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}
    low = tvm.target.Target(dict(spr, **{"opt-level": 0}))
    assert records.target_key(tvm.target.Target(spr)) == "llvm-sapphirerapids-2c"
    assert records.target_key(tvm.target.Target(dict(spr, **{"opt-level": 3}))) == "llvm-sapphirerapids-2c"
    assert records.target_key(low) == "llvm-sapphirerapids-2c-O0"
    assert records.same_cores(low) == ["llvm-sapphirerapids-2c-O0", "llvm-sapphirerapids-2c", "llvm-emeraldrapids-2c"]
    os.makedirs(tmp_path / "llvm-sapphirerapids-2c")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert records.logs_folder(str(tmp_path), low).endswith("llvm-sapphirerapids-2c")
    os.makedirs(tmp_path / "llvm-sapphirerapids-2c-O0")
    assert records.logs_folder(str(tmp_path), low).endswith("llvm-sapphirerapids-2c-O0")


def _copy_logs(src_dir, dst_dir):
    folder = os.path.join(src_dir, records.target_key(tvmrnn.device.host_target()))
    for path in glob.glob(os.path.join(folder, "*")):
        with open(path, "rb") as f, open(os.path.join(dst_dir, os.path.basename(path)), "wb") as g:
            g.write(f.read())
    return glob.glob(os.path.join(dst_dir, "*_tuning_record.json"))[0]


def test_truncated_last_line_is_tolerated(tuned_logs, tmp_path):
    record_file = _copy_logs(tuned_logs[0], tmp_path)
    good = len(records.load_records(str(tmp_path)).get_all_tuning_records())
    with open(record_file, "ab") as f:
        f.write(b'[0, [[["b0", "SBlockRV"')  # a run killed mid-write
    with pytest.warns(UserWarning, match="truncated last line"):
        db = records.load_records(str(tmp_path))
    assert len(db.get_all_tuning_records()) == good


def test_corrupt_record_names_file_and_line(tuned_logs, tmp_path):
    record_file = _copy_logs(tuned_logs[0], tmp_path)
    with open(record_file) as f:
        lines = f.read().splitlines(keepends=True)
    lines.insert(1, '{"this is": "not a record"}\n')
    with open(record_file, "w") as f:
        f.writelines(lines)
    with pytest.raises(records.TuningLogError,
                       match=rf"{os.path.basename(record_file)}:2: not a MetaSchedule tuning record"):
        records.load_records(str(tmp_path))
    with open(record_file, "w") as f:
        f.writelines(lines[:1] + ["{not json\n"] + lines[1:])
    with pytest.raises(records.TuningLogError, match=r":2: not a JSON line"):
        records.load_records(str(tmp_path))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(what, process, ready, timeout=60.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        try:
            if ready():
                return
        except (OSError, RuntimeError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what} did not come up in {timeout:.0f} s")


def test_tunes_through_the_rpc_tracker_on_two_servers(tmp_path, monkeypatch):
    """TVM's stock tracker with two of tvmrnn's servers on loopback (as a 2-GPU machine runs one a
    GPU; each serves its sessions in its own process): one task's candidates are measured on both
    at once; two tasks are seeded and searched by two processes at once, one a server; every
    record lands in the one log."""
    from tvm import rpc

    port = _free_port()
    # (TVM's tracker runs in a child process of its command: a session of its own, killed whole)
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                "--port", str(port), "--port-end", str(port + 1)], start_new_session=True)
    servers, logs, kids = [], [tmp_path / f"server{i}.log" for i in range(2)], []
    try:
        _wait_for("the RPC tracker", tracker, lambda: socket.create_connection(("127.0.0.1", port), timeout=1).close() or True)
        for log in logs:
            server_port = _free_port()
            with open(log, "w") as f:
                servers.append(subprocess.Popen(
                    [sys.executable, "-m", "tvmrnn.tune.rpc_server", "--tracker", f"127.0.0.1:{port}",
                     "--key", "tvmrnn-test", "--host", "127.0.0.1", "--port", str(server_port),
                     "--port-end", str(server_port + 1)], stdout=f, stderr=subprocess.STDOUT))
        _wait_for("two RPC servers", servers[0], lambda: rpc.connect_tracker("127.0.0.1", port).summary()
                  ["queue_info"].get("tvmrnn-test", {}).get("free", 0) >= 2)
        assert tuner.rpc_devices(f"127.0.0.1:{port}", "tvmrnn-test") == 2
        kids = [int(pid) for p in servers
                for pid in subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True).stdout.split()]
        assert len(kids) >= 2, kids
        with pytest.raises(RuntimeError, match="rpc_key: .* no free server under 'no-such-key'"):
            tuner.rpc_devices(f"127.0.0.1:{port}", "no-such-key")
        results, lines = _tune(tmp_path / "logs", trials=4, rpc_tracker=f"127.0.0.1:{port}", rpc_key="tvmrnn-test")
        (task, best_us, trials), = results
        assert trials >= 4 and best_us is not None
        assert any("measuring on 2 RPC devices" in line for line in lines), lines
        assert any("trials on 2 devices" in line for line in lines), lines
        # both servers measured candidates (each logs a module it loads), and all their records
        # are in the one log folder
        for log in logs:
            text = log.read_text()
            assert "sessions in process" in text and "load_module" in text, text[-2000:]
        folder = os.path.join(tmp_path / "logs", records.target_key(tvmrnn.device.host_target()))
        assert len(records.load_records(folder).get_all_tuning_records()) >= 4
        # two tasks: a search (a process) each, on a server each, their records in the same folder
        # (the split's threshold lowered from 2 tasks a server: a 4-task run here would take minutes)
        monkeypatch.setattr(tuner, "SPLIT_TASKS_PER_DEVICE", 1)
        other = "backward_step_rnn_tanh_n2_h8"  # (the train step's workload is the inference step's here)
        results, lines = _tune(tmp_path / "logs", trials=8, kernels=(STEP, other),
                               rpc_tracker=f"127.0.0.1:{port}", rpc_key="tvmrnn-test")
        assert sorted(task.kernel.name for task, _, _ in results) == sorted([STEP, other])
        assert all(trials >= 8 and best_us is not None for _, best_us, trials in results), results
        assert any("tuning 2 tasks as 2 searches at once" in line for line in lines), lines
        for search in (1, 2):
            assert any(line.startswith(f"[search {search}] [") and "trials" in line for line in lines), lines
        # the new task's default was measured in its search process, not before the split
        assert any(line.startswith("[search ") and f"task {other}: default schedule" in line for line in lines), lines
        runs = {os.path.basename(f).split("_tuning_record")[0] for f in glob.glob(os.path.join(folder, "*_tuning_record.json"))}
        assert len(runs) >= 3, runs  # the first run's, and one file pair per search process
    finally:
        for p in servers:  # a server stops its TVM server process on SIGTERM
            p.terminate()
            p.wait(timeout=10)
        os.killpg(tracker.pid, signal.SIGTERM)
        tracker.wait(timeout=10)
    # TVM's server processes (children of the commands) stopped with them
    deadline = time.time() + 10
    while any(_alive(pid) for pid in kids) and time.time() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in kids if _alive(pid)], "a server's TVM process outlived its command"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_shipped_records_are_the_best_of_the_committed_logs():
    """Each shipped records file (package data) holds, for every workload of its target's raw logs
    (tuning_logs/, xz-compressed) with a measured record, that workload's fastest record, its
    trial count, and nothing the logs lack: tuning loses no record between logs and package."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = sorted(glob.glob(os.path.join(records.RECORDS_DIR, "*.jsonl")))
    assert {os.path.basename(f) for f in files} >= {"cuda-sm_90.jsonl", "llvm-sapphirerapids-16c.jsonl"}
    for path in files:
        shipped = records.RecordDatabase(path)
        key = os.path.basename(path)[: -len(".jsonl")]
        assert shipped.header["target"] == key
        logs = records.LogIndex(os.path.join(root, "tuning_logs", key))
        assert set(shipped.entries) == set(logs.records)
        for workload, entry in shipped.entries.items():
            fastest = min(secs for secs, *_ in logs.records[workload])
            assert abs(entry["records"][0]["us"] - fastest * 1e6) < 1e-3 and entry["trials"] == logs.counts[workload]
    for folder in glob.glob(os.path.join(root, "tuning_logs", "superseded", "*")):
        assert len(records.load_records(folder).get_all_tuning_records()) > 0


def test_the_shipped_records_serve_a_ds2_h100_build(tmp_path):
    """Every kernel of the Deep Speech 2 LSTM build for the H100 (1 layer, T=300, N=20, I=H=800) has a
    shipped record that replays on its workload and embeds: the build is tuned out of the box
    (its programs are made, not compiled, here). The records were made for the chunk ladder
    (256, 32, 4, 1), which such builds keep (``records.records_ladder``) where few-row batches
    without records take 16- and 8-step chunks too (v69)."""
    import dataclasses

    from tvmrnn import device
    from tvmrnn.options import BuildOptions
    from tvmrnn.program.passes import GPU_CHUNK_STEPS, GPU_SHORT_CHUNK_STEPS, all_programs
    target = device.resolve("nvidia/nvidia-h100")
    schedule, used, _ = records.scheduler(target, tuning_logs=str(tmp_path))  # no raw logs: the shipped ones alone
    config = Config(CELLS["lstm"], 800, 800, 1, False, 20, False)
    options = records.tuned_options(config, target, str(tmp_path), BuildOptions())
    assert options.chunk_steps == GPU_SHORT_CHUNK_STEPS != GPU_CHUNK_STEPS
    unrecorded = Config(CELLS["lstm"], 800, 800, 1, False, 12, False)  # no records at N = 12
    assert records.tuned_options(unrecorded, target, str(tmp_path), BuildOptions()).chunk_steps is None
    assert records.tuned_options(config, target, False, BuildOptions()).chunk_steps is None  # records off
    persistent_off = records.tuned_options(config, target, str(tmp_path), BuildOptions(persistent="off"))
    assert persistent_off.chunk_steps == GPU_SHORT_CHUNK_STEPS  # other options set: the ladder still follows the records
    own = records.tuned_options(config, target, str(tmp_path), BuildOptions(chunk_steps=(32, 4, 1)))
    assert own.chunk_steps == (32, 4, 1)  # the caller's ladder stays
    from tvmrnn.runtime.pass_tuning import option_candidates
    assert ("chunk_steps", GPU_CHUNK_STEPS) in option_candidates(config, target)  # whole-pass tuning tries it
    config = dataclasses.replace(config, options=options)
    for program in all_programs(config, schedule, target, device.persistent_blocks(target, config.options)):
        program.build()
    # (v78's copy of b_ih's gradient into b_hh's, 3,200 floats once a backward, has no shipped record yet)
    untuned = {k: v for k, v in used.items() if v != "tuned" and k != "copy_4x800"}
    assert used and not untuned, untuned


def test_records_can_be_turned_off(monkeypatch):
    from tvmrnn import device
    target = device.resolve("nvidia/nvidia-h100")
    monkeypatch.setenv("TVMRNN_TUNING_LOGS", "off")
    assert records.records_off(None) and records.logs_folder(None, target) is None
    assert not records.records_off("some/folder") and records.records_off(False)


def test_the_tune_command_distills_logs_into_a_records_file(tuned_logs, tmp_path):
    """``tvmrnn-tune --distill OUT`` on the tiny run's logs: a records file naming the tuned kernel."""
    import json

    from conftest import cli
    log_dir = tuned_logs[0]
    out = tmp_path / "records.jsonl"
    run = subprocess.run([*cli("tvmrnn-tune"), "rnn_tanh", "--input-size", "4", "--hidden-size", "8", "--batch-size",
                          "2", "--target", "cpu", "--log-dir", str(log_dir), "--distill", str(out)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["format"] == "tvmrnn-records" and lines[0]["workloads"] == len(lines) - 1 >= 1
    assert STEP in {line["kernel"] for line in lines[1:]}


def test_distill_keeps_each_workloads_best_and_builds_use_it(tuned_logs, tmp_path, rng):
    """``tvmrnn-tune --distill`` writes a records file from raw logs; a build given only that file (as
    the package's records) finds its record; the file says how it was made."""
    log_dir, results, _ = tuned_logs
    (task, best_us, trials), = results
    target = tvmrnn.device.host_target()
    folder = os.path.join(log_dir, records.target_key(target))
    out = tmp_path / "records" / (records.target_key(target) + ".jsonl")
    counts = records.distill(folder, target, str(out), [task.kernel])
    shipped = records.RecordDatabase(str(out))
    entry = shipped.entries[records.workload_key(task.kernel)]
    assert entry["kernel"] == STEP and entry["trials"] == trials and abs(entry["records"][0]["us"] - best_us) < 1e-3
    assert shipped.header["format"] == "tvmrnn-records" and counts["workloads"] == len(shipped.entries)
    assert records.records_file(target, str(tmp_path / "records")) == str(out)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_committed_h100_logs_build_for_sm90():
    """Logged H100 records (compressed raw logs) are picked up and embed in the driver (one launch
    per kernel). The records sit in superseded/ (slower than today's default), which `build` reads
    when told to. They are for per-step kernels: the inference forward's persistent loop (the
    default) has none. The shipped records are left out (no records file for this folder's key
    would apply: ``records_dir`` is the package's, so they are read too, and they are faster)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rnn = tvmrnn.build("gru", input_size=800, hidden_size=800, batch_size=20, target="nvidia/nvidia-h100",
                       tuning_logs=os.path.join(root, "tuning_logs", "superseded"),
                       options=tvmrnn.BuildOptions(persistent="off"))
    assert rnn.schedules["recurrent_step_gru_infer_n20_h800"] == "tuned"
    assert rnn.schedules["recurrent_step_gru_train_n20_h800"] == "tuned"


def test_masked_chunk_gemms_are_tuned_as_their_twins():
    """A variable-lengths CPU build's chunk GEMMs take a mask that no expression reads (the
    ended-row skip is added after scheduling) and replay their twins' records, so their tasks are
    the twins', with the same calls; the masked steps, whose select reads the mask, stay tasks of
    their own."""
    target = tvmrnn.device.host_target()

    def calls(variable_lengths):
        config = Config(CELLS["lstm"], 24, 24, 1, True, 5, False, tvmrnn.BuildOptions(variable_lengths=variable_lengths))
        return {t.kernel.name: t.calls for t in tasks.extract_tasks([config], target=target)}
    fixed, masked = calls(False), calls(True)
    gemms = [n for n in fixed if n.startswith(("input_projection", "input_gradient", "weight_gradient"))]
    assert gemms and all(masked.get(n) == fixed[n] for n in gemms), (gemms, masked)
    assert not [n for n in masked if n.endswith("_masked") and n.startswith(("input_", "weight_"))]
    steps = [n for n in masked if n.startswith("recurrent_step") and n.endswith("_masked")]
    assert len(steps) == 2 and all(masked[n] == fixed[n[:-len("_masked")]] for n in steps)


def test_tasks_rank_by_their_share_of_a_step(monkeypatch):
    """--max-tasks keeps the heaviest tasks: calls x latency where measured, else calls x FLOPs."""
    every = tasks.extract_tasks([CONFIG])
    unmeasured = tasks.rank_tasks(every)
    work = [t.calls * max(t.flops, 1.0) for t in unmeasured]
    assert work == sorted(work, reverse=True)
    assert unmeasured[0].flops > 0 and any(t.flops == 0 for t in every)  # copies move data, no FLOPs
    # measured: a rarely called task that takes long outranks a frequent quick one
    rare = min((t for t in every if t.calls), key=lambda t: t.calls)
    often = max(every, key=lambda t: t.calls)
    monkeypatch.setattr(tasks, "best_latency_us", lambda db, kernel: 1e6 if kernel.name == rare.kernel.name else 1.0)
    ranked = tasks.rank_tasks(every, db=object())
    assert ranked[0] is rare and ranked.index(often) > 0


# a block per SM (3 rows would take one block, device.small_step_blocks: no grid barrier to test)
H100_CONFIG = Config(CELLS["lstm"], 13, 37, 1, False, 3, False, tvmrnn.BuildOptions(persistent_blocks=132))


def test_a_gpu_builds_persistent_loop_is_a_task_of_its_own():
    """On a GPU target each pass's persistent time loop (inference, training and, at these small
    sizes, the backward) makes its step kernel a task, run once a step, whose space is the
    default's listed shapes; CPU targets have none."""
    every = tasks.extract_tasks([H100_CONFIG], target="nvidia/nvidia-h100")
    persistent = [t for t in every if tasks.is_persistent(t.kernel)]
    assert sorted(t.kernel.name for t in persistent) == ["backward_step_lstm_n3_h37_persistent",
                                                         "recurrent_step_lstm_infer_n3_h37_persistent",
                                                         "recurrent_step_lstm_train_n3_h37_persistent"]
    # (the backward's loop has one step fewer: the sequence's last step has no recurrent GEMM)
    assert [t.calls for t in persistent] == [tasks.REFERENCE_LENGTH - t.kernel.name.startswith("backward") for t in persistent]
    assert not any(tasks.is_persistent(t.kernel) for t in tasks.extract_tasks([H100_CONFIG]))
    off = Config(CELLS["lstm"], 13, 37, 1, False, 3, False, tvmrnn.BuildOptions(persistent="off"))
    assert not any(tasks.is_persistent(t.kernel) for t in tasks.extract_tasks([off], target="nvidia/nvidia-h100"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
def test_persistent_candidates_build_as_step_loops(tmp_path):
    """A persistent task's candidates build as a loop of steps in one launch with the kernel's own
    parameters (what the runner calls); a schedule that cannot run persistently is refused with a
    reason, and a step loop's measured time is logged per step."""
    from tvm.s_tir import meta_schedule as ms
    from tvmrnn import schedules as default_schedule, kernels
    from tvmrnn.tune.step_loop import step_loop
    target = tvm.target.Target("nvidia/nvidia-h100")
    task = next(t for t in tasks.extract_tasks([H100_CONFIG], target=target) if tasks.is_persistent(t.kernel))
    mod = records.workload(task.kernel)
    good = tvm.s_tir.Schedule(mod)
    default_schedule.apply(good, task.kernel, target)
    plain = kernels.recurrent_step(CELLS["lstm"], 3, 37, train=False)  # many small blocks, not persistent
    bad = default_schedule.default_schedule(plain, target).with_attr("tvmrnn.persistent_blocks", 2)
    @tvm.ir.utils.derived_object
    class Here(ms.builder.PyBuilder):  # in this process: a worker's first build imports TVM's tensor intrinsics (~1 min)
        def build(self, inputs):
            paths = []
            for b in inputs:
                paths.append(str(tmp_path / f"{len(os.listdir(tmp_path))}.so"))
                tvm.compile(b.mod, target=b.target).export_library(paths[-1])
            return [ms.builder.BuilderResult(p, None) for p in paths]

    loops = tuner.StepLoops(steps=5)
    builder = tuner.StepLoopBuilder(Here(), loops)
    built = builder.build([ms.builder.BuilderInput(good.mod, target),
                           ms.builder.BuilderInput(tvm.IRModule({"main": bad}), target)])
    assert built[0].error_msg is None and os.path.exists(built[0].artifact_path)
    assert "does not run persistently" in built[1].error_msg and built[1].artifact_path is None
    assert loops.artifacts == {built[0].artifact_path} and loops.steps == 5
    with open(built[0].artifact_path, "rb") as f:  # launched cooperatively, as in a pass
        blob = f.read()
    assert blob.count(b"tirx.use_cooperative_launch") == 2  # the barrier's reset and the loop
    loop = step_loop(good.mod["main"], target, 5)
    assert [(p.name, tuple(p.shape)) for p in loop.params] == [(p.name, tuple(p.shape)) for p in mod["main"].params]
    source = tvm.compile(tvm.IRModule({"main": loop}), target=target).mod.imports[0].inspect_source()
    assert source.count("__global__") == 2 * 2  # two kernels (declared, then defined): the reset and the loop
    assert "for (int step = 0; step < 5; ++step)" in source and "atomicAdd" in source  # the grid barrier
    # 3 rows by default: blocks of row groups (a row a block, common.GPU_ROW_GROUP_STEPS), the loop
    # alone, its threads meeting at __syncthreads
    one = next(t for t in tasks.extract_tasks([Config(CELLS["lstm"], 13, 37, 1, False, 3, False)], target=target)
               if tasks.is_persistent(t.kernel))
    assert one.kernel.name.endswith("_persistent_rows")
    single = tvm.s_tir.Schedule(records.workload(one.kernel))
    default_schedule.apply(single, one.kernel, target)
    source = tvm.compile(tvm.IRModule({"main": step_loop(single.mod["main"], target, 5)}),
                         target=target).mod.imports[0].inspect_source()
    loop = source.split("for (int step = 0; step < 5; ++step)", 1)[1]
    assert source.count("__global__") == 2 and "atomicAdd" not in source and "__syncthreads()" in loop

    @tvm.ir.utils.derived_object
    class Fixed(ms.runner.PyRunner):  # stands in for the GPU: every run takes 1 ms
        def run(self, inputs):
            return [ms.runner.LocalRunnerFuture([tvm.tirx.FloatImm("float64", 1e-3)], None) for _ in inputs]

    runner = tuner.PerStepRunner(Fixed(), loops)
    args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])
    step, other = runner.run([ms.runner.RunnerInput(built[0].artifact_path, "cuda", args),
                              ms.runner.RunnerInput("elsewhere.so", "cuda", args)])
    assert float(step.result().run_secs[0]) == pytest.approx(2e-4) and float(other.result().run_secs[0]) == 1e-3


def test_record_origins_tell_seeded_schedules_from_searched_ones(tuned_logs, tmp_path):
    """Every record of the tiny run, distilled: the seeded default is ``default``, what the search
    made ``searched``. A template-space record is classified by its knob setting (the default's, a
    listed variant's, or another); a plain trace by whether it is today's default or variant."""
    log_dir, results, _ = tuned_logs
    (task, _, _), = results
    target = tvmrnn.device.host_target()
    out = tmp_path / "all.jsonl"
    records.distill(os.path.join(log_dir, records.target_key(target)), target, str(out), [task.kernel], keep=1000)
    entry = records.RecordDatabase(str(out)).entries[records.workload_key(task.kernel)]
    origins = [r["origin"] for r in entry["records"]]
    assert "default" in origins and set(origins) <= set(records.ORIGINS)

    from tvmrnn import kernels
    from tvmrnn.tune import spaces
    step = kernels.recurrent_step(CELLS["gru"], 3, 37, train=False)
    h100 = tvm.target.Target("nvidia/nvidia-h100")
    seeded = records.seeded_traces(step, h100)
    traces, settings = seeded
    as_json = lambda sch: records._plain(sch.trace.as_json())  # noqa: E731
    mod = records.workload(step)
    default, variant = (spaces.knob_schedule(mod, step, h100, v) for v in settings[:2])
    other = dict(settings[0], unroll=1 if settings[0]["unroll"] != 1 else 4)
    assert other not in settings
    assert records.record_origin([as_json(default)], seeded) == "default"
    assert records.record_origin([as_json(variant)], seeded) == "variant"
    assert records.record_origin([as_json(spaces.knob_schedule(mod, step, h100, other))], seeded) == "searched"
    assert records.record_origin([as_json(default)], None) == "fixed"  # kernel not named: which setting is unknown
    plain = next(t for t in traces[1:] if t is not None and t != traces[0])  # some variants are the default here
    as_record = lambda insts: [[insts, []]]  # noqa: E731 - a record's JSON: [[instructions, decisions], ...]
    assert records.record_origin(as_record(traces[0]), seeded) == "default"
    assert records.record_origin(as_record(plain), seeded) == "variant"
    assert records.record_origin(as_record(traces[0][:-1]), seeded) == "fixed"


def test_records_made_before_the_guarded_vectors_knob_are_older_defaults(monkeypatch):
    """``guarded_vectors`` (v79) is a knob whose AUTO is not the schedule that records made before it
    have (:data:`tvmrnn.schedules.knobs.VALUES_BEFORE`: one vector): a record without the knob whose
    other knobs are today's default is ``fixed`` (an older default), not ``default``; with the knob
    at AUTO it is ``default``, at another value ``searched``."""
    from tvmrnn.schedules import cpu, knobs
    # (the weight gradients in rows: an LSTM's at such an H are summed in padded panels since v89)
    monkeypatch.setattr(cpu, "CPU_PADDED_GRADIENT_PANELS", False)
    target = tvm.target.Target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    rnn = tvmrnn.plan("lstm", 37, 67, batch_size=5, target=target, tuning_logs=False)
    kernel = next(k for name, k in rnn.programs["backward"].kernels.items()
                  if name.startswith("weight_gradient_packed_t16_n5_k67_"))
    seeded = records.seeded_traces(kernel, target)
    default = seeded[1][0]
    assert default["guarded_vectors"] == knobs.AUTO
    for values, origin in (({k: v for k, v in default.items() if k != "guarded_vectors"}, "fixed"),
                           (default, "default"), (dict(default, guarded_vectors=3), "searched")):
        monkeypatch.setattr(records, "knob_values_json", lambda trace, values=values: dict(values))
        assert records.record_origin([["a trace"]], seeded) == origin, values


def test_template_search_beats_or_matches_the_default(tmp_path):
    """A seeded search of a GEMM's template space on this CPU: the default is measured first, the
    search's candidates are points of the space (``searched`` once distilled), and the best record
    is at least as fast as the default."""
    config = Config(CELLS["lstm"], 32, 48, 1, False, 8, False)
    target = tvmrnn.device.host_target()
    lines = []
    (task, best_us, trials), = tuner.tune([config], target, log_dir=str(tmp_path), trials_per_task=10,
                                          kernels=["input_projection_t16"], num_trials_per_iter=5,
                                          out=lines.append, population=16)
    default_us = [float(l.split("default schedule ")[1].split()[0]) for l in lines if "default schedule" in l]
    assert trials >= 6 and best_us <= default_us[0] + 0.05
    out = tmp_path / "all.jsonl"
    records.distill(os.path.join(tmp_path, records.target_key(target)), target, str(out), [task.kernel], keep=100)
    origins = [r["origin"] for r in records.RecordDatabase(str(out)).entries[records.workload_key(task.kernel)]["records"]]
    assert origins.count("searched") >= 3 and "default" in origins
    # a template space needs none of TVM's tensor intrinsics (the search may skip importing them);
    # a generic space's search after it gets the real ones, its target's kind's (a CPU's: x86;
    # all of them took 22 s to import on the 2-core dev VM, the CUDA ones 16, v58)
    import sys
    tuner.import_tensor_intrinsics(target)
    intrinsics = sys.modules["tvm.s_tir.tensor_intrin"]
    assert not getattr(intrinsics, "tvmrnn_placeholder", False) and hasattr(intrinsics, "x86")
    assert tvm.s_tir.TensorIntrin.get("dot_16x4_vnni") is not None


def test_a_generic_search_imports_its_targets_tensor_intrinsics_only():
    """A generic space's search imports the TVM tensor intrinsics of its target's kind only
    (an x86 CPU's, a GPU's), all of them for another CPU or where no target is known."""
    assert tuner._intrinsic_parts(tvmrnn.device.host_target() if cpu_is_x86() else "llvm -mtriple=x86_64-linux-gnu") == ("x86",)
    assert tuner._intrinsic_parts({"kind": "llvm", "mcpu": "sapphirerapids", "mtriple": "x86_64-linux-gnu"}) == ("x86",)
    assert tuner._intrinsic_parts(tvm.target.Target("nvidia/nvidia-h100")) == ("cuda",)
    assert tuner._intrinsic_parts({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}) is None
    assert tuner._intrinsic_parts(None) is None


def cpu_is_x86() -> bool:
    import platform
    return platform.machine() in ("x86_64", "AMD64")


def test_template_spaces_hold_the_default_and_the_listed_variants():
    """Each template's space, on the CPU and the H100: the default knob setting schedules a kernel
    exactly as the default schedule does, the trace gives its setting back, every listed variant
    is a point of the space, and a mutation changes one decision."""
    from tvmrnn.tune import spaces, tasks
    from tvmrnn.schedules import apply, knobs
    config = Config(CELLS["gru"], 5, 24, 1, False, 3, False)
    wide = Config(CELLS["gru"], 256, 256, 1, False, 2, False)  # transpositions large enough to tile
    # a half build: its all-steps GEMMs and (128 rows, 1800 x 600) its forward steps on TF32 tiles
    half = Config(CELLS["gru"], 24, 600, 1, False, 128, False, tvmrnn.BuildOptions(dtype="float16"))
    # bf16 steps and their state rounding (scheduled for Sapphire Rapids, whatever this CPU)
    bf16 = Config(CELLS["lstm"], 16, 32, 1, True, 4, False, tvmrnn.BuildOptions(bf16_projections=True))
    spr = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2})
    families = set()
    for target in (tvmrnn.device.host_target(), tvm.target.Target("nvidia/nvidia-h100"), spr):
        # (on the GPU also without row groups: at 3 rows split-K's persistent step is their alternative)
        split = Config(CELLS["gru"], 5, 24, 1, False, 3, False, tvmrnn.BuildOptions(row_groups=False))
        configs = [config, split, half] if is_gpu(target) else [bf16] if target is spr else [config, wide]
        for task in tasks.extract_tasks(configs, target=target):
            kernel = task.kernel
            family = (knobs.family(kernel, target), "_t" in kernel.name and kernel.name.split("_t")[0])
            if family in families:  # one kernel of each template and kind (the test's time)
                continue
            families.add(family)
            mod = records.workload(kernel)
            settings = knobs.seeded_settings(kernel, target)
            found = spaces.knob_schedule(mod, kernel, target, settings[0])
            direct = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
            apply(direct, kernel, target)
            assert tvm_ffi.structural_equal(found.mod, direct.mod), kernel.name
            assert spaces.knob_values(found.trace) == settings[0]
            assert all(spaces.knob_schedule(mod, kernel, target, v) is not None for v in settings[1:]), kernel.name
            if family[0] == "matmul_tf32":  # every seeded setting on the tensor cores (none fell back)
                for values in settings:
                    sch = spaces.knob_schedule(mod, kernel, target, values)
                    assert any(inst.kind.name == "Tensorize" for inst in sch.trace.insts), (kernel.name, values)
                slices = next((k for k in knobs.knobs(kernel, target) if k.name == "k_slices"), None)
                if slices is not None:  # slices that 128-step tiles do not divide: refused, not a naive GEMM
                    bad = {**settings[0], "k_tile": 128, "k_slices": max(slices.values)}
                    assert spaces.knob_schedule(mod, kernel, target, bad) is None, kernel.name
            if any(len(k.values) > 1 for k in knobs.knobs(kernel, target)):
                mutated = spaces.MutateKnob().apply(found.trace)
                replayed = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
                mutated.apply_to_schedule(replayed, remove_postproc=True)
                after = spaces.knob_values(replayed.trace)
                assert sum(after[k] != settings[0][k] for k in after) == 1, kernel.name
    assert {f for f, _ in families} >= {"cpu_gemm", "cpu_pointwise", "cpu_transpose", "split_k", "matmul", "column_sum",
                                        "gpu_pointwise", "persistent", "row_tiles", "matmul_tf32", "cpu_step_bf16",
                                        "cpu_gemm_bf16", "cpu_round_bf16"}
    assert any(f == "matmul_tf32" and str(name).startswith("recurrent_step") for f, name in families)  # the TF32 step


# (a kernel, as the fresh process makes it too; its target; what its record's trace names)
_INTRINSIC_KERNELS = {
    "tf32": ("kernels.tf32(kernels.input_projection(4, 20, 64, 96, 4), 'tf32')", "nvidia/nvidia-h100", "tvmrnn_tf32_"),
    "float16": ("kernels.tf32(kernels.input_projection(4, 20, 64, 96, 4), 'float16')", "nvidia/nvidia-h100",
                "tvmrnn_float16_"),
    # bf16 CPU kernels: the word-pair dot product (one row a step), and AMX's (many rows)
    "bf16 pairs": ("kernels.recurrent_step(get_cell('lstm'), 1, 32, False, panel=16, bf16=True)",
                   {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}, "tvmrnn_dot_pair_words_packed_bf16"),
    "bf16 amx": ("kernels.input_projection(4, 20, 64, 96, 4, panel=16, bf16=True)",
                 {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}, "tvmrnn_amx_"),
    # a step's: its A the rounded state in memory (kernels.bf16_state), the intrinsics' _state forms
    "bf16 amx step": ("kernels.recurrent_step(get_cell('gru'), 20, 64, False, panel=16, bf16=True)",
                      {"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 2}, "tvmrnn_amx_l0_r20_p1_g3_u16_k32_state"),
}


@pytest.mark.parametrize("operands", list(_INTRINSIC_KERNELS))
def test_a_tensor_intrinsic_record_loads_in_a_fresh_process(tmp_path, operands):
    """A record of a kernel scheduled with one of tvmrnn's tensor intrinsics (TF32's, the half
    operands' ``ldmatrix`` and ``mma``, the bf16 word-pair dot product, an AMX microkernel) names
    it, and TVM knows it only once registered: a process that reads the record before scheduling
    any such kernel (a build taking its record, a resumed tuning run, ``--distill``) registers it
    first. (``import tvmrnn`` registers none: TVMScript's parser takes about 0.5 s a function.)"""
    import json as json_
    from tvm.s_tir import meta_schedule as ms
    from tvmrnn import kernels  # noqa: F401 (the kernels' expressions below)
    from tvmrnn.cells.definition import get_cell  # noqa: F401
    from tvmrnn.schedules import apply
    make, target, name = _INTRINSIC_KERNELS[operands]
    target = tvm.target.Target(target)
    kernel = eval(make)
    mod = records.workload(kernel)
    sch = tvm.s_tir.Schedule(mod)
    apply(sch, kernel, target)
    assert name in json_.dumps(records._plain(sch.trace.as_json()))
    record = [records._plain(sch.trace.as_json()), [1e-5], records._plain(target.export()),
              [records._plain(a.as_json()) for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])]]
    records.record_from_json(record, ms.database.Workload(mod))  # (this process has them registered)
    path = tmp_path / "record.json"
    path.write_text(json_.dumps(record))
    script = (
        "import json, sys, tvm\n"
        "from tvm.s_tir import meta_schedule as ms\n"
        "from tvmrnn import kernels\n"
        "from tvmrnn.cells.definition import get_cell\n"
        "from tvmrnn.tune import records\n"
        f"kernel = {make}\n"
        "loaded = records.record_from_json(json.load(open(sys.argv[1])), ms.database.Workload(records.workload(kernel)))\n"
        "print('replayed', len(loaded.trace.insts))\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "replayed" in done.stdout, done.stderr[-2000:]


def test_a_killed_tuning_run_loses_no_record_and_resumes(tmp_path):
    """Faults: a real ``tvmrnn-tune`` process, killed (SIGKILL) at a seeded random moment after it
    has written records, loses none that it finished; its logs still load, and a rerun resumes:
    it finishes the budget, counting the records already there, and rewrites no old file."""
    import random
    import signal

    from conftest import cli
    cmd = [*cli("tvmrnn-tune"), "rnn_tanh", "--input-size", "4", "--hidden-size", "8", "--batch-size", "2",
           "--target", "cpu", "--log-dir", str(tmp_path), "--kernels", STEP, "--trials", "12",
           "--trials-per-iter", "4", "--space", "generic", "--no-pass-check"]  # (the records are the point)
    folder = tmp_path / records.target_key(tvmrnn.device.host_target())

    def record_lines() -> list[bytes]:  # the complete lines of every record file
        return [line for path in sorted(folder.glob("*_tuning_record.json"))
                for line in path.read_bytes().split(b"\n")[:-1] if line.strip()]

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 300
        while len(record_lines()) < 2 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before it could be killed"
        delay = random.Random(40).uniform(0.0, 2.0)
        time.sleep(delay)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    before = {path: path.read_bytes() for path in folder.iterdir()}
    finished = record_lines()
    assert len(finished) >= 2
    with warnings.catch_warnings():  # a line cut by the kill is skipped with a warning
        warnings.simplefilter("ignore")
        loaded = records.load_records(str(folder))
    assert len(loaded.get_all_tuning_records()) == len(finished), f"killed after {delay:.2f} s"

    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    for path, data in before.items():
        assert path.read_bytes() == data, f"{path.name} was rewritten"
    kernel = next(t.kernel for t in tasks.select_tasks([CONFIG], tvmrnn.device.host_target()) if t.kernel.name == STEP)
    logged = records.LogIndex(str(folder)).trials(kernel)
    assert 12 <= logged < 12 + len(finished), (logged, len(finished))  # the old records counted, none repeated
    assert set(finished) <= set(record_lines())


def test_template_postprocessor_reuses_what_it_made_for_a_setting():
    """The search proposes the same knob settings again and again: ApplyTemplate (and its clones,
    one a search thread) runs the template once a setting, and a repeat schedules a candidate to
    the same kernel as the first; a setting the template refuses stays refused."""
    from tvmrnn.tune import spaces
    from tvmrnn.schedules import knobs
    config = Config(CELLS["gru"], 5, 24, 1, False, 3, False)
    target = tvm.target.Target("nvidia/nvidia-h100")
    task = next(t for t in tasks.extract_tasks([config], target=target) if t.kernel.name.startswith("input_projection"))
    kernel, mod = task.kernel, records.workload(task.kernel)
    found = knobs.knobs(kernel, target)
    settings = knobs.seeded_settings(kernel, target)
    post = spaces.ApplyTemplate(kernel, target)
    runs = []
    make = post._make
    post._make = lambda values: runs.append(values) or make(values)

    def candidate(values, postproc):
        sch = tvm.s_tir.Schedule(tvm.IRModule({"main": tvm.s_tir.renew_defs(mod["main"])}))
        spaces._sample_knobs(sch, found, values)
        sch.enter_postproc()
        return sch if postproc.apply(sch) else None

    first = candidate(settings[0], post)
    again = candidate(settings[0], post.clone())  # a clone shares what was made
    assert first is not None and again is not None and len(runs) == 1
    assert tvm_ffi.structural_equal(first.mod, again.mod)
    assert tvm_ffi.structural_equal(first.mod, spaces.knob_schedule(mod, kernel, target, settings[0]).mod)
    # a refused setting (the template raises) is remembered as refused
    post._make = lambda values: runs.append(values) or None
    other = settings[1] if len(settings) > 1 else settings[0]
    key = tuple(sorted(other.items()))
    post.made.pop(key, None)
    assert candidate(other, post) is None and candidate(other, post) is None
    assert runs.count(other) == 1


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_masked_kernels_replay_their_twins_records(cell, monkeypatch):
    """A variable-lengths build's masked kernels take the very record their unmasked twins take
    (the shipped H100 records, DS2 sizes, bidirectional; no compilation). The mask is the last of
    each block's reads, so a twin's trace stages the operands it staged there: with the mask
    first, the GRU's persistent step took another record, and its pass ran at half speed (H200,
    v47). The LSTM's masked backward kernels have an output more than their twins (the dh a
    finished row passes on), so they keep their default schedules."""
    target = tvm.target.Target("nvidia/nvidia-h100")
    config = Config(CELLS[cell], 800, 800, 1, True, 20, False, tvmrnn.BuildOptions(variable_lengths=True))
    masked = [t.kernel for t in tasks.extract_tasks([config], target=target) if t.kernel.unmasked is not None]
    assert len(masked) == 4, [k.name for k in masked]
    monkeypatch.delenv("TVMRNN_TUNING_LOGS")  # the shipped records (and a checkout's logs), as build takes them
    schedule, used, picked = records.scheduler(target)
    for kernel in masked:
        func = schedule(kernel)
        schedule(kernel.unmasked)
        assert func is not None and _mask_reads_are_last(kernel.func), kernel.name
        twin = used[kernel.unmasked.name]
        if twin == "tuned" and (cell == "gru" or kernel.name.startswith("recurrent_step")):
            assert used[kernel.name] == "unmasked record", kernel.name
            assert picked[kernel.name]["where"] == picked[kernel.unmasked.name]["where"], kernel.name
        else:
            assert used[kernel.name] == "default", (kernel.name, twin)
    assert sum(used[k.name] == "unmasked record" for k in masked) >= (3 if cell == "gru" else 1), used


def _mask_reads_are_last(func) -> bool:
    """Whether every block that reads the mask reads it last (and some block reads it)."""
    found = []

    def visit(block, mutator):
        names = [str(r.source.name) for r in block.reads]
        if "mask" in names:
            found.append(names[-1] == "mask")
        return mutator.default_mutate(block)
    tvm_ffi.structural_mutate(func.body, [(tvm.s_tir.SBlock, visit)])
    return bool(found) and all(found)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (the CUDA compiler) on PATH")
@pytest.mark.parametrize("operands", ["tf32", "float16"])
def test_the_tuning_builder_compiles_tensor_core_candidates(operands):
    """The tuner's builder compiles GPU candidates as builds do, without TIR's CSE: with it,
    ``LowerWarpMemory`` could not find the lane of a tensor-core kernel's warp stores, and every
    TF32 candidate, the default's too, failed to build (the first TF32 search, notes v51)."""
    from tvm.s_tir import meta_schedule as ms
    from tvmrnn import kernels
    from tvmrnn.schedules import apply
    from tvmrnn.cells import get_cell
    target = tvm.target.Target("nvidia/nvidia-h100")
    kernel = kernels.tf32(kernels.recurrent_step(get_cell("lstm"), 128, 1024, train=False), operands)
    mod = records.workload(kernel)
    sch = tvm.s_tir.Schedule(mod)
    apply(sch, kernel, target)
    builder = tuner.default_builder(target)
    try:
        result, = builder.build([ms.builder.BuilderInput(sch.mod, target)])
    finally:
        if builder._pool is not None:
            builder._pool.shutdown()
    assert result.error_msg is None, result.error_msg[-1500:]


def test_shared_memory_is_counted_for_gpus_without_fp8():
    """The check of a record's shared memory (``embeddable``) counts it on an A100 (sm_80) as on
    an H100: it raised there (TVM's FP8StorageLegalize on a target without a host), so an A100
    search rejected every large-shared-memory candidate (notes v50, v51)."""
    from tvmrnn import kernels
    from tvmrnn.cells import get_cell
    from tvmrnn.schedules import cuda
    kernel = kernels.tf32(kernels.recurrent_step(get_cell("lstm"), 128, 1024, train=False))
    sch = tvm.s_tir.Schedule(records.workload(kernel))
    cuda.gpu_matmul_tf32(sch, kernel)
    counted = {tag: records._shared_bytes_when_lowered(sch.mod["main"], tvm.target.Target(tag))
               for tag in ("nvidia/nvidia-a100", "nvidia/nvidia-h100")}
    assert counted["nvidia/nvidia-a100"] == counted["nvidia/nvidia-h100"] and sum(counted["nvidia/nvidia-h100"]) > 49152
    assert records.embeddable(sch.mod["main"], tvm.target.Target("nvidia/nvidia-a100"))


def test_a_record_made_before_a_knob_existed_keeps_its_origin(monkeypatch):
    """A template record whose trace predates a knob (``stage_pad``, v51) has that knob's default,
    which is the schedule as it was: its setting still matches the default or its variant."""
    settings = [dict(tf32_shape=1, k_tile=128, pipeline=0, stage_pad=0), dict(tf32_shape=1, k_tile=128, pipeline=1,
                                                                            stage_pad=0)]
    for old, origin in ((dict(tf32_shape=1, k_tile=128, pipeline=0), "default"),
                        (dict(tf32_shape=1, k_tile=128, pipeline=1), "variant"),
                        (dict(tf32_shape=0, k_tile=128, pipeline=1), "searched")):
        monkeypatch.setattr(records, "knob_values_json", lambda trace, old=old: dict(old))
        assert records.record_origin([["trace"], [1e-5]], ([], settings)) == origin


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_masked_chunk_gemms_replay_their_twins_records_and_skip_ended_rows(cell, monkeypatch):
    """A CPU variable-lengths build's masked input projections and input gradients (v72: a
    ``(steps, rows)`` mask no expression reads) take the very records their unmasked twins take
    (the shipped Xeon records, DS2 sizes; no compilation), and then skip ended rows' tiles."""
    target = tvm.target.Target({"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16})
    config = Config(CELLS[cell], 800, 800, 1, True, 20, False, tvmrnn.BuildOptions(variable_lengths=True))
    from tvmrnn.program.passes import all_programs
    # the build's kernels (their tasks are their twins': test_masked_chunk_gemms_are_tuned_as_their_twins)
    chunks = list({k.name: k for p in all_programs(config, lambda k: k.func, target) for k in p.kernels.values()
                   if k.name.startswith(("input_projection", "input_gradient"))}.values())
    assert chunks and all(k.unmasked is not None and k.name.endswith("_masked") for k in chunks), chunks
    monkeypatch.delenv("TVMRNN_TUNING_LOGS")  # the shipped records, as build takes them
    schedule, used, picked = records.scheduler(target)
    replayed = 0
    for kernel in chunks:
        func = schedule(kernel)
        schedule(kernel.unmasked)
        if used[kernel.unmasked.name] == "tuned":
            assert used[kernel.name] == "unmasked record", kernel.name
            assert picked[kernel.name]["where"] == picked[kernel.unmasked.name]["where"], kernel.name
            replayed += 1
        assert "if mask[" in func.script(), kernel.name
    assert replayed >= 2, used


def test_builds_read_a_log_folder_once_until_its_files_change(tmp_path, monkeypatch):
    """``records.cached_index`` (what builds read logs through) reads a folder once while its
    files stay as they are, and again after a tuning run adds a record or a pass check a verdict."""
    import lzma
    from tvmrnn.tune import pass_checks
    shipped = os.path.join(os.path.dirname(os.path.dirname(__file__)), "tuning_logs", "cuda-sm_90")
    run = sorted(glob.glob(os.path.join(shipped, "*_tuning_record.json.xz")), key=os.path.getsize)[0]
    for path in (run, run.replace("_tuning_record", "_workload")):
        shutil.copy(path, tmp_path)
    first = records.cached_index(str(tmp_path))
    assert records.cached_index(str(tmp_path)) is first
    logged = sum(first.counts.values())
    assert logged > 0
    copied = os.path.join(tmp_path, os.path.basename(run))
    with lzma.open(copied) as f:
        lines = f.read().splitlines()
    with lzma.open(copied, "wb") as f:  # a run's record appended (the same size is not likely: one more line)
        f.write(b"\n".join(lines + lines[-1:]) + b"\n")
    second = records.cached_index(str(tmp_path))
    assert second is not first and sum(second.counts.values()) == logged + 1
    key = next(iter(second.records))
    record = second.fastest(key)[0][1]
    assert not second.checks.vetoed(key, record)
    pass_checks.PassChecks(str(tmp_path)).add_record(key, record, "vetoed")
    third = records.cached_index(str(tmp_path))
    assert third is not second and third.checks.vetoed(key, record)
    assert records.cached_index(str(tmp_path)) is third
    # builds read through it
    target = tvm.target.Target("nvidia/nvidia-h100")
    reads = []
    monkeypatch.setattr(records, "LogIndex", lambda folder, cls=records.LogIndex: reads.append(folder) or cls(folder))
    monkeypatch.setattr(records, "logs_folder", lambda tuning_logs, target: str(tmp_path))
    records._INDEX.clear()
    for _ in range(2):
        records.scheduler(target, tuning_logs=str(tmp_path))
    assert len(reads) == 1
