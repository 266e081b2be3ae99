#!/usr/bin/env bash
# v91's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh): v90's parts
# (notes/bench/v90/gpu_run.sh: cuda, sweep, xsweep, xpanels, xscale, profile), SWEEP defaulting to
# the last two shapes of seed 8901, plus
#   xab  issue 39: the Xeon's bf16 DS2 LSTM (1 layer) before and after v91's state rounding kernel
#        (a time loop of bf16 steps one parallel region). "old" is the package at 338715b, unpacked
#        into ab_old/ (untracked; `git archive 338715b tvmrnn | tar -x -C ab_old`), "new" this tree;
#        each side's build cached in a folder of its own, the runs alternated (THREADS, REPS)
#   padab the GPU's padded step reductions off / on against cuDNN (padded_ab.py; PADSHAPES)
#   pkab the same A/B in one process: notes/bench/v91/package_ab.py on ab_pk/old_NAME.so and
#        ab_pk/new_NAME.so (tvmrnn-export on the dev VM for the Xeon, untracked) for NAME in PKGS
export SWEEP=${SWEEP:-notes/bench/v91/gpu_sweep_8901_last.json}
for part in "$@"; do
if [ $part = xab ]; then
    for n in ${THREADS:-16 8}; do
        for rep in $(seq ${REPS:-2}); do
            for tree in old new; do
                root=$PWD; [ $tree = old ] && root=$PWD/ab_old
                # (from its own folder: `python -m` puts the working directory first on the path)
                (cd $root && PYTHONPATH=/opt/tvmsite:$root TVMRNN_CACHE_DIR=/tmp/tvmrnn_cache_$tree timeout ${LIMIT:-150} \
                    python3 -m tvmrnn.cli.bench --device cpu --threads $n --preset ds2 --num-layers 1 ${TRAIN---no-train} \
                    --dtype bfloat16 lstm 2>&1 | grep -v Warn > $OUT/xab_${n}_${tree}_$rep.txt)
                echo "threads $n $tree rep $rep: $(grep -E 'bf16 both|bf16 vs' $OUT/xab_${n}_${tree}_$rep.txt | tr -s ' ' | cut -c1-200)"
            done
        done
    done
elif [ $part = padab ]; then  # passes.GPU_PADDED_REDUCTION off / on / cuDNN (SHAPES: CELL:T:N:I:H:L ...)
    PYTHONPATH=/opt/tvmsite:$PWD timeout ${LIMIT:-400} python3 notes/bench/v91/padded_ab.py ${PADSHAPES:-} 2>&1 \
        | grep -v Warn | tee $OUT/padded_ab.txt
elif [ $part = pkab ]; then  # package_ab.py on ab_pk/old_NAME.so, new_NAME.so (exported on the dev VM, untracked)
    for n in ${THREADS:-16 8}; do
        for name in ${PKGS:-lstm1 gru1 lstm5bi}; do
            TVM_NUM_THREADS=$n PYTHONPATH=/opt/tvmsite:$PWD timeout ${LIMIT:-200} python3 notes/bench/v91/package_ab.py \
                ab_pk/old_$name.so ab_pk/new_$name.so ${REPS:-20} 2>&1 | grep -v Warn | tee $OUT/pkab_${name}_$n.txt
        done
    done
else
    bash notes/bench/v90/gpu_run.sh $part
fi
done
