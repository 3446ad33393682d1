"""plan/layout.py in the reassociating mode: a pairwise reduction that may be a GEMM step
states no order for its leaves; one that cannot be states it for a leaf beyond the
last-level cache (LARGE_VALUE), and a smaller leaf stays in its producer's order."""

from __future__ import annotations

from functools import partial

from catbp_jit.ir.schema import Axis, AxisType, TensorSpec
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.gemm import BLAS_MAX_SIDE, may_run_as_gemm
from catbp_jit.plan.layout import LARGE_VALUE, choose_layouts
from catbp_jit.plan.options import PlanOptions

G = AxisType.GEOMETRIC


def pairwise_plan(x: int, shared_r: bool) -> tuple[Fused, TensorSpec]:
    """v2 = v0 ⊗ v1 over (X, Y, R), written in its leaves' order; then Σ_R v2 ⊗ v3 kept as
    (Y, X): a matrix product when v3 has R too, else not one (R summed by v2 alone)."""
    X, Y, R, S = Axis(1, G, x), Axis(2, G, 128), Axis(3, G, 128), Axis(4, G, 64)
    big = TensorSpec((X, Y, R))
    v3 = TensorSpec((R, Y, S)) if shared_r else TensorSpec((Y, S))
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
    reader = partial(may_run_as_gemm, fused=fused, dtype="float64", options=PlanOptions(exact=False))
    return choose_layouts(fused, None, reader)[2].keys


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


def test_a_gemm_reader_states_no_order():
    x = LARGE_VALUE // (128 * 128)
    fused, big = pairwise_plan(x, shared_r=True)
    assert may_run_as_gemm(fused.segments[1], fused, "float64", PlanOptions(exact=False))
    assert not may_run_as_gemm(fused.segments[1], fused, "float64", PlanOptions(exact=True))
    assert layout_of_product(x, shared_r=True) == big.keys


def test_no_gemm_with_a_side_longer_than_blas_counts():
    """BLAS's sizes are 32-bit ints: a matrix side of 2^31 elements stays a loop kernel's."""
    for x, gemm in ((BLAS_MAX_SIDE, True), (BLAS_MAX_SIDE + 1, False)):
        fused, _ = pairwise_plan(x, shared_r=True)
        assert may_run_as_gemm(fused.segments[1], fused, "float64", PlanOptions(exact=False)) == gemm, x
