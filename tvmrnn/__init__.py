"""tvmrnn: fused LSTM, GRU and vanilla RNN layers, and cells of your own (``define_cell``),
written once as TVM tensor expressions.

>>> rnn = tvmrnn.build("lstm", input_size=13, hidden_size=37, batch_size=3)
>>> w = rnn.pack_weights(tvmrnn.params_from_torch(torch_lstm))
>>> y, hy, cy = rnn.forward(w, x)
"""
__version__ = "0.1.0"

import os as _os


def _default_threads() -> None:
    """Run CPU kernels on every core by default, as PyTorch does.

    TVM's thread pool, without ``TVM_NUM_THREADS`` or ``OMP_NUM_THREADS``, takes half the logical
    CPUs on x86 (it assumes two hyperthreads per core): one thread on the 2-core dev machine, 8 on
    the GPU machine's 16-core Xeon (one thread per core there), and MetaSchedule's runner timed
    kernels at that count too. The pool reads the variable when it starts (the first parallel
    kernel), so it is set here, on import, to the physical cores this process may run on. Set
    either variable yourself to choose.
    """
    if "TVM_NUM_THREADS" in _os.environ or "OMP_NUM_THREADS" in _os.environ:
        return
    allowed = len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity") else (_os.cpu_count() or 1)
    try:
        import psutil
        physical = psutil.cpu_count(logical=False) or allowed
    except ImportError:
        physical = allowed
    _os.environ["TVM_NUM_THREADS"] = str(max(1, min(allowed, physical)))


_default_threads()

from .cells.autodiff import CellDefinitionError
from .cells.definition import CELLS, Cell, define_cell, get_cell
from .runtime.rnn import RNN, PackedWeights, Workspace, build
from .runtime.params import params_from_torch
from .runtime.package import PackageError
from .runtime.loader import load
from .program.sequence import SharedMemoryError

__all__ = ["build", "RNN", "PackedWeights", "Workspace", "params_from_torch", "Cell", "CELLS",
           "define_cell", "get_cell", "CellDefinitionError", "load", "PackageError", "SharedMemoryError"]
