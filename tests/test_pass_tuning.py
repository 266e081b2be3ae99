"""Whole-pass tuning on this CPU: record vetoes honoured by every reader of records, the checks'
verdicts under timings we choose (an injected timer), pass-level options chosen and applied."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import tvmrnn
from tvmrnn.cells.definition import CELLS
from tvmrnn.program.passes import Config
from tvmrnn.runtime import pass_tuning
from tvmrnn.tune import records, tuner
from tvmrnn.tune.pass_checks import PassCheckError, PassChecks, config_key, record_digest
from conftest import rel_error, torch_module

CONFIG = Config(CELLS["rnn_tanh"], 4, 8, 1, False, 2, False)
STEP = "recurrent_step_rnn_tanh_infer_n2_h8"
BACK = "backward_step_rnn_tanh_n2_h8"
TARGET = tvmrnn.device.host_target()


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """A tiny run's logs (MetaSchedule's own space: the step's records are the seeded default and
    searched ones), with the default's time made the slowest: the build takes a searched record."""
    root = tmp_path_factory.mktemp("pass_logs")
    tuner.tune([CONFIG], TARGET, log_dir=str(root), trials_per_task=6, kernels=[STEP, BACK], num_trials_per_iter=3,
               space="generic", out=lambda line: None)
    folder = os.path.join(root, records.target_key(TARGET))
    seeded = [records.seeded_traces(_kernel(name), TARGET) for name in (STEP, BACK)]
    for path in os.listdir(folder):
        if path.endswith("_tuning_record.json"):
            lines = [json.loads(line) for line in open(os.path.join(folder, path)) if line.strip()]
            for _, record in lines:
                if any(records.record_origin(record, traces) == "default" for traces in seeded):
                    record[1] = [1.0]
            with open(os.path.join(folder, path), "w") as f:
                f.writelines(json.dumps(line) + "\n" for line in lines)
    return str(root), folder


def _kernel(name=STEP):
    from tvmrnn.tune.tasks import extract_tasks
    return next(t.kernel for t in extract_tasks([CONFIG], target=TARGET) if t.kernel.name == name)


def _copy(logs, tmp_path):
    import shutil
    root = tmp_path / "logs"
    shutil.copytree(logs[0], root)
    return str(root), os.path.join(root, records.target_key(TARGET))


def _build(root, **kwargs):
    kwargs.setdefault("cache", False)
    return tvmrnn.build("rnn_tanh", 4, 8, batch_size=2, target=TARGET, tuning_logs=root, **kwargs)


def _origin(rnn) -> str:
    taken = rnn.records.get(STEP)
    return "default" if taken is None else records.record_origin(taken["record"], records.seeded_traces(_kernel(), TARGET))


def test_a_vetoed_record_is_skipped_by_build_distill_and_list(logs, tmp_path, monkeypatch, rng):
    root, folder = _copy(logs, tmp_path)
    key = records.workload_key(_kernel())
    index = records.LogIndex(folder)
    ranked = index.fastest(key)
    # (the tiny run's confirm_best may have vetoed records of its own, as timing had it)
    logged = len(index.fastest(key, vetoed=True))
    assert len(ranked) >= 3 and records.record_origin(ranked[0][1], records.seeded_traces(_kernel(), TARGET)) != "default"
    monkeypatch.setenv("TVMRNN_CACHE_DIR", str(tmp_path / "cache"))
    first = _build(root, cache=True)
    assert record_digest(first.records[STEP]["record"]) == record_digest(ranked[0][1])

    PassChecks(folder).add_record(key, ranked[0][1], "vetoed")
    index = records.LogIndex(folder)
    assert [r for _, r, _ in index.fastest(key)] == [r for _, r, _ in ranked[1:]]
    assert len(index.fastest(key, vetoed=True)) == logged  # the record stays in the logs
    second = _build(root, cache=True)  # not the cached build: the verdicts are part of its key
    assert not second.from_cache
    assert record_digest(second.records[STEP]["record"]) == record_digest(ranked[1][1])
    out = tmp_path / "distilled.jsonl"
    records.distill(folder, TARGET, str(out), [_kernel()], keep=100)
    kept = records.RecordDatabase(str(out)).entries[key]["records"]
    assert record_digest(ranked[0][1]) not in {record_digest(r["record"]) for r in kept}
    # a shipped record is vetoed too (the same digest): the distilled file alone serves the build
    PassChecks(folder).add_record(key, ranked[1][1], "vetoed")
    monkeypatch.setattr(records, "records_file", lambda target, records_dir=None: str(out))
    third = _build(root)
    assert record_digest(third.records[STEP]["record"]) not in {record_digest(ranked[0][1]), record_digest(ranked[1][1])}
    # the outputs are still right
    module = torch_module("rnn_tanh", 4, 8, 1, False, False).double()
    x = rng.standard_normal((5, 2, 4)).astype(np.float32)
    y, _, _ = third.forward(third.pack_weights(tvmrnn.params_from_torch(module)), x)
    assert rel_error(y, module(torch.from_numpy(x).double())[0]) < 1e-4
    # a later "kept" verdict lifts a veto
    PassChecks(folder).add_record(key, ranked[0][1], "kept")
    assert records.LogIndex(folder).fastest(key)[0][1] == ranked[0][1]


class FakeTimer:
    """Pass times we choose, from what the build took: ``slow`` when ``slow(rnn)``, else 1."""

    def __init__(self, slow=lambda rnn: False, factor=1.1):
        self.slow, self.factor, self.calls = slow, factor, 0

    def __call__(self, rnn, kind):
        self.calls += 1
        return self.factor if self.slow(rnn) else 1.0


def test_records_that_slow_the_pass_are_vetoed_one_after_another(logs, tmp_path):
    root, folder = _copy(logs, tmp_path)
    timer = FakeTimer(slow=lambda rnn: _origin(rnn) != "default")  # every searched record slows the pass
    lines = []
    written = pass_tuning.check_records(CONFIG, TARGET, root, timer, pairs=3, max_per_kernel=20, out=lines.append,
                                        kernels=[STEP])
    assert written and all(v["verdict"] == "vetoed" and v["kernel"] == STEP for v in written)
    assert all(v["where"].startswith(folder) for v in written)  # the real log file, not the mirror
    assert _origin(_build(root)) == "default"  # every searched record vetoed: the default is taken
    # a rerun measures nothing again
    again = FakeTimer()
    assert pass_tuning.check_records(CONFIG, TARGET, root, again, pairs=3, kernels=[STEP]) == [] and again.calls == 0


def test_a_kernel_whose_records_keep_slowing_the_pass_gets_its_default(logs, tmp_path):
    """After ``max_per_kernel`` vetoes in a row, the kernel's other logged records are vetoed with
    them: the build takes its default schedule rather than the next record, unchecked (v53: a
    search had logged a dozen records of one kind, all slower in the pass than the default)."""
    root, folder = _copy(logs, tmp_path)
    timer = FakeTimer(slow=lambda rnn: _origin(rnn) != "default")
    lines = []
    written = pass_tuning.check_records(CONFIG, TARGET, root, timer, pairs=3, max_per_kernel=1, out=lines.append,
                                        kernels=[STEP])
    assert len(written) > 1 and all(v["verdict"] == "vetoed" for v in written), written
    assert "*" not in {v["record"] for v in written}  # by digest: a later search's records are still checked
    assert any("other logged records vetoed with them" in line for line in lines), lines
    assert _origin(_build(root)) == "default"


def test_records_that_do_not_slow_the_pass_are_kept(logs, tmp_path):
    root, folder = _copy(logs, tmp_path)
    before = _build(root).records[STEP]["record"]
    # two kernels to check: their builds on their defaults made at once first, then loaded
    loaded, lines = set(), []
    timer = FakeTimer(slow=lambda rnn: rnn.from_cache and loaded.add(id(rnn)) and False)
    written = pass_tuning.check_records(CONFIG, TARGET, root, timer, pairs=3, out=lines.append, processes=2)
    assert sorted((v["kernel"], v["verdict"]) for v in written) == [(BACK, "kept"), (STEP, "kept")]
    assert any("2 builds, 2 at once" in line for line in lines), lines  # the train step shares STEP's workload
    assert len(loaded) == 2
    assert _build(root).records[STEP]["record"] == before
    # within the threshold (1%) a record stays: it was faster alone
    root2, _ = _copy(logs, tmp_path / "b")
    timer = FakeTimer(slow=lambda rnn: _origin(rnn) != "default", factor=1.005)
    assert [v["verdict"] for v in pass_tuning.check_records(CONFIG, TARGET, root2, timer, pairs=3, kernels=[STEP],
                                                            out=lambda line: None)] == ["kept"]


def test_options_measured_faster_are_recorded_and_build_applies_them(tmp_path, monkeypatch):
    root = str(tmp_path / "logs")
    timer = FakeTimer(slow=lambda rnn: rnn.config.options.chunk_steps != (8, 1), factor=1.3)
    verdict = pass_tuning.tune_options(CONFIG, TARGET, root, timer, pairs=3, out=lambda line: None,
                                       candidates=[("interleave_projections", False), ("chunk_steps", (8, 1))])
    assert verdict["options"] == {"chunk_steps": [8, 1]}
    assert [t["verdict"] for t in verdict["tried"]] == ["same", "faster"]
    assert _build(root).config.options.chunk_steps == (8, 1)
    monkeypatch.setenv("TVMRNN_CACHE_DIR", str(tmp_path / "cache"))
    assert _build(root, cache=True).config.options.chunk_steps == (8, 1)
    assert _build(root, cache=True).from_cache
    # options that set a pass-level choice, or another configuration: as given
    assert _build(root, options=tvmrnn.BuildOptions(weight_panels=False)).config.options.chunk_steps is None
    other = tvmrnn.plan("rnn_tanh", 4, 8, batch_size=3, target=TARGET, tuning_logs=root)
    assert other.config.options.chunk_steps is None
    assert _build(False).config.options.chunk_steps is None  # records off: no verdicts either
    # nothing faster: the defaults are kept, and said so
    verdict = pass_tuning.tune_options(CONFIG, TARGET, str(tmp_path / "l2"), FakeTimer(), pairs=3,
                                       out=lambda line: None, candidates=[("chunk_steps", (8, 1))])
    assert verdict["options"] == {} and verdict["tried"][0]["verdict"] == "same"
    # distilled, the verdict travels in the shipped records file's header: a build with no log
    # folder (a wheel's) applies it
    shipped = tmp_path / "shipped.jsonl"
    records.distill(os.path.join(root, records.target_key(TARGET)), TARGET, str(shipped))
    assert records.RecordDatabase(str(shipped)).header["pass_options"]
    monkeypatch.setattr(records, "records_file", lambda target, records_dir=None: str(shipped))
    (tmp_path / "no_logs").mkdir()  # (a folder that does not exist is refused: a typo)
    assert _build(str(tmp_path / "no_logs")).config.options.chunk_steps == (8, 1)
    # tuning again measures from the target's defaults, not from the shipped options
    seen = []
    timer = FakeTimer(slow=lambda rnn: seen.append(rnn.config.options.chunk_steps) or False)
    verdict = pass_tuning.tune_options(CONFIG, TARGET, str(tmp_path / "l3"), timer, pairs=3,
                                       out=lambda line: None, candidates=[("chunk_steps", (32, 1))])
    assert seen[0] is None and (32, 1) in seen and (8, 1) not in seen


def test_time_loops_as_one_region_are_a_tuned_option(tmp_path, rng):
    """``time_loop_regions`` is a pass-level option that tuning measures (v73; on by default on
    CPUs since v74): a region a step is chosen where the passes are faster with it, applied by
    build, with the same bits as the default build (its time loops one parallel region each, the
    kernels' tiles called from them); verdicts written before it was tuned keep their keys (it
    stays in them as it was, false)."""
    root = str(tmp_path / "logs")
    timer = FakeTimer(slow=lambda rnn: rnn.config.options.time_loop_regions is not False, factor=1.3)
    verdict = pass_tuning.tune_options(CONFIG, TARGET, root, timer, pairs=3, out=lambda line: None,
                                       candidates=[("time_loop_regions", False)])
    assert verdict["options"] == {"time_loop_regions": False}
    tuned, plain = _build(root), _build(False)
    assert tuned.config.options.time_loop_regions is False and plain.config.options.time_loop_regions is None
    regions = plain.programs["forward"].build().script()
    assert regions.count("pragma_parallel_launch_point") >= 1
    assert regions.count("for tile in T.parallel") == regions.count("pragma_parallel_barrier_when_finish")
    assert "pragma_parallel_launch_point" not in tuned.programs["forward"].build().script()
    x = rng.standard_normal((7, 2, 4)).astype(np.float32)
    params = tvmrnn.params_from_torch(torch_module("rnn_tanh", 4, 8, 1, False, False))
    assert np.array_equal(tuned.forward(tuned.pack_weights(params), x)[0], plain.forward(plain.pack_weights(params), x)[0])
    assert '"time_loop_regions":false' in config_key(CONFIG)


def test_option_candidates_are_built_at_once_before_they_are_timed(tmp_path, monkeypatch):
    """With build processes, the defaults and every candidate are built first, in parallel, into
    a cache of the stage's own: the builds timed are loaded from it, the user's cache untouched."""
    monkeypatch.setenv("TVMRNN_CACHE_DIR", str(tmp_path / "user_cache"))
    seen = []
    timer = FakeTimer(slow=lambda rnn: seen.append((rnn.from_cache, rnn.config.options.chunk_steps)) or
                      rnn.config.options.chunk_steps != (8, 1))
    lines = []
    verdict = pass_tuning.tune_options(CONFIG, TARGET, str(tmp_path / "logs"), timer, pairs=3, out=lines.append,
                                       candidates=[("weight_panels", False), ("chunk_steps", (8, 1))], processes=2)
    assert any("3 builds, 2 at once" in line for line in lines), lines
    assert {steps for _, steps in seen} == {None, (8, 1)} and all(hit for hit, _ in seen)
    assert verdict["options"] == {"chunk_steps": [8, 1]}
    assert not (tmp_path / "user_cache").exists() and os.environ["TVMRNN_CACHE_DIR"] == str(tmp_path / "user_cache")


def test_options_that_do_not_hold_against_the_defaults_are_not_kept(tmp_path):
    """The changes kept one by one are compared together against the defaults once more: a
    change that looked faster once (here: the defaults slow only during the first comparison,
    28 timer calls at 3 pairs) is not written as the configuration's options."""
    timer = FakeTimer()
    timer.slow = lambda rnn: timer.calls <= 28 and rnn.config.options.chunk_steps != (8, 1)
    lines = []
    verdict = pass_tuning.tune_options(CONFIG, TARGET, str(tmp_path), timer, pairs=3, out=lines.append,
                                       candidates=[("chunk_steps", (8, 1))])
    assert verdict["tried"][0]["verdict"] == "faster" and verdict["confirmed"]["verdict"] == "same"
    assert verdict["options"] == {} and "not confirmed" in lines[-1]
    assert _build(str(tmp_path)).config.options.chunk_steps is None


def test_options_that_leave_the_build_slower_than_no_tuning_are_retracted(tmp_path, monkeypatch):
    """The last comparison of ``tune_passes`` (as built against no records and default options)
    has a say: options chosen that leave the build slower are retracted, the defaults written,
    and the build compared again (v53: ``weight_panels=False`` chosen around a slow searched
    record, 2x slower in all, stood before)."""
    root = str(tmp_path / "logs")
    timer = FakeTimer(slow=lambda rnn: rnn.config.options.chunk_steps != (8, 1), factor=1.3)
    real = pass_tuning.tuned_gain

    def turned(*args, **kwargs):  # from here on the chosen options are the slow ones
        timer.slow = lambda rnn: rnn.config.options.chunk_steps == (8, 1)
        return real(*args, **kwargs)
    monkeypatch.setattr(pass_tuning, "tuned_gain", turned)
    lines = []
    gains = pass_tuning.tune_passes([CONFIG], TARGET, root, timer, pairs=3, out=lines.append,
                                    candidates=[("chunk_steps", (8, 1))])
    assert any("retracted" in line for line in lines), lines
    assert [g.verdict for g in gains] == ["same"]
    verdict = PassChecks(os.path.join(root, records.target_key(TARGET))).options_for(config_key(CONFIG))
    assert verdict["options"] == {} and verdict["retracted"] == {"chunk_steps": [8, 1]}
    assert _build(root).config.options.chunk_steps is None


def test_a_retraction_that_does_not_help_is_undone(tmp_path, monkeypatch):
    """A retraction stands only if the build without the options is no slower than with them:
    here the options are slower against no tuning but faster than the retracted build (the timer
    turns twice), so they are written back and ``build`` applies them."""
    root = str(tmp_path / "logs")
    timer = FakeTimer(slow=lambda rnn: rnn.config.options.chunk_steps != (8, 1), factor=1.3)
    real_gain, real_with = pass_tuning.tuned_gain, pass_tuning._build_with

    def turned(*args, **kwargs):  # the first comparison with no tuning: the chosen options slow
        if not hasattr(timer, "turned"):
            timer.turned, timer.slow = True, lambda rnn: rnn.config.options.chunk_steps == (8, 1)
        return real_gain(*args, **kwargs)

    def turned_back(*args, **kwargs):  # ... and against the retracted build, they are faster
        timer.slow = lambda rnn: rnn.config.options.chunk_steps != (8, 1)
        return real_with(*args, **kwargs)
    monkeypatch.setattr(pass_tuning, "tuned_gain", turned)
    monkeypatch.setattr(pass_tuning, "_build_with", turned_back)
    lines = []
    pass_tuning.tune_passes([CONFIG], TARGET, root, timer, pairs=3, out=lines.append,
                            candidates=[("chunk_steps", (8, 1))])
    assert any("retracted" in line for line in lines) and any("restored" in line for line in lines), lines
    verdict = PassChecks(os.path.join(root, records.target_key(TARGET))).options_for(config_key(CONFIG))
    assert verdict["options"] == {"chunk_steps": [8, 1]} and verdict["restored"]
    assert _build(root).config.options.chunk_steps == (8, 1)


def test_records_are_first_checked_in_the_default_options(logs, tmp_path, monkeypatch):
    """``tune_passes`` checks the records before it tunes the options, in the options that
    ``tune_options`` measures from (the target's defaults), not in an earlier run's choice."""
    root, folder = _copy(logs, tmp_path)
    PassChecks(folder).add_options(config_key(CONFIG), {"chunk_steps": [8, 1]})
    assert _build(root).config.options.chunk_steps == (8, 1)  # (what build takes now)
    seen = []
    timer = FakeTimer(slow=lambda rnn: seen.append(rnn.config.options.chunk_steps) or False)

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop
    monkeypatch.setattr(pass_tuning, "tune_options", stop)
    lines = []
    with pytest.raises(Stop):
        pass_tuning.tune_passes([CONFIG], TARGET, root, timer, pairs=3, out=lines.append)
    assert any("with it -> on its default" in line for line in lines), lines  # a record was checked
    assert seen and set(seen) == {None}, set(seen)


def test_the_real_pass_timer_compares_two_builds():
    a = tvmrnn.build("rnn_tanh", 4, 8, batch_size=2, target=TARGET, tuning_logs=False, cache=False)
    b = tvmrnn.build("rnn_tanh", 4, 8, batch_size=2, target=TARGET, tuning_logs=False, cache=False,
                     options=tvmrnn.BuildOptions(chunk_steps=(8, 1)))
    result = pass_tuning.compare(a, b, pass_tuning.PassTimer(T=20), pairs=3)
    assert set(result.passes) == {"inference", "training"}
    assert all(p["incumbent_ms"] > 0 and p["candidate_ms"] > 0 for p in result.passes.values())
    assert result.pairs == 3 and 0.2 < result.ratio < 5


def _comparison(inference, training, min_effect=pass_tuning.RECORD_EFFECT):
    """A comparison from (median ratio, standard error) per pass kind."""
    passes = {kind: {"incumbent_ms": 1.0, "candidate_ms": ratio, "ratio": ratio, "error": error}
              for kind, (ratio, error) in (("inference", inference), ("training", training))}
    return pass_tuning.Comparison(passes, pairs=15, min_effect=min_effect)


def test_verdicts_weigh_each_pass_kind_against_its_noise():
    # a kind counts past 1% (min_effect) and twice its standard error
    assert _comparison((0.97, 0.005), (1.0, 0.005)).verdict == "faster"  # training unchanged
    assert _comparison((0.97, 0.02), (1.0, 0.005)).verdict == "same"  # 3% but within 2 x 2% noise
    assert _comparison((1.0, 0.0), (1.005, 0.0)).verdict == "same"  # under 1%
    assert _comparison((1.0, 0.0), (1.005, 0.0), min_effect=0.002).verdict == "slower"
    assert _comparison((1.0, 0.0), (1.015, 0.0), min_effect=pass_tuning.OPTION_EFFECT).verdict == "same"
    # one kind faster, the other slower: the geometric mean decides, against the pooled noise
    assert _comparison((0.90, 0.0), (1.05, 0.0)).verdict == "faster"  # sqrt(0.945) = 0.972
    assert _comparison((0.95, 0.0), (1.08, 0.0)).verdict == "slower"  # 1.013
    assert _comparison((0.95, 0.01), (1.06, 0.01)).verdict == "same"  # 1.0036, threshold 0.014
    assert abs(_comparison((0.81, 0.0), (1.0, 0.0)).ratio - 0.9) < 1e-12
    # a kind worse than 1% but within its noise is no free pass for the other: the mean decides
    assert _comparison((0.90, 0.0), (1.23, 0.17)).verdict == "same"  # mean 1.052, threshold 0.17: not faster
    assert _comparison((0.90, 0.0), (1.005, 0.17)).verdict == "faster"  # within 1%: the same


def test_compress_keeps_the_verdicts_readable(logs, tmp_path):
    """``tvmrnn-tune --compress`` compresses the runs' files, never ``pass_checks.json``."""
    from tvmrnn.cli.tune import compress
    root, folder = _copy(logs, tmp_path)
    key = records.workload_key(_kernel())
    first = records.LogIndex(folder).fastest(key)[0][1]
    PassChecks(folder).add_record(key, first, "vetoed")
    compress(folder)
    assert os.path.exists(os.path.join(folder, "pass_checks.json"))
    assert not [n for n in os.listdir(folder) if n.endswith("_tuning_record.json")]
    assert records.LogIndex(folder).fastest(key)[0][1] != first  # the veto still holds


def test_a_damaged_verdicts_file_names_itself(tmp_path):
    folder = tmp_path / records.target_key(TARGET)
    folder.mkdir()
    (folder / "pass_checks.json").write_text("{not json")
    with pytest.raises(PassCheckError, match="pass_checks.json: not readable as JSON"):
        _build(str(tmp_path))
    (folder / "pass_checks.json").write_text('{"format": "tvmrnn-pass-checks", "version": 99}')
    with pytest.raises(PassCheckError, match="version 99"):
        _build(str(tmp_path))


def test_option_candidates_follow_the_target_and_configuration():
    h100 = tvmrnn.device.resolve("nvidia/nvidia-h100")
    gpu = pass_tuning.option_candidates(Config(CELLS["lstm"], 96, 96, 1, False, 1, False), h100)
    # around the target's own block count for few rows: 1 at H = 96 (its weights fit a block), 64 at 512
    assert ("persistent", "off") in gpu and {v for n, v in gpu if n == "persistent_blocks"} == {2, 132}
    assert ("chunk_steps", (256, 128, 64, 32, 4, 1)) in gpu  # the other GPU ladder than the batch's default
    assert ("chunk_steps", (256, 32, 4, 1)) in gpu  # and, for few rows, the ladder without 16- and 8-step chunks
    wide = pass_tuning.option_candidates(Config(CELLS["lstm"], 512, 512, 1, False, 1, False), h100)
    assert {v for n, v in wide if n == "persistent_blocks"} == {32, 128, 132}
    assert ("row_groups", False) in gpu  # (its weights fit a block: row groups by default)
    assert ("row_groups", False) not in wide  # (1 MB: no block holds them)
    many_rows = pass_tuning.option_candidates(Config(CELLS["lstm"], 96, 96, 1, True, 64, False), h100)
    # 64 rows: 64 blocks for the two directions (a block per 4 units), and half, twice, one a SM
    assert {v for n, v in many_rows if n == "persistent_blocks"} == {32, 128, 132}
    more_rows = pass_tuning.option_candidates(Config(CELLS["lstm"], 96, 96, 1, True, 128, False), h100)
    assert not any(name in ("persistent_blocks", "row_groups") for name, _ in more_rows)
    assert ("stack_directions", False) in many_rows  # GPUs stack both directions by default
    assert ("chunk_steps", (256, 32, 16, 8, 4, 1)) in many_rows  # (64 rows: 128- and 64-step chunks by default)
    assert ("chunk_steps", (256, 32, 4, 1)) not in many_rows
    assert not any(name == "layer_wavefront" for name, _ in gpu + many_rows)  # 1 layer; bidirectional
    stack = pass_tuning.option_candidates(Config(CELLS["gru"], 126, 126, 3, False, 32, False), h100)
    # the inference forward a wavefront by default: tried without, and with the training passes too
    assert ("layer_wavefront", False) in stack and ("layer_wavefront", True) in stack
    big = pass_tuning.option_candidates(Config(CELLS["lstm"], 512, 512, 2, False, 64, False), h100)
    assert not any(name == "layer_wavefront" for name, _ in big)  # a step that fills the GPU alone
    cpu = pass_tuning.option_candidates(CONFIG, TARGET)
    assert {name for name, _ in cpu} == {"interleave_projections", "weight_panels", "gradient_panels", "chunk_steps",
                                         "time_loop_regions"}
