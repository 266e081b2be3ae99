#!/usr/bin/env bash
# v78's GPU-machine call (after the 3 packing calls): bash notes/bench/v78/gpu_run.sh [part]
#   tests     the new GPU test (padded slices at few rows) and the split-step tests
#   backward  GPU_BACKWARD_MATMUL_ROWS + GPU_MATMUL_PADDED_SLICES, off against on (const_ab.py)
#   ladder    the wide chunk ladder with 16 and 8 at 16-63 rows (NEW_OPTIONS)
#   xeon      the Xeon's LSTM training losses profiled (16 threads)
#   xeonab    v78's CPU transpositions off against on, a process a side, on the Xeon (16 threads)
#   held      the random GPU shapes of seed 7804 again, with v78's defaults (the table before them:
#             gpu_heldout_7804.txt)
#   cuda1/cuda2  tests/test_cuda.py in two calls (the whole file passes 420 s at -n 6)
#   all       tests, backward, ladder, xeon in turn (this session's call)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-all}
if [ $part = tests ] || [ $part = all ]; then
    timeout 100 python3 -m pytest -q -n 4 tests/test_cuda.py -k "padded_slices or split_over_blocks" 2>&1 | tail -3 | tee $OUT/test_cuda_v78.txt
fi
if [ $part = backward ] || [ $part = all ]; then
    SWITCHES="tvmrnn.schedules.common.GPU_BACKWARD_MATMUL_ROWS=1000000000:32;tvmrnn.schedules.cuda.GPU_MATMUL_PADDED_SLICES=False:True" \
        timeout 230 python3 notes/bench/v78/const_ab.py ${SHAPES:-lstm:57:645:161:200 gru:57:645:161:200 lstm:100:1024:1024:100 \
        lstm:40:700:700:100 lstm:57:645:645:100:3} 2>&1 | grep --line-buffered -v Warn | tee $OUT/backward_matmul_ab.txt
fi
if [ $part = ladder ] || [ $part = all ]; then
    FLAG=tvmrnn.program.passes.SHARED_BIAS_GRADIENTS OLD=True NEW=True NEW_OPTIONS="{'chunk_steps': (256, 128, 64, 32, 16, 8, 4, 1)}" \
        timeout 90 python3 notes/bench/v78/const_ab.py gru:32:126:126:200:3 lstm:32:126:126:200:3 2>&1 | grep --line-buffered -v Warn \
        | tee $OUT/ladder_ab.txt
fi
if [ $part = xeon ] || [ $part = all ]; then
    timeout 50 python3 -m tvmrnn.cli.bench --device cpu --threads 16 -T 100 -N 20 --input-size 467 --hidden-size 467 --profile \
        --reps 3 --max-seconds 1 lstm 2>&1 | grep -v Warn > $OUT/xeon_profile_lstm_n20_h467.txt; tail -4 $OUT/xeon_profile_lstm_n20_h467.txt
fi
if [ $part = xeonab ]; then
    for v in False True; do
        FLAG=tvmrnn.schedules.cpu.CPU_GUARDED_TRANSPOSES VALUE=$v THREADS=16 timeout 200 python3 notes/bench/v78/flag_one.py \
            lstm:100:5:1471:1471 lstm:100:20:467:467 2>&1 | grep --line-buffered training | tee -a $OUT/xeon_guarded_transposes.txt
    done
fi
if [ $part = held ]; then
    timeout ${2:-540} python3 -m tvmrnn.cli.bench --device cuda --sweep notes/bench/v78/gpu_heldout_7804.json --reps 5 \
        --max-seconds 2 --json $OUT/gpu_heldout_7804_after.json 2>&1 | grep --line-buffered -v Warn > $OUT/gpu_heldout_7804_after.txt
    tail -14 $OUT/gpu_heldout_7804_after.txt
fi
if [ $part = cuda1 ]; then
    timeout 560 python3 -m pytest -q -n 8 tests/test_cuda.py 2>&1 | tail -5 | tee $OUT/test_cuda_1.txt
fi
if [ $part = cuda2 ]; then  # what cuda1 did not reach: pass the ids left (pytest --co -q, minus those run)
    timeout 560 python3 -m pytest -q -n 8 $(cat ${IDS:-notes/bench/v77/ids_rest.txt}) 2>&1 | tail -5 | tee $OUT/test_cuda_2.txt
fi
