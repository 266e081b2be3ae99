"""A build from the shipped records and the defaults (an empty log folder) against one that also reads a tuning log
folder, same inputs, calls interleaved: forward (inference) and training (forward_train +
backward). Usage: tuned_vs_default.py LOG_DIR THREADS cell:T:N:I:H [dtype]"""
import sys, tempfile, time, statistics, warnings, torch, numpy as np
warnings.simplefilter("ignore")
import tvmrnn
log_dir, threads, shape = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
torch.set_num_threads(threads)
cell, T, N, I, H = shape.split(":"); T, N, I, H = map(int, (T, N, I, H))
ref = getattr(torch.nn, cell.split("_")[0].upper())(I, H)
p = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
builds = {name: tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, dtype=dtype, tuning_logs=logs, cache=False)
          for name, logs in (("default", tempfile.mkdtemp()), ("tuned", log_dir))}
ws = {k: b.pack_weights(p) for k, b in builds.items()}
x, dy = torch.randn(T, N, I), torch.randn(T, N, H)
if dtype != "float32":
    x, dy = x.to(getattr(torch, dtype)), dy.to(getattr(torch, dtype))
def infer(k): return lambda: builds[k].forward(ws[k], x)[0]
def train(k):
    def f():
        y, _, _, st = builds[k].forward_train(ws[k], x)
        return builds[k].backward(ws[k], st, dy)["x"]
    return f
sides = {f"{m} {k}": (infer if m == "infer" else train)(k) for m in ("infer", "train") for k in builds}
out = {k: (lambda r: r if isinstance(r, torch.Tensor) else torch.as_tensor(np.asarray(r)))(f()).float() for k, f in sides.items()}
for m in ("infer", "train"):
    a, b = out[f"{m} default"], out[f"{m} tuned"]
    print(f"{m}: tuned against default, max |diff| / max |default| = {float((a - b).abs().max() / a.abs().max()):.1e}")
times = {k: [] for k in sides}
for _ in range(9):
    for k, f in sides.items():
        f(); t = time.perf_counter(); f(); times[k].append(time.perf_counter() - t)
med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
for m in ("infer", "train"):
    print(f"{cell} T={T} N={N} I={I} H={H} {dtype} {m}: default {med[f'{m} default']:.2f} ms, tuned {med[f'{m} tuned']:.2f} ms, "
          f"{med[f'{m} default'] / med[f'{m} tuned']:.3f}x", flush=True)
