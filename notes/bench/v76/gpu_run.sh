#!/usr/bin/env bash
# v76's GPU-machine calls, each under the 600 s limit (after the 3 packing calls):
#   bash notes/bench/v76/gpu_run.sh blocks    # persistent block counts at small steps (block_sweep.py)
#   bash notes/bench/v76/gpu_run.sh profile   # where the 2-layer N=57 H=645 (and 640) LSTM's passes go
#   bash notes/bench/v76/gpu_run.sh rowgroups # persistent steps of row groups against split-K (row_groups_ab.py)
#   bash notes/bench/v76/gpu_run.sh check     # test_cuda's persistent tests (row groups included), then rowgroups
#   bash notes/bench/v76/gpu_run.sh fewrows   # the 9-64-row block counts swept again
#   others: v75's runbook (xeonheld, xeon, gpuheld, ...)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
blocks)
    nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/gpu.txt
    CAPS=${CAPS:-1,2,4,8,16,32} timeout ${2:-400} python3 notes/bench/v76/block_sweep.py ${SHAPES:-lstm:13:90:90:100 gru:13:90:90:100 \
        lstm:16:128:128:100 lstm:32:96:96:100 gru:32:128:128:100 lstm:24:256:256:100 lstm:12:320:320:100 lstm:64:64:64:100} \
        2>&1 | grep --line-buffered -v Warn | tee $OUT/block_sweep.txt ;;
profile)
    for H in ${HS:-645 640}; do
        timeout ${2:-150} python3 -m tvmrnn.cli.bench --device cuda -T 350 -N 57 --input-size 161 --hidden-size $H \
            --num-layers 2 --profile --reps 3 --max-seconds 1 lstm 2>&1 | grep --line-buffered -v Warn > $OUT/profile_h$H.txt
    done
    tail -5 $OUT/profile_h*.txt ;;
rowgroups)
    timeout ${2:-330} python3 notes/bench/v76/row_groups_ab.py ${SHAPES:-lstm:13:90:90:100 gru:13:90:90:100 lstm:32:96:96:100 \
        gru:100:100:100:100 lstm:1:64:64:100 lstm:8:96:96:100 lstm:64:64:64:100 lstm:20:100:100:100:bi} \
        2>&1 | grep --line-buffered -v Warn | tee $OUT/row_groups_ab.txt ;;
check)  # the next session's first call: v76's GPU changes tested, then A/B'd (row groups) and swept (block counts)
    timeout 240 python3 -m pytest -q -x -n 4 tests/test_cuda.py -k "row_group or capped or held_to_other or persistent" \
        2>&1 | tail -5 > $OUT/test_cuda_v76.txt; cat $OUT/test_cuda_v76.txt
    bash notes/bench/v76/gpu_run.sh rowgroups 300 ;;
fewrows)  # the 9-64-row block rule against 132 blocks and its neighbours (row groups off: split-K)
    CAPS=${CAPS:-16,32,64,132} SHAPES=${SHAPES:-"lstm:16:128:128:100 lstm:24:256:256:100 lstm:40:200:200:100 gru:48:160:160:100"} \
        bash notes/bench/v76/gpu_run.sh blocks ${2:-400} ;;
*) bash notes/bench/v75/gpu_run.sh "$@" ;;
esac
