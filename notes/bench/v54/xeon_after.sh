# v54: the tuned logs of xeon_tune.sh (left in /tmp/logs on the same warm machine) against the defaults, whole DS2 passes
timeout 200 python3 notes/bench/v53/tuned_vs_default.py /tmp/logs 16 lstm:300:20:800:800 bfloat16 > $OUT/tuned_vs_default.txt 2>&1; tail -6 $OUT/tuned_vs_default.txt
