"""fp32 builds' large steps (the tiled SIMT GEMM into a buffer, the epilogue a second kernel: N >= 160
rows, H > 512) with other reduction tiles, against cuDNN fp32 (TF32 off): one process, same inputs,
calls interleaved; output and input-gradient errors against cuDNN's.

python3 notes/bench/v50/simt_steps.py OUT.json [variants [shape ...]]   shape: cell:T:N:H
Variants (comma-separated): k16 (the default, kept), k32, k16p (double-buffered), k8. It patches
``cuda.GPU_STEP_MATMUL``, a hook that existed at commit d6aa8f5 only (removed when k16 stayed)."""
import json, statistics, sys, time
import torch
import tvmrnn
from tvmrnn.schedules import cuda

torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
out_path = sys.argv[1]
VARIANTS = {"k16": dict(k_tile=16, pipeline=False), "k32": dict(k_tile=32, pipeline=False),
            "k16p": dict(k_tile=16, pipeline=True), "k8": dict(k_tile=8, pipeline=False)}
names = sys.argv[2].split(",") if len(sys.argv) > 2 else ["k16", "k32", "k16p"]
shapes = sys.argv[3:] or ["lstm:50:256:1024", "gru:50:256:2048", "lstm:50:192:768", "gru:50:160:1024"]
results = []


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


for shape in shapes:
    cell, T, N, H = shape.split(":")
    T, N, H = int(T), int(N), int(H)
    torch.manual_seed(0)
    ref = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(H, H).cuda()
    params = tvmrnn.params_from_torch(ref)
    x = torch.randn(T, N, H, device="cuda")
    dy = torch.randn(T, N, H, device="cuda")
    xr = x.clone().requires_grad_()
    yr = ref(xr)[0]
    yr.backward(dy)
    builds = {}
    for name in names:
        saved = cuda.GPU_STEP_MATMUL
        cuda.GPU_STEP_MATMUL = VARIANTS[name]
        try:
            t0 = time.perf_counter()
            rnn = tvmrnn.build(cell, H, H, batch_size=N, target="cuda", cache=False, tuning_logs=False)
            print(f"{shape} {name}: built in {time.perf_counter() - t0:.1f} s", flush=True)
            builds[name] = (rnn, rnn.pack_weights(params))
        finally:
            cuda.GPU_STEP_MATMUL = saved
    row = {"shape": shape}
    for name, (rnn, w) in builds.items():
        y, _, _, ws = rnn.forward_train(w, x)
        dx = rnn.backward(w, ws, dy)["x"]
        row[f"err_y_{name}"] = float((y - yr).norm() / yr.norm())
        row[f"err_dx_{name}"] = float((dx - xr.grad).norm() / xr.grad.norm())

    def theirs_infer():
        with torch.no_grad():
            ref(x)

    def theirs_train():
        y, _ = ref(xr)
        y.backward(dy)

    def ours_infer(rnn, w):
        return lambda: rnn.forward(w, x)

    def ours_train(rnn, w):
        def run():
            y, hy, cy, ws = rnn.forward_train(w, x)
            rnn.backward(w, ws, dy)
        return run

    for mode, theirs, ours in (("infer", theirs_infer, ours_infer), ("train", theirs_train, ours_train)):
        fns = {"cudnn": theirs, **{n: ours(*b) for n, b in builds.items()}}
        for f in fns.values():
            f(); f()
        times = {n: [] for n in fns}
        for _ in range(9):
            for n, f in fns.items():
                times[n].append(timed(f))
        for n in fns:
            row[f"{mode}_{n}_ms"] = 1e3 * statistics.median(times[n])
        print(f"{shape} {mode}: " + ", ".join(
            f"{n} {row[f'{mode}_{n}_ms']:.2f} ms ({row[f'{mode}_cudnn_ms'] / row[f'{mode}_{n}_ms']:.2f}x cuDNN)"
            for n in fns), flush=True)
    print(f"{shape} errors vs cuDNN: " + ", ".join(f"{k[4:]} {v:.1e}" for k, v in row.items() if k.startswith("err_")),
          flush=True)
    results.append(row)
    del builds
    json.dump(results, open(out_path, "w"), indent=1)
