"""Cells of evidence as state indices: one reading for CSV and Parquet tables and pandas frames.

A cell is a state name, a state index, or missing. Numbers (integers, whole floats) are
state indices. Text is a state name, or an index written as text ("2"); it is stripped
and matched as written, then in lower case. Missing cells leave the variable unobserved
(-1): None, NaN, pandas' NA, -1, and the texts in UNOBSERVED_CELLS ("", "NA", "?", ...).

`cell_states` reads one column at once: each distinct cell is looked up once, so a column
of a million cells costs one pass to find its distinct values, not a million lookups.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Any

import numpy as np

from .graph import FactorGraph

UNOBSERVED = -1
UNOBSERVED_CELLS = {"", "na", "nan", "?", "-1", "none", "null"}
_NOT_A_STATE = -2  # a cell that names no state of its variable (cell_states' `bad`)


def state_codes(graph: FactorGraph, v: str) -> dict:
    """Cell text -> state index for variable v: its state names and its indices."""
    d = graph.variables[v]
    codes = {str(i): i for i in range(d)}
    codes.update({name: i for i, name in enumerate(graph.states.get(v, ()))})
    codes.update({c: UNOBSERVED for c in UNOBSERVED_CELLS})
    return codes


def cell_states(graph: FactorGraph, v: str, cells: Any) -> tuple[np.ndarray, np.ndarray]:
    """A column of cells for variable v as (states, bad): int64 state indices, -1 where
    unobserved, and a bool mask of the cells that are no state of v (their states -1).
    cells: a 1-D array, or a pandas Series (its text is factorized where it lies)."""
    series = cells if hasattr(cells, "factorize") and not isinstance(cells, np.ndarray) else None
    cells = np.asarray(cells) if series is None or series.dtype.kind in "iufb" else series
    d = graph.variables[v]
    if cells.dtype.kind in "iu":
        states = cells.astype(np.int64)
        bad = (states < UNOBSERVED) | (states >= d)
    elif cells.dtype.kind == "f":
        missing = np.isnan(cells)
        with np.errstate(invalid="ignore"):
            bad = ~missing & ((cells != np.round(cells)) | (cells < UNOBSERVED) | (cells >= d))
        states = np.where(missing | bad, UNOBSERVED, np.nan_to_num(cells)).astype(np.int64)
    else:  # text, objects (a pandas column of names, categories, nullable integers)
        inverse, distinct = _distinct(cells if series is not None else cells.ravel())
        codes = state_codes(graph, v)
        lookup = np.array([_state(x, codes, d) for x in distinct], dtype=np.int64)
        states = lookup[inverse] if len(distinct) else np.zeros(0, np.int64)
        bad = states == _NOT_A_STATE
        states[bad] = UNOBSERVED
    return states, bad


def _distinct(cells: Any) -> tuple[np.ndarray, list]:
    """(where each cell is among the distinct ones, the distinct cells in order of first
    appearance): pandas' hash table when pandas is loaded (a frame's cells, C speed), else
    a dict (a CSV chunk's)."""
    pd = sys.modules.get("pandas")
    if pd is not None:
        try:
            inverse, distinct = pd.factorize(cells, use_na_sentinel=False)  # (a Series: its own)
            return inverse.astype(np.int64, copy=False), list(distinct)
        except TypeError:  # an unhashable cell (a list): read below
            pass
    first: dict[Any, int] = {}
    try:
        inverse = np.fromiter((first.setdefault(x, len(first)) for x in cells.tolist()), np.int64, cells.size)
        return inverse, list(first)
    except TypeError:  # an unhashable cell: each read on its own
        return np.arange(len(cells), dtype=np.int64), list(cells)


def _state(cell: Any, codes: dict, d: int) -> int:
    """One distinct cell's state index, -1 unobserved, _NOT_A_STATE when it names none."""
    if cell is None or type(cell).__name__ in ("NAType", "NaTType"):  # pandas' missing values
        return UNOBSERVED
    if isinstance(cell, numbers.Integral) and not isinstance(cell, (bool, np.bool_)):
        i = int(cell)
        return i if UNOBSERVED <= i < d else _NOT_A_STATE
    if isinstance(cell, numbers.Real) and not isinstance(cell, (bool, np.bool_)):
        x = float(cell)
        if math.isnan(x):
            return UNOBSERVED
        return int(x) if x == int(x) and UNOBSERVED <= x < d else _NOT_A_STATE
    text = str(cell).strip()
    state = codes.get(text, codes.get(text.lower()))
    return _NOT_A_STATE if state is None else state
