"""Half builds' backward steps on the TF32 tiles (``common.GPU_TF32_BACKWARD_STEPS``: "off", the
v51 default; "matmul", those launched as the SIMT tiled GEMM anyway; "all", by the forward rule)
against cuDNN in the same dtype: one process, same inputs, calls interleaved; medians of ms a
pass, and the errors of y and dx against an fp32 torch module on the same (rounded) inputs.

python3 notes/bench/v52/backward_steps.py OUT.json [dtype [variants [shape ...]]]   shape: cell:T:N:H
"""
import json, statistics, sys, time
import torch
import tvmrnn
from tvmrnn.schedules import common

out_path = sys.argv[1]
dtype = sys.argv[2] if len(sys.argv) > 2 else "float16"
names = sys.argv[3].split(",") if len(sys.argv) > 3 else ["off", "matmul", "all"]
shapes = sys.argv[4:] or ["lstm:100:256:512", "lstm:50:256:1024", "gru:50:256:2048", "lstm:100:128:1024"]
half = getattr(torch, dtype)
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
    Module = torch.nn.LSTM if cell == "lstm" else torch.nn.GRU
    mod = Module(H, H).cuda()
    params = tvmrnn.params_from_torch(mod)
    ref = Module(H, H).cuda().to(half)
    ref.load_state_dict({k: v.to(half) for k, v in mod.state_dict().items()})
    x = torch.randn(T, N, H, device="cuda").to(half)
    dy = torch.randn(T, N, H, device="cuda").to(half)
    x32 = x.float().requires_grad_()
    y32 = mod(x32)[0]
    y32.backward(dy.float())
    dx32 = x32.grad
    builds = {}
    for name in names:
        saved, common.GPU_TF32_BACKWARD_STEPS = common.GPU_TF32_BACKWARD_STEPS, name
        try:
            t0 = time.perf_counter()
            rnn = tvmrnn.build(cell, H, H, batch_size=N, dtype=dtype, target="cuda", cache=False, tuning_logs=False)
            steps = sorted(k for k, v in rnn.schedules.items() if v == "tf32" and "step" in k)
            print(f"{shape} {name}: built in {time.perf_counter() - t0:.1f} s; tensor-core steps {steps}", flush=True)
            builds[name] = (rnn, rnn.pack_weights(params))
        finally:
            common.GPU_TF32_BACKWARD_STEPS = saved
    row = {"shape": shape, "dtype": dtype}
    for name, (rnn, w) in builds.items():
        y, hy, cy, ws = rnn.forward_train(w, x)
        dx = rnn.backward(w, ws, dy)["x"]
        row[f"err_y_{name}"] = float((y.float() - y32).norm() / y32.norm())
        row[f"err_dx_{name}"] = float((dx.float() - dx32).norm() / dx32.norm())
    xr = x.clone().requires_grad_()
    yr = ref(xr)[0]
    yr.backward(dy)
    row["err_y_cudnn"] = float((yr.float() - y32).norm() / y32.norm())
    row["err_dx_cudnn"] = float((xr.grad.float() - dx32).norm() / dx32.norm())

    def ours_infer(rnn, w):
        return lambda: rnn.forward(w, x)

    def ours_train(rnn, w):
        def run():
            y, hy, cy, ws = rnn.forward_train(w, x)
            rnn.backward(w, ws, dy)
        return run

    def theirs_infer():
        with torch.no_grad():
            ref(x)

    def theirs_train():
        ref(xr)[0].backward(dy)

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
    print(f"{shape} errors vs fp32: " + ", ".join(f"{k[4:]} {v:.1e}" for k, v in row.items() if k.startswith("err_")),
          flush=True)
    results.append(row)
    del builds
    json.dump(results, open(out_path, "w"), indent=1)
