"""DDP with the drop-ins (scripts/ddp_train.py): two CPU ranks over gloo, tvmrnn's model and
torch.nn's trained side by side from the same weights on the same batches."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "ddp_train.py"


def test_ddp_on_two_cpu_ranks_trains_like_torch(tmp_path):
    """Losses as torch.nn's at every step, the ranks' weights identical after every all-reduce,
    one build per rank for the full batches and the short last one (the two ranks build the same
    entry of a shared build cache: one builds, the other waits for it)."""
    out = tmp_path / "ddp.json"
    env = dict(os.environ, TVMRNN_CACHE="on", TVMRNN_CACHE_DIR=str(tmp_path / "cache"), TVM_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(SCRIPT), "--device", "cpu", "-T", "9", "-N", "3", "--size", "11", "--num-layers", "1",
                           "--steps", "3", "--last-batch", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["world"] == 2 and len(result["losses"]["tvmrnn"]) == 4
    assert result["max_loss_rel_diff"] < 1e-5, result["losses"]
    assert result["rank_weight_spread"]["tvmrnn"] == 0.0 and result["rank_weight_spread"]["torch.nn"] == 0.0
    assert result["builds"] == 1
    assert len(list((tmp_path / "cache").rglob("*.so"))) == 1
