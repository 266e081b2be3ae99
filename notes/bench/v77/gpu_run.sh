#!/usr/bin/env bash
# v77's GPU-machine calls, each under the 600 s limit (after the 3 packing calls):
#   bash notes/bench/v77/gpu_run.sh xeonab    # v77's CPU backward switches, off against on, on the Xeon (16 threads)
#   bash notes/bench/v77/gpu_run.sh rest      # test_cuda.py's second half (ids_rest.txt), for a run that timed out
#   others: v76's runbook (check, rowgroups, fewrows, blocks, profile), then v75's (xeonheld, gpuheld, ...)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
xeonab)
    for flag in tvmrnn.schedules.cpu.CPU_PADDED_BACKWARD_PANELS tvmrnn.program.passes.CPU_STAGED_WEIGHT_GRADIENTS; do
        FLAG=$flag THREADS=16 timeout ${2:-270} python3 notes/bench/v77/flag_ab.py ${SHAPES:-lstm:125:1:1024:1220 \
            lstm:100:20:467:467 lstm:125:4:800:800 lstm:100:5:1471:1471} 2>&1 | grep --line-buffered -v "Warn\|_compile" \
            | tee -a $OUT/xeon_flag_ab.txt
    done ;;
rest)
    timeout ${2:-560} python3 -m pytest -q -n 8 $(cat notes/bench/v77/ids_rest.txt) 2>&1 | tail -5 ;;
*) bash notes/bench/v76/gpu_run.sh "$@" ;;
esac
