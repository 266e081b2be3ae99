"""tvmrnn fp32 / tvmrnn bf16_projections / torch fp32 / torch bf16 (CPU autocast): inference and training, interleaved."""
import sys, time, json, numpy as np, torch, tvmrnn, warnings
warnings.simplefilter("ignore")
# arguments (all optional): the JSON output, the threads (both sides), the shapes as cell:T:N:I:H,...
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
shapes = [("lstm", 100, 20, 800, 800), ("lstm", 80, 160, 256, 384), ("gru", 100, 32, 512, 512), ("lstm", 100, 1, 256, 256),
          ("rnn_tanh", 100, 20, 800, 800)]
if len(sys.argv) > 3:
    shapes = [(c, *map(int, rest)) for c, *rest in (s.split(":") for s in sys.argv[3].split(","))]
rows = []
for cell, T, N, I, H in shapes:
    ref = getattr(torch.nn, cell.split("_")[0].upper())(I, H)
    p = {k: v.detach().numpy() for k, v in ref.state_dict().items()}
    x = torch.randn(T, N, I)
    builds = {o: tvmrnn.build(cell, input_size=I, hidden_size=H, batch_size=N, options=tvmrnn.BuildOptions(bf16_projections=o)) for o in (False, True)}
    ws = {o: b.pack_weights(p) for o, b in builds.items()}
    def t_fp32(): return builds[False].forward(ws[False], x)[0]
    def t_bf16(): return builds[True].forward(ws[True], x)[0]
    def torch32():
        with torch.no_grad(): return ref(x)[0]
    def torchbf():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16): return ref(x)[0]
    dy = torch.randn(T, N, H)
    def train(o):
        def f():
            y, _, _, ws = builds[o].forward_train(ws_[o], x)
            return builds[o].backward(ws_[o], ws, dy)["x"]
        return f
    ws_ = ws
    xg = x.clone().requires_grad_()
    def torch_train(bf):
        def f():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf):
                y = ref(xg)[0]
            return torch.autograd.grad(y.float(), xg, dy)[0]
        return f
    sides = {"tvmrnn fp32": t_fp32, "tvmrnn bf16-proj": t_bf16, "torch fp32": torch32, "torch bf16 autocast": torchbf,
             "train tvmrnn fp32": train(False), "train tvmrnn bf16-proj": train(True), "train torch fp32": torch_train(False),
             "train torch bf16": torch_train(True)}
    yref = torch32()
    gref = torch_train(False)()
    errs = {k: float((torch.as_tensor(f()).float() - (gref if k.startswith("train") else yref)).norm() / (gref if k.startswith("train") else yref).norm()) for k, f in sides.items()}
    times = {k: [] for k in sides}
    for r in range(5):
        for k, f in sides.items():
            f(); t = time.perf_counter(); f(); times[k].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    line = f"{cell} T={T} N={N} I={I} H={H}: " + "  ".join(f"{k} {med[k]:.2f} ms (err {errs[k]:.0e})" for k in sides)
    line += f"  | training: bf16-proj vs tvmrnn fp32 {med['train tvmrnn fp32']/med['train tvmrnn bf16-proj']:.2f}x, vs torch fp32 {med['train torch fp32']/med['train tvmrnn bf16-proj']:.2f}x, vs torch bf16 {med['train torch bf16']/med['train tvmrnn bf16-proj']:.2f}x"
    line += f"  | inference: bf16-proj vs tvmrnn fp32 {med['tvmrnn fp32']/med['tvmrnn bf16-proj']:.2f}x, vs torch fp32 {med['torch fp32']/med['tvmrnn bf16-proj']:.2f}x, vs torch bf16 {med['torch bf16 autocast']/med['tvmrnn bf16-proj']:.2f}x"
    print(line, flush=True)
    rows.append(dict(cell=cell, T=T, N=N, I=I, H=H, ms=med, rel_error=errs))
json.dump(rows, open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/bench_bf16.json", "w"), indent=1)
