#!/usr/bin/env bash
# This session's GPU calls (v66), each under the 600 s call limit:
#   bash notes/bench/v66/gpu_run.sh tests   # the full CUDA file at v65 (long forward slices; masked backward steps' gemm_mask)
#   bash notes/bench/v66/gpu_run.sh long    # v65's long forward slices against v64 at the builds they change (v65's `long`)
#   bash notes/bench/v66/gpu_run.sh xeon    # scripts/configs/sweep.json on the GPU machine's Xeon, 16 threads (last run: v36)
# For the next session (v66's runbook), in this order:
#   bash notes/bench/v66/gpu_run.sh tests    # the full CUDA file at v66 (stacked tiled steps, tanh saturation, Inf checks)
#   bash notes/bench/v66/gpu_run.sh stacked  # v66's two stacked-step rules against v65's, bidirectional shapes
#   bash notes/bench/v66/gpu_run.sh stacked2 # the rest of them
#   bash notes/bench/v66/gpu_run.sh bi       # bidirectional large shapes against cuDNN (v66's bi_large*.txt, at v66)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
ab() {  # ab LIMIT_S OUTFILE ASSIGNMENTS SHAPES...
    local limit=$1 out=$2 assign=$3; shift 3
    timeout "$limit" python3 notes/bench/v62/constants_ab.py "$assign" "$@" 2>&1 | grep --line-buffered -v Warn > "$OUT/$out"
}
V65_ROWS='tvmrnn.schedules.common.GPU_STACKED_MATMUL_ROWS=1073741824'
V65_SLICES='tvmrnn.schedules.cuda.GPU_STEP_SLICES_COUNT_DIRECTIONS=false'
case "$1" in
tests|long|sweeps|sweep_batches) bash notes/bench/v65/gpu_run.sh "$1" ;;
stacked)  # as is (v66) -> v65 (stacked steps by a direction's own rows; slices by one direction)
    ab 280 stacked_ab.txt "$V65_ROWS;$V65_SLICES" lstm:64:2048:2048:50:bi gru:64:2048:2048:50:bi lstm:64:1024:1024:50:bi
    ab 280 slices_ab.txt "$V65_SLICES" lstm:128:1024:1024:50:bi gru:128:1024:1024:50:bi lstm:256:1024:1024:50:bi
    cat $OUT/stacked_ab.txt $OUT/slices_ab.txt ;;
stacked2)
    ab 280 stacked_ab2.txt "$V65_ROWS;$V65_SLICES" gru:64:1024:1024:50:bi lstm:100:1024:1024:50:bi lstm:64:768:768:50:bi rnn_tanh:64:2048:2048:50:bi
    ab 250 slices_ab2.txt "$V65_SLICES" gru:128:2048:2048:50:bi
    cat $OUT/stacked_ab2.txt $OUT/slices_ab2.txt ;;
bi)
    for shape in "-N 64 --input-size 2048 --hidden-size 2048" "-N 128 --input-size 1024 --hidden-size 1024" \
                 "-N 256 --input-size 1024 --hidden-size 1024" "-N 64 --input-size 1024 --hidden-size 1024"; do
        timeout 140 python3 -m tvmrnn.cli.bench lstm gru --device cuda -T 50 $shape --bidirectional --num-layers 1 \
            --max-seconds 1 2>&1 | grep --line-buffered -v Warn | grep --line-buffered "ratio" | grep -v TF32
    done | tee $OUT/bi_sweep.txt ;;
xeon)
    lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon_lscpu.txt
    timeout 570 python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep scripts/configs/sweep.json \
        --reps 3 --max-seconds 1 --json $OUT/xeon_sweep.json 2>&1 | grep --line-buffered -v Warn > $OUT/xeon_sweep.txt
    tail -22 $OUT/xeon_sweep.txt ;;
*) echo "usage: $0 tests|stacked|stacked2|bi|long|xeon|sweeps|sweep_batches"; exit 2 ;;
esac
