#!/usr/bin/env bash
# This session's GPU calls (v65), each under the 600 s call limit:
#   bash notes/bench/v65/gpu_run.sh tests     # the full CUDA file with v64's defaults (forward steps of 128 rows launched, split)
#   bash notes/bench/v65/gpu_run.sh revert    # v64's forward rule against v63's where it changes builds; then sweep_large
#   bash notes/bench/v65/gpu_run.sh tune      # = v64's: GRU N=256 H=2048's forward step, its listed variants, pass-checked
# For the next session (v65's runbook), in this order:
#   bash notes/bench/v65/gpu_run.sh tests     # the full CUDA file at v65 (long forward slices; masked backward steps' gemm_mask)
#   bash notes/bench/v65/gpu_run.sh long      # v65's long forward slices against v64 at the builds they change
#   bash notes/bench/v65/gpu_run.sh sweeps    # sweep_large, then sweep_batches (a call each)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
ab() {  # ab LIMIT_S OUTFILE ASSIGNMENTS SHAPES...
    local limit=$1 out=$2 assign=$3; shift 3
    timeout "$limit" python3 notes/bench/v62/constants_ab.py "$assign" "$@" 2>&1 | grep --line-buffered -v Warn > "$OUT/$out"
}
case "$1" in
tests)
    timeout 480 python3 -m pytest -q -n 12 -p no:cacheprovider --durations=15 tests/test_cuda.py 2>&1 | tail -45 > $OUT/test_cuda.txt
    tail -20 $OUT/test_cuda.txt ;;
revert)  # as is (v64) -> v63 (no forward step split by default, so none launched below 160 rows)
    ab 250 revert_ab.txt 'tvmrnn.schedules.cuda.GPU_FORWARD_STEP_FILL=1073741824' \
        gru:160:768:768:50 rnn_tanh:512:1024:1024:50 rnn_tanh:256:2048:2048:50 rnn_tanh:144:2048:2048:50
    timeout 290 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_large.json --max-seconds 1 \
        --json $OUT/sweep_large.json 2>&1 | grep --line-buffered -v Warn > $OUT/sweep_large.txt
    cat $OUT/revert_ab.txt; tail -14 $OUT/sweep_large.txt ;;
tune) bash notes/bench/v64/gpu_run.sh tune ;;
long)  # as is (v65) -> v64 (no forward split in slices of 1024+ between 1/6 and 1/2 of the threads)
    ab 330 long_ab.txt 'tvmrnn.schedules.cuda.GPU_FORWARD_STEP_LONG_FILL=1073741824' \
        gru:256:2048:2048:50 lstm:256:2048:2048:50 lstm:192:2048:2048:50 lstm:128:2048:2048:50 rnn_tanh:128:2048:2048:50
    ab 200 long_ab2.txt 'tvmrnn.schedules.cuda.GPU_FORWARD_STEP_LONG_FILL=1073741824' \
        gru:224:2048:2048:50 rnn_tanh:512:2048:2048:50
    cat $OUT/long_ab*.txt ;;
sweeps)
    timeout 290 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_large.json --max-seconds 1 \
        --json $OUT/sweep_large.json 2>&1 | grep --line-buffered -v Warn > $OUT/sweep_large.txt
    tail -12 $OUT/sweep_large.txt ;;
sweep_batches)
    timeout 560 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_batches.json --max-seconds 1 \
        --json $OUT/sweep_batches.json 2>&1 | grep --line-buffered -v Warn > $OUT/sweep_batches.txt
    tail -14 $OUT/sweep_batches.txt ;;
*) echo "usage: $0 tests|revert|tune|long|sweeps|sweep_batches"; exit 2 ;;
esac
