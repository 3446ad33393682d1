"""pyAgrum models as FactorGraphs: a BayesNet (its CPTs) or a MarkovRandomField (its
factors), and the model files pyAgrum reads (Hugin .net, GeNIe .xdsl, .dsl, .bifxml,
.o3prm, pyAgrum's own .jgum and .bgum).

A pyAgrum tensor lists its variables as tensor.variable(0), variable(1), ...; the first
varies fastest. toarray() holds the same entries in C order, so its axes are those
variables in reverse order: the factor here has that reversed scope and a float64 copy of
toarray(), no rounding, no renormalizing.

pyAgrum is imported only when a file is read: a model in hand means the caller has
imported it already (as `pyagrum`, or `pyAgrum` in older releases).
"""

from __future__ import annotations

import importlib
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import clip, name_list, shown
from ..frontend.graph import FactorGraph, FactorGraphError, factor_graph

DEFAULT_NAME = "pyAgrum model"

# The suffixes read_model hands to pyAgrum (UAI and BIF have readers of our own).
PYAGRUM_SUFFIXES = (".net", ".dsl", ".xdsl", ".bifxml", ".o3prm", ".jgum", ".bgum")
# pyAgrum's loadBN unpickles a .pkl file, which runs whatever code the file holds
PICKLE_SUFFIX = ".pkl"
INSTALL_HINT = "pip install pyagrum (or catbp_jit[interop])"

BAYES_NET_CLASS = "IBayesNet"  # BayesNet and BayesNetFragment
MRF_CLASS = "IMarkovRandomField"  # MarkovRandomField


def import_pyagrum() -> Any:
    """The pyAgrum module (`pyagrum`, or `pyAgrum` before 2.0); ImportError saying how to
    install it when neither is there."""
    for module in ("pyagrum", "pyAgrum"):
        try:
            return importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # installed, but something it needs is missing: say so
                raise
    raise ImportError(f"reading this model needs pyAgrum: {INSTALL_HINT}")


def from_pyagrum(model: Any, name: str | None = None) -> FactorGraph:
    """The FactorGraph of a pyAgrum BayesNet (one factor per CPT) or MarkovRandomField
    (one factor per factor); a factor's scope is its tensor's variables reversed (a CPT's:
    parents, last first, then the variable), the axes of its toarray().

    Variables come in node id order with their labels as state names (`graph.states`).
    Graph name: `name`, else the model's non-empty "name" property, else "pyAgrum
    model". Anything else is refused with a FactorGraphError.
    """
    classes = {c.__name__ for c in type(model).__mro__ if c.__module__.lower().startswith("pyagrum")}
    if BAYES_NET_CLASS in classes:
        label = name if name is not None else _model_name(model)
        tensors = [(f"CPT of {model.variable(n).name()}", model.cpt(n)) for n in sorted(model.nodes())]
    elif MRF_CLASS in classes:
        label = name if name is not None else _model_name(model)
        tensors = [(f"factor {i}", model.factor(nodes)) for i, nodes in enumerate(model.factors())]
    else:
        label = name if name is not None else DEFAULT_NAME
        raise FactorGraphError(
            f"{label}: a {type(model).__name__} is not a pyAgrum BayesNet or MarkovRandomField"
        )

    domains: dict[str, int] = {}
    states: dict[str, tuple[str, ...]] = {}
    for node in sorted(model.nodes()):
        variable = model.variable(node)
        v = variable.name()
        if not (hasattr(variable, "labels") and hasattr(variable, "domainSize")):
            raise FactorGraphError(
                f"{label}: variable {shown(v)} is a {type(variable).__name__}; only discrete ones convert"
            )
        domains[v] = int(variable.domainSize())
        states[v] = tuple(str(s) for s in variable.labels())
    factors = {where: _factor(label, where, tensor, domains) for where, tensor in tensors}
    return factor_graph(domains, factors, name=label, states=states)


def _model_name(model: Any) -> str:
    name = model.propertyWithDefault("name", "")
    return name if isinstance(name, str) and name else DEFAULT_NAME


def _factor(
    label: str, where: str, tensor: Any, domains: dict[str, int]
) -> tuple[tuple[str, ...], np.ndarray]:
    """(scope, table) of a pyAgrum tensor: toarray()'s axes are its variables reversed."""
    names = [tensor.variable(i).name() for i in range(tensor.nbrDim())]
    scope = tuple(reversed(names))
    unknown = [v for v in scope if v not in domains]
    if unknown:
        raise FactorGraphError(f"{label}: {where} is over {name_list(unknown, repr)}, not model variables")
    values = np.asarray(tensor.toarray())
    shape = tuple(domains[v] for v in scope)
    if values.shape != shape:  # toarray()'s layout is not the one described above
        raise FactorGraphError(
            f"{label}: {where} over ({name_list(scope)}) has a table of shape {values.shape}, "
            f"not the variables' domains {shape}"
        )
    return scope, values


def read_pyagrum_file(path: str | PathLike[str], name: str | None = None) -> FactorGraph:
    """A Bayesian network file read by pyAgrum's loadBN (.net, .xdsl, .dsl, .bifxml, .o3prm,
    ...), as a FactorGraph (from_pyagrum). Graph name: `name`, else the file name without
    its suffix. A pickle (.pkl) is refused: loading one runs the code it holds."""
    path = Path(path)
    if path.name.lower().endswith(PICKLE_SUFFIX):
        raise FactorGraphError(
            f"{path}: a pickle runs code when it is loaded, so it is not read as a model file; "
            "if you trust it, load it with pyagrum.loadBN and convert it with from_pyagrum"
        )
    gum = import_pyagrum()
    try:
        model = gum.loadBN(str(path))
    except gum.GumException as e:  # pyAgrum's own errors: a syntax error, no such file, ...
        lines = str(e).strip().splitlines() or [type(e).__name__]
        raise FactorGraphError(f"{path}: pyAgrum cannot read it: {clip(lines[0], 300)}") from None
    return from_pyagrum(model, name=name if name is not None else path.stem)
