"""A NORMALIZE in chunks (abi.SPLIT_FINISH): a step cut in chunks whose PROB NORMALIZE
divides many elements has the threads share its total's ranges and its division, in two
passes after its chunks (codegen/dispatch.py, codegen/cpu.py's finish_part). The same
bits as the NORMALIZE on one thread: in both loop templates, in lanes (reassociating) and
in the elements' order (exact), in float64 and float32, and in tracks (tests/test_tracks.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec, abi
from catbp_jit.plan.options import PlanOptions
from catbp_jit.plan.schedule import splits_finish
from jit_helpers import assert_same_bits, settings, slot_copies, summed_products

ONE_THREAD = PlanOptions(split_finish_min_elements=None)


def split_steps(exe) -> list[int]:
    return [i for i in range(len(exe.schedule.steps)) if exe.schedule.finish(i) == abi.SPLIT_FINISH]


@st.composite
def normalized_steps(draw):
    """A product of 1-3 leaves over 2-4 axes of sizes 1-9, summed over some of them or
    none, then NORMALIZEd; its dtype, mode, template, and chunks (2-64: parts of the
    passes with no range of the total's, or no element, among them)."""
    program, specs = draw(summed_products(sizes=(2, 9), axes=(2, 4), leaves=(1, 3)))
    ins = list(program.instructions)
    ins = ins[:-1] + [Instruction(OpCode.NORMALIZE, None, {"src": 11}), ins[-1]]  # (in place)
    dtype = draw(st.sampled_from(["float64", "float32"]))
    exact, lines, chunks = draw(st.booleans()), draw(st.booleans()), draw(st.sampled_from([2, 3, 64]))
    return Program(tuple(ins), "upward"), specs, dtype, exact, lines, chunks


@settings(10)
@given(normalized_steps(), st.integers(0, 2**32 - 1))
def test_a_normalize_in_chunks_keeps_the_bits_of_one_on_one_thread(step, seed):
    same_bits_split_or_not(*step, seed)


@pytest.mark.slow  # (100 random steps, many with kernels of their own to compile: ~60 s)
@settings(100)
@given(normalized_steps(), st.integers(0, 2**32 - 1))
def test_many_normalizes_in_chunks_keep_the_bits_of_one_on_one_thread(step, seed):
    same_bits_split_or_not(*step, seed)


def same_bits_split_or_not(program, specs, dtype, exact, lines, chunks, seed):
    note(f"{program}\n{dtype} exact {exact} lines {lines} chunks {chunks}")
    sr = catbp_jit.make_semiring("PROB", dtype)
    rng = np.random.default_rng(seed)
    values = {f: rng.uniform(0.1, 2.0, spec.shape).astype(dtype) for f, spec in specs.items()}
    values[0].flat[0] = 0.0  # (a zero, so that a sum of a few terms may be 0: then no division)

    def exe(options: PlanOptions):
        knobs = dict(exact=exact, line_products=lines, chunks=chunks, parallel_min_work=1)
        return catbp_jit.compile(program, sr, factor_specs=specs, options=options.with_(**knobs))

    want = slot_copies(exe(ONE_THREAD).bind().run(factors=values))
    split = exe(PlanOptions(split_finish_min_elements=1))
    event(f"steps split: {len(split_steps(split))}")
    for i in split_steps(split):
        assert split.schedule.chunks(i) > 1 and split.schedule.steps[i].pattern.normalize
    assert_same_bits(want, slot_copies(split.bind().run(factors=values)), "split")
    assert_same_bits(want, slot_copies(split.bind().run(factors=values)), "split, again")


def test_which_steps_split():
    """A PROB NORMALIZE of a step in chunks, from the bar's elements on, one group; not
    LOGPROB's (its subtraction is a pass of its own), not a batch's rows, not one chunk."""
    program, specs = _normalized_sum(64)
    for name, bar, want in (("PROB", 4096, True), ("PROB", 4097, False), ("LOGPROB", 1, False)):
        sr = catbp_jit.make_semiring(name, "float64")
        options = PlanOptions(parallel_min_work=1, split_finish_min_elements=bar)
        exe = catbp_jit.compile(program, sr, factor_specs=specs, options=options)
        steps = exe.schedule.steps
        assert any(splits_finish(s, name, options) for s in steps) == want, (name, bar)
        assert bool(split_steps(exe)) == want
    prob = catbp_jit.make_semiring("PROB", "float64")
    one_chunk = PlanOptions(chunks=1, parallel_min_work=1, split_finish_min_elements=1)
    assert not split_steps(catbp_jit.compile(program, prob, factor_specs=specs, options=one_chunk))


def _normalized_sum(n: int) -> tuple[Program, dict]:
    """Σ_k a[i, j, k] b[j, k] over an n x n x 8 product, NORMALIZEd: n * n elements divided."""
    G = AxisType.GEOMETRIC
    i, j, k = Axis(0, G, n), Axis(1, G, n), Axis(2, G, 8)
    specs = {0: TensorSpec((i, j, k)), 1: TensorSpec((j, k))}
    ins = [
        Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
        Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
        Instruction(OpCode.CONTRACT, 10, {"inputs": (0, 1), "out_spec": TensorSpec((i, j, k))}),
        Instruction(OpCode.ELIMINATE, 11, {"src": 10, "keep_keys": (i.key, j.key)}),
        Instruction(OpCode.NORMALIZE, None, {"src": 11}),
        Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 11}),
    ]
    return Program(tuple(ins), "upward"), specs
