"""Drop-in inference under torch.no_grad on the GPU (DS2, 1 layer): tvmrnn vs cuDNN, interleaved;
and the same call with grad on (the training forward), which no_grad calls ran before v47."""
import statistics, time, torch, tvmrnn.torch as tt
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
for cell in ("lstm", "gru"):
    torch.manual_seed(0)
    ref = getattr(torch.nn, cell.upper())(800, 800).cuda()
    ours = getattr(tt, cell.upper())(800, 800).cuda(); ours.load_state_dict(ref.state_dict())
    x = torch.randn(300, 20, 800, device="cuda")
    with torch.no_grad():
        ours(x); ref(x)
    ours(x)
    ts = {"tvmrnn no_grad": [], "cuDNN no_grad": [], "tvmrnn grad on (forward only)": []}
    for _ in range(15):
        for name in ts:
            torch.cuda.synchronize(); t0 = time.perf_counter()
            if name == "tvmrnn grad on (forward only)":
                y = ours(x)[0]
            else:
                with torch.no_grad():
                    y = (ours if name.startswith("tvmrnn") else ref)(x)[0]
            torch.cuda.synchronize(); ts[name].append(time.perf_counter() - t0)
            del y
    med = {k: statistics.median(v) * 1e3 for k, v in ts.items()}
    with torch.no_grad():
        err = ((ours(x)[0] - ref(x)[0]).norm() / ref(x)[0].norm()).item()
    print(cell, {k: f"{v:.2f} ms" for k, v in med.items()}, f"no_grad vs cuDNN {med['cuDNN no_grad'] / med['tvmrnn no_grad']:.2f}x, rel err {err:.1e}", flush=True)
