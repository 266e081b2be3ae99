#!/usr/bin/env bash
# v88's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   training  v86's training wavefront (layer_wavefront=True) on the GPU: the CUDA wavefront tests,
#             then wave_check.py (outputs and gradients against layer by layer and torch.nn in
#             float64, passes timed against layer by layer and cuDNN)
#   xeonbf16  issue 39: the Xeon's bf16 DS2 LSTM inference against PyTorch bf16 and fp32, profiled
#   cuda      every CUDA test, LIMIT seconds
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/device.txt
git log -1 --format=%h >> $OUT/device.txt 2>/dev/null
lscpu | grep -E "Model name|^CPU\(s\)" >> $OUT/device.txt
for part in "$@"; do
if [ $part = training ]; then
    timeout ${LIMIT:-200} python3 -m pytest -q -n 4 tests/test_cuda.py -k wavefront -rfE > $OUT/test_cuda_wavefront.txt 2>&1
    tail -3 $OUT/test_cuda_wavefront.txt
    WAVE=1 timeout ${LIMIT:-200} python3 notes/bench/v86/wave_check.py ${SHAPES:-gru:32:126:126:700:3 lstm:32:126:126:700:3 gru:128:256:256:200:3} \
        2>&1 | grep -v Warn | tee $OUT/wave_training.txt
fi
if [ $part = xeonbf16 ]; then
    timeout ${LIMIT:-200} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --preset ds2 --num-layers 1 --no-train \
        --dtype bfloat16 --profile lstm 2>&1 | grep -v Warn | tee $OUT/xeon_bf16_profile.txt | tail -40
fi
if [ $part = cuda ]; then
    timeout ${LIMIT:-420} python3 -m pytest -q -n ${WORKERS:-14} tests/test_cuda.py ${TESTS:+-k "$TESTS"} -rfE \
        > $OUT/test_cuda_v88.txt 2>&1
    grep -E "^(FAILED|ERROR)" $OUT/test_cuda_v88.txt | head -20; tail -1 $OUT/test_cuda_v88.txt
fi
done
