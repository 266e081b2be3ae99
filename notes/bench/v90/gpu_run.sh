#!/usr/bin/env bash
# v90's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh): v89's parts
# (notes/bench/v89/gpu_run.sh: cuda, sweep, xsweep, xpanels, xscale) with v90's defaults, plus
#   sweep, xsweep  default SWEEP: this folder's rest of seed 8901
#   xpanels v89's three CPU changes (padded gradient panels, guarded panel rows, GRU packs from 288
#          units) off -> on on the Xeon, whole passes, one process (SWITCHES: cpu_flag_ab.py's)
#   profile the GPU's per-kernel times at the inference floor's shapes (many rows, few units; PSHAPES)
export SWEEP=${SWEEP:-notes/bench/v90/gpu_sweep_8901_rest.json}
export SHAPES=${SHAPES:-"lstm:20:467:467:100 lstm:13:354:354:50 lstm:20:247:161:62 gru:20:467:467:100 gru:13:354:354:50"}
for part in "$@"; do
if [ $part = profile ]; then
    export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
    for shape in ${PSHAPES:-50:200:161:227 100:256:512:510}; do
        IFS=: read T N I H <<< "$shape"
        timeout ${LIMIT:-120} python3 -m tvmrnn.cli.bench --device cuda -T $T -N $N --input-size $I --hidden-size $H \
            --profile lstm gru 2>&1 | grep -v Warn > $OUT/profile_${T}_${N}_${I}_${H}.txt
        tail -4 $OUT/profile_${T}_${N}_${I}_${H}.txt
    done
elif [ $part = xpanels ]; then
    SWITCHES=${SWITCHES:-"tvmrnn.schedules.cpu.CPU_PADDED_GRADIENT_PANELS=False:True;tvmrnn.schedules.cpu.CPU_GUARDED_PANEL_ROWS=False:True;tvmrnn.program.passes.TWO_GRADIENT_PACKS_MIN_UNITS=512:288"} \
        bash notes/bench/v89/gpu_run.sh $part
else
    bash notes/bench/v89/gpu_run.sh $part
fi
done
