#!/usr/bin/env bash
# v8 GPU session helper (runs on the GPU machine): re-measure the default GEMM shapes of the
# 256-step GEMM tasks with the new gpu_matmul and copy the new log pair to $OUT.
set -uo pipefail
python3 scripts/tune.py --config scripts/configs/ds2.json --target nvidia/nvidia-h100 \
  --kernels input_projection_t256 weight_gradient_t256 input_gradient_t256 --reseed-defaults --trials 1 \
  2>&1 | grep -v "^ " | tee "$OUT/tune_h100_gemms_v8.log" | tail -40
mkdir -p "$OUT/logs"
for f in $(ls -t tuning_logs/cuda-sm_90 | head -2); do cp "tuning_logs/cuda-sm_90/$f" "$OUT/logs/"; done
