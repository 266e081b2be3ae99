#!/usr/bin/env bash
# v56: timeline.py at the floor shapes, into $1/timelines.txt
OUT=$1
for a in "lstm 128 96 100" "lstm 128 128 200" "lstm 128 128 200 --train" "gru 128 128 200" "lstm 1 96 60" "lstm 8 128 100 --train"; do
  python3 notes/bench/v56/timeline.py $a 2>&1 | grep -v -i warn
done > "$OUT/timelines.txt"
