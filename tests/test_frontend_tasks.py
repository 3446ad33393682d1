"""MPE, max-marginals, marginal MAP and posterior samples (frontend/tasks.py, descend.py,
map_query.py) against brute-force enumeration on small random models, ties included."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catbp_jit.frontend import compile_model, factor_graph
from catbp_jit.frontend.build import tree_leaves
from catbp_jit.frontend.descend import argmax, descend, walk
from catbp_jit.frontend.descend_tree import tree_walk
from catbp_jit.frontend.graph import FactorGraphError
from catbp_jit.frontend.model import map_query
from catbp_jit.frontend.tasks import full_states, log_values

# few distinct values (and zeros) make ties and impossible evidence common
VALUES = np.array([0.0, 0.5, 1.0, 2.0, 0.25, 3.0])


@st.composite
def small_models(draw, max_vars=5):
    n = draw(st.integers(1, max_vars))
    sizes = [draw(st.integers(1, 3)) for _ in range(n)]
    names = [f"x{i}" for i in range(n)]
    factors = []
    for _ in range(draw(st.integers(1, 6))):
        k = draw(st.integers(1, min(3, n)))
        scope = tuple(draw(st.permutations(names))[:k])
        shape = tuple(sizes[names.index(v)] for v in scope)
        picks = draw(
            st.lists(st.integers(0, len(VALUES) - 1), min_size=math.prod(shape), max_size=math.prod(shape))
        )
        factors.append((scope, VALUES[picks].reshape(shape)))
    evidence = {}
    for v, d in zip(names, sizes):
        if draw(st.integers(0, 3)) == 0:
            evidence[v] = draw(st.integers(0, d - 1))
    return factor_graph(dict(zip(names, sizes)), factors), evidence


def joint(graph):
    """Every assignment (rows, variables in graph order) and its log weight."""
    names = list(graph.variables)
    states = np.array(list(itertools.product(*[range(d) for d in graph.variables.values()])), dtype=np.int64)
    states = states.reshape(-1, len(names))
    logw = np.zeros(len(states))
    with np.errstate(divide="ignore"):
        for f in graph.factors:
            logw += np.log(f.values[tuple(states[:, names.index(v)] for v in f.scope)])
    return states, logw


def consistent(graph, states, evidence):
    names = list(graph.variables)
    ok = np.ones(len(states), dtype=bool)
    for v, s in evidence.items():
        ok &= states[:, names.index(v)] == s
    return ok


@settings(max_examples=60, deadline=None)
@given(small_models(), st.booleans())
def test_mpe_is_a_best_assignment(model, absorb):
    graph, evidence = model
    states, logw = joint(graph)
    ok = consistent(graph, states, evidence)
    best = logw[ok].max() if ok.any() else -np.inf
    compiled = compile_model(
        graph, "prob", target="reference", evidence_vars=list(evidence), absorb_evidence=absorb
    )
    answer = compiled.mpe(evidence)
    if best == -np.inf:
        assert answer.assignment is None and answer.log_value == -np.inf
        return
    assert answer.assignment is not None
    for v, s in evidence.items():
        assert answer.assignment[v] == s
    row = np.array([[answer.assignment[v] for v in graph.variables]])
    # the assignment's own value, and the best value, to rounding
    assert answer.log_value == pytest.approx(joint_value(graph, row), abs=1e-12)
    assert answer.log_value == pytest.approx(best, rel=1e-12, abs=1e-12)


def joint_value(graph, row):
    names = list(graph.variables)
    with np.errstate(divide="ignore"):
        return float(
            sum(np.log(f.values[tuple(row[0, names.index(v)] for v in f.scope)]) for f in graph.factors)
        )


@settings(max_examples=40, deadline=None)
@given(small_models(), st.randoms(use_true_random=False))
def test_the_compiled_walk_chooses_as_descend(model, rnd):
    """descend.Walk (compiled, over a flat buffer, beliefs in any axis layout) chooses the
    states descend's numpy pass chooses, ties included."""
    graph, evidence = model
    built = compile_model(
        graph,
        "maxlog",
        target="reference",
        evidence_vars=list(evidence),
        passes="upward",
        plan_kind="junction",
    )
    table = built._evidence_table([evidence])
    beliefs = built._clique_beliefs(table)
    plan = built.plan
    want = descend(plan, beliefs, 1, argmax)[0]
    parts, offsets, layouts, at = [], {}, {}, 3  # (a few elements before the first belief)
    for a, b in beliefs.items():
        order = list(range(b.ndim - 1))
        rnd.shuffle(order)
        layouts[a] = tuple(plan.cliques[a].variables[i] for i in order)
        moved = np.transpose(b[0], order).ravel()
        offsets[a] = at
        parts.append(moved)
        at += moved.size
    buffer = np.concatenate([np.full(3, np.nan)] + parts)
    states, top = walk(plan, offsets, layouts).best(buffer)
    root = beliefs[plan.root]
    assert top == (root.max() if root.size else -np.inf)
    if top > -np.inf:
        assert np.array_equal(states, want)


@settings(max_examples=60, deadline=None)
@given(small_models(), st.booleans(), st.randoms(use_true_random=False))
def test_the_contraction_walk_finds_a_best_assignment(model, absorb, rnd):
    """descend_tree.TreeWalk over a contraction tree's upward pass (run by the reference
    interpreter, its tensors laid out in a buffer in random axis orders): a best
    assignment of enumeration, and the root's value is Z."""
    graph, evidence = model
    compiled = compile_model(
        graph,
        "maxlog",
        target="reference",
        evidence_vars=list(evidence),
        absorb_evidence=absorb,
        passes="upward",
        plan_kind="contraction",
    )
    built = compiled.built
    slots = compiled._reference_slots(evidence)
    parts, offsets, layouts, at = [], {}, {}, 2
    for key, value in slots.items():
        if key[0] != "t":
            continue
        node = built.contraction.nodes[key[1]]
        order = list(range(value.ndim))
        rnd.shuffle(order)
        layouts[key[1]] = tuple(node.variables[i] for i in order)
        offsets[key[1]] = at
        parts.append(np.transpose(value, order).ravel())
        at += parts[-1].size
    buffer = np.concatenate([np.full(2, np.nan)] + parts)
    ids, leaf_layouts = tree_leaves(built)
    tw = tree_walk(built.contraction, offsets, layouts, ids, leaf_layouts, built.values, np.dtype(np.float64))
    tw.refresh(built.evidence_values(evidence)[0])
    planned, top = tw.best(buffer)
    assert top == float(slots[("Z",)])
    states, logw = joint(graph)
    ok = consistent(graph, states, evidence)
    best = logw[ok].max() if ok.any() else -np.inf
    if best > -np.inf:
        table = compiled._evidence_table([evidence])
        row = full_states(compiled, planned[None, :], table)
        assert log_values(graph, row)[0] == pytest.approx(best, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("target", ["reference", pytest.param("cpu", marks=pytest.mark.slow)])
def test_ties_go_to_the_lowest_states(target):
    # every assignment ties: the answer is all zeros
    graph = factor_graph(
        {"a": 3, "b": 2, "c": 2}, [(("a", "b"), np.ones((3, 2))), (("b", "c"), np.ones((2, 2)))]
    )
    answer = compile_model(graph, "prob", target=target).mpe()
    assert answer.assignment == {"a": 0, "b": 0, "c": 0}
    # a tie between (a, b) = (1, 0) and (2, 1): the lower state of the clique's first variable
    t = np.array([[0.1, 0.2], [0.9, 0.3], [0.4, 0.9]])
    graph = factor_graph({"a": 3, "b": 2}, [(("a", "b"), t)])
    assert compile_model(graph, "prob", target=target).mpe().assignment == {"a": 1, "b": 0}


@settings(max_examples=25, deadline=None)
@given(small_models(max_vars=4))
def test_max_marginals_are_the_best_per_state(model):
    graph, evidence = model
    states, logw = joint(graph)
    ok = consistent(graph, states, evidence)
    answer = compile_model(graph, "prob", target="reference", evidence_vars=list(evidence)).max_marginals(
        evidence
    )
    for j, v in enumerate(graph.variables):
        expect = np.array(
            [logw[ok & (states[:, j] == s)].max(initial=-np.inf) for s in range(graph.variables[v])]
        )
        got = np.asarray(answer.raw_marginals[v])
        assert np.array_equal(np.isneginf(got), np.isneginf(expect))
        finite = np.isfinite(expect)
        np.testing.assert_allclose(got[finite], expect[finite], rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(small_models(), st.data())
def test_marginal_map_is_the_best_sum(model, data):
    graph, evidence = model
    free = [v for v in graph.variables if v not in evidence]
    if not free:
        return
    query = data.draw(st.lists(st.sampled_from(free), min_size=1, unique=True))
    states, logw = joint(graph)
    ok = consistent(graph, states, evidence)
    cols = [list(graph.variables).index(v) for v in query]
    totals: dict = {}
    for row, w in zip(states[ok], np.exp(logw[ok])):
        key = tuple(row[cols])
        totals[key] = totals.get(key, 0.0) + w
    answer = map_query(graph, query, evidence, target="reference")
    best = max(totals.values(), default=0.0)
    if best == 0.0:
        assert answer.assignment is None and answer.log_value == -np.inf
        return
    got = tuple(answer.assignment[v] for v in query)
    assert totals[got] == pytest.approx(best, rel=1e-9)
    assert answer.log_value == pytest.approx(math.log(best), rel=1e-9, abs=1e-9)
    for v, s in evidence.items():
        assert answer.assignment[v] == s


def test_marginal_map_refuses_bad_queries():
    graph = factor_graph({"a": 2, "b": 2}, [(("a", "b"), np.ones((2, 2)))])
    with pytest.raises(FactorGraphError, match="unknown"):
        map_query(graph, ["z"], {}, target="reference")
    with pytest.raises(FactorGraphError, match="also evidence"):
        map_query(graph, ["a"], {"a": 1}, target="reference")
    with pytest.raises(FactorGraphError, match="at least one"):
        map_query(graph, [], {}, target="reference")


def chain_graph():
    rng = np.random.default_rng(7)
    domains = {"a": 2, "b": 3, "c": 2, "d": 3}
    factors = [
        (("a",), rng.random(2) + 0.1),
        (("a", "b"), rng.random((2, 3)) + 0.1),
        (("b", "c"), rng.random((3, 2))),
        (("c", "d", "a"), rng.random((2, 3, 2)) + 0.1),
    ]
    return factor_graph(domains, factors)


# (the CPU's: in the slow set, its LOGPROB kernels cost the default suite seconds)
@pytest.mark.parametrize("target", ["reference", pytest.param("cpu", marks=pytest.mark.slow)])
def test_samples_follow_the_posterior(target):
    """10^5 samples of the joint (36 cells) given evidence: a chi-square test at a fixed
    seed, and the same samples for the same seed."""
    graph = chain_graph()
    evidence = {"c": 1}
    model = compile_model(graph, "prob", target=target, evidence_vars=["c"])
    n = 100_000
    samples = model.sample(n, evidence, seed=3)
    assert samples.shape == (n, 4)
    assert np.array_equal(samples, model.sample(n, evidence, seed=3))
    assert (samples[:, 2] == 1).all()
    states, logw = joint(graph)
    ok = consistent(graph, states, evidence)
    p = np.where(ok, np.exp(logw), 0.0)
    p /= p.sum()
    index = np.ravel_multi_index(samples.T, tuple(graph.variables.values()))
    counts = np.bincount(index, minlength=len(p))
    assert counts[p == 0].sum() == 0  # nothing impossible is drawn
    expected = n * p[p > 0]
    chi2 = float((((counts[p > 0] - expected) ** 2) / expected).sum())
    df = int((p > 0).sum()) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df), (chi2, df)  # p < 1e-4 under the posterior
    # pairwise joints: total variation within Monte Carlo error
    for i, j in itertools.combinations(range(4), 2):
        sizes = (graph.variables[list(graph.variables)[i]], graph.variables[list(graph.variables)[j]])
        pij = np.zeros(sizes)
        np.add.at(pij, (states[:, i], states[:, j]), p)
        qij = np.zeros(sizes)
        np.add.at(qij, (samples[:, i], samples[:, j]), 1.0 / n)
        assert 0.5 * np.abs(pij - qij).sum() < 0.01


def test_sampling_impossible_evidence_is_refused():
    graph = factor_graph({"a": 2}, [(("a",), np.array([1.0, 0.0]))])
    model = compile_model(graph, "prob", target="reference", evidence_vars=["a"])
    with pytest.raises(FactorGraphError, match="probability 0"):
        model.sample(10, {"a": 1}, seed=0)
    assert model.sample(0, {}, seed=0).shape == (0, 1)
    with pytest.raises(ValueError, match="non-negative"):
        model.sample(-1)


@pytest.mark.parametrize("target", ["reference", pytest.param("cpu", marks=pytest.mark.slow)])
@pytest.mark.parametrize("absorb", [False, True])
def test_mpe_batch_is_mpe_row_by_row(target, absorb):
    graph = chain_graph()
    model = compile_model(graph, "prob", target=target, evidence_vars=["c", "a"], absorb_evidence=absorb)
    rows = [{"c": c, "a": a} for c in range(2) for a in range(2)]
    if not absorb:
        rows += [{}, {"c": 0}]
    batch = model.mpe_batch(rows)
    assert batch.assignments.shape == (len(rows), 4)
    for i, row in enumerate(rows):
        single = model.mpe(row)
        assert batch.assignment(i) == single.assignment
        assert batch.log_values[i] == single.log_value
    impossible = compile_model(graph, "prob", target=target, evidence_vars=["b", "c"]).mpe_batch(
        [{"b": 0, "c": 0}, {"b": 0, "c": 1}]
    )
    states, logw = joint(graph)
    for i, row in enumerate([{"b": 0, "c": 0}, {"b": 0, "c": 1}]):
        best = logw[consistent(graph, states, row)].max()
        if best == -np.inf:
            assert impossible.assignment(i) is None and (impossible.assignments[i] == -1).all()
        else:
            assert impossible.log_values[i] == pytest.approx(best, rel=1e-12)


@pytest.mark.slow  # (its MAXLOG kernels cost the default suite seconds; random programs cover them)
def test_compiled_mpe_agrees_with_the_reference():
    """The CPU's MAXLOG kernels and the reference interpreter: the same assignment and
    value bit for bit (a max is exact; the decoded value is summed from the tables)."""
    graph = chain_graph()
    cpu_model = compile_model(graph, "prob", target="cpu", evidence_vars=["a", "c"])
    ref_model = compile_model(graph, "prob", target="reference", evidence_vars=["a", "c"])
    for evidence in ({}, {"c": 0}, {"a": 1, "c": 1}):
        ref, cpu = ref_model.mpe(evidence), cpu_model.mpe(evidence)
        assert cpu.assignment == ref.assignment and cpu.log_value == ref.log_value


@pytest.mark.slow
def test_compiled_max_marginals_and_map_agree_with_the_reference():
    graph = chain_graph()
    mm_ref = compile_model(graph, "maxlog", target="reference").max_marginals()
    mm_cpu = compile_model(graph, "maxlog", target="cpu").max_marginals()
    for v in graph.variables:
        assert np.array_equal(mm_ref.raw_marginals[v], mm_cpu.raw_marginals[v])
    answer = compile_model(graph, "prob", target="cpu").map(["b", "d"], {"c": 1})
    assert answer == map_query(graph, ["b", "d"], {"c": 1}, target="reference")


def test_named_states_and_state_names_in_evidence():
    graph = factor_graph(
        {"rain": 2, "wet": 2},
        [(("rain",), [0.8, 0.2]), (("rain", "wet"), [[0.9, 0.1], [0.05, 0.95]])],
        states={"rain": ("no", "yes"), "wet": ("dry", "wet")},
    )
    model = compile_model(graph, "prob", target="reference", evidence_vars=["wet"])
    answer = model.mpe({"wet": "wet"})
    assert answer.named() == {"rain": "yes", "wet": "wet"}
    assert answer.log_value == pytest.approx(math.log(0.2 * 0.95))
    assert model.map(["rain"], {"wet": "dry"}).assignment == {"rain": 0, "wet": 0}


def grid_graph(n=4, seed=3):
    rng = np.random.default_rng(seed)
    names = [f"v{i}{j}" for i in range(n) for j in range(n)]
    factors = [((), np.array(2.0))]  # a constant factor: its log enters the value
    for i in range(n):
        for j in range(n):
            factors.append(((f"v{i}{j}",), rng.random(2) + 0.1))
            if i + 1 < n:  # (a scope out of the graph's order: leaves keep their tables' order)
                factors.append(((f"v{i + 1}{j}", f"v{i}{j}"), rng.random((2, 2)) + 0.1))
            if j + 1 < n:
                factors.append(((f"v{i}{j}", f"v{i}{j + 1}"), rng.random((2, 2)) + 0.1))
    return factor_graph({v: 2 for v in names}, factors)


@pytest.mark.parametrize(
    "absorb, evidence",
    [  # (slow: compiling; the walk itself is checked by the reference-based test above)
        pytest.param(False, {"v00": 1, "v33": 0}, marks=pytest.mark.slow),
        pytest.param(False, {}, marks=pytest.mark.slow),
        pytest.param(True, {"v00": 1, "v33": 0}, marks=pytest.mark.slow),
    ],
)
def test_mpe_down_a_contraction_tree(absorb, evidence):
    """One MPE walks down a contraction tree's upward pass (descend_tree.py) as well as down
    a junction tree: both the best assignment of enumeration."""
    graph = grid_graph()
    states, logw = joint(graph)
    ok = consistent(graph, states, evidence)
    best = int(np.flatnonzero(ok)[np.argmax(logw[ok])])
    for kind in ("junction", "contraction"):
        model = compile_model(
            graph, "prob", plan_kind=kind, evidence_vars=list(evidence), absorb_evidence=absorb
        )
        answer = model.mpe(evidence)
        assert model._task_model("MAXLOG", passes="upward", junction=False).plan_kind == kind
        assert list(answer.assignment.values()) == states[best].tolist()
        assert answer.log_value == pytest.approx(logw[best], rel=1e-12)


@pytest.mark.slow  # (the simulator compiles for seconds; the default suite has the CPU's)
def test_mpe_and_samples_on_cuda_equal_the_cpu():
    """The tasks on target="cuda" (Numba's simulator without a GPU): the beliefs are read
    back from the device, and the answers are the CPU's."""
    pytest.importorskip("numba_cuda", reason="the CUDA target needs numba-cuda: pip install -e '.[cuda]'")
    graph = chain_graph()
    rows = [{"c": 0}, {"c": 1, "a": 0}, {}]
    cpu = compile_model(graph, "prob", evidence_vars=["a", "c"])
    gpu = compile_model(graph, "prob", evidence_vars=["a", "c"], target="cuda")
    for row in rows:
        assert gpu.mpe(row) == cpu.mpe(row)
    want, got = cpu.mpe_batch(rows), gpu.mpe_batch(rows)
    assert np.array_equal(want.assignments, got.assignments) and np.array_equal(
        want.log_values, got.log_values
    )
    assert np.array_equal(gpu.sample(1000, {"c": 1}, seed=5), cpu.sample(1000, {"c": 1}, seed=5))


@pytest.mark.slow
@pytest.mark.parametrize("target", ["cpu", "cuda"])
@settings(max_examples=12, deadline=None)
@given(model=small_models(max_vars=4), absorb=st.booleans())
def test_compiled_tasks_against_enumeration(target, model, absorb):
    """MPE (one row and a batch), max-marginals and marginal MAP on the compiled targets
    (CUDA in Numba's simulator) against enumeration, ties and impossible evidence included."""
    if target == "cuda":
        pytest.importorskip("numba_cuda", reason="the CUDA target needs numba-cuda: pip install -e '.[cuda]'")
    graph, evidence = model
    states, logw = joint(graph)
    ok = consistent(graph, states, evidence)
    best = logw[ok].max() if ok.any() else -np.inf
    compiled = compile_model(
        graph, "prob", target=target, evidence_vars=list(evidence), absorb_evidence=absorb
    )
    for answer in (compiled.mpe(evidence), compiled.mpe_batch([evidence])):
        value = answer.log_value if hasattr(answer, "log_value") else answer.log_values[0]
        if best == -np.inf:
            assert value == -np.inf
        else:
            assert value == pytest.approx(best, rel=1e-12, abs=1e-12)
    if best > -np.inf:
        mm = compile_model(graph, "maxlog", target=target, evidence_vars=list(evidence)).max_marginals(
            evidence
        )
        for j, v in enumerate(graph.variables):
            expect = [logw[ok & (states[:, j] == s)].max(initial=-np.inf) for s in range(graph.variables[v])]
            np.testing.assert_allclose(mm.raw_marginals[v], expect, rtol=1e-12, atol=1e-12)
        query = [v for v in graph.variables if v not in evidence][:2]
        if query:
            want = map_query(graph, query, evidence, target="reference")
            assert compiled.map(query, evidence).log_value == pytest.approx(
                want.log_value, rel=1e-9, abs=1e-9
            )
