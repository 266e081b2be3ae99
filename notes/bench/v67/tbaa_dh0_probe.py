# v67: the fused-rows dh0 repro built with TGT (extra target keys, e.g. {"opt-level":0} or
# {"cl-opt":["-enable-tbaa:bool=false"]}) and T steps; prints dh0 against torch.nn
import os, warnings; warnings.simplefilter("ignore")
import numpy as np, torch, tvm, tvmrnn
from tvmrnn.schedules import cpu
from tvmrnn.device import host_target
cpu.CPU_FUSED_ROW_TILES = os.environ.get("FUSED", "1") == "1"
torch.manual_seed(0)
ref = torch.nn.GRU(1, 1, bidirectional=True).double()
params = tvmrnn.params_from_torch(ref)
t = dict(host_target().export()); t.update(eval(os.environ.get("TGT", "{}")))
rnn = tvmrnn.build("gru", 1, 1, batch_size=1, bidirectional=True, cache=False, target=tvm.target.Target(t))
w = rnn.pack_weights({k: v.astype(np.float32) for k, v in params.items()})
T = int(os.environ.get("T", "1"))
x = np.full((T, 1, 1), 0.7, np.float32)
y, hy, _, ws = rnn.forward_train(w, x)
dy = np.full((T, 1, 2), 0.3, np.float32); dhy = np.array([[[0.2]], [[0.9]]], np.float32)
g = rnn.backward(w, ws, dy, dhy)
xt = torch.tensor(x, dtype=torch.float64, requires_grad=True); h0 = torch.zeros(2, 1, 1, dtype=torch.float64, requires_grad=True)
yr, hr = ref(xt, h0)
((yr * torch.tensor(dy).double()).sum() + (hr * torch.tensor(dhy).double()).sum()).backward()
print(os.environ.get("TGT"), "T", T, "dh0", g["h0"].ravel(), h0.grad.numpy().ravel(), "dx err", np.abs(g["x"].ravel()- xt.grad.numpy().ravel()).max())
