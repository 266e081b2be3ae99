#!/usr/bin/env bash
# This session's GPU calls (v62), each under the 600 s call limit:
#   bash notes/bench/v62/gpu_run.sh tests     # the full CUDA file with the tiled GEMM unrolled by NVCC
#   bash notes/bench/v62/gpu_run.sh ab        # large steps of 128 rows as launches against persistent split-K; ncu of the latter
#   bash notes/bench/v62/gpu_run.sh sweeps    # against cuDNN, with absolute times
# For the next session (v62's runbook):
#   bash notes/bench/v62/gpu_run.sh split     # large steps' tiled GEMM split over blocks (GPU_STEP_MATMUL_K_SLICES)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests)
    timeout 560 python3 -m pytest -q -n 12 -p no:cacheprovider --durations=15 tests/test_cuda.py 2>&1 | tail -45 | tee $OUT/test_cuda.txt ;;
ab)
    timeout 330 python3 notes/bench/v62/constants_ab.py tvmrnn.schedules.common.GPU_PERSISTENT_SPLIT_K_ROWS=128 \
        lstm:128:1024:1024:50 gru:128:1024:1024:50 lstm:128:768:768:50 2>&1 | grep -v Warn | tee $OUT/persistent_rows_ab.txt
    timeout 150 python3 scripts/ncu_pass.py lstm -T 50 -N 128 --hidden-size 1024 --kernels 12 --out $OUT/ncu_lstm_n128_h1024_forward \
        2>&1 | grep -v Warn | tail -40 | tee $OUT/ncu_forward.txt ;;
sweeps)
    timeout 290 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_large.json --max-seconds 1 \
        --json $OUT/sweep_large.json 2>&1 | grep -v Warn | tee $OUT/sweep_large.txt | tail -14
    timeout 270 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_batches.json --max-seconds 1 \
        --json $OUT/sweep_batches.json 2>&1 | grep -v Warn | tee $OUT/sweep_batches.txt | tail -14 ;;
split)  # the rule on, as is; then also backward steps under 2^18 outputs on the tiled GEMM (split)
    timeout 300 python3 notes/bench/v62/constants_ab.py 'tvmrnn.schedules.cuda.GPU_STEP_MATMUL_K_SLICES=true' \
        lstm:256:1024:1024:50 gru:256:2048:2048:50 gru:256:1024:1024:50 2>&1 | grep -v Warn | tee $OUT/split_ab.txt
    timeout 250 python3 notes/bench/v62/constants_ab.py \
        'tvmrnn.schedules.cuda.GPU_STEP_MATMUL_K_SLICES=true;tvmrnn.schedules.common.GPU_STEP_MATMUL_OUTPUTS=65536' \
        lstm:192:768:768:50 lstm:128:1024:1024:50 gru:128:1024:1024:50 2>&1 | grep -v Warn | tee $OUT/split_outputs_ab.txt ;;
*) echo "usage: $0 tests|ab|sweeps|split"; exit 2 ;;
esac
