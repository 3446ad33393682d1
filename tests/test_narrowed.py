"""plan/narrowed.py: a computed value is stored without the axes none of its leaves has;
its readers read it with a stride of 0 there and give the same bits (kernels and numpy
tier, both modes' plans, against the plan that stores every copy; the reference within
rounding, as exact mode's sums are)."""

from __future__ import annotations

import numpy as np
import pytest

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.narrowed import narrow_values
from catbp_jit.plan.options import PlanOptions
from catbp_jit.reference import run_program as reference_run_program
from jit_helpers import positive_factors, same_bits_as

G = AxisType.GEOMETRIC
I, J, K, L, ONE = Axis(0, G, 4), Axis(1, G, 5), Axis(2, G, 3), Axis(3, G, 6), Axis(4, G, 1)  # noqa: E741


def broadcast_then_sum(normalize: bool = False, slot: bool = False) -> Fused:
    """v2 = v0 ⊗ v1 over (I, L, J, ONE, K), L in neither; v3 = Σ_K v2 ⊗ v4."""
    specs = {0: TensorSpec((I, K)), 1: TensorSpec((J,)), 4: TensorSpec((L, K))}
    specs[2], specs[3] = TensorSpec((I, L, J, ONE, K)), TensorSpec((I, L, J))
    segments = [
        Segment(2, specs[2], (), (0, 1), False, normalize, (2,)),
        Segment(3, specs[3], (K,), (2, 4), True, False, (3,)),
    ]
    kinds = {0: "factor", 1: "factor", 4: "factor", 2: "computed", 3: "computed"}
    outputs = {("s",): 3} | ({("p",): 2} if slot else {})
    return Fused(segments, specs, kinds, {}, outputs, "PROB")


def test_a_value_keeps_only_the_axes_its_leaves_have():
    out = narrow_values(broadcast_then_sum())
    product, reader = out.segments
    assert product.out_spec == out.specs[2] == TensorSpec((I, J, ONE, K))  # L gone, size 1 kept
    assert reader == broadcast_then_sum().segments[1]  # its reader reads it as it is


def test_the_batch_axis_stays():
    out = narrow_values(broadcast_then_sum(), batch_key=L.key)
    assert out.specs[2] == TensorSpec((I, L, J, ONE, K))


@pytest.mark.parametrize("normalize, slot", [(True, False), (False, True)])
def test_normalized_values_and_slot_results_keep_every_copy(normalize, slot):
    """A NORMALIZE's total counts every copy; a slot shows its whole spec."""
    out = narrow_values(broadcast_then_sum(normalize, slot))
    assert out.specs[2] == TensorSpec((I, L, J, ONE, K))


def test_a_reader_left_with_axes_its_leaves_lack_is_narrowed_in_turn():
    fused = broadcast_then_sum()
    fused.specs[4] = TensorSpec((K,))  # now only v2 had L, and v2 loses it
    fused.outputs = {("s",): 1}  # (v3 no slot result)
    out = narrow_values(fused)
    assert out.specs[3] == TensorSpec((I, J))


def clique_program() -> tuple[Program, dict]:
    """A clique's product of two small factors over its whole space (axes J and L in
    neither), read by a sum over K and by a sum over J and L, each multiplying it by a
    third factor first, and normalized into a slot (which keeps every copy)."""
    specs = {0: TensorSpec((I, K)), 1: TensorSpec((K,)), 2: TensorSpec((J, K, L))}
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    space = TensorSpec((I, J, K, L))
    ins.append(Instruction(OpCode.CONTRACT, 3, {"inputs": (0, 1), "out_spec": space}))
    ins.append(Instruction(OpCode.CONTRACT, 4, {"inputs": (3, 2), "out_spec": space}))
    ins.append(Instruction(OpCode.ELIMINATE, 5, {"src": 4, "keep_keys": (I.key, J.key, L.key)}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("sum_k",), "src": 5}))
    ins.append(Instruction(OpCode.CONTRACT, 6, {"inputs": (3, 2), "out_spec": space}))
    ins.append(Instruction(OpCode.ELIMINATE, 7, {"src": 6, "keep_keys": (K.key, I.key)}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("sum_jl",), "src": 7}))
    ins.append(Instruction(OpCode.NORMALIZE, None, {"src": 3}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("clique",), "src": 3}))
    return Program(tuple(ins), "clique"), specs


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB"])
@pytest.mark.parametrize("exact", [True, False])
def test_readers_of_a_narrowed_value_give_the_same_bits(semiring, exact):
    prog, specs = clique_program()
    sr = catbp_jit.make_semiring(semiring)
    narrowed = catbp_jit.compile([prog], sr, factor_specs=specs, options=PlanOptions(exact=exact))
    whole = catbp_jit.compile([prog], sr, factor_specs=specs, options=PlanOptions(exact=exact, narrow=False))
    small = {v for v, spec in narrowed.plan.fused.specs.items() if spec.keys == (I.key, K.key)}
    assert small & {seg.out for seg in narrowed.plan.fused.segments}  # the product, stored once
    factors = positive_factors(specs, semiring, seed=7)
    want = same_bits_as(whole, narrowed, factors)
    if exact:
        ref = reference_run_program(prog, sr, lambda f: (factors[f], specs[f]), lambda s: None)
        for key, (value, _) in ref.items():  # (numpy sums runs of reduced axes pairwise)
            np.testing.assert_allclose(want[key], value, rtol=1e-13, atol=0)
