"""The on-disk build cache (tvmrnn.runtime.cache): a second build of the same RNN, in this process
or another, loads the first one's package; anything that changes the build changes the key; a
broken entry is rebuilt; processes building one entry at once build it once."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import tvmrnn
from tvmrnn.runtime import cache as build_cache
from conftest import rel_error, torch_module


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TVMRNN_CACHE", "on")
    monkeypatch.setenv("TVMRNN_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _entries(folder):
    return sorted(folder.glob("*/*.so"))


def _gru(**kwargs):
    return tvmrnn.build("gru", input_size=5, hidden_size=6, batch_size=2, **kwargs)


def test_second_build_loads_the_first(cache_dir):
    first = _gru()
    assert not first.from_cache and len(_entries(cache_dir)) == 1
    second = _gru()
    assert second.from_cache and second.package_path == str(_entries(cache_dir)[0])
    assert second.schedules == first.schedules
    torch.manual_seed(0)
    ref = torch_module("gru", 5, 6, 1, False, False)
    x = np.random.default_rng(0).standard_normal((4, 2, 5)).astype(np.float32)
    for rnn in (first, second):
        w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
        assert rel_error(rnn.forward(w, x)[0], ref(torch.from_numpy(x))[0]) < 1e-5
    second.export(cache_dir.parent / "copy.so")  # a cached build exports (a copy of its package)
    assert tvmrnn.load(cache_dir.parent / "copy.so").config == second.config


def test_what_changes_a_build_changes_the_key(cache_dir):
    _gru()
    _gru(batch_first=True)
    _gru(options=tvmrnn.BuildOptions(chunk_steps=(4, 1)))
    assert _gru().from_cache  # the first build again
    one = tvmrnn.define_cell("mine", gates=("a",), math=lambda x, h, h_prev, c_prev, p: (x[0] + h[0] + h_prev, None))
    other = tvmrnn.define_cell("mine", gates=("a",), math=lambda x, h, h_prev, c_prev, p: (x[0] - h[0] + h_prev, None))
    for cell, hit in ((one, False), (other, False), (one, True)):
        # a cell of the same name with other math (redefined in a notebook) is another build
        assert tvmrnn.build(cell, input_size=5, hidden_size=6, batch_size=2).from_cache == hit
    assert len(_entries(cache_dir)) == 5


def test_off_switches(cache_dir, monkeypatch):
    assert not _gru(cache=False).from_cache and not _entries(cache_dir)
    monkeypatch.setenv("TVMRNN_CACHE", "off")
    _gru()
    assert not _entries(cache_dir)
    with pytest.raises(TypeError, match="cache: expected None or bool"):
        _gru(cache="yes")


def test_a_corrupt_entry_is_reported_and_rebuilt(cache_dir):
    _gru()
    entry = _entries(cache_dir)[0]
    entry.write_bytes(entry.read_bytes()[:1000])  # truncated
    with pytest.warns(build_cache.CacheWarning, match="unusable"):
        again = _gru()
    assert not again.from_cache
    assert _gru().from_cache  # and the rebuilt entry serves the next build
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern in the middle: same size, other contents
    entry.write_bytes(bytes(data))
    with pytest.warns(build_cache.CacheWarning, match="do not match the digest"):
        assert not _gru().from_cache


def test_an_entry_that_cannot_be_locked_is_read_with_a_warning(cache_dir):
    """A lock file that cannot be opened (a read-only shared cache; here a folder in its place,
    which root cannot open either): the entry is read without the lock, with a CacheWarning, and a
    build with no entry yet builds (it crashed with PermissionError)."""
    _gru()
    lock = next(cache_dir.glob("*/*.lock"))
    lock.unlink()
    lock.mkdir()
    with pytest.warns(build_cache.CacheWarning, match="cannot lock"):
        assert _gru().from_cache


def test_a_fresh_process_is_ready_from_the_cache_in_under_2_s(cache_dir):
    """Two processes start together and build the same RNN: one builds, the other waits on the
    entry's lock and loads the result; a third process later loads it in under 2 s."""
    script = textwrap.dedent("""
        import json, sys, time, warnings
        warnings.simplefilter("ignore")
        import tvmrnn
        t = time.perf_counter()
        rnn = tvmrnn.build("gru", input_size=7, hidden_size=9, batch_size=3)
        print(json.dumps({"seconds": time.perf_counter() - t, "hit": rnn.from_cache}))
    """)
    env = dict(os.environ)
    run = lambda: subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)  # noqa: E731
    procs = [run(), run()]
    results = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    assert sorted(r["hit"] for r in results) == [False, True], results
    assert len(_entries(cache_dir)) == 1
    third = run()
    result = json.loads(third.communicate(timeout=600)[0].strip().splitlines()[-1])
    assert result["hit"] and result["seconds"] < 2.0, result
