import sys, traceback
sys.path.insert(0, "tests")
import fuzz, conftest
from fuzz import Build, Call, Case
from tvmrnn.program import passes
fuzz.event = lambda *a, **k: None
b = Build(cell='rnn_tanh', input_size=1, hidden_size=1, batch_size=1, num_layers=2, bidirectional=True, batch_first=True)
for tails in (64 * 10**6, 0):
    passes.GPU_TAIL_FLOPS = tails
    conftest._cache_clear(); fuzz._PACKAGES.clear()
    for packaged in (True, False):
        for seed in (1, 2):
            for T in (10, 37):
                case = Case(b, packaged, False, (Call(T, 1, False, True, False, False, False, None, None, seed),))
                try:
                    fuzz.run_case(case, target="cuda", device="cuda"); r = "ok"
                except AssertionError as e:
                    r = str(e).splitlines()[0][:150]
                print(f"tails={tails} packaged={packaged} seed={seed} T={T}: {r}", flush=True)
