# the OpenMP pool against TVM's on the 16-core Xeon: drop-in steps in a PyTorch model, separate processes alternated
export TVMRNN_CACHE_DIR=/tmp/tvmrnn-cache
mkdir -p $OUT
for shape in "lstm 100 20 800 800" "gru 100 20 800 800" "lstm 100 8 256 256" "gru 50 64 512 512" "lstm 50 64 1024 1024"; do
  for i in 1 2; do for p in tvm auto; do
    TVMRNN_THREAD_POOL=$p timeout 200 python3 scratch/pool_one.py $shape 2>/dev/null | tail -1 | tee -a $OUT/xeon_pool.txt
  done; done
done
