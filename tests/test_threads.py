"""One CPU thread pool with PyTorch (tvmrnn/runtime/threads.py): once torch is imported, tvmrnn's
CPU kernels run their parallel loops on PyTorch's libgomp threads instead of starting TVM's pool,
with the same bits; ``TVMRNN_THREAD_POOL`` chooses, and a bad value is refused by name."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

# whole builds at LLVM's own optimisation level, as users get them (tests/conftest.py)
pytestmark = pytest.mark.llvm_optimized

TESTS = os.path.dirname(os.path.abspath(__file__))

# A fresh process (the pool is chosen once per process): a 2-layer bidirectional LSTM and GRU on 2
# threads, time loops as one parallel region each (the pool's barrier at every step), then the
# pool, the launches it ran, the threads the process holds and the digest of every output and
# gradient (test_determinism.digest)
_SCRIPT = """
import hashlib, os
import numpy as np
import torch
import tvmrnn
from tvmrnn.runtime import threads
torch.set_num_threads(2)
torch.randn(256, 256) @ torch.randn(256, 256)  # PyTorch's threads started
h = hashlib.sha256()
for cell, module in (("lstm", torch.nn.LSTM), ("gru", torch.nn.GRU)):
    torch.manual_seed(0)
    ref = module(11, 37, num_layers=2, bidirectional=True)
    rnn = tvmrnn.build(cell, 11, 37, num_layers=2, bidirectional=True, batch_size=5,
                       options=tvmrnn.BuildOptions(threads=2, time_loop_regions=True))
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((29, 5, 11)).astype(np.float32)
    dy = rng.standard_normal((29, 5, 74)).astype(np.float32)
    out = list(rnn.forward(w, x))
    y, hy, cy, ws = rnn.forward_train(w, x)
    grads = rnn.backward(w, ws, dy)
    for a in out + [y, hy, cy] + [grads[k] for k in sorted(grads)]:
        if a is not None:
            h.update(np.ascontiguousarray(a).tobytes())
    want = ref(torch.from_numpy(x))[0].detach().numpy()
    assert np.abs(out[0] - want).max() < 1e-4, cell
torch.randn(256, 256) @ torch.randn(256, 256)
print(threads.pool(), threads.launches(), len(os.listdir("/proc/self/task")), h.hexdigest())
"""


def _env(pool: str, **more) -> dict:
    """This environment without the user's OpenMP and TVM thread settings, on ``pool``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMP_", "GOMP_", "KMP_")) and k not in ("TVM_NUM_THREADS", "TVM_BIND_THREADS")}
    return dict(env, TVMRNN_THREAD_POOL=pool, TVMRNN_CACHE="off", OMP_NUM_THREADS="2", **more)


def _run(pool: str, **env):
    env = _env(pool, **env)
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=TESTS,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    pool, launches, tasks, digest = out.stdout.split()[-4:]
    return pool, int(launches), int(tasks), digest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the OpenMP launcher is built for Linux")
def test_cpu_kernels_run_on_pytorchs_openmp_threads_with_the_same_bits():
    pool, launches, tasks, digest = _run("auto")
    tvm_pool, tvm_launches, tvm_tasks, tvm_digest = _run("tvm")
    assert (pool, tvm_pool) == ("openmp", "tvm")
    assert launches > 100 and tvm_launches == 0  # every parallel loop went through the launcher
    assert digest == tvm_digest  # the same partition of the work, so the same bits
    assert tasks < tvm_tasks  # no second pool: TVM's workers were never started


def test_a_bad_pool_setting_is_refused_by_name(monkeypatch):
    from tvmrnn.runtime import threads
    monkeypatch.setenv("TVMRNN_THREAD_POOL", "gnu")
    monkeypatch.setattr(threads, "_state", {})
    with pytest.raises(ValueError, match="TVMRNN_THREAD_POOL"):
        threads.use_openmp_pool(2)


_FORK = """
import os, time
import numpy as np
import torch
import tvmrnn
from tvmrnn.runtime import threads
rnn = tvmrnn.build("gru", 16, 24, batch_size=4, options=tvmrnn.BuildOptions(threads=2, time_loop_regions=True))
params = tvmrnn.params_from_torch(torch.nn.GRU(16, 24))
w = rnn.pack_weights(params)
x = np.random.default_rng(0).standard_normal((40, 4, 16)).astype(np.float32)
want = rnn.forward(w, x)[0]
torch.randn(256, 256) @ torch.randn(256, 256)
pid = os.fork()
if pid == 0:  # a forked worker (a DataLoader's): libgomp's threads stayed in the parent
    same = np.array_equal(rnn.forward(w, x)[0], want)
    again = tvmrnn.build("gru", 16, 24, batch_size=4, options=tvmrnn.BuildOptions(threads=2, chunk_steps=(4, 1)))
    same = same and np.abs(again.forward(again.pack_weights(params), x)[0] - want).max() < 1e-5  # built here
    os._exit(0 if same else 3)
for _ in range(600):
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    status = "hung"
print(threads.pool(), status)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the OpenMP launcher is built for Linux")
def test_a_forked_child_runs_the_cpu_kernels_on_its_own_thread():
    """libgomp's threads do not survive a fork, and a parallel loop in the child would wait for them
    forever (TVM's own pool hangs there too): the launcher runs the child's loops on its one thread."""
    out = subprocess.run([sys.executable, "-c", _FORK], capture_output=True, text=True, env=_env("auto"), cwd=TESTS,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-2:] == ["openmp", "0"], out.stdout


_ERROR = """
import os
import numpy as np
import torch
import tvm, tvm_ffi
from tvm import te, s_tir
from tvmrnn.runtime import threads
assert threads.use_openmp_pool(2) == "openmp"

@tvm_ffi.register_global_func("test_threads.fail_at")
def fail_at(i):
    if i == int(os.environ["FAIL_AT"]):
        raise ValueError(f"element {i} refused")
    return 0

x = te.placeholder((8,), "float32", name="x")
y = te.compute((8,), lambda i: x[i] + tvm.tirx.call_packed("test_threads.fail_at", i).astype("float32"), name="y")
sch = s_tir.Schedule(te.create_prim_func([x, y]))
sch.parallel(sch.get_loops(sch.get_sblock("y"))[0])
f = tvm.compile(sch.mod, target="llvm")["main"]
a, b = (tvm.runtime.tensor(np.zeros(8, "float32")) for _ in range(2))
try:
    f(a, b)
    print("no error")
except ValueError as err:
    print("ValueError:", err)
f(a, b) if os.environ["FAIL_AT"] == "-1" else None
print("launches", threads.launches())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the OpenMP launcher is built for Linux")
@pytest.mark.parametrize("fail_at", [1, 5])  # on the calling thread (task 0 of 2: 0-3), on the worker (4-7)
def test_an_error_in_any_task_of_a_parallel_loop_reaches_the_caller(fail_at):
    """A task's error is kept per thread by tvm-ffi: a worker's must be moved to the calling thread
    (before, a worker's error made the caller read an empty slot, and the process crashed)."""
    out = subprocess.run([sys.executable, "-c", _ERROR], capture_output=True, text=True,
                         env=_env("openmp", FAIL_AT=str(fail_at)), cwd=TESTS, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"ValueError: element {fail_at} refused" in out.stdout, out.stdout
    assert "launches 1" in out.stdout


_LOAD = """
import sys, warnings
import numpy as np
import torch
import tvmrnn
from tvmrnn.runtime import threads
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    rnn = tvmrnn.load(sys.argv[1])
w = rnn.pack_weights(tvmrnn.params_from_torch(torch.nn.LSTM(7, 9)))
y = rnn.forward(w, np.ones((6, 3, 7), np.float32))[0]
print(threads.pool(), threads.launches() > 0, any("TVMRNN_THREAD_POOL" in str(c.message) for c in caught), y.shape)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the OpenMP launcher is built for Linux")
def test_a_loaded_package_runs_on_the_openmp_pool_and_without_a_compiler_on_tvms(tmp_path):
    """``tvmrnn.load`` chooses the pool as ``build`` does. Without a C compiler for the launcher,
    ``auto`` stays on TVM's pool quietly and ``openmp`` says so; the package runs either way."""
    import tvmrnn
    path = str(tmp_path / "lstm.so")
    tvmrnn.build("lstm", 7, 9, batch_size=3, cache=False).export(path)
    no_compiler = str(tmp_path / "bin")  # a PATH without cc, gcc or clang
    os.mkdir(no_compiler)
    for pool, env, want in (("auto", {}, ["openmp", "True", "False"]),
                            ("auto", {"PATH": no_compiler, "CC": ""}, ["tvm", "False", "False"]),
                            ("openmp", {"PATH": no_compiler, "CC": ""}, ["tvm", "False", "True"])):
        out = subprocess.run([sys.executable, "-c", _LOAD, path], capture_output=True, text=True,
                             env=_env(pool, **env), cwd=TESTS, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert out.stdout.split()[:3] == want, (pool, env, out.stdout)


def test_a_later_build_asking_for_another_thread_count_is_told_the_pools():
    """Either pool is sized once a process, by its first CPU build: a later build that asks for
    another count runs on the first's and says so (a RuntimeWarning naming both); one that asks
    for the same count, or none, says nothing."""
    script = """
import warnings
import tvmrnn
import os
def build(threads):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tvmrnn.build("gru", 3, 4, batch_size=2, options=tvmrnn.BuildOptions(threads=threads))
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
first, second = build(1), build(2)
tvm_threads = os.environ.get("TVM_NUM_THREADS")  # what TVM's pool will read at its start
print(repr([first, second, build(None), build(1), tvm_threads]))
"""
    for pool in ("tvm", "openmp"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(pool),
                             cwd=TESTS, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        first, second, unset, same, tvm_threads = eval(out.stdout.strip().splitlines()[-1])
        assert first == [] and unset == [] and same == [], (pool, first, unset, same)
        assert tvm_threads == "1"  # after the second build: the first build's count still
        assert len(second) == 1 and "threads=2" in second[0] and "at most 1 thread," in second[0], (pool, second)
