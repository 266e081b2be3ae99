export TVMRNN_CACHE_DIR=/tmp/tvmrnn-cache
mkdir -p $OUT
for shape in "gru 300 20 800 800 5" "lstm 50 64 1024 1024 5"; do
  for i in 1 2 3; do for p in auto tvm; do
    TVMRNN_THREAD_POOL=$p timeout 200 python3 scratch/dropin_vs_torch.py $shape 2>/dev/null | tail -1 | tee -a $OUT/xeon_dropin_vs_torch2.txt
  done; done
done
