"""plan/totals.py: in the reassociating mode, a NORMALIZE whose tensor's total is also stored
(the front end's scales) is done by the segment computing the tensor, whose normalize pass
writes the total: no reduction of its own, no normalized copy. Results within the
tolerances of docs/ir.md of the reference, on both targets' kernels and the numpy tier;
exact mode keeps its segments as they were."""

from __future__ import annotations

import numpy as np
import pytest

import catbp_jit
from catbp_jit.plan.options import PlanOptions
from jit_helpers import assert_same_slots, compile_case, run_reference, session_results
from random_programs import AI, elim, scale_case, store


def totals_of(exe) -> list:
    return [seg for seg in exe.plan.fused.segments if seg.total is not None]


@pytest.mark.parametrize(
    "semiring, dtype, gemm",
    [
        ("PROB", "float64", True),
        ("LOGPROB", "float64", False),
        # (a max is exact: the reference's bits)
        pytest.param("MAXLOG", "float64", False, marks=pytest.mark.slow),
        pytest.param("PROB", "float64", False, marks=pytest.mark.slow),
        pytest.param("PROB", "float32", False, marks=pytest.mark.slow),
        pytest.param("PROB", "float32", True, marks=pytest.mark.slow),
        pytest.param("LOGPROB", "float64", True, marks=pytest.mark.slow),
    ],
)
def test_the_normalize_writes_the_total(semiring, dtype, gemm):
    case = scale_case(semiring, dtype)
    exact = compile_case(case, "compiled")
    fast = compile_case(
        case, "compiled", options=PlanOptions(exact=False, gemm=gemm, gemm_program_min_terms=1)
    )
    assert not totals_of(exact)
    (seg,) = totals_of(fast)
    assert seg.normalize and seg.reduce and seg.total == fast.fused.outputs[("scale",)]
    assert len(fast.schedule.steps) == len(exact.schedule.steps) - 2  # no sum, no copy
    assert ("gemm" in {st.pattern.template for st in fast.schedule.steps}) == gemm
    assert "(total v" in fast.as_text()
    want = run_reference(case)
    assert_same_slots(want, session_results(fast.bind(), case.inputs[0]), case, "totals")
    numpy_tier = session_results(fast.bind(numpy_only=True), case.inputs[0]) if not gemm else None
    if numpy_tier is not None:
        assert_same_slots(want, numpy_tier, case, "totals, numpy tier")


def test_a_split_does_not_keep_the_total_apart():
    """Split reductions run after this pass: the scale, a sum to one output that they
    would split, is still written by the normalize pass (a split of it first cost Grids_11
    a pass of its own over 2^20 elements); the sum to Z, no total, is split."""
    case = scale_case("PROB")
    split = PlanOptions(
        exact=False, gemm=False, split_reductions=True, split_min_terms=2, split_outputs_below=8
    )
    fast = compile_case(case, "compiled", options=split)
    (seg,) = totals_of(fast)
    assert seg.total == fast.fused.outputs[("scale",)]
    unsplit = compile_case(case, "compiled", options=split.with_(split_reductions=False))
    assert len(fast.fused.segments) == len(unsplit.fused.segments) + 1  # Z's partials
    want = run_reference(case)
    assert_same_slots(want, session_results(fast.bind(), case.inputs[0]), case, "totals, split")


def test_a_total_read_by_another_step_is_not_fused():
    """The unnormalized tensor read by a third step must stay: nothing is fused."""
    case = scale_case("PROB")
    ins = list(case.programs[0].instructions)
    ins[6:6] = [elim(8, 4, [AI.key]), store(("rows",), 8)]  # before the NORMALIZE
    case.programs[0] = catbp_jit.Program(tuple(ins), "upward")
    fast = compile_case(case, "compiled", exact=False)
    assert not totals_of(fast)
    assert_same_slots(
        run_reference(case), session_results(fast.bind(), case.inputs[0]), case, "three readers"
    )


def test_batched_rows_get_their_own_totals():
    case = scale_case("PROB")
    batched = catbp_jit.compile(
        case.programs,
        case.sr(),
        factor_specs=case.factor_specs,
        batched_factors={0},
        buckets=(4,),
        exact=False,
    )
    (seg,) = totals_of(batched.profiles[4])
    assert batched.profiles[4].fused.specs[seg.total].shape == (4,)  # a total per row
    rng = np.random.default_rng(5)
    rows = rng.uniform(0.1, 2.0, (3,) + case.factor_specs[0].shape)  # 3 rows in a bucket of 4
    factors = case.inputs[0].factors
    got = batched.bind().run(factors={0: rows, 1: factors[1], 2: factors[2]})
    for r in range(3):
        one = scale_case("PROB")
        one.inputs[0].factors[0] = rows[r]
        want = run_reference(one)
        for key in (("scale",), ("Z",), ("t",)):
            np.testing.assert_allclose(got[key][0][r], want[key][0], rtol=1e-12, err_msg=f"row {r} {key}")
