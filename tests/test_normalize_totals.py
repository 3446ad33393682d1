"""A PROB NORMALIZE divides by the reference's total, bit for bit: numpy's np.sum of the
tensor, which sums it pairwise (codegen/reduction.pairwise_total walks numpy's tree), in
the kernels of both dispatch modes, cut in chunks or not (the numpy tier and the CUDA
template give the kernels' bits: tests/test_tiers.py, tests/test_cuda_kernels.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
from catbp_jit.bundle import load_bundle
from catbp_jit.codegen.reduction import pairwise_total
from catbp_jit.plan.options import PlanOptions
from catbp_jit.reference import run_program, run_programs
from conftest import CORPUS
from jit_helpers import (
    assert_same_bits,
    catbp_jit_inputs,
    executable,
    inputs,
    random_factors,
    session_results,
)

G = AxisType.GEOMETRIC


def normalized_product(sizes):
    """bel = NORMALIZE(f0 ⊗ f1), f1 holding the axes in reverse (a gathered leaf)."""
    axes = [Axis(i, G, n) for i, n in enumerate(sizes)]
    specs = {0: TensorSpec(tuple(axes[:1])), 1: TensorSpec(tuple(reversed(axes)))}
    program = Program(
        [
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
            Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": TensorSpec(tuple(axes))}),
            Instruction(OpCode.NORMALIZE, None, {"src": 2}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("bel",), "src": 2}),
        ],
        "p",
    )
    return program, specs


def test_the_walk_is_numpys_sum():
    """The generated lines, run as Python, against np.sum: every length up to 300 (each
    leaf kind and the first splits), long ones (deep trees), strided, and -0.0."""
    names = ("lo", "n", "state", "sums")
    body = "\n".join(pairwise_total("    ", "x[at + {k} * es]", names))
    scope: dict = {"np": np}
    exec(f"def total_of(x, at, es, size, lo, n, state, sums):\n{body}\n    return total\n", scope)
    total_of = scope["total_of"]
    rng = np.random.default_rng(0)
    for size in [*range(301), 1000, 8193, 20000]:
        x = rng.random(size) * 10.0 ** rng.uniform(-3, 3, size)
        stacks = [np.zeros(64, np.int64) for _ in range(3)] + [np.zeros(64)]
        assert total_of(x, 0, 1, size, *stacks) == np.sum(x), size
        strided = np.zeros(3 * size + 2)
        strided[2::3] = x
        assert total_of(strided, 2, 3, size, *stacks) == np.sum(x), size
    negative_zeros = np.array([-0.0, -0.0])
    assert np.signbit(total_of(negative_zeros, 0, 1, 2, *stacks)) == np.signbit(np.sum(negative_zeros))


@given(
    sizes=st.lists(st.sampled_from([1, 2, 3, 7, 8, 9, 16, 17, 129]), min_size=1, max_size=3).filter(
        lambda s: int(np.prod(s)) <= 40_000
    ),
    chunks=st.sampled_from([1, 3]),
    zeros=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(0, 3),
)
@settings(max_examples=25, deadline=None, database=None)
def test_a_prob_normalize_gives_the_references_bits(sizes, chunks, zeros, seed):
    program, specs = normalized_product(sizes)
    sr = catbp_jit.make_semiring("PROB", "float64")
    values = random_factors(specs, sr, seed=seed, zeros=zeros)
    want = run_program(program, sr, lambda f: (values[f], specs[f]), lambda s: None)
    want = {"bel": np.asarray(want[("bel",)][0])}
    options = PlanOptions(parallel_min_work=1, chunks=chunks) if chunks > 1 else None
    for mode in ("compiled", "loop"):
        exe = catbp_jit.compile(program, sr, factor_specs=specs, mode=mode, options=options)
        got = session_results(exe.bind(), catbp_jit_inputs(values))[("bel",)][0]
        assert_same_bits({"bel": got}, want, f"{mode}, sizes {sizes}")


def test_the_normalized_corpus_bundle_gives_the_references_bits():
    """grid3_d2 PROB normalized: every slot the reference's (25 of 62 when the kernels
    added their totals in order)."""
    (path,) = [p for p in CORPUS if p.name == "grid3_d2__prob_float64_normalized"]
    bundle = load_bundle(path)
    sr = bundle.semiring_runtime()
    out = run_programs(bundle.programs, sr, bundle.factor_provider, bundle.selector_provider)
    want = {key: np.asarray(value) for key, (value, _) in out.items()}
    factors, selectors = inputs(bundle)
    for mode in ("compiled", "loop"):
        got = executable(bundle, mode).bind().run(factors=factors, selectors=selectors)
        assert_same_bits({k: np.asarray(v) for k, (v, _) in got.items()}, want, mode)
