#!/usr/bin/env bash
# v83's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   bwd    persistent backward steps' tiles: BACKWARD_PERSISTENT_THREADS 128 -> 256 (row_tiles.py),
#          whole passes in one process (v78's const_ab.py), against cuDNN
#   rules  v82's Xeon runbook part (the CPU backward step's tile rules alone; the by-cores rule in passes)
#   cuda   the CUDA tests the change touches
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-bwd}
if [ $part = bwd ]; then
    FLAG=tvmrnn.schedules.row_tiles.BACKWARD_PERSISTENT_THREADS OLD=128 NEW=${NEW:-256} \
        timeout ${LIMIT:-330} python3 notes/bench/v78/const_ab.py ${SHAPES:-lstm:256:510:161:200 gru:256:510:161:200 \
        lstm:128:256:256:200 lstm:160:384:384:100 gru:200:300:300:100} \
        2>&1 | grep --line-buffered -v Warn | tee -a $OUT/backward_threads_ab.txt
fi
if [ $part = rules ]; then
    PASSES="${PASSES:-lstm:100:48:256:423 lstm:100:24:161:423}" bash notes/bench/v82/gpu_run.sh rules
fi
if [ $part = cuda ]; then
    timeout ${LIMIT:-400} python3 -m pytest -v -n ${WORKERS:-12} tests/test_cuda.py -k "${TESTS:-row_tiles or persistent or backward}" \
        > $OUT/test_cuda_v83.txt 2>&1
    echo "passed $(grep -cE ' PASSED' $OUT/test_cuda_v83.txt)"; grep -E " (FAILED|ERROR)" $OUT/test_cuda_v83.txt | head; tail -2 $OUT/test_cuda_v83.txt
fi
if [ $part = rows ]; then  # persistent steps of 32-127 rows a direction on row tiles (units split over blocks where needed)
    FLAG=tvmrnn.schedules.common.GPU_PERSISTENT_ROW_TILE_ROWS OLD=128 NEW=${NEW:-32} \
        timeout ${LIMIT:-330} python3 notes/bench/v78/const_ab.py ${SHAPES:-lstm:32:126:126:200:3 lstm:64:256:256:200 \
        lstm:100:384:384:100 lstm:57:645:161:200 gru:64:300:300:200} \
        2>&1 | grep --line-buffered -v Warn | tee -a $OUT/persistent_rows_ab.txt
fi
if [ $part = few ]; then  # persistent steps of 32-127 rows on row tiles where rows x units <= 16384
    FLAG=tvmrnn.schedules.common.GPU_PERSISTENT_FEW_ROWS_OUTPUTS OLD=0 NEW=${NEW:-16384} \
        timeout ${LIMIT:-330} python3 notes/bench/v78/const_ab.py ${SHAPES:-lstm:48:160:160:200 gru:32:170:170:200 \
        lstm:96:128:128:200 gru:48:300:300:200 lstm:32:200:40:300:2} \
        2>&1 | grep --line-buffered -v Warn | tee -a $OUT/persistent_few_rows_ab.txt
fi
