#!/usr/bin/env bash
# The next session's GPU calls (v70's runbook), each under the 600 s call limit, in this order:
#   bash notes/bench/v70/gpu_run.sh tests     # the full CUDA file (v70 ran it on v69's defaults: 237 passed in 6:46 at -n 14;
#                                             #   at -n 12 it no longer fits 480 s)
#   bash notes/bench/v70/gpu_run.sh xeonodd   # notes/bench/v69/cpu_odd.json on the Xeon with v70's final rules
#                                             #   (guarded tiles at H = 37 too, guarded row tiles: not run there)
#   bash notes/bench/v70/gpu_run.sh xeonab    # guarded rows off -> on at two odd shapes, 16 threads (the Xeon's cores)
#   bash notes/bench/v70/gpu_run.sh xeon13    # 13 rows built for 15 against 16 on the Xeon (v68's 0.83x)
#   bash notes/bench/v70/gpu_run.sh xeon      # scripts/configs/sweep.json on the Xeon (last: v68)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests)
    timeout ${2:-570} python3 -m pytest -v -n 14 -p no:cacheprovider --durations=20 tests/test_cuda.py > $OUT/test_cuda.txt 2>&1
    grep -c PASSED $OUT/test_cuda.txt; grep -E "FAILED|ERROR" $OUT/test_cuda.txt | head; tail -3 $OUT/test_cuda.txt ;;
xeonodd) bash notes/bench/v69/gpu_run.sh xeonodd ${2:-560} ;;
xeonab)
    for a in "lstm 50 13 129 129" "lstm 30 2 37 37" "gru 50 13 129 129"; do
        echo "== $a"; THREADS=16 AB=CPU_GUARDED_ROWS timeout 150 python3 notes/bench/v70/guarded_tile_ab.py $a 2>&1 | grep -v Warn
    done | tee $OUT/xeon_guarded_rows_ab.txt ;;
xeon13) bash notes/bench/v68/gpu_run.sh xeon13 ;;
xeon) bash notes/bench/v68/gpu_run.sh xeon ;;
*) echo "usage: $0 tests|xeonodd|xeonab|xeon13|xeon"; exit 2 ;;
esac
