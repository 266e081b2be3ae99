#!/usr/bin/env python3
"""Both directions of a bidirectional layer in one launch per step, against one after the other.

    python scripts/direction_study.py lstm gru --device cuda --num-layers 1 5

For each cell at Deep Speech 2 sizes (T=300, N=20, I=H=800) by default, builds a bidirectional RNN
twice: with the directions stacked (``tvmrnn.program.passes.stack_directions``, the GPU default: the step kernels
get a leading direction axis, one launch runs both), here kept per-step launches
(``TVMRNN_PERSIST_STACKED=0``), and with ``TVMRNN_STACK_DIRECTIONS=0`` (a time loop per direction).
Checks the builds agree and prints median inference and training-pass times. The unstacked build's
time loops in the passes of ``--persistent-passes`` (GPU; default both forwards, as
``TVMRNN_PERSISTENT=auto``) run as persistent kernels (``tvmrnn.device.PERSISTENT_PASSES``).
With ``--stacked-persistent`` (GPU) the stacked per-step build is compared with itself made persistent
(``TVMRNN_PERSIST_STACKED=1``, the default since v21: one launch runs both directions' loops, each
block on one direction's units, the hidden state staged in phases where it does not fit beside the
weights), for the inference forward alone (``TVMRNN_PERSISTENT=forward``) and for both forwards
(``auto``), instead of unstacked:

    python scripts/direction_study.py lstm gru --num-layers 1 --stacked-persistent --rounds 3
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main():
    from bench import study_parser
    p = study_parser(__doc__, reps=10)
    p.add_argument("--num-layers", type=int, nargs="+", default=[1])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--persistent-passes", default="forward,forward_train",
                   help="comma-separated passes whose one-direction time loops are persistent (GPU)")
    p.add_argument("--stacked-persistent", action="store_true",
                   help="compare stacked per-step launches with stacked persistent loops instead (GPU)")
    a = p.parse_args()
    if a.threads:
        os.environ["TVM_NUM_THREADS"] = str(a.threads)  # before TVM starts its thread pool
        import torch
        torch.set_num_threads(a.threads)
    from bench import compare_builds
    from tvmrnn import device as target
    default_passes = target.PERSISTENT_PASSES["auto"]

    def stacked(on, persist_stacked="0", mode="auto"):
        def setup():  # read by build through passes.stack_directions and target.persistent_passes
            os.environ["TVMRNN_STACK_DIRECTIONS"] = "1" if on else "0"
            os.environ["TVMRNN_PERSIST_STACKED"] = persist_stacked
            os.environ["TVMRNN_PERSISTENT"] = mode
            target.PERSISTENT_PASSES["auto"] = default_passes if on else tuple(a.persistent_passes.split(","))
        return setup

    variants = [("directions stacked (one launch per step)", stacked(True))]
    if a.stacked_persistent:
        variants += [("stacked, persistent inference forward", stacked(True, "1", "forward")),
                     ("stacked, persistent inference and training forwards", stacked(True, "1", "auto"))]
    else:
        variants += [("directions one after the other", stacked(False))]
    for layers in a.num_layers:
        print(f"-- {layers} bidirectional layer(s)", flush=True)
        compare_builds(a.cells, variants, device=a.device, T=a.T, N=a.N, hidden_size=a.hidden_size, reps=a.reps,
                       rounds=a.rounds, num_layers=layers, bidirectional=True)


if __name__ == "__main__":
    main()
