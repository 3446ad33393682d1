"""Planning in bounded time: the greedy orders, early refusal, progress, large shapes.

The orders are checked against the planner as it was before score deltas (kept here as
the oracle): the same order, hence the same plan, for every heuristic on random graphs.
"""

import heapq
import math
import random
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import catbp_jit.frontend.plan as plan_mod
from catbp_jit.errors import CatbpError
from catbp_jit.frontend import FactorGraphError, compile_model, factor_graph
from catbp_jit.frontend.emit import emit_programs
from catbp_jit.frontend.model import ModelTooLargeError
from catbp_jit.frontend.plan import (
    HEURISTICS,
    PlanLimitError,
    PlanLimits,
    elimination_order,
    format_count,
    greedy_order,
    interaction_graph,
    junction_tree,
)
from catbp_jit.memory import PlanTooLargeError
from conftest import shared_dir

# -- the oracle: greedy_order before score deltas (it rescored every touched variable) ----

OLD_SCORES = {
    "weighted-min-fill": lambda fill, missing, log_w: (fill, log_w),
    "min-fill": lambda fill, missing, log_w: (missing, log_w),
    "min-weight": lambda fill, missing, log_w: (log_w, fill),
}


def old_greedy_order(sizes, scopes, score):
    n = len(sizes)
    adj = interaction_graph(n, scopes)
    log_size = [math.log(s) for s in sizes]

    def cost(v):
        nb = list(adj[v])
        fill, missing = 0, 0
        for i, a in enumerate(nb):
            adj_a = adj[a]
            for b in nb[i + 1 :]:
                if b not in adj_a:
                    fill += sizes[a] * sizes[b]
                    missing += 1
        return (*score(fill, missing, log_size[v] + sum(log_size[a] for a in nb)), v)

    current = [cost(v) for v in range(n)]
    heap = list(current)
    heapq.heapify(heap)
    done = [False] * n
    order, total = [], 0
    while heap:
        entry = heapq.heappop(heap)
        v = entry[-1]
        if done[v] or entry != current[v]:
            continue
        done[v] = True
        order.append(v)
        nb = adj[v]
        total += sizes[v] * math.prod(sizes[a] for a in nb)
        for a in nb:
            adj[a].discard(v)
            adj[a].update(w for w in nb if w != a)
        touched = set(nb)
        for a in nb:
            touched.update(adj[a])
        adj[v] = set()
        for a in touched:
            if not done[a]:
                current[a] = cost(a)
                heapq.heappush(heap, current[a])
    return tuple(order), total


def old_elimination_order(sizes, scopes):
    runs = [old_greedy_order(sizes, scopes, score) for score in OLD_SCORES.values()]
    return min(runs, key=lambda run: run[1])[0]


@st.composite
def structures(draw, max_vars=14):
    """Sizes and scopes: domains 1..4 (equal weights from unequal sizes tie often), up to
    four variables a factor, repeated scopes, variables in no factor."""
    n = draw(st.integers(0, max_vars))
    sizes = [draw(st.integers(1, 4)) for _ in range(n)]
    scopes = (
        [
            tuple(draw(st.lists(st.integers(0, n - 1), max_size=min(4, n), unique=True)))
            for _ in range(draw(st.integers(0, 16)))
        ]
        if n
        else []
    )
    return sizes, scopes


@settings(max_examples=300, deadline=None)
@given(structures())
def test_every_heuristic_orders_as_before(structure):
    sizes, scopes = structure
    for name, score in OLD_SCORES.items():
        old_order, old_total = old_greedy_order(sizes, scopes, score)
        run = greedy_order(sizes, scopes, name)
        assert (run.order, run.total_states, run.stopped) == (old_order, old_total, None), name
    assert elimination_order(sizes, scopes) == old_elimination_order(sizes, scopes)


def random_graph(rng, n, edges, max_size=4):
    pairs = set()
    while len(pairs) < edges:
        a, b = rng.sample(range(n), 2)
        pairs.add((min(a, b), max(a, b)))
    return [rng.randint(1, max_size) for _ in range(n)], sorted(pairs)


@pytest.mark.parametrize("n, edges", [(60, 150), (120, 400), (40, 500)])
def test_larger_random_graphs_plan_as_before(n, edges):
    sizes, scopes = random_graph(random.Random(n * edges), n, edges)
    old = old_elimination_order(sizes, scopes)
    assert elimination_order(sizes, scopes) == old
    assert junction_tree(sizes, scopes).stats() == junction_tree(sizes, scopes, old).stats()


@settings(max_examples=200, deadline=None)
@given(structures())
def test_a_run_counts_the_states_of_the_junction_trees_cliques(structure):
    """tree_states (what the total limit is checked against) is the junction tree's
    total_states: the elimination cliques not inside another one."""
    sizes, scopes = structure
    for name in HEURISTICS:
        run = greedy_order(sizes, scopes, name)
        stats = junction_tree(sizes, scopes, run.order).stats()
        assert run.tree_states == (stats["total_states"] if sizes else 0)
        assert run.largest_states == (stats["max_clique_states"] if sizes else 0)


# -- early stops ------------------------------------------------------------------------------


def test_a_run_no_better_than_the_best_stops_early():
    sizes, scopes = random_graph(random.Random(7), 80, 240)
    full = greedy_order(sizes, scopes, "min-fill")
    stopped = greedy_order(sizes, scopes, "min-fill", best_total=full.total_states // 2)
    assert stopped.stopped == "worse" and len(stopped.order) < len(full.order)
    assert stopped.order == full.order[: len(stopped.order)]
    # a tie with the best loses too (the first of equal runs is kept), so it stops
    assert greedy_order(sizes, scopes, "min-fill", best_total=full.total_states).stopped == "worse"


def test_limits_stop_every_run_and_name_the_smallest_clique():
    sizes, scopes = [2] * 12, [tuple(range(12))]  # one clique of 4,096 states
    with pytest.raises(PlanLimitError) as info:
        elimination_order(sizes, scopes, limits=PlanLimits(max_clique_states=4095))
    run = info.value.run
    assert (run.stopped, run.largest_variables, run.largest_states) == ("clique", 12, 4096)
    assert len(run.order) == 1  # it stopped at the first clique, not after all twelve
    with pytest.raises(PlanLimitError) as info:
        elimination_order(sizes, scopes, limits=PlanLimits(max_total_states=4095))
    assert info.value.run.stopped == "total"
    # the cliques inside it (eleven of them, 4,094 states) are merged away: they don't count
    elimination_order(sizes, scopes, limits=PlanLimits(max_total_states=4096))
    # within the limits, the plan is the one without them
    fits = PlanLimits(max_clique_states=4096, max_total_states=4096)
    assert elimination_order(sizes, scopes, limits=fits) == elimination_order(sizes, scopes)


def test_progress_reports_each_heuristic_and_long_runs(monkeypatch):
    monkeypatch.setattr(plan_mod, "PROGRESS_EVERY_S", 0.0)  # report after every elimination
    lines = []
    elimination_order([2] * 5, [(0, 1), (1, 2), (2, 3), (3, 4)], progress=lines.append)
    assert "min-fill 2/5 variables eliminated" in " ".join(lines)
    for name in HEURISTICS:
        assert any(line.startswith(f"{name}: ") for line in lines)
    assert any("states in all" in line for line in lines)


def test_format_count():
    assert format_count(7257600) == "7,257,600"
    assert format_count(2**251) == "3.62e75"
    assert format_count(10**17 - 1) == "1.00e17"
    assert format_count(3**20000).endswith("e9542")  # far past a float


# -- the model refuses while planning --------------------------------------------------------


def chain(n, d):
    """n variables of domain d, each factor over a neighbouring pair: cliques of d*d states."""
    return factor_graph(
        {f"x{i}": d for i in range(n)},
        [((f"x{i}", f"x{i + 1}"), np.ones((d, d))) for i in range(n - 1)],
        name="chain",
    )


def test_a_plan_over_the_total_limit_is_refused_before_emitting(monkeypatch):
    from catbp_jit.frontend import build

    monkeypatch.setattr(build, "emit_programs", lambda *a: pytest.fail("emitted a refused plan"))
    graph = chain(50, 10)  # 49 cliques of 100 states: 39,200 bytes as float64
    with pytest.raises(
        ModelTooLargeError,
        match=r"chain: the junction tree's cliques hold [\d,]+ states .* or more .*, the "
        r"largest 2 variables and 100 states; the limit is 32.00 KiB for all "
        r"cliques together \(max_total_bytes",
    ):
        compile_model(graph, "prob", target="reference", max_total_bytes=32 << 10, plan_kind="junction")


def test_the_limit_defaults_to_the_memory_limit(monkeypatch):
    monkeypatch.setenv("CATBP_JIT_MAX_BYTES", str(32 << 10))
    with pytest.raises(ModelTooLargeError, match="32.00 KiB for all cliques together"):
        compile_model(chain(50, 10), "prob", target="reference", plan_kind="junction")
    monkeypatch.setenv("CATBP_JIT_MAX_BYTES", str(40 << 10))
    assert (
        compile_model(chain(50, 10), "prob", target="reference", plan_kind="junction").stats["total_states"]
        == 4900
    )


def test_the_refusal_is_a_factor_graph_error_and_a_plan_too_large_error():
    graph = factor_graph(
        {f"x{i}": 4 for i in range(6)}, [(tuple(f"x{i}" for i in range(6)), np.ones((4,) * 6))], name="six"
    )
    for kind in (FactorGraphError, PlanTooLargeError, MemoryError, CatbpError):
        with pytest.raises(
            kind,
            match=r"six: the junction tree's largest clique has 6 variables "
            r"and 4,096 states \(32.00 KiB as float64\) or more",
        ):
            compile_model(graph, "prob", target="reference", max_clique_bytes=1024)


def test_a_finished_plan_is_checked_against_the_limits_too(monkeypatch):
    """The check after planning stays: an order that did not stop at the limits is refused."""
    from catbp_jit.frontend import search

    monkeypatch.setattr(
        search, "elimination_order", lambda sizes, scopes, **unused: elimination_order(sizes, scopes)
    )
    with pytest.raises(
        ModelTooLargeError,
        match=r"largest clique has 2 variables and 100 states "
        r"\(800 B as float64\); the limit is 512 B per clique",
    ):
        compile_model(chain(5, 10), "prob", target="reference", max_clique_bytes=512, plan_kind="junction")


def test_the_model_reports_planning_progress():
    lines = []
    compile_model(chain(5, 2), "prob", target="reference", progress=lines.append)
    assert any(line.startswith("planning chain: weighted-min-fill: ") for line in lines)


# -- shapes that were quadratic or worse -----------------------------------------------------


def plan_and_emit(sizes, scopes):
    t0 = time.perf_counter()
    plan = junction_tree(sizes, scopes)
    programs = emit_programs(plan, len(scopes))
    return plan, programs, time.perf_counter() - t0


# (isolated and fan, ~5 s each, with the slow tests)
@pytest.mark.parametrize(
    "shape", ["star", *(pytest.param(s, marks=pytest.mark.slow) for s in ("isolated", "fan"))]
)
def test_hubs_and_many_components_plan_and_emit_in_seconds(shape):
    if shape == "star":  # a hub and 10,000 leaves
        n = 10_000
        sizes, scopes = [2] * (n + 1), [(0, i) for i in range(1, n + 1)]
        cliques = n
    elif shape == "isolated":  # 20,000 variables, each alone: 20,000 components
        n = 20_000
        sizes, scopes = [2] * n, [(i,) for i in range(n)]
        cliques = n
    else:  # 10,000 triangles sharing one hub: every elimination merges a clique away
        n = 10_000
        sizes, scopes = [2] * (2 * n + 1), [(0, 2 * k + 1, 2 * k + 2) for k in range(n)]
        cliques = n
    plan, programs, seconds = plan_and_emit(sizes, scopes)
    assert plan.stats()["cliques"] == cliques
    assert seconds < 60, f"{shape}: planned and emitted in {seconds:.1f} s"
    stored = {i.args["slot"] for p in programs for i in p.instructions if i.op.name == "STORE_SLOT"}
    assert {("marg", v) for v in range(len(sizes))} <= stored


def test_separators_are_the_shared_variables():
    sizes, scopes = random_graph(random.Random(3), 50, 120)
    plan = junction_tree(sizes, scopes)
    for c in plan.cliques:
        for k in c.children:
            shared = tuple(sorted(set(c.variables) & set(plan.cliques[k].variables)))
            assert plan.separator(c.id, k) == plan.separator(k, c.id) == shared
    far = next(
        (a, b)
        for a in range(len(plan.cliques))
        for b in range(len(plan.cliques))
        if a != b and plan.cliques[a].parent != b and plan.cliques[b].parent != a
    )
    with pytest.raises(ValueError, match="not adjacent"):
        plan.separator(*far)


def test_suffix_unions_are_the_unions_of_the_later_separators():
    from catbp_jit.frontend.emit import _suffix_unions

    sizes, scopes = random_graph(random.Random(5), 60, 100)
    plan = junction_tree(sizes, scopes)
    checked = 0
    for c in plan.cliques:
        kids = c.children
        for i, (variables, states) in enumerate(_suffix_unions(plan, c.id, kids)):
            union = sorted({v for k in kids[i:] for v in plan.separator(c.id, k)})
            assert list(variables) == union and states == math.prod(sizes[v] for v in union)
            checked += len(kids) >= 3
    assert checked


def dense_graph(n=500, edges=62_500, seed=0):
    """The shape of UAI 2014's relational_1: 500 binary variables, 62,500 pairwise factors."""
    _, pairs = random_graph(random.Random(seed), n, edges)
    table = np.ones((2, 2))
    return factor_graph(
        {str(i): 2 for i in range(n)}, [((str(a), str(b)), table) for a, b in pairs], name="dense"
    )


def assert_refused_quickly(graph):
    t0 = time.perf_counter()
    with pytest.raises(
        ModelTooLargeError,
        match=rf"{graph.name}: the junction tree's largest "
        r"clique has \d{3} variables and [\d.]+e\d+ states",
    ):
        compile_model(graph, "prob", target="reference")
    assert time.perf_counter() - t0 < 60


def test_a_dense_graph_is_refused_quickly():
    assert_refused_quickly(dense_graph())


def test_relational_1_is_refused_quickly():
    path = shared_dir() / "uai2014" / "problems" / "relational_1" / "relational_1.uai"
    if not path.exists():
        pytest.skip(f"{path} is not here (UAI 2014 problems are in the shared data)")
    from catbp_jit.frontend.uai import read_uai

    assert_refused_quickly(read_uai(path))
