"""plan/layout.py in the reassociating mode: a pairwise reduction that may be a GEMM step
has its operands stored as matrices and its output as its products come out, results
included (their bindings then say how they lie); one that cannot be states its order for
a leaf beyond the last-level cache (LARGE_VALUE), and a smaller leaf stays in its
producer's order. Where a GEMM step may write its products in several orders, its
other readers' loops choose."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from catbp_jit.ir.schema import Axis, AxisType, TensorSpec
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.gemm import BLAS_MAX_SIDE, gemm_groups, gemm_shape, may_run_as_gemm
from catbp_jit.plan.layout import LARGE_VALUE, choose_layouts
from catbp_jit.plan.options import PlanOptions
from catbp_jit.plan.pipeline import Binding, stored_order
from catbp_jit.plan.schedule import read_cost

G = AxisType.GEOMETRIC
OPTIONS = PlanOptions(exact=False)


def pairwise_plan(x: int, shared_r: bool) -> tuple[Fused, TensorSpec]:
    """v2 = v0 ⊗ v1 over (X, Y, R), written in its leaves' order; then Σ_R v2 ⊗ v3 kept as
    (Y, X): a matrix product when v3 has R too, else not one (R summed by v2 alone)."""
    X, Y, R, S = Axis(1, G, x), Axis(2, G, 128), Axis(3, G, 128), Axis(4, G, 64)
    big = TensorSpec((X, Y, R))
    v3 = TensorSpec((Y, R, S)) if shared_r else TensorSpec((Y, S))
    out = TensorSpec((Y, S, X))
    specs = {0: big, 1: big, 2: big, 3: v3, 4: out}
    segments = [
        Segment(2, big, (), (0, 1), False, False, (2,)),
        Segment(4, out, (R,), (2, 3), True, False, (4,)),
    ]
    kinds = {0: "factor", 1: "factor", 2: "computed", 3: "factor", 4: "computed"}
    fused = Fused(segments, specs, kinds, {}, {("out",): 4}, "PROB")
    return fused, big


def layout_of_product(x: int, shared_r: bool) -> tuple:
    fused, _ = pairwise_plan(x, shared_r)
    groups = partial(gemm_groups, fused=fused, dtype="float64", options=PlanOptions(exact=False))
    return choose_layouts(fused, None, groups)[2].keys


def test_a_large_leaf_of_a_pairwise_reduction_that_is_no_gemm_is_stored_for_it():
    x = LARGE_VALUE // (128 * 128)
    fused, big = pairwise_plan(x, shared_r=False)
    assert not may_run_as_gemm(fused.segments[1], fused, "float64", PlanOptions(exact=False))
    y, s, xk, r = (ax.key for ax in fused.specs[4].axes + (big.axes[2],))
    assert layout_of_product(x, shared_r=False) == (y, xk, r)  # kept axes, then the sum's


def test_a_smaller_leaf_stays_in_its_producers_order():
    x = LARGE_VALUE // (128 * 128) - 1
    _, big = pairwise_plan(x, shared_r=False)
    assert layout_of_product(x, shared_r=False) == big.keys


def test_a_gemm_reader_has_its_operands_stored_as_matrices():
    """Σ_R v2 ⊗ v3 kept as (Y, S, X) is a batch over Y of [X][R] x [R][S]: the product v2 is
    written as its matrix (batch axis outermost, the summed axis innermost as in v2's own
    leaves) and the result in its own order, which is one the GEMM writes: no copies."""
    x = LARGE_VALUE // (128 * 128)
    fused, big = pairwise_plan(x, shared_r=True)
    assert may_run_as_gemm(fused.segments[1], fused, "float64", PlanOptions(exact=False))
    assert not may_run_as_gemm(fused.segments[1], fused, "float64", PlanOptions(exact=True))
    X, Y, R = big.keys
    layouts = choose_layouts(fused, None, partial(gemm_groups, fused=fused, dtype="float64", options=OPTIONS))
    assert layouts[2].keys == (Y, X, R)
    assert layouts[4].keys == fused.specs[4].keys
    shape = gemm_shape(fused.segments[1], fused, layouts, "float64", OPTIONS)
    assert shape is not None and shape.copied_elements == 0


def chain_plan() -> Fused:
    """v2 = Σ_K v0 ⊗ v1 (batch B, rows X, columns Y), a result, then v4 = Σ_Y v2 ⊗ v3
    (batch B, rows X, columns Z): both GEMM steps; v2's spec (X, B, Y) suits neither."""
    B, X, Y, K, Z = (Axis(i, G, n) for i, n in ((1, 8), (2, 64), (3, 32), (4, 16), (5, 24)))
    specs = {
        0: TensorSpec((B, X, K)),
        1: TensorSpec((B, K, Y)),
        2: TensorSpec((X, B, Y)),
        3: TensorSpec((B, Y, Z)),
        4: TensorSpec((B, X, Z)),
    }
    segments = [
        Segment(2, specs[2], (K,), (0, 1), True, False, (2,)),
        Segment(4, specs[4], (Y,), (2, 3), True, False, (4,)),
    ]
    kinds = {0: "factor", 1: "factor", 2: "computed", 3: "factor", 4: "computed"}
    return Fused(segments, specs, kinds, {}, {("v2",): 2, ("out",): 4}, "PROB")


def test_a_result_between_gemm_steps_is_stored_as_both_take_it():
    """A result written by one GEMM step and read by another lies as the first writes its
    products and the second reads its matrix (its binding says so: plan/pipeline.py); a
    batched program keeps its results in their own order."""
    fused = chain_plan()
    groups = partial(gemm_groups, fused=fused, dtype="float64", options=OPTIONS)
    layouts = choose_layouts(fused, None, groups)
    B, X, _ = fused.specs[0].keys
    Y = fused.specs[2].keys[2]
    assert layouts[2].keys == (B, X, Y)
    for seg in fused.segments:
        shape = gemm_shape(seg, fused, layouts, "float64", OPTIONS)
        assert shape is not None and shape.copied_elements == 0
    assert choose_layouts(fused, ("batch",), groups)[2].keys == fused.specs[2].keys


def gemm_then_product() -> Fused:
    """v2 = Σ_K v0 ⊗ v1 (batch B, rows X, columns Y), a GEMM step; then v4 = v2 ⊗ v3, a
    result in the order (B, Y, X): a product, which reads v2 where it lies."""
    B, X, Y, K = (Axis(i, G, n) for i, n in ((1, 8), (2, 64), (3, 32), (4, 16)))
    specs = {
        0: TensorSpec((B, X, K)),
        1: TensorSpec((B, K, Y)),
        2: TensorSpec((B, X, Y)),
        3: TensorSpec((Y,)),
        4: TensorSpec((B, Y, X)),
    }
    segments = [
        Segment(2, specs[2], (K,), (0, 1), True, False, (2,)),
        Segment(4, specs[4], (), (2, 3), False, False, (4,)),
    ]
    kinds = {0: "factor", 1: "factor", 2: "computed", 3: "factor", 4: "computed"}
    return Fused(segments, specs, kinds, {}, {("out",): 4}, "PROB")


def test_a_gemm_steps_products_lie_as_its_loop_readers_read_them():
    """Of the orders a GEMM step writes without a copy, rows then columns or columns then
    rows, the one its readers' loops cost least in (plan/schedule.read_cost): here the
    product's, which then reads v2 in its own output's order. Without the costs, the
    GEMM step's first order (its spec's)."""
    fused = gemm_then_product()
    groups = partial(gemm_groups, fused=fused, dtype="float64", options=OPTIONS)
    costs = partial(read_cost, fused=fused, dtype="float64", batch_key=None, options=OPTIONS)
    B, X, Y = fused.specs[2].keys
    assert choose_layouts(fused, None, groups)[2].keys == (B, X, Y)
    layouts = choose_layouts(fused, None, groups, read_cost=costs)
    assert layouts[2].keys == (B, Y, X)
    assert layouts[4].keys == fused.specs[4].keys
    shape = gemm_shape(fused.segments[0], fused, layouts, "float64", OPTIONS)
    assert shape is not None and shape.copied_elements == 0
    before = read_cost(fused.segments[1], {**layouts, 2: fused.specs[2]}, fused, "float64", None, OPTIONS)
    assert read_cost(fused.segments[1], layouts, fused, "float64", None, OPTIONS) < before


@pytest.mark.parametrize("across", [None, "reduced", "outputs", "both"])
def test_the_loop_readers_cost_prices_every_kind_of_vector(across):
    """read_cost of a reduction (a GEMM step's other reader, say) under every choice of
    PlanOptions.across: a cost, whatever nest the choice gives (across both included)."""
    fused, _ = pairwise_plan(LARGE_VALUE // (128 * 128), shared_r=False)
    options = PlanOptions(exact=False, across=across)
    cost = read_cost(fused.segments[1], dict(fused.specs), fused, "float64", None, options)
    assert 0.0 < cost < float("inf")


def test_a_result_stored_in_another_order_is_seen_in_its_own():
    X, Y, Z = Axis(1, G, 2), Axis(2, G, 3), Axis(3, G, 4)
    one = Axis(9, G, 1)
    spec, layout = TensorSpec((X, one, Y, Z)), TensorSpec((Z, X, Y))
    order = stored_order(spec, layout)
    assert order is not None and order.keys == (one.key, Z.key, X.key, Y.key)
    assert stored_order(spec, TensorSpec((X, Y, Z))) is None
    mem = np.arange(40.0)
    b = Binding("result", ("v",), 5, 24, spec, order)
    want = np.arange(5.0, 29.0).reshape(4, 2, 3).transpose(1, 2, 0).reshape(2, 1, 3, 4)
    np.testing.assert_array_equal(b.view(mem), want)
    np.testing.assert_array_equal(mem[b.positions()], want.ravel())
    assert np.shares_memory(b.view(mem), mem)


def test_no_gemm_with_a_side_longer_than_blas_counts():
    """BLAS's sizes are 32-bit ints: a matrix side of 2^31 elements stays a loop kernel's."""
    for x, gemm in ((BLAS_MAX_SIDE, True), (BLAS_MAX_SIDE + 1, False)):
        fused, _ = pairwise_plan(x, shared_r=True)
        assert may_run_as_gemm(fused.segments[1], fused, "float64", PlanOptions(exact=False)) == gemm, x


def copied_operand_plan() -> Fused:
    """v2 = v0 ⊗ v1 (B, X, R1, R2), then v4 = Σ_{R1,R2} v2 ⊗ v3 (batch B, rows X, columns
    Z) and v6 = Σ_Z v4 ⊗ v5 (batch B, rows X, columns Y1 Y2): GEMM steps whose factors v3
    (B, R2, Z, R1) and v5 (B, Y2, Z, Y1) are no matrices as they lie (an axis of another
    group between two of one), so each step copies its factor into a matrix, in any order."""
    B, X, R1, R2, Z, Y1, Y2 = (
        Axis(i, G, n) for i, n in ((1, 8), (2, 64), (3, 16), (4, 16), (5, 32), (7, 8), (8, 8))
    )
    specs = {
        0: TensorSpec((B, X, R1, R2)),
        1: TensorSpec((B, X, R1, R2)),
        2: TensorSpec((B, X, R1, R2)),
        3: TensorSpec((B, R2, Z, R1)),
        4: TensorSpec((B, X, Z)),
        5: TensorSpec((B, Y2, Z, Y1)),
        6: TensorSpec((B, X, Y1, Y2)),
    }
    segments = [
        Segment(2, specs[2], (), (0, 1), False, False, (2,)),
        Segment(4, specs[4], (R1, R2), (2, 3), True, False, (4,)),
        Segment(6, specs[6], (Z,), (4, 5), True, False, (6,)),
    ]
    kinds = {0: "factor", 1: "factor", 2: "computed", 3: "factor", 4: "computed", 5: "factor", 6: "computed"}
    return Fused(segments, specs, kinds, {}, {("out",): 6}, "PROB")


def test_an_operand_copied_into_a_matrix_sets_no_order():
    """A GEMM operand that is no matrix as it lies is copied into one in whatever order the
    step takes, so its order of a group decides nothing: the other operand keeps its summed
    axes in its own order (v2: R1 R2, not v3's R2 R1), and the products their columns in
    the result's (v6: Y1 Y2, not v5's Y2 Y1). The 12 x 12 3-state grid's values had
    taken a copied operand's order of five axes, against the one its other values lie in,
    and its sums read them gathered. Only the copies the operands need: none out."""
    fused = copied_operand_plan()
    groups = partial(gemm_groups, fused=fused, dtype="float64", options=OPTIONS)
    layouts = choose_layouts(fused, None, groups)
    B, X, R1, R2 = fused.specs[2].keys
    _, _, Y1, Y2 = fused.specs[6].keys
    assert layouts[2].keys == (B, X, R1, R2)
    assert layouts[6].keys == (B, X, Y1, Y2)
    for seg, factor in zip(fused.segments[1:], (3, 5)):
        shape = gemm_shape(seg, fused, layouts, "float64", OPTIONS)
        assert shape is not None and shape.copy_out is None
        assert shape.copied_elements == int(np.prod(fused.specs[factor].shape))
