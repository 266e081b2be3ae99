# v67: the backward pass's arrays (inputs, outputs, workspace) after one call, fused rows off and on, compared
import os, warnings; warnings.simplefilter("ignore")
import numpy as np, torch, tvm, tvmrnn
from tvmrnn.schedules import cpu
torch.manual_seed(0)
ref = torch.nn.GRU(1, 1, bidirectional=True).double()
params = tvmrnn.params_from_torch(ref)
got = {}
for fused in (False, True):
    cpu.CPU_FUSED_ROW_TILES = fused
    rnn = tvmrnn.build("gru", 1, 1, batch_size=1, bidirectional=True, cache=False)
    orig = rnn._run
    def run(program, frame, T, arrays, results=(), kept=(), fused=fused, orig=orig):
        orig(program, frame, T, arrays, results, kept)
        if program == "backward":
            got[fused] = {k: np.array(v.numpy() if hasattr(v, "numpy") else v).copy() for k, v in arrays.items()}
    rnn._run = run
    w = rnn.pack_weights({k: v.astype(np.float32) for k, v in params.items()})
    x = np.full((1, 1, 1), 0.7, np.float32)
    y, hy, _, ws = rnn.forward_train(w, x)
    dy = np.full((1, 1, 2), 0.3, np.float32); dhy = np.array([[[0.2]], [[0.9]]], np.float32)
    g = rnn.backward(w, ws, dy, dhy)
for k in got[False]:
    a, b = got[False][k], got[True][k]
    print(k, a.shape, "same" if np.array_equal(a, b) else f"DIFF\n {a.ravel()}\n {b.ravel()}")
