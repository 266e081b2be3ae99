#!/usr/bin/env bash
# The next session's GPU calls (v60 runbook), each under the 600 s call limit:
#   bash notes/bench/v60/gpu_next.sh tests   # the full CUDA file (~6 min)
#   bash notes/bench/v60/gpu_next.sh sweeps  # against cuDNN, ratios and absolute times (~8 min)
#   bash notes/bench/v60/gpu_next.sh chunks  # the chunk ladder at more shapes, N=1 and DS2 2-layer builds (~5 min)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests)
    timeout 560 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -30 | tee $OUT/test_cuda.txt ;;
sweeps)
    timeout 290 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_batches.json --max-seconds 1 \
        --json $OUT/sweep_batches.json 2>&1 | grep -v Warn | tee $OUT/sweep_batches.txt | tail -14
    timeout 260 python3 -m tvmrnn.cli.bench --device cuda --sweep notes/bench/v45/floor.json --max-seconds 1 \
        --json $OUT/floor.json 2>&1 | grep -v Warn | tee $OUT/floor.txt | tail -14 ;;
chunks)
    # below 64 rows (default 256, 32, 4, 1): the wide ladder as the candidate ("faster": widen the rule)
    timeout 380 python3 notes/bench/v60/options_ab.py '{"chunk_steps": [256, 128, 64, 32, 4, 1]}' \
        lstm:1:256:256:100 gru:8:512:512:150 lstm:32:512:512:200 lstm:20:800:800:120 \
        2>&1 | grep -v Warn | tee $OUT/chunks_ab_narrow.txt
    # at 64+ rows (default wide): the four sizes as the candidate ("faster": the v60 rule loses there)
    timeout 180 python3 notes/bench/v60/options_ab.py '{"chunk_steps": [256, 32, 4, 1]}' \
        lstm:256:256:256:100 gru:64:512:512:150 2>&1 | grep -v Warn | tee $OUT/chunks_ab_wide.txt ;;
*) echo "usage: $0 tests|sweeps|chunks"; exit 2 ;;
esac
