"""Contraction-tree programs (frontend/contraction.py, emit_tree.py) against enumeration,
the reference VM against the JIT, and the planner's choice between the two kinds."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catbp_jit.frontend import compile_model, factor_graph, solve
from catbp_jit.frontend.contraction import contraction_tree, tree_from_path
from catbp_jit.frontend.search import PlanSearch
from frontend_helpers import SEMIRINGS, brute_force, check_solution, graphs

GREEDY = PlanSearch(time_s=0)  # no search: the tests need no cotengra and stay quick


def scopes_of(graph):
    index = graph.index()
    return tuple(graph.variables.values()), [tuple(index[v] for v in f.scope) for f in graph.factors]


@settings(max_examples=200, deadline=None)
@given(graphs(max_vars=9), st.data())
def test_tree_is_a_contraction_of_every_tensor(ge, data):
    """Each tensor (factor, indicator, unit) is contracted once; each internal node keeps
    exactly the variables its subtree shares with the rest; each marginal's home holds it."""
    graph, _ = ge
    sizes, scopes = scopes_of(graph)
    n = len(sizes)
    evidence = data.draw(st.lists(st.integers(0, n - 1), unique=True))
    order = data.draw(st.permutations(range(n)))
    tree = contraction_tree(sizes, scopes, order, evidence)
    nodes = tree.nodes
    leaves = [x for x in nodes if not x.children]
    assert [x.leaf.ident for x in leaves if x.leaf.kind == "factor"] == list(range(len(scopes)))
    assert [x.leaf.ident for x in leaves if x.leaf.kind == "indicator"] == sorted(evidence)
    held = {v for x in leaves if x.leaf.kind != "unit" for v in x.variables}
    assert sorted(x.leaf.ident for x in leaves if x.leaf.kind == "unit") == sorted(set(range(n)) - held) or (
        n == 0
    )
    children = [c for x in nodes for c in x.children]
    assert sorted(children + [tree.root]) == list(range(len(nodes)))  # a tree
    below = {}
    for x in nodes:  # children before parents
        assert all(c < x.id for c in x.children)
        below[x.id] = {x.id}.union(*(below[c] for c in x.children))
    for x in nodes:
        if not x.children:
            continue
        inside = {v for i in below[x.id] if not nodes[i].children for v in nodes[i].variables}
        outside = {v for x2 in leaves if x2.id not in below[x.id] for v in x2.variables}
        assert set(x.variables) == inside & outside, x
    for v, h in enumerate(tree.home):
        assert v in nodes[h].variables


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.data())
def test_a_searched_path_with_indicators_gives_enumerations_answer(ge, data):
    """tree_from_path on random paths over the factors, with random evidence as
    indicators: the programs run by the reference VM give enumeration's Z and marginals."""
    from catbp_jit.frontend.emit import factor_specs
    from catbp_jit.frontend.emit_tree import contraction_scale_slots, emit_contraction_programs
    from catbp_jit.reference import run_programs
    from catbp_jit.semiring import make_semiring

    graph, evidence = ge
    sizes, scopes = scopes_of(graph)
    index = graph.index()
    free = list(range(sum(1 for s in scopes if s)))
    path, made = [], len(free)
    while len(free) > 1:
        i, j = data.draw(st.permutations(free))[:2]
        free = [k for k in free if k not in (i, j)] + [made]
        path.append((i, j))
        made += 1
    ev = sorted(index[v] for v in evidence)
    tree = tree_from_path(sizes, scopes, path, ev)
    joint, marg = brute_force(graph, evidence)
    # scaled: each tensor divided by its total (a zero total gives NaN: the model then asks SAT)
    scaled = data.draw(st.booleans()) and joint.sum() > 0
    programs = emit_contraction_programs(tree, len(scopes), ev, scaled)
    specs = factor_specs(tree, scopes, ev)
    values = {f: fac.values for f, fac in enumerate(graph.factors)}
    names = list(graph.variables)
    for k, v in enumerate(ev):
        values[len(scopes) + k] = np.eye(sizes[v])[evidence[names[v]]]
    slots = run_programs(
        list(programs),
        make_semiring("PROB"),
        lambda f: (values[f], specs[f]),
        lambda key: (_ for _ in ()).throw(KeyError(key)),
    )
    z = float(slots[("Z",)][0])
    for key in contraction_scale_slots(tree) if scaled else ():
        z *= float(slots[key][0])
    assert z == pytest.approx(joint.sum(), rel=1e-12, abs=1e-300)
    for i, v in enumerate(names):
        got = np.ravel(slots[("marg", i)][0])
        if not scaled:
            np.testing.assert_allclose(got, marg[v], rtol=1e-12, atol=1e-300)
        elif marg[v].sum() > 0:
            np.testing.assert_allclose(got / got.sum(), marg[v] / marg[v].sum(), rtol=1e-12)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(SEMIRINGS), st.booleans())
def test_reference_runs_them_as_enumeration_says(ge, semiring, absorb):
    graph, evidence = ge
    joint, marg = brute_force(graph, evidence)
    check_solution(
        solve(
            graph,
            semiring=semiring,
            evidence=evidence,
            target="reference",
            absorb_evidence=absorb,
            plan_kind="contraction",
            plan_search=GREEDY,
        ),
        joint,
        marg,
        semiring,
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(SEMIRINGS), st.data())
def test_jit_gives_the_reference_bits_for_any_evidence(ge, semiring, data):
    """Indicators for every variable: one executable answers any evidence, its slots the
    reference VM's (SAT, COUNT: its bits; sums of floats within 1e-12), its answers
    enumeration's."""
    graph, _ = ge
    names = list(graph.variables)
    options = dict(evidence_vars=names, plan_kind="contraction", plan_search=GREEDY)
    jit = compile_model(graph, semiring, **options)
    ref = compile_model(graph, semiring, target="reference", **options)
    assert jit.plan_kind == ref.plan_kind == "contraction"
    for _ in range(2):
        ev = data.draw(st.dictionaries(st.sampled_from(names), st.integers(0, 2), max_size=len(names)))
        ev = {v: x % graph.variables[v] for v, x in ev.items()}
        got, want = jit.run_slots(ev), ref.run_slots(ev)
        want = {k: a for k, a in want.items() if k[0] != "t"}  # the JIT's answers only
        assert set(got) == set(want)
        for k in want:
            # numpy's sums (the reference) go pairwise where the JIT's run in order
            if semiring in ("prob", "logprob"):
                np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-12)
            else:
                np.testing.assert_array_equal(got[k], want[k])
        joint, marg = brute_force(graph, ev)
        check_solution(jit.solve(ev), joint, marg, semiring)


def dense_pairs(n=10, seed=1):
    """Every pair of n binary variables has a table: one clique of 2^n states that
    multiplies n(n-1)/2 tables at each state, where pairs contract in far smaller spaces."""
    rng = np.random.default_rng(seed)
    names = [f"x{i}" for i in range(n)]
    factors = [((a, b), rng.random((2, 2)) + 0.2) for i, a in enumerate(names) for b in names[i + 1 :]]
    return factor_graph({v: 2 for v in names}, factors)


@pytest.mark.parametrize("semiring", SEMIRINGS)
def test_auto_picks_the_contraction_tree_where_it_is_cheaper(semiring):
    graph = dense_pairs()
    auto = compile_model(graph, semiring, plan_search=GREEDY)
    junction = compile_model(graph, semiring, plan_search=GREEDY, plan_kind="junction")
    st_ = auto.stats
    assert auto.plan_kind == "contraction" and st_["programs"] == "contraction tree"
    assert st_["contraction_flops"] < st_["junction_flops"]
    assert st_["estimated_flops"] == st_["contraction_flops"] == junction.stats["contraction_flops"]
    assert [p.name for p in auto.programs] == ["upward", "downward"]
    joint, marg = brute_force(graph, {})
    a, j = auto.solve(), junction.solve()
    check_solution(a, joint, marg, semiring)
    check_solution(j, joint, marg, semiring)


def test_auto_keeps_the_junction_tree_where_one_table_fills_the_clique():
    """One table over ten variables and a unary table on each: the junction tree
    multiplies them in one pass over the clique, the contraction tree in ten."""
    rng = np.random.default_rng(0)
    names = [f"x{i}" for i in range(10)]
    graph = factor_graph(
        {v: 2 for v in names},
        [(tuple(names), rng.random((2,) * 10))] + [((v,), rng.random(2)) for v in names],
    )
    model = compile_model(graph, "prob", plan_search=GREEDY)
    assert model.plan_kind == "junction" and model.contraction is None
    assert model.stats["junction_flops"] < model.stats["contraction_flops"]
    joint, marg = brute_force(graph, {})
    check_solution(model.solve(), joint, marg, "prob")


def test_the_jit_never_stores_a_contractions_joint_space():
    """A triangle of 50-state variables: the junction tree's clique holds 125,000 states;
    the contraction tree loops over them but keeps pairs (2,500) only."""
    rng = np.random.default_rng(2)
    graph = factor_graph(
        {"a": 50, "b": 50, "c": 50},
        [
            (("a", "b"), rng.random((50, 50))),
            (("b", "c"), rng.random((50, 50))),
            (("a", "c"), rng.random((50, 50))),
        ],
    )
    tree = compile_model(graph, "prob", plan_search=GREEDY, plan_kind="contraction")
    junction = compile_model(graph, "prob", plan_search=GREEDY, plan_kind="junction")
    assert tree.stats["max_loop_states"] == 125_000 and tree.stats["max_stored_states"] == 2_500
    assert tree.executable.memory.total_bytes < 125_000 * 8 // 4
    assert junction.executable.memory.total_bytes >= 125_000 * 8
    a, b = tree.solve(), junction.solve()
    assert a.log_Z == pytest.approx(b.log_Z, rel=1e-13)
    for v in "abc":
        np.testing.assert_allclose(a.marginals[v], b.marginals[v], rtol=1e-12)


def test_tree_cost_counts_each_pass():
    """f(a,b) and g(a): one contraction over (a, b) into the root (8); adjoints from the
    scalar root: f's is g (2 states), g's is f summed to a (4); the marginals: a from g
    (2 states, two tensors), b from f (4 states, two tensors): 12; five kernels."""
    from catbp_jit.frontend.search import STEP_OPERATIONS, tree_cost

    tree = contraction_tree((2, 2), [(0, 1), (0,)], (0, 1))
    assert [n.variables for n in tree.nodes] == [(0, 1), (0,), ()]
    assert tree.home == (1, 0) and tree.root == 2
    cost = tree_cost(tree)
    assert cost.flops == 8 + 2 + 4 + 12 + 5 * STEP_OPERATIONS
    assert (cost.largest_states, cost.total_states, cost.separator_states) == (0, 0, 4)


def test_a_bad_plan_kind_is_refused():
    with pytest.raises(ValueError, match="plan_kind must be one of auto, junction, contraction"):
        compile_model(dense_pairs(3), "prob", plan_kind="tree")


@pytest.mark.parametrize("semiring", SEMIRINGS)
def test_graphs_without_variables(semiring):
    for graph in (factor_graph({}, [((), 0.5), ((), 3.0)]), factor_graph({}, [])):
        a = solve(graph, semiring=semiring, plan_kind="contraction", plan_search=GREEDY)
        b = solve(graph, semiring=semiring, plan_kind="junction", plan_search=GREEDY)
        assert a.Z == b.Z and a.marginals == {} and (a.log_Z == b.log_Z)


def test_scaled_prob_survives_a_long_grid():
    """PROB on a 12x12 grid with log Z in the hundreds: every tensor is normalized and its
    total kept as a scale, so Z is finite where the plain product would overflow."""
    rng = np.random.default_rng(4)
    names = {(i, j): f"x{i}_{j}" for i in range(12) for j in range(12)}
    factors = []
    for (i, j), v in names.items():
        for di, dj in ((0, 1), (1, 0)):
            if (i + di, j + dj) in names:
                factors.append(((v, names[i + di, j + dj]), np.exp(rng.normal(2.0, 1.0, (2, 2)))))
    graph = factor_graph({v: 2 for v in names.values()}, factors)
    prob = compile_model(graph, "prob", plan_search=GREEDY, plan_kind="contraction").solve()
    log = compile_model(graph, "logprob", plan_search=GREEDY, plan_kind="contraction").solve()
    assert prob.log_Z > 700 and math.isclose(prob.log_Z, log.log_Z, rel_tol=1e-12)
    for v in names.values():
        np.testing.assert_allclose(prob.marginals[v], log.marginals[v], rtol=1e-10)
