"""The reassociating mode (compile(..., exact=False)): plan/reassociate.py and plan/gemm.py.

The pass alone on hand-made segments (shapes, order, intermediates freed, left alone when it
does not pay); then whole executables against the reference VM on the corpus and on random
programs, within the tolerances of docs/ir.md (SAT and COUNT exactly), batched against unbatched,
and saved and loaded as what they are.
"""

from __future__ import annotations

from types import SimpleNamespace

import numba
import numpy as np
import opt_einsum
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Program, TensorSpec, abi
from catbp_jit.bundle import load_bundle
from catbp_jit.executable import plan
from catbp_jit.plan.arena import plan_memory
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.permuted import share_permuted
from catbp_jit.plan.pipeline import RESULT
from catbp_jit.plan.reassociate import (
    DP_MAX_SHARING,
    OPTIMAL_MAX_LEAVES,
    pairwise_plan,
    path_finder,
    reassociate,
)
from conftest import CORPUS
from jit_helpers import (
    assert_rows_equal,
    assert_same_slots,
    compare_slots,
    count_allocations,
    inputs,
    record,
    run_reference,
    session_results,
    settings,
    unbatched_rows,
)
from random_programs import (
    AB,
    AB2,
    AI,
    AJ,
    AK,
    cases,
    contract,
    elim,
    gemm_case,
    load,
    random_values,
    scale_case,
    store,
)

G = AxisType.GEOMETRIC


def ax(i: int, n: int) -> Axis:
    return Axis(i, G, n)


def spec(*axes: Axis) -> TensorSpec:
    return TensorSpec(tuple(axes))


I, J, K, L = ax(0, 4), ax(1, 5), ax(2, 6), ax(3, 7)  # noqa: E741 (index letters, as in einsum)


def chain_fused(normalize: bool = False) -> Fused:
    """out[i, l] = Σ_{j,k} a[i, j] b[j, k] c[k, l], one fused segment (value 3)."""
    specs = {0: spec(I, J), 1: spec(J, K), 2: spec(K, L), 3: spec(I, L)}
    seg = Segment(3, specs[3], (J, K), (0, 1, 2), True, normalize, (3,))
    kinds = {0: "factor", 1: "factor", 2: "factor", 3: "computed"}
    return Fused([seg], specs, kinds, {0: 0, 1: 1, 2: 2}, {("out",): 3}, "PROB")


def keys(s: TensorSpec) -> set:
    return {a.key for a in s.axes}


# ---------------------------------------------------------------------- the pass alone


def test_chain_becomes_pairwise_segments_summing_early():
    fused = chain_fused(normalize=True)
    out = reassociate(fused)
    assert fused.segments == chain_fused(True).segments  # pure: the argument is unchanged
    segs = out.segments
    assert len(segs) == 2 and all(len(s.leaves) <= 2 for s in segs)
    first, last = segs
    # a 4x5x6x7 chain: (b c) first costs 5*6*7 + 4*5*7, (a b) first 4*5*6 + 4*6*7: the latter
    assert set(first.leaves) == {0, 1} and {a.key for a in first.red_axes} == {J.key}
    assert keys(first.out_spec) == {I.key, K.key}
    assert out.kinds[first.out] == "computed" and out.specs[first.out] == first.out_spec
    assert first.out not in fused.specs and not first.normalize
    # the final segment is the original one's: value, spec, NORMALIZE
    assert last.out == 3 and last.out_spec == fused.segments[0].out_spec and last.normalize
    assert set(last.leaves) == {first.out, 2} and {a.key for a in last.red_axes} == {K.key}
    assert out.outputs == fused.outputs


def test_operands_joined_by_one_axis_past_the_bar_are_paired_greedily():
    """opt_einsum's dynamic programming takes 3-5x longer per operand that shares an
    axis with all the others (16 leaves f[c, a, b] summed over c: 9 minutes); past
    DP_MAX_SHARING such operands the path is greedy, and the pass still pairs them all.
    A long chain shares each axis two ways only: dynamic programming, however long."""
    chain = [frozenset({i, i + 1}) for i in range(30)]
    assert path_finder(chain) is opt_einsum.paths.dynamic_programming
    hub = [frozenset({"c", "a", "b"})] * (DP_MAX_SHARING + 1)
    assert path_finder(hub[:-1]) is opt_einsum.paths.dynamic_programming
    assert path_finder(hub) is opt_einsum.paths.greedy
    assert path_finder(hub[:OPTIMAL_MAX_LEAVES]) is opt_einsum.paths.optimal
    # the pass's path for 16 such leaves (the segment is then left whole: no split pays)
    steps = pairwise_plan(hub[:1] * 16, frozenset({"a", "b"}), {"a": 4, "b": 64, "c": 3})
    assert len(steps) == 15 and all(len(st.picked) == 2 for st in steps)


def test_intermediates_are_workspace_freed_after_their_reader():
    out = reassociate(chain_fused())
    mem = plan_memory(out, 8)
    tmp = out.segments[0].out
    assert mem.regions[tmp].cls == "workspace"
    assert mem.intervals[tmp].start == 0 and mem.intervals[tmp].end == 1


def test_private_axes_are_summed_out_first():
    """out[i] = Σ_{j,k} a[i, j] b[j, k]: b's k is summed out alone, then a pairwise step."""
    specs = {0: spec(I, J), 1: spec(J, K), 2: spec(I)}
    seg = Segment(2, specs[2], (J, K), (0, 1), True, False, (2,))
    fused = Fused(
        [seg], specs, {0: "factor", 1: "factor", 2: "computed"}, {0: 0, 1: 1}, {("out",): 2}, "LOGPROB"
    )
    segs = reassociate(fused).segments
    assert [s.leaves[:1] for s in segs] == [(1,), (0,)]
    assert keys(segs[0].out_spec) == {J.key} and {a.key for a in segs[0].red_axes} == {K.key}
    assert segs[1].out == 2 and {a.key for a in segs[1].red_axes} == {J.key}


def test_own_axes_stored_outermost_are_carried_into_the_product():
    """An input's private axes stored before its shared ones would be summed from far
    apart: they are summed in the first pairwise step instead of alone."""
    specs = {0: spec(K, J), 1: spec(I, J), 2: spec(I)}
    seg = Segment(2, specs[2], (J, K), (0, 1), True, False, (2,))
    fused = Fused(
        [seg], specs, {0: "factor", 1: "factor", 2: "computed"}, {0: 0, 1: 1}, {("out",): 2}, "PROB"
    )
    assert reassociate(fused).segments == [seg]  # one pairwise step: the segment itself


def summed_alike_fused(d: TensorSpec) -> Fused:
    """v3 = a ⊗ b over (I, J, K), a workspace value with two readers, each keeping (I, J):
    out4 = Σ_k c[i] v3[i, j, k] and out5 = Σ_k d v3[i, j, k]."""
    specs = {0: spec(I, J, K), 1: spec(I, J, K), 2: spec(I), 6: d, 3: spec(I, J, K)}
    specs[4] = specs[5] = spec(I, J)
    product = Segment(3, specs[3], (), (0, 1), False, False, (3,))
    first = Segment(4, specs[4], (K,), (2, 3), True, False, (4,))
    second = Segment(5, specs[5], (K,), (6, 3), True, False, (5,))
    kinds = {v: "factor" for v in (0, 1, 2, 6)} | {3: "computed", 4: "computed", 5: "computed"}
    return Fused([product, first, second], specs, kinds, {}, {("x",): 4, ("y",): 5}, "PROB")


def test_a_value_its_readers_all_sum_alike_is_summed_alone():
    """Both readers sum v3's private K out (d = (I, J) lacks it too): K alone first in
    each reader's path, the same sum, computed once (here the paths' intermediates are
    shared as they are; in other axis orders plan/permuted.py shares them)."""
    out = share_permuted(reassociate(summed_alike_fused(spec(I, J))))
    (total,) = [s for s in out.segments if s.leaves == (3,)]
    assert [a.key for a in total.red_axes] == [K.key]
    assert {s.out for s in out.segments if total.out in s.leaves} == {4, 5}


def test_a_value_its_readers_sum_otherwise_is_carried_into_the_product():
    """d = (I, K) has K: v3 has no private axis in the second reader, which the first
    sums K from: not alike, and v3's layout is not known yet (two readers)."""
    out = reassociate(summed_alike_fused(spec(I, K)))
    assert not [s for s in out.segments if s.leaves == (3,)]


def test_left_alone_when_it_does_not_pay():
    """A product of three leaves over the same axes, nothing reduced: pairwise steps would
    write and read an intermediate as large as the output."""
    specs = {0: spec(I, J), 1: spec(I, J), 2: spec(J, I), 3: spec(I, J)}
    seg = Segment(3, specs[3], (), (0, 1, 2), False, False, (3,))
    fused = Fused(
        [seg],
        specs,
        {0: "factor", 1: "factor", 2: "factor", 3: "computed"},
        {0: 0, 1: 1, 2: 2},
        {("out",): 3},
        "PROB",
    )
    assert reassociate(fused).segments == [seg]


def test_batch_axis_is_innermost_and_paths_ignore_its_size():
    B = Axis(9, G, 64)
    specs = {0: spec(I, J, B), 1: spec(J, K), 2: spec(K, L), 3: spec(I, L, B)}
    seg = Segment(3, specs[3], (J, K), (0, 1, 2), True, False, (3,))
    fused = Fused(
        [seg],
        specs,
        {0: "factor", 1: "factor", 2: "factor", 3: "computed"},
        {0: 0, 1: 1, 2: 2},
        {("out",): 3},
        "PROB",
    )
    segs = reassociate(fused, batch_key=B.key).segments
    plain = reassociate(chain_fused()).segments
    assert [set(s.leaves) for s in segs] == [set(s.leaves) for s in plain]
    for s in segs[:-1]:
        if s.out_spec.has_key(B.key):
            assert s.out_spec.axes[-1].key == B.key


# ------------------------------------------------------------------- against the reference


def compile_bundle(b, exact=False, **kw):
    return catbp_jit.compile(
        b.programs,
        b.semiring_runtime(),
        factor_specs=b.factor_specs(),
        selector_specs=b.selector_specs(),
        exact=exact,
        **kw,
    )


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus_within_tolerance(path):
    b = load_bundle(path)
    exe = compile_bundle(b)
    assert exe.plan.options.exact is False
    factors, selectors = inputs(b)
    compare_slots(exe.bind().run(factors=factors, selectors=selectors), b)


def test_reassociation_happens_on_the_corpus():
    """Not a vacuous mode: some corpus program is regrouped."""
    grown = 0
    for path in CORPUS:
        b = load_bundle(path)
        args = (b.programs, b.semiring_runtime())
        kw = dict(factor_specs=b.factor_specs(), selector_specs=b.selector_specs())
        grown += len(plan(*args, exact=False, **kw).fused.segments) > len(plan(*args, **kw).fused.segments)
    assert grown > 0


@settings(150)
@given(cases())
def test_random_programs(case):
    note(case.listing())
    record(case)
    exe = catbp_jit.compile(
        case.programs,
        case.sr(),
        factor_specs=case.factor_specs,
        selector_specs=case.selector_specs,
        slot_specs=case.slot_specs or None,
        mode="loop",
        exact=False,
    )
    sess = exe.bind()
    for which in range(len(case.inputs)):
        got = session_results(sess, case.inputs[which])
        assert_same_slots(run_reference(case, which), got, case, f"exact=False, inputs {which}")


def test_axes_no_leaf_has_stay_on_the_last_segment():
    """Regression: Σ_{i,k} of a product broadcast over k (no leaf has it) counts each term
    once per k; the pass dropped k and so the factor |k| (hypothesis: PROB Z half of it)."""
    specs = {0: spec(I, J), 1: spec(J), 2: spec(J), 3: spec()}
    seg = Segment(3, specs[3], (I, J, K), (0, 1, 2), True, False, (3,))
    fused = Fused(
        [seg],
        specs,
        {0: "factor", 1: "factor", 2: "factor", 3: "computed"},
        {0: 0, 1: 1, 2: 2},
        {("out",): 3},
        "PROB",
    )
    last = reassociate(fused).segments[-1]
    assert last.out == 3 and K.key in {a.key for a in last.red_axes}
    out = Fused(
        [Segment(3, spec(I, K), (J,), (0, 1, 2), True, False, (3,))],
        {**specs, 3: spec(I, K)},
        fused.kinds,
        fused.attrs,
        fused.outputs,
        "PROB",
    )
    last = reassociate(out).segments[-1]
    assert last.out_spec == spec(I, K) and {a.key for a in last.red_axes} <= {J.key}


# --------------------------------------------------------------------------------- GEMM

# these cases' products are test-sized: any of them may be a GEMM step (by default a program
# whose contractions are all small does not compile the GEMM kernel for them)
ANY_GEMM = catbp_jit.PlanOptions(gemm_program_min_terms=1)


def run_gemm_case(case, gemm_steps=1, options=ANY_GEMM):
    exe = catbp_jit.compile(
        case.programs, case.sr(), factor_specs=case.factor_specs, exact=False, options=options
    )
    chosen = [st for st in exe.schedule.steps if st.pattern.template == "gemm"]
    assert len(chosen) == gemm_steps, exe.as_text()
    got = session_results(exe.bind(), case.inputs[0])
    assert_same_slots(run_reference(case), got, case, "gemm")
    return exe


@pytest.mark.parametrize(
    "a_axes, b_axes, keep",
    [
        ((AI, AK), (AK, AJ), (AI, AJ)),  # C-order leaves
        ((AK, AI), (AJ, AK), (AI, AJ)),  # both transposed
        ((AI, AK), (AK, AJ), (AJ, AI)),  # out^T = b^T a^T
        ((AB, AI, AK), (AB, AK, AJ), (AB, AI, AJ)),  # a batch axis outermost
    ],
    ids=["cc", "ff", "swapped", "batched"],
)
def test_gemm_prob(a_axes, b_axes, keep):
    run_gemm_case(gemm_case("PROB", "float64", a_axes, b_axes, keep))


def test_gemm_prob_float32_normalized():
    run_gemm_case(gemm_case("PROB", "float32", (AI, AK), (AK, AJ), (AI, AJ), norm=True))


# products that outnumber their operands' elements (64 x 64 of k = 8): a normalized GEMM
# step's total then comes from the operands and scales the products in the BLAS call
FI, FJ, FK = Axis(30, G, 64), Axis(31, G, 64), Axis(32, G, 8)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_normalized_gemm_step_scales_its_products_by_its_operands_total(dtype):
    """Σ_k a ⊗ b normalized, its total as Σ_k (Σ_i a[i][k]) (Σ_j b[k][j]) and each product
    times its reciprocal in the BLAS call (codegen/cpu_gemm.py): the reference's answer
    within this mode's tolerance, and numpy's (a @ b) / total within a few ulps."""
    case = gemm_case("PROB", dtype, (FI, FK), (FK, FJ), (FI, FJ), norm=True)
    exe = run_gemm_case(case)
    got = session_results(exe.bind(), case.inputs[0])[("out",)][0]
    a, b = (case.inputs[0].factors[f].astype(np.float64) for f in (0, 1))
    want = (a @ b) / (a @ b).sum()
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(dtype).eps)


def test_a_normalized_gemm_steps_kept_total_is_its_operands_total():
    """The front end's scaled tensor (t = Σ_k a ⊗ b, its total stored, t normalized): the
    stored total is the operands' (within rounding of the products' sum), and t is each
    product times its reciprocal, bit for bit (BLAS's alpha), not the product divided by
    it: the products come from the same step without the NORMALIZE."""
    case = scale_case("PROB", seed=3, axes=(FI, FK, FJ))
    got = session_results(run_gemm_case(case).bind(), case.inputs[0])
    total, t = float(got[("scale",)][0]), got[("t",)][0]
    factors = case.inputs[0].factors
    same = iter((factors[0], factors[1]))
    plain = gemm_case("PROB", "float64", (FI, FK), (FK, FJ), (FI, FJ), values=lambda shape: next(same))
    products = session_results(run_gemm_case(plain).bind(), plain.inputs[0])[("out",)][0]
    assert abs(total / products.sum() - 1.0) < 1e-13
    assert np.array_equal(t, products * (1.0 / total))
    assert not np.array_equal(t, products / total)


@pytest.mark.parametrize("poison", ["zeros", "inf", "nan"])
def test_a_normalized_gemm_step_whose_operands_total_is_no_safe_number_divides_as_before(poison):
    """A total of 0, inf or NaN from the operands scales nothing: the products' own total
    and division stand, as the reference's NORMALIZE gives them (zeros stay zeros; inf and
    NaN where the reference has them)."""
    case = gemm_case("PROB", "float64", (FI, FK), (FK, FJ), (FI, FJ), norm=True)
    a = case.inputs[0].factors[0]
    if poison == "zeros":
        a[:] = 0.0
    else:
        a[5, 3] = np.inf if poison == "inf" else np.nan
    run_gemm_case(case)


def logprob_values(rng):
    """Log-potentials with -inf entries, an all -inf row and column, and a spread that
    underflows the shifted exponentials (those elements are summed directly)."""

    def make(shape):
        x = rng.normal(0.0, 3.0, shape)
        x[rng.random(shape) < 0.3] = -np.inf
        x[0] = -np.inf
        x[..., 1] = -np.inf
        x[2, 2] = 900.0
        x[min(3, len(x) - 1)] -= 2000.0
        return x

    return make


@pytest.mark.parametrize("norm", [False, True])
def test_gemm_logprob_with_minus_inf(norm):
    rng = np.random.default_rng(1)
    case = gemm_case(
        "LOGPROB", "float64", (AI, AK), (AK, AJ), (AI, AJ), norm=norm, values=logprob_values(rng)
    )
    exe = run_gemm_case(case)
    assert exe.memory.scratch  # the exponentials' workspace


# operands that are no matrices in memory: copied into the workspace (or out of it) around
# the GEMM; (a axes, b axes, kept axes, copies expected: the result in its spec's order, and
# as the GEMM writes it: plan/layout.py)
COPIED = [
    ((AI, AK, AB), (AK, AJ), (AI, AB, AJ), 1, 1),  # a's rows split by k
    ((AI, AB, AK), (AK, AJ), (AI, AJ, AB), 1, 0),  # the output's rows split by a column
    ((AK, AI, AB), (AJ, AB, AK), (AJ, AI, AB), 3, 2),  # a batch axis innermost: all three
    ((AI, AK, AB), (AB, AK, AJ), (AJ, AB, AI), 2, 1),  # a and the output
]


@pytest.mark.parametrize(
    "a_axes, b_axes, keep, copies, laid_out", COPIED, ids=["a", "out", "batch", "a-and-out"]
)
@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB"])
def test_gemm_copies_operands_into_matrices(a_axes, b_axes, keep, copies, laid_out, semiring):
    """...and the result lies as the GEMM writes its products unless gemm_result_layouts
    is off: its slot is then a view in its spec's order, not C-contiguous."""
    rng = np.random.default_rng(3)
    values = logprob_values(rng) if semiring == "LOGPROB" else None
    case = gemm_case(semiring, "float64", a_axes, b_axes, keep, norm=True, values=values)
    for options, want in ((ANY_GEMM.with_(gemm_result_layouts=False), copies), (ANY_GEMM, laid_out)):
        exe = run_gemm_case(case, options=options)
        (step,) = [st for st in exe.schedule.steps if st.pattern.template == "gemm"]
        assert len(step.params.before) + len(step.params.after) == want, exe.as_text()
        assert bool(exe.memory.scratch) == (want > 0 or semiring == "LOGPROB")  # the copies' matrices
        (result,) = exe.plan.bound(RESULT)
        assert (result.layout is not None) == (want < copies)
        assert ("stored as" in exe.as_text()) == (want < copies)
        view = exe.bind().run(factors=case.inputs[0].factors)[("out",)][0]
        assert view.flags.c_contiguous == (want == copies)


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB"])
def test_gemm_copies_of_binary_axes_are_grouped(semiring):
    """A grid's contraction: binary axes interleaved so that a, b and the output are no
    matrices, their densest axes 2 elements each: copies of GroupedCopy blocks of several
    axes (plan/copies.py; one whose last axis is dense on both sides stays strided), and
    the results are the reference's."""
    i, k, j = ([ax(10 * g + x, 2) for x in range(4)] for g in range(1, 4))
    b = [ax(40, 2), ax(41, 2)]
    a_axes = (i[0], k[0], b[0], i[1], k[1], i[2], k[3], b[1], k[2], i[3])
    b_axes = (k[2], j[0], b[1], k[0], j[3], j[1], b[0], k[1], j[2], k[3])
    keep = (j[0], i[0], j[1], b[0], i[3], i[1], j[2], b[1], i[2], j[3])
    rng = np.random.default_rng(5)

    def log_values(shape):  # (-inf entries; logprob_values indexes past binary axes)
        x = rng.normal(0.0, 3.0, shape)
        x[rng.random(shape) < 0.2] = -np.inf
        return x

    values = log_values if semiring == "LOGPROB" else None
    case = gemm_case(semiring, "float64", a_axes, b_axes, keep, norm=True, values=values)
    options = ANY_GEMM.with_(gemm_result_layouts=False)  # (the output copied out too)
    exe = run_gemm_case(case, options=options)
    (step,) = [st for st in exe.schedule.steps if st.pattern.template == "gemm"]
    copies = step.params.before + step.params.after
    assert len(copies) == 3 and sum(isinstance(c, abi.GroupedCopy) for c in copies) >= 2, copies


def test_gemm_copies_float32():
    run_gemm_case(gemm_case("PROB", "float32", (AI, AK, AB), (AK, AJ), (AI, AB, AJ), norm=True))


def test_gemm_without_copies_when_they_would_not_fit():
    """The copies' workspace is what a plan near the memory limit cannot afford: the
    planner then keeps the loop kernel for such products (and says so in its options)."""
    case = gemm_case("PROB", "float64", (AI, AK, AB), (AK, AJ), (AI, AB, AJ))
    roomy = catbp_jit.compile(
        case.programs, case.sr(), factor_specs=case.factor_specs, exact=False, options=ANY_GEMM
    )
    values = roomy.memory.total_bytes - roomy.memory.scratch[0].size * 8
    tight = catbp_jit.compile(
        case.programs,
        case.sr(),
        factor_specs=case.factor_specs,
        exact=False,
        max_total_bytes=values,
        options=ANY_GEMM,
    )
    assert not tight.plan.options.gemm_copies
    assert all(st.pattern.template != "gemm" for st in tight.schedule.steps)
    assert_same_slots(run_reference(case), session_results(tight.bind(), case.inputs[0]), case, "tight")


def test_a_program_of_small_contractions_compiles_no_gemm_kernel():
    """A program runs GEMM steps only where one of its contractions has
    gemm_program_min_terms terms: the GEMM kernel costs about a second to compile, which
    small ones do not pay back. Below the bar the product runs in the loop kernels (the
    planner says so in its options), with the reference's values within rounding."""
    case = gemm_case("PROB", "float64", (AI, AK), (AK, AJ), (AI, AJ))
    terms = AI.size * AK.size * AJ.size
    kw = dict(factor_specs=case.factor_specs, exact=False)

    def gemm_steps(options):
        p = plan(case.programs, case.sr(), options=options, **kw)
        return sum(st.pattern.template == "gemm" for st in p.schedule.steps), p.options.gemm

    assert terms < catbp_jit.PlanOptions().gemm_program_min_terms
    assert gemm_steps(None) == (0, False)
    assert gemm_steps(catbp_jit.PlanOptions(gemm_program_min_terms=terms)) == (1, True)
    assert gemm_steps(catbp_jit.PlanOptions(gemm_program_min_terms=terms + 1)) == (0, False)
    exe = catbp_jit.compile(case.programs, case.sr(), **kw)
    assert_same_slots(run_reference(case), session_results(exe.bind(), case.inputs[0]), case, "loop")


def test_sat_and_count_keep_loop_kernels():
    for semiring, dtype in (("SAT", "bool"), ("COUNT", "int64")):
        case = gemm_case(
            semiring,
            dtype,
            (AI, AK),
            (AK, AJ),
            (AI, AJ),
            values=lambda shape: np.random.default_rng(2).integers(0, 3, shape),
        )
        run_gemm_case(case, gemm_steps=0)


def test_exact_mode_has_no_gemm():
    case = gemm_case("PROB", "float64", (AI, AK), (AK, AJ), (AI, AJ))
    exe = catbp_jit.compile(case.programs, case.sr(), factor_specs=case.factor_specs)
    assert all(st.pattern.template != "gemm" for st in exe.schedule.steps)


# ---------------------------------------------------------------- batched, saved, front end


@settings(60)
@given(cases(), st.integers(0, 2**32 - 1))
def test_batched_equals_unbatched(case, seed):
    """Paths are chosen with the batch axis counted as size 1, so every bucket regroups as
    the unbatched program does: row by row the same results."""
    if not case.factor_specs:
        event("no factor to batch")
        return
    note(case.listing())
    bf = set(case.factor_specs)
    kw = dict(
        factor_specs=case.factor_specs,
        selector_specs=case.selector_specs,
        slot_specs=case.slot_specs or None,
        mode="loop",
        exact=False,
    )
    plain = catbp_jit.compile(case.programs, case.sr(), **kw).bind()
    try:
        sess = catbp_jit.compile(case.programs, case.sr(), batched_factors=bf, buckets=(3,), **kw).bind()
    except catbp_jit.ir.batch.BatchedCompileError:
        event("refused: a slot batched at one write, not at another")
        return
    rng = np.random.default_rng(seed)
    base = case.inputs[0]
    factors = {
        k: np.stack([random_values(rng, case.factor_specs[k], case.semiring, case.dtype) for _ in range(3)])
        for k in bf
    }
    with np.errstate(all="ignore"):
        want = unbatched_rows(plain, factors, base.selectors, base.slots, bf, set(), 3)
    got = sess.run(factors=factors, selectors=base.selectors, slots=base.slots)
    assert_rows_equal(got, want, sess.batched_slots, case.semiring, case.dtype)


def test_a_batched_leaf_sums_its_own_axes_as_the_unbatched_one_does():
    """Found by test_batched_equals_unbatched: Z = Σ_l s·f[l] with s = Σ_l f[l]. Unbatched,
    f's own axis l is its innermost, so the path sums f alone first (Z = s·Σ_l f[l]); batched,
    the batch axis is stored after l, and the layout test counted it, so the segment was
    left fused (Σ_l s·f[l]): other rounding in float32, row by row."""
    A = ax(0, 1), ax(1, 4)
    f_spec, l_spec = spec(*A), spec(A[1])
    finalize = Program(
        (
            load(0, 0),
            contract(1, [0], l_spec),
            elim(2, 1, []),
            contract(3, [2, 0], l_spec),
            elim(4, 3, []),
            store(("Z",), 4),
        ),
        name="finalize",
    )
    sr = catbp_jit.make_semiring("PROB", np.dtype("float32"))
    kw = dict(factor_specs={0: f_spec}, selector_specs={}, mode="loop", exact=False)
    plain = catbp_jit.compile([finalize], sr, **kw).bind()
    batched = catbp_jit.compile([finalize], sr, batched_factors={0}, buckets=(3,), **kw).bind()
    rng = np.random.default_rng(0)
    for _ in range(50):  # most draws told the two groupings apart
        f = (rng.random((3, 1, 4)) * 2).astype(np.float32)
        got = batched.run(factors={0: f})[("Z",)][0].copy()
        want = [plain.run(factors={0: f[i]})[("Z",)][0].copy() for i in range(3)]
        assert np.array_equal(got, np.array(want)), (got, want)


def test_save_and_load_keep_the_mode(tmp_path):
    case = gemm_case("PROB", "float64", (AI, AK), (AK, AJ), (AI, AJ))
    for exact in (True, False):
        exe = catbp_jit.compile(case.programs, case.sr(), factor_specs=case.factor_specs, exact=exact)
        exe.save(tmp_path / "exe.json")
        loaded = catbp_jit.load(tmp_path / "exe.json")
        assert loaded.plan.options.exact is exact
        assert [st.pattern for st in loaded.schedule.steps] == [st.pattern for st in exe.schedule.steps]
        f = case.inputs[0].factors
        a, b = exe.bind().run(factors=f), loaded.bind().run(factors=f)
        assert np.array_equal(a[("out",)][0], b[("out",)][0])


def test_load_refuses_a_mode_that_is_not_a_boolean(tmp_path):
    import json

    case = gemm_case("PROB", "float64", (AI, AK), (AK, AJ), (AI, AJ))
    catbp_jit.compile(case.programs, case.sr(), factor_specs=case.factor_specs, exact=False).save(
        tmp_path / "exe.json"
    )
    doc = json.loads((tmp_path / "exe.json").read_text())
    doc["exact"] = "no"
    (tmp_path / "exe.json").write_text(json.dumps(doc))
    with pytest.raises(catbp_jit.executable.SavedExecutableError, match="'exact'"):
        catbp_jit.load(tmp_path / "exe.json")


def test_compile_model_passes_the_mode_down():
    from catbp_jit.frontend import factor_graph

    rng = np.random.default_rng(3)
    n = 6
    graph = factor_graph(
        {f"x{i}": 3 for i in range(n)},
        [((f"x{i}", f"x{(i + 1) % n}"), rng.uniform(0.1, 1, (3, 3))) for i in range(n)],
        name="ring6",
    )
    exact = catbp_jit.compile_model(graph, "prob", exact=True)
    loose = catbp_jit.compile_model(graph, "prob", exact=False)
    default = catbp_jit.compile_model(graph, "prob")  # the CPU's choice: reassociating
    assert loose.executable.plan.options.exact is False
    assert default.executable.plan.options.exact is False
    assert exact.executable.plan.options.exact is True
    a, b = exact.solve(), loose.solve()
    assert np.isclose(a.Z, b.Z, rtol=1e-9)


def test_cuda_plans_reassociate_without_gemm():
    """GEMM is a CPU kernel: a CUDA plan keeps loop kernels, even with options that ask."""
    case = gemm_case("PROB", "float64", (AI, AK), (AK, AJ), (AI, AJ))
    kw = dict(factor_specs=case.factor_specs, exact=False)

    def templates(p):
        return {st.pattern.template for st in p.schedule.steps}

    assert "gemm" in templates(plan(case.programs, case.sr(), options=ANY_GEMM, **kw))
    assert templates(plan(case.programs, case.sr(), target="cuda", **kw)) == {"contract_reduce"}
    assert templates(plan(case.programs, case.sr(), target="cuda", options=ANY_GEMM, **kw)) == {
        "contract_reduce"
    }


@st.composite
def matrix_products(draw):
    """Σ_k a ⊗ b with random groups of row, column, summed and batch axes (0-2 each,
    sizes 1-4), each operand's axes in a random order, PROB or LOGPROB, maybe normalized."""
    sizes = iter(draw(st.lists(st.integers(1, 4), min_size=8, max_size=8)))
    counter = iter(range(20, 40))

    def group():
        return [ax(next(counter), next(sizes)) for _ in range(draw(st.integers(0, 2)))]

    rows, cols, ks, batch = group(), group(), group(), group()
    if not any(x.size > 1 for x in ks):
        ks.append(ax(next(counter), 3))

    def order(axes):
        return tuple(draw(st.permutations(axes)))

    semiring, dtype = draw(
        st.sampled_from([("PROB", "float64"), ("PROB", "float32"), ("LOGPROB", "float64")])
    )
    values = (
        logprob_values_small(np.random.default_rng(draw(st.integers(0, 99))))
        if semiring == "LOGPROB"
        else None
    )
    return gemm_case(
        semiring,
        dtype,
        order(batch + rows + ks),
        order(batch + ks + cols),
        order(batch + rows + cols),
        norm=draw(st.booleans()),
        values=values,
        seed=draw(st.integers(0, 99)),
    )


def logprob_values_small(rng):
    def make(shape):
        x = rng.normal(0.0, 3.0, shape)
        x[rng.random(shape) < 0.3] = -np.inf
        x[rng.random(shape) < 0.1] = rng.choice([-800.0, 800.0])  # underflowing shifts
        return x

    return make


@settings(80)
@given(matrix_products())
def test_random_matrix_products_with_gemm_at_every_size(case):
    """GEMM steps at any size (plan/gemm.MIN_WORK lifted): transposed operands, batch
    axes, NORMALIZE, -inf entries and far-apart terms, against the reference."""
    import catbp_jit.plan.gemm as gemm

    note(case.listing())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemm, "MIN_WORK", 1)
        mp.setattr(gemm, "MIN_REUSE", 0)
        exe = catbp_jit.compile(
            case.programs,
            case.sr(),
            factor_specs=case.factor_specs,
            mode="loop",
            exact=False,
            options=ANY_GEMM,
        )
    event("GEMM" if any(st.pattern.template == "gemm" for st in exe.schedule.steps) else "loop kernels")
    got = session_results(exe.bind(), case.inputs[0])
    assert_same_slots(run_reference(case), got, case, "gemm")


def test_an_intermediate_two_segments_need_is_computed_once():
    """Two sums over a[j, i, k] b[j] and a[j, i, k] c[j, l]: both first sum a's private axes
    (i, k, stored innermost) out; the second segment reads the first one's intermediate."""
    specs = {0: spec(J, I, K), 1: spec(J), 2: spec(J, L), 3: spec(), 4: spec(L)}
    segs = [
        Segment(3, specs[3], (I, J, K), (0, 1), True, False, (3,)),
        Segment(4, specs[4], (I, J, K), (0, 2), True, False, (4,)),
    ]
    fused = Fused(
        segs,
        specs,
        {0: "factor", 1: "factor", 2: "factor", 3: "computed", 4: "computed"},
        {0: 0, 1: 1, 2: 2},
        {("x",): 3, ("y",): 4},
        "PROB",
    )
    out = reassociate(fused).segments
    pre = [s for s in out if s.leaves == (0,)]
    assert len(pre) == 1 and keys(pre[0].out_spec) == {J.key}
    assert [s.out for s in out][-2:] == [3, 4]
    assert pre[0].out in out[-1].leaves and pre[0].out in out[-2].leaves
    mem = plan_memory(reassociate(fused), 8)
    assert mem.intervals[pre[0].out].end == len(out) - 1  # live until its last reader


def no_allocation_and_one_thread(sess, case):
    """Checks that a run of a parallel kernel's session allocates nothing; its results on
    one thread."""
    np_count, per_run = count_allocations(sess, case.inputs[0].factors, {}, 3)
    assert np_count.allocations == 0 and set(per_run) == {0}, (np_count, per_run)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return session_results(sess, case.inputs[0])
    finally:
        numba.set_num_threads(threads)


@pytest.mark.parametrize(
    "a_axes, b_axes, keep, copies",
    [
        ((AB, AB2, AI, AK), (AB, AB2, AK, AJ), (AB, AB2, AI, AJ), 0),  # matrices in place
        ((AK, AI, AB, AB2), (AJ, AB, AB2, AK), (AJ, AI, AB, AB2), 3),  # all three copied
    ],
    ids=["in-place", "copied"],
)
# (LOGPROB's parallel GEMM kernel takes ~8 s to compile: with the slow tests)
@pytest.mark.parametrize("semiring", ["PROB", pytest.param("LOGPROB", marks=pytest.mark.slow)])
def test_gemm_steps_of_many_small_products_run_on_all_threads(a_axes, b_axes, keep, copies, semiring):
    """A GEMM step of 12 small products made parallel (its batch positions, its copies'
    blocks and its normalization's division shared by the threads; LOGPROB's positions in
    parts with a workspace each): the serial step's bits, on one thread as on two, and no
    allocation per run."""
    case = gemm_case(semiring, "float64", a_axes, b_axes, keep, norm=True)
    runs = {}
    for min_work in (1, catbp_jit.PlanOptions().gemm_parallel_min_work):
        options = catbp_jit.PlanOptions(
            exact=False, gemm_parallel_min_work=min_work, gemm_result_layouts=False
        )
        exe = catbp_jit.compile(
            case.programs, case.sr(), factor_specs=case.factor_specs, mode="loop", options=options
        )
        (step,) = [st for st in exe.schedule.steps if st.pattern.template == "gemm"]
        assert len(step.params.before) + len(step.params.after) == copies
        sess = exe.bind()
        runs[step.pattern.parallel] = session_results(sess, case.inputs[0])
        if step.pattern.parallel:
            alone = no_allocation_and_one_thread(sess, case)
    assert set(runs) == {True, False}
    (key,) = runs[True]
    got, want = runs[True][key][0], runs[False][key][0]
    assert np.array_equal(got.view(np.uint8), alone[key][0].view(np.uint8))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("semiring", ["PROB", pytest.param("LOGPROB", marks=pytest.mark.slow)])
def test_a_gemm_step_of_large_products_shares_only_its_copies_and_normalize(semiring):
    """A step whose products BLAS runs on its own threads (its batch positions one at a
    time: GemmParams.parallel_batch off) but which moves enough elements to share its
    copies and NORMALIZE passes among the threads (a parallel kernel): the serial
    kernel's bits, on one thread as on two, and no allocation per run."""
    case = gemm_case(semiring, "float64", (AK, AI, AB, AB2), (AJ, AB, AB2, AK), (AJ, AI, AB, AB2), norm=True)
    runs = {}
    for threads_min in (1 << 40, 1):
        options = catbp_jit.PlanOptions(
            exact=False,
            gemm_parallel_min_work=1 << 40,
            gemm_threads_min_elements=threads_min,
            gemm_result_layouts=False,
        )
        exe = catbp_jit.compile(
            case.programs, case.sr(), factor_specs=case.factor_specs, mode="loop", options=options
        )
        (step,) = [st for st in exe.schedule.steps if st.pattern.template == "gemm"]
        assert not step.params.parallel_batch and len(step.params.before) + len(step.params.after) == 3
        assert step.pattern.parallel == (threads_min == 1)
        sess = exe.bind()
        runs[step.pattern.parallel] = session_results(sess, case.inputs[0])
    alone = no_allocation_and_one_thread(sess, case)
    (key,) = runs[True]
    got, want = runs[True][key][0], runs[False][key][0]
    assert np.array_equal(got.view(np.uint8), alone[key][0].view(np.uint8))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_a_run_of_small_parallel_gemm_products_keeps_blas_on_one_thread():
    """BLAS splits even a small product among threads of its own, which on top of a
    parallel GEMM step's own threads oversubscribe the cores (catbp_jit/blas_threads.py):
    a run whose GEMM steps are small products, some parallel, sets every BLAS library to
    one thread and puts them back after; a run without parallel steps, or with a large
    product, leaves them."""
    from threadpoolctl import threadpool_info

    from catbp_jit.blas_threads import SMALL_PRODUCT, wants_one_thread

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    case = gemm_case("PROB", "float64", (AB, AB2, AI, AK), (AB, AB2, AK, AJ), (AB, AB2, AI, AJ))
    specs = case.factor_specs
    parallel = catbp_jit.PlanOptions(exact=False, gemm_parallel_min_work=1)
    exe = catbp_jit.compile(case.programs, case.sr(), factor_specs=specs, mode="loop", options=parallel)
    assert wants_one_thread(exe.schedule)
    seen = []
    sess = exe.bind(before=lambda i, step: seen.append(blas_threads()))
    outside = blas_threads()
    sess.run(factors=case.inputs[0].factors)
    assert seen and all(set(s) == {1} for s in seen) and blas_threads() == outside
    serial = catbp_jit.compile(case.programs, case.sr(), factor_specs=specs, exact=False)
    assert not wants_one_thread(serial.schedule)  # no parallel GEMM step
    i, k, j = (Axis(15 + d, AxisType.GEOMETRIC, 257) for d in range(3))  # 257^3 multiply-adds
    assert 257**3 > SMALL_PRODUCT
    large = gemm_case("PROB", "float64", (i, k), (k, j), (i, j))
    big = catbp_jit.compile(large.programs, large.sr(), factor_specs=large.factor_specs, exact=False)
    assert any(st.pattern.template == "gemm" for st in big.schedule.steps)
    both = SimpleNamespace(steps=exe.schedule.steps + big.schedule.steps)  # small parallel + large
    assert not wants_one_thread(both)


def test_runs_inside_at_once_put_blas_back_as_the_first_found_it():
    """Sessions running at once in several threads share BLAS's process-wide thread
    counts: the first run in saves them, the last one out puts them back."""
    from threadpoolctl import threadpool_info

    from catbp_jit.blas_threads import OneBlasThread

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    a, b = OneBlasThread(), OneBlasThread()
    before = blas_threads()
    a.enter()
    b.enter()
    a.exit()  # b is still inside: one thread still
    assert set(blas_threads()) == {1}
    b.exit()
    assert blas_threads() == before
