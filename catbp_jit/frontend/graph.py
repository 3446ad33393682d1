"""A discrete factor graph: named variables with domain sizes, factors as scope + table.

This is what users and the readers (UAI, BIF) hand to the front end. Values are
non-negative potentials (probabilities for a Bayesian network); `semiring_values` turns
them into what a semiring's program loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import CatbpError


class FactorGraphError(CatbpError, ValueError):
    """A factor graph, or evidence for one, that cannot be solved as given."""


@dataclass(frozen=True)
class Factor:
    scope: Tuple[str, ...]  # variable names; the table's axes in this order
    values: np.ndarray  # float64, shape = the scope's domain sizes


@dataclass(frozen=True)
class FactorGraph:
    variables: Dict[str, int]  # name -> domain size, in a fixed order (axis ids follow it)
    factors: Tuple[Factor, ...]
    name: str = "model"
    states: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # optional state names

    @property
    def names(self) -> Tuple[str, ...]:
        return tuple(self.variables)

    def index(self) -> Dict[str, int]:
        return {v: i for i, v in enumerate(self.variables)}


def factor_graph(var_domains: Mapping[str, int], factors: Iterable, *, name: str = "model",
                 states: Optional[Mapping[str, Sequence[str]]] = None) -> FactorGraph:
    """Check and build a FactorGraph.

    factors: Factor objects or (scope, array) pairs. Every table must be real, finite and
    non-negative, with one axis per scope variable of that variable's domain size.
    """
    variables: Dict[str, int] = {}
    for v, d in var_domains.items():
        if not isinstance(v, str) or not v:
            raise FactorGraphError(f"{name}: variable names must be non-empty strings, got {v!r}")
        if isinstance(d, bool) or int(d) != d or int(d) < 1:
            raise FactorGraphError(f"{name}: variable {v!r} has domain size {d!r}; "
                                   "it must be a positive integer")
        variables[v] = int(d)

    checked = []
    for i, f in enumerate(factors):
        scope, values = (f.scope, f.values) if isinstance(f, Factor) else f
        checked.append(_check_factor(name, i, variables, tuple(scope), values))

    state_names: Dict[str, Tuple[str, ...]] = {}
    for v, s in (states or {}).items():
        if v not in variables or len(s) != variables[v]:
            raise FactorGraphError(f"{name}: state names for {v!r} do not match its domain")
        state_names[v] = tuple(str(x) for x in s)
    return FactorGraph(variables, tuple(checked), name, state_names)


def _check_factor(name: str, i: int, variables: Mapping[str, int], scope: Tuple[str, ...],
                  values) -> Factor:
    where = f"{name}: factor {i} (scope {', '.join(map(str, scope)) or '()'})"
    for v in scope:
        if v not in variables:
            raise FactorGraphError(f"{where}: unknown variable {v!r}")
    if len(set(scope)) != len(scope):
        raise FactorGraphError(f"{where}: a variable appears twice in the scope")
    arr = np.asarray(values)
    if arr.dtype.kind not in "biuf":
        raise FactorGraphError(f"{where}: values must be real numbers, got dtype {arr.dtype}")
    arr = np.array(arr, dtype=np.float64)  # a private copy: later edits by the caller don't leak in
    shape = tuple(variables[v] for v in scope)
    if arr.shape != shape:
        if arr.size == int(np.prod(shape, dtype=np.int64)):
            arr = arr.reshape(shape)  # a flat table in row-major scope order
        else:
            raise FactorGraphError(f"{where}: table has shape {arr.shape}, the scope's domains "
                                   f"give {shape}")
    if not np.all(np.isfinite(arr)):
        raise FactorGraphError(f"{where}: values must be finite (found NaN or inf)")
    if np.any(arr < 0):
        raise FactorGraphError(f"{where}: values must be non-negative potentials")
    arr.setflags(write=False)
    return Factor(scope, arr)


def semiring_values(values: np.ndarray, semiring: str, dtype: np.dtype) -> np.ndarray:
    """Potentials as a semiring's program loads them.

    PROB: as given. LOGPROB: natural log (0 -> -inf). SAT: non-zero. COUNT: 1 where
    non-zero, so Z counts the assignments every factor allows (the models).
    """
    # np.asarray: numpy turns 0-d results into scalars, the executor wants arrays
    if semiring == "PROB":
        return np.asarray(values, dtype=dtype)
    if semiring == "LOGPROB":
        with np.errstate(divide="ignore"):
            return np.asarray(np.log(values), dtype=dtype)
    if semiring == "SAT":
        return np.asarray(values != 0)
    if semiring == "COUNT":
        return np.asarray(values != 0, dtype=np.int64)
    raise ValueError(f"unknown semiring {semiring!r}")
