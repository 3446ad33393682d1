"""A solve's answer, vectorized over the variables (frontend/answer.py): the same bits as
one numpy call per variable, no Python work per variable, answers that stay valid."""

import math
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catbp_jit.frontend import compile_model, factor_graph
from catbp_jit.frontend.answer import answer_layout, finish
from catbp_jit.frontend.scaling import ScaledNumber
from catbp_jit.semiring import logsumexp


def per_variable(semiring, raw):
    """What solve computed before answer.py: one numpy normalization per variable."""
    out = {}
    for v, m in raw.items():
        if semiring == "LOGPROB":
            total = float(logsumexp(m))
            out[v] = np.exp(m - total) if total > -math.inf else np.full(m.shape, np.nan)
        else:
            total = m.sum()
            out[v] = m / total if total > 0 else np.full(m.shape, np.nan)
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 12), min_size=1, max_size=30),
    st.sampled_from(["PROB", "LOGPROB"]),
    st.integers(0, 2**32 - 1),
)
def test_marginals_have_the_bits_of_one_normalization_per_variable(sizes, semiring, seed):
    rng = np.random.default_rng(seed)
    names = [f"v{i}" for i in range(len(sizes))]
    domains = dict(zip(names, sizes))
    layout = answer_layout(names, domains, {v: i for i, v in enumerate(names)}, ())
    raw = {v: rng.random(d) * 10.0 ** rng.integers(-5, 6) for v, d in domains.items()}
    zero = -np.inf if semiring == "LOGPROB" else 0.0
    for v in names[::3]:  # all-zero marginals: NaN
        raw[v][:] = zero
    if semiring == "LOGPROB":
        raw = {v: np.log(m) if m[0] != zero else m for v, m in raw.items()}
    flat = np.empty(layout.total)
    for v, (lo, hi) in layout.at.items():
        flat[lo:hi] = raw[v]
    got = finish(semiring, 1.0, flat, layout)[2]
    want = per_variable(semiring, raw)
    assert list(got) == names
    for v in names:
        assert np.array_equal(got[v], want[v], equal_nan=True), v


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**32 - 1), st.sampled_from(["", "zero", "inf", "nan"]))
def test_product_of_has_the_bits_of_the_loop(n, seed, special):
    rng = np.random.default_rng(seed)
    x = np.exp(rng.uniform(-700, 700, size=n))
    if special and n:
        x[rng.integers(n)] = {"zero": 0.0, "inf": np.inf, "nan": np.nan}[special]
    got, want = ScaledNumber.product_of(x, 7), ScaledNumber.product(x.tolist(), 7)
    assert (got.exponent, repr(got.mantissa)) == (want.exponent, repr(want.mantissa))


def chain(n, k=3):
    rng = np.random.default_rng(n)
    sizes = {f"x{i}": 2 + i % k for i in range(n)}
    names = list(sizes)
    factors = [((a, b), rng.random((sizes[a], sizes[b])) + 0.1) for a, b in zip(names, names[1:])]
    return factor_graph(sizes, factors)


def calls_in(fn):
    """How many Python and C functions fn() calls."""
    count = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            count[0] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count[0]


@pytest.mark.parametrize("semiring", ["prob", "logprob"])
def test_solve_does_no_python_work_per_variable(semiring):
    small, large = (
        compile_model(chain(n), semiring, evidence_vars=["x1"], absorb_evidence=True) for n in (6, 120)
    )
    for m in (small, large):
        m.solve({"x1": 1})
    # both walk their schedules in turn: a chain's messages wait on each other, so it gains
    # nothing in tracks (plan/tracks.py); a run in tracks makes more calls (the pool's)
    assert [m.built.executable.schedule.tracks for m in (small, large)] == [-1, -1]
    assert calls_in(lambda: large.solve({"x1": 1})) == calls_in(lambda: small.solve({"x1": 1}))


def test_an_answer_stays_valid_after_the_next_solve():
    model = compile_model(chain(8), "prob", evidence_vars=["x2"], absorb_evidence=True)
    first = model.solve({"x2": 0})
    kept = {v: m.copy() for v, m in first.marginals.items()}
    raw = {v: m.copy() for v, m in first.raw_marginals.items()}
    model.solve({"x2": 2})
    for v in kept:
        assert np.array_equal(first.marginals[v], kept[v])
        assert np.array_equal(first.raw_marginals[v], raw[v])
    assert first.marginals["x2"].tolist() == [1.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize("semiring", ["prob", "logprob", "sat", "count"])
@pytest.mark.parametrize("absorb", [False, True])
def test_raw_marginals_are_the_programs_slots(semiring, absorb):
    """Each variable's raw marginal is its marginal slot (an absorbed one: Z at its state;
    x2 has 4 states and x3 2, so the flat array, grouped by domain size, lists them in the
    other order than the graph)."""
    graph = chain(7)
    if semiring == "count":
        graph = factor_graph(
            graph.variables, [(f.scope, (f.values > 0.5).astype(float)) for f in graph.factors]
        )
    model = compile_model(graph, semiring, evidence_vars=["x3", "x2"], absorb_evidence=absorb)
    evidence = {"x3": 1, "x2": 3}
    sol = model.solve(evidence)
    slots = model.run_slots(evidence)
    index = model.planned.index()
    for v in graph.names:
        if v in index:
            want = slots[("marg", index[v])]
        else:
            want = np.full(graph.variables[v], model.sr.kind.zero, dtype=slots[("Z",)].dtype)
            want[evidence[v]] = slots[("Z",)]
        if semiring == "prob":  # rescaled to Z
            want = want / want.sum() * sol.Z
            assert np.allclose(sol.raw_marginals[v], want, rtol=1e-12, atol=0)
        else:
            assert np.array_equal(sol.raw_marginals[v], want) and sol.raw_marginals[v].dtype == want.dtype
