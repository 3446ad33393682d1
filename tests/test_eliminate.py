"""vm_eliminate_keep (docs/ir.md) against oracles computed independently.

The oracle groups the input's elements by their kept index with plain Python loops and
reduces each group with Python arithmetic (math.fsum, a hand-written logsumexp, any(),
int sums wrapped to int64 by hand), never with the library's semiring callables.
"""

import math
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catbp_jit import (
    Axis,
    AxisType,
    Instruction,
    OpCode,
    Program,
    TensorSpec,
    validate_programs,
    vm_counting_semiring,
    vm_logprob_semiring,
    vm_maxlog_semiring,
    vm_prob_semiring,
    vm_sat_semiring,
)
from catbp_jit.reference import keep_keys_from_drop, run_program, vm_eliminate_keep

G, T = AxisType.GEOMETRIC, AxisType.TOPOLOGICAL
POOL = [(G, 0), (G, 1), (G, 2), (T, 2), (T, 0), (T, 7)]

SEMIRINGS = {
    "PROB64": lambda: vm_prob_semiring(np.float64),
    "PROB32": lambda: vm_prob_semiring(np.float32),
    "LOGPROB": vm_logprob_semiring,
    "SAT": vm_sat_semiring,
    "COUNT": vm_counting_semiring,
    "MAXLOG": vm_maxlog_semiring,
}


def wrap_int64(v: int) -> int:
    return ((v + 2**63) % 2**64) - 2**63


def py_logsumexp(vals):
    m = max(vals)
    if m == -math.inf:
        return -math.inf
    return m + math.log(math.fsum(math.exp(v - m) for v in vals))


def oracle(arr, in_spec, keep_keys, sr_name):
    """(expected array, expected axis keys) with Python loops and Python arithmetic."""
    pos = {ax.key: i for i, ax in enumerate(in_spec.axes)}
    present = [k for k in keep_keys if k in pos]
    out_shape = tuple(in_spec.axes[pos[k]].size for k in present)
    groups = defaultdict(list)
    for idx in np.ndindex(*arr.shape):
        groups[tuple(idx[pos[k]] for k in present)].append(arr[idx].item())
    out = {}
    for o in np.ndindex(*out_shape):
        vals = groups[o]
        if sr_name.startswith("PROB"):
            out[o] = math.fsum(vals)
        elif sr_name == "LOGPROB":
            out[o] = py_logsumexp(vals)
        elif sr_name == "MAXLOG":
            out[o] = max(vals)
        elif sr_name == "SAT":
            out[o] = any(vals)
        else:
            out[o] = wrap_int64(sum(int(v) for v in vals))
    exp = np.empty(out_shape, dtype=object)
    for o, v in out.items():
        exp[o] = v
    return exp, tuple(present)


def random_array(rng, shape, sr_name):
    if sr_name.startswith("PROB"):
        return rng.uniform(0.0, 3.0, size=shape).astype(np.float32 if sr_name == "PROB32" else np.float64)
    if sr_name in ("LOGPROB", "MAXLOG"):
        x = rng.uniform(-20.0, 5.0, size=shape)
        x[rng.random(size=shape) < 0.25] = -np.inf  # some log-zeros, whole groups at times
        return x
    if sr_name == "SAT":
        return rng.random(size=shape) < 0.3
    return rng.integers(-(2**62), 2**62, size=shape, dtype=np.int64)  # sums overflow often


def check_against_oracle(got, exp, sr_name):
    assert got.shape == exp.shape
    if sr_name in ("SAT", "COUNT", "MAXLOG"):  # (a max is exact)
        np.testing.assert_array_equal(got, exp.astype(got.dtype))
    elif sr_name == "LOGPROB":
        want = exp.astype(np.float64)
        assert np.array_equal(np.isneginf(got), np.isneginf(want))
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    else:
        rtol = 1e-5 if sr_name == "PROB32" else 1e-12
        atol = 1e-6 if sr_name == "PROB32" else 0
        np.testing.assert_allclose(got, exp.astype(np.float64), rtol=rtol, atol=atol)


@st.composite
def cases(draw):
    sizes = {k: draw(st.integers(1, 3)) for k in POOL}
    perm = draw(st.permutations(POOL))
    in_keys = list(perm[: draw(st.integers(0, 4))])
    in_spec = TensorSpec(tuple(Axis(aid, kind, sizes[(kind, aid)]) for kind, aid in in_keys))
    kperm = draw(st.permutations(POOL))
    keep_keys = tuple(kperm[: draw(st.integers(0, len(POOL)))])  # may name absent keys
    sr_name = draw(st.sampled_from(sorted(SEMIRINGS)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arr = random_array(rng, in_spec.shape, sr_name)
    return arr, in_spec, keep_keys, sr_name


@settings(max_examples=300, deadline=None)
@given(cases())
def test_eliminate_keep_matches_oracle(case):
    arr, in_spec, keep_keys, sr_name = case
    sr = SEMIRINGS[sr_name]()
    got, out_spec = vm_eliminate_keep(arr, in_spec, keep_keys, sr)
    got = np.asarray(got)
    exp, present = oracle(arr, in_spec, keep_keys, sr_name)
    # axes follow keep_keys order, absent keys ignored, axes keep their sizes
    assert out_spec.keys == present
    assert out_spec == TensorSpec(tuple(a for k in present for a in in_spec.axes if a.key == k))
    assert got.dtype == sr.dtype
    check_against_oracle(got, exp, sr_name)
    if not present:
        assert got.ndim == 0


@settings(max_examples=200, deadline=None)
@given(cases(), st.data())
def test_legacy_drop_agrees_with_keep_keys(case, data):
    arr, in_spec, _, sr_name = case
    sr = SEMIRINGS[sr_name]()
    ids = sorted({aid for _, aid in POOL})
    drop = tuple(data.draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids))))
    # the legacy drop names axis ids of EITHER kind: every axis with such an id goes
    keep_expected = tuple(ax.key for ax in in_spec.axes if ax.id not in set(drop))
    assert keep_keys_from_drop(in_spec, drop) == keep_expected
    got_drop, spec_drop = vm_eliminate_keep(arr, in_spec, keep_keys_from_drop(in_spec, drop), sr)
    got_keep, spec_keep = vm_eliminate_keep(arr, in_spec, keep_expected, sr)
    assert spec_drop == spec_keep
    np.testing.assert_array_equal(np.asarray(got_drop), np.asarray(got_keep))
    exp, present = oracle(arr, in_spec, keep_expected, sr_name)
    check_against_oracle(np.asarray(got_drop), exp, sr_name)

    # and through the VM and the validator, spelled as args["drop"]
    prog = Program(
        (
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.ELIMINATE, 1, {"src": 0, "drop": drop}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("out",), "src": 1}),
        ),
        name="drop",
    )
    fp = lambda i: (arr, in_spec)  # noqa: E731
    slots = run_program(prog, sr, fp, fp)
    out, spec = slots[("out",)]
    assert spec == spec_keep
    np.testing.assert_array_equal(np.asarray(out), np.asarray(got_keep))
    v = validate_programs([prog], factor_specs={0: in_spec})
    assert v.slot_specs[("out",)] == spec_keep


def test_drop_of_a_shared_id_drops_both_kinds():
    spec = TensorSpec((Axis(3, G, 2), Axis(3, T, 3), Axis(1, G, 2)))
    assert keep_keys_from_drop(spec, [3]) == ((G, 1),)
    assert keep_keys_from_drop(spec, []) == ((G, 3), (T, 3), (G, 1))
    arr = np.arange(12.0).reshape(2, 3, 2)
    out, out_spec = vm_eliminate_keep(arr, spec, keep_keys_from_drop(spec, [3]), vm_prob_semiring())
    assert out_spec.keys == ((G, 1),)
    np.testing.assert_array_equal(out, arr.sum(axis=(0, 1)))


def test_keep_order_transposes():
    spec = TensorSpec((Axis(0, G, 2), Axis(1, G, 3), Axis(1, T, 4)))
    arr = np.arange(24.0).reshape(2, 3, 4)
    out, out_spec = vm_eliminate_keep(arr, spec, ((T, 1), (G, 9), (G, 0)), vm_prob_semiring())
    assert out_spec.keys == ((T, 1), (G, 0))
    np.testing.assert_array_equal(out, np.einsum("abc->ca", arr))
    # keeping every axis in a new order is a pure transpose, no reduction
    out, out_spec = vm_eliminate_keep(arr, spec, ((T, 1), (G, 0), (G, 1)), vm_prob_semiring())
    np.testing.assert_array_equal(out, np.einsum("abc->cab", arr))


@pytest.mark.parametrize("name", sorted(SEMIRINGS))
def test_empty_keep_reduces_to_0d(name):
    sr = SEMIRINGS[name]()
    spec = TensorSpec((Axis(0, G, 2), Axis(0, T, 3)))
    arr = random_array(np.random.default_rng(1), spec.shape, name)
    for keep in ((), ((G, 5), (T, 9))):  # nothing kept, or only absent keys
        out, out_spec = vm_eliminate_keep(arr, spec, keep, sr)
        out = np.asarray(out)
        assert out.shape == () and out_spec == TensorSpec(())
        assert out.dtype == sr.dtype
        exp, _ = oracle(arr, spec, (), name)
        check_against_oracle(out, exp, name)


def test_prob_einsum_cross_check():
    rng = np.random.default_rng(7)
    spec = TensorSpec((Axis(0, G, 3), Axis(2, T, 2), Axis(1, G, 4)))
    arr = rng.random(spec.shape)
    out, _ = vm_eliminate_keep(arr, spec, ((G, 1),), vm_prob_semiring())
    np.testing.assert_allclose(out, np.einsum("abc->c", arr), rtol=1e-12)
    out32, _ = vm_eliminate_keep(arr.astype(np.float32), spec, ((G, 1),), vm_prob_semiring(np.float32))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, np.einsum("abc->c", arr), rtol=1e-5)


def test_logprob_all_neg_inf_group_is_neg_inf_not_nan():
    spec = TensorSpec((Axis(0, G, 2), Axis(1, G, 3)))
    arr = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -np.inf, np.log(2.0)]])
    out, _ = vm_eliminate_keep(arr, spec, ((G, 0),), vm_logprob_semiring())
    assert out[0] == -np.inf
    assert np.isclose(out[1], np.log(3.0))
    out, _ = vm_eliminate_keep(np.full((2, 3), -np.inf), spec, (), vm_logprob_semiring())
    assert np.asarray(out) == -np.inf


def test_logprob_large_values_do_not_overflow():
    spec = TensorSpec((Axis(0, G, 3),))
    arr = np.array([1000.0, 1000.0, 999.0])
    out, _ = vm_eliminate_keep(arr, spec, (), vm_logprob_semiring())
    assert np.isclose(out, 1000.0 + math.log(2.0 + math.exp(-1.0)), rtol=1e-14)


def test_count_sum_wraps_like_numpy():
    spec = TensorSpec((Axis(0, G, 4), Axis(1, T, 2)))
    arr = np.full((4, 2), 2**62 + 3, dtype=np.int64)  # each column sums to 2**64 + 12
    out, _ = vm_eliminate_keep(arr, spec, ((T, 1),), vm_counting_semiring())
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, np.sum(arr, axis=0))  # numpy's wrapped value
    np.testing.assert_array_equal(out, [12, 12])  # 2**64 + 12 wrapped to int64
    assert [wrap_int64(4 * (2**62 + 3))] * 2 == out.tolist()
    total, _ = vm_eliminate_keep(arr, spec, (), vm_counting_semiring())
    assert int(total) == wrap_int64(8 * (2**62 + 3)) == int(np.sum(arr)) == 24
    # past INT64_MAX but not a full turn: negative
    big = np.array([2**62, 2**62], dtype=np.int64)
    s, _ = vm_eliminate_keep(big, TensorSpec((Axis(0, G, 2),)), (), vm_counting_semiring())
    assert int(s) == -(2**63) == int(np.sum(big))


def test_sat_any():
    spec = TensorSpec((Axis(0, G, 2), Axis(1, G, 2)))
    arr = np.array([[False, False], [False, True]])
    out, _ = vm_eliminate_keep(arr, spec, ((G, 1),), vm_sat_semiring())
    assert out.dtype == np.bool_
    np.testing.assert_array_equal(out, [False, True])
    out, _ = vm_eliminate_keep(arr, spec, ((G, 0),), vm_sat_semiring())
    np.testing.assert_array_equal(out, [False, True])
