"""Every bnlearn network: exact Z and posteriors, with and without evidence.

Checked three ways: Z = 1 within 1e-9 (a Bayesian network's CPTs multiply to a
distribution); every posterior against an independent exact computation within 1e-9
(enumeration of the joint for the small networks, an opt_einsum contraction over the
query's ancestral sub-network otherwise); every posterior against pyAgrum's
LazyPropagation within 1e-6 (pyAgrum rounds CPT entries to float32).

Needs the network files (`python -m catbp_jit.frontend.bnlearn`); the comparisons need
pyagrum and opt_einsum (the `compare` extra). CI has all three.
"""

import gzip
import math
import zlib

import numpy as np
import pytest

from bn_helpers import pyagrum_network
from catbp_jit.frontend import FactorGraphError, bnlearn, compile_model, solve

# munin1: a 78M-state clique, half a minute a solve here; pyAgrum needs a minute for
# munin1's posteriors and a minute and a half for link's. munin2-4 (5-9 s each) are
# munin's subnetworks. barley (15 s), munin (10 s), diabetes and mildew (7 s each, most
# of it compiles) were the default run's slowest cases: the other 15 networks
# (hailfinder, pathfinder, pigs, andes, ...) stay in it
SLOW = {"munin1", "munin2", "munin3", "munin4", "link", "barley", "munin", "diabetes", "mildew"}
ENUMERATE_MAX = 1 << 20  # joint states up to which the whole joint is enumerated
EINSUM_MAX = 1 << 24  # largest intermediate an opt_einsum check may build
EINSUM_QUERIES = 25  # posteriors per evidence setting checked with opt_einsum on big networks
N_OBSERVED = 3


_fetch_failed = []


def _network(name):
    if name not in bnlearn.available() and not _fetch_failed:
        try:
            bnlearn.fetch()
        except (RuntimeError, OSError) as e:  # offline: say why, once
            _fetch_failed.append(str(e).splitlines()[0])
    if name not in bnlearn.available():
        pytest.skip(
            f"{name} not in {bnlearn.data_dir()}: {_fetch_failed[0] if _fetch_failed else ''}"
            " (python -m catbp_jit.frontend.bnlearn fetches the networks)"
        )
    return bnlearn.load_network(name)


def observation(graph, seed):
    """A few observed variables and states drawn from the network itself (so P(e) > 0)."""
    rng = np.random.default_rng(seed)
    order, parents = bnlearn.parents_first(graph)
    cpt = {f.scope[0]: f.values for f in graph.factors}
    sample = {}
    for v in order:
        p = cpt[v][(slice(None),) + tuple(sample[q] for q in parents[v])]
        sample[v] = int(rng.choice(len(p), p=p / p.sum()))
    names = list(graph.variables)
    picked = rng.choice(len(names), size=min(N_OBSERVED, len(names)), replace=False)
    return {names[i]: sample[names[i]] for i in sorted(picked)}


def _with_evidence(graph, evidence):
    ops = [(f.values, f.scope) for f in graph.factors]
    for v, x in evidence.items():
        ind = np.zeros(graph.variables[v])
        ind[x] = 1.0
        ops.append((ind, (v,)))
    return ops


def enumerate_posteriors(graph, evidence):
    names = list(graph.variables)
    joint = np.ones(())
    axes = []
    for values, scope in _with_evidence(graph, evidence):  # an outer product, aligned by name
        new = [v for v in scope if v not in axes]
        joint = joint.reshape(joint.shape + (1,) * len(new))
        axes += new
        perm = [scope.index(v) for v in axes if v in scope]
        shape = [graph.variables[v] if v in scope else 1 for v in axes]
        joint = joint * np.transpose(values, perm).reshape(shape)
    for v in names:
        if v not in axes:
            joint = joint[..., None] * np.ones(graph.variables[v])
            axes.append(v)
    z = joint.sum()
    return z, {v: joint.sum(axis=tuple(i for i, a in enumerate(axes) if a != v)) / z for v in names}


def einsum_posterior(graph, evidence, query, oe):
    """P(query | evidence) by contracting the query's and evidence's ancestral sub-network."""
    _, parents = bnlearn.parents_first(graph)
    keep, stack = set(), [query, *evidence]
    while stack:
        v = stack.pop()
        if v not in keep:
            keep.add(v)
            stack.extend(parents[v])
    ops = [(vals, scope) for vals, scope in _with_evidence(graph, evidence) if scope[0] in keep]
    symbol = {v: oe.get_symbol(i) for i, v in enumerate(keep)}
    expr = ",".join("".join(symbol[v] for v in scope) for _, scope in ops) + "->" + symbol[query]
    arrays = [vals for vals, _ in ops]
    _, info = oe.contract_path(expr, *arrays, optimize="greedy")
    if info.largest_intermediate > EINSUM_MAX:
        return None
    m = oe.contract(expr, *arrays, optimize="greedy")
    return m / m.sum()


def pyagrum_posteriors(name, evidence, targets, tmp_path):
    gum = pytest.importorskip("pyagrum")
    text = gzip.decompress(bnlearn.network_path(name).read_bytes()).decode()
    bn, _ = pyagrum_network(gum, text, tmp_path)
    ie = gum.LazyPropagation(bn)
    ie.setEvidence({v: int(x) for v, x in evidence.items()})
    ie.setTargets(set(targets))
    ie.makeInference()
    out = {}
    for v in targets:
        out[v] = np.array(ie.posterior(v).toarray(), dtype=np.float64)
    return out, ie.evidenceProbability(), bn


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in bnlearn.NETWORKS]
)
def test_bnlearn_network_is_exact(name, tmp_path):
    graph = _network(name)
    seed = zlib.crc32(name.encode())
    evidence = observation(graph, seed)
    # greedy plans (plan_time=0): the tree sizes below compare one deterministic planner's
    # plans (a searched plan minimizes flops, not states, and varies from run to run)
    model = compile_model(graph, "prob", evidence_vars=tuple(evidence), plan_time=0)
    plain = model.solve()
    observed = model.solve(evidence)

    assert plain.Z == pytest.approx(1.0, abs=1e-9)
    for m in plain.marginals.values():
        assert m.sum() == pytest.approx(1.0, abs=1e-12)
    for v, x in evidence.items():
        assert observed.marginals[v][x] == 1.0
    # the same evidence cut into the factors (catbp_jit.solve): a smaller tree, same answer
    absorbed = solve(graph, evidence=evidence, plan_time=0)
    assert absorbed.plan.stats()["total_states"] <= model.plan.stats()["total_states"]
    assert absorbed.Z == pytest.approx(observed.Z, rel=1e-11)
    for v in graph.variables:
        np.testing.assert_allclose(
            absorbed.marginals[v], observed.marginals[v], rtol=0, atol=1e-11, err_msg=v
        )

    states = math.prod(graph.variables.values())
    names = list(graph.variables)
    rng = np.random.default_rng(seed)
    sampled = (
        names
        if len(names) <= EINSUM_QUERIES
        else [names[i] for i in rng.choice(len(names), EINSUM_QUERIES, replace=False)]
    )
    # pyAgrum with every variable a target does not fit: link's junction tree alone
    # throws std::bad_alloc at 16 GB. With fewer targets it prunes to what they need.
    agrum_targets = sampled if name in SLOW else names
    agrum_z = None
    for ev, sol in (({}, plain), (evidence, observed)):
        if states <= ENUMERATE_MAX:
            z, exact = enumerate_posteriors(graph, ev)
            assert sol.Z == pytest.approx(z, rel=1e-9)
            for v in graph.variables:
                np.testing.assert_allclose(sol.marginals[v], exact[v], rtol=0, atol=1e-9, err_msg=v)
        else:
            oe = pytest.importorskip("opt_einsum")
            checked = 0
            for v in sampled:
                exact = einsum_posterior(graph, ev, v, oe)
                if exact is not None:
                    np.testing.assert_allclose(sol.marginals[v], exact, rtol=0, atol=1e-9, err_msg=v)
                    checked += 1
            assert checked >= min(len(sampled), 5), f"opt_einsum could check only {checked} posteriors"

        theirs, p_evidence, bn = pyagrum_posteriors(name, ev, agrum_targets, tmp_path)
        # pyAgrum's float32 CPTs don't multiply to exactly 1 (diabetes: 1 + 3.6e-6), so
        # compare P(e) as a fraction of its own total
        agrum_z = agrum_z or p_evidence
        assert sol.Z == pytest.approx(p_evidence / agrum_z, rel=1e-5)
        for v in agrum_targets:
            np.testing.assert_allclose(sol.marginals[v], theirs[v], rtol=0, atol=1e-6, err_msg=v)
        del bn


def test_a_network_over_the_clique_limit_is_refused():
    graph = _network("barley")
    with pytest.raises(FactorGraphError, match=r"largest clique has \d+ variables and 7,257,600 states"):
        # plan_time=0: greedy's refusal, without the rescue search's 10 s (its own tests
        # are in test_frontend_search.py)
        compile_model(graph, "prob", max_clique_bytes=32 << 20, plan_kind="junction", plan_time=0)
