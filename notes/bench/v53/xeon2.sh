# the bf16 DS2 LSTM's heaviest kernels tuned on the Xeon (template space, whole-pass check), then tuned against default
T='{"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16}'
mkdir -p /tmp/logs
timeout ${TUNE_S:-330} python3 -m tvmrnn.cli.tune lstm --input-size 800 --hidden-size 800 --batch-size 20 --dtype bfloat16 \
  --target "$T" --trials ${TRIALS:-16} --max-tasks ${TASKS:-2} --log-dir /tmp/logs > $OUT/tune.txt 2>&1; echo tune rc $? >> $OUT/tune.txt
tail -25 $OUT/tune.txt
python3 -m tvmrnn.cli.tune lstm --input-size 800 --hidden-size 800 --batch-size 20 --dtype bfloat16 --target "$T" --log-dir /tmp/logs --list > $OUT/list.txt 2>&1
mkdir -p $OUT/logs && cp -r /tmp/logs/* $OUT/logs/
grep -v "nan\| 0      0" $OUT/list.txt | head -20
timeout 150 python3 notes/bench/v53/tuned_vs_default.py /tmp/logs 16 lstm:300:20:800:800 bfloat16 > $OUT/tuned_vs_default.txt 2>&1; cat $OUT/tuned_vs_default.txt | tail -5
