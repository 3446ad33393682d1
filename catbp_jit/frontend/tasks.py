"""The inference tasks beyond Z and marginals: MPE, max-marginals and posterior samples.

Each runs the junction-tree programs of a companion model (model.py's `_task_model`: the
same graph, evidence variables and target, in the semiring the task needs) and reads its
clique beliefs, then chooses states by a pass down the tree (descend.py):

- MPE: MAXLOG beliefs (the best weight with a clique's variables fixed), the best entry
  each time. Ties go to the first entry, so to the lowest states of the clique's
  undecided variables, compared in the model's variable order. One MPE walks down the
  tree compiled (descend.Walk), or down a contraction tree (descend_tree.py) when the
  model plans one; rows of evidence (mpe_batch) go down a junction tree vectorized.
- samples: LOGPROB beliefs (the total weight), an entry drawn in proportion to it.

An MPE's `log_value` is the log of the product of the potentials at the assignment,
summed from the tables themselves (so it is that assignment's value, not a message's).
Marginal MAP is in map_query.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .descend import argmax, descend, sampler
from .graph import FactorGraph, FactorGraphError

if TYPE_CHECKING:
    from .model import CompiledModel

IMPOSSIBLE = -1  # a state in a row whose evidence has probability 0


@dataclass(frozen=True)
class MPE:
    """The most probable assignment given the evidence. assignment: every variable of the
    model (evidence included) -> its state index; None when the evidence is impossible.
    log_value: log of the largest product of the potentials (-inf when impossible);
    log_value - log Z is its log-probability given the evidence."""

    assignment: dict[str, int] | None
    log_value: float
    evidence: dict[str, int]
    graph: FactorGraph = field(compare=False, repr=False)  # (for state names)

    def named(self) -> dict[str, Any] | None:
        """The assignment with state names where the model has them (else indices)."""
        if self.assignment is None:
            return None
        states = self.graph.states
        return {v: states[v][s] if v in states else s for v, s in self.assignment.items()}


@dataclass(frozen=True)
class MPEBatch:
    """MPE per evidence row: assignments (rows, variables), columns in `variables` order,
    -1 in a row whose evidence is impossible (its log_value is -inf)."""

    assignments: np.ndarray
    log_values: np.ndarray
    variables: tuple[str, ...]
    # what to_pandas labels with: the model's graph (state names), the rows' index (a
    # DataFrame's, when the rows were one)
    graph: FactorGraph | None = field(default=None, repr=False, compare=False)
    index: Any = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.log_values)

    def to_pandas(self, variables: Any = None, names: bool = True) -> Any:
        """The rows as a DataFrame indexed as the evidence rows were: log_value, then each
        variable's state (names=True: its state name where the model has names). A row
        whose evidence is impossible: log_value -inf, states missing."""
        from .frames import mpe_frame

        if self.graph is None:
            raise ValueError("this MPEBatch was not made by mpe_batch: it has no graph to label")
        return mpe_frame(
            self.assignments, self.log_values, self.variables, self.graph, self.index, variables, names
        )

    def assignment(self, i: int) -> dict[str, int] | None:
        """Row i's assignment as a dict (None when its evidence is impossible)."""
        if self.log_values[i] == -np.inf:
            return None
        return dict(zip(self.variables, map(int, self.assignments[i])))


@dataclass(frozen=True)
class LogTables:
    """Every factor's log table in one flat array, and how an assignment indexes each: the
    log value of many assignments in a few numpy calls, not a Python loop over factors."""

    logs: np.ndarray  # every table's natural logs, one after another
    bases: np.ndarray  # (factors,): where each table starts
    variables: np.ndarray  # (factors, arity): its scope's variables (graph order), padded
    strides: np.ndarray  # (factors, arity): their strides in its table, padded with 0

    def values(self, states: np.ndarray) -> np.ndarray:
        """Per row of states (rows, variables in graph order): the log of the product of
        every potential at that assignment (the logs summed by numpy, row by row)."""
        if not len(self.bases):
            return np.zeros(len(states))
        at = self.bases + (states[:, self.variables] * self.strides).sum(axis=2)
        return self.logs[at].sum(axis=1)


def log_tables(graph: FactorGraph) -> LogTables:
    index = graph.index()
    arity = max((len(f.scope) for f in graph.factors), default=0)
    n = len(graph.factors)
    variables = np.zeros((n, arity), dtype=np.int64)
    strides = np.zeros((n, arity), dtype=np.int64)
    bases = np.zeros(n, dtype=np.int64)
    at = 0
    for i, f in enumerate(graph.factors):
        shape = f.values.shape
        for j, v in enumerate(f.scope):
            variables[i, j] = index[v]
            strides[i, j] = math.prod(shape[j + 1 :])
        bases[i] = at
        at += f.values.size
    flat = np.concatenate([f.values.ravel() for f in graph.factors]) if n else np.zeros(0)
    with np.errstate(divide="ignore"):
        return LogTables(np.log(flat), bases, variables, strides)


def log_values(graph: FactorGraph, states: np.ndarray) -> np.ndarray:
    """Per row of states (rows, variables in graph order): log of the product of every
    potential at that assignment."""
    return log_tables(graph).values(states)


def full_states(model: CompiledModel, planned: np.ndarray, table: np.ndarray) -> np.ndarray:
    """States over every variable of the graph: the planned ones as chosen, the absorbed
    ones (not in the plan) from the evidence table."""
    built = model.built
    out = np.empty((len(planned), len(built.graph.variables)), dtype=np.int64)
    if model._columns is None:  # (where each goes: once per model)
        index = built.graph.index()
        column = {v: j for j, v in enumerate(built.evidence_columns)}
        observed = built.absorbed.observed if built.absorbed is not None else ()
        model._columns = (
            np.array([index[v] for v in built.planned_index], dtype=np.intp),
            np.array(list(built.planned_index.values()), dtype=np.intp),
            np.array([index[v] for v in observed], dtype=np.intp),
            np.array([column[v] for v in observed], dtype=np.intp),
        )
    to, planned_at, observed_to, observed_at = model._columns
    out[:, to] = planned[:, planned_at]
    out[:, observed_to] = table[:, observed_at]
    return out


def mpe_rows(model: CompiledModel, table: np.ndarray) -> MPEBatch:
    """MPE for each row of an evidence table (model.evidence_columns, -1 unobserved)."""
    task = model._task_model("MAXLOG", passes="upward")
    beliefs = task._clique_beliefs(table)
    plan = task.plan
    n = len(table)
    root = beliefs[plan.root].reshape(len(beliefs[plan.root]), -1)
    best = root.max(axis=1) if root.shape[1] else np.full(len(root), -np.inf)
    possible = np.broadcast_to(best > -np.inf, (n,))
    planned = descend(plan, beliefs, n, argmax)
    states = full_states(task, planned, table)
    values = model._log_tables().values(states)
    values[~possible] = -np.inf
    states[~possible] = IMPOSSIBLE
    return MPEBatch(states, values, model.graph.names)


def mpe(model: CompiledModel, evidence: Mapping[str, Any]) -> MPE:
    table = model._evidence_table([evidence])
    observed = {v: int(s) for v, s in zip(model.evidence_columns, table[0]) if s >= 0}
    if not model.built.target_object.compiled:
        rows = mpe_rows(model, table)
        return MPE(rows.assignment(0), float(rows.log_values[0]), observed, model.graph)
    # one row: the walk down the tree runs compiled, over the session's buffer, on either
    # kind of tree (a contraction tree's upward pass can be far cheaper: ObjectDetection)
    task = model._task_model("MAXLOG", passes="upward", junction=False)
    planned, top = task._best_row(observed)
    if top == -np.inf:
        return MPE(None, -math.inf, observed, model.graph)
    states = full_states(task, planned[None, :], table)
    value = float(model._log_tables().values(states)[0])
    return MPE(dict(zip(model.graph.names, map(int, states[0]))), value, observed, model.graph)


def sample(model: CompiledModel, n: int, evidence: Mapping[str, Any], seed: Any) -> np.ndarray:
    """n exact samples of the posterior given the evidence: (n, variables) state indices,
    columns in the graph's variable order; the same for the same seed."""
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
        raise ValueError(f"sample: n must be a non-negative integer, got {n!r}")
    task = model._task_model("LOGPROB", passes="upward")
    table = model._evidence_table([evidence])
    beliefs = task._clique_beliefs(table)
    root = beliefs[task.plan.root]
    if not (root > -np.inf).any():
        raise FactorGraphError(
            f"{model.graph.name}: the evidence {dict(evidence)!r} has probability 0; nothing to sample"
        )
    planned = descend(task.plan, beliefs, int(n), sampler(np.random.default_rng(seed)))
    return full_states(task, planned, np.repeat(table, int(n), axis=0))
