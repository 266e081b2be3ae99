"""Cells: each cell's math written once (:mod:`.definition`), its backward derived from it
(:mod:`.autodiff`), worked examples of custom cells (:mod:`.examples`), and the PyTorch-named
layout of a stack's parameters (:mod:`.parameters`). Everything after this package (kernels,
schedules, programs, tuning tasks, packages) is generated from a :class:`Cell`."""
from __future__ import annotations

import importlib

from .autodiff import CellDefinitionError
from .definition import CELLS, STANDARD_PARAMETERS, Cell, define_cell, get_cell

__all__ = ["CELLS", "STANDARD_PARAMETERS", "Cell", "CellDefinitionError", "define_cell", "get_cell",
           "find_cell"]


def find_cell(spec: str) -> Cell:
    """A cell named on a command line: a built-in cell, an example cell (:mod:`tvmrnn.cells.examples`),
    or ``module:attribute`` naming a :class:`Cell` in an importable module (``mycells:MY_CELL``)."""
    if spec in CELLS:
        return CELLS[spec]
    module, _, attribute = spec.partition(":")
    if not attribute:
        from .examples import EXAMPLES  # only here: a loaded package must not need the examples' math
        if spec in EXAMPLES:
            return EXAMPLES[spec]
        raise ValueError(f"cell: unknown cell {spec!r}; expected one of {sorted(CELLS) + sorted(EXAMPLES)} "
                         f"or module:attribute")
    cell = getattr(importlib.import_module(module), attribute, None)
    if not isinstance(cell, Cell):
        raise ValueError(f"cell: {spec!r} is not a tvmrnn Cell (make one with tvmrnn.define_cell)")
    return cell
