"""Exact inference on discrete factor graphs, as CatBP programs.

factor graph → tree plan (elimination order, junction tree) → upward / downward /
finalize programs → the JIT (or the reference interpreter) → Z and marginals; and MPE,
marginal MAP, max-marginals and posterior samples (tasks.py, map_query.py).
"""

from .emit import emit_programs
from .graph import Factor, FactorGraph, FactorGraphError, factor_graph
from .map_query import MAP
from .model import CompiledModel, Solution, compile_model, map_query, solve
from .plan import TreePlan, elimination_order, junction_tree
from .tasks import MPE, MPEBatch

__all__ = [
    "CompiledModel",
    "Factor",
    "FactorGraph",
    "FactorGraphError",
    "MAP",
    "MPE",
    "MPEBatch",
    "Solution",
    "TreePlan",
    "compile_model",
    "elimination_order",
    "emit_programs",
    "factor_graph",
    "junction_tree",
    "map_query",
    "solve",
]
