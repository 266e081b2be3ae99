#!/bin/bash
# v55's GPU run (H200 machine): the host-overhead probe, then the whole CUDA suite.
# Usage (after the wheels' setup): bash notes/bench/v55/gpu_run.sh "$OUT" SECONDS
out=$1; limit=${2:-440}
python3 notes/bench/v55/host_overhead.py lstm 1 96 60 > "$out/host_overhead.txt" 2>&1
timeout "$limit" python3 -m pytest -q -n 12 tests/test_cuda.py -p no:cacheprovider -rf --durations=25 \
    > "$out/test_cuda.txt" 2>&1
echo "rc=$?" >> "$out/test_cuda.txt"
head -12 "$out/host_overhead.txt"; tail -40 "$out/test_cuda.txt"
