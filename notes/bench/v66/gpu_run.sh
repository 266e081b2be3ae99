#!/usr/bin/env bash
# This session's GPU calls (v66), each under the 600 s call limit:
#   bash notes/bench/v66/gpu_run.sh tests   # the full CUDA file at v65 (long forward slices; masked backward steps' gemm_mask)
#   bash notes/bench/v66/gpu_run.sh long    # v65's long forward slices against v64 at the builds they change (v65's `long`)
#   bash notes/bench/v66/gpu_run.sh xeon    # scripts/configs/sweep.json on the GPU machine's Xeon, 16 threads (last run: v36)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests|long|sweeps|sweep_batches) bash notes/bench/v65/gpu_run.sh "$1" ;;
xeon)
    lscpu | grep -E "Model name|^CPU\(s\)" > $OUT/xeon_lscpu.txt
    timeout 570 python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep scripts/configs/sweep.json \
        --reps 3 --max-seconds 1 --json $OUT/xeon_sweep.json 2>&1 | grep --line-buffered -v Warn > $OUT/xeon_sweep.txt
    tail -22 $OUT/xeon_sweep.txt ;;
*) echo "usage: $0 tests|long|xeon|sweeps|sweep_batches"; exit 2 ;;
esac
