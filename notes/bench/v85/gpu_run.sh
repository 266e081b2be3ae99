#!/usr/bin/env bash
# v85's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   cuda     every CUDA test (v85's pipeline injects cp.async itself: every tiled GEMM changes path)
#   masks    the masked DS2 build profiled (sequence.masked_selects_without_branches, v84, never run),
#            then the drop-ins' packed / padded / cuDNN benchmark
#   sweep    the seed-7804 held-out-like sweep (v84: notes/bench/v84/gpu_heldout_7804_summary.txt)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-cuda}
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/device.txt
if [ $part = cuda ]; then
    timeout ${LIMIT:-420} python3 -m pytest -q -n ${WORKERS:-12} tests/test_cuda.py ${TESTS:+-k "$TESTS"} -rfE \
        > $OUT/test_cuda_v85.txt 2>&1
    grep -E "^(FAILED|ERROR)" $OUT/test_cuda_v85.txt | head -20; tail -1 $OUT/test_cuda_v85.txt
fi
if [ $part = masks ]; then
    timeout 120 python3 -m tvmrnn.cli.bench --device cuda --bidirectional --num-layers 1 --reps 5 --profile \
        --options '{"variable_lengths": true}' lstm 2>&1 | grep -v Warn | tee $OUT/packed_profile_masks.txt \
        | grep -E "recurrent_step|backward_step|ratio"
    timeout 200 python3 scripts/bench_packed.py --device cuda --reps 10 ${CELLS:-lstm} 2>&1 | grep -v Warn \
        | tee $OUT/bench_packed_masks.txt | tail -3
fi
if [ $part = sweep ]; then
    timeout ${LIMIT:-400} python3 -m tvmrnn.cli.bench --device cuda --sweep notes/bench/v80/gpu_shapes_7804.json \
        --reps 5 --max-seconds 2 --json $OUT/gpu_heldout_7804.json 2>&1 | grep -v Warn | tee $OUT/gpu_heldout_7804.txt | tail -14
fi
