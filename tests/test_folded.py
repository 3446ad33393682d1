"""plan/folded.py: a product whose one reader sums it alone is computed inside that sum,
never written; the same bits as with the product written (exact mode, kernels and numpy
tier), and the reassociating mode within its tolerance."""

from __future__ import annotations

import numpy as np
import pytest

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
from catbp_jit.plan.folded import fold_products, sum_inside
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.options import PlanOptions
from jit_helpers import positive_factors, same_bits_as

G = AxisType.GEOMETRIC
I, J, K, L = Axis(0, G, 6), Axis(1, G, 5), Axis(2, G, 7), Axis(3, G, 3)  # noqa: E741 (index letters)


def pair(reader_leaves: tuple, red: tuple, slot: bool = False) -> Fused:
    """v2 = v0 ⊗ v1 over (I, J, K), then v3 = Σ_red of reader_leaves."""
    specs = {0: TensorSpec((I, K)), 1: TensorSpec((J, K)), 2: TensorSpec((I, J, K)), 4: TensorSpec((I, J))}
    kept = tuple(ax for ax in (I, J, K) if ax not in red)
    specs[3] = TensorSpec(kept)
    segments = [
        Segment(2, specs[2], (), (0, 1), False, False, (2,)),
        Segment(3, specs[3], red, reader_leaves, True, False, (3,)),
    ]
    kinds = {0: "factor", 1: "factor", 4: "factor", 2: "computed", 3: "computed"}
    outputs = {("s",): 3} | ({("p",): 2} if slot else {})
    return Fused(segments, specs, kinds, {}, outputs, "PROB")


def test_a_product_summed_alone_by_its_one_reader_is_folded():
    out = fold_products(pair((2,), (K,)), 8)
    (seg,) = out.segments
    assert seg.out == 3 and seg.leaves == (0, 1) and [ax.key for ax in seg.red_axes] == [K.key]
    assert seg.nodes == (2, 3) and 2 not in out.specs and 2 not in out.kinds


def chain(reader_leaves: tuple, product_space: tuple = (I, J, K)) -> Fused:
    """v2 = v0 ⊗ v1 over product_space, then v3 = the product of reader_leaves over
    (I, J, K), nothing summed."""
    specs = {0: TensorSpec((I, K)), 1: TensorSpec((J, K)), 4: TensorSpec((I, J, K))}
    specs[2], specs[3] = TensorSpec(product_space), TensorSpec((I, J, K))
    segments = [
        Segment(2, specs[2], (), (0, 1), False, False, (2,)),
        Segment(3, specs[3], (), reader_leaves, False, False, (3,)),
    ]
    kinds = {0: "factor", 1: "factor", 4: "factor", 2: "computed", 3: "computed"}
    return Fused(segments, specs, kinds, {}, {("s",): 3}, "PROB")


def test_a_product_read_first_by_its_one_reader_is_folded_in_either_mode():
    """((v0 ⊗ v1) ⊗ v4) is the order written: the same bits."""
    for regroup in (False, True):
        (seg,) = fold_products(chain((2, 4)), 8, regroup).segments
        assert seg.leaves == (0, 1, 4) and not seg.red_axes


def test_a_product_read_second_is_folded_where_products_may_be_regrouped():
    fused = chain((4, 2))
    assert fold_products(fused, 8) is fused  # exact: v4 ⊗ (v0 ⊗ v1) is another order
    (seg,) = fold_products(fused, 8, regroup=True).segments
    assert seg.leaves == (0, 1, 4)


def test_a_static_product_read_by_a_dynamic_reader_stays():
    """v0 ⊗ v1 of static inputs runs when they change; folded into a reader of a dynamic
    v4 it would run every run."""
    fused = chain((2, 4))
    assert fold_products(fused, 8, True, static={0, 1, 2}) is fused
    (seg,) = fold_products(fused, 8, True, static={0, 1, 2, 4, 3}).segments  # all static
    assert seg.leaves == (0, 1, 4)


def test_a_small_product_its_reader_broadcasts_stays():
    """v0 ⊗ v1 over (I, K), a quarter of the reader's space or less: recomputed at every J,
    it is the hoisted prefix plan/hoist.py made, kept."""
    fused = chain((2, 4), product_space=(I, K))
    fused.specs[1] = TensorSpec((K,))
    assert fold_products(fused, 8, regroup=True) is fused


@pytest.mark.parametrize(
    "reader, red, slot, leaves",
    [
        ((2, 4), (K,), False, 8),  # a sum of it and another leaf: reassociate.py's pairwise step
        ((2,), (K,), True, 8),  # the product is a slot result: written anyway
        ((2,), (K,), False, 1),  # its leaves would be more than a segment may multiply
    ],
)
def test_otherwise_it_is_written(reader, red, slot, leaves):
    fused = pair(reader, red, slot)
    assert fold_products(fused, leaves) is fused


def product_read_by_twins() -> tuple[Program, dict]:
    """p = a ⊗ b over (I, J, L, K), read by four sums over K kept in four orders (more
    readers than fusion recomputes a product for: p is written). The sums are twins
    (plan/permuted.py): one is computed, and p then has one reader."""
    specs = {0: TensorSpec((I, L, K)), 1: TensorSpec((J, K))}
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins.append(Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": TensorSpec((I, J, L, K))}))
    for n, keep in enumerate(((I, J, L), (J, I, L), (L, I, J), (I, L, J))):
        ins.append(Instruction(OpCode.ELIMINATE, 3 + n, {"src": 2, "keep_keys": tuple(a.key for a in keep)}))
        ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": (f"s{n}",), "src": 3 + n}))
    return Program(tuple(ins), "upward"), specs


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB"])
def test_a_folded_product_gives_the_bits_of_the_written_one(semiring):
    prog, specs = product_read_by_twins()
    sr = catbp_jit.make_semiring(semiring)
    folded = catbp_jit.compile([prog], sr, factor_specs=specs)
    written = catbp_jit.compile([prog], sr, factor_specs=specs, options=PlanOptions(twins=False))
    assert len(written.plan.fused.segments) == 5  # the product, then four sums of it
    sums = [seg for seg in folded.plan.fused.segments if seg.red_axes]
    assert [seg.leaves for seg in sums] == [(0, 1)]  # the product folded into the one sum
    assert len(folded.plan.fused.segments) == 4  # and three copies in the slots' orders
    same_bits_as(written, folded, positive_factors(specs, semiring, seed=4))


def constant_across_the_sum(n: int) -> Fused:
    """v2 = v0 ⊗ v1 over (I, J, M), M of n states, then v3 = Σ_M v2: v0 over (I, J) has
    no M, so each of its elements multiplies n terms alike."""
    M = Axis(4, G, n)
    specs = {0: TensorSpec((I, J)), 1: TensorSpec((J, M)), 2: TensorSpec((I, J, M)), 3: TensorSpec((I, J))}
    segments = [
        Segment(2, specs[2], (), (0, 1), False, False, (2,)),
        Segment(3, specs[3], (M,), (2,), True, False, (3,)),
    ]
    kinds = {0: "factor", 1: "factor", 2: "computed", 3: "computed"}
    return Fused(segments, specs, kinds, {}, {("s",): 3}, "PROB")


def test_a_sum_folded_where_products_may_be_regrouped_sums_first_what_the_sum_needs():
    """Σ_M v0 ⊗ v1 = v0 ⊗ Σ_M v1 (rounding only): the sum of v1 alone, a new value over
    (J), then the product over (I, J), nothing summed; exact mode folds it as written."""
    fused = constant_across_the_sum(64)
    inner, outer = fold_products(fused, 8, regroup=True).segments
    assert inner.leaves == (1,) and [ax.key for ax in inner.red_axes] == [(G, 4)] and inner.reduce
    assert inner.out_spec == TensorSpec((J,)) and inner.out not in fused.specs
    assert outer.out == 3 and outer.leaves == (0, inner.out) and not outer.red_axes and not outer.reduce
    (seg,) = fold_products(fused, 8).segments
    assert seg.leaves == (0, 1) and seg.red_axes


def test_the_product_left_folds_on_into_its_own_reader():
    """v5 = v3 ⊗ v4 reads v3 first: once v3 is v0 ⊗ Σ_M v1, a product with one reader, it
    is folded into v5 in turn, the sum read there."""
    fused = constant_across_the_sum(64)
    fused.specs[4], fused.specs[5] = TensorSpec((I, J)), TensorSpec((I, J))
    fused.kinds[4], fused.kinds[5] = "factor", "computed"
    fused.segments.append(Segment(5, fused.specs[5], (), (3, 4), False, False, (5,)))
    fused.outputs = {("s",): 5}
    inner, seg = fold_products(fused, 8, regroup=True).segments
    assert inner.leaves == (1,) and seg.out == 5 and seg.leaves == (0, inner.out, 4)


def test_a_short_sum_stays_folded_whole():
    """M of 2 states: the sum and the product would cost more work, and a step more, than
    the folded sum (sum_inside's estimate)."""
    fused = constant_across_the_sum(2)
    (seg,) = fold_products(fused, 8, regroup=True).segments
    assert seg.leaves == (0, 1)
    assert sum_inside(seg, fused.specs, 9) is None


def test_a_sum_split_so_gives_the_reference_within_its_tolerance():
    """product_read_by_twins with a over (I, L), no K: the one sum left, Σ_K a ⊗ b, runs
    as a ⊗ Σ_K b in the reassociating mode."""
    prog, specs = product_read_by_twins()
    specs[0] = TensorSpec((I, L))
    sr = catbp_jit.make_semiring("PROB")
    exe = catbp_jit.compile([prog], sr, factor_specs=specs, exact=False)
    sums = [seg for seg in exe.plan.fused.segments if seg.red_axes]
    assert [seg.leaves for seg in sums] == [(1,)]
    assert any(seg.leaves == (0, sums[0].out) for seg in exe.plan.fused.segments)
    factors = positive_factors(specs, "PROB", seed=5)
    got = exe.bind().run(factors=factors)
    want = np.einsum("il,jk->ijl", factors[0], factors[1])
    for n, order in enumerate(("ijl", "jil", "lij", "ilj")):
        np.testing.assert_allclose(got[(f"s{n}",)][0], np.einsum(f"ijl->{order}", want), rtol=1e-12)
