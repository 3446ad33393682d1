"""codegen/totals.py in the loop kernels: in the reassociating mode a PROB NORMALIZE sums
its total in lanes and ranges (KernelPattern.total_in_lanes), and the numpy tier adds the
same numbers in the same order (numpy_steps.lane_totals): the same bits in both tiers,
the reference's values within rounding. Exact mode, and the CUDA target, keep the
elements' order."""

from __future__ import annotations

import pytest

from catbp_jit.executable import plan_options
from catbp_jit.plan.options import PlanOptions
from jit_helpers import assert_same_bits, assert_same_slots, compile_case, run_reference, session_results
from random_programs import scale_case


def bits(results: dict) -> dict:
    return {k: v for k, (v, _) in results.items()}


@pytest.mark.parametrize("dtype", ["float64", pytest.param("float32", marks=pytest.mark.slow)])
def test_loop_kernels_and_the_numpy_tier_give_the_same_bits(dtype):
    case = scale_case("PROB", dtype)  # a 12 x 20 tensor normalized: 16 ranges of 15 elements
    # both loop templates' NORMALIZE (their `finish`): in lines, and through the buffer
    # (float32's sums, which accumulate in float64, are never in lines: sums_in_lines)
    lines = "contract_lines" if dtype == "float64" else "contract_reduce"
    for line_products, template in ((True, lines), (False, "contract_reduce")):
        options = PlanOptions(exact=False, gemm=False, line_products=line_products)
        fast = compile_case(case, "compiled", options=options)
        lanes = [st for st in fast.schedule.steps if st.pattern.total_in_lanes]
        assert lanes and all(st.pattern.normalize and st.pattern.template == template for st in lanes)
        assert "_lanetotal" in lanes[0].pattern.name
        kernels = session_results(fast.bind(), case.inputs[0])
        numpy_tier = session_results(fast.bind(numpy_only=True), case.inputs[0])
        assert_same_bits(bits(kernels), bits(numpy_tier), f"lane totals, {template}")
        assert_same_slots(run_reference(case), kernels, case, f"lane totals, {template}")


def test_exact_mode_the_option_and_cuda_keep_the_elements_order():
    case = scale_case("PROB")
    exact = compile_case(case, "compiled")
    off = compile_case(case, "compiled", options=PlanOptions(exact=False, gemm=False, lane_totals=False))
    for exe in (exact, off):
        assert not any(st.pattern.total_in_lanes for st in exe.schedule.steps)
    assert plan_options("cpu", None, exact=False).lane_totals
    assert not plan_options("cuda", None, exact=False).lane_totals
