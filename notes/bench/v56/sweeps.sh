#!/usr/bin/env bash
# v56 GPU call: a sweep config into $OUT/<name>.txt, each row a process of its own (bench --sweep).
# usage: sweeps.sh OUT CONFIG [CONFIG ...]
OUT=$1; shift
for c in "$@"; do
  n=$(basename "$c" .json)
  python3 -m tvmrnn.cli.bench --device cuda --sweep "$c" --max-seconds 1 --json "$OUT/$n.json" > "$OUT/$n.txt" 2>&1
  tail -14 "$OUT/$n.txt"
done
