#!/usr/bin/env bash
# v75's GPU-machine calls, each under the 600 s limit:
#   bash notes/bench/v75/gpu_run.sh xeon      # v74's Xeon checks: sweep_lstm.json with v74's CPU defaults
#   bash notes/bench/v75/gpu_run.sh xeonheld  # random held-out-like shapes on the Xeon (heldout_like.py 7501 8 40)
#   bash notes/bench/v75/gpu_run.sh gpuheld   # random held-out-like shapes on the GPU (heldout_like.py 7502 7 600)
#   others: v74's runbook
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
xeon)
    lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon_lscpu.txt
    timeout ${2:-300} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep notes/bench/v74/sweep_lstm.json \
        --reps 3 --max-seconds 1 --json $OUT/xeon_sweep_lstm.json 2>&1 | grep --line-buffered -v Warn > $OUT/xeon_sweep_lstm.txt
    tail -12 $OUT/xeon_sweep_lstm.txt ;;
xeonheld)
    timeout ${2:-560} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep notes/bench/v75/xeon_heldout_like.json \
        --reps 3 --max-seconds 1 --json $OUT/xeon_heldout.json 2>&1 | grep --line-buffered -v Warn > $OUT/xeon_heldout.txt
    tail -22 $OUT/xeon_heldout.txt ;;
gpuheld)
    timeout ${2:-560} python3 -m tvmrnn.cli.bench --device cuda --sweep notes/bench/v75/gpu_heldout_like.json \
        --reps 5 --max-seconds 2 --json $OUT/gpu_heldout.json 2>&1 | grep --line-buffered -v Warn > $OUT/gpu_heldout.txt
    tail -20 $OUT/gpu_heldout.txt ;;
*) bash notes/bench/v74/gpu_run.sh "$@" ;;
esac
