#!/usr/bin/env bash
# This session's GPU calls (v61), each under the 600 s call limit:
#   bash notes/bench/v61/gpu_run.sh gemm          # cp.async pipelines against the default, kernel by kernel
#   bash notes/bench/v61/gpu_run.sh ab '{"async_stages": 3}'   # that default in whole passes
#   bash notes/bench/v61/gpu_run.sh tests         # the full CUDA file (~6 min)
#   bash notes/bench/v61/gpu_run.sh sweeps        # against cuDNN, with absolute times
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
gemm)
    timeout 330 python3 notes/bench/v61/gemm_async.py $OUT/gemm_large.jsonl scripts/configs/sweep_large.json \
        --kernels _t256_ _t32_ step --variants default async2 async3 async4_k8 async2_k32 --rounds 5 2>&1 \
        | grep -v Warn | tee $OUT/gemm_large.txt
    timeout 200 python3 notes/bench/v61/gemm_async.py $OUT/gemm_small.jsonl scripts/configs/sweep_batches.json \
        scripts/configs/ds2.json --kernels t256_n128_k128 t32_n128_k128 t256_n256_k256 t32_n64_k1024 t256_n64_k1024 \
        t256_n20_k800 t32_n20_k800 --variants default async2 async3 async4_k8 async2_k32 --rounds 5 2>&1 \
        | grep -v Warn | tee $OUT/gemm_small.txt ;;
ab)
    timeout 560 python3 notes/bench/v61/matmul_ab.py "$2" gru:256:2048:2048:50 lstm:256:1024:1024:50 \
        lstm:128:128:128:200 lstm:64:1024:1024:100 lstm:20:800:800:300 2>&1 | grep -v Warn | tee $OUT/matmul_ab.txt ;;
tests)
    timeout 560 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py 2>&1 | tail -30 | tee $OUT/test_cuda.txt ;;
sweeps)
    timeout 290 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_batches.json --max-seconds 1 \
        --json $OUT/sweep_batches.json 2>&1 | grep -v Warn | tee $OUT/sweep_batches.txt | tail -14
    timeout 290 python3 -m tvmrnn.cli.bench --device cuda --sweep scripts/configs/sweep_large.json --max-seconds 1 \
        --json $OUT/sweep_large.json 2>&1 | grep -v Warn | tee $OUT/sweep_large.txt | tail -14 ;;
*) echo "usage: $0 gemm|ab KNOBS|tests|sweeps"; exit 2 ;;
esac
