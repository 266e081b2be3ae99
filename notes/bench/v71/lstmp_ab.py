"""v71: tvmrnn.torch.LSTM(proj_size=P) on a CPU, fused (the LSTMP build: the step on the P-wide
state, then its projection) against v70's layer-by-layer reformulation (a plain LSTM build on
W_hh W_hr, H / P times the recurrent work; forced here by patching _fused_projections) and
torch.nn.LSTM, in one process on the same inputs, calls in turn (round robin), medians.

    python notes/bench/v71/lstmp_ab.py T N I H P [L] [bi]
"""
import sys, time, warnings, numpy as np, torch
warnings.simplefilter("ignore")
import tvmrnn.torch as tt
T, N, I, H, P = map(int, sys.argv[1:6])
L = int(sys.argv[6]) if len(sys.argv) > 6 else 1
bi = len(sys.argv) > 7 and sys.argv[7] == "bi"
torch.set_num_threads(2)
torch.manual_seed(0)
ref = torch.nn.LSTM(I, H, num_layers=L, bidirectional=bi, proj_size=P)
fused = tt.LSTM(I, H, num_layers=L, bidirectional=bi, proj_size=P)
old = tt.LSTM(I, H, num_layers=L, bidirectional=bi, proj_size=P)
old._fused_projections = lambda device: False  # v70's path
for m in (fused, old):
    m.load_state_dict(ref.state_dict())
x = torch.randn(T, N, I)
xr = x.clone().requires_grad_(True)
sides = {"fused": fused, "v70": old, "torch": ref}
with torch.no_grad():
    outs = {k: m(x)[0] for k, m in sides.items()}
print("max |diff| vs torch:", {k: float((o - outs["torch"]).abs().max()) for k, o in outs.items() if k != "torch"})


def infer(m):
    with torch.no_grad():
        m(x)


def train(m):
    m.zero_grad(set_to_none=True)
    xr.grad = None
    m(xr)[0].sum().backward()


for name, fn, reps in (("inference", infer, 11), ("training", train, 7)):
    times = {k: [] for k in sides}
    for k, m in sides.items():
        fn(m)  # warm-up
    for _ in range(reps):
        for k, m in sides.items():
            fn(m)  # lead-in
            t0 = time.perf_counter()
            fn(m)
            times[k].append(time.perf_counter() - t0)
    med = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    print(f"LSTM T={T} N={N} I={I} H={H} P={P} L={L}{' bi' if bi else ''} {name}: " +
          ", ".join(f"{k} {v:.2f} ms" for k, v in med.items()) +
          f"; fused / torch {med['torch'] / med['fused']:.2f}x, v70 / torch {med['torch'] / med['v70']:.2f}x",
          flush=True)
