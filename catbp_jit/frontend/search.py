"""Plan search: the elimination order with the lowest estimated run time, within a budget.

Greedy min-fill (plan.elimination_order) is instant but minimizes states, not time, and
on Promedus and Pedigree its largest cliques are 2^24–2^27 states where contraction
trees of 2^15–2^18 exist. cotengra (an optional dependency: `pip install
'catbp_jit[plan]'`) searches contraction trees of the model's tensor network (factor
scopes as tensors, every index summed out) for the budget; each tree is an elimination
order (a variable is eliminated at the contraction that sums its index out), whose
junction tree is scored like the greedy one (`plan_cost`), and the tree with the lowest
flops plus kept states (KEPT_STATE_FLOPS) is also a candidate as a contraction tree of
its own (`tree_cost`). An order costs the cheaper of its junction and contraction trees.
The cheapest plan within the limits (by flops plus kept states) wins; the greedy order
is always a candidate, and the only one when plan_time is 0, when cotengra is missing,
or when the greedy plan is so cheap that no search could pay for itself.
"""

from __future__ import annotations

import heapq
import importlib.util
import itertools
import math
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import plan_cache
from .contraction import ContractionTree, contraction_tree, tree_from_path
from .plan import (
    GreedyRun,
    PlanLimitError,
    PlanLimits,
    Progress,
    TreePlan,
    elimination_order,
    junction_tree,
)
from .plan_cache import PlanKey

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
# What a contraction tree's trials, reconfigurations and path are ranked by: flops plus
# KEPT_STATE_FLOPS per element of every intermediate (cotengra's "combo", its default
# factor): each is written once and read again on the way down, at memory speed. Flops
# alone chose trees whose kept tables made them slow: Grids_16 ran in 0.35 s with 1.2e7
# states kept, 1.2 s with 9.7e7 and 1.7 s with 1.9e8, at about the same flops (1.2e9-2.6e9)
KEPT_STATE_FLOPS = 64
COMBO = f"combo-{KEPT_STATE_FLOPS}"  # (cotengra parses the factor from the name)
# the best trials (by that rank) are scored as junction trees after the search; the trees
# cotengra ranks first are often not the cheapest junction trees
SCORED = 4
# of the budget, what the trials get; the rest is for reconfiguring the RECONFIGURED best
# trees and the greedy plan's tree (about a second each on linkage_24) and scoring
TRIAL_SHARE = 0.8
RECONFIGURED = 2
# The search draws every random number from Python's `random` seeded with this (its state
# put back after), and runs cotengra's greedy trials with seeds drawn from it
# (SEEDED_GREEDY): the same trials in the same order on every run, so a model gets the
# same plan whenever its search runs as many trials. Unseeded, two searches of Grids_16
# gave largest loops of 2^27 and 2^29 states (solves 74 and 360 ms), of Promedus_14
# 2^27 and 2^24 (100 and 5.6 ms).
SEARCH_SEED = 2014
SEEDED_GREEDY = "catbp-seeded-greedy"
# A search runs at least MIN_TRIALS trials, past its budget if need be (up to OVERRUN
# times it). Trials take 6 ms to 12 s each, and where each one is slow the day's load
# decided whether the good ones ran at all: Grids_16's second trial takes 5-12 s and its
# fifth finds the tree of 2^27-state loops (80 ms a solve) where the first has 2^29
# (280 ms), so its plan changed with the machine's load. Eight trials fit in 3x the
# default budget on every UAI 2014 model here (linkage_24, the slowest: 6 trials in 16 s).
MIN_TRIALS = 8
OVERRUN = 3.0
# a kernel dispatch, in element operations: a contraction tree runs about three kernels
# per table where a junction tree runs a few per clique (counts only between close plans)
STEP_OPERATIONS = 256


@dataclass(frozen=True)
class PlanSearch:
    """How to find the elimination order. time_s: the search budget, 0 = greedy only;
    min_flops: search only when the greedy plan's estimated cost reaches this; cache:
    keep searched plans on disk (plan_cache.py); searcher: the search itself, called as
    searched_order is (None: searched_order, cotengra's trials); trials: at most this many
    of cotengra's trials (None: as many as the budget allows); min_trials: at least this
    many (or `trials`, if fewer), past the budget if need be but within `overrun` times
    it. The trials are seeded (SEARCH_SEED), so a search that runs as many trials finds
    the same plan on any machine; a count that fits in the budget, or in the overrun when
    it is min_trials, makes that certain."""

    time_s: float = DEFAULT_PLAN_TIME
    min_flops: float = SEARCH_ABOVE_FLOPS
    cache: bool = True
    searcher: Callable[..., Searched | None] | None = None
    trials: int | None = None
    min_trials: int = MIN_TRIALS
    overrun: float = OVERRUN

    def __post_init__(self) -> None:
        if not (isinstance(self.time_s, (int, float)) and math.isfinite(self.time_s) and self.time_s >= 0):
            raise ValueError(f"plan_time must be a number of seconds >= 0, got {self.time_s!r}")
        if self.trials is not None and not (type(self.trials) is int and self.trials >= 1):
            raise ValueError(f"plan search trials must be an int >= 1 or None, got {self.trials!r}")
        if not (type(self.min_trials) is int and self.min_trials >= 0):
            raise ValueError(f"plan search min_trials must be an int >= 0, got {self.min_trials!r}")
        if not (isinstance(self.overrun, (int, float)) and math.isfinite(self.overrun) and self.overrun >= 1):
            raise ValueError(f"plan search overrun must be a number >= 1, got {self.overrun!r}")


@dataclass(frozen=True)
class PlanCost:
    """A plan's estimated run time and memory (the search compares plans by flops plus
    KEPT_STATE_FLOPS per kept state: _with_kept)."""

    flops: int  # element operations of the upward and downward passes (see plan_cost)
    largest_states: int
    total_states: int  # every belief is kept: the beliefs' memory
    separator_states: int  # messages, both directions

    def peak_bytes(self, itemsize: int) -> int:
        return (self.total_states + 2 * self.separator_states) * itemsize


def plan_cost(plan: TreePlan) -> PlanCost:
    """Each pass loops over every clique's states once per table it multiplies there (the
    JIT fuses a product with its elimination, so a loop costs its states times its inputs;
    STEP_OPERATIONS per kernel).
    Upward: the clique's factors and indicators and its children's messages. Downward
    (emit_downward): the same base plus the parent's message, and per child about four
    more (the prefix product, the product excluding the child, the suffix, the read)."""
    flops = total = seps = largest = 0
    steps = len(plan.sizes)  # the marginals
    for c in plan.cliques:
        states = plan.states(c.id)
        local = len(c.factors) + len(c.evidence)
        k = len(c.children)
        up = max(1, local + k)
        down = (local + (c.parent is not None) + 4 * k) if (k or c.parent is not None) else 0
        flops += states * (up + down)
        steps += 1 + (k + 1 if down else 0)
        total += states
        largest = max(largest, states)
        if c.parent is not None:
            seps += math.prod(plan.sizes[v] for v in plan.up_separator[c.id])
    return PlanCost(flops + STEP_OPERATIONS * steps, largest, total, seps)


def tree_cost(tree: ContractionTree) -> PlanCost:
    """A contraction tree's passes (emit_tree.py), in plan_cost's units: each contraction
    loops over its children's joint states reading two tensors (the root's adjoint is a
    scalar: one), upward once per internal node, downward once per child on the way to a
    marginal's home, plus the home tensor times its adjoint; STEP_OPERATIONS per kernel.
    Memory: every internal node's tensor is kept; adjoints are counted as separators."""
    parent = tree.parents()
    homes = set(tree.home)
    needed = tree.on_paths_to_homes(parent)
    flops = steps = stored = adjoints = largest = 0
    for node in tree.internal:
        flops += 2 * tree.loop_states(node.id)
        steps += 1
        if node.id != tree.root:
            states = tree.states(node.id)
            stored += states
            largest = max(largest, states)
        for c in node.children:
            if c not in needed:
                continue
            (sibling,) = [x for x in node.children if x != c]
            over = set(tree.adjoint_variables(node.id, parent)) | set(tree.nodes[sibling].variables)
            flops += (1 if node.id == tree.root else 2) * math.prod(tree.sizes[v] for v in over)
            adjoints += math.prod(tree.sizes[v] for v in tree.adjoint_variables(c, parent))
            steps += 1
    for n in homes:
        flops += 2 * tree.states(n)
        steps += 1
    return PlanCost(flops + STEP_OPERATIONS * steps, largest, stored, adjoints)


def within(cost: PlanCost, limits: PlanLimits) -> bool:
    return (limits.max_clique_states is None or cost.largest_states <= limits.max_clique_states) and (
        limits.max_total_states is None or cost.total_states <= limits.max_total_states
    )


@dataclass(frozen=True)
class PlanChoice:
    """The order that won, which planner found it, its cost and how long the search took."""

    order: tuple[int, ...]
    planner: str  # "greedy", "cotengra", or "cache" (a search paid earlier)
    cost: PlanCost
    search_s: float = 0.0
    greedy_cost: PlanCost | None = None  # None when greedy found no plan within the limits
    # a searched contraction tree, as tree_from_path takes it, when it won; else the
    # order's own trees are the candidates
    path: tuple[tuple[int, int], ...] | None = None


def search_available() -> bool:
    return importlib.util.find_spec("cotengra") is not None


def choose_order(
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    *,
    limits: PlanLimits = PlanLimits(),
    search: PlanSearch = PlanSearch(),
    key: PlanKey | None = None,
    progress: Progress | None = None,
    kinds: tuple[str, ...] = ("junction", "contraction"),
) -> PlanChoice:
    """The cheapest order within `limits`: greedy's, or a searched one when `search` allows.
    Each order is costed as the cheaper of its junction and contraction trees (`kinds`:
    those allowed), and a searched contraction tree is a candidate of its own.
    With `key` a search is filed on disk (plan_cache.py) and a filed one is reused when it
    was searched with at least this budget. PlanLimitError (greedy's) when no plan found
    is within the limits."""
    say = progress or (lambda msg: None)
    if search.time_s > 0 and search.cache and key is not None:
        hit = plan_cache.load(key)
        if hit is not None and hit.plan_time >= search.time_s:
            path = hit.path if "contraction" in kinds else None
            cost = (
                tree_cost(tree_from_path(sizes, scopes, path))
                if path is not None
                else _cost(sizes, scopes, hit.order, kinds)
            )
            if within(cost, limits):
                say(f"plan from the cache ({hit.planner}, searched for {hit.plan_time:g} s)")
                return PlanChoice(hit.order, "cache", cost, path=path)
    greedy: PlanChoice | None = None
    refused: PlanLimitError | None = None
    try:
        order = elimination_order(sizes, scopes, limits=limits, progress=progress)
        greedy = PlanChoice(order, "greedy", _cost(sizes, scopes, order, kinds))
    except PlanLimitError as e:
        refused = e
    if greedy is None:
        assert refused is not None  # elimination_order raised it
        worth = _near(refused.run, limits)
    else:
        worth = greedy.cost.flops >= search.min_flops
    if (
        search.time_s <= 0
        or not worth
        or not search_available()
        or len(scopes) < 2
        or (greedy is not None and cliques_are_factors(sizes, scopes, greedy.order))
        or (greedy is None and pairwise_forest(scopes))
    ):
        if greedy is None:
            assert refused is not None
            raise refused
        return PlanChoice(greedy.order, "greedy", greedy.cost, greedy_cost=greedy.cost)
    # (said before, not only after: a search runs for seconds, past its budget at times)
    least = least_trials(search.min_trials, search.trials)
    say(
        f"searching for a faster plan: {search.time_s:g} s"
        + (f", at least {least} trials (within {search.time_s * search.overrun:g} s)" if least else "")
    )
    t0 = time.perf_counter()
    # every greedy junction tree refused: the greedy order finished without the limits
    # seeds the search's trees and competes as a plan of its own (_rescued)
    unlimited = _unlimited_greedy(sizes, scopes) if greedy is None and "contraction" in kinds else None
    seed = greedy.order if greedy is not None and "contraction" in kinds else unlimited
    # trials are scored as junction trees only: scoring both kinds doubled the search
    find = search.searcher or searched_order
    found = find(
        sizes,
        scopes,
        search.time_s,
        score=lambda order: _score(plan_cost(junction_tree(sizes, scopes, order)), limits),
        seed=seed,
        trials=search.trials,
        min_trials=search.min_trials,
        overrun=search.overrun,
    )
    search_s = time.perf_counter() - t0
    best = greedy
    if found is not None:
        cost = _cost(sizes, scopes, found.order, kinds)
        say(
            f"cotengra: {cost.flops:.3g} flops, largest kept table {cost.largest_states:,} "
            f"states (its order), {search_s:.1f} s"
        )
        if within(cost, limits) and (best is None or _with_kept(cost) < _with_kept(best.cost)):
            best = PlanChoice(found.order, "cotengra", cost)
        if "contraction" in kinds:
            tree = tree_cost(tree_from_path(sizes, scopes, found.path))
            say(
                f"cotengra: {tree.flops:.3g} flops, largest kept table "
                f"{tree.largest_states:,} states (its contraction tree)"
            )
            if within(tree, limits) and (best is None or _with_kept(tree) < _with_kept(best.cost)):
                best = PlanChoice(found.order, "cotengra", tree, path=found.path)
    if unlimited is not None:
        rescue = _rescued(sizes, scopes, limits, unlimited)
        if rescue is not None:
            say(
                f"greedy order without the limits: {rescue.cost.flops:.3g} flops, "
                f"{rescue.cost.total_states:,} states kept (its reconfigured contraction tree)"
            )
            if best is None or _with_kept(rescue.cost) < _with_kept(best.cost):
                best = rescue
    if best is None:  # greedy refused, and no search found a plan within the limits
        assert refused is not None
        raise refused
    if search.cache and key is not None:
        plan_cache.store(key, plan_cache.CachedPlan(best.order, best.planner, search.time_s, best.path))
    return PlanChoice(
        best.order, best.planner, best.cost, search_s, greedy.cost if greedy else None, best.path
    )


def _unlimited_greedy(sizes: Sequence[int], scopes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The greedy order without the limits, for when every greedy junction tree is over
    them: a contraction tree keeps fewer and smaller tables, and this order's, reconfigured,
    is often far better than what the search's own trials find in their time (linkage_24
    under 2 GiB: the trials' best tree had 2.5e10 flops and was over the limit)."""
    return elimination_order(sizes, scopes)  # (no limits: no PlanLimitError)


def _with_kept(cost: PlanCost) -> float:
    """What the search compares plans by: the greedy plan, the searched order's and the
    searched tree (Segmentation_13: greedy's tree, 7.8e7 flops and 6.5e6 kept states, won
    by flops against a searched one of 9.0e7 flops and 3e5 kept, and ran 81-116 ms against
    11 ms)."""
    return cost.flops + KEPT_STATE_FLOPS * cost.total_states


def _rescued(
    sizes: Sequence[int], scopes: Sequence[Sequence[int]], limits: PlanLimits, order: Sequence[int]
) -> PlanChoice | None:
    """A plan for when every greedy junction tree is over the limits: `order`
    (_unlimited_greedy's), its contraction tree reconfigured by cotengra, within the limits
    (else None); the search's path may be another tree, over them. It competes with the
    search's plan by flops plus its kept states (_with_kept), not flops alone:
    linkage_24 under 2 GiB, 2.6e8 flops and 6.9e6 kept states, ran in 0.18 s where the
    search's trees had 2.5e10 flops; on Grids_16 it had about the flops of the search's
    (1.7e9-2.6e9) but kept 7e7-1.9e8 states and ran 1.7 s, against 1.2e7-2.3e7 states and
    0.35-0.48 s for the search's."""
    path = reconfigured_path(sizes, scopes, order)
    if path is None:
        return None
    cost = tree_cost(tree_from_path(sizes, scopes, path))
    return PlanChoice(tuple(order), "cotengra", cost, path=path) if within(cost, limits) else None


def cliques_are_factors(sizes: Sequence[int], scopes: Sequence[Sequence[int]], order: Sequence[int]) -> bool:
    """Whether every clique of the order's junction tree is the scope of a factor it
    holds (a chain, a tree of pairwise factors): no plan loops over less than each
    factor's table, so no search can pay for itself, and one trial of cotengra's on a
    10^5-variable chain would take many minutes whatever the budget."""
    plan = junction_tree(sizes, scopes, order)
    return all(any(len(set(scopes[f])) == len(c.variables) for f in c.factors) for c in plan.cliques)


def pairwise_forest(scopes: Sequence[Sequence[int]]) -> bool:
    """Whether every factor holds at most two variables and their edges close no cycle (a
    chain, a tree, a forest of them). Min-fill then eliminates a leaf at every step and
    makes no clique larger than a factor's scope, so when its plan is over the limits
    every plan is: a search would spend its whole budget to refuse the same graph."""
    root: dict[int, int] = {}

    def find(v: int) -> int:
        while root.get(v, v) != v:
            v = root[v]
        return v

    edges: set[tuple[int, int]] = set()
    for scope in scopes:
        held = sorted(set(scope))
        if len(held) > 2:
            return False
        if len(held) < 2 or (held[0], held[1]) in edges:
            continue  # (a second factor over the same pair closes no cycle)
        edges.add((held[0], held[1]))
        a, b = find(held[0]), find(held[1])
        if a == b:
            return False
        root[a] = b
    return True


def _score(cost: PlanCost, limits: PlanLimits) -> float:
    return cost.flops if within(cost, limits) else math.inf


def _near(run: GreedyRun, limits: PlanLimits) -> bool:
    """Did a greedy run refused at a limit come within RESCUE_WITHIN of it?"""
    if run.stopped == "clique":
        assert limits.max_clique_states is not None  # a run stops only at a limit given
        return run.largest_states <= limits.max_clique_states * RESCUE_WITHIN
    assert limits.max_total_states is not None
    return run.tree_states <= limits.max_total_states * RESCUE_WITHIN


def _cost(
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    order: Sequence[int],
    kinds: tuple[str, ...] = ("junction", "contraction"),
) -> PlanCost:
    """The cheaper of the order's two plans (of `kinds`): its junction or contraction tree."""
    costs = []
    if "junction" in kinds:
        costs.append(plan_cost(junction_tree(sizes, scopes, order)))
    if "contraction" in kinds:
        costs.append(tree_cost(contraction_tree(sizes, scopes, order)))
    return min(costs, key=lambda c: c.flops)


@dataclass(frozen=True)
class Searched:
    """What a search found: the best order as `score` judged it, and the path (cotengra's
    single-assignment form, over the factors with a non-empty scope) of its tree with the
    lowest flops plus kept states (KEPT_STATE_FLOPS), for tree_from_path."""

    order: tuple[int, ...]
    path: tuple[tuple[int, int], ...]
    scores: tuple[float, ...] = ()  # every finished trial's score, in the order they ran


def searched_order(
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    time_s: float,
    score: Callable[[tuple[int, ...]], float] | None = None,
    seed: Sequence[int] | None = None,
    trials: int | None = None,
    min_trials: int = 0,
    overrun: float = 1.0,
) -> Searched | None:
    """The best order and tree cotengra's trials give in `time_s`, `trials` of them at most
    (None: as many as fit) and `min_trials` at least (or `trials` if fewer: in up to
    `overrun` times `time_s`), drawn from SEARCH_SEED (None when the network
    has fewer than two tensors: nothing to search). Trials, reconfigurations and the path
    are ranked by flops plus KEPT_STATE_FLOPS per kept element (cotengra's "combo"). The
    SCORED best trials are turned into orders and judged by `score` (lower is better;
    default: that rank): the trees cotengra ranks first are often not the cheapest junction
    trees. The best tree is kept as it is, too: the contraction tree rebuilt from its order
    by bucket elimination can cost far more (linkage_24).

    Trials run without cotengra's per-trial subtree reconfiguration (1-2 s each on
    linkage_24, so a 10 s search saw five trials); instead the RECONFIGURED best trees and
    the contraction tree of the `seed` order (the greedy plan's) are reconfigured once
    after the search, which alone takes linkage_24's greedy tree from 2^28.8 to 2^25.4
    flops. The path is the best tree, reconfigured or not."""
    import cotengra as ctg

    inputs, symbol = _network(ctg, scopes)
    if len(inputs) < 2:
        return None
    methods = [_seeded_greedy(ctg), "kahypar" if importlib.util.find_spec("kahypar") else "labels"]
    # (-score, trial, tree): the SCORED best (cotengra's trees, which it does not type)
    trees: list[tuple[float, int, Any]] = []
    arrival = itertools.count()  # tells equal scores apart (trees do not compare)
    scores: list[float] = []  # every finished trial's

    class Kept(ctg.HyperOptimizer):
        # cotengra's hook for each finished trial (private: in a version without it,
        # `trees` stays empty and cotengra's own best tree is used)
        def _maybe_report_result(self, setting, trial):
            super()._maybe_report_result(setting, trial)
            score, tree = trial.get("score", math.inf), trial.get("tree")
            scores.append(float(score))
            if tree is not None and math.isfinite(score):
                # no scoring here: a junction tree of a large model takes a second to
                # build, and trials scored as they came left linkage_24 two trials in 10 s
                heapq.heappush(trees, (-score, next(arrival), tree))
                if len(trees) > SCORED:
                    heapq.heappop(trees)

    state = random.getstate()
    random.seed(SEARCH_SEED)  # (before the optimizer is made: it may draw its first points)
    try:
        least = least_trials(min_trials, trials)
        tree = _search(Kept, methods, time_s, trials, least, overrun, inputs, symbol, sizes, trees)
        best = sorted(trees, key=lambda t: (-t[0], t[1]))
        candidates = [t for _, _, t in best] or ([tree] if tree is not None else [])
        seeded = _seed_tree(ctg, sizes, scopes, inputs, symbol, seed) if seed is not None else None
        refined = []
        for t in ([seeded] if seeded is not None else []) + candidates[:RECONFIGURED]:
            try:
                refined.append(t.subtree_reconfigure(minimize=COMBO))
            except Exception as e:  # a failed refinement only loses that candidate
                warnings.warn(
                    f"plan search: subtree reconfiguration failed ({type(e).__name__}: {str(e)[:200]})",
                    PlanSearchWarning,
                    stacklevel=2,
                )
    finally:
        random.setstate(state)
    candidates += refined
    if not candidates:
        return None
    orders = [tree_order(t, inputs, len(sizes)) for t in candidates]
    order = orders[0] if score is None else min(orders, key=score)
    fewest = min(candidates, key=lambda t: t.combo_cost(factor=KEPT_STATE_FLOPS))
    return Searched(order, tuple((int(i), int(j)) for i, j in fewest.get_ssa_path()), tuple(scores))


def least_trials(min_trials: int, trials: int | None) -> int:
    """How many trials a search runs at the least: min_trials, or the cap if fewer."""
    return min_trials if trials is None else min(min_trials, trials)


def _search(
    kept: Any,
    methods: list[str],
    time_s: float,
    trials: int | None,
    least: int,
    overrun: float,
    inputs: Sequence[tuple[int, ...]],
    symbol: Mapping[int, str],
    sizes: Sequence[int],
    trees: list,
) -> Any:
    """cotengra's best tree of the trials that fit in the budget, `trials` at most and
    `least` at least while within `overrun` times the budget (each finished trial also
    kept in `trees` by `kept`, a HyperOptimizer), or None when a trial failed so that the
    search stopped (the trials kept before it stand)."""
    t0 = time.perf_counter()
    opt = kept(
        methods=methods,
        minimize=COMBO,
        max_time=TRIAL_SHARE * time_s,
        max_repeats=10**9 if trials is None else trials,
        parallel=False,
        progbar=False,
        on_trial_error="ignore",
        reconf_opts=None,
    )
    network = ([tuple(symbol[v] for v in s) for s in inputs], (), {symbol[v]: sizes[v] for v in symbol})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = opt.search(*network)
            left = TRIAL_SHARE * time_s * overrun - (time.perf_counter() - t0)
            if len(opt.scores) < least and left > 0:
                # on past the budget: a second search of the same optimizer runs the
                # trials one longer search would have (same settings, same seeds)
                opt.max_repeats, opt.max_time = least - len(opt.scores), left
                tree = opt.search(*network)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: B036  a Rust path finder's panic is no Exception
        # (cotengrust's greedy panicked on bnlearn's pathfinder: pyo3's PanicException
        # derives from BaseException, so on_trial_error="ignore" lets it through): the
        # trials kept so far stand; without any, the caller keeps the greedy plan
        warnings.warn(
            f"plan search stopped by a failing cotengra trial ({type(e).__name__}: "
            f"{str(e)[:200]}); {len(trees)} trial(s) kept before it are used",
            PlanSearchWarning,
            stacklevel=3,
        )
        tree = None
    return tree


def _seeded_greedy(ctg: Any) -> str:
    """The name of cotengra's greedy trial (same space, same steps) with its Gumbel noise
    seeded from Python's `random`, registered once: cotengra's own passes no seed to its
    path finder, whose noise then comes from the operating system. ("greedy", cotengra's
    own, where its version lacks what the twin is made of.)"""
    try:
        from cotengra.hyperoptimizers.hyper import get_hyper_space, register_hyper_function
        from cotengra.pathfinders.path_basic import get_optimize_greedy

        ctg.core.jitter_dict  # noqa: B018  (the twin's, checked here)
    except (ImportError, AttributeError):
        return "greedy"

    if SEEDED_GREEDY in get_hyper_space():
        return SEEDED_GREEDY
    greedy = get_optimize_greedy()

    def trial(inputs, output, size_dict, random_strength=0.0, temperature=0.0, costmod=1.0):
        jittered = ctg.core.jitter_dict(size_dict, random_strength) if random_strength else size_dict
        path = greedy(
            inputs,
            output,
            jittered,
            temperature=temperature,
            costmod=costmod,
            seed=random.randrange(2**32),
            use_ssa=True,
        )
        return ctg.ContractionTree.from_path(inputs, output, size_dict, ssa_path=path)

    register_hyper_function(name=SEEDED_GREEDY, ssa_func=trial, space=dict(get_hyper_space()["greedy"]))
    return SEEDED_GREEDY


def _network(ctg: Any, scopes: Sequence[Sequence[int]]) -> tuple[list[tuple[int, ...]], dict[int, str]]:
    """The factors with a non-empty scope as cotengra's inputs, and each variable's symbol."""
    inputs = [tuple(sorted(set(s))) for s in scopes if s]
    return inputs, {v: ctg.get_symbol(v) for s in inputs for v in s}


def reconfigured_path(
    sizes: Sequence[int], scopes: Sequence[Sequence[int]], order: Sequence[int]
) -> tuple[tuple[int, int], ...] | None:
    """The order's contraction tree after cotengra's subtree reconfiguration, as a path
    (tree_from_path's); None when cotengra cannot take the tree (see _seed_tree)."""
    import cotengra as ctg

    inputs, symbol = _network(ctg, scopes)
    if len(inputs) < 2:
        return None
    tree = _seed_tree(ctg, sizes, scopes, inputs, symbol, order)
    if tree is None:
        return None
    tree = tree.subtree_reconfigure(minimize=COMBO)
    return tuple((int(i), int(j)) for i, j in tree.get_ssa_path())


def _seed_tree(
    ctg: Any,
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    inputs: Sequence[tuple[int, ...]],
    symbol: Mapping[int, str],
    order: Sequence[int],
) -> Any:
    """cotengra's tree of the order's contraction tree over the factors (None when a
    variable in no factor, whose unit tensor cotengra does not see, joins it)."""
    tree = contraction_tree(sizes, [s for s in scopes if s], order)
    ssa: dict[int, int] = {}
    path = []
    for node in tree.nodes:
        if node.leaf is not None:
            if node.leaf.kind != "factor":
                return None
            ssa[node.id] = node.leaf.ident
            continue
        a, b = node.children
        if a not in ssa or b not in ssa:
            return None
        path.append((ssa[a], ssa[b]))
        ssa[node.id] = len(inputs) + len(path) - 1
    if not path:
        return None
    return ctg.ContractionTree.from_path(
        [tuple(symbol[v] for v in s) for s in inputs],
        (),
        {symbol[v]: sizes[v] for v in symbol},
        ssa_path=path,
    )


class PlanSearchWarning(UserWarning):
    """The plan search failed part-way; the plan is the best found before (or greedy)."""


def tree_order(tree: Any, inputs: Sequence[tuple[int, ...]], n: int) -> tuple[int, ...]:
    """The elimination order of a contraction tree: each variable at the contraction (in
    the tree's order) after which no tensor outside the contracted subtree holds it;
    variables of a single tensor first, variables in none (their own cliques) last."""
    appearances = Counter(v for s in inputs for v in s)
    order: list[int] = [v for v in sorted(appearances) if appearances[v] == 1]
    counts: dict[object, Counter] = {}

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
