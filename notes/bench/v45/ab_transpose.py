import numpy as np
from tvmrnn import kernels
import tvmrnn.schedules as S
from tvmrnn.schedules import default_schedule
from tvmrnn.runtime.profile import time_kernel
from tvmrnn.device import host_target
target = host_target()
orig = S.cpu_transpose
for k in (kernels.gate_transpose(4, 1024, 1024, panel=16), kernels.gate_transpose(3, 1024, 1024),
          kernels.gate_untranspose(4, 1024, 1024, panel=16), kernels.gate_transpose(4, 64, 32, panel=16),
          kernels.gate_untranspose(4, 64, 32, panel=16)):
    S.cpu_transpose = orig
    new = default_schedule(k, target)
    S.cpu_transpose = lambda *a, **kw: False
    old = default_schedule(k, target)
    r1, r2 = [], []
    tn = time_kernel(new, target, results=r1); to = time_kernel(old, target, results=r2)
    assert all(np.array_equal(a, b) for a, b in zip(r1, r2))
    print(k.name, f"old {to:.1f} new {tn:.1f} us")
