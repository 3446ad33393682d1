"""Many evidence rows in one run: the evidence factors get a batch axis (catbp_jit.batched).

`CompiledModel.solve_batch(rows)` turns the rows into a table of state indices
(`evidence_table`), the table into the batched factor values that carry it
(`evidence_factors`: indicator rows, or the cut factors' rows when evidence is absorbed),
runs the batched executable once for all rows (it routes them to a bucket, or chunks of
the largest), and turns the rows of Z, the scales and the marginals back into answers
(`batch_solution`), vectorized: nothing per row in Python but the rare certificates.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import name_list
from ..semiring import logsumexp
from .frames import frame_states, is_frame
from .graph import FactorGraph, FactorGraphError
from .scaling import TINY, NumericalError

if TYPE_CHECKING:
    from .build import BuiltModel

UNOBSERVED = -1
Evidence = dict[str, int]


@dataclass(frozen=True)
class Certificates:
    """What vouches for a rare row (model.py's CompiledModel passes its own, which solve
    companion models): each raises NumericalError unless the row's answer is exact."""

    infeasible: Callable[[Evidence], None]  # PROB's Z is 0: nothing is possible
    count_fits: Callable[[Evidence], None]  # COUNT's wrapped count is the count


@dataclass
class BatchSolution:
    """Answers for n evidence rows. log_Z: (n,); marginals[v]: (n, domain size), NaN in a
    row whose Z is 0 (the row's evidence is impossible); SAT: bool, COUNT: counts."""

    semiring: str
    log_Z: np.ndarray
    marginals: dict[str, np.ndarray]
    states: np.ndarray  # (n, evidence variables): the rows as state indices, -1 unobserved
    columns: tuple[str, ...]  # the evidence variables, in the order of states' columns
    counts: Any = None  # SAT: satisfiable per row (bool); COUNT: models per row (int64)
    # what to_pandas labels with: the model's graph (state names), the rows' index (a
    # DataFrame's, when the rows were one)
    graph: FactorGraph | None = field(default=None, repr=False, compare=False)
    index: Any = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.log_Z)

    def to_pandas(self, variables: Any = None, long: bool = False) -> Any:
        """The answers as a DataFrame indexed as the rows were: log_Z (and Z for SAT and
        COUNT), then `var=state` posterior columns; long=True: a row per case, variable
        and state (row, variable, state, probability). variables: whose (default all)."""
        from .frames import posterior_frame

        if self.graph is None:
            raise ValueError("this BatchSolution was not made by solve_batch: it has no graph to label")
        return posterior_frame(self, self.graph, self.index, variables, long)

    @property
    def Z(self) -> np.ndarray:
        """Z per row as float64 (SAT: bool, COUNT: int64). Where a row's Z is beyond
        float64 (|log Z| over ~708) this raises NumericalError: use log_Z."""
        if self.counts is not None:
            return self.counts
        with np.errstate(over="ignore", under="ignore"):
            out = np.exp(self.log_Z)
        wide = np.isfinite(self.log_Z) & ~((out >= TINY) & np.isfinite(out))
        if wide.any():
            row = int(np.flatnonzero(wide)[0])
            raise NumericalError(f"row {row}: Z = exp({self.log_Z[row]!r}) is beyond float64; use log_Z")
        return out


def evidence_table(model: BuiltModel, rows: Any) -> np.ndarray:
    """Rows of evidence as an int64 table (n, len(model.evidence_columns)) of state indices,
    -1 where unobserved. rows: a sequence of {variable: state index or name}, a 2-D
    integer array whose columns follow model.evidence_columns, or a pandas DataFrame with
    a column per observed variable (frames.py)."""
    cols = model.evidence_columns
    name = model.graph.name
    if is_frame(rows):
        table = frame_states(model, rows)
    elif isinstance(rows, np.ndarray):
        if rows.dtype.kind not in "iu" or rows.ndim != 2 or rows.shape[1] != len(cols):
            raise FactorGraphError(
                f"{name}: an evidence table is a 2-D integer array of shape (rows, "
                f"{len(cols)}) with columns {name_list(cols, repr)}; got {rows.dtype} {rows.shape}"
            )
        table = rows.astype(np.int64)
        for j, v in enumerate(cols):
            col = table[:, j]
            bad = (col < UNOBSERVED) | (col >= model.graph.variables[v])
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise FactorGraphError(
                    f"{name}: evidence row {i}: {v}={int(col[i])} is not a state of {v} "
                    f"(0..{model.graph.variables[v] - 1}, or -1 for unobserved)"
                )
    else:
        # None, one mapping or a string would otherwise fail deep inside (or iterate
        # over keys or characters): say what rows must be
        if rows is None or isinstance(rows, (Mapping, str, bytes)) or not isinstance(rows, Iterable):
            hint = " (one row: pass [row], or use solve)" if isinstance(rows, Mapping) else ""
            raise TypeError(
                f"solve_batch: rows must be a sequence of {{variable: state}} mappings, a "
                f"2-D integer array or a pandas DataFrame, got {type(rows).__name__}"
                f"{hint}"
            )
        rows = list(rows)
        table = np.full((len(rows), len(cols)), UNOBSERVED, dtype=np.int64)
        where = {v: j for j, v in enumerate(cols)}
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping):
                raise FactorGraphError(
                    f"{name}: evidence row {i} is a {type(row).__name__}, not a mapping {{variable: state}}"
                )
            for v, state in row.items():
                if v not in where:
                    raise FactorGraphError(
                        f"{name}: evidence row {i} observes {v!r}, but this model was compiled "
                        f"for evidence on {name_list(cols, repr) or 'no variables'}"
                    )
                table[i, where[v]] = model.state_index(v, state)
    if model.absorbed is not None and (table == UNOBSERVED).any():
        i, j = (int(x[0]) for x in np.nonzero(table == UNOBSERVED))
        raise FactorGraphError(
            f"{name}: evidence row {i} leaves {cols[j]!r} unobserved, but this model absorbs "
            "evidence and needs a state for each of its evidence variables (compile without "
            "absorb_evidence to leave some unobserved)"
        )
    return table


def evidence_factors(model: BuiltModel, table: np.ndarray) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """The batched factor values that carry the rows, and per row the power of two (PROB)
    the cut tables were scaled by."""
    n = len(table)
    column = {v: table[:, j] for j, v in enumerate(model.evidence_columns)}
    exponent = np.zeros(n, dtype=np.int64)
    out = {}
    if model.absorbed is None:
        first = len(model.graph.factors)
        for k, v in enumerate(model.evidence_vars):  # indicator k is factor first + k
            states = column[v]
            ind = np.ones((n, model.graph.variables[v]), dtype=np.float64)
            seen = states != UNOBSERVED
            ind[seen] = 0.0
            ind[np.flatnonzero(seen), states[seen]] = 1.0
            out[first + k] = _as_semiring(model, ind)
        return out, exponent
    gone = set(model.absorbed.observed)
    for f in model.absorbed.cut:
        fac = model.graph.factors[f]
        cut = [i for i, v in enumerate(fac.scope) if v in gone]
        kept = [i for i, v in enumerate(fac.scope) if v not in gone]
        moved = np.transpose(fac.values, cut + kept)  # observed axes first
        rows = moved[tuple(column[fac.scope[i]] for i in cut)]  # (n, *kept shape)
        if model.scaled:
            rows, shifts = _pow2_rows(rows)
            exponent += shifts
        out[f] = _as_semiring(model, rows)
    return out, exponent


def _pow2_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scaling.pow2_scaled for each row: (rows / 2**k per row, k); all-zero rows keep k=0."""
    n = len(rows)
    top = rows.reshape(n, -1).max(axis=1) if rows.size else np.zeros(n)
    k = np.where(top > 0, np.frexp(top)[1], 0).astype(np.int64)
    return np.ldexp(rows, (-k).reshape((n,) + (1,) * (rows.ndim - 1))), k


def _as_semiring(model: BuiltModel, values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(model.kind.potentials(values, model.sr.dtype))


def batch_solution(
    model: BuiltModel,
    slots: Mapping[tuple, np.ndarray],
    table: np.ndarray,
    exponent: np.ndarray,
    certify: Certificates,
) -> BatchSolution:
    """Answers from the rows of Z, the scales and the raw marginals."""
    n = len(table)
    if n == 0:
        return _no_rows(model, table)
    z = _rows(slots, ("Z",), n, ())
    raw = {v: _raw_marginal(model, slots, table, v, z) for v in model.graph.names}
    if model.kind.is_scaled:
        return _scaled_rows(model, slots, table, exponent, certify, z, raw)
    # every array below is a copy: the slots are views the next run writes over
    kind = model.kind
    counts = None if kind.result_dtype is None else np.array(z, dtype=kind.result_dtype)
    if model.count_may_wrap:  # rare: a model of 2^63 assignments or more
        for i in range(n):
            certify.count_fits(_row_evidence(model, table[i]))
    log_z = kind.log_z_rows(z if counts is None else counts)
    marg = _ROW_MARGINALS[kind.result_kind](raw, counts)
    if kind.marginal_dtype != "bool":  # SAT's impossible rows: all False
        marg = _nan_where_zero(marg, log_z)
    return BatchSolution(model.semiring, log_z, marg, table, model.evidence_columns, counts)


def _bool_marginals(raw: dict[str, np.ndarray], counts: np.ndarray | None) -> dict[str, np.ndarray]:
    return {v: np.array(m, dtype=bool) for v, m in raw.items()}


def _count_marginals(raw: dict[str, np.ndarray], counts: np.ndarray | None) -> dict[str, np.ndarray]:
    assert counts is not None  # COUNT's Z is exact: its rows are counts
    with np.errstate(divide="ignore", invalid="ignore"):
        return {v: np.asarray(m, dtype=np.float64) / counts[:, None] for v, m in raw.items()}


def _log_marginals(raw: dict[str, np.ndarray], counts: np.ndarray | None) -> dict[str, np.ndarray]:
    marg = {}
    with np.errstate(invalid="ignore"):
        for v, m in raw.items():
            m = np.asarray(m, dtype=np.float64)
            marg[v] = np.exp(m - logsumexp(m, axis=(1,))[:, None])
    return marg


def _max_marginals(raw: dict[str, np.ndarray], counts: np.ndarray | None) -> dict[str, np.ndarray]:
    """MAXLOG: each row's max-marginal as exp(m - max m) (the best states read 1)."""
    marg = {}
    with np.errstate(invalid="ignore"):
        for v, m in raw.items():
            m = np.asarray(m, dtype=np.float64)
            marg[v] = np.exp(m - m.max(axis=1, keepdims=True))
    return marg


# what a result means (Semiring.result_kind) -> each row's normalized marginals
_ROW_MARGINALS: dict[str, Callable[[dict[str, np.ndarray], np.ndarray | None], dict[str, np.ndarray]]] = {
    "bool": _bool_marginals,
    "count": _count_marginals,
    "log": _log_marginals,
    "maxlog": _max_marginals,
}


def _scaled_rows(
    model: BuiltModel,
    slots: Mapping[tuple, np.ndarray],
    table: np.ndarray,
    exponent: np.ndarray,
    certify: Certificates,
    z: np.ndarray,
    raw: dict[str, np.ndarray],
) -> BatchSolution:
    """PROB: Z is the root's total times every upward scale times the tables' powers of two."""
    n = len(table)
    parts = np.stack([z] + [_rows(slots, k, n, ()) for k in model.scale_slots], axis=1)
    parts = np.asarray(parts, dtype=np.float64)
    zero = (parts == 0).any(axis=1)
    lost = ~zero & (parts < TINY).any(axis=1)
    if lost.any():
        raise NumericalError(
            f"{model.graph.name}: evidence row {int(np.flatnonzero(lost)[0])}: PROB underflowed "
            f"(a message's total fell below {TINY:.3g}); solve with semiring='logprob'"
        )
    for i in np.flatnonzero(zero):  # certified, or NumericalError
        certify.infeasible(_row_evidence(model, table[i]))
    with np.errstate(divide="ignore"):
        log_z = np.log(parts).sum(axis=1) + (exponent + model.exponent) * math.log(2.0)
    log_z[zero] = -math.inf
    with np.errstate(invalid="ignore", divide="ignore"):
        marg = {
            v: m / m.sum(axis=1, keepdims=True)
            for v, m in ((v, np.asarray(m, dtype=np.float64)) for v, m in raw.items())
        }
    return BatchSolution(model.semiring, log_z, _nan_where_zero(marg, log_z), table, model.evidence_columns)


def _no_rows(model: BuiltModel, table: np.ndarray) -> BatchSolution:
    kind = model.kind
    counts = None if kind.result_dtype is None else np.zeros(0, kind.result_dtype)
    marg = {v: np.zeros((0, d), dtype=kind.marginal_dtype) for v, d in model.graph.variables.items()}
    return BatchSolution(model.semiring, np.zeros(0), marg, table, model.evidence_columns, counts)


def _rows(slots: Mapping[tuple, Any], key: tuple, n: int, shape: tuple[int, ...]) -> np.ndarray:
    """A slot's rows: a slot that does not depend on the evidence has none (it is the same
    for every row) and is broadcast."""
    a = np.asarray(slots[key])
    return a if a.ndim == len(shape) + 1 else np.broadcast_to(a, (n,) + a.shape)


def _raw_marginal(
    model: BuiltModel, slots: Mapping[tuple, np.ndarray], table: np.ndarray, v: str, z: np.ndarray
) -> np.ndarray:
    """Variable v's raw marginal per row; an absorbed variable's is Z at its observed state
    and the semiring's zero elsewhere (what the indicator model computes)."""
    n, d = len(table), model.graph.variables[v]
    planned = model.planned_index
    if v in planned:
        return _rows(slots, ("marg", planned[v]), n, (d,))
    hit = np.zeros((n, d), dtype=bool)
    hit[np.arange(n), table[:, model.evidence_columns.index(v)]] = True
    zero = model.kind.zero
    return np.where(hit, np.asarray(z)[:, None], zero)


def _nan_where_zero(marg: dict[str, np.ndarray], log_z: np.ndarray) -> dict[str, np.ndarray]:
    """Rows whose Z is 0 have no marginals: NaN, as solve() gives them."""
    dead = log_z == -math.inf
    if dead.any():
        for m in marg.values():
            m[dead] = np.nan
    return marg


def concatenate(parts: Sequence[BatchSolution]) -> BatchSolution:
    """The answers of consecutive chunks of rows as one."""
    first = parts[0]

    def cat(xs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(xs, axis=0)

    return BatchSolution(
        first.semiring,
        cat([p.log_Z for p in parts]),
        {v: cat([p.marginals[v] for p in parts]) for v in first.marginals},
        cat([p.states for p in parts]),
        first.columns,
        None if first.counts is None else cat([p.counts for p in parts]),
    )


def _row_evidence(model: BuiltModel, states: np.ndarray) -> dict[str, int]:
    return {v: int(s) for v, s in zip(model.evidence_columns, states) if s != UNOBSERVED}


def stack_solutions(model: BuiltModel, solutions: Sequence[Any], table: np.ndarray) -> BatchSolution:
    """Row-by-row answers (the reference target) as one BatchSolution."""
    n = len(table)
    log_z = np.array([s.log_Z for s in solutions], dtype=np.float64).reshape(n)
    marg = {
        v: np.array([s.marginals[v] for s in solutions]).reshape(n, d)
        for v, d in model.graph.variables.items()
    }
    dtype = model.kind.result_dtype  # SAT, COUNT: Z exactly
    counts = None if dtype is None else np.array([s.Z for s in solutions], dtype=dtype).reshape(n)
    return BatchSolution(model.semiring, log_z, marg, table, model.evidence_columns, counts)
