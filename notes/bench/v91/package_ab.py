"""Two packages of one configuration (``tvmrnn-export``: the same sizes, two versions of tvmrnn),
and PyTorch in bf16, timed in one process on the same inputs, calls in turn (each after one
untimed call of the same side, as tvmrnn-bench's ``interleaved``): medians and ratios, inference
and training. Checks that the two packages agree bit for bit (and against PyTorch's fp32).

    TVM_NUM_THREADS=16 python notes/bench/v91/package_ab.py OLD.so NEW.so [REPS]

Made for v91's A/B of the bf16 step's state rounding (issue 39) on the Xeon: packages exported
on the dev VM for ``{"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16}`` with
``--options '{"bf16_projections": true}'`` (fp32 inputs and outputs, the bf16 kernels)."""
import os
import statistics
import sys
import time

threads = int(os.environ.setdefault("TVM_NUM_THREADS", str(os.cpu_count())))
import torch  # noqa: E402

torch.set_num_threads(threads)
import tvmrnn  # noqa: E402

paths, reps = sys.argv[1:3], int(sys.argv[3]) if len(sys.argv) > 3 else 20
rnns = [tvmrnn.load(p) for p in paths]
c = rnns[0].config
T, N, I, H, L, bi = 300, c.batch_size, c.input_size, c.hidden_size, c.num_layers, c.bidirectional
cell = c.cell.name
torch.manual_seed(0)
ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H, num_layers=L, bidirectional=bi)
ws = [r.pack_weights(tvmrnn.params_from_torch(ref)) for r in rnns]
x = torch.randn(T, N, I)
dy = torch.randn(T, N, H * (2 if bi else 1))
ref_bf16 = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H, num_layers=L, bidirectional=bi)
ref_bf16.load_state_dict(ref.state_dict())
ref_bf16 = ref_bf16.bfloat16()
x_bf16 = x.bfloat16()


def rel(a, b):
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).norm() / b.norm())


with torch.no_grad():
    ys = [r.forward(w, x)[0] for r, w in zip(rnns, ws)]
    y_ref = ref(x)[0]
same = torch.equal(torch.as_tensor(ys[0]), torch.as_tensor(ys[1]))
print(f"{cell} L={L} {'bi' if bi else 'uni'} T={T} N={N} I={I} H={H}, {threads} threads: outputs the same bits: {same}; "
      f"rel err vs fp32 PyTorch {rel(ys[0], y_ref):.1e} / {rel(ys[1], y_ref):.1e}", flush=True)


def run(sides: dict, reps: int) -> dict:
    times = {k: [] for k in sides}
    for fn in sides.values():
        fn()
    for i in range(reps):
        order = list(sides) if i % 2 == 0 else list(sides)[::-1]
        for k in order:
            sides[k]()  # lead-in
            t0 = time.perf_counter()
            sides[k]()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


with torch.no_grad():
    inf = run({"old": lambda: rnns[0].forward(ws[0], x), "new": lambda: rnns[1].forward(ws[1], x),
               "torch_bf16": lambda: ref_bf16(x_bf16)}, reps)


def train(i):
    def f():
        *_, wsp = rnns[i].forward_train(ws[i], x)
        return rnns[i].backward(ws[i], wsp, dy)
    return f


xr = x_bf16.clone().requires_grad_(True)


def torch_train():
    ref_bf16.zero_grad(set_to_none=True)
    xr.grad = None
    ref_bf16(xr)[0].backward(dy.bfloat16())


tr = run({"old": train(0), "new": train(1), "torch_bf16": torch_train}, max(3, reps // 3))
for name, t in (("inference", inf), ("training", tr)):
    print(f"  {name:9s} ms: old {1e3 * t['old']:8.2f}  new {1e3 * t['new']:8.2f}  torch bf16 {1e3 * t['torch_bf16']:8.2f}"
          f"   new/old speed {t['old'] / t['new']:.2f}x   vs torch bf16: old {t['torch_bf16'] / t['old']:.2f}x "
          f"new {t['torch_bf16'] / t['new']:.2f}x", flush=True)
