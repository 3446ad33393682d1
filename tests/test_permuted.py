"""plan/permuted.py: a segment computing what an earlier one did, in another axis order, is
not computed again. Its readers read the earlier output (or, for a slot result, a copy of
it in the slot's order); sums in another order of their reduced axes are not twins. Exact
mode gives the bits it gives without the pass (PlanOptions(twins=False)), kernels and numpy
tier, within the reference's tolerance; the reassociating mode stays within it too."""

from __future__ import annotations

import numpy as np
import pytest

from catbp_jit.ir.ops import Program
from catbp_jit.ir.schema import TensorSpec
from catbp_jit.plan.options import PlanOptions
from jit_helpers import assert_same_bits, assert_same_slots, compile_case, run_reference, session_results
from random_programs import AB, AI, AJ, AK, Case, Inputs, contract, elim, load, store

A, B, C = TensorSpec((AI, AK, AB)), TensorSpec((AK, AJ, AB)), TensorSpec((AJ, AI))
FIRST = TensorSpec((AI, AK, AB, AJ))  # Σ over K then B (the order of the reduced axes)
TWIN = TensorSpec((AJ, AK, AB, AI))  # the same sums
OTHER = TensorSpec((AJ, AB, AK, AI))  # Σ over B then K: another order, not a twin


def twins_case(second: TensorSpec, store_it: bool, semiring: str = "PROB") -> Case:
    """t = Σ a ⊗ b kept as (I, J) and stored; the same product in `second`'s order summed
    again, kept as (J, I) (t2), optionally stored, then read: Z = Σ t2 ⊗ c."""
    prog = [load(0, 0), load(1, 1), load(2, 2)]
    prog += [contract(3, (0, 1), FIRST), elim(4, 3, [AI.key, AJ.key]), store(("t",), 4)]
    prog += [contract(5, (0, 1), second), elim(6, 5, [AJ.key, AI.key])]
    prog += [store(("t2",), 6)] if store_it else []
    prog += [contract(7, (6, 2), TensorSpec((AJ, AI))), elim(8, 7, []), store(("Z",), 8)]
    rng = np.random.default_rng(3)
    factors = {f: rng.uniform(0.1, 2.0, s.shape) for f, s in enumerate((A, B, C))}
    if semiring == "LOGPROB":
        factors = {f: np.log(x) for f, x in factors.items()}
    return Case(
        semiring,
        np.dtype("float64"),
        [Program(tuple(prog), "upward")],
        {0: A, 1: B, 2: C},
        {},
        {},
        [Inputs(factors, {}, {})],
    )


def sums_of_ab(exe) -> list:
    """The segments that sum a ⊗ b (the factors' values are the first two leaves read)."""
    fused = exe.plan.fused
    inputs = {v for v, kind in fused.kinds.items() if kind != "computed"}
    return [
        seg for seg in fused.segments if seg.reduce and set(seg.leaves) <= inputs and len(seg.leaves) == 2
    ]


def bits(results: dict) -> dict:
    return {key: value for key, (value, _) in results.items()}


@pytest.mark.parametrize("store_it", [False, True])
def test_a_twin_is_computed_once_exact(store_it):
    case = twins_case(TWIN, store_it)
    exe = compile_case(case, "compiled")
    alone = compile_case(case, "compiled", options=PlanOptions(twins=False))
    (first,) = sums_of_ab(exe)
    assert len(sums_of_ab(alone)) == 2
    copies = [seg for seg in exe.plan.fused.segments if seg.leaves == (first.out,) and not seg.red_axes]
    assert len(copies) == (1 if store_it else 0)  # a slot result: a copy in its order
    if store_it:
        assert copies[0].out_spec.keys == (AJ.key, AI.key)
    want = session_results(alone.bind(), case.inputs[0])
    got = session_results(exe.bind(), case.inputs[0])
    assert_same_bits(bits(want), bits(got), "kernels")
    assert_same_bits(
        bits(want), bits(session_results(exe.bind(numpy_only=True), case.inputs[0])), "numpy tier"
    )
    assert_same_slots(run_reference(case), got, case, "exact")
    if store_it:
        assert np.array_equal(got[("t2",)][0], got[("t",)][0].T)  # the same values, permuted


def test_sums_in_another_order_are_not_twins():
    case = twins_case(OTHER, store_it=True)
    exe = compile_case(case, "compiled")
    assert len(sums_of_ab(exe)) == 2
    assert_same_slots(run_reference(case), session_results(exe.bind(), case.inputs[0]), case)


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB"])
@pytest.mark.parametrize("gemm", [True, False])
def test_a_twin_is_computed_once_reassociating(semiring, gemm):
    """(Σ a ⊗ b is a matrix product: a GEMM step, or the loop kernels.)"""
    case = twins_case(TWIN, store_it=True, semiring=semiring)
    exe = compile_case(
        case, "compiled", options=PlanOptions(exact=False, gemm=gemm, gemm_program_min_terms=1)
    )
    assert len(sums_of_ab(exe)) == 1
    assert ("gemm" in {st.pattern.template for st in exe.schedule.steps}) == gemm
    got = session_results(exe.bind(), case.inputs[0])
    assert_same_slots(run_reference(case), got, case, "reassociating")
    assert np.array_equal(got[("t2",)][0], got[("t",)][0].T)  # the same values, permuted
