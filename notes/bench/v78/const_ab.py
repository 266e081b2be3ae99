"""v78: A/B of module constants on the GPU (FLAG=module.NAME, OLD and NEW as Python literals, OLD=None
the current value; default: common.GPU_BACKWARD_PERSISTENT_WORK -> 2^31, the backward's split-K
steps persistent at any step's work; or SWITCHES="mod.NAME=old:new;..." for several at once;
NEW_OPTIONS: a dict of build options for the new side). Each shape ``cell:N:H:I:T[:L][:bi]`` is built both ways in one process; both
builds' outputs and gradients compared on the same inputs; inference and training passes timed in
turn (``pass_tuning.compare``, 11 pairs, medians); cuDNN's passes (fp32, TF32 off) timed after.

    FLAG=tvmrnn.schedules.common.GPU_BACKWARD_PERSISTENT_WORK OLD=16777216 NEW=2147483648 \
        python notes/bench/v78/const_ab.py lstm:57:645:161:200 lstm:20:800:800:200
"""
import ast
import importlib
import importlib.util
import os
import statistics
import sys
import time
import warnings

import numpy as np
import torch

import tvmrnn
from tvmrnn.runtime import pass_tuning

here = os.path.dirname(__file__)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(here, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rules_ab = _load("rules_ab", "../v57/rules_ab.py")
row_groups_ab = _load("row_groups_ab", "../v76/row_groups_ab.py")


def cudnn_ms(cell, N, H, I, T, L, bi):
    ref = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[cell](I, H, num_layers=L, bidirectional=bi).cuda()
    x = torch.randn(T, N, I, device="cuda", requires_grad=True)
    dy = torch.randn(T, N, H * (2 if bi else 1), device="cuda")
    out = {}
    for kind in ("inference", "training"):
        def call():
            if kind == "inference":
                with torch.no_grad():
                    ref(x)
            else:
                ref.zero_grad(set_to_none=True)
                x.grad = None
                ref(x)[0].backward(dy)
        call(); torch.cuda.synchronize()
        samples = []
        for _ in range(11):
            t0 = time.perf_counter(); call(); torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3)
        out[kind] = statistics.median(samples)
    return out


def main(shapes):
    warnings.simplefilter("ignore")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    # SWITCHES="mod.NAME=old:new;mod.NAME2=old:new" (several at once), else FLAG, OLD, NEW
    specs = os.environ.get("SWITCHES") or "{}={}:{}".format(
        os.environ.get("FLAG", "tvmrnn.schedules.common.GPU_BACKWARD_PERSISTENT_WORK"), os.environ.get("OLD", "None"),
        os.environ.get("NEW", "2147483648"))
    switches = []
    for spec in specs.split(";"):
        path, values = spec.split("=")
        module, name = path.rsplit(".", 1)
        module = importlib.import_module(module)
        old_s, new_s = values.split(":")
        old_v = getattr(module, name) if old_s == "None" else ast.literal_eval(old_s)
        switches.append((module, name, old_v, ast.literal_eval(new_s), getattr(module, name)))
    name = ",".join(s[1] for s in switches)
    old_v, new_v = [s[2] for s in switches], [s[3] for s in switches]
    new_options = ast.literal_eval(os.environ.get("NEW_OPTIONS", "None"))  # build options of the new side

    def setting(i):  # 2: as saved
        for module, attr, *values in switches:
            setattr(module, attr, values[i])
    for shape in shapes:
        cell, n, h, i, T, *rest = shape.split(":")
        n, h, T = int(n), int(h), int(T)
        L = int(rest[0]) if rest and rest[0].isdigit() else 1
        bi = "bi" in rest
        sizes = dict(input_size=int(i), hidden_size=h, batch_size=n, num_layers=L, target=os.environ.get("TARGET", "cuda"),
                     tuning_logs=False, cache=False, bidirectional=bi)
        t0 = time.perf_counter()
        try:
            setting(0)
            old = tvmrnn.build(cell, **sizes)
            setting(1)
            new = tvmrnn.build(cell, **sizes, options=new_options)
        except Exception as e:  # noqa: BLE001 (said, not fatal: the next shape runs)
            print(f"{shape}: build failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        finally:
            setting(2)
        steps = {k: sorted(s for s in rnn.schedules if "_persistent" in s) for k, rnn in (("old", old), ("new", new))}
        if os.environ.get("DRY"):
            print(shape, f"{time.perf_counter() - t0:.0f} s", steps, flush=True)
            continue
        if L == 1:
            ya, yb = row_groups_ab.outputs(old, cell, n, h, T), row_groups_ab.outputs(new, cell, n, h, T)
            y_err = float(np.abs(ya - yb).max() / max(np.abs(ya).max(), 1e-30))
            a, b = rules_ab.gradients(old, cell, n, h, T), rules_ab.gradients(new, cell, n, h, T)
            g_err = max(float(np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)) for k in a)
            agree = f"outputs agree to {y_err:.1e}, gradients to {g_err:.1e}; "
        else:
            agree = ""
        result = pass_tuning.compare(old, new, pass_tuning.PassTimer(T), pairs=11)
        theirs = cudnn_ms(cell, n, h, int(i), T, L, bi)
        ours = {k: p["candidate_ms"] for k, p in result.passes.items()}
        vs = ", ".join(f"{k} new {theirs[k] / ours[k]:.2f}x cuDNN ({theirs[k]:.3f} ms)" for k in ours if k in theirs)
        print(f"{shape} {name} {old_v} -> {new_v}{' options ' + str(new_options) if new_options else ''}: builds {time.perf_counter() - t0:.0f} s; blocks "
              f"{old.persistent_blocks} -> {new.persistent_blocks}; new steps {steps['new']}; {agree}{result.line()}; {vs}",
              flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
