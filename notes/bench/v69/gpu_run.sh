#!/usr/bin/env bash
# The next session's GPU calls (v69's runbook), each under the 600 s call limit, in this order:
#   bash notes/bench/v69/gpu_run.sh tests      # the full CUDA file on v69's GPU defaults (only 160 of its tests ran on them)
#   bash notes/bench/v69/gpu_run.sh gpusweep   # scripts/configs/sweep.json on the H200 with v69's defaults (v68: 1.81x / 1.78x)
#   bash notes/bench/v69/gpu_run.sh xeonodd    # notes/bench/v69/cpu_odd.json on the Xeon, 16 threads (v69's odd-H tiles)
#   bash notes/bench/v69/gpu_run.sh xeon13     # 13 rows built for 15 against 16 on the Xeon (v68's 0.83x)
#   bash notes/bench/v69/gpu_run.sh xeon       # scripts/configs/sweep.json on the Xeon (no odd H there: a check that nothing moved)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
case "$1" in
tests) bash notes/bench/v65/gpu_run.sh tests ;;
gpusweep) bash notes/bench/v68/gpu_run.sh gpusweep ;;
xeon13) bash notes/bench/v68/gpu_run.sh xeon13 ;;
xeon) bash notes/bench/v68/gpu_run.sh xeon ;;
xeonodd)
    timeout ${2:-560} python3 -m tvmrnn.cli.bench --device cpu --threads 16 --sweep notes/bench/v69/cpu_odd.json \
        --reps 5 --max-seconds 1 --json $OUT/xeon_odd.json 2>&1 | grep --line-buffered -v Warn > $OUT/xeon_odd.txt
    tail -14 $OUT/xeon_odd.txt ;;
*) echo "usage: $0 tests|gpusweep|xeonodd|xeon13|xeon"; exit 2 ;;
esac
