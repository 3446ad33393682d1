"""Marginal MAP: the best assignment of some query variables, the others summed out.

    argmax over q of  Σ over h of  Π f(q, h, e)

Sums and maxes do not commute, so the hidden variables h must be summed before any query
variable is maximized: an elimination order constrained to take h first. It is built
here in two stages, each an ordinary model:

1. Sum. The hidden variables fall into connected parts (two share a part when a factor
   holds both). A part K touches the query only through its boundary B_K (the query
   variables in its factors), so its sum is one table T_K(B_K). Every part, with its own
   copy of its boundary, becomes one LOGPROB model of disjoint pieces; an all-ones factor
   over each copy makes some clique hold the whole boundary, and that clique's belief,
   summed to the boundary, is T_K times the other parts' totals. Those totals cancel:
   with L the log of the whole model's total, log T_K = belief_K - L + log Z_K, and the
   log Z_K of all parts add up to L.
2. Max. The query variables with the T_K tables and the factors over query variables
   only: an MPE (tasks.py, MAXLOG) whose assignment is the answer.

What it costs: the boundary of a part is one table, so a wide boundary is a large clique
(a chain's hidden middle is cheap; a grid with every other variable queried is not);
stage 1 refuses it at the memory limit like any model. Both stages compile per call
(kernels come from the disk cache after the first).

log_value is log Σ_h Π f(q*, h, e): the stage-1 tables at the answer plus the query-only
factors. T_K enters stage 2 scaled to a largest entry of 1; an entry that underflows to 0
there could only hide an answer if that answer were below e^-700 of the best, which is
checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import name_list
from ..semiring import logsumexp
from .absorb import absorb, cut_values
from .graph import Factor, FactorGraph, FactorGraphError
from .scaling import NumericalError

if TYPE_CHECKING:
    from .model import CompiledModel
    from .tasks import MPE

Build = Callable[[FactorGraph, str], "CompiledModel"]  # a stage's model: (graph, semiring)

# below this log value of stage 2's best (its tables scaled to a largest entry of 1), an
# entry that underflowed to 0 might have been the best
UNDERFLOW_LOG = -700.0


@dataclass(frozen=True)
class MAP:
    """The most probable joint state of the query variables given the evidence, the rest
    summed out. assignment: query variables and evidence -> state index (None when the
    evidence is impossible); log_value: log of the summed weight at that assignment."""

    assignment: dict[str, int] | None
    log_value: float
    query: tuple[str, ...]
    evidence: dict[str, int]


def marginal_map(graph: FactorGraph, query: Sequence[str], evidence: Mapping[str, Any], build: Build) -> MAP:
    """Marginal MAP of `graph` (a FactorGraph); evidence: {variable: state index or name}
    on any variables but the query's. build(graph, semiring): a junction-tree model of a
    stage (model.py's map_query passes one, on a target: this module builds none itself)."""
    from .build import state_index

    query = _checked_query(graph, query, evidence)
    observed = {v: state_index(graph, v, s) for v, s in evidence.items()}
    stages = _Stages(build)
    cut = _with_evidence(graph, observed)
    hidden = [v for v in cut.variables if v not in set(query)]
    parts = _parts(cut, hidden)
    constant = 0.0
    in_parts: set[int] = set()
    for part in parts:
        in_parts.update(part.factors)
    with np.errstate(divide="ignore"):
        for f, fac in enumerate(cut.factors):
            if f not in in_parts and not fac.scope:  # a factor over evidence alone
                constant += float(np.log(fac.values))
    direct = [fac for f, fac in enumerate(cut.factors) if f not in in_parts and fac.scope]
    summed, log_total = _summed_tables(stages, cut, parts) if parts else ([], 0.0)
    if log_total == -math.inf:
        return MAP(None, -math.inf, query, observed)
    scaled, underflowed = [], False
    for scope, log_table in summed:
        top = log_table.max()
        if top == -np.inf:  # the evidence is impossible
            return MAP(None, -math.inf, query, observed)
        with np.errstate(under="ignore"):
            values = np.exp(log_table - top)
        underflowed |= bool(((values == 0) & np.isfinite(log_table)).any())
        scaled.append(Factor(scope, values))
    stage2 = FactorGraph({v: cut.variables[v] for v in query}, tuple(direct + scaled), f"{graph.name} (MAP)")
    best = stages.mpe(stage2)
    if best.assignment is None:
        return MAP(None, -math.inf, query, observed)
    scaled_value = _log_sum(stage2.factors, best.assignment)
    if underflowed and scaled_value < UNDERFLOW_LOG:
        raise NumericalError(
            f"{graph.name}: marginal MAP's best is below e^{UNDERFLOW_LOG:g} of a summed table's "
            "largest entry, where entries underflowed; the answer is not certain"
        )
    value = _log_sum(direct, best.assignment) + constant + log_total
    value += sum(_log_at(scope, table, best.assignment) for scope, table in summed)
    if value == -math.inf:  # a factor over the evidence alone is 0 there
        return MAP(None, -math.inf, query, observed)
    assignment = {v: best.assignment[v] for v in query} | observed
    return MAP(assignment, value, query, observed)


def _checked_query(graph: FactorGraph, query: Sequence[str], evidence: Mapping[str, Any]) -> tuple[str, ...]:
    if isinstance(query, str):
        query = (query,)
    query = tuple(dict.fromkeys(query))
    unknown = [v for v in query if v not in graph.variables]
    if unknown:
        raise FactorGraphError(f"{graph.name}: MAP query on unknown variable(s) {name_list(unknown, repr)}")
    both = [v for v in query if v in evidence]
    if both:
        raise FactorGraphError(
            f"{graph.name}: MAP query variable(s) {name_list(both, repr)} are also evidence"
        )
    if not query:
        raise FactorGraphError(f"{graph.name}: a MAP query needs at least one variable")
    return query


def _with_evidence(graph: FactorGraph, observed: Mapping[str, int]) -> FactorGraph:
    """The graph with the observed variables cut out of every factor at their states."""
    if not observed:
        return graph
    cut = absorb(graph, tuple(observed))
    values = cut_values(graph, cut, observed)
    factors = tuple(
        Factor(fac.scope, values[f]) if f in values else fac for f, fac in enumerate(cut.graph.factors)
    )
    return FactorGraph(cut.graph.variables, factors, graph.name, cut.graph.states)


@dataclass(frozen=True)
class _Part:
    hidden: tuple[str, ...]
    factors: tuple[int, ...]  # the factors that hold one of its hidden variables
    boundary: tuple[str, ...]  # the query variables in those factors, in graph order


def _parts(graph: FactorGraph, hidden: Sequence[str]) -> list[_Part]:
    """The connected parts of the hidden variables, linked by shared factors."""
    parent = {v: v for v in hidden}

    def root(v: str) -> str:
        while parent[v] != v:
            parent[v] = parent[parent[v]]
            v = parent[v]
        return v

    for fac in graph.factors:
        inside = [v for v in fac.scope if v in parent]
        for v in inside[1:]:
            parent[root(v)] = root(inside[0])
    members: dict[str, list[str]] = {}
    for v in hidden:
        members.setdefault(root(v), []).append(v)
    order = {v: i for i, v in enumerate(graph.variables)}
    parts = []
    for vs in members.values():
        group = set(vs)
        factors = tuple(f for f, fac in enumerate(graph.factors) if group.intersection(fac.scope))
        boundary = {v for f in factors for v in graph.factors[f].scope if v not in parent}
        parts.append(_Part(tuple(vs), factors, tuple(sorted(boundary, key=order.__getitem__))))
    return parts


class _Stages:
    """Builds the two stages' models."""

    def __init__(self, build: Build):
        self.build = build

    def model(self, graph: FactorGraph, semiring: str) -> CompiledModel:
        return self.build(graph, semiring)

    def mpe(self, graph: FactorGraph) -> MPE:
        return self.model(graph, "MAXLOG").mpe()


def _summed_tables(
    stages: _Stages, graph: FactorGraph, parts: list[_Part]
) -> tuple[list[tuple[tuple[str, ...], np.ndarray]], float]:
    """Per part that touches the query: (its boundary, log T - log Z over the boundary in
    that order, Z the part's total), and L, the sum of every part's log Z."""
    variables: dict[str, int] = {}
    factors: list[Factor] = []
    marks: list[int | None] = []  # per part: its all-ones factor's index
    for k, part in enumerate(parts):
        name = {v: f"{k}:{v}" for v in part.hidden + part.boundary}  # each part its own copies
        for v in part.hidden + part.boundary:
            variables[name[v]] = graph.variables[v]
        for f in part.factors:
            fac = graph.factors[f]
            factors.append(Factor(tuple(name[v] for v in fac.scope), fac.values))
        if part.boundary:
            marks.append(len(factors))
            shape = tuple(graph.variables[v] for v in part.boundary)
            factors.append(Factor(tuple(name[v] for v in part.boundary), np.ones(shape)))
        else:
            marks.append(None)
    stage1 = FactorGraph(variables, tuple(factors), f"{graph.name} (MAP, summed)")
    summing = stages.model(stage1, "LOGPROB")
    beliefs = summing._clique_beliefs(np.zeros((1, 0), dtype=np.int64))
    plan = summing.plan
    root = beliefs[plan.root][0]
    log_total = float(logsumexp(root, axis=tuple(range(root.ndim)))) if root.ndim else float(root)
    if log_total == -math.inf:  # nothing is possible
        return [], log_total
    home = {f: c.id for c in plan.cliques for f in c.factors}
    names = list(stage1.variables)
    out = []
    for k, (part, mark) in enumerate(zip(parts, marks)):
        if mark is None:  # a part that touches no query variable: its total is in L alone
            continue
        clique = plan.cliques[home[mark]]
        belief = beliefs[clique.id][0]
        inside = [names[v] for v in clique.variables]
        wanted = [inside.index(f"{k}:{v}") for v in part.boundary]
        rest = tuple(i for i in range(belief.ndim) if i not in wanted)
        table = np.asarray(logsumexp(belief, axis=rest) if rest else belief)
        # the remaining axes follow the clique's order: put them in the boundary's
        kept = [i for i in range(belief.ndim) if i in wanted]
        out.append((part.boundary, np.transpose(table, [kept.index(i) for i in wanted]) - log_total))
    return out, log_total


def _log_at(scope: tuple[str, ...], log_table: np.ndarray, assignment: Mapping[str, int]) -> float:
    return float(log_table[tuple(assignment[v] for v in scope)]) if scope else float(log_table)


def _log_sum(factors: Sequence[Factor], assignment: Mapping[str, int]) -> float:
    with np.errstate(divide="ignore"):
        return float(sum(np.log(fac.values[tuple(assignment[v] for v in fac.scope)]) for fac in factors))
