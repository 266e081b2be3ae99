#!/usr/bin/env bash
# This session's GPU calls (v63), each under the 600 s call limit:
#   bash notes/bench/v63/gpu_run.sh tests     # the full CUDA file with v62's vector_k rule
#   bash notes/bench/v63/gpu_run.sh split     # large steps' tiled GEMM split over blocks (v62's GPU_STEP_MATMUL_K_SLICES)
#   bash notes/bench/v63/gpu_run.sh columns   # launched split-K steps with 8 output columns a thread
#   bash notes/bench/v63/gpu_run.sh sweeps    # against cuDNN, with absolute times
# For the next session (v63's runbook), in this order:
#   bash notes/bench/v63/gpu_run.sh tests     # the full CUDA file with v63's defaults (split on, 2^16, 8 columns)
#   bash notes/bench/v63/gpu_run.sh revert    # v63's defaults against v62's, and forward steps split too
#   bash notes/bench/v63/gpu_run.sh sweeps    # sweep_large, then sweep_batches
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests)
    timeout 560 python3 -m pytest -q -n 12 -p no:cacheprovider --durations=15 tests/test_cuda.py 2>&1 | tail -45 | tee $OUT/test_cuda.txt ;;
split)
    bash notes/bench/v62/gpu_run.sh split ;;
columns)
    # (run with v63's first commit's constant GPU_SPLIT_K_THREAD_COLUMNS=8; since then the rule's, and
    # 'tvmrnn.schedules.split_k.GPU_SPLIT_K_WIDE_UNITS=1000000' takes every step back to 4)
    timeout 560 python3 notes/bench/v62/constants_ab.py 'tvmrnn.schedules.split_k.GPU_SPLIT_K_WIDE_UNITS=1000000' \
        lstm:32:2048:2048:50 gru:64:2048:2048:50 lstm:16:1536:1536:50 gru:20:800:800:100 lstm:64:1024:1024:50 lstm:128:128:128:100 \
        2>&1 | grep -v Warn | tee $OUT/columns_ab.txt ;;
sweeps)
    bash notes/bench/v62/gpu_run.sh sweeps ;;
revert)  # as is (v63) -> v62's large-step constants; then forward steps split too (off by default)
    timeout 330 python3 notes/bench/v62/constants_ab.py \
        'tvmrnn.schedules.cuda.GPU_STEP_MATMUL_K_SLICES=false;tvmrnn.schedules.common.GPU_BACKWARD_STEP_MATMUL_OUTPUTS=262144' \
        lstm:256:1024:1024:50 gru:128:2048:2048:50 lstm:512:1024:1024:50 lstm:128:2048:2048:50 \
        2>&1 | grep --line-buffered -v Warn > $OUT/revert_ab.txt
    timeout 200 python3 notes/bench/v62/constants_ab.py 'tvmrnn.schedules.cuda.GPU_FORWARD_STEP_K_SLICES=true' \
        lstm:256:1024:1024:50 gru:256:2048:2048:50 2>&1 | grep --line-buffered -v Warn > $OUT/forward_split_ab.txt
    cat $OUT/revert_ab.txt $OUT/forward_split_ab.txt ;;
*) echo "usage: $0 tests|split|columns|sweeps|revert"; exit 2 ;;
esac
