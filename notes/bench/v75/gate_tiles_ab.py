"""v75: a GRU built with cpu.CPU_GUARDED_GATE_TILES off (0) or on (1), timed alone (one process a
setting: the kernels' names do not say the tile, so one process would reuse the first schedule),
medians of 7 forward and of 7 training calls (forward_train + backward), errors against torch.nn
in float64. AVX2=1 builds for znver3 (AVX2 code).

    TVMRNN_CACHE=off python notes/bench/v75/gate_tiles_ab.py gru N H LAYERS 0|1 [T]
"""
import statistics, sys, time, warnings
import numpy as np, torch
import tvmrnn
from tvmrnn.schedules import cpu
warnings.simplefilter("ignore")
cell = sys.argv[1]; N, H, L = map(int, sys.argv[2:5]); on = sys.argv[5] == "1"; T = int(sys.argv[6]) if len(sys.argv) > 6 else 50
cpu.CPU_GUARDED_GATE_TILES = on
torch.manual_seed(0)
module = getattr(torch.nn, cell.upper())(H, H, L).double()
params = tvmrnn.params_from_torch(module)
rng = np.random.default_rng(0)
x = rng.standard_normal((T, N, H)).astype(np.float32); dy = rng.standard_normal((T, N, H)).astype(np.float32)
t0 = time.time(); import os; tgt = {"kind": "llvm", "mcpu": "znver3", "num-cores": 2} if os.environ.get("AVX2") else None
rnn = tvmrnn.build(cell, H, H, num_layers=L, batch_size=N, cache=False, target=tgt); tb = time.time() - t0
w = rnn.pack_weights({k: np.asarray(v, dtype=np.float32) for k, v in params.items()} if isinstance(params, dict) else params)
ti, tt = [], []
for _ in range(7):
    t0 = time.perf_counter(); y = rnn.forward(w, x)[0]; ti.append(time.perf_counter() - t0)
    t0 = time.perf_counter(); out = rnn.forward_train(w, x); g = rnn.backward(w, out[-1], dy); tt.append(time.perf_counter() - t0)
xt = torch.from_numpy(x).double().requires_grad_()
yr = module(xt)[0]; yr.backward(torch.from_numpy(dy).double())
err = np.abs(np.asarray(y) - yr.detach().numpy()).max()
gerr = np.abs(np.asarray(g["x"] if "x" in g else g["dx"]) - xt.grad.numpy()).max() if ("x" in g or "dx" in g) else float("nan")
print(f"{cell} N={N} H={H} L={L} gate-guarded={on}: build {tb:.1f}s inference {statistics.median(ti)*1e3:.2f} ms training {statistics.median(tt)*1e3:.2f} ms  y err {err:.1e} dx err {gerr:.1e} grads {sorted(g)[:4]}", flush=True)
