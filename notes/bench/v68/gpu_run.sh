#!/usr/bin/env bash
# This session's GPU calls (v68), each under the 600 s call limit:
#   bash notes/bench/v68/gpu_run.sh tests       # the full CUDA file at v67 (the CPU kernels' calling convention changed)
#   bash notes/bench/v68/gpu_run.sh xeon        # scripts/configs/sweep.json on the Xeon, fused row tiles and padded rows on
#   bash notes/bench/v68/gpu_run.sh gpusweep    # scripts/configs/sweep.json on the H200 (last run on a GPU: v35, H100)
#   bash notes/bench/v68/gpu_run.sh xeonsmall   # batches 1, 3, 7, 11, 13 on the Xeon (fused row tiles, padded rows)
#   bash notes/bench/v68/gpu_run.sh tails       # v68's projection tails for short GEMMs against none (GPU_GEMM_FULL_ROWS=0)
# For the next session (v68's runbook), in this order:
#   bash notes/bench/v68/gpu_run.sh tests       # the full CUDA file at v68 (projection tails; packages' checksum trailer)
#   bash notes/bench/v68/gpu_run.sh igtails     # the backward's input-gradient tails (off) and the narrow ladder, A/B
#   bash notes/bench/v68/gpu_run.sh splitk      # chunk GEMMs of 33-64 rows on the tiled GEMM instead of split-K, A/B
#   bash notes/bench/v68/gpu_run.sh xeon13      # 13 rows built for 15 against 16 on the Xeon (v68's 0.83x)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests) bash notes/bench/v65/gpu_run.sh tests ;;
xeon) bash notes/bench/v66/gpu_run.sh xeon ;;
gpusweep)
    timeout ${2:-560} python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep.json --max-seconds 1 \
        --json $OUT/gpu_sweep.json 2>&1 | grep --line-buffered -v Warn > $OUT/gpu_sweep.txt
    tail -22 $OUT/gpu_sweep.txt ;;
xeonsmall)
    timeout ${2:-560} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep notes/bench/v68/xeon_small.json \
        --reps 3 --max-seconds 1 --json $OUT/xeon_small.json 2>&1 | grep --line-buffered -v Warn > $OUT/xeon_small.txt
    tail -14 $OUT/xeon_small.txt ;;
tails)  # as is (v68: tails where the chunks they save are short GEMMs) -> v67 (GPU_GEMM_FULL_ROWS=0: none)
    timeout ${2:-250} python3 notes/bench/v62/constants_ab.py 'tvmrnn.program.passes.GPU_GEMM_FULL_ROWS=0' \
        gru:12:2048:2048:60 lstm:24:1280:1280:120 lstm:20:800:800:500 2>&1 | grep --line-buffered -v Warn > $OUT/tails_ab.txt
    cat $OUT/tails_ab.txt ;;
igtails)  # as is -> with GPU_INPUT_GRADIENT_TAILS; then as is -> the narrow ladder (256, 32, 16, 8, 4, 1)
    timeout 300 python3 notes/bench/v62/constants_ab.py 'tvmrnn.program.passes.GPU_INPUT_GRADIENT_TAILS=true' \
        gru:12:2048:2048:60 lstm:24:1280:1280:120 lstm:20:800:800:300:bi lstm:8:320:320:90 2>&1 | grep --line-buffered -v Warn > $OUT/igtails_ab.txt
    timeout 280 python3 notes/bench/v62/constants_ab.py 'tvmrnn.program.passes.GPU_CHUNK_STEPS=[256,32,16,8,4,1]' \
        gru:12:2048:2048:60 lstm:24:1280:1280:120 lstm:20:800:800:300 2>&1 | grep --line-buffered -v Warn > $OUT/narrow_ab.txt
    cat $OUT/igtails_ab.txt $OUT/narrow_ab.txt ;;
splitk)  # as is -> GEMMs without a fused epilogue of 33-64 rows on the tiled GEMM (split-K's per-thread
    # scalar loads: the 48-row input projection at N=12 H=2048 took 227 us, where streaming its weights takes ~12)
    timeout 280 python3 notes/bench/v62/constants_ab.py 'tvmrnn.schedules.common.GPU_SPLIT_K_ROWS=32' \
        gru:12:2048:2048:60 lstm:16:1024:1024:100 lstm:48:640:640:150 2>&1 | grep --line-buffered -v Warn > $OUT/splitk_ab.txt
    timeout 250 python3 -m tvmrnn.cli.bench gru --device cuda -T 60 -N 12 --input-size 2048 --hidden-size 2048 \
        --num-layers 1 --max-seconds 1 --profile 2>&1 | grep -v Warn > $OUT/gru12_profile_v68.txt
    cat $OUT/splitk_ab.txt; grep -E "^ +[a-z_]+_t[0-9]|ratio" $OUT/gru12_profile_v68.txt ;;
xeon13)  # 13 rows on builds of 13, 15 (the padded default) and 16, 16 threads
    for m in 15 16; do timeout 200 python3 notes/bench/v67/padded_rows_ab.py 13 $m 2>&1 | grep -v Warn; done | tee $OUT/xeon13.txt ;;
*) echo "usage: $0 tests|xeon|gpusweep|xeonsmall|tails|igtails|splitk|xeon13"; exit 2 ;;
esac
