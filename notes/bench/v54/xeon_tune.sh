# v54: the bf16 DS2 LSTM's 2 heaviest kernels tuned on the Xeon (template space) WITH the whole-pass check
# (v53's AMX fix in; v53's xeon2.sh ran before it), then --list
T='{"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16}'
mkdir -p /tmp/logs
timeout ${TUNE_S:-540} python3 -m tvmrnn.cli.tune lstm --input-size 800 --hidden-size 800 --batch-size 20 --dtype bfloat16 \
  --target "$T" --trials ${TRIALS:-16} --max-tasks ${TASKS:-2} --log-dir /tmp/logs > $OUT/tune.txt 2>&1; echo tune rc $? >> $OUT/tune.txt
tail -32 $OUT/tune.txt
python3 -m tvmrnn.cli.tune lstm --input-size 800 --hidden-size 800 --batch-size 20 --dtype bfloat16 --target "$T" --log-dir /tmp/logs --list > $OUT/list.txt 2>&1
grep -v "nan\| 0      0" $OUT/list.txt | head -20
tar -czf $OUT/logs.tgz -C /tmp logs
