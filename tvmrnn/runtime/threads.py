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
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings

from ..options import cpu_threads, use_cpu_threads

# The launcher and the barrier, with TVM's signatures (tvm/runtime/c_backend_api.h). A team of
# OpenMP threads runs the lambda, each thread as the task of its thread number, and the task count
# the lambda sees is the team's size: TVM's kernels split their loops by that count, so a team
# smaller than asked (a call from inside another parallel region runs on one thread) is still
# correct. The team is at most PyTorch's thread count (``omp_get_max_threads``:
# ``torch.set_num_threads`` sets it), and a team of one runs on the calling thread without libgomp.
# A task that fails makes the launch fail with its error: a worker's error is moved from its
# thread's slot to the calling thread's (tvm-ffi keeps the raised error per thread).
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
static int (*omp_max_threads)(void);
static void (*error_move_from_raised)(void**);
static void (*error_set_raised)(void*);
static void (*error_set_raised_from_cstr)(const char*, const char*);
static int (*object_dec_ref)(void*);
static int pool_threads = 1;
static long launches = 0;
static int cpus[1024];
static int n_cpus = 0;  /* 0: threads are not pinned */
static __thread int pinned_to = -1;
static __thread int alone = 0;  /* this thread runs a loop by itself: its barriers are no-ops */
static volatile int forked = 0;  /* in a child forked from this process: libgomp's threads are gone */

static void after_fork_in_child(void) { forked = 1; }

long tvmrnn_pool_launches(void) { return __atomic_load_n(&launches, __ATOMIC_RELAXED); }

int tvmrnn_pool_bind(void* parallel, void* barrier, void* thread_num, void* num_threads, void* max_threads,
                     int threads, int in_child) {
  gomp_parallel = (void (*)(void (*)(void*), void*, unsigned, unsigned))parallel;
  gomp_barrier = (void (*)(void))barrier;
  omp_thread_num = (int (*)(void))thread_num;
  omp_num_threads = (int (*)(void))num_threads;
  omp_max_threads = (int (*)(void))max_threads;
  pool_threads = threads > 0 ? threads : 1;
  forked = in_child;
  return pthread_atfork(0, 0, after_fork_in_child);
}

int tvmrnn_pool_bind_errors(void* move_from_raised, void* set_raised, void* set_raised_from_cstr, void* dec_ref) {
  error_move_from_raised = (void (*)(void**))move_from_raised;
  error_set_raised = (void (*)(void*))set_raised;
  error_set_raised_from_cstr = (void (*)(const char*, const char*))set_raised_from_cstr;
  object_dec_ref = (int (*)(void*))dec_ref;
  return 0;
}

/* The CPUs a team's thread k >= 1 is pinned to, as TVM's pool pins its workers (TVM_BIND_THREADS):
   the k-th of the process's allowed CPUs, the calling thread (k = 0) left free; only for teams
   no larger than the CPUs. A failed pin is not tried again. */
int tvmrnn_pool_pin(const int* allowed, int count) {
  n_cpus = count < 1024 ? count : 1024;
  for (int i = 0; i < n_cpus; ++i) cpus[i] = allowed[i];
  return 0;
}

static void pin(int task, int team) {
  if (n_cpus == 0 || task == 0 || team > n_cpus) return;
  int cpu = cpus[task];
  if (pinned_to == cpu) return;
  pinned_to = cpu;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

typedef struct { FTVMParallelLambda lambda; void* cdata; int status; int caller_failed; void* error; } Job;

static void run_task(void* data) {
  Job* job = (Job*)data;
  TVMParallelGroupEnv env;
  env.sync_handle = 0;
  env.num_task = omp_num_threads();
  int task = omp_thread_num();
  pin(task, env.num_task);
  int status = job->lambda(task, &env, job->cdata);
  if (status == 0) return;
  __atomic_store_n(&job->status, status, __ATOMIC_RELAXED);
  if (task == 0) {
    job->caller_failed = 1;  /* its error is already in the calling thread's slot */
    return;
  }
  void* error = 0;
  if (error_move_from_raised) error_move_from_raised(&error);
  void* none = 0;
  if (error && !__atomic_compare_exchange_n(&job->error, &none, error, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    object_dec_ref(error);  /* another worker's error is kept */
}

int tvmrnn_parallel_launch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
  int team = num_task > 0 ? num_task : pool_threads;
  if (!forked && omp_max_threads) {
    int most = omp_max_threads();
    if (most < team) team = most;
  }
  if (forked || team <= 1) {  /* a forked child (libgomp would wait for its parent's threads), or one thread */
    TVMParallelGroupEnv env;
    env.sync_handle = 0;
    env.num_task = 1;
    int outer = alone;
    alone = 1;
    int status = lambda(0, &env, cdata);
    alone = outer;
    return status == 0 ? 0 : -1;
  }
  Job job;
  job.lambda = lambda;
  job.cdata = cdata;
  job.status = 0;
  job.caller_failed = 0;
  job.error = 0;
  gomp_parallel(run_task, &job, (unsigned)team, 0);
  if (job.status == 0) return 0;
  if (!job.caller_failed) {
    if (job.error && error_set_raised) error_set_raised(job.error);
    else if (error_set_raised_from_cstr) error_set_raised_from_cstr("RuntimeError", "a parallel task failed");
  }
  if (job.error) object_dec_ref(job.error);
  return -1;
}

int tvmrnn_parallel_barrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  (void)penv;
  if (!forked && !alone) gomp_barrier();
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
    return 0 if shim is None else int(shim.tvmrnn_pool_launches())


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
        if name and (found := shutil.which(name)):
            return found
    return None


def _compile(cc: str | None, folder: pathlib.Path, name: str) -> pathlib.Path:
    """Compile the shim into ``folder/name``, renamed into place whole (several processes may
    compile it at once: each sees a whole file or none)."""
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
        os.replace(out, folder / name)
    return folder / name


def _load_shim() -> ctypes.CDLL:
    """The compiled shim, loaded. It is compiled once per source, machine and compiler into the
    build cache's folder, at its top (the cache's entries are the ``*/*.so`` below it); with the
    cache off, or where its folder cannot be written or its file does not load, into a private
    temporary folder of this process (removed once loaded: the mapping stays)."""
    from .cache import cache_dir, cache_off
    cc = _compiler()
    key = "\0".join([_SOURCE, platform.machine(), cc or ""])
    name = f"openmp_pool-{hashlib.sha256(key.encode()).hexdigest()[:16]}.lib"  # not *.so: not an entry
    if not cache_off():
        path = cache_dir() / name
        try:
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                _compile(cc, path.parent, name)
            return ctypes.CDLL(str(path))
        except OSError:
            pass  # a read-only cache folder, or a file that does not load here: compile privately
    private = tempfile.mkdtemp(prefix="tvmrnn-openmp-")  # mode 0700, a fresh name
    try:
        return ctypes.CDLL(str(_compile(cc, pathlib.Path(private), name)))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _libtvm_ffi() -> ctypes.CDLL:
    import tvm_ffi
    folder = pathlib.Path(tvm_ffi.__file__).resolve().parent / "lib"
    for path in sorted(folder.glob("libtvm_ffi.*")):
        if "testing" not in path.name:
            return ctypes.CDLL(str(path))
    raise RuntimeError(f"libtvm_ffi not found in {folder}")


def _forked_child() -> None:
    _state["forked"] = True


if hasattr(os, "register_at_fork"):  # a child forked before the pool is chosen must not wait on libgomp
    os.register_at_fork(after_in_child=_forked_child)


def prepare_cpu_threads(options) -> str:
    """What every CPU build and package load does before it loads a module: the first time in a
    process, TVM's pool sized (:func:`tvmrnn.options.use_cpu_threads`) and the pool chosen
    (:func:`use_openmp_pool`) for :func:`tvmrnn.options.cpu_threads` threads; later, the same
    pool and count. Returns the pool."""
    with _lock:
        first = _state.get("threads")
        if first is None:
            use_cpu_threads(options)
            first = _state["threads"] = cpu_threads(options)
    if options.threads is not None and options.threads != first:
        # either pool is sized once a process (TVM's reads TVM_NUM_THREADS at its first loop, which
        # a later build no longer changes; the OpenMP launcher keeps the count it was registered
        # with): say so rather than run silently on another count than the one asked for
        counted = f"{first} thread{'s' if first != 1 else ''}"
        warnings.warn(f"tvmrnn: BuildOptions(threads={options.threads}): this process's CPU kernels run with "
                      f"at most {counted}, the count of its first CPU build (the thread pool is sized once a "
                      "process); give the first build the count, or set TVM_NUM_THREADS before it",
                      RuntimeWarning, stacklevel=3)
    return use_openmp_pool(first)


def use_openmp_pool(threads: int) -> str:
    """Decide, once per process, which pool the CPU modules loaded from now on run on (see the
    module's text); the OpenMP launcher gives a loop ``threads`` threads, at most PyTorch's
    count (TVM's pool reads ``TVM_NUM_THREADS`` once, likewise; the first build's count is kept).
    Returns the pool."""
    with _lock:
        if "pool" in _state:
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


def _pins() -> list[int]:
    """The CPUs to pin team threads to (see the shim), or none: as TVM's pool, unless
    ``TVM_BIND_THREADS`` is set to other than 1, or ``OMP_PROC_BIND`` asks libgomp to bind."""
    if os.environ.get("TVM_BIND_THREADS", "1").strip() != "1" or os.environ.get("OMP_PROC_BIND", "").strip():
        return []
    if not hasattr(os, "sched_getaffinity"):
        return []
    return [c for c in sorted(os.sched_getaffinity(0)) if c < 1024]  # cpu_set_t holds 1024


def _register(gomp_path: str, threads: int) -> str:
    gomp = ctypes.CDLL(gomp_path)  # the instance already loaded (the loader matches the file)
    ffi = _libtvm_ffi()
    shim = _load_shim()
    shim.tvmrnn_pool_launches.restype = ctypes.c_long
    address = [ctypes.cast(getattr(gomp, name), ctypes.c_void_p) for name in
               ("GOMP_parallel", "GOMP_barrier", "omp_get_thread_num", "omp_get_num_threads", "omp_get_max_threads")]
    errors = [ctypes.cast(getattr(ffi, name), ctypes.c_void_p) for name in
              ("TVMFFIErrorMoveFromRaised", "TVMFFIErrorSetRaised", "TVMFFIErrorSetRaisedFromCStr",
               "TVMFFIObjectDecRef")]
    shim.tvmrnn_pool_bind_errors(*errors)
    if shim.tvmrnn_pool_bind(*address, ctypes.c_int(int(threads)), ctypes.c_int(int(_state.get("forked", False)))):
        raise RuntimeError("pthread_atfork failed")
    pins = _pins()
    shim.tvmrnn_pool_pin((ctypes.c_int * max(1, len(pins)))(*pins), ctypes.c_int(len(pins)))
    ffi.TVMFFIEnvModRegisterContextSymbol.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    # (both are registered before this process loads any tvmrnn module)
    for symbol, function in (("__TVMBackendParallelLaunch", "tvmrnn_parallel_launch"),
                             ("__TVMBackendParallelBarrier", "tvmrnn_parallel_barrier")):
        if ffi.TVMFFIEnvModRegisterContextSymbol(symbol.encode(), ctypes.cast(getattr(shim, function),
                                                                              ctypes.c_void_p)) != 0:
            raise RuntimeError(f"TVM refused the context symbol {symbol}")
    _state["shim"] = shim
    _state["gomp"] = gomp
    return "openmp"
