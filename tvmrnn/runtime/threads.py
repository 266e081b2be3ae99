"""CPU kernels on PyTorch's OpenMP threads: one thread pool in the process instead of two.

TVM's compiled CPU kernels start their parallel loops through ``TVMBackendParallelLaunch``, which
runs them on TVM's own thread pool. PyTorch's CPU build runs its parallel ops on libgomp's pool.
In a process that uses both (a drop-in module in a PyTorch model), each pool's threads spin for
a while after their work, on the cores that the other pool's next work needs. On the 2-core
development VM that cost a drop-in LSTM training step a quarter of its time: 67.5 ms against
54.1 ms for the same passes called alone (notes/performance.md v47).

The environment remedies (``GOMP_SPINCOUNT``, ``OMP_WAIT_POLICY``) slow PyTorch's own ops
(v25), so tvmrnn sets none of them. Instead, once PyTorch's libgomp is in the process, tvmrnn
gives TVM a launcher that runs each parallel loop as an OpenMP parallel region on that same
libgomp (``GOMP_parallel``) and meets at its barrier (``GOMP_barrier``). Both libraries then share
one set of threads, and a thread that spins after PyTorch's op picks up tvmrnn's next loop.

How: every library module that TVM loads (or JIT-compiles) finds its backend functions through
context symbols that the loader writes into it (``__TVMBackendParallelLaunch``, registered with
``TVMFFIEnvModRegisterContextSymbol``; the last registration wins). :func:`use_openmp_pool`
registers the launcher and barrier of a small C shim, compiled once with the system's C compiler
into the build cache's folder. Modules loaded before that call keep TVM's pool.

``TVMRNN_THREAD_POOL``: ``auto`` (the default: OpenMP where a libgomp is loaded, which importing
torch does), ``openmp`` (load the system's libgomp if none is), or ``tvm`` (TVM's own pool).
Where the shim cannot be made (no C compiler, no libgomp, not Linux), TVM's pool stays, with a
warning for ``openmp`` only.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings

# The launcher and the barrier, with TVM's signatures (tvm/runtime/c_backend_api.h). A team of
# OpenMP threads runs the lambda, each thread as the task of its thread number, and the task count
# the lambda sees is the team's size: TVM's kernels split their loops by that count, so a team
# smaller than asked (a call from inside another parallel region runs on one thread) is still
# correct. A lambda that fails makes the launch fail, as in TVM's pool.
_SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

static void (*gomp_parallel)(void (*)(void*), void*, unsigned, unsigned);
static void (*gomp_barrier)(void);
static int (*omp_thread_num)(void);
static int (*omp_num_threads)(void);
static int pool_threads = 1;
static long launches = 0;
static int cpus[1024];
static int n_cpus = 0;  /* 0: threads are not pinned */
static __thread int pinned_to = -1;
static volatile int forked = 0;  /* in a child forked from this process: libgomp's threads are gone */

static void after_fork_in_child(void) { forked = 1; }

/* The CPUs a team's thread k >= 1 is pinned to, as TVM's pool pins its workers (TVM_BIND_THREADS):
   the k-th of the process's allowed CPUs, the calling thread (k = 0) left free. */
int tvmrnn_pool_pin(const int* allowed, int count) {
  n_cpus = count < 1024 ? count : 1024;
  for (int i = 0; i < n_cpus; ++i) cpus[i] = allowed[i];
  return 0;
}

static void pin(int task) {
  if (n_cpus == 0 || task == 0) return;
  int cpu = cpus[task % n_cpus];
  if (pinned_to == cpu) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) == 0) pinned_to = cpu;
}

long tvmrnn_pool_launches(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }

int tvmrnn_pool_bind(void* parallel, void* barrier, void* thread_num, void* num_threads, int threads) {
  gomp_parallel = (void (*)(void (*)(void*), void*, unsigned, unsigned))parallel;
  gomp_barrier = (void (*)(void))barrier;
  omp_thread_num = (int (*)(void))thread_num;
  omp_num_threads = (int (*)(void))num_threads;
  pool_threads = threads > 0 ? threads : 1;
  return pthread_atfork(0, 0, after_fork_in_child);
}

int tvmrnn_pool_threads(int threads) {
  if (threads > 0) pool_threads = threads;
  return pool_threads;
}

typedef struct { FTVMParallelLambda lambda; void* cdata; int status; } Job;

static void run_task(void* data) {
  Job* job = (Job*)data;
  TVMParallelGroupEnv env;
  env.sync_handle = 0;
  env.num_task = omp_num_threads();
  int task = omp_thread_num();
  pin(task);
  int status = job->lambda(task, &env, job->cdata);
  if (status != 0) __atomic_store_n(&job->status, status, __ATOMIC_RELAXED);
}

int tvmrnn_parallel_launch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  Job job;
  __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
  job.lambda = lambda;
  job.cdata = cdata;
  job.status = 0;
  if (forked) {  /* libgomp would wait for its parent's threads forever: the loop runs on this thread alone */
    TVMParallelGroupEnv env;
    env.sync_handle = 0;
    env.num_task = 1;
    return lambda(0, &env, cdata) == 0 ? 0 : -1;
  }
  gomp_parallel(run_task, &job, (unsigned)(num_task > 0 ? num_task : pool_threads), 0);
  return job.status == 0 ? 0 : -1;
}

int tvmrnn_parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  (void)penv;
  if (!forked) gomp_barrier();
  return 0;
}
"""

_lock = threading.Lock()
_state: dict = {}  # "pool": "openmp" or "tvm", once decided; "shim": the loaded shim


def pool() -> str | None:
    """The pool that CPU modules loaded from now on run on: ``"openmp"`` or ``"tvm"``; None
    before the first CPU build or load decides."""
    return _state.get("pool")


def launches() -> int:
    """How many parallel loops the OpenMP launcher has run in this process (0 on TVM's pool)."""
    shim = _state.get("shim")
    if shim is None:
        return 0
    shim.tvmrnn_pool_launches.restype = ctypes.c_long
    return int(shim.tvmrnn_pool_launches())


def _setting() -> str:
    value = os.environ.get("TVMRNN_THREAD_POOL", "auto").strip().lower() or "auto"
    if value not in ("auto", "openmp", "tvm"):
        raise ValueError(f"TVMRNN_THREAD_POOL: expected 'auto', 'openmp' or 'tvm', got {value!r}")
    return value


def _loaded_libgomp() -> str | None:
    """The path of a libgomp mapped into this process (PyTorch's own copy, once torch is
    imported), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").partition("/")[2]
                if path and os.path.basename(path).startswith("libgomp"):
                    return "/" + path
    except OSError:
        pass
    return None


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    return None


def _shim_path() -> pathlib.Path:
    """The compiled shim, made once per source and machine into the build cache's folder (a
    temporary folder where that cannot be written)."""
    from .cache import cache_dir
    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
    name = f"openmp_pool-{digest}.lib"  # a shared library, named apart from the cache's entries (*/*.so)
    # (at the cache folder's top: its entries are the */*.so below it, which cache.clear() removes)
    for folder in (cache_dir(), pathlib.Path(tempfile.gettempdir()) / f"tvmrnn-{os.getuid()}"):
        path = folder / name
        if path.exists():
            return path
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        cc = _compiler()
        if cc is None:
            raise RuntimeError("no C compiler (cc, gcc or clang; or $CC) to compile the OpenMP launcher")
        with tempfile.TemporaryDirectory(dir=folder) as work:
            source = pathlib.Path(work) / "openmp_pool.c"
            source.write_text(_SOURCE)
            out = pathlib.Path(work) / name
            result = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(source)],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"{cc} could not compile the OpenMP launcher: {result.stderr.strip()[:400]}")
            os.replace(out, path)  # atomic: a concurrent process sees the whole file or none
        return path
    raise RuntimeError("no writable folder for the OpenMP launcher")


def _libtvm_ffi() -> ctypes.CDLL:
    import tvm_ffi
    folder = pathlib.Path(tvm_ffi.__file__).resolve().parent / "lib"
    for path in sorted(folder.glob("libtvm_ffi.*")):
        if "testing" not in path.name:
            return ctypes.CDLL(str(path))
    raise RuntimeError(f"libtvm_ffi not found in {folder}")


def use_openmp_pool(threads: int) -> str:
    """Decide, once per process, which pool the CPU modules loaded from now on run on (see the
    module's text), and give the OpenMP launcher ``threads`` threads for a loop that asks for
    none in particular (TVM's pool reads ``TVM_NUM_THREADS`` once, likewise). Returns the pool."""
    with _lock:
        if "pool" in _state:
            if _state["pool"] == "openmp":
                _state["shim"].tvmrnn_pool_threads(int(threads))
            return _state["pool"]
        setting = _setting()
        chosen = "tvm"
        if setting != "tvm" and sys.platform.startswith("linux"):
            gomp = _loaded_libgomp()
            if gomp is None and setting == "openmp":
                gomp = ctypes.util.find_library("gomp")
            if gomp is not None:
                try:
                    chosen = _register(gomp, threads)
                except (OSError, RuntimeError, AttributeError) as err:
                    if setting == "openmp":
                        warnings.warn(f"tvmrnn: TVMRNN_THREAD_POOL=openmp: {err}; CPU kernels stay on TVM's "
                                      "thread pool", RuntimeWarning, stacklevel=3)
            elif setting == "openmp":
                warnings.warn("tvmrnn: TVMRNN_THREAD_POOL=openmp: no libgomp found; CPU kernels stay on TVM's "
                              "thread pool", RuntimeWarning, stacklevel=3)
        _state["pool"] = chosen
        return chosen


def _register(gomp_path: str, threads: int) -> str:
    gomp = ctypes.CDLL(gomp_path)  # the instance already loaded (the loader matches the file)
    shim = ctypes.CDLL(str(_shim_path()))
    address = [ctypes.cast(getattr(gomp, name), ctypes.c_void_p)
               for name in ("GOMP_parallel", "GOMP_barrier", "omp_get_thread_num", "omp_get_num_threads")]
    if shim.tvmrnn_pool_bind(*address, ctypes.c_int(int(threads))) != 0:
        raise RuntimeError("pthread_atfork failed")
    if os.environ.get("TVM_BIND_THREADS", "1").strip() != "0" and hasattr(os, "sched_getaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        shim.tvmrnn_pool_pin((ctypes.c_int * len(allowed))(*allowed), ctypes.c_int(len(allowed)))
    ffi = _libtvm_ffi()
    ffi.TVMFFIEnvModRegisterContextSymbol.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    for symbol, function in (("__TVMBackendParallelLaunch", "tvmrnn_parallel_launch"),
                             ("__TVMBackendParallelBarrier", "tvmrnn_parallel_barrier")):
        if ffi.TVMFFIEnvModRegisterContextSymbol(symbol.encode(), ctypes.cast(getattr(shim, function),
                                                                              ctypes.c_void_p)) != 0:
            raise RuntimeError(f"TVM refused the context symbol {symbol}")
    _state["shim"] = shim
    _state["gomp"] = gomp
    return "openmp"
