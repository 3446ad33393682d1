"""A discrete factor graph: named variables with domain sizes, factors as scope + table.

This is what users and the readers (UAI, BIF) hand to the front end. Values are
non-negative potentials (probabilities for a Bayesian network); `semiring_values` turns
them into what a semiring's program loads.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CatbpError, name_list, shown


class FactorGraphError(CatbpError, ValueError):
    """A factor graph, or evidence for one, that cannot be solved as given."""


@dataclass(frozen=True)
class Factor:
    scope: tuple[str, ...]  # variable names; the table's axes in this order
    values: np.ndarray  # float64, shape = the scope's domain sizes


@dataclass(frozen=True)
class FactorGraph:
    variables: dict[str, int]  # name -> domain size, in a fixed order (axis ids follow it)
    factors: tuple[Factor, ...]
    name: str = "model"
    states: dict[str, tuple[str, ...]] = field(default_factory=dict)  # optional state names

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.variables)

    def index(self) -> dict[str, int]:
        return {v: i for i, v in enumerate(self.variables)}


def factor_graph(
    var_domains: Mapping[str, int],
    factors: Iterable | Mapping = (),
    *,
    name: str = "model",
    states: Mapping[str, Sequence[str]] | None = None,
) -> FactorGraph:
    """Check and build a FactorGraph.

    var_domains: {variable name: domain size (a positive integer)}.
    factors: Factor objects or (scope, table) pairs, as a sequence, or as a mapping
    {factor name: Factor or (scope, table)} whose names then label the factors in errors.
    A table is real, finite and non-negative, and either has exactly the scope's shape
    (one axis per scope variable, of that variable's domain size) or is 1-D holding the
    entries row-major over the scope order (the last scope variable varies fastest). Any
    other shape is refused, even one with the right number of entries: reshaping it
    would silently mix up the axes.
    """
    if not isinstance(var_domains, Mapping):
        raise FactorGraphError(
            f"{name}: variable domains must be a mapping {{name: domain "
            f"size}}, got {type(var_domains).__name__}"
        )
    variables: dict[str, int] = {}
    for v, d in var_domains.items():
        if not isinstance(v, str) or not v:
            raise FactorGraphError(f"{name}: variable names must be non-empty strings, got {shown(v)}")
        variables[v] = _domain_size(name, v, d)

    if isinstance(factors, Mapping):
        labelled = [(repr(k), f) for k, f in factors.items()]
    elif isinstance(factors, (str, bytes)) or not isinstance(factors, Iterable):
        raise FactorGraphError(
            f"{name}: factors must be a sequence of (scope, table) pairs or "
            f"a mapping {{factor name: (scope, table)}}, got "
            f"{type(factors).__name__}"
        )
    else:
        labelled = [(str(i), f) for i, f in enumerate(factors)]
    checked = [_check_factor(name, label, variables, f) for label, f in labelled]

    state_names: dict[str, tuple[str, ...]] = {}
    for v, s in (states or {}).items():
        if (
            v not in variables
            or isinstance(s, (str, bytes))
            or not isinstance(s, Sequence)
            or len(s) != variables[v]
        ):
            raise FactorGraphError(f"{name}: state names for {shown(v)} do not match its domain")
        state_names[v] = tuple(str(x) for x in s)
    return FactorGraph(variables, tuple(checked), name, state_names)


def _domain_size(name: str, v: str, d: Any) -> int:
    """d as a positive int; a float is accepted only when it is a whole number (2.0)."""
    if isinstance(d, (bool, np.bool_)) or not isinstance(d, numbers.Real):
        size = None
    else:
        try:
            # typeshed's Real.__trunc__ returns an _IntegralLike, not an int: int() takes any Real
            size = int(d) if d == int(d) else None  # type: ignore[call-overload]
        except (ValueError, OverflowError):  # NaN, inf
            size = None
    if size is None or size < 1:
        raise FactorGraphError(
            f"{name}: variable {shown(v)} has domain size {shown(d)}; it must be a positive integer"
        )
    return size


def _check_factor(name: str, label: str, variables: Mapping[str, int], factor: Any) -> Factor:
    where = f"{name}: factor {label}"
    if isinstance(factor, Factor):
        scope, values = factor.scope, factor.values
    elif _is_sequence(factor) and len(factor) == 2:
        scope, values = factor
    else:
        raise FactorGraphError(
            f"{where}: expected a Factor or a (scope, table) pair, got {_describe(factor)}"
        )
    if not _is_sequence(scope):
        raise FactorGraphError(
            f"{where}: the scope must be a sequence of variable names, got "
            f"{shown(scope)} (one variable: ({shown(scope)},))"
        )
    scope = tuple(scope)
    where += f" (scope {name_list(scope) or '()'})"
    for v in scope:
        if not isinstance(v, str) or v not in variables:
            raise FactorGraphError(f"{where}: unknown variable {shown(v)}")
    if len(set(scope)) != len(scope):
        raise FactorGraphError(f"{where}: a variable appears twice in the scope")
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError):  # ragged nested lists, objects numpy refuses
        raise FactorGraphError(f"{where}: the table is not a rectangular array (ragged rows?)") from None
    if arr.dtype.kind not in "biuf":
        raise FactorGraphError(f"{where}: values must be real numbers, got {_dtype_name(arr)} values")
    shape = tuple(variables[v] for v in scope)
    size = math.prod(shape)
    if arr.shape != shape:
        if arr.ndim == 1 and arr.size == size:
            arr = arr.reshape(shape)  # a flat table, row-major over the scope order
        else:
            raise FactorGraphError(
                f"{where}: table has shape {arr.shape}, the scope's domains "
                f"give {shape} (or a 1-D table of {size} entries, row-major "
                "over the scope)"
            )
    arr = np.array(arr, dtype=np.float64)  # a private copy: later edits by the caller don't leak in
    if not np.all(np.isfinite(arr)):
        raise FactorGraphError(f"{where}: values must be finite (found NaN or inf)")
    if np.any(arr < 0):
        raise FactorGraphError(f"{where}: values must be non-negative potentials")
    arr.setflags(write=False)
    return Factor(scope, arr)


def _is_sequence(x: Any) -> bool:
    """A list, tuple or other sequence, but not a string (its characters are no scope)."""
    # tuple and list first: the ABC check is slow, and readers build 100,000s of factors
    return isinstance(x, (tuple, list, np.ndarray)) or (
        isinstance(x, Sequence) and not isinstance(x, (str, bytes))
    )


def _describe(x: Any) -> str:
    text = repr(x)
    return f"{type(x).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _dtype_name(arr: np.ndarray) -> str:
    if arr.dtype.kind == "c":
        return "complex"
    if arr.dtype.kind == "O":
        return "non-numeric (object)"
    return f"{arr.dtype} (non-numeric)"
