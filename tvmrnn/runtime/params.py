"""PyTorch parameters in: ``params_from_torch`` turns a module or a state_dict into numpy arrays."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def params_from_torch(module_or_state_dict) -> dict[str, np.ndarray]:
    """``{PyTorch parameter name: float32 numpy array}`` from an ``nn.LSTM/GRU/RNN`` or its state_dict.

    The arrays of a module's float32 CPU parameters share their memory (NumPy's view of a tensor,
    no copy): they follow the module's training steps, and writing into one writes the module's
    parameter. Copy them (``{k: v.copy() for k, v in ...}``) to keep or edit a snapshot."""
    state = module_or_state_dict
    if hasattr(state, "state_dict") and callable(state.state_dict):
        state = state.state_dict()
    if not isinstance(state, Mapping):
        raise TypeError(f"params_from_torch: expected a torch.nn.Module or a state_dict, got {type(state).__name__}")
    out = {}
    for name, value in state.items():
        if hasattr(value, "detach"):
            value = value.detach().cpu().numpy()
        out[name] = np.ascontiguousarray(value, dtype=np.float32)
    return out
