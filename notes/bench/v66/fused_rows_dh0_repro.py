import numpy as np, torch, tvmrnn, warnings, sys, os
warnings.simplefilter("ignore")
import os
from tvmrnn.schedules import cpu
cpu.CPU_FUSED_ROW_TILES = os.environ.get("FUSED", "1") == "1"
torch.manual_seed(0)
ref = torch.nn.GRU(1, 1, bidirectional=True).double()
params = tvmrnn.params_from_torch(ref)
for packaged in (False, True):
    rnn = tvmrnn.build("gru", 1, 1, batch_size=1, bidirectional=True, cache=False)
    if packaged:
        rnn.export(os.path.join(os.environ.get("TMPDIR", "/tmp"), "fused_rows_repro.so")); rnn = tvmrnn.load(os.path.join(os.environ.get("TMPDIR", "/tmp"), "fused_rows_repro.so"))
    w = rnn.pack_weights({k: v.astype(np.float32) for k, v in params.items()})
    x = np.array([[[0.7]]], np.float32)
    y, hy, _, ws = rnn.forward_train(w, x)
    dy = np.array([[[0.3, -0.5]]], np.float32); dhy = np.array([[[0.2]], [[0.9]]], np.float32)
    g = rnn.backward(w, ws, dy, dhy)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True); h0 = torch.zeros(2, 1, 1, dtype=torch.float64, requires_grad=True)
    yr, hr = ref(xt, h0)
    ((yr * torch.tensor(dy).double()).sum() + (hr * torch.tensor(dhy).double()).sum()).backward()
    print(packaged, "dh0", g["h0"].ravel(), h0.grad.numpy().ravel(), "dx", g["x"].ravel(), xt.grad.numpy().ravel())
