"""v68: the input-projection launches a GPU forward makes, without and with the GPU_GEMM_FULL_ROWS tails (no GPU needed)."""
import tvm
from tvmrnn.program import passes
from tvmrnn.cells.definition import get_cell
from tvmrnn.options import BuildOptions
from tvmrnn import schedules
target = tvm.target.Target("nvidia/nvidia-h100")
shapes = [("lstm", 20, 800, 300), ("gru", 12, 2048, 60), ("lstm", 24, 1280, 120), ("lstm", 1, 96, 60),
          ("lstm", 48, 640, 150), ("lstm", 8, 320, 400), ("lstm", 4, 192, 700), ("lstm", 32, 512, 100),
          ("lstm", 16, 400, 200), ("gru", 12, 2048, 100), ("lstm", 1, 1024, 100), ("lstm", 64, 1024, 100),
          ("lstm", 20, 800, 100), ("lstm", 20, 800, 500), ("lstm", 2, 2048, 1000)]
for cell, N, H, T in shapes:
    cfg = passes.Config(get_cell(cell), H, H, 1, False, N, False, BuildOptions())
    out = []
    for rows in (0, 256):
        passes.tail_rows = lambda target, r=rows: r
        progs = passes.all_programs(cfg, lambda k: k.func, target)
        fwd = progs[0]
        calls = {k: v for k, v in fwd.calls(T).items() if k.startswith("input_projection")}
        out.append(calls)
    print(cell, N, H, T, out[0], "->", out[1])
