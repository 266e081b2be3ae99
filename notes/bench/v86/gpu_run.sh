#!/usr/bin/env bash
# v86's runbook for the GPU machine (after the packing calls of ../shared/gpu/pack.sh):
#   cuda     every CUDA test (v85's pipeline change: 65% of them ran in v85), LIMIT seconds
#   masks    the masked DS2 bidirectional LSTM profiled with training (forward_train, backward), and unmasked
#   gruab    issue 37's GRU at 32-160 rows: row groups against the few-row tiles / split-K (v85's A/B)
#   wave     v86's layer wavefront (inference of unidirectional stacks) against the layers one after another
#   training v86's training passes as a wavefront (layer_wavefront=True) checked and timed (for the next session)
export PYTHONPATH=/opt/tvmsite:$PWD TVMRNN_CACHE=off
part=${1:-cuda}
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $OUT/device.txt
git log -1 --format=%h >> $OUT/device.txt 2>/dev/null
if [ $part = cuda ]; then
    timeout ${LIMIT:-420} python3 -m pytest -q -n ${WORKERS:-14} tests/test_cuda.py ${TESTS:+-k "$TESTS"} -rfE \
        > $OUT/test_cuda_v86.txt 2>&1
    grep -E "^(FAILED|ERROR)" $OUT/test_cuda_v86.txt | head -20; tail -1 $OUT/test_cuda_v86.txt
fi
if [ $part = masks ]; then
    for opt in '{"variable_lengths": true}' '{"variable_lengths": false}'; do
        timeout 150 python3 -m tvmrnn.cli.bench --device cuda --bidirectional --num-layers 1 --reps 5 --profile \
            --options "$opt" lstm 2>&1 | grep -v Warn | tee -a $OUT/profile_masks_train.txt \
            | grep -E "recurrent_step|backward_step|ratio|pass"
    done
fi
if [ $part = gruab ]; then
    FLAG=tvmrnn.schedules.common.GPU_FEW_ROW_TILE_GATES OLD=None NEW=4 NEW_OPTIONS='{"row_groups": False}' \
        timeout ${LIMIT:-400} python3 notes/bench/v78/const_ab.py ${SHAPES:-gru:32:126:126:700:3 gru:64:128:128:300 gru:48:160:160:300} \
        2>&1 | grep -v Warn | tee $OUT/gru_rowgroups_ab.txt | tail -20
fi
if [ $part = wave ]; then
    # the layer wavefront (v86, on by default where it applies) against the layers one after another
    FLAG=tvmrnn.program.passes.WAVE_STEPS OLD=None NEW=64 NEW_OPTIONS='{"layer_wavefront": False}' \
        timeout ${LIMIT:-400} python3 notes/bench/v78/const_ab.py ${SHAPES:-gru:32:126:126:700:3 lstm:32:126:126:700:3 lstm:8:455:455:300:2 lstm:64:256:256:100:2 gru:16:320:320:200:4} \
        2>&1 | grep -v Warn | tee $OUT/wavefront_ab.txt | grep -v "^ "
fi
if [ $part = training ]; then
    # v86's training passes as a wavefront (layer_wavefront=True; not yet the default): correct and faster?
    timeout ${LIMIT:-300} python3 -m pytest -q -n 4 tests/test_cuda.py -k wavefront -rfE > $OUT/test_cuda_wavefront.txt 2>&1
    tail -3 $OUT/test_cuda_wavefront.txt
    WAVE=1 timeout ${LIMIT:-300} python3 notes/bench/v86/wave_check.py ${SHAPES:-gru:32:126:126:700:3 lstm:32:126:126:700:3 gru:128:256:256:200:3} \
        2>&1 | grep -v Warn | tee $OUT/wave_training.txt
fi
