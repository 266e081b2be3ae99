#!/usr/bin/env bash
# v73's GPU calls, each under the 600 s limit:
#   bash notes/bench/v73/gpu_run.sh packed    # DS2 packed vs padded vs cuDNN packed (bench_packed), and where the
#                                             #   packed step's GPU time goes (v47's packed_prof, LSTM)
#   bash notes/bench/v73/gpu_run.sh tests     # the full CUDA file
#   others: v72's runbook (bash notes/bench/v72/gpu_run.sh MODE)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
packed)
    timeout 300 python3 scripts/bench_packed.py --device cuda --reps 15 --json $OUT/bench_packed.json 2>&1 | grep -v Warn | tee $OUT/bench_packed.txt
    timeout 200 python3 notes/bench/v47/packed_prof.py lstm > $OUT/packed_prof_lstm.txt 2>&1; grep median $OUT/packed_prof_lstm.txt ;;
tests)
    timeout ${2:-520} python3 -m pytest -v -n 14 -p no:cacheprovider --durations=20 tests/test_cuda.py > $OUT/test_cuda.txt 2>&1
    grep -c PASSED $OUT/test_cuda.txt; grep -E "FAILED|ERROR" $OUT/test_cuda.txt | head; tail -3 $OUT/test_cuda.txt ;;
*) bash notes/bench/v72/gpu_run.sh "$@" ;;
esac
