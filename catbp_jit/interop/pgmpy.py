"""pgmpy models as FactorGraphs: a DiscreteBayesianNetwork with its TabularCPDs, or a
DiscreteMarkovNetwork with its DiscreteFactors.

A pgmpy factor holds its table as `factor.values`, an array with one axis per variable
in the order of `factor.variables` (a TabularCPD's: its variable, then its evidence),
each axis in the order of that variable's state names. TabularCPD.get_values() is the
same array flattened to (card(variable), prod(card(evidence))), the last evidence
variable varying fastest. So each factor here has scope `factor.variables` and a float64
copy of `factor.values`: no rounding, no renormalizing.

The model kind is told by class name, so pgmpy (seconds to import) is never imported
here: a pgmpy model in hand means the caller has imported it already.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import name_list, shown
from ..frontend.graph import FactorGraph, FactorGraphError, factor_graph

DEFAULT_NAME = "pgmpy model"

# pgmpy >= 1.0 calls the discrete models so; before 1.0 they were BayesianNetwork (or
# BayesianModel, its subclass) and MarkovNetwork. In 1.x those old names are stubs that
# refuse to be made, so an instance of one is always an older pgmpy's model.
BAYESIAN_CLASSES = ("DiscreteBayesianNetwork", "BayesianNetwork")
MARKOV_CLASSES = ("DiscreteMarkovNetwork", "MarkovNetwork")
SUPPORTED = "a pgmpy DiscreteBayesianNetwork (with TabularCPDs) or DiscreteMarkovNetwork (DiscreteFactors)"


def from_pgmpy(model: Any, *, name: str | None = None) -> FactorGraph:
    """The FactorGraph of a pgmpy discrete Bayesian or Markov network.

    Variables come in the model's node order with their state names (as strings, in
    `graph.states`); a Bayesian network gives one factor per CPD, scope (variable,
    evidence...), a Markov network one per DiscreteFactor. Graph name: `name`, else the
    model's non-empty `name`, else "pgmpy model". Anything else (a continuous model or
    CPD, a network without CPDs or factors, cardinalities or state names that disagree
    between factors) is refused with a FactorGraphError.
    """
    label = name if name is not None else _model_name(model)
    classes = _pgmpy_classes(model)
    if classes & set(BAYESIAN_CLASSES):
        return _bayesian_network(model, label)
    if classes & set(MARKOV_CLASSES):
        return _markov_network(model, label)
    raise FactorGraphError(f"{label}: a {type(model).__name__} is not {SUPPORTED}")


def _pgmpy_classes(obj: Any) -> set[str]:
    """The names of obj's classes (its own and its bases) that pgmpy defines."""
    return {c.__name__ for c in type(obj).__mro__ if c.__module__.startswith("pgmpy.")}


def _model_name(model: Any) -> str:
    name = getattr(model, "name", None)
    return name if isinstance(name, str) and name else DEFAULT_NAME


def _bayesian_network(model: Any, label: str) -> FactorGraph:
    cpds = list(model.get_cpds())
    if not cpds:
        raise FactorGraphError(f"{label}: the Bayesian network has no CPDs (add them with model.add_cpds)")
    for cpd in cpds:
        if "TabularCPD" not in _pgmpy_classes(cpd):
            raise FactorGraphError(
                f"{label}: the CPD of {shown(getattr(cpd, 'variable', None))} is a {type(cpd).__name__}; "
                "only discrete CPDs (TabularCPD) convert"
            )
    own = {cpd.variables[0]: cpd for cpd in cpds}
    nodes = list(model.nodes())
    missing = [v for v in nodes if v not in own]
    if missing:
        raise FactorGraphError(f"{label}: no CPD for {name_list(missing, repr)}")
    strays = [v for v in own if v not in set(nodes)]
    if strays:
        raise FactorGraphError(f"{label}: CPDs for {name_list(strays, repr)}, which are not nodes")

    # each variable's states are those its own CPD gives it; every other CPD must agree
    domains = {v: int(own[v].cardinality[0]) for v in nodes}
    states = {v: _state_names(own[v], v) for v in nodes}
    factors = {}
    for v in nodes:
        cpd = own[v]
        parents = set(model.get_parents(v))
        if set(cpd.variables[1:]) != parents:
            raise FactorGraphError(
                f"{label}: the CPD of {shown(v)} is conditioned on "
                f"({name_list(cpd.variables[1:], repr)}) but its parents in the graph are "
                f"({name_list(sorted(parents, key=str), repr)})"
            )
        where = f"the CPD of {shown(v)}"
        factors[f"CPD of {v}"] = _factor(label, where, cpd, domains, states)
    return _graph(label, domains, factors, states)


def _markov_network(model: Any, label: str) -> FactorGraph:
    found = list(model.get_factors())
    if not found:
        raise FactorGraphError(f"{label}: the Markov network has no factors (add them with add_factors)")
    nodes = list(model.nodes())
    known = set(nodes)
    domains: dict[Any, int] = {}
    states: dict[Any, Any] = {}
    for i, factor in enumerate(found):
        if "DiscreteFactor" not in _pgmpy_classes(factor):
            raise FactorGraphError(
                f"{label}: factor {i} is a {type(factor).__name__}; only DiscreteFactors convert"
            )
        strays = [v for v in factor.variables if v not in known]
        if strays:
            raise FactorGraphError(
                f"{label}: factor {i} is over {name_list(strays, repr)}, which are not nodes of the model"
            )
        # a variable's first factor gives its states; every later one must agree
        for axis, v in enumerate(factor.variables):
            if v not in domains:
                domains[v] = int(factor.cardinality[axis])
                states[v] = _state_names(factor, v)
    lonely = [v for v in nodes if v not in domains]
    if lonely:
        raise FactorGraphError(
            f"{label}: no factor is over {name_list(lonely, repr)}, so their numbers of states are unknown"
        )
    domains = {v: domains[v] for v in nodes}  # in the model's node order
    factors = [_factor(label, f"factor {i}", factor, domains, states) for i, factor in enumerate(found)]
    return _graph(label, domains, factors, states)


def _factor(
    label: str, where: str, factor: Any, domains: dict[Any, int], states: dict[Any, Any]
) -> tuple[tuple[Any, ...], np.ndarray]:
    """(scope, table) of a TabularCPD or DiscreteFactor, checked against the variables'
    domains and state names as the model's other factors give them."""
    scope = tuple(factor.variables)
    values = np.asarray(factor.values)
    cards = tuple(int(c) for c in factor.cardinality)
    if values.shape != cards:
        raise FactorGraphError(f"{label}: {where} has a table of shape {values.shape}, cardinality {cards}")
    for axis, v in enumerate(scope):
        if cards[axis] != domains[v]:
            raise FactorGraphError(
                f"{label}: {where} gives {shown(v)} {cards[axis]} states; it has {domains[v]} elsewhere"
            )
        if _state_names(factor, v) != states[v]:
            raise FactorGraphError(
                f"{label}: {where} names the states of {shown(v)} {shown(_state_names(factor, v))}; "
                f"they are {shown(states[v])} elsewhere"
            )
    return scope, values


def _state_names(factor: Any, v: Any) -> list[Any] | None:
    names = getattr(factor, "state_names", None) or {}
    return list(names[v]) if v in names else None


def _graph(
    label: str, domains: dict[Any, int], factors: Sequence[Any] | dict[str, Any], states: dict[Any, Any]
) -> FactorGraph:
    """The checked FactorGraph; pgmpy allows any hashable as a variable name, we strings."""
    odd = [v for v in domains if not isinstance(v, str)]
    if odd:
        raise FactorGraphError(f"{label}: variable names must be strings, got {name_list(odd, repr)}")
    state_names = {v: [str(s) for s in names] for v, names in states.items() if names is not None}
    return factor_graph(domains, factors, name=label, states=state_names)
