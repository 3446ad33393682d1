"""The front end against brute-force enumeration: Z and every marginal, all semirings.

Random small factor graphs: mixed domain sizes (1..3), arities up to 4, zeros in tables,
disconnected components, variables in no factor, random evidence.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catbp_jit.frontend import FactorGraphError, compile_model, factor_graph, junction_tree, solve
from catbp_jit.ir.text import parse_programs
from frontend_helpers import SEMIRINGS, brute_force, check_solution, graphs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(SEMIRINGS), st.booleans())
def test_reference_target_matches_enumeration(ge, semiring, absorb):
    graph, evidence = ge
    joint, marg = brute_force(graph, evidence)
    check_solution(
        solve(graph, semiring=semiring, evidence=evidence, target="reference", absorb_evidence=absorb),
        joint,
        marg,
        semiring,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(SEMIRINGS))
def test_jit_matches_enumeration(ge, semiring):
    graph, evidence = ge
    joint, marg = brute_force(graph, evidence)
    check_solution(solve(graph, semiring=semiring, evidence=evidence), joint, marg, semiring)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.data())
def test_one_executable_answers_any_evidence(ge, data):
    graph, evidence = ge
    names = list(graph.variables)
    model = compile_model(graph, "prob", evidence_vars=names)
    exe = model.executable
    for _ in range(3):
        ev = data.draw(st.dictionaries(st.sampled_from(names), st.integers(0, 2), max_size=len(names)))
        ev = {v: x % graph.variables[v] for v, x in ev.items()}
        joint, marg = brute_force(graph, ev)
        check_solution(model.solve(ev), joint, marg, "prob")
    assert model.executable is exe


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(SEMIRINGS), st.data())
def test_absorbed_evidence_answers_any_states(ge, semiring, data):
    """Evidence cut into the factors: one executable for any states of the same variables
    (every variable observed included: then the plan has no variables left)."""
    graph, evidence = ge
    observed = list(evidence)
    model = compile_model(graph, semiring, evidence_vars=observed, absorb_evidence=True)
    assert not set(observed) & set(model.planned.variables)
    exe = model.executable
    for _ in range(3):
        ev = {v: data.draw(st.integers(0, graph.variables[v] - 1)) for v in observed}
        joint, marg = brute_force(graph, ev)
        check_solution(model.solve(ev), joint, marg, semiring)
    assert model.executable is exe


@pytest.mark.parametrize("semiring", SEMIRINGS)
def test_a_graph_without_variables(semiring):
    s = solve(factor_graph({}, [((), 0.5), ((), 3.0)]), semiring=semiring)
    z = {"prob": 1.5, "logprob": pytest.approx(1.5, rel=1e-15), "sat": True, "count": 1}[semiring]
    assert s.Z == z and s.marginals == {}
    assert solve(factor_graph({}, []), semiring=semiring).log_Z == 0.0


@settings(max_examples=200, deadline=None)
@given(graphs(max_vars=9))
def test_plan_is_a_junction_tree(ge):
    graph, _ = ge
    index = graph.index()
    scopes = [tuple(index[v] for v in f.scope) for f in graph.factors]
    plan = junction_tree(tuple(graph.variables.values()), scopes, evidence=range(len(index)))
    cliques = plan.cliques
    assert sorted(plan.postorder) == list(range(len(cliques)))
    assert [c.id for c in cliques if c.parent is None] == [plan.root]
    for c in cliques:  # every factor, indicator and marginal lives in a clique holding it
        for f in c.factors:
            assert set(scopes[f]) <= set(c.variables)
        for v in c.evidence:
            assert v in c.variables
    for v, a in enumerate(plan.home):
        assert v in cliques[a].variables
    for v in range(len(index)):  # running intersection: the cliques holding v are connected
        holding = {c.id for c in cliques if v in c.variables}
        tops = [a for a in holding if cliques[a].parent not in holding]
        assert len(tops) == 1
    assert sorted(f for c in cliques for f in c.factors) == list(range(len(scopes)))


def test_programs_print_and_parse_back():
    graph = factor_graph(
        {"a": 2, "b": 3, "c": 2}, [(("a", "b"), np.ones((2, 3))), (("b", "c"), np.ones((3, 2)))]
    )
    for kind, names in (
        ("junction", ["upward", "downward", "finalize"]),
        ("contraction", ["upward", "downward"]),
    ):
        model = compile_model(graph, "prob", evidence_vars=["c"], target="reference", plan_kind=kind)
        text = "\n\n".join(str(p) for p in model.programs)
        assert tuple(parse_programs(text)) == model.programs
        assert [p.name for p in model.programs] == names


def test_chain_by_hand():
    # P(a) P(b|a): Z = 1, P(b) by hand; through the package's top-level solve
    import catbp_jit as cj

    pa = np.array([0.3, 0.7])
    pba = np.array([[0.9, 0.1], [0.2, 0.8]])
    s = cj.solve({"a": 2, "b": 2}, [(("a",), pa), (("a", "b"), pba)])
    assert s.Z == pytest.approx(1.0, abs=1e-15)
    np.testing.assert_allclose(s.marginals["b"], pa @ pba, rtol=1e-15)
    s = solve({"a": 2, "b": 2}, [(("a",), pa), (("a", "b"), pba)], evidence={"b": 1})
    np.testing.assert_allclose(s.marginals["a"], pa * pba[:, 1] / (pa @ pba[:, 1]), rtol=1e-14)
    assert s.Z == pytest.approx(pa @ pba[:, 1], rel=1e-15)


@pytest.mark.parametrize(
    "factors, message",
    [
        ([(("a", "z"), np.ones((2, 2)))], "unknown variable 'z'"),
        ([(("a",), np.ones(3))], "shape"),
        ([(("a",), np.array([1.0, -1.0]))], "non-negative"),
        ([(("a",), np.array([1.0, np.nan]))], "finite"),
        ([(("a", "a"), np.ones((2, 2)))], "twice"),
    ],
)
def test_bad_graphs_are_refused(factors, message):
    with pytest.raises(FactorGraphError, match=message):
        factor_graph({"a": 2}, factors)


def test_bad_evidence_is_refused():
    graph = factor_graph({"a": 2, "b": 2}, [(("a", "b"), np.ones((2, 2)))])
    model = compile_model(graph, "prob", evidence_vars=["a"], target="reference")
    with pytest.raises(FactorGraphError, match=r"a=5 is not a state of a \(0..1\)"):
        model.solve({"a": 5})
    with pytest.raises(FactorGraphError, match="compiled for evidence on"):
        model.solve({"b": 0})
    with pytest.raises(FactorGraphError, match="unknown variable"):
        compile_model(graph, "prob", evidence_vars=["q"])
    absorbing = compile_model(
        graph, "prob", evidence_vars=["a", "b"], absorb_evidence=True, target="reference"
    )
    with pytest.raises(FactorGraphError, match=r"absorbs evidence on 'a', 'b'.*missing: 'b'"):
        absorbing.solve({"a": 1})
    with pytest.raises(FactorGraphError, match=r"b=2 is not a state"):
        absorbing.solve({"a": 1, "b": 2})


def test_a_clique_too_large_is_refused_with_its_size():
    graph = factor_graph(
        {f"x{i}": 4 for i in range(6)}, [(tuple(f"x{i}" for i in range(6)), np.ones((4,) * 6))]
    )
    with pytest.raises(FactorGraphError, match=r"6 variables and 4,096 states"):
        compile_model(graph, "prob", max_clique_bytes=1024)


def hub_with_children(extra: int):
    """h (3 states) and 11 binary children x0..x10, each in a factor with h; `extra` binary
    variables share h's own factor, so the hub clique grows (2**extra) while the
    children's separators stay {h}."""
    rng = np.random.default_rng(11)
    ys = tuple(f"y{j}" for j in range(extra))
    sizes = {"h": 3, **{y: 2 for y in ys}, **{f"x{i}": 2 for i in range(11)}}
    factors = [(("h",) + ys, rng.uniform(0.1, 1, (3,) + (2,) * extra))] + [
        (("h", f"x{i}"), rng.uniform(0, 1, (3, 2))) for i in range(11)
    ]
    return factor_graph(sizes, factors)


@pytest.mark.parametrize("suffixes", [False, True])
def test_a_clique_with_many_children(suffixes, monkeypatch):
    """A hub clique's downward messages: halving (its suffixes are too large to keep: a
    clique of 6 states) and, where the hub clique holds 96 states, the prefix/suffix
    scheme; both exact, in every semiring."""
    from catbp_jit.frontend import emit

    halvings = []
    halve = emit._send_halving
    monkeypatch.setattr(emit, "_send_halving", lambda *args: (halvings.append(1), halve(*args))[1])
    graph = hub_with_children(5 if suffixes else 0)
    evidence = {"x3": 1}
    joint, marg = brute_force(graph, evidence)
    for semiring in SEMIRINGS:
        model = compile_model(graph, semiring, evidence_vars=["x3"], target="reference", plan_kind="junction")
        assert max(len(c.children) for c in model.plan.cliques) >= 9
        check_solution(model.solve(evidence), joint, marg, semiring)
    assert bool(halvings) is not suffixes
    check_solution(solve(graph, evidence=evidence), joint, marg, "prob")
