"""The reassociating mode (compile(..., exact=False)): plan/reassociate.py and plan/gemm.py.

The pass alone on hand-made segments (shapes, order, intermediates freed, left alone when it
does not pay); then whole executables against the reference VM on the corpus and on random
programs, within DESIGN.md's tolerances (SAT and COUNT exactly), batched against unbatched,
and saved and loaded as what they are.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, note

import catbp_jit
from catbp_jit import Axis, AxisType, TensorSpec
from catbp_jit.bundle import load_bundle
from catbp_jit.executable import plan
from catbp_jit.plan.arena import plan_memory
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.reassociate import reassociate

from conftest import CORPUS
from jit_helpers import inputs
from random_programs import cases
from test_jit_corpus import compare_slots
from test_jit_random import (_settings, assert_same_slots, record, run_reference,
                             session_results)

G = AxisType.GEOMETRIC


def ax(i: int, n: int) -> Axis:
    return Axis(i, G, n)


def spec(*axes: Axis) -> TensorSpec:
    return TensorSpec(tuple(axes))


I, J, K, L = ax(0, 4), ax(1, 5), ax(2, 6), ax(3, 7)


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
    fused = Fused([seg], specs, {0: "factor", 1: "factor", 2: "computed"}, {0: 0, 1: 1},
                  {("out",): 2}, "LOGPROB")
    segs = reassociate(fused).segments
    assert [s.leaves[:1] for s in segs] == [(1,), (0,)]
    assert keys(segs[0].out_spec) == {J.key} and {a.key for a in segs[0].red_axes} == {K.key}
    assert segs[1].out == 2 and {a.key for a in segs[1].red_axes} == {J.key}


def test_left_alone_when_it_does_not_pay():
    """A product of three leaves over the same axes, nothing reduced: pairwise steps would
    write and read an intermediate as large as the output."""
    specs = {0: spec(I, J), 1: spec(I, J), 2: spec(J, I), 3: spec(I, J)}
    seg = Segment(3, specs[3], (), (0, 1, 2), False, False, (3,))
    fused = Fused([seg], specs, {0: "factor", 1: "factor", 2: "factor", 3: "computed"},
                  {0: 0, 1: 1, 2: 2}, {("out",): 3}, "PROB")
    assert reassociate(fused).segments == [seg]


def test_batch_axis_is_innermost_and_paths_ignore_its_size():
    B = Axis(9, G, 64)
    specs = {0: spec(I, J, B), 1: spec(J, K), 2: spec(K, L), 3: spec(I, L, B)}
    seg = Segment(3, specs[3], (J, K), (0, 1, 2), True, False, (3,))
    fused = Fused([seg], specs, {0: "factor", 1: "factor", 2: "factor", 3: "computed"},
                  {0: 0, 1: 1, 2: 2}, {("out",): 3}, "PROB")
    segs = reassociate(fused, batch_key=B.key).segments
    plain = reassociate(chain_fused()).segments
    assert [set(s.leaves) for s in segs] == [set(s.leaves) for s in plain]
    for s in segs[:-1]:
        if s.out_spec.has_key(B.key):
            assert s.out_spec.axes[-1].key == B.key


# ------------------------------------------------------------------- against the reference

def compile_bundle(b, exact=False, **kw):
    return catbp_jit.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(),
                             selector_specs=b.selector_specs(), exact=exact, **kw)


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
        grown += len(plan(*args, exact=False, **kw).fused.segments) > \
            len(plan(*args, **kw).fused.segments)
    assert grown > 0


@_settings(150)
@given(cases())
def test_random_programs(case):
    note(case.listing())
    record(case)
    exe = catbp_jit.compile(case.programs, case.sr(), factor_specs=case.factor_specs,
                            selector_specs=case.selector_specs,
                            slot_specs=case.slot_specs or None, mode="loop", exact=False)
    sess = exe.bind()
    for which in range(len(case.inputs)):
        got = session_results(sess, case.inputs[which])
        assert_same_slots(run_reference(case, which), got, case, f"exact=False, inputs {which}")


def test_axes_no_leaf_has_stay_on_the_last_segment():
    """Regression: Σ_{i,k} of a product broadcast over k (no leaf has it) counts each term
    once per k; the pass dropped k and so the factor |k| (hypothesis: PROB Z half of it)."""
    specs = {0: spec(I, J), 1: spec(J), 2: spec(J), 3: spec()}
    seg = Segment(3, specs[3], (I, J, K), (0, 1, 2), True, False, (3,))
    fused = Fused([seg], specs, {0: "factor", 1: "factor", 2: "factor", 3: "computed"},
                  {0: 0, 1: 1, 2: 2}, {("out",): 3}, "PROB")
    last = reassociate(fused).segments[-1]
    assert last.out == 3 and K.key in {a.key for a in last.red_axes}
    out = Fused([Segment(3, spec(I, K), (J,), (0, 1, 2), True, False, (3,))],
                {**specs, 3: spec(I, K)}, fused.kinds, fused.attrs, fused.outputs, "PROB")
    last = reassociate(out).segments[-1]
    assert last.out_spec == spec(I, K) and {a.key for a in last.red_axes} <= {J.key}
