#!/usr/bin/env bash
# This session's GPU calls (v65), each under the 600 s call limit:
#   bash notes/bench/v65/gpu_run.sh tests     # the full CUDA file with v64's defaults (forward steps of 128 rows launched, split)
#   bash notes/bench/v65/gpu_run.sh revert    # v64's forward rule against v63's where it changes builds; then sweep_large
#   bash notes/bench/v65/gpu_run.sh tune      # = v64's: GRU N=256 H=2048's forward step, its listed variants, pass-checked
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
*) echo "usage: $0 tests|revert|tune"; exit 2 ;;
esac
