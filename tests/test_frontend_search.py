"""Plan search (frontend/search.py) and the plan cache (frontend/plan_cache.py).

Searched orders are checked the way greedy ones are: on random small graphs the answers
equal enumeration; the cache is used on a second compile, survives damaged files with a
warning, and does not mix up structures; plan_time=0 is the greedy plan.
"""

import json
import math
import random
import time
import warnings
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import catbp_jit.frontend.search as search_mod
from catbp_jit.frontend import compile_model, factor_graph, junction_tree
from catbp_jit.frontend.contraction import tree_from_path
from catbp_jit.frontend.plan import PlanLimitError, PlanLimits, elimination_order
from catbp_jit.frontend.plan_cache import PlanCacheWarning
from catbp_jit.frontend.search import PlanSearch, plan_cost, tree_order
from frontend_helpers import SEMIRINGS, brute_force, check_solution, graphs

ctg = pytest.importorskip("cotengra")  # the `plan` extra; `test` installs it

ALWAYS = PlanSearch(time_s=0.05, min_flops=0, cache=False)  # search even tiny graphs


def scopes_of(graph):
    index = graph.index()
    scopes = [tuple(index[v] for v in f.scope) for f in graph.factors]
    return tuple(graph.variables.values()), scopes


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(SEMIRINGS), st.booleans())
def test_searched_plans_match_enumeration(ge, semiring, absorb):
    graph, evidence = ge
    joint, marg = brute_force(graph, evidence)
    model = compile_model(
        graph,
        semiring,
        evidence_vars=list(evidence),
        absorb_evidence=absorb,
        target="reference",
        plan_search=ALWAYS,
    )
    check_solution(model.solve(evidence), joint, marg, semiring)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_vars=9))
def test_a_searched_order_is_a_permutation_and_its_tree_is_sound(ge):
    graph, _ = ge
    sizes, scopes = scopes_of(graph)
    greedy = elimination_order(sizes, scopes)
    found = search_mod.searched_order(sizes, scopes, 0.02, seed=greedy)
    if found is None:  # fewer than two tensors: nothing to search
        assert sum(1 for s in scopes if s) < 2
        return
    order = found.order
    assert sorted(order) == list(range(len(sizes)))
    plan = junction_tree(sizes, scopes, order)
    for f, scope in enumerate(scopes):
        assert any(f in c.factors and set(scope) <= set(c.variables) for c in plan.cliques)
    # the path contracts every factor with a scope once: a tree over them
    tensors = sum(1 for s in scopes if s)
    assert len(found.path) == tensors - 1
    assert sorted(i for pair in found.path for i in pair) == list(range(2 * tensors - 2))
    tree = tree_from_path(sizes, scopes, found.path)
    assert tree.nodes[tree.root].variables == ()


def test_tree_order_eliminates_each_index_where_it_is_summed_out():
    # chain a-b-c-d as tensors (a,b), (b,c), (c,d), contracted left to right
    inputs = [(0, 1), (1, 2), (2, 3)]
    sym = ctg.get_symbol
    tree = ctg.ContractionTree.from_path(
        [tuple(map(sym, s)) for s in inputs], (), {sym(v): 2 for v in range(4)}, path=[(0, 1), (0, 1)]
    )
    # a and d are in one tensor each (first); b goes with the first contraction, c the last
    assert tree_order(tree, inputs, 5) == (0, 3, 1, 2, 4)  # 4 is in no tensor: last


def test_a_searched_plan_answers_like_the_greedy_one():
    graph = ring_graph(24, seed=1)
    greedy = compile_model(graph, "prob", target="reference", plan_time=0)
    searched = compile_model(
        graph, "prob", target="reference", plan_search=PlanSearch(time_s=0.3, min_flops=0, cache=False)
    )
    a, b = greedy.solve(), searched.solve()
    assert b.log_Z == pytest.approx(a.log_Z, rel=1e-12)
    for v in graph.variables:
        np.testing.assert_allclose(b.marginals[v], a.marginals[v], rtol=1e-10, atol=1e-14)
    # the cheaper estimate wins; the greedy plan is always a candidate
    assert searched.stats["estimated_flops"] <= greedy.stats["estimated_flops"] * 1.01


def test_a_search_runs_the_same_trials_every_time():
    """The trials are seeded (search.SEARCH_SEED): two searches of one network, with a
    count of trials that fits the budget, see the same trials and find the same order and
    path, whatever state Python's `random` was in; each puts that state back."""
    sizes, scopes = scopes_of(ring_graph(40, seed=3))
    found = []
    for seed in (1, 2):
        random.seed(seed)
        before = random.getstate()
        found.append(search_mod.searched_order(sizes, scopes, 60.0, trials=12))
        assert random.getstate() == before
    a, b = found
    assert len(a.scores) == 12 and a.scores == b.scores
    assert len(set(a.scores)) > 1  # (trials that differ: a seed that did nothing would not show)
    assert (a.order, a.path) == (b.order, b.path)
    with pytest.raises(ValueError, match="trials"):
        PlanSearch(trials=0)


def test_a_search_says_what_it_will_take_before_it_starts():
    heard = []
    graph = ring_graph(24, seed=4)
    sizes, scopes = scopes_of(graph)
    search = PlanSearch(time_s=0.5, min_flops=0, cache=False, searcher=lambda *a, **k: heard.append("ran"))
    search_mod.choose_order(sizes, scopes, search=search, progress=heard.append)
    said = "searching for a faster plan: 0.5 s, at least 8 trials (within 1.5 s)"
    assert said in heard and heard[heard.index(said) + 1] == "ran"  # (after the greedy plan's lines)


def test_a_search_runs_its_least_trials_past_its_budget():
    """A budget too short for one trial still gets min_trials of them (within overrun
    times the budget): the same trials a longer search runs first, so slow trials do not
    leave the plan to the machine's load (search.MIN_TRIALS). Without the overrun the
    budget stops it after the trial it is in."""
    sizes, scopes = scopes_of(ring_graph(40, seed=3))
    least = search_mod.searched_order(sizes, scopes, 1e-6, min_trials=5, overrun=1e9)
    counted = search_mod.searched_order(sizes, scopes, 60.0, trials=5)
    assert len(least.scores) == 5 and least.scores == counted.scores
    assert (least.order, least.path) == (counted.order, counted.path)
    assert len(search_mod.searched_order(sizes, scopes, 1e-6, min_trials=5, overrun=1.0).scores) == 1
    # `trials` caps it: the least is the smaller of the two
    assert (
        len(search_mod.searched_order(sizes, scopes, 1e-6, trials=2, min_trials=5, overrun=1e9).scores) == 2
    )
    for bad in (dict(min_trials=-1), dict(min_trials=2.0), dict(overrun=0.5), dict(overrun=math.inf)):
        with pytest.raises(ValueError, match="min_trials|overrun"):
            PlanSearch(**bad)


def ring_graph(n, seed, chords=None):
    """Binary variables on a ring with random chords: treewidth to search over."""
    rng = np.random.default_rng(seed)
    names = [f"x{i}" for i in range(n)]
    scopes = [(names[i], names[(i + 1) % n]) for i in range(n)]
    for _ in range(chords if chords is not None else n // 2):
        a, b = rng.choice(n, 2, replace=False)
        scopes.append((names[a], names[b]))
    factors = [(s, rng.uniform(0.1, 2.0, (2, 2))) for s in scopes]
    return factor_graph({v: 2 for v in names}, factors)


def test_plan_time_zero_is_the_greedy_plan():
    graph = ring_graph(30, seed=2)
    model = compile_model(
        graph, "prob", target="reference", plan_search=PlanSearch(time_s=0, min_flops=0, searcher=_no_search)
    )
    sizes, scopes = scopes_of(graph)
    assert model.plan_choice.planner == "greedy"
    assert model.plan.order == elimination_order(sizes, scopes)


def test_without_cotengra_the_greedy_plan_is_used(monkeypatch):
    monkeypatch.setattr(search_mod, "search_available", lambda: False)
    model = compile_model(
        ring_graph(30, seed=2),
        "prob",
        target="reference",
        plan_search=PlanSearch(time_s=1, min_flops=0, searcher=_no_search),
    )
    assert model.plan_choice.planner == "greedy"


class FakePanic(BaseException):
    """As pyo3's PanicException: a Rust path finder's panic, not an Exception."""


def test_a_panicking_path_finder_leaves_the_greedy_plans(monkeypatch):
    """Regression: cotengrust's greedy panicked on bnlearn's pathfinder, and the panic (a
    BaseException) went through cotengra's on_trial_error="ignore" and out of compile_model.
    Without trials, the candidates are the greedy order's and its refined tree."""
    cotengra = pytest.importorskip("cotengra")

    def panic(self, *args, **kwargs):
        raise FakePanic("no entry found for key")

    monkeypatch.setattr(cotengra.HyperOptimizer, "search", panic)
    graph = ring_graph(24, seed=1)
    with pytest.warns(search_mod.PlanSearchWarning, match="FakePanic: no entry found"):
        model = compile_model(
            graph, "prob", target="reference", plan_search=PlanSearch(time_s=0.3, min_flops=0, cache=False)
        )
    greedy = compile_model(graph, "prob", target="reference", plan_time=0)
    assert model.solve().log_Z == pytest.approx(greedy.solve().log_Z, rel=1e-13)


def _no_search(*args, **kwargs):
    raise AssertionError("searched although it should not have")


def test_the_search_keeps_to_its_budget():
    graph = ring_graph(120, seed=3, chords=120)
    t0 = time.perf_counter()
    model = compile_model(
        graph, "prob", target="reference", plan_search=PlanSearch(time_s=0.5, min_flops=0, cache=False)
    )
    assert time.perf_counter() - t0 < 0.5 + 20  # generous: one trial may run past the budget
    assert model.plan_choice.search_s > 0


# -- the cache -------------------------------------------------------------------------------

CACHED = PlanSearch(time_s=0.2, min_flops=0)


def plan_files(tmp_path):
    return sorted((tmp_path / "plans").glob("*.json"))


@pytest.fixture
def plan_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CATBP_JIT_CACHE", raising=False)
    return tmp_path


def test_a_second_compile_of_the_same_structure_does_not_search(plan_dir):
    graph = ring_graph(24, seed=4)
    first = compile_model(graph, "prob", target="reference", plan_search=CACHED)
    assert len(plan_files(plan_dir)) == 1
    second = compile_model(
        graph, "logprob", target="reference", plan_search=replace(CACHED, searcher=_no_search)
    )
    assert second.plan_choice.planner == "cache"
    assert second.plan.order == first.plan.order
    # a larger budget than the filed one searches again
    third = compile_model(graph, "prob", target="reference", plan_search=PlanSearch(time_s=0.3, min_flops=0))
    assert third.plan_choice.planner != "cache"


def test_another_structure_is_planned_anew(plan_dir, monkeypatch):
    compile_model(ring_graph(24, seed=4), "prob", target="reference", plan_search=CACHED)
    other = ring_graph(24, seed=5)  # other chords: another structure
    model = compile_model(other, "prob", target="reference", plan_search=CACHED)
    assert model.plan_choice.planner != "cache"
    assert len(plan_files(plan_dir)) == 2
    # the same structure with evidence on a variable is another key too
    compile_model(other, "prob", evidence_vars=["x0"], target="reference", plan_search=CACHED)
    assert len(plan_files(plan_dir)) == 3


@pytest.mark.parametrize(
    "damage",
    [
        b"{not json",
        b"\xff\xfe",
        b"[1, 2, 3]",
        "order-not-a-permutation",
        "order-of-strings",
        "path-reuses-a-tensor",
        "path-too-long",
    ],
)
def test_a_damaged_plan_file_is_replanned_with_a_warning(plan_dir, damage):
    graph = ring_graph(24, seed=6)
    compile_model(graph, "prob", target="reference", plan_search=CACHED)
    (path,) = plan_files(plan_dir)
    if isinstance(damage, bytes):
        path.write_bytes(damage)
    else:
        doc = json.loads(path.read_text())
        n = len(doc["order"])
        if damage.startswith("path"):  # a contraction path that is no tree of the tables
            tensors = len(graph.factors)
            doc["path"] = [[0, 1], [0, 2]] if damage == "path-reuses-a-tensor" else [[0, 1]] * tensors
        else:
            doc["order"] = [0] * n if damage == "order-not-a-permutation" else [str(v) for v in range(n)]
        path.write_text(json.dumps(doc))
    with pytest.warns(PlanCacheWarning, match="damaged plan cache file"):
        model = compile_model(graph, "prob", target="reference", plan_search=CACHED)
    assert model.plan_choice.planner != "cache"
    assert sorted(model.plan.order) == list(range(24))
    with warnings.catch_warnings():  # rewritten whole: the next compile uses it quietly
        warnings.simplefilter("error")
        again = compile_model(graph, "prob", target="reference", plan_search=CACHED)
    assert again.plan_choice.planner == "cache"


def test_no_plan_files_when_the_cache_is_off(plan_dir, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_CACHE", "off")
    compile_model(ring_graph(24, seed=7), "prob", target="reference", plan_search=CACHED)
    assert plan_files(plan_dir) == []


def test_plan_cost_counts_each_pass():
    # one clique of 4 states with two factors: upward 2 tables, no downward pass; kernels:
    # the clique's and one per marginal
    from catbp_jit.frontend.search import STEP_OPERATIONS

    graph = factor_graph({"a": 2, "b": 2}, [(("a", "b"), np.ones((2, 2))), (("a",), np.ones(2))])
    sizes, scopes = scopes_of(graph)
    cost = plan_cost(junction_tree(sizes, scopes))
    assert (cost.flops, cost.largest_states, cost.total_states) == (8 + 3 * STEP_OPERATIONS, 4, 4)
    assert cost.peak_bytes(8) == 32


def test_bad_plan_time_is_refused():
    with pytest.raises(ValueError, match="plan_time"):
        compile_model(ring_graph(6, seed=0), "prob", target="reference", plan_time=-1)
    with pytest.raises(ValueError, match="plan_time"):
        PlanSearch(time_s=math.nan)


def test_catbp_jit_plan_prints_the_estimate_and_the_planner(plan_dir, capsys):
    from catbp_jit.cli import main
    from catbp_jit.frontend.uai import write_uai

    path = plan_dir / "ring.uai"
    path.write_text(write_uai(ring_graph(20, seed=8)))
    assert main(["plan", str(path), "--no-listing", "-q", "--plan-time", "0"]) == 0
    out = capsys.readouterr().out
    assert "estimated cost:" in out and "flops (upward and downward), peak memory" in out
    assert "planner:            greedy" in out
    assert main(["plan", str(path), "--plan-time", "-1"]) == 2
    assert "--plan-time: expected a number of seconds >= 0" in capsys.readouterr().err


def test_a_refused_greedy_plan_is_searched_only_when_near_the_limit():
    from catbp_jit.frontend.model import ModelTooLargeError

    calls = []
    graph = factor_graph(
        {"a": 16, "b": 16, "c": 16}, [(("a", "b", "c"), np.ones((16, 16, 16))), (("a",), np.ones(16))]
    )
    near = PlanSearch(time_s=1, min_flops=0, cache=False, searcher=lambda *a, **k: calls.append(a) or None)
    with pytest.raises(ModelTooLargeError, match="4,096 states"):  # 4x the limit: near
        compile_model(graph, "prob", target="reference", max_clique_bytes=8 * 1024, plan_search=near)
    assert len(calls) == 1
    with pytest.raises(ModelTooLargeError, match="4,096 states"):  # 4096x: hopeless
        compile_model(graph, "prob", target="reference", max_clique_bytes=8, plan_search=near)
    assert len(calls) == 1


def test_a_refused_greedy_order_finished_without_the_limits_is_a_plan_of_its_own():
    """Every greedy junction tree over the limits and the search finding nothing: the
    greedy order finished without the limits gives a contraction tree within them (on
    linkage_24 under 2 GiB: 2.6e8 flops, where the search's trees had 2.5e10)."""
    from catbp_jit.frontend.search import choose_order

    sizes = [16, 16, 16]
    scopes = [(0, 1, 2), (0,)]
    limits = PlanLimits(max_clique_states=1024)  # the one clique holds 4,096 states
    search = PlanSearch(time_s=1, min_flops=0, cache=False, searcher=lambda *a, **k: None)
    choice = choose_order(sizes, scopes, limits=limits, search=search)
    assert choice.planner == "cotengra" and choice.path is not None
    assert choice.order == elimination_order(sizes, scopes)
    assert choice.cost.largest_states <= 1024
    with pytest.raises(PlanLimitError):  # junction trees only: nothing to rescue with
        choose_order(sizes, scopes, limits=limits, search=search, kinds=("junction",))


def test_a_refused_chain_or_tree_is_not_searched():
    """On a forest of pairwise factors greedy's plan is the smallest there is: its refusal
    stands without a search (which would spend its whole budget to agree)."""
    from catbp_jit.frontend.model import ModelTooLargeError
    from catbp_jit.frontend.search import pairwise_forest

    calls = []
    never = PlanSearch(time_s=10, min_flops=0, cache=False, searcher=lambda *a, **k: calls.append(a) or None)
    chain = factor_graph(
        {f"x{i}": 10 for i in range(50)}, [((f"x{i}", f"x{i + 1}"), np.ones((10, 10))) for i in range(49)]
    )
    with pytest.raises(ModelTooLargeError, match="for all cliques together"):
        compile_model(chain, "prob", target="reference", max_total_bytes=32 << 10, plan_search=never)
    assert calls == []
    assert pairwise_forest([(0, 1), (1, 2), (1, 3), (0, 1), (4,), (5, 6)])
    assert not pairwise_forest([(0, 1), (1, 2), (2, 0)])  # a cycle
    assert not pairwise_forest([(0, 1, 2)])  # a factor over three variables


def test_a_companion_model_plans_with_the_same_search():
    # PROB certifies a Z of 0 with a SAT model of the same graph: it must not search anew
    graph = factor_graph({"a": 2, "b": 2}, [(("a", "b"), np.array([[1.0, 0.0], [0.0, 1.0]]))])
    model = compile_model(
        graph,
        "prob",
        evidence_vars=["a", "b"],
        target="reference",
        plan_search=PlanSearch(time_s=0, min_flops=0, searcher=_no_search),
    )
    assert model.solve({"a": 0, "b": 1}).log_Z == -math.inf
    assert model._companion("SAT").plan_search == model.plan_search
