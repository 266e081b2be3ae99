"""GPU: tvmrnn dtype=float16/bfloat16 builds against cuDNN in the same dtype (module.to(dtype)), and fp32 both; interleaved."""
import sys, time, json, torch, tvmrnn, warnings, numpy as np
warnings.simplefilter("ignore")
torch.backends.cuda.matmul.allow_tf32 = False; torch.backends.cudnn.allow_tf32 = False
out = sys.argv[1]
rows = []
for cell, T, N, I, H in [("lstm", 300, 20, 800, 800), ("gru", 300, 20, 800, 800), ("lstm", 100, 64, 1024, 1024)]:
    torch.manual_seed(0)
    ref = getattr(torch.nn, cell.upper())(I, H).cuda()
    sides, errs = {}, {}
    x32 = torch.randn(T, N, I, device="cuda"); dy32 = torch.randn(T, N, H, device="cuda")
    y64 = ref.double()(x32.double())[0].float(); ref.float()
    for dt in ("float32", "float16", "bfloat16"):
        tdt = getattr(torch, dt)
        rnn = tvmrnn.build(cell, I, H, batch_size=N, target="cuda", dtype=dt)
        w = rnn.pack_weights(dict(ref.state_dict()))
        x, dy = x32.to(tdt), dy32.to(tdt)
        m = getattr(torch.nn, cell.upper())(I, H).cuda().to(tdt); m.load_state_dict(ref.state_dict())
        xg = x.clone().requires_grad_()
        def tv_inf(rnn=rnn, w=w, x=x): return rnn.forward(w, x)[0]
        def tv_train(rnn=rnn, w=w, x=x, dy=dy):
            y, _, _, ws = rnn.forward_train(w, x); return rnn.backward(w, ws, dy)["x"]
        def cu_inf(m=m, x=x):
            with torch.no_grad(): return m(x)[0]
        def cu_train(m=m, xg=xg, dy=dy):
            y = m(xg)[0]; return torch.autograd.grad(y, xg, dy)[0]
        sides.update({f"tvmrnn {dt} inf": tv_inf, f"cudnn {dt} inf": cu_inf, f"tvmrnn {dt} train": tv_train, f"cudnn {dt} train": cu_train})
        errs[f"tvmrnn {dt}"] = float((tv_inf().float() - y64).norm() / y64.norm()); errs[f"cudnn {dt}"] = float((cu_inf().float() - y64).norm() / y64.norm())
    times = {k: [] for k in sides}
    for r in range(7):
        for k, f in sides.items():
            f(); torch.cuda.synchronize(); t = time.perf_counter(); f(); torch.cuda.synchronize(); times[k].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    line = f"{cell} T={T} N={N} H={H}:"
    for dt in ("float32", "float16", "bfloat16"):
        for p in ("inf", "train"):
            line += f" {dt} {p} {med[f'tvmrnn {dt} {p}']:.2f}/{med[f'cudnn {dt} {p}']:.2f} ms ({med[f'cudnn {dt} {p}']/med[f'tvmrnn {dt} {p}']:.2f}x);"
    line += " errs " + " ".join(f"{k} {v:.1e}" for k, v in errs.items())
    print(line, flush=True)
    rows.append(dict(cell=cell, T=T, N=N, I=I, H=H, ms=med, rel_error_vs_float64=errs))
json.dump(rows, open(out, "w"), indent=1)
