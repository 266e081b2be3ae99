"""tvmrnn against PyTorch, side by side in one process on the same inputs.

    tvmrnn-bench --device cuda --preset ds2 --json bench_h100.json
    tvmrnn-bench --device cpu --threads 16 lstm --num-layers 1 --json bench_spr.json
    tvmrnn-bench --plot bench_h100.json bench_spr.json   # PNG charts from saved results
    tvmrnn-bench --device cuda --sweep scripts/configs/sweep.json   # a table of ratios over many shapes
    tvmrnn-bench --custom peephole_lstm -T 50 -N 20 --input-size 256 --hidden-size 256 --threads 2

For each configuration: builds tvmrnn (with the tuning records it finds for the target), loads the
same weights into torch.nn.LSTM/GRU/RNN, runs both on the same input, checks they agree, and times
inference (forward) and training (forward + backward with the same output gradient), the two sides'
calls in turn (:func:`interleaved`: each pair at the same moment of a machine whose speed drifts),
each after an untimed call of its own (``--lead-in``), so that neither starts while the other's
threads spin.
Prints samples/s (N / seconds per batch, the median of --reps) for each side and the ratio.
On CUDA: cuDNN with TF32 off on both sides, plus rows (inference, training) with TF32 allowed for cuDNN (tvmrnn computes
in plain fp32 either way). With --tf32, TF32 is allowed on both sides instead: tvmrnn built with
``allow_tf32=True`` (its all-steps GEMMs on tensor cores), cuDNN and cuBLAS with PyTorch's TF32 switches on; the
rows say "(TF32 both)" and their errors are against PyTorch's TF32 result. On the CPU: PyTorch's CPU path; both
sides use --threads threads. With --dtype bfloat16 (CPUs with AVX512-BF16, CUDA) or float16 (CUDA): tvmrnn's
``build(dtype=...)`` against PyTorch's module in that dtype (``module.to(dtype)``: cuDNN's, oneDNN's half
paths; rows "(bf16 both)", "(fp16 both)"), and against PyTorch's fp32 (rows "(bf16 vs PyTorch fp32)"); errors
against PyTorch's fp32 result. ``--options``:
BuildOptions fields for tvmrnn's builds.

With --custom CELL (an example cell of tvmrnn.cells.examples), each configuration instead times that
cell through tvmrnn beside the built-in LSTM through tvmrnn at the same sizes (same fusion: the
ratio is the custom cell's cost), the same cell as a per-step PyTorch loop (what a framework user
writes for a cell cuDNN lacks), and torch.compile of that loop (reported as failed where it fails).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import platform
import statistics
import time

from tvmrnn.cli import positive_int, usage_errors

CELLS = ("lstm", "gru", "rnn_tanh", "rnn_relu")
DS2 = dict(T=300, N=20, I=800, H=800)


def parse(argv=None):
    p = argparse.ArgumentParser(prog="tvmrnn-bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("cells", nargs="*", default=[], help="default: all four")
    p.add_argument("--preset", choices=["ds2"], help="Deep Speech 2: T=300 N=20 I=H=800, 1 layer and 5 "
                                                     "bidirectional layers, every cell given")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--target", help="tvmrnn's target (default: this GPU for --device cuda, this CPU for cpu), "
                                    "e.g. a JSON dict")
    p.add_argument("--threads", type=positive_int, default=os.cpu_count(), help="CPU threads for both sides")
    p.add_argument("--seq-len", "-T", type=positive_int, default=DS2["T"])
    p.add_argument("--batch-size", "-N", type=positive_int, default=DS2["N"])
    p.add_argument("--input-size", type=positive_int, default=DS2["I"])
    p.add_argument("--hidden-size", type=positive_int, default=DS2["H"])
    p.add_argument("--proj-size", type=positive_int, default=0,
                   help="the LSTM's projections (torch.nn's proj_size) on both sides; LSTM only")
    p.add_argument("--num-layers", type=positive_int, nargs="*", default=None, help="e.g. 1 5")
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--custom", metavar="CELL", help="an example custom cell (tvmrnn.cells.examples.EXAMPLES) "
                                                    "against the built-in LSTM, a PyTorch loop and torch.compile")
    p.add_argument("--no-compile", action="store_true", help="with --custom: leave out torch.compile (its compilation "
                                                              "of a long loop can take many minutes)")
    p.add_argument("--reps", type=positive_int, default=10)
    p.add_argument("--max-seconds", type=float, default=20.0, help="per side and pass, fewer reps if slower")
    p.add_argument("--lead-in", type=int, default=1,
                   help="untimed calls of the same side before each timed one (0: the sides back to back, "
                        "each slowed by the threads the other leaves spinning)")
    p.add_argument("--no-train", action="store_true")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="bfloat16 (CPUs with AVX512-BF16, CUDA), float16 (CUDA): tvmrnn.build(dtype=) against "
                   "PyTorch's module in that dtype, plus rows against PyTorch's fp32; errors against PyTorch's fp32")
    p.add_argument("--options", type=json.loads, default=None, metavar="JSON",
                   help='tvmrnn.BuildOptions fields for tvmrnn\'s builds, e.g. \'{"bf16_projections": true}\' '
                   "(PyTorch's side is unchanged)")
    p.add_argument("--tf32", action="store_true", help="CUDA: TF32 allowed on both sides (tvmrnn's allow_tf32, "
                   "PyTorch's allow_tf32 switches) instead of fp32 against fp32 and cuDNN TF32")
    p.add_argument("--tuning-logs", default=None)
    p.add_argument("--packages", nargs="*", default=[], metavar="SO",
                   help="exported packages (tvmrnn-export) to load instead of building, each used for the "
                        "configuration it was built for (a 5-layer GPU build takes minutes on a GPU machine's host; "
                        "build it elsewhere with --target and bring the file)")
    p.add_argument("--profile", action="store_true", help="also time every kernel alone: where the time goes "
                                                          "(input GEMMs, weight gradients, recurrent part, gaps per step)")
    p.add_argument("--torch-huge-pages", action="store_true",
                   help="CPU: PyTorch's allocator on 2 MB pages too (THP_MEM_ALLOC_ENABLE=1, PyTorch's own switch, "
                        "off by default), as tvmrnn's kept arrays are (TVMRNN_HUGE_PAGES)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--sweep", metavar="FILE", help="a JSON list of shapes ({cell (name or list), T (default -T), "
                                                   "batch_size, input_size, hidden_size, num_layers, bidirectional}: "
                                                   "tvmrnn-tune --config reads the same file), e.g. "
                                                   "scripts/configs/sweep.json: each measured in a process of its own, "
                                                   "then one table of ratios with their geometric means")
    p.add_argument("--plot", nargs="*", help="draw PNG charts from result files and exit")
    return p.parse_args(argv)


def configs(a):
    cells = [a.custom] if a.custom else a.cells or list(CELLS)
    if a.preset == "ds2":
        return [(c, 1, False) for c in cells] + [(c, 5, True) for c in cells]
    return [(c, L, a.bidirectional) for L in (a.num_layers or [1]) for c in cells]


def timed(fn, sync, reps, max_seconds):
    times = samples(fn, sync, reps, max_seconds)
    return statistics.median(times), len(times)


def samples(fn, sync, reps, max_seconds=float("inf")):
    """Seconds of each of ``reps`` calls after a warm-up (fewer past ``max_seconds``, at least 3)."""
    fn()
    sync()  # warm-up (and first-call allocations)
    times, start = [], time.perf_counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > max_seconds and len(times) >= 3:
            break
    return times


def interleaved(ours, theirs, sync, reps, max_seconds, lead_in=1):
    """Both sides timed in turn (ours, theirs, ours, ...) after a warm-up of each:
    ``((median, calls), (median, calls))``. On a shared VM a pass moves 20-40% within minutes
    (notes/performance.md v12, v23), so one side's block of calls timed after the other's can
    differ by the machine's drift alone; in turn, each pair sees the same moment. Stops after
    ``reps`` pairs, or past ``max_seconds`` for both together with at least 3. ``lead_in``:
    untimed calls of the same side before each timed one, so that each timed call starts as it
    would in a run of its own calls: right after a PyTorch op its OpenMP threads spin for ~20 ms
    on the Xeon (libgomp's default spin count) on the cores the next call needs, which slowed a
    tvmrnn call right after PyTorch's by up to 20 ms, and an idle pause instead made PyTorch's
    next call slower (its threads asleep; notes/performance.md v25). ``lead_in=0`` times the two
    back to back, as a network that mixes them runs."""
    times = ([], [])
    for fn in (ours, theirs):
        fn()
        sync()  # warm-up (and first-call allocations)
    start = time.perf_counter()
    for _ in range(reps):
        for fn, out in zip((ours, theirs), times):
            for _ in range(lead_in):
                fn()
                sync()
            t0 = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t0)
        if time.perf_counter() - start > max_seconds and len(times[0]) >= 3:
            break
    return tuple((statistics.median(t), len(t)) for t in times)


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def torch_rnn(cell, I, H, L, bidir, proj_size=0):
    import torch
    kw = dict(num_layers=L, bidirectional=bidir)
    if cell == "lstm":
        return torch.nn.LSTM(I, H, proj_size=proj_size, **kw)
    if cell == "gru":
        return torch.nn.GRU(I, H, **kw)
    return torch.nn.RNN(I, H, nonlinearity=cell[4:], **kw)


def find_package(paths, **config):
    """The first of ``paths`` whose package metadata has every item of ``config``; None if none."""
    from tvmrnn.runtime.package import read_metadata
    for path in paths:
        meta = read_metadata(path)
        meta.setdefault("proj_size", 0)  # (packages before v71: none)
        if all(meta.get(k) == v for k, v in config.items()):
            return path
    return None


def bench_one(a, cell, L, bidir, tvmrnn, torch):
    T, N, I, H = a.seq_len, a.batch_size, a.input_size, a.hidden_size
    dev = torch.device(a.device)
    target = json.loads(a.target) if a.target and a.target.startswith("{") else a.target
    target = target or ("cuda" if a.device == "cuda" else None)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    torch.manual_seed(0)
    P = a.proj_size
    ref = torch_rnn(cell, I, H, L, bidir, P).to(dev)
    t0 = time.perf_counter()
    half = a.dtype != "float32"
    short = {"bfloat16": "bf16", "float16": "fp16"}.get(a.dtype)
    options = a.options
    package = None if a.tf32 or options or half else find_package(a.packages, cell=cell, num_layers=L, bidirectional=bidir, batch_size=N,
                           input_size=I, hidden_size=H, target_kind="cuda" if a.device == "cuda" else "llvm",
                           proj_size=P)
    if package:
        if a.profile:
            raise ValueError(f"--profile needs a build (the kernels' programs); {package} is a package")
        rnn = tvmrnn.load(package, device=a.device)
    else:
        rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=L, bidirectional=bidir, batch_size=N,
                           target=target, tuning_logs=a.tuning_logs, allow_tf32=a.tf32, options=options,
                           cache=False if a.profile else None, dtype=a.dtype,  # a cached build has no per-kernel programs
                           proj_size=P)
    build_s = time.perf_counter() - t0
    schedules = rnn.schedules  # a package made before v28 does not know them
    tuned = f"{sum(1 for v in schedules.values() if v == 'tuned')}/{len(schedules)}" if schedules else "package"
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = torch.randn(T, N, I, device=dev)
    dy = torch.randn(T, N, (P or H) * (2 if bidir else 1), device=dev)
    # a half run: both sides take the same half inputs; PyTorch's module in that dtype
    low = getattr(torch, a.dtype)
    x_in, dy_in = (x.to(low), dy.to(low)) if half else (x, dy)
    ref_in = copy.deepcopy(ref).to(low) if half else ref
    row = dict(cell=cell, num_layers=L, bidirectional=bidir, T=T, N=N, I=I, H=H, proj_size=P, device=a.device,
               build_s=round(build_s, 1), tuned_kernels=tuned, package=package, options=options, dtype=a.dtype)
    results = []
    if a.profile:
        from tvmrnn.runtime.profile import GROUPS, profile
        passes = ("forward",) if a.no_train else ("forward", "forward_train", "backward")
        row["profile"] = []
        for p in profile(rnn, T, passes):
            print(p.table(), flush=True)
            row["profile"].append(dict(pass_=p.name, measured_ms=p.measured_ms, kernel_ms=p.kernel_ms,
                                       steps=p.steps, launches_per_step=p.launches_per_step, persistent=p.persistent,
                                       gap_us_per_step=p.gap_us_per_step,
                                       groups={g: p.group_ms(g) for g in GROUPS},
                                       kernels=[vars(k) for k in p.kernels]))

    def record(name, ours, theirs, agree):
        (ts, tn), (rs, rn) = ours, theirs
        r = dict(row, pass_=name, tvmrnn_sps=N / ts, torch_sps=N / rs, ratio=rs / ts, rel_error=agree,
                 tvmrnn_ms=1e3 * ts, torch_ms=1e3 * rs, reps=min(tn, rn))
        results.append(r)
        print(f"{cell:8s} L={L} {'bi ' if bidir else 'uni'} {name:16s} tvmrnn {N / ts:9.1f}  torch {N / rs:9.1f} "
              f"samples/s  ratio {rs / ts:5.2f}x  rel err {agree:.1e}", flush=True)

    both = " (TF32 both)" if a.tf32 else f" ({short} both)" if half else ""  # every row with TF32 / half on both sides
    # inference
    with torch.no_grad(), cudnn_tf32(torch, a.tf32):
        y_ref = ref(x)[0]  # fp32: what the errors are measured against
        y = rnn.forward(w, x_in)[0]
        agree = rel(y, y_ref)
        ours, theirs = interleaved(lambda: rnn.forward(w, x_in), lambda: ref_in(x_in), sync, a.reps,
                                   2 * a.max_seconds, a.lead_in)
        if half:  # the extra row: ours in half against PyTorch's fp32
            record(f"inference ({short} vs PyTorch fp32)", ours, timed(lambda: ref(x), sync, a.reps, a.max_seconds),
                   agree)
    with torch.no_grad():
        for tf32 in ([False, True] if a.device == "cuda" and not a.tf32 else [a.tf32]):
            with cudnn_tf32(torch, tf32):
                if tf32 != a.tf32:  # the extra row: cuDNN with TF32 against our fp32 times above
                    theirs = timed(lambda: ref(x), sync, a.reps, a.max_seconds)
                record("inference" + (" (cuDNN TF32)" if tf32 and not a.tf32 else both), ours, theirs,
                       agree if tf32 == a.tf32 else rel(y, ref(x)[0]))
    if a.no_train:
        return results

    # training: forward keeping the workspace, backward with the same output gradient
    def ours_train():
        y, hy, cy, ws = rnn.forward_train(w, x_in)
        return rnn.backward(w, ws, dy_in)

    xr = x.clone().requires_grad_(True)
    xr_in = x_in.clone().requires_grad_(True) if half else xr  # (fp32: one input, whose gradient is compared)

    def theirs_train():
        ref_in.zero_grad(set_to_none=True)
        xr_in.grad = None
        ref_in(xr_in)[0].backward(dy_in)

    def theirs_train_fp32():
        ref.zero_grad(set_to_none=True)
        xr.grad = None
        ref(xr)[0].backward(dy)

    g = ours_train()

    def agreement():  # ours against PyTorch's gradients of its last training step
        return max(rel(g["x"], xr.grad), rel(g["weight_hh_l0"], ref.weight_hh_l0.grad))

    with cudnn_tf32(torch, a.tf32):
        (theirs_train_fp32 if half else theirs_train)()
        agree = agreement()
        ours, theirs = interleaved(ours_train, theirs_train, sync, a.reps, 2 * a.max_seconds, a.lead_in)
    if half:
        record(f"training ({short} vs PyTorch fp32)", ours, timed(theirs_train_fp32, sync, a.reps, a.max_seconds), agree)
    record("training" + both, ours, theirs, agree)
    # memory: what the training forward keeps for the backward, and (CUDA) the peak a training step
    # allocates beyond what was allocated before it, both sides through PyTorch's allocator
    results[-1]["tvmrnn_workspace_mb"] = rnn.forward_train(w, x_in)[3].workspace_bytes / 2**20
    memory = f"tvmrnn workspace {results[-1]['tvmrnn_workspace_mb']:.1f} MB"
    if a.device == "cuda":
        results[-1]["tvmrnn_peak_mb"] = peak_mb(torch, ours_train)
        results[-1]["torch_peak_mb"] = peak_mb(torch, theirs_train)
        memory += (f"; peak per training step: tvmrnn {results[-1]['tvmrnn_peak_mb']:.1f} MB, "
                   f"cuDNN {results[-1]['torch_peak_mb']:.1f} MB")
    print(f"{'':8s} {'':5s} {'':3s} memory           {memory}", flush=True)
    if a.device == "cuda" and not a.tf32:  # cuDNN's training with TF32 allowed (tvmrnn's is fp32 here)
        with cudnn_tf32(torch, True):
            theirs_train()
            agree = agreement()
            record("training (cuDNN TF32)", ours, timed(theirs_train, sync, a.reps, a.max_seconds), agree)
    return results


@contextlib.contextmanager
def cudnn_tf32(torch, allowed: bool):
    """PyTorch's TF32 switches (cuDNN's and cuBLAS's) set to ``allowed`` inside, off again after:
    off is how every comparison here runs unless a row says TF32."""
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False


def peak_mb(torch, step) -> float:
    """Peak CUDA memory one call of ``step`` allocates beyond what was allocated before it, in MB."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def bench_custom(a, name, L, bidir, tvmrnn, torch):
    """A custom cell through tvmrnn beside the built-in LSTM (tvmrnn), a per-step loop and torch.compile."""
    from tvmrnn.cells import examples as example_cells
    if name not in example_cells.EXAMPLES:
        raise ValueError(f"--custom: expected one of {sorted(example_cells.EXAMPLES)} (cells with a PyTorch "
                         f"reference in tvmrnn.cells.examples), got {name!r}")
    cell = example_cells.EXAMPLES[name]
    T, N, I, H = a.seq_len, a.batch_size, a.input_size, a.hidden_size
    dev = torch.device(a.device)
    target = json.loads(a.target) if a.target and a.target.startswith("{") else a.target
    target = target or ("cuda" if a.device == "cuda" else None)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    sizes = dict(input_size=I, hidden_size=H, num_layers=L, bidirectional=bidir, batch_size=N, target=target,
                 tuning_logs=a.tuning_logs)
    torch.manual_seed(0)
    rnns, weights = {}, {}
    for side, c in ((name, cell), ("lstm", "lstm")):
        rnns[side] = tvmrnn.build(c, **sizes)
        params = {k: v.to(dev) for k, v in example_cells.reference_params(c, I, H, L, bidir).items()}
        weights[side] = (rnns[side].pack_weights(params), params)
    params = {k: v.clone().requires_grad_(True) for k, v in weights[name][1].items()}
    x = torch.randn(T, N, I, device=dev)
    xr = x.clone().requires_grad_(True)
    dy = torch.randn(T, N, H * (2 if bidir else 1), device=dev)

    def loop(inp):
        return example_cells.reference_forward(cell, params, inp, num_layers=L, bidirectional=bidir)[0]

    compiled = torch.compile(loop)

    def tvmrnn_pass(side, train):
        rnn, w = rnns[side], weights[side][0]
        if not train:
            return lambda: rnn.forward(w, x)
        return lambda: rnn.backward(w, rnn.forward_train(w, x)[3], dy)

    def torch_pass(fn, train):
        def run():
            if not train:
                with torch.no_grad():
                    return fn(x)
            xr.grad = None
            for p in params.values():
                p.grad = None
            fn(xr).backward(dy)
        return run

    results = []
    for train in ([False] if a.no_train else [False, True]):
        pass_ = "training" if train else "inference"
        sides = {f"tvmrnn {name}": tvmrnn_pass(name, train), "tvmrnn lstm": tvmrnn_pass("lstm", train),
                 "torch loop": torch_pass(loop, train)}
        if not a.no_compile:
            sides["torch.compile loop"] = torch_pass(compiled, train)
        times, notes = {}, {}
        for side, fn in sides.items():
            t0 = time.perf_counter()
            try:
                fn()  # warm-up; for torch.compile, the compilation
            except Exception as err:  # torch.compile fails on some setups (no compiler, no Triton)
                notes[side] = f"failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:120]}"
                continue
            if side.startswith("torch.compile"):
                notes[side] = f"compiled in {time.perf_counter() - t0:.1f} s"
            for _ in range(3):  # first calls run slow (thread pools, allocations, torch.compile's lazy set-up)
                fn()
            times[side] = timed(fn, sync, a.reps, a.max_seconds)
        with torch.no_grad():
            agree = rel(rnns[name].forward(weights[name][0], x)[0], loop(x))
        if train:
            grads = rnns[name].backward(weights[name][0], rnns[name].forward_train(weights[name][0], x)[3], dy)
            torch_pass(loop, True)()
            agree = max(agree, rel(grads["x"], xr.grad), rel(grads["weight_hh_l0"], params["weight_hh_l0"].grad))
        ours = times[f"tvmrnn {name}"][0]
        print(f"{name} L={L} {'bi ' if bidir else 'uni'} {pass_} (T={T} N={N} I={I} H={H}), median ms; "
              f"rel err vs loop {agree:.1e}", flush=True)
        for side in sides:
            if side in times:
                s = times[side][0]
                print(f"  {side:22s} {1e3 * s:9.2f} ms {N / s:9.1f} samples/s  {s / ours:5.2f}x the custom cell's "
                      f"time  {notes.get(side, '')}", flush=True)
            else:
                print(f"  {side:22s} {notes[side]}", flush=True)
        results.append(dict(cell=name, num_layers=L, bidirectional=bidir, T=T, N=N, I=I, H=H, device=a.device,
                            pass_=pass_, rel_error=agree, notes=notes, reps=min(n for _, n in times.values()),
                            ms={side: 1e3 * s for side, (s, _) in times.items()}))
    return results


def machine(torch, a):
    from tvmrnn.runtime.arrays import huge_pages
    info = dict(python=platform.python_version(), torch=torch.__version__, threads=a.threads,
                cpu=platform.processor() or platform.machine(), date=time.strftime("%Y-%m-%d"),
                tvmrnn_huge_pages=huge_pages(), torch_huge_pages=os.environ.get("THP_MEM_ALLOC_ENABLE") == "1",
                lead_in=a.lead_in, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                thread_pool=os.environ.get("TVMRNN_THREAD_POOL", "auto"))  # CPU loops: PyTorch's OpenMP or TVM's
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    if a.device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cudnn"] = torch.backends.cudnn.version()
    return info


def _missing(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def plot(paths):
    if _missing("matplotlib"):
        raise SystemExit("tvmrnn-bench --plot draws with matplotlib, which is not installed: pip install matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for path in paths:
        data = json.load(open(path))
        rows = [r for r in data["results"] if "TF32" not in r["pass_"]]
        labels = [f"{r['cell']}\n{r['num_layers']}{'bi' if r['bidirectional'] else ''} {r['pass_'][:5]}" for r in rows]
        fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
        xs = range(len(rows))
        ax.bar([i - 0.2 for i in xs], [r["torch_sps"] for r in rows], 0.4, label="PyTorch")
        ax.bar([i + 0.2 for i in xs], [r["tvmrnn_sps"] for r in rows], 0.4, label="tvmrnn")
        ax.set_xticks(list(xs), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("samples/s")
        m = data["machine"]
        ax.set_title(f"{m.get('gpu', m['cpu'])}, {m['date']}", fontsize=9)
        ax.legend()
        fig.tight_layout()
        out = os.path.splitext(path)[0] + ".png"
        fig.savefig(out, dpi=120)
        print("wrote", out)


def sweep(a) -> list[dict]:
    """Every shape of ``a.sweep`` measured by this command in a process of its own (with this
    call's device, target, threads, reps and logs), then a table of the ratios, their geometric
    means and minimums. Returns the results."""
    import subprocess
    import sys
    import tempfile
    shapes = json.load(open(a.sweep))
    passthrough = ["--device", a.device, "--threads", str(a.threads), "--reps", str(a.reps),
                   "--max-seconds", str(a.max_seconds), "--lead-in", str(a.lead_in)]
    passthrough += ["--target", a.target] if a.target else []
    passthrough += ["--tuning-logs", a.tuning_logs] if a.tuning_logs else []
    passthrough += ["--no-train"] if a.no_train else []
    passthrough += ["--options", json.dumps(a.options)] if a.options else []
    passthrough += ["--tf32"] if a.tf32 else []
    passthrough += ["--dtype", a.dtype]
    main_row = " (TF32 both)" if a.tf32 else {"bfloat16": " (bf16 both)", "float16": " (fp16 both)"}.get(a.dtype, "")
    results, rows = [], []
    for shape in shapes:
        for cell in [shape["cell"]] if isinstance(shape["cell"], str) else shape["cell"]:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "r.json")
                T = shape.get("T", a.seq_len)
                cmd = [sys.executable, "-m", "tvmrnn.cli.bench", cell, "-T", str(T),
                       "-N", str(shape["batch_size"]), "--input-size", str(shape["input_size"]),
                       "--hidden-size", str(shape["hidden_size"]), "--num-layers", str(shape.get("num_layers", 1)),
                       *(["--bidirectional"] if shape.get("bidirectional") else []),
                       *(["--proj-size", str(shape["proj_size"])] if shape.get("proj_size") else []),
                       *passthrough, "--json", out]
                done = subprocess.run(cmd, capture_output=True, text=True)
                found = json.load(open(out))["results"] if os.path.exists(out) else []
            ratios = {r["pass_"]: r["ratio"] for r in found}
            proj = shape.get("proj_size")
            name = (f"{cell} T={T} N={shape['batch_size']} I={shape['input_size']} H={shape['hidden_size']} "
                    f"{f'P={proj} ' if proj else ''}L={shape.get('num_layers', 1)}"
                    f"{' bi' if shape.get('bidirectional') else ''}")
            error = "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["failed"])[-1][:80]
            inference, training = ratios.get("inference" + main_row), ratios.get("training" + main_row)
            rows.append((name, inference, training, error))
            ms = "  ".join(f"{r['pass_']} {r['tvmrnn_ms']:.3f} / {r['torch_ms']:.3f} ms" for r in found
                           if "tvmrnn_ms" in r and r["pass_"] in ("inference" + main_row, "training" + main_row))
            print(f"{name:44s} inference {_x(inference)}  training {_x(training)}  {ms}  {error}", flush=True)
            results += found
            if a.json:  # after every shape, so a cut-off sweep keeps what it measured (whole files only)
                with open(a.json + ".part", "w") as f:
                    json.dump(dict(results=results), f, indent=1)
                os.replace(a.json + ".part", a.json)
    print(f"\n{'shape':44s} {'inference':>9s} {'training':>9s}")
    for name, inf, train, error in rows:
        print(f"{name:44s} {_x(inf):>9s} {_x(train):>9s}  {error}")
    for i, label in ((1, "inference"), (2, "training")):
        values = [r[i] for r in rows if r[i]]
        if values:
            print(f"{label}: geometric mean {statistics.geometric_mean(values):.2f}x, lowest {min(values):.2f}x "
                  f"({len(values)} of {len(rows)} shapes)")
    return results


def _x(ratio) -> str:
    return f"{ratio:.2f}x" if ratio else "-"


@usage_errors("tvmrnn-bench")
def main(argv=None):
    a = parse(argv)
    if a.tf32 and a.device != "cuda":  # (with the others before any setup: threads, TF32 flags)
        raise ValueError("--tf32 is for --device cuda")
    if a.dtype != "float32" and a.tf32:
        raise ValueError(f"--dtype {a.dtype}: not with --tf32 (a half build's all-steps GEMMs are on tensor cores)")
    if a.dtype == "float16" and a.device != "cuda":
        raise ValueError("--dtype float16: CUDA only (CPUs: bfloat16)")
    if a.plot:
        return plot(a.plot)
    if _missing("torch"):  # the other side of every comparison (imported later: see below)
        raise SystemExit("tvmrnn-bench times tvmrnn against PyTorch, which is not installed: pip install torch")
    if a.sweep:
        sweep(a)  # (writes a.json after every shape)
        return
    unknown = [c for c in a.cells if c not in CELLS]
    if unknown:
        raise ValueError(f"cells: unknown {unknown}; expected some of {list(CELLS)} (--custom for custom cells)")
    if a.proj_size and (a.custom or a.cells != ["lstm"]):
        raise ValueError("--proj-size: the LSTM's projections; name the lstm cell alone (tvmrnn-bench lstm --proj-size P)")
    os.environ.setdefault("TVM_NUM_THREADS", str(a.threads))  # before TVM starts its thread pool
    if a.torch_huge_pages:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # read by PyTorch's CPU allocator at its first use
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: PyTorch sees no CUDA GPU on this machine")
    torch.set_num_threads(a.threads)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    import tvmrnn
    info = machine(torch, a)
    print(json.dumps(info))
    results = []
    for cell, L, bidir in configs(a):
        results += (bench_custom if a.custom else bench_one)(a, cell, L, bidir, tvmrnn, torch)
        if a.json:  # after every configuration, so a cut-off run keeps what it measured
            with open(a.json, "w") as f:
                json.dump(dict(machine=info, results=results), f, indent=1)
    if a.json:
        print("wrote", a.json)


if __name__ == "__main__":
    main()
