"""Split reductions (PlanOptions(exact=False, split_reductions=True)): plan/split.py.

The pass alone on a hand-made segment (which axes it keeps, where NORMALIZE goes, a batch
axis innermost and counted as 1, left alone when it does not pay); then whole executables
against the reference VM on random programs and the corpus, within the tolerances of
docs/ir.md (SAT and COUNT exactly), batched against unbatched, saved and loaded. The CPU
and CUDA targets agreeing on a split plan is checked in test_cuda_kernels.py.
"""

from __future__ import annotations

import json
from dataclasses import replace
from math import prod

import numpy as np
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, TensorSpec
from catbp_jit.bundle import load_bundle
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.options import PlanOptions
from catbp_jit.plan.split import TARGET_ITEMS, split_reductions
from catbp_jit.saved import SavedExecutableError
from conftest import CORPUS
from jit_helpers import (
    assert_rows_equal,
    assert_same_slots,
    compare_slots,
    compile_case,
    inputs,
    run_reference,
    session_results,
    settings,
    unbatched_rows,
)
from random_programs import cases, random_values

G = AxisType.GEOMETRIC
SPLIT = PlanOptions(exact=False, split_reductions=True, split_min_terms=4)  # splits small programs too


def ax(i: int, n: int) -> Axis:
    return Axis(i, G, n)


OUT, R1, R2, R3 = ax(0, 3), ax(1, 64), ax(2, 64), ax(3, 16)


def big_sum(normalize: bool = False, out=(OUT,)) -> Fused:
    """out[o] = Σ_{r1,r2,r3} a[r1, r2, o, r3] ⊗ b[r3]: 3 outputs of 65,536 terms each."""
    specs = {0: TensorSpec((R1, R2, OUT, R3)), 1: TensorSpec((R3,)), 2: TensorSpec(tuple(out))}
    seg = Segment(2, specs[2], (R1, R2, R3), (0, 1), True, normalize, (2,))
    kinds = {0: "factor", 1: "factor", 2: "computed"}
    return Fused([seg], specs, kinds, {0: 0, 1: 1}, {("out",): 2}, "PROB")


# ---------------------------------------------------------------------- the pass alone


def test_few_outputs_of_many_terms_become_partials_and_their_sum():
    """min_terms 256: partials sum at least 4 terms; the largest leaf's outermost reduced
    axes are kept while they leave that many (R3 alone would leave 1), or until there are
    TARGET_ITEMS partials."""
    fused = big_sum(normalize=True)
    partial, total = split_reductions(fused, min_terms=256).segments
    assert [a.key for a in partial.out_spec.axes] == [OUT.key, R1.key, R2.key]
    assert 3 * 64 * 64 < TARGET_ITEMS
    assert partial.red_axes == (R3,) and partial.leaves == (0, 1) and not partial.normalize
    assert total.out == 2 and total.out_spec == fused.specs[2] and total.leaves == (partial.out,)
    assert total.red_axes == (R1, R2) and total.normalize  # NORMALIZE on the output's segment
    out = split_reductions(fused, min_terms=256)
    assert out.kinds[partial.out] == "computed" and out.specs[partial.out] == partial.out_spec
    assert fused.segments == big_sum(normalize=True).segments  # pure: the argument unchanged


def test_a_partial_keeps_enough_terms():
    """The default min_terms, 4096: a partial sums at least 4096 / 64 = 64 terms, so only R1
    is kept (64 partials of 1,024 terms; R2 too would leave 16). So does min_terms 2**16
    (at least 1,024 terms); at 2**17 the segment has too few terms to split."""
    for min_terms in (1 << 12, 1 << 16):
        partial, _ = split_reductions(big_sum(), min_terms=min_terms).segments
        assert [a.key for a in partial.out_spec.axes] == [OUT.key, R1.key]


def test_left_alone_when_it_does_not_pay():
    fused = big_sum()
    assert split_reductions(fused, min_terms=1 << 17).segments == fused.segments  # too few terms
    many = ax(0, TARGET_ITEMS)  # as many outputs as a GPU needs already
    wide = Fused(
        [Segment(2, TensorSpec((many,)), (R3,), (0, 1), True, False, (2,))],
        {0: TensorSpec((many, R3)), 1: TensorSpec((R3,)), 2: TensorSpec((many,))},
        {0: "factor", 1: "factor", 2: "computed"},
        {0: 0, 1: 1},
        {("out",): 2},
        "PROB",
    )
    assert split_reductions(wide, min_terms=2).segments == wide.segments


def test_a_batch_axis_stays_innermost_and_counts_as_one():
    """Every bucket of a batched executable splits as the unbatched program does."""
    for rows in (1, 4, 512):
        batch = Axis(9, AxisType.TOPOLOGICAL, rows)  # (ir/batch.py's axis: a key of its own)
        partial, _ = split_reductions(big_sum(out=(OUT, batch)), batch_key=batch.key, min_terms=256).segments
        assert [a.key for a in partial.out_spec.axes] == [OUT.key, R1.key, R2.key, batch.key]


def test_options_refuse_a_split_in_exact_mode():
    with pytest.raises(ValueError, match="split_reductions .* needs exact=False"):
        PlanOptions(split_reductions=True)
    for bad in (1, 0, True, 2.5):
        with pytest.raises(ValueError, match="split_min_terms must be an int >= 2"):
            PlanOptions(exact=False, split_min_terms=bad)


# ------------------------------------------------------------------- against the reference


@settings(60)
@given(cases())
def test_random_programs(case):
    note(case.listing())
    exe = compile_case(case, "loop", options=SPLIT)
    plain = compile_case(case, "loop", exact=False)
    split = len(exe.plan.fused.segments) > len(plain.plan.fused.segments)
    event("split" if split else "nothing to split")
    sess = exe.bind()
    for which in range(len(case.inputs)):
        got = session_results(sess, case.inputs[which])
        assert_same_slots(run_reference(case, which), got, case, f"split, inputs {which}")


def compile_split(b):
    return catbp_jit.compile(
        b.programs,
        b.semiring_runtime(),
        factor_specs=b.factor_specs(),
        selector_specs=b.selector_specs(),
        options=SPLIT,
    )


@pytest.mark.parametrize("path", CORPUS, ids=[p.name for p in CORPUS])
def test_corpus_within_tolerance(path):
    b = load_bundle(path)
    exe = compile_split(b)
    factors, selectors = inputs(b)
    compare_slots(exe.bind().run(factors=factors, selectors=selectors), b)


@settings(25)
@given(cases(), st.integers(0, 2**32 - 1))
def test_batched_equals_unbatched(case, seed):
    if not case.factor_specs:
        event("no factor to batch")
        return
    note(case.listing())
    bf = set(case.factor_specs)
    plain = compile_case(case, "loop", options=SPLIT).bind()
    try:
        sess = compile_case(case, "loop", options=SPLIT, batched_factors=bf, buckets=(3,)).bind()
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


def test_save_and_load_keep_the_split(tmp_path):
    b = load_bundle(next(p for p in CORPUS if p.name == "grid3_d2__prob_float64"))
    kw = dict(factor_specs=b.factor_specs(), selector_specs=b.selector_specs())
    exe = catbp_jit.compile(
        b.programs, b.semiring_runtime(), options=SPLIT.with_(split_outputs_below=4), **kw
    )
    exe.save(tmp_path / "exe.json")
    loaded = catbp_jit.load(tmp_path / "exe.json")
    options = loaded.plan.options
    assert options.split_reductions and (options.split_min_terms, options.split_outputs_below) == (4, 4)
    assert [st.pattern for st in loaded.schedule.steps] == [st.pattern for st in exe.schedule.steps]
    doc = json.loads((tmp_path / "exe.json").read_text())
    for key, bad in (("split_reductions", "yes"), ("split_min_terms", 1), ("split_outputs_below", 0)):
        (tmp_path / "bad.json").write_text(json.dumps(dict(doc, **{key: bad})))
        with pytest.raises(SavedExecutableError, match=f"'{key}'"):
            catbp_jit.load(tmp_path / "bad.json")
    # a file saved before split_outputs_below existed: the one bar there was, TARGET_ITEMS
    exe = compile_split(b)
    exe.save(tmp_path / "exe.json")
    doc = json.loads((tmp_path / "exe.json").read_text())
    del doc["split_outputs_below"]
    (tmp_path / "older.json").write_text(json.dumps(doc))
    loaded = catbp_jit.load(tmp_path / "older.json")
    assert loaded.plan.options.split_outputs_below == TARGET_ITEMS
    assert [st.pattern for st in loaded.schedule.steps] == [st.pattern for st in exe.schedule.steps]


def test_splits_happen_on_the_corpus():
    """Not a vacuous option: corpus programs are split (and the corpus test above runs
    them)."""
    from catbp_jit.executable import plan

    split = 0
    for path in CORPUS:
        b = load_bundle(path)
        args = (b.programs, b.semiring_runtime())
        kw = dict(factor_specs=b.factor_specs(), selector_specs=b.selector_specs())
        split += len(plan(*args, options=SPLIT, **kw).fused.segments) > len(
            plan(*args, exact=False, **kw).fused.segments
        )
    assert split >= len(CORPUS) // 2, (split, len(CORPUS))


def test_both_targets_split_when_reassociating_each_with_its_bars():
    """The default of both targets in the reassociating mode: the CUDA target's for any
    few outputs (it needs threads), the CPU's for sums into fewer than 8 outputs (its
    kernels add 8 side by side) of 2^20 terms each at least; options given explicitly are
    taken as they are; exact mode never."""
    from catbp_jit.executable import plan_options

    cuda, cpu = plan_options("cuda", None, exact=False), plan_options("cpu", None, exact=False)
    assert cuda.split_reductions and cpu.split_reductions
    assert (cuda.split_outputs_below, cuda.split_min_terms) == (TARGET_ITEMS, 1 << 12)
    assert (cpu.split_outputs_below, cpu.split_min_terms) == (8, 1 << 20)
    assert not plan_options("cuda", None).split_reductions  # exact
    assert not plan_options("cpu", None).split_reductions
    assert not plan_options("cuda", PlanOptions(exact=False), exact=False).split_reductions
    assert not plan_options("cpu", PlanOptions(exact=False), exact=False).split_reductions
    assert plan_options("cpu", SPLIT).split_reductions


def test_a_sum_into_many_outputs_or_one_that_writes_a_total_is_not_split():
    """outputs_below: 3 outputs split below 4, not below 3; a segment whose normalize pass
    writes its total (plan/totals.py) stays whole whatever the bars."""
    assert len(split_reductions(big_sum(), min_terms=256, outputs_below=4).segments) == 2
    assert split_reductions(big_sum(), min_terms=256, outputs_below=3).segments == big_sum().segments
    fused = big_sum(normalize=True)
    fused.segments[0] = replace(fused.segments[0], total=9)
    assert split_reductions(fused, min_terms=256).segments == fused.segments


def test_a_split_cuda_executable_loads_as_saved(tmp_path):
    """load() restores the saved split, not the target's default for the mode."""
    pytest.importorskip("numba_cuda", reason="the CUDA target needs numba-cuda")
    b = load_bundle(next(p for p in CORPUS if p.name == "z4_cycle__prob_float64"))
    kw = dict(factor_specs=b.factor_specs(), selector_specs=b.selector_specs(), target="cuda")
    for options in (PlanOptions(exact=False, gemm=False), SPLIT.with_(gemm=False)):
        exe = catbp_jit.compile(b.programs, b.semiring_runtime(), options=options, **kw)
        exe.save(tmp_path / "exe.json")
        loaded = catbp_jit.load(tmp_path / "exe.json")
        assert loaded.plan.options.split_reductions is options.split_reductions
        assert loaded.plan.options.split_min_terms == options.split_min_terms


def test_the_cpu_splits_a_long_sum_into_one_output_by_default():
    """compile(exact=False) on the CPU, no options: a sum of 2^20 terms into one output (a
    tensor's total, log Z) is split (one chain of 2^20 dependent additions otherwise), a
    sum into 32 outputs is not; results within docs/ir.md's tolerances of the reference."""
    from random_programs import Case, Inputs, elim, load, store

    big = TensorSpec(tuple(ax(20 + i, n) for i, n in enumerate((8, 64, 64, 32))))
    prog = [load(0, 0), elim(1, 0, []), store(("Z",), 1), elim(2, 0, [big.axes[3].key]), store(("rows",), 2)]
    rng = np.random.default_rng(5)
    case = Case(
        "PROB",
        np.dtype("float64"),
        [catbp_jit.Program(tuple(prog), "upward")],
        {0: big},
        {},
        {},
        [Inputs({0: rng.uniform(0.5, 1.5, big.shape)}, {}, {})],
    )
    exe = compile_case(case, "compiled", exact=False)
    fused = exe.plan.fused
    assert exe.plan.options.split_reductions
    (factor,) = [v for v, kind in fused.kinds.items() if kind == "factor"]
    writes = {seg.out: seg for seg in fused.segments}
    (partial,) = writes[fused.outputs[("Z",)]].leaves  # Z sums the partials ...
    assert fused.kinds[partial] == "computed" and writes[partial].leaves == (factor,)  # ... of the factor
    assert 8 <= prod(fused.specs[partial].shape) <= TARGET_ITEMS  # (each of 2^20 / 64 terms at least)
    assert writes[fused.outputs[("rows",)]].leaves == (factor,)  # 32 outputs: not split
    assert_same_slots(run_reference(case), session_results(exe.bind(), case.inputs[0]), case, "split")
