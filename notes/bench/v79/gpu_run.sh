#!/usr/bin/env bash
# v79's additions for the GPU machine (after the 3 packing calls), beside v78's runbook
# (notes/bench/v78/gpu_run.sh: cuda1/cuda2 = the whole test_cuda.py, held, xeonab, xeon, ladder):
#   xeonwide  the wide guarded tiles (cpu.CPU_GUARDED_TILE_VECTORS 1 -> 2) on the Xeon, 16 threads,
#             drop-in training against PyTorch, a process a side, twice
#   xeonregions  time loops at odd H as one parallel region (sequence.WHOLE_GUARDED_TILES off -> on), the same way
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-xeonwide}
if [ $part = xeonwide ]; then
    for v in 1 2 1 2; do
        FLAG=tvmrnn.schedules.cpu.CPU_GUARDED_TILE_VECTORS VALUE=$v THREADS=16 timeout 130 python3 notes/bench/v78/flag_one.py \
            lstm:100:20:467:467 lstm:100:5:1024:1471 lstm:100:129:161:292 gru:100:20:601:601 2>&1 \
            | grep --line-buffered training | tee -a $OUT/xeon_wide_guarded_tiles.txt
    done
fi
if [ $part = xeonregions ]; then
    for v in False True False True; do
        FLAG=tvmrnn.program.sequence.WHOLE_GUARDED_TILES VALUE=$v THREADS=16 timeout 130 python3 notes/bench/v78/flag_one.py \
            lstm:200:1:161:363 lstm:200:7:30:129 gru:200:5:37:67 lstm:100:20:467:467 2>&1 \
            | grep --line-buffered training | tee -a $OUT/xeon_whole_guarded_tiles.txt
    done
fi
