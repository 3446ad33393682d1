"""pandas in and out: evidence frames as state tables, answers as frames.

A frame of evidence has a column per evidence variable (any subset of the model's; the
others stay unobserved) and a row per case; its cells are read as cells.py reads any
table's (names, indices, NaN/None/NA for unobserved). Answers keep the frame's index.

Posteriors come as a wide frame (`log_Z`, then one column per variable and state named
`var=state`, as the CLI's posterior tables) or a long one (a row per case, variable and
state: `row`, `variable`, `state`, `probability`). MPE rows come as `log_value` and a
column per variable holding its state (the name where the model has names).

pandas is not a dependency of the core: nothing here imports it until a frame is given
or asked for (the `pandas` extra installs it).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import name_list
from .cells import UNOBSERVED, cell_states
from .graph import FactorGraph, FactorGraphError

if TYPE_CHECKING:
    from .batch import BatchSolution


def pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("answers as DataFrames need pandas (pip install 'catbp_jit[pandas]')") from None
    return pd


def is_frame(x: Any) -> bool:
    """Whether x is a pandas DataFrame (without importing pandas when nobody has)."""
    pd = sys.modules.get("pandas")
    return pd is not None and isinstance(x, pd.DataFrame)


def frame_states(model: Any, frame: Any) -> np.ndarray:
    """A frame of evidence as the (rows, model.evidence_columns) int64 table solve_batch
    runs, -1 unobserved. model: anything with .graph and .evidence_columns. A bad cell is
    a FactorGraphError naming the model, the row (the frame's index) and the column."""
    graph, columns = model.graph, tuple(model.evidence_columns)
    names = list(frame.columns)
    unknown = [c for c in names if c not in columns]
    if unknown or len(set(names)) != len(names):
        raise FactorGraphError(
            f"{graph.name}: the frame's columns must be distinct evidence variables of this model "
            f"({name_list(columns, repr) or 'none'}); unknown or repeated: "
            f"{name_list(unknown, repr) or 'repeated'} (compile with evidence_vars= naming them)"
        )
    out = np.full((len(frame), len(columns)), UNOBSERVED, dtype=np.int64)
    for j, v in enumerate(columns):
        if v in names:
            out[:, j], bad = cell_states(graph, v, frame[v])
            if bad.any():
                _bad_cell(graph, frame, bad, v, frame[v].to_numpy())
    return out


def _bad_cell(graph: FactorGraph, frame: Any, bad: np.ndarray, v: str, cells: Any) -> None:
    i = int(np.flatnonzero(bad)[0])
    row = frame.index[i]
    row = row.item() if isinstance(row, np.generic) else row  # 11, not np.int64(11)
    cell = cells[i].item() if isinstance(cells[i], np.generic) else cells[i]
    d = graph.variables[v]
    names = graph.states.get(v)
    allowed = f"0..{d - 1}" + (f" or one of {name_list(names, repr)}" if names else "")
    raise FactorGraphError(
        f"{graph.name}: evidence row {row!r}: {v}={cell!r} is not a state of {v} "
        f"({allowed}; missing or -1: unobserved)"
    )


def state_labels(graph: FactorGraph, v: str) -> list[Any]:
    """Variable v's states as answers show them: its names, else its indices."""
    return list(graph.states.get(v) or range(graph.variables[v]))


def posterior_frame(
    res: BatchSolution, graph: FactorGraph, index: Any, variables: Any = None, long: bool = False
) -> Any:
    """res's answers as a DataFrame (see the module's text); variables: whose posteriors
    (default all; log_Z is always there in the wide form)."""
    pd = pandas()
    variables = list(graph.variables if variables is None else variables)
    index = pd.RangeIndex(len(res)) if index is None else index
    if long:
        return _long_frame(pd, res, graph, index, variables)
    data: dict[str, Any] = {"log_Z": res.log_Z}
    if res.counts is not None:  # SAT, COUNT: Z exactly
        data["Z"] = res.counts
    for v in variables:
        for s, label in enumerate(state_labels(graph, v)):
            data[f"{v}={label}"] = res.marginals[v][:, s]
    return pd.DataFrame(data, index=index)


def _long_frame(pd: Any, res: BatchSolution, graph: FactorGraph, index: Any, variables: list[str]) -> Any:
    """A row per (case, variable, state): cases outermost, then variables, then states."""
    n = len(res)
    blocks = [np.asarray(res.marginals[v]) for v in variables]
    sizes = [graph.variables[v] for v in variables]
    width = sum(sizes)
    values = np.concatenate(blocks, axis=1) if blocks else np.zeros((n, 0))
    labels = [lab for v in variables for lab in state_labels(graph, v)]
    return pd.DataFrame(
        {
            "row": np.repeat(np.asarray(index), width),
            "variable": np.tile(np.repeat(np.array(variables, dtype=object), sizes), n),
            "state": np.tile(np.array(labels, dtype=object), n),
            "probability": values.reshape(-1),
        }
    )


def mpe_frame(
    assignments: np.ndarray,
    log_values: np.ndarray,
    columns: tuple[str, ...],
    graph: FactorGraph,
    index: Any,
    variables: Any = None,
    names: bool = True,
) -> Any:
    """MPE rows (tasks.MPEBatch's fields: assignments' columns are `columns`) as a
    DataFrame: log_value, then each variable's state (names: a categorical of its state
    names where the model has names; else indices). A row whose evidence is impossible has
    log_value -inf and missing states."""
    pd = pandas()
    index = pd.RangeIndex(len(log_values)) if index is None else index
    data: dict[str, Any] = {"log_value": log_values}
    at = {v: j for j, v in enumerate(columns)}
    for v in graph.variables if variables is None else variables:
        data[v] = _state_column(pd, graph, v, assignments[:, at[v]], names)
    return pd.DataFrame(data, index=index)


def _state_column(pd: Any, graph: FactorGraph, v: str, states: np.ndarray, names: bool) -> Any:
    impossible = states < 0
    if names and v in graph.states:  # categories: one small table of names, codes per row
        return pd.Categorical.from_codes(np.where(impossible, -1, states), categories=list(graph.states[v]))
    column = pd.array(states, dtype="Int64")
    column[impossible] = pd.NA
    return column


def row_index(rows: Any) -> Any:
    """The labels of evidence rows: a frame's index, else None (0..n-1)."""
    return rows.index if is_frame(rows) else None


def missing_variables(graph: FactorGraph, frame: Any) -> list[str]:
    """The variables a frame does not observe, in the graph's order: what predict answers."""
    observed = set(frame.columns)
    return [v for v in graph.variables if v not in observed]


def distinct_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct rows, where each row of table is among them): a data set's repeated
    cases are solved once."""
    n = len(table)
    if not n:
        return table, np.zeros(0, dtype=np.intp)
    # each row as one integer, columns packed in mixed radix (state + 1: -1 is a value),
    # as many columns at a time as fit in int64 beside the rows' numbers so far
    row_id = np.zeros(n, dtype=np.int64)
    firsts = np.zeros(1, dtype=np.intp)  # (no columns: every row is the first)
    radix = table.max(axis=0, initial=0) + 2
    limit, j = 2**62 // (n + 1), 0
    while j < table.shape[1]:
        key, width = row_id, 1
        while j < table.shape[1] and (width == 1 or width * int(radix[j]) <= limit):
            key = key * int(radix[j]) + table[:, j] + 1
            width *= int(radix[j])
            j += 1
        _, firsts, row_id = np.unique(key, return_index=True, return_inverse=True)
        row_id = row_id.reshape(-1)
    return table[firsts], row_id


def _checked_frame(frame: Any, what: str) -> None:
    if not is_frame(frame):
        raise TypeError(f"{what}: expected a pandas DataFrame of evidence, got {type(frame).__name__}")


def _by_completeness(model: Any, frame: Any, rows: np.ndarray, answer: Any) -> list[tuple[np.ndarray, Any]]:
    """answer(m, rows) for each group of rows: those that observe every column of the frame
    on a companion model that absorbs those columns (its cliques hold no evidence
    variable: alarm's 27 cliques of 1,020 states per row become 3 of 8), the rest on
    `model`. [(which rows, their answer), ...]."""
    columns = tuple(c for c in model.evidence_columns if c in set(frame.columns))
    whole = np.ones(len(rows), dtype=bool)
    if not columns or (model.built.absorbed is not None and tuple(model.evidence_columns) == columns):
        return [(whole, answer(model, rows))] if len(rows) else []
    absorbing = model._companion(model.semiring, absorbing=columns)
    at = [list(model.evidence_columns).index(c) for c in absorbing.evidence_columns]
    full = (rows[:, at] != UNOBSERVED).all(axis=1)
    out = []
    if full.any():
        out.append((full, answer(absorbing, rows[full][:, at])))
    if not full.all():
        out.append((~full, answer(model, rows[~full])))
    return out


def predict(model: Any, frame: Any, names: bool = True) -> Any:
    """model.predict (model.py), in pgmpy's layout: the frame's columns, their missing
    cells filled, then the variables the frame lacks; every filled cell from the row's MPE."""
    _checked_frame(frame, "predict")
    graph = model.graph
    table = frame_states(model.built, frame)
    distinct, inverse = distinct_rows(table)
    assignments = np.empty((len(distinct), len(graph.variables)), dtype=np.int64)
    log_values = np.empty(len(distinct))
    for which, best in _by_completeness(model, frame, distinct, lambda m, rows: m.mpe_batch(rows)):
        assignments[which], log_values[which] = best.assignments, best.log_values
    out = mpe_frame(assignments[inverse], log_values[inverse], graph.names, graph, frame.index, None, names)
    for j, v in enumerate(model.evidence_columns):  # the cells the frame gave stay as given
        if v in frame.columns:
            given = table[:, j] != UNOBSERVED
            out[v] = frame[v].where(given, out[v]) if not given.all() else frame[v]
    return out[list(frame.columns) + missing_variables(graph, frame)]


def predict_proba(model: Any, frame: Any) -> Any:
    """model.predict_proba (model.py): each row's posterior of each variable the frame lacks."""
    _checked_frame(frame, "predict_proba")
    graph = model.graph
    missing = missing_variables(graph, frame)
    distinct, inverse = distinct_rows(frame_states(model.built, frame))
    marginals = {v: np.empty((len(distinct), graph.variables[v])) for v in missing}
    for which, res in _by_completeness(model, frame, distinct, lambda m, rows: m.solve_batch(rows)):
        for v in missing:
            marginals[v][which] = res.marginals[v]
    pd = pandas()
    data = {
        f"{v}={label}": marginals[v][inverse, s]
        for v in missing
        for s, label in enumerate(state_labels(graph, v))
    }
    return pd.DataFrame(data, index=frame.index)
