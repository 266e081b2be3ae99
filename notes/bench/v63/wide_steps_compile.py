"""Compile sweep (v63): every launched split-K step kernel that takes 8 columns a thread by
default (``split_k.default_thread_columns``) at odd sizes, through the builds' own pipeline and
NVCC (sm_90), looking for a shape the default cannot build. Runs nothing on a GPU.

    python notes/bench/v63/wide_steps_compile.py > notes/bench/v63/wide_steps_compile.txt
"""
import itertools
import time
import warnings

import tvm
from tvm import s_tir

from tvmrnn import kernels
from tvmrnn.cells.definition import CELLS
from tvmrnn.program.sequence import compile_module
from tvmrnn.schedules import default_schedule, knobs, split_k

warnings.simplefilter("ignore")
target = tvm.target.Target({"kind": "cuda", "arch": "sm_90", "host": "llvm"})
failed = built = 0
t0 = time.time()
for cell, batch, hidden, directions, masked in itertools.product(
        ("lstm", "gru", "rnn_tanh"), (1, 3, 7, 20, 33, 100, 127), (2048, 2050, 2304, 3001),
        (1, 2), (False, True)):
    c = CELLS[cell]
    ks = [kernels.recurrent_step(c, batch, hidden, train, directions=directions, masked=masked) for train in (False, True)]
    ks.append(kernels.backward_step(c, batch, hidden, directions=directions, masked=masked))
    for k in ks:
        if knobs.family(k, target) != "split_k":
            continue
        sch = s_tir.Schedule(s_tir.renew_defs(k.func))
        if split_k.default_thread_columns(sch, k, sch.get_sblock(k.gemm)) != 8:
            continue
        try:
            compile_module(tvm.IRModule({"main": default_schedule(k, target)}), target)
            built += 1
        except Exception as err:  # noqa: BLE001 (a study: every failure listed)
            failed += 1
            print(f"FAILED {k.name} directions={directions} masked={masked}: {str(err).splitlines()[-1][:160]}", flush=True)
print(f"{built} built, {failed} failed, {time.time() - t0:.0f} s")
