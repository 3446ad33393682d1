"""One solve's answer, vectorized over the variables: the results read from the session's
buffer with one index array into one flat array, every marginal normalized at once, and
handed out as views of that array. No Python code runs per variable: on small models
(Promedus_26, 614 variables) that loop, not the programs, was most of a solve.

The flat array holds the variables grouped by domain size, so each group is a (k, d)
matrix normalized along its rows: numpy sums a matrix's contiguous rows exactly as it sums
one variable's array (np.add.reduceat does not: it rounds differently), so the answers
have the bits that one numpy call per variable gave.
"""

from __future__ import annotations

import decimal
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..semiring import Semiring
from ..semiring import semiring as describe
from .scaling import exp_of_log


class Marginals(Mapping):
    """variable -> its marginal, a view of one flat array made by this solve (a new array
    per solve: earlier answers stay valid)."""

    __slots__ = ("flat", "_at")

    def __init__(self, flat: np.ndarray, at: Mapping[str, tuple[int, int]]):
        self.flat = flat
        self._at = at

    def __getitem__(self, v: str) -> np.ndarray:
        lo, hi = self._at[v]
        return self.flat[lo:hi]

    def __iter__(self) -> Iterator[str]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def __repr__(self) -> str:
        return f"Marginals({len(self._at)} variables, {self.flat.dtype})"


@dataclass(frozen=True)
class AnswerLayout:
    """Where a model's results are, and where each variable's marginal goes in the flat
    array: a segment of its domain size, the variables grouped by domain size."""

    keys: tuple[tuple, ...]  # the result slots read: Z, the scales, the planned marginals
    n_scales: int
    at: dict[str, tuple[int, int]]  # variable -> (start, stop) in the flat marginals
    groups: tuple[tuple[int, int, int], ...]  # (start, stop, domain size) of each group
    planned: np.ndarray  # flat positions the planned marginal slots fill, in keys' order
    # (ascending: keys list the planned variables in the flat array's order)
    observed: np.ndarray  # start of each absorbed variable's segment, in the graph's order
    observed_all: np.ndarray  # every flat position of the absorbed variables

    @property
    def total(self) -> int:
        return self.groups[-1][1] if self.groups else 0

    def gather_index(self, positions: Mapping[tuple, np.ndarray]) -> np.ndarray:
        """The buffer positions of every value of self.keys, in order: results[index] reads
        Z, the scales and the planned marginals in one go. positions: each result's
        (Binding.positions)."""
        parts = [positions[k] for k in self.keys]
        return np.concatenate(parts).astype(np.intp) if parts else np.zeros(0, np.intp)

    def raw(self, values: np.ndarray, states: Sequence[int], zero: Any, dtype: Any) -> np.ndarray:
        """The flat raw marginals from the gathered values (Z, scales, planned marginals):
        an absorbed variable's is Z at its observed state and zero elsewhere (what the
        indicator model computes). states: the absorbed variables', in the graph's order."""
        marg = values[1 + self.n_scales :]
        if not self.observed.size:
            return marg.astype(dtype, copy=False)
        flat = np.empty(self.total, dtype=dtype)
        flat[self.planned] = marg
        flat[self.observed_all] = zero
        flat[self.observed + np.asarray(states, dtype=np.intp)] = values[0]
        return flat


def answer_layout(
    names: Sequence[str],
    domains: Mapping[str, int],
    planned_index: Mapping[str, int],
    scale_keys: Sequence[tuple],
) -> AnswerLayout:
    """The layout of a model over `names`, of which those in planned_index have a
    ("marg", i) slot and the others (absorbed evidence) are built from Z."""
    by_size = sorted(names, key=lambda v: domains[v])
    at, groups, start = {}, [], 0
    for d, members in itertools.groupby(by_size, key=lambda v: domains[v]):
        lo = start
        for v in members:  # (once per model, at compile time)
            at[v] = (start, start + d)
            start += d
        groups.append((lo, start, d))
    # the marginal slots are read in the flat array's order: without absorbed variables
    # the gathered values are the flat array itself
    planned = [v for v in by_size if v in planned_index]
    absorbed = [v for v in names if v not in planned_index]  # as the model lists them
    at = {v: at[v] for v in names}  # iterated in the graph's order

    def positions(vs: list[str]) -> np.ndarray:
        return np.concatenate([np.arange(*at[v]) for v in vs]).astype(np.intp) if vs else np.zeros(0, np.intp)

    return AnswerLayout(
        keys=(("Z",),) + tuple(scale_keys) + tuple(("marg", planned_index[v]) for v in planned),
        n_scales=len(scale_keys),
        at=at,
        groups=tuple(groups),
        planned=positions(planned),
        observed=np.array([at[v][0] for v in absorbed], np.intp),
        observed_all=positions(absorbed),
    )


def finish(
    semiring: str | Semiring, z: Any, raw: np.ndarray, layout: AnswerLayout
) -> tuple[Any, float, Marginals]:
    """Z, log Z and normalized marginals from the semiring's raw values (flat); each
    marginal is normalized on its own, by the same operations, so with the same bits, as
    one numpy call per variable would. semiring: its description (or its name)."""
    kind = semiring if isinstance(semiring, Semiring) else describe(semiring)
    log_z = kind.to_log_z(z)
    value, marginals = _FINISH[kind.result_kind](z, log_z, raw, layout)
    return value, log_z, Marginals(marginals, layout.at)


def _finish_bool(z: Any, log_z: float, raw: np.ndarray, layout: AnswerLayout) -> tuple[bool, np.ndarray]:
    """SAT: satisfiable or not; which values some model takes."""
    return bool(z), raw.astype(bool)


def _finish_count(z: Any, log_z: float, raw: np.ndarray, layout: AnswerLayout) -> tuple[int, np.ndarray]:
    """COUNT: the number of models; the fraction of them per value."""
    count = int(z)
    return count, (raw.astype(np.float64) / count if count > 0 else np.full(raw.shape, np.nan))


def _finish_log(
    z: Any, log_z: float, raw: np.ndarray, layout: AnswerLayout
) -> tuple[float | decimal.Decimal, np.ndarray]:
    """LOGPROB: Z from its log; each marginal normalized in the log domain."""
    return exp_of_log(log_z), _log_normalized(raw, layout)


def _finish_max(
    z: Any, log_z: float, raw: np.ndarray, layout: AnswerLayout
) -> tuple[float | decimal.Decimal, np.ndarray]:
    """MAXLOG: Z is the largest product (from its log); each max-marginal as exp(m - max m),
    so a variable's best states read 1."""
    return exp_of_log(log_z), _max_normalized(raw, layout)


def _finish_scaled(z: Any, log_z: float, raw: np.ndarray, layout: AnswerLayout) -> tuple[float, np.ndarray]:
    """PROB: Z as a float (the caller rebuilds a scaled Z itself); each marginal m / sum."""
    return float(z), _normalized(raw, layout)


# what a result means (Semiring.result_kind) -> how Z and the marginals are read
_FINISH: dict[str, Callable[[Any, float, np.ndarray, AnswerLayout], tuple[Any, np.ndarray]]] = {
    "bool": _finish_bool,
    "count": _finish_count,
    "log": _finish_log,
    "maxlog": _finish_max,
    "scaled": _finish_scaled,
}


def _by_group(
    normalize: Callable[[np.ndarray], np.ndarray], raw: np.ndarray, layout: AnswerLayout
) -> np.ndarray:
    """normalize applied to each group of variables as a (variables, domain) matrix."""
    m = raw.astype(np.float64, copy=False)
    out = np.empty(m.shape, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        for lo, hi, d in layout.groups:  # one pass per distinct domain size
            out[lo:hi] = normalize(m[lo:hi].reshape(-1, d)).ravel()
    return out


def _normalized(raw: np.ndarray, layout: AnswerLayout) -> np.ndarray:
    """m / sum(m) per variable; NaN where the sum is not positive."""

    def rows(m: np.ndarray) -> np.ndarray:
        total = m.sum(axis=1, keepdims=True)
        return np.where(total > 0, m / total, np.nan)

    return _by_group(rows, raw, layout)


def _log_normalized(raw: np.ndarray, layout: AnswerLayout) -> np.ndarray:
    """exp(m - logsumexp(m)) per variable (semiring.logsumexp's max shift); NaN where
    every entry is -inf."""

    def rows(m: np.ndarray) -> np.ndarray:
        top = m.max(axis=1, keepdims=True)
        total = np.where(np.isneginf(top), -np.inf, top + np.log(np.exp(m - top).sum(axis=1, keepdims=True)))
        return np.where(total > -np.inf, np.exp(m - total), np.nan)

    return _by_group(rows, raw, layout)


def _max_normalized(raw: np.ndarray, layout: AnswerLayout) -> np.ndarray:
    """exp(m - max(m)) per variable; NaN where every entry is -inf."""

    def rows(m: np.ndarray) -> np.ndarray:
        top = m.max(axis=1, keepdims=True)
        return np.where(top > -np.inf, np.exp(m - top), np.nan)

    return _by_group(rows, raw, layout)
