#!/usr/bin/env bash
# v82's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   cuda   the CUDA tests v81's drop-in change (_Fused in the new style, torch.func.grad) touches
#   xeon   on the Xeon, 16 threads: tune the LSTM backward step at N=24 H=423 (28 parallel tasks
#          for 16 cores with the default tile) and bench the pass with and without the records
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-cuda}
if [ $part = cuda ]; then
    timeout ${LIMIT:-400} python3 -m pytest -v -n ${WORKERS:-12} tests/test_cuda.py -k "dropin or func_grad or packed_sequences_on_cuda or variable_lengths_match_torch_packed or projections_match or autocast_returns or fuzzed_contract or h100_package or build_cache_on_cuda or smaller_batches or inductor" > $OUT/test_cuda_v82.txt 2>&1
    echo "passed $(grep -cE ' PASSED' $OUT/test_cuda_v82.txt)"
    grep -E " (FAILED|ERROR)" $OUT/test_cuda_v82.txt | head; tail -2 $OUT/test_cuda_v82.txt
fi
if [ $part = xeon ]; then
    export TVM_NUM_THREADS=16 OMP_NUM_THREADS=16
    mkdir -p $OUT/logs
    timeout ${LIMIT:-300} python3 -m tvmrnn.cli.tune lstm --input-size 161 --hidden-size 423 --batch-size 24 \
        --target cpu --kernels backward_step --trials 24 --trials-per-iter 8 --log-dir $OUT/logs > $OUT/xeon_tune.txt 2>&1
    tail -15 $OUT/xeon_tune.txt
    python3 -m tvmrnn.cli.tune --list --log-dir $OUT/logs --target cpu 2>&1 | tail -8
    for logs in tuning_logs $OUT/logs; do
        timeout 120 python3 -m tvmrnn.cli.bench --device cpu --threads 16 -T 100 -N 24 --input-size 161 --hidden-size 423 \
            --tuning-logs $logs --profile --reps 5 --max-seconds 3 lstm 2>&1 | tail -25 | tee -a $OUT/xeon_bench.txt
    done
fi
if [ $part = steps ]; then  # the step kernels' register tiles on the Xeon (notes/bench/v82/step_tiles.py)
    export TVM_NUM_THREADS=16 OMP_NUM_THREADS=16
    JOBS=14 timeout ${LIMIT:-400} python3 notes/bench/v82/step_tiles.py lstm:24:161:423 gru:24:161:423 lstm:64:256:256 lstm:129:161:292 lstm:48:256:423 \
        lstm:256:512:512 lstm:20:800:800 lstm:5:900:900 gru:64:256:256 lstm:32:512:343 lstm:12:256:256 \
        2>&1 | grep -v -e Warn -e "return _compile" | tee $OUT/xeon_step_tiles.txt
fi
if [ $part = tall ]; then  # CPU_TALL_STEP_TILES off -> on, whole training passes on the Xeon (16 threads)
    for shape in lstm:100:24:161:423 gru:100:24:161:423 lstm:50:130:161:292; do
        for v in False True False True; do
            FLAG=tvmrnn.schedules.cpu.CPU_TALL_STEP_TILES VALUE=$v THREADS=16 timeout 100 python3 notes/bench/v78/flag_one.py $shape 2>&1 \
                | grep --line-buffered training | tee -a $OUT/xeon_tall.txt
        done
    done
fi
if [ $part = rules ]; then  # the backward step's tile rules alone (old / tall / new), then the tasks rule in whole passes
    export TVM_NUM_THREADS=16 OMP_NUM_THREADS=16
    (cd notes/bench/v82 && JOBS=14 ROUNDS=15 timeout 150 python3 step_rules_ab.py lstm:24:161:423 gru:24:161:423 lstm:48:256:423 \
        lstm:32:512:343 lstm:12:256:256 lstm:20:800:800 lstm:64:256:256 gru:16:910:910 \
        2>&1 | grep -v -e Warn -e "return _compile" | tee $OUT/xeon_step_rules.txt)
    for shape in ${PASSES:-}; do
        for v in False True False True; do
            FLAG=tvmrnn.schedules.cpu.CPU_STEP_TILES_BY_CORES VALUE=$v THREADS=16 timeout 40 python3 notes/bench/v78/flag_one.py $shape 2>&1 \
                | grep --line-buffered training | tee -a $OUT/xeon_tasks.txt
        done
    done
fi
