"""Half builds with half operands on the tensor cores (BuildOptions.half_operands: fp16/bf16
``mma.m16n8k16``, ``ldmatrix``) against the TF32 tiles of v50 and cuDNN in the same dtype: one
process, same inputs, calls interleaved.

python3 notes/bench/v51/half_operands.py OUT.json [dtype [variants [shape ...]]]   shape: cell:T:N:H
Variants (comma-separated, :data:`VARIANTS`): "simt" (fp32 steps, TF32 all-steps GEMMs: v49),
"tf32" (v50's default: TF32 tiles for the large steps), "default" (the build's), "half"
(``half_operands=True``: the steps on half operands too), "half_any" (half-operand steps at any
size: the step thresholds patched to 1), "tf32_128x32", "half_128x32" (128 x 32 step tiles: each
block reads a weight column once a step), "half_k64", "half_k256", "half_p" (the step tiles'
reduction steps a shared tile; double-buffered), "stage_pad", "half_stage_pad" (the step tiles'
staging rows padded by 4 floats: ``tf32_tiles(stage_pad=)``); medians of ms a pass."""
import json, statistics, sys, time
import torch
import tvmrnn
from tvmrnn.schedules import common, cuda

out_path = sys.argv[1]
dtype = sys.argv[2] if len(sys.argv) > 2 else "float16"
shapes = ["lstm:100:128:1024", "lstm:100:256:512", "gru:50:256:2048", "lstm:100:64:1024", "lstm:300:20:800"]
half = getattr(torch, dtype)
results = []

# name -> (BuildOptions fields, patches: "any" sets the step thresholds to 1, "tiles" replaces the
# step tiles, others update them)
T128x32 = (dict(warps=(4, 2), fragments=(2, 1), k_tile=128),)
VARIANTS = {"simt": (dict(tensor_core_steps=False, half_operands=False), {}),
            "tf32": (dict(half_operands=False), {}), "default": ({}, {}), "half": (dict(half_operands=True), {}),
            "half_any": (dict(half_operands=True, tensor_core_steps=True), {"any": True}),
            "tf32_128x32": (dict(half_operands=False), {"tiles": T128x32}),
            "half_128x32": (dict(half_operands=True), {"tiles": T128x32}),
            "half_k64": (dict(half_operands=True), {"k_tile": 64}),
            "half_k256": (dict(half_operands=True), {"k_tile": 256}),
            "half_p": (dict(half_operands=True), {"pipeline": True}),
            "stage_pad": ({}, {"stage_pad": 4}), "half_stage_pad": (dict(half_operands=True), {"stage_pad": 4})}
names = (sys.argv[3].split(",") if len(sys.argv) > 3 else ["tf32", "half"])
shapes = sys.argv[4:] or shapes


def variant(name):
    saved = (common.GPU_TF32_STEP_ROWS, common.GPU_TF32_STEP_WORK, cuda.TF32_STEP_TILES)
    fields, change = VARIANTS[name]
    change = dict(change)
    if change.pop("any", False):
        common.GPU_TF32_STEP_ROWS = common.GPU_TF32_STEP_WORK = 1
    if "tiles" in change:
        cuda.TF32_STEP_TILES = change.pop("tiles")
    if change:
        cuda.TF32_STEP_TILES = tuple({**t, **change} for t in cuda.TF32_STEP_TILES)
    return tvmrnn.BuildOptions(**fields), saved


def timed(fn, reps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


for shape in shapes:
    cell, T, N, H = shape.split(":")
    T, N, H = int(T), int(N), int(H)
    torch.manual_seed(0)
    mod = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(H, H).cuda()
    params = tvmrnn.params_from_torch(mod)
    ref = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(H, H).cuda().to(half)
    ref.load_state_dict({k: v.to(half) for k, v in mod.state_dict().items()})
    x = torch.randn(T, N, H, device="cuda").to(half)
    with torch.no_grad():
        y32 = mod(x.float())[0]
    builds = {}
    for name in names:
        options, saved = variant(name)
        try:
            t0 = time.perf_counter()
            rnn = tvmrnn.build(cell, H, H, batch_size=N, dtype=dtype, target="cuda", options=options, cache=False,
                               tuning_logs=False)
            steps = sorted(k for k, v in rnn.schedules.items() if v == "tf32" and "step" in k)
            print(f"{shape} {name}: built in {time.perf_counter() - t0:.1f} s; tensor-core steps {steps}", flush=True)
            builds[name] = (rnn, rnn.pack_weights(params))
        finally:
            common.GPU_TF32_STEP_ROWS, common.GPU_TF32_STEP_WORK, cuda.TF32_STEP_TILES = saved
    dy = torch.randn(T, N, H, device="cuda").to(half)

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

    xr = x.clone().requires_grad_()

    def theirs_train():
        y, _ = ref(xr)
        y.backward(dy)

    row = {"shape": shape, "dtype": dtype}
    for name, (rnn, w) in builds.items():
        y = rnn.forward(w, x)[0]
        row[f"err_{name}"] = float((y.float() - y32).norm() / y32.norm())
    with torch.no_grad():
        row["err_cudnn"] = float((ref(x)[0].float() - y32).norm() / y32.norm())
    for mode, theirs, ours in (("infer", theirs_infer, ours_infer), ("train", theirs_train, ours_train)):
        fns = {"cudnn": theirs, **{n: ours(*b) for n, b in builds.items()}}
        for f in fns.values():
            f(); f()
        times = {n: [] for n in fns}
        for _ in range(9):
            for n, f in fns.items():
                times[n].append(timed(f, 1))
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
