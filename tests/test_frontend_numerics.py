"""PROB stays exact where its products leave float64's range (scaling.py, emit scaled=True).

Random Ising grids with log Z in the thousands (the UAI 2014 Grids family, which gave
inf and NaN before messages were scaled) must give PROB's log Z equal to LOGPROB's
within 1e-9 relative and the same marginals within 1e-9, on the JIT and the reference.
An answer that is not exact is never returned: Z = 0 only when SAT agrees that nothing is
possible, and an underflow raises NumericalError.
"""

from __future__ import annotations

import decimal
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catbp_jit.frontend import compile_model, factor_graph, solve
from catbp_jit.frontend.scaling import NumericalError, ScaledNumber, exp_of_log, pow2_scaled
from catbp_jit.frontend.uai import read_evidence, read_mar, read_uai
from conftest import shared_dir
from frontend_helpers import SHORT_SEARCH, ising_grid


def assert_agree(prob, logprob, names):
    assert math.isfinite(prob.log_Z) and math.isfinite(logprob.log_Z)
    assert prob.log_Z == pytest.approx(logprob.log_Z, rel=1e-9)
    for v in names:
        assert np.all(np.isfinite(prob.marginals[v]))
        np.testing.assert_allclose(prob.marginals[v], logprob.marginals[v], rtol=0, atol=1e-9)


@pytest.mark.parametrize("target", ["cpu", "reference"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ising_grid_with_log_z_in_the_thousands(seed, target):
    g = ising_grid(7, 7, 60.0, seed)
    prob = solve(g, semiring="prob", target=target)
    logprob = solve(g, semiring="logprob", target=target)
    assert logprob.log_Z > 2000  # far beyond float64's exp range
    assert_agree(prob, logprob, g.names)
    # Z itself: a Decimal where a float would be inf, agreeing with exp(log Z)
    assert isinstance(prob.Z, decimal.Decimal) and prob.Z.is_finite()
    assert float(prob.Z.ln()) == pytest.approx(prob.log_Z, rel=1e-12)
    assert prob.raw_log_scale == prob.log_Z
    for v in g.names:  # raw marginals times exp(raw_log_scale) are the unnormalized ones
        assert prob.raw_marginals[v].sum() == pytest.approx(1.0, rel=1e-12)


def test_very_negative_log_z():
    g = ising_grid(6, 6, 5.0, 3, offset=-40.0)  # every potential below e^-35
    prob, logprob = solve(g, semiring="prob"), solve(g, semiring="logprob")
    assert logprob.log_Z < -2000
    assert_agree(prob, logprob, g.names)
    assert isinstance(prob.Z, decimal.Decimal) and prob.Z > 0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(2, 5),
    st.integers(2, 5),
    st.floats(0.1, 80.0),
    st.integers(0, 2**32 - 1),
    st.floats(-60.0, 60.0),
)
def test_random_grids_prob_matches_logprob(n, m, strength, seed, offset):
    g = ising_grid(n, m, strength, seed, offset)
    assert_agree(
        solve(g, semiring="prob", target="reference"),
        solve(g, semiring="logprob", target="reference"),
        g.names,
    )


def test_evidence_on_a_strong_grid_indicators_and_absorbed():
    g = ising_grid(5, 6, 40.0, 7)
    ev = {"x0_0": 1, "x2_3": 0, "x4_5": 1}
    want = solve(g, semiring="logprob", evidence=ev)
    assert_agree(solve(g, semiring="prob", evidence=ev), want, g.names)
    model = compile_model(g, "prob", evidence_vars=list(ev))  # indicators
    assert_agree(model.solve(ev), want, g.names)


def test_float_z_is_unchanged_by_scaling():
    # two variables: Z exactly as the product would give it
    s = solve(
        {"a": 2, "b": 2}, [(("a",), [0.3, 0.7]), (("a", "b"), [[0.9, 0.1], [0.2, 0.8]])], evidence={"b": 1}
    )
    assert isinstance(s.Z, float) and s.Z == pytest.approx(0.3 * 0.1 + 0.7 * 0.8, rel=1e-15)
    assert s.raw_log_scale == 0.0
    np.testing.assert_allclose(s.raw_marginals["a"], [0.03, 0.56], rtol=1e-15)


def test_impossible_evidence_gives_exact_zero():
    g = factor_graph({"a": 2, "b": 2}, [(("a", "b"), [[1.0, 0.0], [0.0, 1.0]])])
    s = compile_model(g, "prob", evidence_vars=["a", "b"]).solve({"a": 0, "b": 1})
    assert s.Z == 0.0 and s.log_Z == -math.inf
    assert all(np.isnan(m).all() for m in s.marginals.values())  # undefined, and said so


def _underflowing(exponent: float):
    """One binary variable whose four factors disagree: every state's product is 10^-exponent
    times the largest entries, though each table's largest entry is 1."""
    tiny = 10.0 ** -(exponent / 2)
    tables = [[1.0, tiny], [tiny, 1.0], [1.0, tiny], [tiny, 1.0]]
    return factor_graph({"a": 2}, [(("a",), t) for t in tables])


@pytest.mark.parametrize("exponent", [320.0, 400.0])  # subnormal; and exactly 0 in float64
def test_underflow_is_an_error_never_a_wrong_answer(exponent):
    g = _underflowing(exponent)
    with pytest.raises(NumericalError, match="logprob"):
        solve(g, semiring="prob")
    logprob = solve(g, semiring="logprob")
    assert logprob.log_Z == pytest.approx(math.log(2.0) - exponent * math.log(10.0), rel=1e-12)


def test_scaled_number_and_pow2_tables():
    z = ScaledNumber.product([1e300, 1e300, 1e-5], 3)
    assert z.log == pytest.approx(600 * math.log(10) - 5 * math.log(10) + 3 * math.log(2), rel=1e-15)
    assert isinstance(z.value(), decimal.Decimal)
    assert ScaledNumber.product([2.0, 0.0, 1e300]).log == -math.inf
    assert ScaledNumber.product([3.0, 0.25]).value() == 0.75
    t, k = pow2_scaled(np.array([0.0, 3.0, 1e-300]))
    assert k == 2 and t[1] == 0.75 and np.array_equal(np.ldexp(t, k), [0.0, 3.0, 1e-300])
    assert pow2_scaled(np.zeros(3))[1] == 0
    assert exp_of_log(1.0) == math.exp(1.0) and exp_of_log(-math.inf) == 0.0
    assert isinstance(exp_of_log(5000.0), decimal.Decimal)


UAI = ["Promedus_11", "CSP_12", "Pedigree_11"]  # shipped in tests/data/uai2014


# each compiles two models of a real instance (11-15 s cold here): Promedus_11 (a network
# with evidence) by default, the other two with the slow tests
@pytest.mark.parametrize(
    "name", [n if n == "Promedus_11" else pytest.param(n, marks=pytest.mark.slow) for n in UAI]
)
def test_uai2014_instances_exact_in_prob_and_logprob(name):
    d = shared_dir() / "uai2014" / "problems" / name
    graph = read_uai(d / f"{name}.uai")
    evidence = read_evidence(d / f"{name}.uai.evid", graph)
    want = read_mar(d / f"{name}.uai.MAR", graph)  # the competition's, 6 significant digits
    sols = [
        solve(graph, semiring=s, evidence=evidence, plan_search=SHORT_SEARCH) for s in ("prob", "logprob")
    ]
    assert sols[0].log_Z == pytest.approx(sols[1].log_Z, rel=1e-9)
    for sol in sols:
        for v, m in want.items():
            np.testing.assert_allclose(sol.marginals[v], m, rtol=0, atol=1e-5)


def test_count_beyond_int64_is_an_error_not_a_wrapped_number():
    # 64 free binary variables: 2^64 models, which int64 arithmetic wraps to 0
    names = [f"v{i}" for i in range(64)]
    g = factor_graph({v: 2 for v in names}, [((v,), [1.0, 1.0]) for v in names])
    with pytest.raises(NumericalError, match="int64"):
        solve(g, semiring="count")
    assert solve(g, semiring="logprob").log_Z == pytest.approx(64 * math.log(2), rel=1e-12)


def test_count_with_many_assignments_but_few_models_is_exact():
    # 70 binary variables chained by equality: 2^70 assignments, 2 models
    names = [f"v{i}" for i in range(70)]
    eq = np.eye(2)
    g = factor_graph({v: 2 for v in names}, [((a, b), eq) for a, b in zip(names, names[1:])])
    s = solve(g, semiring="count")
    assert s.Z == 2 and np.array_equal(s.raw_marginals["v5"], [1, 1])
    # 62 free variables (2^62 models) also fit
    free = factor_graph({f"w{i}": 2 for i in range(62)}, [])
    assert solve(free, semiring="count").Z == 2**62
