#!/usr/bin/env bash
# v59's GPU call: gate threads over the rows of unit-splitting persistent tiles (the new default)
# against the plain tile (gradients compared, passes timed), then the CUDA tests that take them.
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
timeout 230 python3 notes/bench/v58/gate_ab.py lstm:128:128:128:200 gru:128:160:160:100 lstm:256:128:128:100 \
    lstm:128:200:200:100 2>&1 | grep -v Warning > $OUT/unit_gate_ab.txt
timeout 150 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py -k "many_rows or row_groups" \
    2>&1 | tail -15 > $OUT/unit_gate_tests.txt
cat $OUT/unit_gate_ab.txt $OUT/unit_gate_tests.txt
