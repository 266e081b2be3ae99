set -x
which perf gcc; lscpu | grep -E "Model name|L2|L3|NUMA node0"
gcc -O2 -mamx-tile -mamx-bf16 -o /tmp/amx_proj notes/bench/v53/amx_proj.c && /tmp/amx_proj > $OUT/amx_proj_1core.txt
for i in $(seq 0 15); do taskset -c $i /tmp/amx_proj > $OUT/amx_proj_16x_$i.txt & done; wait
for t in 16 8 4 1; do TVMRNN_THREAD_POOL=tvm TVM_NUM_THREADS=$t timeout 100 python3 notes/bench/v53/amx_projection.py $t 2,0 1,0 4,0 8,0 1,1 1,2 2,5 1,50 >> $OUT/amx_projection.txt 2>&1; done
cat $OUT/amx_proj_1core.txt; cat $OUT/amx_proj_16x_3.txt; cat $OUT/amx_projection.txt
