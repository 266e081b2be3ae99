#!/usr/bin/env bash
# The next session's GPU calls (v72's runbook), each under the 600 s limit:
#   bash notes/bench/v72/gpu_run.sh tests      # the full CUDA file (v72: 232 passed in 500 s at -n 14, 8 left)
#   bash notes/bench/v72/gpu_run.sh rest       # the tests v72's 500 s did not reach or finish
#   bash notes/bench/v72/gpu_run.sh lstmp      # check_kernels and the CUDA LSTMP against cuDNN (now unpatched)
#   then v70's Xeon modes: xeonodd, xeonab, xeon13, xeon (bash notes/bench/v70/gpu_run.sh MODE), and
#   bash notes/bench/v71/gpu_run.sh xeonlstmp  # scripts/configs/sweep_lstmp.json on the Xeon (16 threads)
#   bash notes/bench/v72/gpu_run.sh xeonpacked # the chunk GEMMs' ended-row skip on the Xeon (16 threads)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests)
    timeout ${2:-520} python3 -m pytest -v -n 14 -p no:cacheprovider --durations=20 tests/test_cuda.py > $OUT/test_cuda.txt 2>&1
    grep -c PASSED $OUT/test_cuda.txt; grep -E "FAILED|ERROR" $OUT/test_cuda.txt | head; tail -3 $OUT/test_cuda.txt ;;
rest)
    timeout ${2:-520} python3 -m pytest -v -n 8 -p no:cacheprovider tests/test_cuda.py -k \
        "fuzzed or half_operands or kernels_per_call_site or ddp or bench or profile or tune" > $OUT/test_cuda_rest.txt 2>&1
    grep -E "PASSED|FAILED|ERROR|passed|failed" $OUT/test_cuda_rest.txt | tail -20 ;;
lstmp)
    python3 scripts/check_kernels.py lstm 96 5 --proj-size 40 2>&1 | tail -3 | tee $OUT/check_kernels_lstmp.txt
    for a in "-T 100 -N 16 --input-size 512 --hidden-size 1024 --proj-size 256" \
             "-T 200 -N 64 --input-size 320 --hidden-size 1280 --proj-size 320" \
             "-T 300 -N 20 --input-size 800 --hidden-size 800 --proj-size 400 --num-layers 2 --bidirectional"; do
        echo "== $a"; timeout 170 python3 -m tvmrnn.cli.bench lstm --device cuda $a --reps 10 2>&1 | grep -v Warn
    done | tee $OUT/gpu_lstmp.txt ;;
xeonpacked)
    for a in "lstm -H 800 -I 800 --reps 7" "gru -H 800 -I 800 --reps 7" "lstm -N 64 -H 512 --reps 7"; do
        OMP_NUM_THREADS=16 timeout 170 python3 notes/bench/v72/skip_ended_ab.py $a 2>&1 | grep -v Warn | tail -4
    done | tee $OUT/xeon_skip_ended.txt ;;
*) bash notes/bench/v71/gpu_run.sh "$@" ;;
esac
