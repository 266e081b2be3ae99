#!/usr/bin/env bash
# v89's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   cuda   every CUDA test, LIMIT seconds (TESTS: a -k filter)
#   sweep  tvmrnn-bench --sweep SWEEP (default: this folder's held-out-like seed 8901) on the H100
#   xsweep the same on the Xeon (16 threads)
#   xpanels the padded gradient panels (v89) off -> on on the Xeon, whole passes, one process
#   xscale issue 39: the Xeon's bf16 DS2 LSTM step on 4, 8 and 16 threads (profiled)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/device.txt
git log -1 --format=%h >> $OUT/device.txt 2>/dev/null
lscpu | grep -E "Model name|^CPU\(s\)" >> $OUT/device.txt
for part in "$@"; do
if [ $part = cuda ]; then
    timeout ${LIMIT:-420} python3 -m pytest -q -n ${WORKERS:-14} tests/test_cuda.py ${TESTS:+-k "$TESTS"} -rfE --durations=15 \
        > $OUT/test_cuda.txt 2>&1
    grep -E "^(FAILED|ERROR)" $OUT/test_cuda.txt | head -20; tail -1 $OUT/test_cuda.txt
fi
if [ $part = sweep ]; then
    timeout ${LIMIT:-400} python3 -m tvmrnn.cli.bench --device cuda --sweep ${SWEEP:-notes/bench/v89/gpu_sweep_8901.json} \
        --json $OUT/sweep.json 2>&1 | grep -v Warn | tee $OUT/sweep.txt | tail -30
fi
if [ $part = xsweep ]; then
    timeout ${LIMIT:-400} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep ${SWEEP:-notes/bench/v89/gpu_sweep_8901.json} \
        --json $OUT/xsweep.json 2>&1 | grep -v Warn | tee $OUT/xsweep.txt | tail -30
fi
if [ $part = xpanels ]; then
    timeout ${LIMIT:-300} python3 notes/bench/v89/cpu_flag_ab.py ${SHAPES:-lstm:20:467:467:100 lstm:13:354:354:50 lstm:20:247:161:62 lstm:5:1471:1024:50} \
        2>&1 | grep -v Warn | tee $OUT/xeon_padded_panels_ab.txt
fi
if [ $part = xscale ]; then
    for n in ${THREADS:-4 8 16}; do
        timeout ${LIMIT:-150} python3 -m tvmrnn.cli.bench --device cpu --threads $n --preset ds2 --num-layers 1 --no-train \
            --dtype bfloat16 --profile lstm 2>&1 | grep -v Warn > $OUT/xscale_$n.txt
        echo "threads $n"; grep -E "recurrent_step|input_projection_t16|bf16 both" $OUT/xscale_$n.txt
    done
fi
done
