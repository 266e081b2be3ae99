#!/usr/bin/env bash
# v60: more GPU chunk sizes (256, 128, 64, 32, 4, 1) against the default (256, 32, 4, 1), whole passes
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
timeout ${1:-280} python3 notes/bench/v60/options_ab.py '{"chunk_steps": [256, 128, 64, 32, 4, 1]}' \
    ${SHAPES:-lstm:128:128:128:200 gru:128:128:128:200 lstm:64:1024:1024:100 lstm:32:512:512:200 lstm:256:256:256:100} \
    2>&1 | grep -v Warn | tee $OUT/chunks_ab.txt
