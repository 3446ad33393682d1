"""Plan search: the elimination order with the lowest estimated run time, within a budget.

Greedy min-fill (plan.elimination_order) is instant but minimizes states, not time, and on
Promedus and Pedigree its largest cliques are 2^24–2^27 states where contraction trees of
2^15–2^18 exist. cotengra (an optional dependency: `pip install 'catbp_jit[plan]'`)
searches contraction trees of the model's tensor network (factor scopes as tensors, every
index summed out) for the budget; each tree is an elimination order (a variable is
eliminated at the contraction that sums its index out), and the junction tree of that
order is scored like the greedy one (`plan_cost`). The cheapest plan within the limits
wins; the greedy order is always a candidate, and the only one when plan_time is 0, when
cotengra is missing, or when the greedy plan is so cheap that no search could pay for itself.
"""

from __future__ import annotations

import importlib.util
import math
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import plan_cache
from .plan_cache import PlanKey
from .plan import (PlanLimitError, PlanLimits, Progress, TreePlan, elimination_order,
                   junction_tree)

# seconds; paid once per model structure (plans are cached). cotengra's trials take
# 0.3-2 s each on UAI 2014's Pedigree/Promedus/linkage models and vary a lot: 5 s often
# found nothing better than greedy there, 10 s mostly did (Pedigree_11: 2^25 -> 2^20)
DEFAULT_PLAN_TIME = 10.0
# below this the greedy plan runs in about a millisecond: a search cannot pay for itself
SEARCH_ABOVE_FLOPS = 1e7
# when greedy passes a limit, search only if it came within this factor of it: searches
# shrink the largest clique 2^3-2^7 on UAI 2014 models, and on a hopeless graph
# (relational_1: a clique of 2^251 states) a search would only delay the refusal
RESCUE_WITHIN = 2**10
# a search trial is scored as a junction tree when its flops (cotengra's count) are within
# this factor of the best trial's so far
SCORED_WITHIN = 8.0


@dataclass(frozen=True)
class PlanSearch:
    """How to find the elimination order. time_s: the search budget, 0 = greedy only;
    min_flops: search only when the greedy plan's estimated cost reaches this; cache:
    keep searched plans on disk (plan_cache.py)."""
    time_s: float = DEFAULT_PLAN_TIME
    min_flops: float = SEARCH_ABOVE_FLOPS
    cache: bool = True

    def __post_init__(self):
        if not (isinstance(self.time_s, (int, float)) and math.isfinite(self.time_s)
                and self.time_s >= 0):
            raise ValueError(f"plan_time must be a number of seconds >= 0, got {self.time_s!r}")


@dataclass(frozen=True)
class PlanCost:
    """A plan's estimated run time and memory (the planner compares plans by `flops`)."""
    flops: int  # element operations of the upward and downward passes (see plan_cost)
    largest_states: int
    total_states: int  # every belief is kept: the beliefs' memory
    separator_states: int  # messages, both directions

    def peak_bytes(self, itemsize: int) -> int:
        return (self.total_states + 2 * self.separator_states) * itemsize


def plan_cost(plan: TreePlan) -> PlanCost:
    """Each pass loops over every clique's states once per table it multiplies there (the
    JIT fuses a product with its elimination, so a loop costs its states times its inputs).
    Upward: the clique's factors and indicators and its children's messages. Downward
    (emit_downward): the same base plus the parent's message, and per child about four
    more (the prefix product, the product excluding the child, the suffix, the read)."""
    flops = total = seps = largest = 0
    for c in plan.cliques:
        states = plan.states(c.id)
        local = len(c.factors) + len(c.evidence)
        k = len(c.children)
        up = max(1, local + k)
        down = (local + (c.parent is not None) + 4 * k) if (k or c.parent is not None) else 0
        flops += states * (up + down)
        total += states
        largest = max(largest, states)
        if c.parent is not None:
            seps += math.prod(plan.sizes[v] for v in plan.up_separator[c.id])
    return PlanCost(flops, largest, total, seps)


def within(cost: PlanCost, limits: PlanLimits) -> bool:
    return ((limits.max_clique_states is None or cost.largest_states <= limits.max_clique_states)
            and (limits.max_total_states is None or cost.total_states <= limits.max_total_states))


@dataclass(frozen=True)
class PlanChoice:
    """The order that won, which planner found it, its cost and how long the search took."""
    order: Tuple[int, ...]
    planner: str  # "greedy", "cotengra", or "cache" (a search paid earlier)
    cost: PlanCost
    search_s: float = 0.0
    greedy_cost: Optional[PlanCost] = None  # None when greedy found no plan within the limits


def search_available() -> bool:
    return importlib.util.find_spec("cotengra") is not None


def choose_order(sizes: Sequence[int], scopes: Sequence[Sequence[int]], *,
                 limits: PlanLimits = PlanLimits(), search: PlanSearch = PlanSearch(),
                 key: Optional[PlanKey] = None,
                 progress: Optional[Progress] = None) -> PlanChoice:
    """The cheapest order within `limits`: greedy's, or a searched one when `search` allows.
    With `key` a search is filed on disk (plan_cache.py) and a filed one is reused when it
    was searched with at least this budget. PlanLimitError (greedy's) when no plan found
    is within the limits."""
    say = progress or (lambda msg: None)
    if search.time_s > 0 and search.cache and key is not None:
        hit = plan_cache.load(key)
        if hit is not None and hit.plan_time >= search.time_s:
            cost = _cost(sizes, scopes, hit.order)
            if within(cost, limits):
                say(f"plan from the cache ({hit.planner}, searched for {hit.plan_time:g} s)")
                return PlanChoice(hit.order, "cache", cost)
    greedy: Optional[PlanChoice] = None
    refused: Optional[PlanLimitError] = None
    try:
        order = elimination_order(sizes, scopes, limits=limits, progress=progress)
        greedy = PlanChoice(order, "greedy", _cost(sizes, scopes, order))
    except PlanLimitError as e:
        refused = e
    worth = _near(refused.run, limits) if greedy is None else greedy.cost.flops >= search.min_flops
    if search.time_s <= 0 or not worth or not search_available() or len(scopes) < 2:
        if greedy is None:
            raise refused
        return PlanChoice(greedy.order, "greedy", greedy.cost, greedy_cost=greedy.cost)
    t0 = time.perf_counter()
    found = searched_order(sizes, scopes, search.time_s, score=lambda order: _score(
        _cost(sizes, scopes, order), limits))
    search_s = time.perf_counter() - t0
    best = greedy
    if found is not None:
        cost = _cost(sizes, scopes, found)
        say(f"cotengra: {cost.flops:.3g} flops, largest clique {cost.largest_states:,} states, "
            f"{search_s:.1f} s")
        if within(cost, limits) and (best is None or cost.flops < best.cost.flops):
            best = PlanChoice(found, "cotengra", cost)
    if best is None:
        raise refused
    if search.cache and key is not None:
        plan_cache.store(key, plan_cache.CachedPlan(best.order, best.planner, search.time_s))
    return PlanChoice(best.order, best.planner, best.cost, search_s,
                      greedy.cost if greedy else None)


def _score(cost: PlanCost, limits: PlanLimits) -> float:
    return cost.flops if within(cost, limits) else math.inf


def _near(run, limits: PlanLimits) -> bool:
    """Did a greedy run refused at a limit come within RESCUE_WITHIN of it?"""
    if run.stopped == "clique":
        return run.largest_states <= limits.max_clique_states * RESCUE_WITHIN
    return run.tree_states <= limits.max_total_states * RESCUE_WITHIN


def _cost(sizes, scopes, order) -> PlanCost:
    return plan_cost(junction_tree(sizes, scopes, order))


def searched_order(sizes: Sequence[int], scopes: Sequence[Sequence[int]], time_s: float,
                   score: Optional[Callable[[Tuple[int, ...]], float]] = None,
                   ) -> Optional[Tuple[int, ...]]:
    """The best order cotengra's trials give in `time_s` (None when the network has fewer
    than two tensors: nothing to search). Each promising trial (within SCORED_WITHIN of
    the fewest flops so far) is turned into an order and judged by `score` (lower is
    better; default: cotengra's own flops, its best tree only): the trees cotengra ranks
    first are often not the cheapest junction trees, and trials vary a lot."""
    import cotengra as ctg
    inputs = [tuple(sorted(set(s))) for s in scopes if s]
    if len(inputs) < 2:
        return None
    symbol = {v: ctg.get_symbol(v) for s in inputs for v in s}
    methods = ["greedy", "kahypar" if importlib.util.find_spec("kahypar") else "labels"]
    kept: List[Tuple[float, Tuple[int, ...]]] = []
    least = [math.inf]  # the fewest flops of any trial so far

    class Scored(ctg.HyperOptimizer):
        # cotengra's hook for each finished trial (private: in a version without it,
        # `kept` stays empty and cotengra's own best tree is used)
        def _maybe_report_result(self, setting, trial):
            super()._maybe_report_result(setting, trial)
            flops, tree = trial.get("flops", math.inf), trial.get("tree")
            if score is None or tree is None or not flops <= least[0] * SCORED_WITHIN:
                return
            least[0] = min(least[0], flops)
            order = tree_order(tree, inputs, len(sizes))
            kept.append((score(order), order))

    opt = Scored(methods=methods, minimize="flops", max_time=time_s, max_repeats=10**9,
                 parallel=False, progbar=False, on_trial_error="ignore")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = opt.search([tuple(symbol[v] for v in s) for s in inputs], (),
                              {symbol[v]: sizes[v] for v in symbol})
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: B036  a Rust path finder's panic is no Exception
        # (cotengrust's greedy panicked on bnlearn's pathfinder: pyo3's PanicException
        # derives from BaseException, so on_trial_error="ignore" lets it through): the
        # trials scored so far stand; without any, the caller keeps the greedy plan
        warnings.warn(f"plan search stopped by a failing cotengra trial ({type(e).__name__}: "
                      f"{str(e)[:200]}); {len(kept)} trial(s) scored before it are used",
                      PlanSearchWarning)
        tree = None
    if kept:
        return min(kept, key=lambda k: k[0])[1]
    return None if tree is None else tree_order(tree, inputs, len(sizes))


class PlanSearchWarning(UserWarning):
    """The plan search failed part-way; the plan is the best found before (or greedy)."""


def tree_order(tree, inputs: Sequence[Tuple[int, ...]], n: int) -> Tuple[int, ...]:
    """The elimination order of a contraction tree: each variable at the contraction (in
    the tree's order) after which no tensor outside the contracted subtree holds it;
    variables of a single tensor first, variables in none (their own cliques) last."""
    appearances = Counter(v for s in inputs for v in s)
    order: List[int] = [v for v in sorted(appearances) if appearances[v] == 1]
    counts: Dict[object, Counter] = {}

    def held(node) -> Counter:
        if node not in counts:  # a leaf: one input tensor, less what it alone holds
            (i,) = tree.get_subgraph(node)
            counts[node] = Counter(v for v in inputs[i] if appearances[v] > 1)
        return counts.pop(node)

    for parent, left, right in tree.traverse():
        merged = held(left) + held(right)
        done = sorted(v for v, k in merged.items() if k == appearances[v])
        order.extend(done)
        for v in done:
            del merged[v]
        counts[parent] = merged
    seen = set(order)
    order.extend(v for v in range(n) if v not in seen)
    return tuple(order)
