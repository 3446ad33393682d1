"""Exact PROB sums across reduced axes in lanes (codegen/cpu.py: _lanes_reduction): LANES
output elements summed side by side, each in its own chain of additions, in its own
order. Whatever the count of outputs (whole groups of LANES, then the rest), the vector's
length and the chunks a parallel step is cut into: the bits of the same sums vectorized
across outputs (the same order, another path), and the reference interpreter's values."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec, abi
from catbp_jit.codegen.cpu import kernel_source
from catbp_jit.plan.options import PlanOptions
from catbp_jit.plan.steps import KernelPattern
from catbp_jit.reference import run_program
from catbp_jit.semiring import SEMIRINGS
from jit_helpers import assert_same_bits, catbp_jit_inputs, random_factors, session_results

G = AxisType.GEOMETRIC


def test_only_exact_float_sums_across_reduced_axes_run_in_lanes():
    for name, sr in SEMIRINGS.items():
        for dtype in sr.dtypes:
            for vector in ("reduced", "outputs", "both"):
                lanes = KernelPattern(name, dtype, True, False, False, vector).sums_in_lanes
                assert lanes == (name == "PROB" and vector == "reduced"), (name, dtype, vector)
    assert not KernelPattern("PROB", "float64", False, False, False, "reduced").sums_in_lanes
    source = kernel_source(KernelPattern("PROB", "float64", True, False, False, "reduced"))
    assert "s3 += buf[3 * PIECE + v]" in source and abi.LANES == 4  # readable: one sum per lane


@st.composite
def reductions(draw):
    """out[o...] = sum_r f[o..., r...] * g[r..., o'...]: 1-3 output axes (1 to 24 output
    elements, so every count of lanes in the last group), 1-2 reduced axes, g holding some
    of the axes, in a random order."""
    n_out, n_red = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=n_out, max_size=n_out))
    sizes += draw(st.lists(st.sampled_from([2, 3, 9, 40, 130]), min_size=n_red, max_size=n_red))
    axes = [Axis(i, G, n) for i, n in enumerate(sizes)]
    held = [a for a in axes if draw(st.booleans())] or [axes[-1]]
    held = draw(st.permutations(held))
    return axes[:n_out], axes, held


def program_of(out_axes, axes, held):
    specs = {0: TensorSpec(tuple(axes)), 1: TensorSpec(tuple(held))}
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins.append(Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": TensorSpec(tuple(axes))}))
    keep = tuple(a.key for a in out_axes)
    ins.append(Instruction(OpCode.ELIMINATE, 3, {"src": 2, "keep_keys": keep}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 3}))
    return Program(tuple(ins), "upward"), specs


def sums_both_ways(program, specs, block: int, chunks: int, seed: int, lanes_step) -> None:
    """The program's one reduction compiled across reduced axes (in lanes) and across
    outputs: the same bits (where the nest has both vectors), and the reference's values
    within 1e-12 (numpy sums pairwise, the kernels in order: the last bits may differ).
    lanes_step(step): checks on the lanes kernel's step."""
    sr = catbp_jit.make_semiring("PROB", "float64")
    values = random_factors(specs, sr, seed=seed, zeros=0.2)
    results = {}
    for across in ("reduced", "outputs"):
        # chunks: a parallel step's chunks of outputs (3: groups cut at their ends)
        work = 1 if chunks > 1 else 1 << 22
        options = PlanOptions(across=across, block=block, chunks=chunks, parallel_min_work=work)
        exe = catbp_jit.compile(program, sr, factor_specs=specs, mode="loop", options=options)
        (step,) = [s for s in exe.schedule.steps if s.pattern.reduce]
        if across == "reduced":
            lanes_step(step)
        got = session_results(exe.bind(), catbp_jit_inputs(values))
        results[across] = {slot: value for slot, (value, _) in got.items()}
    if step.pattern.vector == "outputs":  # (a nest without output axes has no other vector)
        assert_same_bits(results["reduced"], results["outputs"], "lanes vs across outputs")
    ref = run_program(program, sr, lambda f: (values[f], specs[f]), lambda s: None)
    want, got = np.asarray(ref[("x",)][0]), results["reduced"][("x",)]
    assert np.allclose(got, want, rtol=1e-12, atol=0), (got, want)


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(reductions(), st.sampled_from([4, 16, 256]), st.sampled_from([1, 3, 64]), st.integers(0, 3))
def test_lanes_give_the_bits_of_the_sums_across_outputs(reduction, block, chunks, seed):
    def lanes_step(step):  # (a parallel step keeps 8 outputs at least to share)
        assert step.pattern.vector == "reduced" and step.pattern.sums_in_lanes
        event(f"chunks > 1: {step.params.chunks > 1}")

    sums_both_ways(*program_of(*reduction), block, chunks, seed, lanes_step)


@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(reductions(), st.booleans(), st.sampled_from([16, 256]), st.sampled_from([1, 3]), st.integers(0, 3))
def test_one_leaf_in_a_row_is_summed_where_it_lies(reduction, shuffled, block, chunks, seed):
    """out = Σ_r f[o, r]: where f's reduced axes are its innermost and the vector holds
    them all, each lane adds its terms straight from f (no buffer): the same bits."""
    out_axes, axes, _ = reduction
    stored = list(np.random.default_rng(seed).permutation(axes)) if shuffled else axes
    specs = {0: TensorSpec(tuple(stored))}
    ins = (
        Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
        Instruction(OpCode.ELIMINATE, 1, {"src": 0, "keep_keys": tuple(a.key for a in out_axes)}),
        Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 1}),
    )

    def lanes_step(step):
        p = step.params
        event(f"summed where it lies: {p.block_axes == p.red_rank and p.accesses[0].kind == abi.CONTIGUOUS}")

    sums_both_ways(Program(ins, "upward"), specs, block, chunks, seed, lanes_step)
