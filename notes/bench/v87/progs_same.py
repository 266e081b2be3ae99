"""v87: hash the TIR of every pass of several builds (no compile): same programs before and after a refactor."""
import dataclasses, hashlib, sys, json
import tvmrnn
from tvmrnn.runtime import build as B
cases = [
    ("lstm", 13, 37, 3, False, 5, {"layer_wavefront": True}, None),
    ("gru", 13, 37, 2, False, 3, {"layer_wavefront": True, "variable_lengths": True}, None),
    ("peephole_lstm", 13, 37, 3, False, 4, {"layer_wavefront": True}, None),
    ("lstm", 13, 37, 2, True, 3, {}, None),
    ("lstm", 13, 37, 2, True, 3, {"variable_lengths": True}, None),
    ("gru", 16, 48, 3, False, 8, {}, "nvidia/nvidia-h100"),
    ("lstm", 16, 48, 3, False, 8, {"layer_wavefront": True}, "nvidia/nvidia-h100"),
    ("lstm", 16, 48, 2, True, 8, {}, "nvidia/nvidia-h100"),
]
from tvmrnn.cells import examples
out = {}
for cell, I, H, L, bi, N, opts, target in cases:
    c = examples.EXAMPLES.get(cell, cell) if hasattr(examples, "EXAMPLES") else cell
    captured = {}
    orig = B.compile_module
    def fake(module, target, _c=captured):
        _c["m"] = module
        raise KeyboardInterrupt
    B.compile_module = fake
    try:
        tvmrnn.build(c, I, H, num_layers=L, bidirectional=bi, batch_size=N, target=target,
                     options=tvmrnn.BuildOptions(**opts), cache=False, tuning_logs=False)
    except KeyboardInterrupt:
        pass
    B.compile_module = orig
    m = captured["m"]
    for gv, f in sorted(m.functions.items(), key=lambda kv: kv[0].name_hint):
        if gv.name_hint in ("forward", "forward_train", "backward"):
            out[f"{cell}/{L}/{bi}/{opts}/{target}/{gv.name_hint}"] = hashlib.sha1(f.script().encode()).hexdigest()[:12]
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(len(out))
