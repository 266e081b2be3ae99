"""bf16 (AMX) and fp32 LSTM DS2-size forward at a given thread count, real weights, one process."""
import sys, time, statistics
import torch, tvmrnn
threads, dtype = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
mod = torch.nn.LSTM(800, 800)
rnn = tvmrnn.build("lstm", 800, 800, batch_size=20, dtype=dtype, options=tvmrnn.BuildOptions(threads=threads))
w = rnn.pack_weights(tvmrnn.params_from_torch(mod))
x = torch.randn(300, 20, 800).to(torch.bfloat16 if dtype == "bfloat16" else torch.float32)
for _ in range(3): rnn.forward(w, x)
ts = []
for _ in range(15):
    t0 = time.perf_counter(); rnn.forward(w, x); ts.append(time.perf_counter() - t0)
print(f"{dtype} threads={threads}: forward T=300 {1e3*statistics.median(ts):.2f} ms (min {1e3*min(ts):.2f})", flush=True)
