"""Semiring laws, logsumexp, normalization and the semiring adapters (VM spec §5)."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catbp_jit import (
    VMSemiringRuntime,
    adapt_semiring,
    logsumexp,
    make_semiring,
    vm_counting_semiring,
    vm_logprob_semiring,
    vm_maxlog_semiring,
    vm_prob_semiring,
    vm_sat_semiring,
)

RUNTIMES = {
    "SAT": vm_sat_semiring,
    "PROB64": lambda: vm_prob_semiring(np.float64),
    "PROB32": lambda: vm_prob_semiring(np.float32),
    "LOGPROB": vm_logprob_semiring,
    "COUNT": vm_counting_semiring,
    "MAXLOG": vm_maxlog_semiring,
}
EXACT = {"SAT", "COUNT"}

SETTINGS = settings(max_examples=150, deadline=None)

shapes = st.lists(st.integers(1, 3), min_size=0, max_size=3).map(tuple)


def values(name, rng, shape):
    """Random elements whose products and sums stay finite (or wrap, for COUNT)."""
    if name == "SAT":
        return rng.random(size=shape) < 0.5
    if name.startswith("PROB"):
        return rng.uniform(0.0, 10.0, size=shape).astype(np.float32 if name == "PROB32" else np.float64)
    if name in ("LOGPROB", "MAXLOG"):
        x = rng.uniform(-30.0, 30.0, size=shape)
        x[rng.random(size=shape) < 0.15] = -np.inf
        return x
    # the whole int64 range: products and sums wrap, and the ring laws still hold mod 2**64
    return rng.integers(
        np.iinfo(np.int64).min, np.iinfo(np.int64).max, size=shape, dtype=np.int64, endpoint=True
    )


@st.composite
def triples(draw):
    name = draw(st.sampled_from(sorted(RUNTIMES)))
    shape = draw(shapes)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    a, b, c = (values(name, rng, shape) for _ in range(3))
    return name, a, b, c


def plus(sr, x, y):
    """x ⊕ y through the runtime's own reduction of a stacked pair."""
    return sr.add_reduce(np.stack([x, y]), axis=(0,))


def assert_same(name, got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    if name in EXACT:
        np.testing.assert_array_equal(got, want)
    else:
        assert np.array_equal(np.isneginf(got), np.isneginf(want))
        assert not np.isnan(got).any() and not np.isnan(want).any()
        rtol = 2e-5 if name == "PROB32" else 1e-12
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


@SETTINGS
@given(triples())
def test_identities_and_annihilation(case):
    name, a, _, _ = case
    sr = RUNTIMES[name]()
    one, zero = sr.one(a.shape), sr.zero(a.shape)
    assert one.dtype == sr.dtype and zero.dtype == sr.dtype
    np.testing.assert_array_equal(sr.mul(a, one), a)  # exact for every runtime
    np.testing.assert_array_equal(sr.mul(one, a), a)
    np.testing.assert_array_equal(plus(sr, a, zero), a)
    np.testing.assert_array_equal(plus(sr, zero, a), a)
    np.testing.assert_array_equal(sr.mul(a, zero), zero)
    np.testing.assert_array_equal(sr.mul(zero, a), zero)
    if name in ("LOGPROB", "MAXLOG"):
        assert np.isneginf(zero).all() and (one == 0).all()


@SETTINGS
@given(triples())
def test_mul_commutative_associative(case):
    name, a, b, c = case
    sr = RUNTIMES[name]()
    assert_same(name, sr.mul(a, b), sr.mul(b, a))
    assert_same(name, sr.mul(sr.mul(a, b), c), sr.mul(a, sr.mul(b, c)))


@SETTINGS
@given(triples())
def test_add_commutative_associative(case):
    name, a, b, c = case
    sr = RUNTIMES[name]()
    assert_same(name, plus(sr, a, b), plus(sr, b, a))
    assert_same(name, plus(sr, plus(sr, a, b), c), plus(sr, a, plus(sr, b, c)))


@SETTINGS
@given(triples())
def test_distributivity(case):
    name, a, b, c = case
    sr = RUNTIMES[name]()
    lhs = sr.mul(a, plus(sr, b, c))
    rhs = plus(sr, sr.mul(a, b), sr.mul(a, c))
    assert_same(name, lhs, rhs)


@SETTINGS
@given(triples())
def test_add_reduce_over_axes_matches_pairwise(case):
    """Reducing a stack of three over axis 0 equals (a ⊕ b) ⊕ c; with the dtype kept."""
    name, a, b, c = case
    sr = RUNTIMES[name]()
    red = sr.add_reduce(np.stack([a, b, c]), axis=(0,))
    assert np.asarray(red).dtype == sr.dtype
    assert_same(name, red, plus(sr, plus(sr, a, b), c))


def test_add_reduce_empty_axes_is_identity():
    for name, make in RUNTIMES.items():
        sr = make()
        x = values(name, np.random.default_rng(0), (2, 3))
        np.testing.assert_array_equal(sr.add_reduce(x, axis=()), x)


@pytest.mark.parametrize("name", sorted(RUNTIMES))
def test_add_reduce_falsy_axis_returns_input_as_catbp_does(name):
    # CatBP's VM runtimes write `np.sum(x, axis=axis) if axis else x`: a falsy axis (the
    # empty tuple, and also 0 or None) reduces nothing. We keep that behaviour on purpose.
    sr = RUNTIMES[name]()
    x = values(name, np.random.default_rng(0), (2, 3))
    for axis in ((), 0, None):
        assert np.asarray(sr.add_reduce(x, axis)).shape == (2, 3)
    assert np.asarray(sr.add_reduce(x, (0,))).shape == (3,)
    assert np.asarray(sr.add_reduce(x, (0, 1))).shape == ()


# --- logsumexp --------------------------------------------------------------------------


def test_logsumexp_all_neg_inf():
    x = np.full((2, 3), -np.inf)
    for axis in ((0,), (1,), (0, 1), None):
        with np.errstate(all="raise"):  # no warning either
            r = np.asarray(logsumexp(x, axis=axis))
        assert np.isneginf(r).all() and not np.isnan(r).any(), axis
    assert np.asarray(logsumexp(x, axis=(1,))).shape == (2,)
    assert np.asarray(logsumexp(x)).shape == ()
    mixed = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, 1.0]])
    r = logsumexp(mixed, axis=(1,))
    assert r[0] == -np.inf
    assert np.isclose(r[1], math.log(1.0 + math.e))
    assert np.asarray(logsumexp(np.array([]))) == -np.inf


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple), st.integers(0, 2**32 - 1), st.data())
def test_logsumexp_finite_matches_log_sum_exp(shape, seed, data):
    x = np.random.default_rng(seed).uniform(-20.0, 20.0, size=shape)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    # (atol: where the sum is near 1 its log is near 0, and a last-bit difference in the
    # sum, ~1e-16, is all of the log's; seed 1288, shape (2, 2) gave -1.4e-5 +- 1.3e-16)
    np.testing.assert_allclose(
        logsumexp(x, axis=axes), np.log(np.sum(np.exp(x), axis=axes)), rtol=1e-12, atol=1e-12
    )
    np.testing.assert_allclose(logsumexp(x), np.log(np.sum(np.exp(x))), rtol=1e-12, atol=1e-12)


def test_logsumexp_is_shifted():
    x = np.array([[1000.0, 1000.0], [-1000.0, -1001.0]])
    r = logsumexp(x, axis=(1,))
    np.testing.assert_allclose(
        r, [1000.0 + math.log(2.0), -1000.0 + math.log(1.0 + math.exp(-1.0))], rtol=1e-14
    )
    assert np.isclose(logsumexp(x), 1000.0 + math.log(2.0), rtol=1e-14)


def test_logsumexp_keeps_float32():
    x = np.array([[0.0, -np.inf], [-np.inf, -np.inf]], dtype=np.float32)
    r = logsumexp(x, axis=(1,))
    assert r.dtype == np.float32
    np.testing.assert_array_equal(r, np.array([0.0, -np.inf], dtype=np.float32))


# --- normalization ----------------------------------------------------------------------


@SETTINGS
@given(st.sampled_from(["PROB64", "PROB32"]), shapes, st.integers(0, 2**32 - 1))
def test_prob_normalize(name, shape, seed):
    sr = RUNTIMES[name]()
    assert sr.supports_normalize()
    x = values(name, np.random.default_rng(seed), shape)
    total = float(np.sum(x, dtype=np.float64))
    y = sr.normalize(x, None)
    assert np.asarray(y).dtype == sr.dtype
    if total == 0:
        np.testing.assert_array_equal(y, x)
    else:
        rtol = 2e-5 if name == "PROB32" else 1e-12
        np.testing.assert_allclose(y, x.astype(np.float64) / total, rtol=rtol, atol=1e-7)
        assert np.isclose(float(np.sum(y, dtype=np.float64)), 1.0, rtol=rtol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_prob_normalize_all_zero_unchanged(dtype):
    sr = vm_prob_semiring(dtype)
    z = np.zeros((2, 3), dtype=dtype)
    with np.errstate(all="raise"):
        y = sr.normalize(z, None)
    np.testing.assert_array_equal(y, z)
    assert not np.isnan(y).any() and np.asarray(y).dtype == np.dtype(dtype)
    # per-axis: a zero row stays zero, the others sum to one
    x = np.array([[0.0, 0.0], [1.0, 3.0]], dtype=dtype)
    with np.errstate(all="raise"):
        y = sr.normalize(x, 1)
    np.testing.assert_allclose(y, [[0.0, 0.0], [0.25, 0.75]])


@SETTINGS
@given(shapes, st.integers(0, 2**32 - 1))
def test_logprob_normalize(shape, seed):
    sr = vm_logprob_semiring()
    assert sr.supports_normalize()
    x = np.random.default_rng(seed).uniform(-30.0, 30.0, size=shape)
    y = sr.normalize(x, None)
    assert np.asarray(y).shape == x.shape
    assert abs(float(logsumexp(y))) < 1e-12
    # subtracting one constant: the differences are unchanged
    np.testing.assert_allclose(
        np.asarray(x) - np.asarray(y), np.full(x.shape, float(logsumexp(x))), rtol=1e-12, atol=1e-12
    )


def test_logprob_normalize_with_neg_inf_and_axis():
    sr = vm_logprob_semiring()
    x = np.array([[0.0, -np.inf], [np.log(1.0), np.log(3.0)]])
    y = sr.normalize(x, None)
    assert y[0, 1] == -np.inf
    assert abs(float(logsumexp(y))) < 1e-12
    y = sr.normalize(x, 1)
    np.testing.assert_allclose(logsumexp(y, axis=(1,)), [0.0, 0.0], atol=1e-12)
    np.testing.assert_allclose(np.exp(y[1]), [0.25, 0.75])


@SETTINGS
@given(shapes, st.integers(0, 2**32 - 1), st.sampled_from([np.float64, np.float32]))
def test_maxlog_is_numpys_max_and_exact(shape, seed, dtype):
    """MAXLOG's ⊕ is np.max in the dtype; max is exact, so ⊕'s laws and ⊗'s
    distributivity over it hold bit for bit (a + max(b, c) = max(a + b, a + c): rounding
    is monotonic); NORMALIZE makes the best entry 0."""
    sr = vm_maxlog_semiring(dtype)
    rng = np.random.default_rng(seed)
    a, b, c = (values("MAXLOG", rng, shape).astype(dtype) for _ in range(3))
    stack = np.stack([a, b, c])
    red = sr.add_reduce(stack, (0,))
    assert np.asarray(red).dtype == np.dtype(dtype)
    np.testing.assert_array_equal(red, np.max(stack, axis=0))
    np.testing.assert_array_equal(plus(sr, plus(sr, a, b), c), plus(sr, a, plus(sr, b, c)))
    np.testing.assert_array_equal(sr.mul(a, plus(sr, b, c)), plus(sr, sr.mul(a, b), sr.mul(a, c)))
    y = sr.normalize(a, None)
    assert np.asarray(y).dtype == np.dtype(dtype)
    if np.isneginf(a).all():
        assert np.isnan(y).all()  # -inf - -inf, as LOGPROB's
    else:
        assert np.max(y) == 0.0
        np.testing.assert_array_equal(y, a - np.max(a))


def test_maxlog_normalize_along_an_axis_and_nan():
    sr = vm_maxlog_semiring()
    x = np.array([[0.0, -np.inf], [np.log(1.0), np.log(3.0)], [-np.inf, -np.inf]])
    with np.errstate(invalid="raise"):  # no warning for -inf - -inf
        y = sr.normalize(x, 1)
    np.testing.assert_array_equal(y[:2], [[0.0, -np.inf], [-np.log(3.0), 0.0]])
    assert np.isnan(y[2]).all()
    assert np.isnan(sr.add_reduce(np.array([1.0, np.nan, np.inf]), (0,)))  # NaN wins, as numpy's


@pytest.mark.parametrize("make", [vm_sat_semiring, vm_counting_semiring])
def test_sat_and_count_do_not_normalize(make):
    sr = make()
    assert sr.normalize is None
    assert not sr.supports_normalize()


# --- adapters ----------------------------------------------------------------------------


class ForeignRuntime:
    """A CatBP-like runtime: only a name string and a dtype, no enums, no callables."""

    def __init__(self, name, dtype):
        self.name = name
        self.dtype = dtype


@pytest.mark.parametrize(
    "foreign, name, dtype",
    [
        (SimpleNamespace(name="PROB", dtype=np.float32), "PROB", np.float32),
        (SimpleNamespace(name="PROB", dtype=np.dtype("float64")), "PROB", np.float64),
        (ForeignRuntime("LOGPROB", np.float64), "LOGPROB", np.float64),
        (ForeignRuntime("SAT", np.bool_), "SAT", np.bool_),
        (SimpleNamespace(name="COUNT", dtype=np.int64), "COUNT", np.int64),
        (SimpleNamespace(name="prob", dtype="float32"), "PROB", np.float32),
        (ForeignRuntime("MaxLog", np.float32), "MAXLOG", np.float32),
    ],
)
def test_adapt_semiring_foreign(foreign, name, dtype):
    sr = adapt_semiring(foreign)
    assert isinstance(sr, VMSemiringRuntime)
    assert sr.name == name and sr.dtype == np.dtype(dtype)
    assert sr.one((2,)).dtype == np.dtype(dtype)
    reference = {
        "PROB": vm_prob_semiring(dtype),
        "LOGPROB": vm_logprob_semiring(dtype),
        "SAT": vm_sat_semiring(),
        "COUNT": vm_counting_semiring(dtype),
        "MAXLOG": vm_maxlog_semiring(dtype),
    }[name]
    x = values(
        {"PROB": "PROB64", "LOGPROB": "LOGPROB", "SAT": "SAT", "COUNT": "COUNT", "MAXLOG": "MAXLOG"}[name],
        np.random.default_rng(3),
        (2, 3),
    ).astype(dtype)
    np.testing.assert_array_equal(sr.mul(x, x), reference.mul(x, x))
    np.testing.assert_array_equal(sr.add_reduce(x, (1,)), reference.add_reduce(x, (1,)))
    np.testing.assert_array_equal(sr.zero((2,)), reference.zero((2,)))
    assert sr.supports_normalize() == reference.supports_normalize()


def test_adapt_semiring_passthrough_and_strings():
    sr = vm_prob_semiring(np.float32)
    assert adapt_semiring(sr) is sr
    assert adapt_semiring("LOGPROB").name == "LOGPROB"
    assert make_semiring("COUNT").dtype == np.int64
    assert make_semiring("PROB").dtype == np.float64
    with pytest.raises(TypeError):
        adapt_semiring(SimpleNamespace(dtype=np.float64))  # no .name


@pytest.mark.parametrize("bad", ["TROPICAL", "MAXPROD", ""])
def test_unknown_semiring_name_rejected(bad):
    with pytest.raises(ValueError, match="unknown semiring"):
        make_semiring(bad)
    with pytest.raises(ValueError):
        adapt_semiring(SimpleNamespace(name=bad, dtype=np.float64))
