#!/usr/bin/env bash
# v74's GPU-machine calls, each under the 600 s limit:
#   bash notes/bench/v74/gpu_run.sh autocast   # the CUDA autocast test fixed in v74 (LSTMP stays fp32)
#   bash notes/bench/v74/gpu_run.sh xeonregion # time loops as one parallel region against a region a step,
#                                              #   on the Xeon's 16 cores (notes/bench/v73/region_ab.py)
#   bash notes/bench/v74/gpu_run.sh xeonlstm   # sweep.json's LSTM shapes on the Xeon with the v74 default
#   bash notes/bench/v74/gpu_run.sh xeonchunks # the backward's chunk gradients, A/B on the Xeon
#   others: v73's runbook (bash notes/bench/v73/gpu_run.sh MODE)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
autocast)
    timeout 200 python3 -m pytest -q -n 2 -p no:cacheprovider tests/test_cuda.py -k "autocast_returns_what_cudnn" 2>&1 | tail -3 | tee $OUT/test_cuda_autocast.txt ;;
xeonregion)
    lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon_lscpu.txt
    for a in "lstm 100 32 512 3 0" "lstm 60 1 96 1 0" "lstm 400 8 320 1 0" "lstm 150 48 640 1 0" "lstm 80 160 384 1 0" \
             "gru 100 32 512 3 0" "lstm 100 20 800 1 1" "gru 400 8 320 1 0"; do
        timeout 100 python3 notes/bench/v73/region_ab.py $a ${2:-9} 2>&1 | grep -v Warn
    done | tee $OUT/xeon_region_ab.txt ;;
xeonlstm)  # sweep.json's shapes, LSTM only, with v74's default (one region a time loop)
    timeout ${2:-300} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep notes/bench/v74/sweep_lstm.json \
        --reps 3 --max-seconds 1 --json $OUT/xeon_sweep_lstm.json 2>&1 | grep --line-buffered -v Warn > $OUT/xeon_sweep_lstm.txt
    tail -12 $OUT/xeon_sweep_lstm.txt ;;
xeonchunks)  # the backward's chunk gradients A/B on the Xeon's 16 cores
    for a in "lstm 80 130 200 1 0 7" "lstm 100 20 800 1 1 5" "lstm 200 64 256 1 0 5" "gru 100 32 512 3 0 5"; do
        timeout 60 python3 notes/bench/v74/chunk_grads_ab.py $a 2>&1 | grep -v Warn | tee -a $OUT/xeon_chunk_grads_ab.txt
    done ;;
*) bash notes/bench/v73/gpu_run.sh "$@" ;;
esac
