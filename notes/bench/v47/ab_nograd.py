import time, statistics, torch, tvmrnn.torch as tt
torch.manual_seed(0)
for cell in ("lstm", "gru"):
    m = getattr(tt, cell.upper())(512, 512)
    ref = getattr(torch.nn, cell.upper())(512, 512); ref.load_state_dict(m.state_dict())
    x = torch.randn(50, 20, 512)
    with torch.no_grad():
        m(x)
    m(x)
    ts = {"no_grad": [], "grad (training forward)": [], "torch.nn no_grad": []}
    for _ in range(15):
        with torch.no_grad():
            t0 = time.perf_counter(); m(x); ts["no_grad"].append(time.perf_counter() - t0)
            t0 = time.perf_counter(); ref(x); ts["torch.nn no_grad"].append(time.perf_counter() - t0)
        t0 = time.perf_counter(); y = m(x)[0]; ts["grad (training forward)"].append(time.perf_counter() - t0)
        del y
    print(cell, {k: round(statistics.median(v) * 1e3, 2) for k, v in ts.items()})
