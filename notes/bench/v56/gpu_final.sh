#!/usr/bin/env bash
# v56's last GPU call: the stream / graph / drop-in CUDA tests, the host probe, then as much of the
# GEMM grid (N=128 H=96 / 128 and N=160 H=384 kernels) as the time left allows.
OUT=$1
timeout 110 python3 -m pytest -q -n 12 tests/test_cuda.py -k "stream or graph or dropin or packed or lengths" > "$OUT/test_cuda_subset.txt" 2>&1
tail -3 "$OUT/test_cuda_subset.txt"
for a in "lstm 1 96 60" "lstm 128 96 100"; do
  timeout 30 python3 notes/bench/v55/host_overhead.py $a 2>&1 | grep -v -i warn | head -9
done > "$OUT/host_overhead.txt"
cat "$OUT/host_overhead.txt"
timeout "${2:-60}" python3 notes/bench/v56/gemm_grid.py --target nvidia/nvidia-h100 \
  "$OUT/gemm_grid_h200.jsonl" scripts/configs/sweep.json notes/bench/v45/floor.json --kernels _n128_ _n160_ > "$OUT/gemm_grid_h200.txt" 2>&1
tail -25 "$OUT/gemm_grid_h200.txt"
