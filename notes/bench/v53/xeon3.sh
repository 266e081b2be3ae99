# after the runner's AMX fix: the bf16 DS2 LSTM's two heaviest kernels searched again on the Xeon (no pass check), then tuned against default
T='{"kind": "llvm", "mcpu": "sapphirerapids", "num-cores": 16}'
rm -rf /tmp/logs3 && mkdir -p /tmp/logs3
timeout ${TUNE_S:-100} python3 -m tvmrnn.cli.tune lstm --input-size 800 --hidden-size 800 --batch-size 20 --dtype bfloat16 \
  --target "$T" --trials ${TRIALS:-8} --max-tasks 2 --no-pass-check --log-dir /tmp/logs3 > $OUT/tune3.txt 2>&1; echo tune rc $? >> $OUT/tune3.txt
head -12 $OUT/tune3.txt
mkdir -p $OUT/logs3 && cp -r /tmp/logs3/* $OUT/logs3/
timeout ${BENCH_S:-90} python3 notes/bench/v53/tuned_vs_default.py /tmp/logs3 16 lstm:300:20:800:800 bfloat16 > $OUT/tuned_vs_default3.txt 2>&1; tail -4 $OUT/tuned_vs_default3.txt
