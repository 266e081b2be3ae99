#!/usr/bin/env bash
# v84's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   cuda     the CUDA tests v83's rules touch (its few-row float64 test was never run)
#   sweep    the seed-7804 held-out-like sweep (compare notes/bench/v80/gpu_heldout_7804_v79.txt)
#   packed   where a variable-lengths (packed) DS2 build's time goes against the padded build's:
#            both profiled (every kernel alone), then the drop-ins' packed/padded/cuDNN benchmark
#   masks    after sequence.masked_selects_without_branches: the CUDA tests of variable lengths, the
#            masked build profiled again, the drop-ins' benchmark again
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-cuda}
if [ $part = cuda ]; then
    timeout ${LIMIT:-300} python3 -m pytest -v -n ${WORKERS:-12} tests/test_cuda.py \
        -k "${TESTS:-few_rows_on_row_tiles or row_tiles or persistent or backward}" > $OUT/test_cuda_v84.txt 2>&1
    echo "passed $(grep -cE ' PASSED' $OUT/test_cuda_v84.txt)"; grep -E " (FAILED|ERROR)" $OUT/test_cuda_v84.txt | head
    tail -2 $OUT/test_cuda_v84.txt
fi
if [ $part = sweep ]; then
    timeout ${LIMIT:-280} python3 -m tvmrnn.cli.bench --device cuda --sweep notes/bench/v80/gpu_shapes_7804.json \
        --reps 5 --max-seconds 2 --json $OUT/gpu_heldout_7804.json 2>&1 | grep -v Warn | tee $OUT/gpu_heldout_7804.txt | tail -14
fi
if [ $part = packed ]; then
    for opt in '{"variable_lengths": true}' '{}'; do
        timeout 150 python3 -m tvmrnn.cli.bench --device cuda --bidirectional --num-layers 1 --reps 5 --profile \
            --options "$opt" ${CELLS:-lstm} 2>&1 | grep -v Warn | tee -a $OUT/packed_profile.txt | tail -4
    done
    timeout 200 python3 scripts/bench_packed.py --device cuda --reps 10 ${CELLS:-lstm} 2>&1 | grep -v Warn \
        | tee $OUT/bench_packed.txt | tail -6
fi
if [ $part = masks ]; then
    timeout ${LIMIT:-150} python3 -m pytest -v -n 12 tests/test_cuda.py -k "lengths or packed or masked or ragged" \
        > $OUT/test_cuda_masks.txt 2>&1
    echo "passed $(grep -cE ' PASSED' $OUT/test_cuda_masks.txt)"; grep -E " (FAILED|ERROR)" $OUT/test_cuda_masks.txt | head
    tail -1 $OUT/test_cuda_masks.txt
    timeout 100 python3 -m tvmrnn.cli.bench --device cuda --bidirectional --num-layers 1 --reps 5 --profile \
        --options '{"variable_lengths": true}' lstm 2>&1 | grep -v Warn | tee $OUT/packed_profile_masks.txt \
        | grep -E "recurrent_step|backward_step|ratio"
    timeout 150 python3 scripts/bench_packed.py --device cuda --reps 10 ${CELLS:-lstm} 2>&1 | grep -v Warn \
        | tee $OUT/bench_packed_masks.txt | tail -1
fi
