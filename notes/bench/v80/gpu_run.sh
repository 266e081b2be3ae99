#!/usr/bin/env bash
# v80's runbook for the GPU machine (after the 3 packing calls of ../shared/gpu/pack.sh):
#   cuda1 / cuda2  tests/test_cuda.py in two halves, verbose into $OUT (v80's padding rows and
#                  drop-in changes touch the CUDA path: Frame.padded on CUDA tensors)
#   xeonpanels     the GRU's padded panels (cpu.CPU_PADDED_PANELS off -> on) on the Xeon, 16 threads,
#                  drop-in training against PyTorch, a process a side, twice
#   xeonrows       the rows model (cpu.PADDED_BATCH_DATA_GEMMS off -> on) the same way
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-cuda1}
if [ $part = cuda1 ] || [ $part = cuda2 ]; then
    python3 -m pytest --co -q tests/test_cuda.py 2>/dev/null | grep "::" > /tmp/ids.txt
    half=$(( $(wc -l < /tmp/ids.txt) / 2 ))
    if [ $part = cuda1 ]; then head -n $half /tmp/ids.txt > /tmp/run.txt; else tail -n +$((half + 1)) /tmp/ids.txt > /tmp/run.txt; fi
    timeout 540 python3 -m pytest -v -n 8 $(cat /tmp/run.txt) > $OUT/test_cuda_$part.txt 2>&1
    grep -cE " PASSED" $OUT/test_cuda_$part.txt; grep -E " (FAILED|ERROR)" $OUT/test_cuda_$part.txt | head; tail -2 $OUT/test_cuda_$part.txt
fi
for pair in "xeonpanels CPU_PADDED_PANELS gru:100:1:1082:1082 gru:100:20:601:601 gru:100:129:161:292" \
            "xeonrows PADDED_BATCH_DATA_GEMMS lstm:100:129:161:292 gru:100:129:161:292 lstm:100:57:161:645"; do
    set -- $pair
    [ $part = $1 ] || continue
    name=$2; shift 2
    for v in False True False True; do
        FLAG=tvmrnn.schedules.cpu.$name VALUE=$v THREADS=16 timeout 130 python3 notes/bench/v78/flag_one.py "$@" 2>&1 \
            | grep --line-buffered training | tee -a $OUT/xeon_$part.txt
    done
done
