#!/usr/bin/env bash
# The next session's GPU calls (v59 runbook), each under the 600 s call limit:
#   bash notes/bench/v59/gpu_next.sh tests   # the full CUDA file (~7 min)
#   bash notes/bench/v59/gpu_next.sh ab      # this session's forms at more shapes (~5 min)
#   bash notes/bench/v59/gpu_next.sh sweeps  # against cuDNN, before/after in notes/bench/v59 (~8 min)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests)
    timeout 560 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -30 | tee $OUT/test_cuda.txt ;;
ab)
    # the unit-splitting form at other H (forward default) and in backward steps (a knob)
    timeout 250 python3 notes/bench/v58/gate_ab.py lstm:96:128:128:100 gru:128:144:144:100 lstm:128:160:160:100 \
        2>&1 | grep -v Warning | tee $OUT/unit_gate_ab3.txt
    timeout 300 python3 notes/bench/v58/gate_ab.py --backward lstm:128:128:128:200 gru:128:160:160:100 \
        lstm:128:200:200:100 2>&1 | grep -v Warning | tee $OUT/unit_gate_backward_ab.txt ;;
sweeps)
    timeout 290 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_batches.json --max-seconds 1 \
        2>&1 | grep -v Warn | tail -14 | tee $OUT/sweep_batches.txt
    timeout 260 python3 -m tvmrnn.cli.bench --device cuda --sweep notes/bench/v45/floor.json --max-seconds 1 \
        2>&1 | grep -v Warn | tail -14 | tee $OUT/floor.txt ;;
*) echo "usage: $0 tests|ab|sweeps"; exit 2 ;;
esac
