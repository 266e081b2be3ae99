"""v68: GPU builds (nvidia/nvidia-h100, compiled here, not run) at random shapes of the held-out range:
each must build (no ScheduleError, no shared-memory error). Prints a JSON line a case."""
import json, random, sys, time, traceback, warnings
warnings.simplefilter("ignore")
import tvmrnn
HIDDEN = (64, 65, 96, 128, 129, 200, 256, 320, 384, 511, 512, 640, 800, 1000, 1024, 1040, 1536, 2048)
BATCH = (1, 2, 3, 7, 8, 13, 20, 32, 64, 100, 128, 129, 160, 192, 256)
rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 68)
deadline = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 1200)
while time.time() < deadline:
    cell = rng.choice(("lstm", "gru", "rnn_tanh", "rnn_relu"))
    H, N = rng.choice(HIDDEN), rng.choice(BATCH)
    I = rng.choice((H, 13, 80, 1024))
    L, D = rng.choice((1, 1, 2)), rng.choice((False, True))
    case = dict(cell=cell, I=I, H=H, N=N, layers=L, bidirectional=D)
    t = time.time()
    try:
        rnn = tvmrnn.build(cell, input_size=I, hidden_size=H, num_layers=L, bidirectional=D, batch_size=N,
                           target="nvidia/nvidia-h100", cache=False)
        case["ok"] = True
    except Exception as e:
        case["ok"] = False
        case["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    case["seconds"] = round(time.time() - t, 1)
    print(json.dumps(case), flush=True)
