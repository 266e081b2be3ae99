#!/usr/bin/env bash
# v90's runbook (v89 copy) for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   cuda   every CUDA test, LIMIT seconds (TESTS: a -k filter)
#   sweep  tvmrnn-bench --sweep SWEEP (default: this folder's held-out-like seed 8901) on the H100
#   xsweep the same on the Xeon (16 threads)
#   xpanels v89's CPU changes (padded gradient panels, guarded panel rows, GRU packs from 288 units) off -> on
#          on the Xeon, whole passes, one process (SWITCHES: cpu_flag_ab.py's)
#   profile the GPU's per-kernel times at the inference floor's shapes (many rows, few units)
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
    timeout ${LIMIT:-400} python3 -m tvmrnn.cli.bench --device cuda --sweep ${SWEEP:-notes/bench/v90/gpu_sweep_8901_rest.json} \
        --json $OUT/sweep.json 2>&1 | grep -v Warn | tee $OUT/sweep.txt | tail -30
fi
if [ $part = xsweep ]; then
    timeout ${LIMIT:-400} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep ${SWEEP:-notes/bench/v90/gpu_sweep_8901_rest.json} \
        --json $OUT/xsweep.json 2>&1 | grep -v Warn | tee $OUT/xsweep.txt | tail -30
fi
if [ $part = xpanels ]; then
    SWITCHES=${SWITCHES:-"tvmrnn.schedules.cpu.CPU_PADDED_GRADIENT_PANELS=False:True;tvmrnn.schedules.cpu.CPU_GUARDED_PANEL_ROWS=False:True;tvmrnn.program.passes.TWO_GRADIENT_PACKS_MIN_UNITS=512:288"} \
    timeout ${LIMIT:-300} python3 notes/bench/v89/cpu_flag_ab.py ${SHAPES:-lstm:20:467:467:100 lstm:13:354:354:50 lstm:20:247:161:62 gru:20:467:467:100 gru:13:354:354:50} \
        2>&1 | grep -v Warn | tee $OUT/xeon_padded_panels_ab.txt
fi
if [ $part = profile ]; then
    for shape in ${PSHAPES:-50:200:161:227 100:256:512:510}; do
        IFS=: read T N I H <<< "$shape"
        timeout ${LIMIT:-120} python3 -m tvmrnn.cli.bench --device cuda -T $T -N $N --input-size $I --hidden-size $H \
            --profile lstm gru 2>&1 | grep -v Warn > $OUT/profile_${T}_${N}_${I}_${H}.txt
        tail -4 $OUT/profile_${T}_${N}_${I}_${H}.txt
    done
fi
if [ $part = xscale ]; then
    for n in ${THREADS:-4 8 16}; do
        timeout ${LIMIT:-150} python3 -m tvmrnn.cli.bench --device cpu --threads $n --preset ds2 --num-layers 1 --no-train \
            --dtype bfloat16 --profile lstm 2>&1 | grep -v Warn > $OUT/xscale_$n.txt
        echo "threads $n"; grep -E "recurrent_step|input_projection_t16|bf16 both" $OUT/xscale_$n.txt
    done
fi
done
