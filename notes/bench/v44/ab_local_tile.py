"""The fp32 input projection's tile local (v44) against global, A/B in one process: python3 ab_local_tile.py THREADS [cell:T:N:I:H,...]"""
import sys, time, numpy as np, torch, tvmrnn, tvmrnn.schedules.cpu, warnings
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
warnings.simplefilter("ignore")
shapes = [("lstm", 80, 160, 256, 384), ("lstm", 100, 20, 800, 800), ("gru", 100, 64, 256, 256)]
if len(sys.argv) > 2:  # cell:T:N:I:H,...
    shapes = [(c, *map(int, rest)) for c, *rest in (s.split(":") for s in sys.argv[2].split(","))]
for cell, T, N, I, H in shapes:
    ref = getattr(torch.nn, cell.upper())(I, H)
    p = {k: v.numpy() for k, v in ref.state_dict().items()}
    b = {}
    for v in ("0", "1"):
        tvmrnn.schedules.cpu.LOCAL_PROJECTION_TILE = v == "1"
        b[v] = tvmrnn.build(cell, I, H, batch_size=N, cache=False, tuning_logs=False)
    w = {v: r.pack_weights(p) for v, r in b.items()}
    x = np.random.randn(T, N, I).astype(np.float32); dy = np.random.randn(T, N, H).astype(np.float32)
    def inf(v): return b[v].forward(w[v], x)[0]
    def train(v):
        y, _, _, ws = b[v].forward_train(w[v], x); return b[v].backward(w[v], ws, dy)["x"]
    assert np.allclose(inf("0"), inf("1"), atol=1e-5)
    t = {k: [] for k in ("inf0", "inf1", "tr0", "tr1")}
    for r in range(7):
        for v in ("0", "1"):
            inf(v); s = time.perf_counter(); inf(v); t["inf" + v].append(time.perf_counter() - s)
            train(v); s = time.perf_counter(); train(v); t["tr" + v].append(time.perf_counter() - s)
    m = {k: np.median(v) * 1e3 for k, v in t.items()}
    print(f"{cell} T={T} N={N} I={I} H={H}: inference global {m['inf0']:.1f} local {m['inf1']:.1f} ms ({m['inf0']/m['inf1']:.3f}x); training {m['tr0']:.1f} / {m['tr1']:.1f} ({m['tr0']/m['tr1']:.3f}x)", flush=True)
