#!/usr/bin/env bash
# The next session's GPU calls (v71's runbook: v70's, plus the CUDA LSTMP), each under the 600 s limit:
#   bash notes/bench/v71/gpu_run.sh tests     # the full CUDA file, now with test_projection_builds_match_torch_on_cuda
#                                             #   (3 more tests; v70: 237 passed in 6:46 at -n 14)
#   bash notes/bench/v71/gpu_run.sh lstmp     # CUDA LSTMP builds (refusal patched) against cuDNN's LSTMP, and the
#                                             #   drop-in's layer-by-layer path on the GPU for comparison
#   then v70's: xeonodd, xeonab, xeon13, xeon (bash notes/bench/v70/gpu_run.sh MODE), and
#   bash notes/bench/v71/gpu_run.sh xeonlstmp # scripts/configs/sweep_lstmp.json on the Xeon (16 threads)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests)
    timeout ${2:-570} python3 -m pytest -v -n 14 -p no:cacheprovider --durations=20 tests/test_cuda.py > $OUT/test_cuda.txt 2>&1
    grep -c PASSED $OUT/test_cuda.txt; grep -E "FAILED|ERROR" $OUT/test_cuda.txt | head; tail -3 $OUT/test_cuda.txt ;;
lstmp)
    python3 scripts/check_kernels.py lstm 96 5 --proj-size 40 2>&1 | tail -5 | tee $OUT/check_kernels_lstmp.txt
    for a in "-T 100 -N 16 --input-size 512 --hidden-size 1024 --proj-size 256" \
             "-T 200 -N 64 --input-size 320 --hidden-size 1280 --proj-size 320" \
             "-T 50 -N 4 --input-size 128 --hidden-size 512 --proj-size 64 --num-layers 2 --bidirectional"; do
        echo "== $a"; timeout 170 python3 notes/bench/v71/gpu_lstmp.py lstm --device cuda $a --reps 10 2>&1 | grep -v Warn
    done | tee $OUT/gpu_lstmp.txt ;;
xeonlstmp)
    timeout ${2:-560} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep scripts/configs/sweep_lstmp.json \
        --reps 5 --max-seconds 2 --json $OUT/xeon_lstmp.json 2>&1 | grep -v Warn | tee $OUT/xeon_lstmp.txt ;;
*) bash notes/bench/v70/gpu_run.sh "$@" ;;
esac
