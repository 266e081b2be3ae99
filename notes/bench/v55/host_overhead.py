"""Where a small pass's time goes beyond its kernels (v55): batch 1, H = 96, T = 60 on the GPU.
``rnn.forward`` against the compiled pass called directly with the same arrays, each waited for
(medians of 300), the host time of ``rnn.forward`` alone (no wait), cuDNN's forward, and a cProfile
of 500 calls of ``rnn.forward``.

    python notes/bench/v55/host_overhead.py lstm 1 96 60
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
import warnings

import torch

import tvmrnn
from tvmrnn.runtime.arrays import to_tvm


def median_us(fn, sync, n=300):
    fn()
    sync()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return 1e6 * statistics.median(times)


def main(cell, n, h, T):
    warnings.simplefilter("ignore")
    n, h, T = int(n), int(h), int(T)
    ref = (torch.nn.LSTM if cell == "lstm" else torch.nn.GRU)(h, h).cuda()
    rnn = tvmrnn.build(cell, input_size=h, hidden_size=h, batch_size=n, target="cuda", tuning_logs=False, cache=False)
    w = rnn.pack_weights(tvmrnn.params_from_torch(ref))
    x = torch.randn(T, n, h, device="cuda")
    sync = torch.cuda.synchronize
    arrays = {}
    rnn.forward(w, x)
    fn = rnn._function("forward")
    shapes = rnn._shapes_of("forward", T)
    given = {"x": x, "w": w.flat}
    args = []
    for name, shape in shapes.items():
        a = given.get(name)
        if a is None:
            a = torch.zeros(shape, device="cuda")
        arrays[name] = a
        args.append(to_tvm(a))
    import tvm_ffi

    def direct():
        with tvm_ffi.use_torch_stream():
            fn(*args)

    def bare():
        fn(*args)

    with torch.no_grad():
        print(f"{cell} N={n} H={h} T={T}")
        print(f"  rnn.forward, waited:        {median_us(lambda: rnn.forward(w, x), sync):8.1f} us")
        print(f"  pass called directly:       {median_us(direct, sync):8.1f} us")
        print(f"  ... without use_torch_stream: {median_us(bare, sync):8.1f} us")
        print(f"  rnn.forward, host only:     {median_us(lambda: rnn.forward(w, x), lambda: None):8.1f} us")
        sync()
        print(f"  direct, host only:          {median_us(direct, lambda: None):8.1f} us")
        sync()
        print(f"  use_torch_stream alone:     {median_us(lambda: tvm_ffi.use_torch_stream().__enter__(), lambda: None):8.1f} us")
        print(f"  cuDNN forward, waited:      {median_us(lambda: ref(x), sync):8.1f} us")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(500):
            rnn.forward(w, x)
        sync()
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main(*sys.argv[1:])
