#!/usr/bin/env bash
# v81's runbook for the GPU machine (after the 3 packing calls of ../shared/gpu/pack.sh):
#   cuda1 / cuda2  tests/test_cuda.py in two halves, verbose into $OUT (v80's padding rows and
#                  drop-in changes touch the CUDA path: Frame.padded on CUDA tensors)
#   xeon           on the Xeon, 16 threads: v80's GRU padded panels and rows model (switch off -> on,
#                  a process a side, drop-in training against PyTorch), and interleave_projections
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-cuda1}
if [ $part = cuda1 ] || [ $part = cuda2 ]; then
    python3 -m pytest --co -q tests/test_cuda.py 2>/dev/null | grep "::" > /tmp/ids.txt
    half=$(( $(wc -l < /tmp/ids.txt) / 2 ))
    if [ $part = cuda1 ]; then head -n $half /tmp/ids.txt > /tmp/run.txt; else tail -n +$((half + 1)) /tmp/ids.txt > /tmp/run.txt; fi
    timeout ${LIMIT:-500} python3 -m pytest -v -n ${WORKERS:-12} $(cat /tmp/run.txt) > $OUT/test_cuda_$part.txt 2>&1
    echo "passed $(grep -cE ' PASSED' $OUT/test_cuda_$part.txt) of $(wc -l < /tmp/run.txt)"
    grep -E " (FAILED|ERROR)" $OUT/test_cuda_$part.txt | head; tail -2 $OUT/test_cuda_$part.txt
fi
if [ $part = xeon ]; then
    for pair in "CPU_PADDED_PANELS gru:100:1:1082:1082 gru:100:20:601:601" \
                "PADDED_BATCH_DATA_GEMMS lstm:100:129:161:292 gru:100:129:161:292"; do
        set -- $pair
        name=$1; shift
        for v in False True; do
            FLAG=tvmrnn.schedules.cpu.$name VALUE=$v THREADS=16 timeout 100 python3 notes/bench/v78/flag_one.py "$@" 2>&1 \
                | grep --line-buffered training | tee -a $OUT/xeon_flags.txt
        done
    done
    for shape in "lstm 50 5 161 900 2 0" "lstm 50 1 1400 1400 1 0" "lstm 100 20 800 800 1 0" "lstm 50 64 256 256 1 0"; do
        TVM_NUM_THREADS=16 OMP_NUM_THREADS=16 timeout 100 python3 notes/bench/v81/interleave_ab.py $shape 5 2>&1 | tail -4 | tee -a $OUT/xeon_interleave.txt
    done
fi
