"""Shared fixtures: PyTorch references in float64 and a cache of built RNNs (builds take ~1 s)."""
from __future__ import annotations

import functools
import itertools
import json
import os
import sys

import numpy as np
import pytest
import torch

import tvmrnn

# Odd sizes on purpose: nothing divides evenly into vector widths, chunks or thread blocks.
I, H, N = 13, 37, 3


def torch_module(cell, input_size, hidden_size, num_layers, bidirectional, batch_first, proj_size=0):
    kwargs = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first)
    if cell == "lstm":
        return torch.nn.LSTM(input_size, hidden_size, proj_size=proj_size, **kwargs)
    if cell == "gru":
        return torch.nn.GRU(input_size, hidden_size, **kwargs)
    return torch.nn.RNN(input_size, hidden_size, nonlinearity=cell[4:], **kwargs)


def built(cell, num_layers=1, bidirectional=False, batch_first=False, input_size=I, hidden_size=H, batch_size=N,
          target=None, allow_tf32=False, options=None, proj_size=0):
    """A build shared by every test that asks for the same one, however it names the arguments
    (``options``: a tvmrnn.BuildOptions, hashable; None and BuildOptions() are the same build)."""
    options = options if options is not None else tvmrnn.BuildOptions()
    target = json.dumps(target, sort_keys=True) if isinstance(target, dict) else target
    return _built(cell, num_layers, bidirectional, batch_first, input_size, hidden_size, batch_size, target,
                  allow_tf32, options, proj_size, os.environ.get("TVMRNN_LLVM_OPT_LEVEL"))


def _cache_clear():
    _built.cache_clear()


@functools.lru_cache(maxsize=None)
def _built(cell, num_layers, bidirectional, batch_first, input_size, hidden_size, batch_size, target, allow_tf32,
           options, proj_size=0, llvm_opt_level=None):  # (the level in the key: tests marked llvm_optimized)
    if isinstance(target, str) and target.startswith("{"):
        target = json.loads(target)
    return tvmrnn.build(cell, input_size=input_size, hidden_size=hidden_size, num_layers=num_layers,
                        bidirectional=bidirectional, batch_size=batch_size, batch_first=batch_first, target=target,
                        allow_tf32=allow_tf32, options=options, proj_size=proj_size)


built.cache_clear = _cache_clear  # for tests that patch what the arguments do not say (schedule constants)


def cli(name: str) -> list[str]:
    """The command line that runs one of tvmrnn's console commands (``tvmrnn-tune``, ...): the
    installed script beside this Python, else its module."""
    script = os.path.join(os.path.dirname(sys.executable), name)
    return [script] if os.path.exists(script) else [sys.executable, "-m", "tvmrnn.cli." + name.split("-", 1)[1]]


def cpu_has(flag: str) -> bool:
    """Whether this CPU lists ``flag`` in /proc/cpuinfo (False where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return flag in f.read().split()
    except OSError:
        return False


def rel_error(actual, expected) -> float:
    """||a - e|| / ||e||, computed in float64."""
    a = np.asarray(actual.detach().cpu() if hasattr(actual, "detach") else actual, np.float64)
    e = np.asarray(expected.detach().cpu() if hasattr(expected, "detach") else expected, np.float64)
    assert a.shape == e.shape, (a.shape, e.shape)
    assert np.all(np.isfinite(a)), "non-finite values"
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker's CPU kernels and PyTorch get their share of the cores
    (cores // workers threads), unless the user set ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``.
    Otherwise every worker's TVM pool spins as many threads as there are cores: with two workers
    on two cores the torch grid of test_rnn.py took 85 s, and 58 s with a thread a worker
    (notes/performance.md v34). Tests of threading say their thread counts themselves
    (test_determinism.py, test_errors.py), in processes of their own."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers <= 1 or "TVM_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = max(1, cores // workers)
    os.environ["TVM_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)


_share_the_cores()


# The test files by their time on a 2-core machine, slowest first (worker-seconds, v53's fresh-clone
# run on the dev VM, 3,729 in all: test_codegen 655, test_rnn 513, test_tuning 506, test_bf16 297,
# test_torch_module 248, test_cli 204, test_codegen_persistent 198, test_custom_cells 176,
# test_pass_tuning 173, test_threads 169, test_fuzz 81; the rest under 80 each). `--dist loadfile`
# hands whole files to the workers in this order, the short ones last, so that neither worker is
# left alone with a long file at the end (pytest-xdist would order the files by their number of
# tests: the 2-test test_fuzz.py and the 7-test test_threads.py would come among the last).
SLOWEST_FIRST = ("test_codegen.py", "test_rnn.py", "test_tuning.py", "test_bf16.py", "test_torch_module.py",
                 "test_cli.py", "test_codegen_persistent.py", "test_custom_cells.py", "test_pass_tuning.py",
                 "test_threads.py", "test_fuzz.py")


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist: keep the order below
        config.option.loadscopereorder = False


def pytest_addoption(parser):
    parser.addoption("--full-grid", action="store_true", default=False,
                     help="tvmrnn: every configuration of the configuration grids (tests marked slow); by default "
                          "a covering subset, every pair of settings at least once (conftest.grid)")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable: the rest keep their order)
    if not config.getoption("--full-grid"):
        skip = pytest.mark.skip(reason="beyond the pairwise grid: --full-grid runs it")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def sampled(request):
    """``sampled(items)``: every item with ``--full-grid``; by default the first two, the last and
    every third between. For tests that compile each schedule variant tuning seeds a kernel with
    (a compile each, 1-3 s): the default and a spread of the others by default, all of them in
    the full grid."""
    full = request.config.getoption("--full-grid")

    def pick(items):
        items = list(items)
        if full:
            return items
        return [items[i] for i in sorted({0, 1, len(items) - 1, *range(0, len(items), 3)}) if 0 <= i < len(items)]
    return pick


def slow(*values):
    """A ``pytest.mark.parametrize`` case marked slow: run by ``--full-grid`` only."""
    return pytest.param(*values, marks=pytest.mark.slow)


def covering_rows(axes: dict) -> list[tuple]:
    """Rows of the product of ``axes`` (name -> values) that hold every pair of values of any two
    axes at least once: greedy, deterministic, each next row the one covering most pairs not yet
    covered (for 4 cells x 2 x 2 x 2 settings, 8 rows of 32). A configuration bug that needs two
    settings together shows up in such a subset (the pairwise testing of combinatorial designs);
    one that needs three may not, which ``--full-grid`` and tests/fuzz.py's random draws are for."""
    names = list(axes)
    rows = list(itertools.product(*(axes[n] for n in names)))

    def pairs(row):  # (a single axis: each value, all of them)
        if len(row) == 1:
            return {row}
        return {(i, row[i], j, row[j]) for i, j in itertools.combinations(range(len(row)), 2)}
    left = set().union(*(pairs(r) for r in rows))
    chosen = []
    while left:
        best = max(rows, key=lambda r: len(pairs(r) & left))
        chosen.append(best)
        left -= pairs(best)
    return sorted(chosen, key=rows.index)


def grid(axes: dict, ids: dict | None = None, every: dict | None = None):
    """``pytest.mark.parametrize`` arguments for the product of ``axes`` (name -> values) times
    the product of ``every`` (values always all run, such as lengths a build serves): the rows of
    :func:`covering_rows` as they are, the others marked slow (run by ``--full-grid``). ``ids``:
    name -> a function of a value, for the test ids."""
    every = every or {}
    names = [*axes, *every]
    covered = set(covering_rows(axes))
    ids = ids or {}
    params = []
    for row in itertools.product(*axes.values()):
        for more in itertools.product(*every.values()):
            values = (*row, *more)
            label = "-".join(str(ids.get(n, lambda v: v)(v)) for n, v in zip(names, values))
            params.append(pytest.param(*values, id=label, marks=() if row in covered else pytest.mark.slow))
    return ",".join(names), params


# Tests use default schedules unless they say otherwise: the committed logs are for other machines.
os.environ["TVMRNN_TUNING_LOGS"] = "off"
# ... and build: tests patch schedule constants the cache key cannot see; the cache's own tests
# turn it on in a folder of their own (test_cache.py).
os.environ["TVMRNN_CACHE"] = "off"
# ... and compile CPU code (CPU kernels, GPU builds' host code) without LLVM's optimisations
# (TVMRNN_LLVM_OPT_LEVEL=0): builds are half the suite's time and LLVM's -O3 ~40% of a small CPU
# build; at -O0 the suite took 1,048 s instead of 1,452 on a 2-core VM (notes/performance.md v88).
# Kernels, schedules, TIR and numerics stay what they are; the code LLVM makes of them is what a
# user never runs, so the tests of whole builds against torch.nn (test_rnn.py, the fuzz), of bits
# (determinism, packages, threads) mark themselves ``llvm_optimized`` and build at LLVM's own
# level (-O3), the level users get: LLVM bugs that need its optimisations (v67's alias tags) show
# there. A level the user set is kept. (Set in pytest's hooks, not on import: a test's child
# process that imports a test module builds at the level its parent's test set.)
_QUICK_LLVM = []


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Each test's level before its fixtures build (module-scoped ones too, as its first user)."""
    if not _QUICK_LLVM:
        _QUICK_LLVM.append(os.environ.get("TVMRNN_LLVM_OPT_LEVEL", "0"))
    if item.get_closest_marker("llvm_optimized") and _QUICK_LLVM[0] == "0":
        os.environ.pop("TVMRNN_LLVM_OPT_LEVEL", None)
    else:
        os.environ["TVMRNN_LLVM_OPT_LEVEL"] = _QUICK_LLVM[0]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# TVMRNN_TEST_BUILD_LOG=FOLDER: every build and plan a test makes, a JSON line each (the test, the
# configuration and target, seconds) in FOLDER/<xdist worker>.jsonl, to find where the suite's
# time goes (notes/performance.md v87: which builds repeat within and across files)
if os.environ.get("TVMRNN_TEST_BUILD_LOG"):
    import time

    from tvmrnn.runtime import build as _build_module

    _inside = []  # a build's own planning is not logged apart

    def _logged(fn, kind):
        @functools.wraps(fn)
        def wrapper(config, target, *args, **kwargs):
            if _inside:
                return fn(config, target, *args, **kwargs)
            start = time.perf_counter()
            _inside.append(kind)
            try:
                return fn(config, target, *args, **kwargs)
            finally:
                _inside.pop()
                folder = os.environ["TVMRNN_TEST_BUILD_LOG"]
                os.makedirs(folder, exist_ok=True)
                line = dict(kind=kind, test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
                            config=repr(config), target=str(target), seconds=round(time.perf_counter() - start, 2))
                with open(os.path.join(folder, os.environ.get("PYTEST_XDIST_WORKER", "main") + ".jsonl"), "a") as f:
                    f.write(json.dumps(line) + "\n")
        return wrapper
    _build_module._compile = _logged(_build_module._compile, "build")
    _build_module._programs = _logged(_build_module._programs, "plan")



def check_half_build(cell, I, H, layers, bidirectional, dtype, target, device, bound=(1e-2, 3e-2), N=5, n=4,
                     options=None):
    """A ``dtype=`` half build takes and returns ``dtype`` tensors (the states and the input and
    state gradients too) and fp32 weight gradients; against torch.nn in float64 on the same
    half-rounded inputs and weights, its outputs are within ``bound[0]`` and its gradients within
    ``bound[1]`` (relative norms), at a batch of ``n`` rows on a build for ``N`` (``options``:
    the build's ``BuildOptions``)."""
    import torch
    T = 6
    half = getattr(torch, dtype)
    torch.manual_seed(0)
    kind = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}.get(cell)
    ref = (kind(I, H, num_layers=layers, bidirectional=bidirectional) if kind else
           torch.nn.RNN(I, H, num_layers=layers, nonlinearity=cell.split("_")[1], bidirectional=bidirectional))
    ref = ref.to(half).double()  # the reference's weights: half values, as the build packs them
    rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=layers, bidirectional=bidirectional,
                       batch_size=N, dtype=dtype, target=target, cache=False, tuning_logs=False, options=options)
    assert rnn.dtype == dtype
    assert n <= N
    w = rnn.pack_weights({k: v.float().to(device) for k, v in ref.state_dict().items()})  # fp32 master weights
    D = 2 if bidirectional else 1
    x = torch.randn(T, n, I).to(half)
    h0 = torch.randn(layers * D, n, H).to(half)
    c0 = torch.randn(layers * D, n, H).to(half) if cell == "lstm" else None
    dy = torch.randn(T, n, D * H).to(half)
    on = (lambda t: None if t is None else t.to(device))  # noqa: E731
    y, hy, cy, ws = rnn.forward_train(w, on(x), on(h0), on(c0))
    grads = rnn.backward(w, ws, on(dy))

    xr = x.double().requires_grad_()
    h0r = h0.double().requires_grad_()
    states = (h0r, c0.double().requires_grad_()) if cell == "lstm" else h0r
    yr, hr = ref(xr, states)
    hyr = hr[0] if cell == "lstm" else hr
    wanted = [xr, h0r] + ([states[1]] if cell == "lstm" else []) + list(ref.parameters())
    gr = torch.autograd.grad(yr, wanted, dy.double())

    def close(got, expected, limit, name):
        err = float((got.detach().cpu().double() - expected.detach()).norm() / expected.detach().norm())
        assert err < limit, f"{name}: relative error {err:.2e}"

    assert y.dtype == hy.dtype == half and (cy is None or cy.dtype == half)
    assert y.device.type == device
    close(y, yr, bound[0], "y")
    close(hy, hyr, bound[0], "hy")
    y_infer, hy_infer, _ = rnn.forward(w, on(x), on(h0), on(c0))  # the inference pass: its own kernels
    close(y_infer, yr, bound[0], "y (forward)")
    close(hy_infer, hyr, bound[0], "hy (forward)")
    assert grads["x"].dtype == grads["h0"].dtype == half
    close(grads["x"], gr[0], bound[1], "dx")
    close(grads["h0"], gr[1], bound[1], "dh0")
    names = [name for name, _ in ref.named_parameters()]
    for name, expected in zip(names, gr[-len(names):]):
        assert grads[name].dtype == torch.float32, name
        close(grads[name], expected, bound[1], name)
    return rnn
