"""The bf16 LSTM at DS2 sizes, forward, real weights, with BuildOptions given as JSON; one process."""
import sys, time, statistics, json
import torch, tvmrnn
opts = json.loads(sys.argv[1]); dtype = sys.argv[2] if len(sys.argv) > 2 else "bfloat16"
torch.manual_seed(0)
mod = torch.nn.LSTM(800, 800)
rnn = tvmrnn.build("lstm", 800, 800, batch_size=20, dtype=dtype, options=tvmrnn.BuildOptions(**opts))
w = rnn.pack_weights(tvmrnn.params_from_torch(mod))
x = torch.randn(300, 20, 800).to(getattr(torch, dtype))
for _ in range(3): rnn.forward(w, x)
ts = []
for _ in range(15):
    t0 = time.perf_counter(); rnn.forward(w, x); ts.append(time.perf_counter() - t0)
m = mod.to(torch.bfloat16) if dtype == "bfloat16" else mod
with torch.no_grad():
    for _ in range(2): m(x)
    tt = []
    for _ in range(7):
        t0 = time.perf_counter(); m(x); tt.append(time.perf_counter() - t0)
print(f"{dtype} {opts}: tvmrnn forward T=300 {1e3*statistics.median(ts):.2f} ms; torch {1e3*statistics.median(tt):.2f} ms; ratio {statistics.median(tt)/statistics.median(ts):.2f}x", flush=True)
