"""tvmrnn: fused LSTM, GRU and vanilla RNN layers, and cells of your own (``define_cell``),
written once as TVM tensor expressions.

>>> rnn = tvmrnn.build("lstm", input_size=13, hidden_size=37, batch_size=3)
>>> w = rnn.pack_weights(tvmrnn.params_from_torch(torch_lstm))
>>> y, hy, cy = rnn.forward(w, x)
"""
__version__ = "0.1.0"

from .cells.autodiff import CellDefinitionError
from .options import BuildOptions
from .cells.definition import CELLS, Cell, define_cell, get_cell
from .runtime.rnn import RNN, PackedWeights, Workspace
from .runtime.build import Plan, build, plan
from .runtime.params import params_from_torch
from .runtime.package import PackageError
from .runtime.loader import load
from .program.sequence import SharedMemoryError

__all__ = ["build", "plan", "Plan", "BuildOptions", "RNN", "PackedWeights", "Workspace", "params_from_torch", "Cell",
           "CELLS", "define_cell", "get_cell", "CellDefinitionError", "load", "PackageError", "SharedMemoryError"]
