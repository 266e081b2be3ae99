#!/usr/bin/env bash
# This session's GPU calls (v64):
#   bash notes/bench/v64/gpu_run.sh tests     # = v63's: the full CUDA file (v63's defaults)
#   bash notes/bench/v64/gpu_run.sh sweeps    # = v62's: sweep_large, then sweep_batches
#   bash notes/bench/v64/gpu_run.sh forward   # 128-row forward steps launched (and split) instead of persistent
# For the next session (v64's runbook), in this order:
#   bash notes/bench/v64/gpu_run.sh tests     # the full CUDA file with v64's defaults (new: forward steps of 128 rows)
#   bash notes/bench/v64/gpu_run.sh revert    # v64's forward rule against v63's where it was not measured
#   bash notes/bench/v64/gpu_run.sh sweeps
#   bash notes/bench/v64/gpu_run.sh tune      # GRU N=256 H=2048's forward step (0.81x): its listed splits and tiles, pass-checked
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
revert)  # as is (v64) -> v63 (no forward step split by default, so none launched below 160 rows)
    ab 280 revert_ab.txt 'tvmrnn.schedules.cuda.GPU_FORWARD_STEP_FILL=1073741824' \
        gru:160:768:768:50 rnn_tanh:512:1024:1024:50 rnn_tanh:256:2048:2048:50 rnn_tanh:144:2048:2048:50
    ab 150 revert_ab2.txt 'tvmrnn.schedules.cuda.GPU_FORWARD_STEP_FILL=1073741824' \
        lstm:128:1024:1024:100 gru:128:1024:1024:200
    cat $OUT/revert_ab*.txt ;;
tune)  # the listed variants (k_slices 1/2/4/8, other tiles) of the weakest sweep_large step, then a whole-pass check
    mkdir -p $OUT/logs
    timeout 400 python3 -m tvmrnn.cli.tune gru --input-size 2048 --hidden-size 2048 --batch-size 256 --target cuda \
        --kernels recurrent_step_gru_infer_n256_h2048 --trials 24 --log-dir $OUT/logs --pass-length 50 2>&1 \
        | grep --line-buffered -v Warn > $OUT/tune_gru_n256_h2048.txt
    python3 -m tvmrnn.cli.tune gru --input-size 2048 --hidden-size 2048 --batch-size 256 --target cuda \
        --log-dir $OUT/logs --list 2>&1 | grep -v Warn > $OUT/tune_list.txt
    tail -n 30 $OUT/tune_gru_n256_h2048.txt $OUT/tune_list.txt ;;
*) echo "usage: $0 tests|sweeps|forward|revert|tune"; exit 2 ;;
esac
