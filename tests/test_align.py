"""align_array_to (docs/ir.md) and the validator's spec-level check_alignment.

Every value is checked against an index-by-index oracle written here, which maps each
output index to an input index through the axis keys (kind, id) alone.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catbp_jit import AlignmentError, Axis, AxisType, TensorSpec
from catbp_jit.ir.validate import check_alignment
from catbp_jit.reference import align_array_to

G, T = AxisType.GEOMETRIC, AxisType.TOPOLOGICAL

# The same integer id 3 in both kinds: (G, 3) and (T, 3) must never be confused.
POOL = [(G, 0), (G, 1), (G, 3), (T, 3), (T, 1), (T, 5)]

SETTINGS = settings(max_examples=250, deadline=None)


def spec_of(keys, sizes):
    return TensorSpec(tuple(Axis(aid, kind, sizes[(kind, aid)]) for kind, aid in keys))


@st.composite
def key_lists(draw, min_size=0):
    """A random subset of POOL in a random order (no key twice)."""
    perm = draw(st.permutations(POOL))
    return list(perm[: draw(st.integers(min_size, len(perm)))])


@st.composite
def legal_pairs(draw):
    """(arr, in_spec, out_spec) where the alignment is legal: sizes agree per key and
    input-only axes are singletons."""
    sizes = {k: draw(st.integers(1, 3)) for k in POOL}
    out_keys = draw(key_lists())
    in_keys = draw(key_lists())
    for k in in_keys:
        if k not in out_keys and draw(st.booleans()):
            sizes[k] = 1  # an extra input axis is fine when it is a singleton
    in_keys = [k for k in in_keys if k in out_keys or sizes[k] == 1]
    in_spec, out_spec = spec_of(in_keys, sizes), spec_of(out_keys, sizes)
    # distinct values, shuffled, so that any wrong index shows up
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = int(np.prod(in_spec.shape, dtype=np.int64))
    arr = rng.permutation(np.arange(n, dtype=np.float64) * 1.5 - 3.0).reshape(in_spec.shape)
    return arr, in_spec, out_spec


def oracle_aligned(arr, in_spec, out_spec):
    """The broadcast result, element by element: out[o] = arr[i(o)], matching by key."""
    out_pos = {ax.key: i for i, ax in enumerate(out_spec.axes)}
    out = np.empty(out_spec.shape, dtype=arr.dtype)
    for o in np.ndindex(*out_spec.shape):
        idx = tuple(o[out_pos[ax.key]] if ax.key in out_pos else 0 for ax in in_spec.axes)
        out[o] = arr[idx]
    return out


def legal_by_rules(in_spec, out_spec):
    """The alignment rules written out independently of the library."""
    out_sizes = {ax.key: ax.size for ax in out_spec.axes}
    for ax in in_spec.axes:
        if ax.key not in out_sizes:
            if ax.size != 1:
                return False
        elif out_sizes[ax.key] != ax.size:
            return False
    return True


@SETTINGS
@given(legal_pairs())
def test_align_matches_index_oracle(case):
    arr, in_spec, out_spec = case
    view = align_array_to(arr, in_spec, out_spec)
    assert view.ndim == out_spec.ndim
    in_keys = set(in_spec.keys)
    # output axis order; size-1 exactly where the input lacks the axis
    expected_shape = tuple(ax.size if ax.key in in_keys else 1 for ax in out_spec.axes)
    assert view.shape == expected_shape
    full = np.broadcast_to(view, out_spec.shape)
    np.testing.assert_array_equal(full, oracle_aligned(arr, in_spec, out_spec))


@SETTINGS
@given(legal_pairs())
def test_check_alignment_accepts_every_legal_pair(case):
    arr, in_spec, out_spec = case
    check_alignment(in_spec, out_spec)  # must not raise


@st.composite
def any_pairs(draw):
    """Arbitrary sizes: the alignment may or may not be legal."""
    in_sizes = {k: draw(st.integers(1, 3)) for k in POOL}
    out_sizes = dict(in_sizes)
    for k in POOL:
        if draw(st.integers(0, 4)) == 0:
            out_sizes[k] = draw(st.integers(1, 3))
    in_spec = spec_of(draw(key_lists()), in_sizes)
    out_spec = spec_of(draw(key_lists()), out_sizes)
    return in_spec, out_spec


@settings(max_examples=300, deadline=None)
@given(any_pairs())
def test_check_alignment_agrees_with_align_array_to(pair):
    in_spec, out_spec = pair
    arr = np.arange(int(np.prod(in_spec.shape, dtype=np.int64)), dtype=np.int64).reshape(in_spec.shape)
    try:
        check_alignment(in_spec, out_spec)
        spec_ok = True
    except AlignmentError as e:
        assert isinstance(e, ValueError)
        spec_ok = False
    try:
        view = align_array_to(arr, in_spec, out_spec)
        arr_ok = True
    except AlignmentError as e:
        assert isinstance(e, ValueError)
        arr_ok = False
    assert spec_ok == arr_ok == legal_by_rules(in_spec, out_spec), (in_spec, out_spec)
    if arr_ok:
        np.testing.assert_array_equal(
            np.broadcast_to(view, out_spec.shape), oracle_aligned(arr, in_spec, out_spec)
        )


@SETTINGS
@given(legal_pairs(), st.data())
def test_extra_non_singleton_axis_raises(case, data):
    arr, in_spec, out_spec = case
    missing = [k for k in POOL if k not in set(in_spec.keys) and k not in set(out_spec.keys)]
    if not missing:
        return  # every pool key already used: nothing to add
    missing_key = data.draw(st.sampled_from(missing))
    size = data.draw(st.integers(2, 4))
    kind, aid = missing_key
    where = data.draw(st.integers(0, in_spec.ndim))
    axes = list(in_spec.axes)
    axes.insert(where, Axis(aid, kind, size))
    bigger = TensorSpec(tuple(axes))
    big_arr = np.stack([arr] * size, axis=where)
    assert big_arr.shape == bigger.shape
    with pytest.raises(AlignmentError) as ei:
        align_array_to(big_arr, bigger, out_spec)
    assert isinstance(ei.value, ValueError)
    with pytest.raises(AlignmentError):
        check_alignment(bigger, out_spec)
    # the same axis as a singleton is fine, and changes nothing
    single = TensorSpec(tuple(axes[:where] + [Axis(aid, kind, 1)] + axes[where + 1 :]))
    single_arr = np.expand_dims(arr, where)
    check_alignment(single, out_spec)
    np.testing.assert_array_equal(
        np.broadcast_to(align_array_to(single_arr, single, out_spec), out_spec.shape),
        oracle_aligned(arr, in_spec, out_spec),
    )


@SETTINGS
@given(legal_pairs(), st.data())
def test_size_mismatch_raises(case, data):
    arr, in_spec, out_spec = case
    shared = [i for i, ax in enumerate(out_spec.axes) if ax.key in set(in_spec.keys)]
    if not shared:
        return
    j = data.draw(st.sampled_from(shared))
    ax = out_spec.axes[j]
    new_size = data.draw(st.integers(1, 5).filter(lambda s: s != ax.size))
    axes = list(out_spec.axes)
    axes[j] = Axis(ax.id, ax.kind, new_size)
    bad_out = TensorSpec(tuple(axes))
    with pytest.raises(AlignmentError) as ei:
        align_array_to(arr, in_spec, bad_out)
    assert isinstance(ei.value, ValueError)
    assert "mismatch" in str(ei.value)
    with pytest.raises(AlignmentError):
        check_alignment(in_spec, bad_out)


def test_geometric_and_topological_same_id_are_distinct():
    arr = np.arange(6.0).reshape(2, 3)
    in_spec = TensorSpec((Axis(3, G, 2), Axis(3, T, 3)))
    out_spec = TensorSpec((Axis(3, T, 3), Axis(3, G, 2)))
    view = align_array_to(arr, in_spec, out_spec)
    np.testing.assert_array_equal(view, arr.T)
    # (G,3) is not in an output that only has (T,3): an extra non-singleton axis
    with pytest.raises(AlignmentError):
        align_array_to(np.arange(2.0), TensorSpec((Axis(3, G, 2),)), TensorSpec((Axis(3, T, 2),)))
    with pytest.raises(AlignmentError):
        check_alignment(TensorSpec((Axis(3, G, 2),)), TensorSpec((Axis(3, T, 2),)))
    # and a (G,3) input aligned to {(T,3), (G,3)} varies along (G,3) only
    v = align_array_to(
        np.array([10.0, 20.0]), TensorSpec((Axis(3, G, 2),)), TensorSpec((Axis(3, T, 2), Axis(3, G, 2)))
    )
    assert v.shape == (1, 2)
    np.testing.assert_array_equal(np.broadcast_to(v, (2, 2)), [[10.0, 20.0], [10.0, 20.0]])


def test_vm_spec_worked_example():
    """VM spec §3.1: (2, 3) over axes 0, 1 aligned to axes 1, 2, 0 gives shape (3, 1, 2)."""
    in_spec = TensorSpec([Axis(0, G, 2), Axis(1, G, 3)])
    out_spec = TensorSpec([Axis(1, G, 3), Axis(2, G, 4), Axis(0, G, 2)])
    arr = np.arange(6).reshape(2, 3)
    view = align_array_to(arr, in_spec, out_spec)
    assert view.shape == (3, 1, 2)
    for i in range(2):
        for j in range(3):
            assert view[j, 0, i] == arr[i, j]
    full = np.broadcast_to(view, out_spec.shape)
    assert full.shape == (3, 4, 2)
    for k in range(4):
        np.testing.assert_array_equal(full[:, k, :], arr.T)


def test_scalar_and_singleton_only_inputs():
    out_spec = TensorSpec((Axis(0, G, 2), Axis(1, T, 3)))
    v = align_array_to(np.array(7.0), TensorSpec(()), out_spec)
    assert v.shape == (1, 1) and v[0, 0] == 7.0
    # an input made only of extra singleton axes collapses to a broadcastable scalar
    v = align_array_to(np.full((1, 1), 5.0), TensorSpec((Axis(9, G, 1), Axis(9, T, 1))), out_spec)
    assert v.shape == (1, 1) and v[0, 0] == 5.0
    # and aligning to an empty output spec gives a 0-d array
    v = align_array_to(np.full((1,), 4.0), TensorSpec((Axis(9, G, 1),)), TensorSpec(()))
    assert v.shape == () and v == 4.0
    with pytest.raises(AlignmentError):
        align_array_to(np.ones(2), TensorSpec((Axis(9, G, 2),)), TensorSpec(()))


def test_present_singleton_into_larger_output_is_a_mismatch():
    # A size-1 input axis that IS in the output must match the output's size (no implicit
    # broadcast of a named axis): both levels agree.
    in_spec = TensorSpec((Axis(0, G, 1),))
    out_spec = TensorSpec((Axis(0, G, 3),))
    with pytest.raises(AlignmentError):
        align_array_to(np.ones(1), in_spec, out_spec)
    with pytest.raises(AlignmentError):
        check_alignment(in_spec, out_spec)
