#!/usr/bin/env bash
# This session's GPU calls (v64):
#   bash notes/bench/v64/gpu_run.sh tests     # = v63's: the full CUDA file (v63's defaults)
#   bash notes/bench/v64/gpu_run.sh sweeps    # = v62's: sweep_large, then sweep_batches
#   bash notes/bench/v64/gpu_run.sh forward   # 128-row forward steps launched (and split) instead of persistent
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
ab() {  # ab LIMIT_S OUTFILE ASSIGNMENTS SHAPES...
    local limit=$1 out=$2 assign=$3; shift 3
    timeout "$limit" python3 notes/bench/v62/constants_ab.py "$assign" "$@" 2>&1 | grep --line-buffered -v Warn > "$OUT/$out"
}
case "$1" in
tests|sweeps) bash notes/bench/v63/gpu_run.sh "$1" ;;
forward)
    ab 200 forward_launched_split.txt \
        'tvmrnn.schedules.common.GPU_PERSISTENT_SPLIT_K_ROWS=128;tvmrnn.schedules.cuda.GPU_FORWARD_STEP_K_SLICES=true' \
        gru:128:1024:1024:50 lstm:128:1024:1024:50
    ab 110 forward_launched.txt 'tvmrnn.schedules.common.GPU_PERSISTENT_SPLIT_K_ROWS=128' gru:128:1024:1024:50
    ab 110 forward_split_192.txt 'tvmrnn.schedules.cuda.GPU_FORWARD_STEP_K_SLICES=true' gru:192:1024:1024:50
    cat $OUT/*.txt ;;
*) echo "usage: $0 tests|sweeps|forward"; exit 2 ;;
esac
