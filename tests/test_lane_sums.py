"""Reassociating sums in lanes: in the reassociating mode a float64 PROB sum across
reduced axes adds each output's terms in the lanes of a line (KernelPattern.terms_in_lanes:
term v of each vector into lane v % LANES, the lanes added pairwise at the end), and the
numpy tier adds the same numbers in the same order (numpy_steps.lane_sums): the same bits
in both tiers, the reference's values within rounding. Exact mode, the option off, other
dtypes and semirings, and the CUDA target keep each output's terms in order."""

from __future__ import annotations

import numpy as np
import pytest

from catbp_jit.codegen.totals import LANES
from catbp_jit.executable import model_options, plan_options
from catbp_jit.numpy_steps import in_order_sum, lane_sums
from catbp_jit.plan.options import PlanOptions
from jit_helpers import assert_same_bits, assert_same_slots, compile_case, run_reference, session_results
from random_programs import LANE_SUM_CASES, LD, LS, lane_sum_case

OPTIONS = PlanOptions(exact=False, gemm=False, split_reductions=False)


def bits(results: dict) -> dict:
    return {k: v for k, (v, _) in results.items()}


def lanes_by_hand(terms: np.ndarray, V: int) -> np.ndarray:
    """The order the kernels promise, one term at a time: term t of a row is term t % V of
    its vector, which goes to lane (t % V) % LANES."""
    out = []
    for row in terms:
        lanes = [0.0] * LANES
        for t, x in enumerate(row):
            lanes[(t % V) % LANES] += float(x)
        s = lanes
        out.append(((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])))
    return np.array(out)


@pytest.mark.parametrize("V", [1, 5, 8, 21, 105, 120, 840])
def test_the_numpy_tier_adds_as_the_kernels_promise(V):
    rng = np.random.default_rng(V)
    terms = rng.uniform(-1.0, 1.0, (7, 840)) * 10.0 ** rng.integers(-8, 8, (7, 840))
    got = lane_sums(terms, V)
    assert np.array_equal(got.view(np.uint64), lanes_by_hand(terms, V).view(np.uint64))
    if V >= 2 * LANES:  # (a cancelling sum in another order has other bits)
        assert not np.array_equal(got, in_order_sum(terms))


@pytest.mark.parametrize("name", list(LANE_SUM_CASES))
def test_kernels_and_the_numpy_tier_give_the_same_bits(name):
    rng = np.random.default_rng(1)

    def values(shape):  # signs and scales that make the order of the additions show
        return rng.uniform(-1.0, 2.0, shape) * 10.0 ** rng.integers(-6, 6, shape)

    case = lane_sum_case(name, values=values)
    fast = compile_case(case, "compiled", options=OPTIONS)
    lanes = [st for st in fast.schedule.steps if st.pattern.terms_in_lanes]
    assert lanes and all(st.pattern.sums_in_lanes for st in lanes), name
    assert "_laneterms" in lanes[0].pattern.name
    step = lanes[0]
    V, n_red = step.params.block_size, int(np.prod([ax.size for ax in step.segment.red_axes]))
    if name == "one leaf":  # a vector of every term
        assert V == n_red == LS.size
    else:  # several vectors an output, each ending in a part line
        assert n_red > V and V % LANES != 0, (n_red, V)
    kernels = session_results(fast.bind(), case.inputs[0])
    numpy_tier = session_results(fast.bind(numpy_only=True), case.inputs[0])
    assert_same_bits(bits(kernels), bits(numpy_tier), name)
    assert_same_slots(run_reference(case), kernels, case, name)
    # the lanes are there: in order (the option off) the bits are others
    in_order = compile_case(case, "compiled", options=OPTIONS.with_(lane_sums=False))
    assert not any(st.pattern.terms_in_lanes for st in in_order.schedule.steps)
    ordered = bits(session_results(in_order.bind(), case.inputs[0]))
    assert any(not np.array_equal(ordered[k], v) for k, v in bits(kernels).items()), name


def test_zeros_infinities_and_nans_sum_as_in_order():
    case = lane_sum_case("two leaves")
    a = case.inputs[0].factors[0]
    a[0] = 0.0  # an output of zeros
    a[1, 3, 5] = np.inf
    a[2, 7, 2] = np.nan
    fast = compile_case(case, "compiled", options=OPTIONS)
    assert any(st.pattern.terms_in_lanes for st in fast.schedule.steps)
    kernels = session_results(fast.bind(), case.inputs[0])
    assert_same_bits(bits(kernels), bits(session_results(fast.bind(numpy_only=True), case.inputs[0])))
    out = bits(kernels)[("out",)]
    assert np.array_equal(out[0].view(np.uint64), np.zeros(LD.size).view(np.uint64))  # +0.0 each
    assert np.isposinf(out[1]).all() and np.isnan(out[2]).all()


@pytest.mark.parametrize("options", [PlanOptions(gemm=False), OPTIONS.with_(lane_sums=False)])
def test_exact_mode_and_the_option_off_keep_the_terms_order(options):
    exe = compile_case(lane_sum_case("two leaves"), "compiled", options=options)
    assert any(st.pattern.sums_in_lanes for st in exe.schedule.steps)
    assert not any(st.pattern.terms_in_lanes for st in exe.schedule.steps)


@pytest.mark.parametrize("semiring, dtype", [("PROB", "float32"), ("LOGPROB", "float64"), ("COUNT", "int64")])
def test_other_dtypes_and_semirings_keep_the_terms_order(semiring, dtype):
    exe = compile_case(lane_sum_case("two leaves", semiring, dtype), "compiled", options=OPTIONS)
    assert not any(st.pattern.terms_in_lanes for st in exe.schedule.steps)


def test_the_cpu_sums_in_lanes_and_cuda_and_the_front_ends_models_in_order():
    """The front end's models keep within 1e-12 of exact mode's answers (docs/frontend.md),
    which Grids_11's 2^24-term total in lanes is not: test_frontend_mode.py."""
    assert plan_options("cpu", None, exact=False).lane_sums
    assert not plan_options("cuda", None, exact=False).lane_sums
    assert not model_options("cpu", False).lane_sums


@pytest.mark.parametrize("lanes", [True, False])
def test_save_and_load_keep_the_sums_in_lanes_or_in_order(tmp_path, lanes):
    """load() plans again with the saved choice, not the target's default: a front end
    model's plan sums in order (model_options), compile()'s in lanes. A file saved before
    sums in lanes (no field) loads summing in order, as it was planned."""
    import json

    import catbp_jit
    from catbp_jit.executable import SavedExecutableError

    case = lane_sum_case("two leaves")
    options = OPTIONS.with_(lane_sums=lanes)
    exe = compile_case(case, "compiled", options=options)
    exe.save(tmp_path / "exe.json")
    loaded = catbp_jit.load(tmp_path / "exe.json")
    assert loaded.plan.options.lane_sums is lanes
    assert [st.pattern for st in loaded.schedule.steps] == [st.pattern for st in exe.schedule.steps]
    assert any(st.pattern.terms_in_lanes for st in loaded.schedule.steps) is lanes
    assert_same_bits(
        bits(session_results(loaded.bind(), case.inputs[0])),
        bits(session_results(exe.bind(), case.inputs[0])),
    )
    doc = json.loads((tmp_path / "exe.json").read_text())
    del doc["lane_sums"]
    (tmp_path / "old.json").write_text(json.dumps(doc))
    if lanes:  # (planned in lanes, saved without the field: its kernels are not the plan's)
        with pytest.raises(SavedExecutableError, match="its kernels are not the ones"):
            catbp_jit.load(tmp_path / "old.json")
    else:
        assert not catbp_jit.load(tmp_path / "old.json").plan.options.lane_sums
