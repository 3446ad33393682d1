"""The CUDA kernels (codegen/cuda.py) compute what the CPU kernels compute, bit for bit.

Each case is planned once and run three times on the same memory plan and table: on the
CPU target (compile + bind + run, loop mode), and on the device (codegen/cuda_run.py) from
a copy of the CPU arena taken when the inputs are bound, just before the first step, both
ways: a launch per step, and every step in one launch of the schedule kernel
(codegen/cuda_schedule.py). Every slot must agree with the CPU's: PROB, SAT, COUNT and
MAXLOG bit for bit (and the whole arena too: every intermediate; NaN's payload aside),
LOGPROB within
jit_helpers.TOLERANCES (exp and log differ between a GPU's libdevice and the CPU's libm);
the two device runs agree bit for bit in every semiring; the table comes back unchanged
(the device kernels keep no loop counters in it).

Without a GPU the kernels run under Numba's CUDA simulator (conftest.py sets
NUMBA_ENABLE_CUDASIM=1 unless the environment sets it), which runs every thread as
Python: sizes stay small. Measured on a 2-core machine: the corpus bundles take 0.1-7 s
each, but star5_d3 (720k arena elements) 50-95 s; by default the smallest model runs in
every semiring and dtype, and one grid, the rest with the slow tests (pytest -m slow, as
CI does).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

nb_cuda = pytest.importorskip(
    "numba.cuda",
    reason="numba-cuda is not installed: the CUDA target needs it, even to "
    "run under the simulator (pip install numba-cuda)",
)

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec, abi
from catbp_jit.batched import BatchedCompileError
from catbp_jit.bundle import load_bundle
from catbp_jit.codegen import cuda, cuda_run, cuda_schedule
from catbp_jit.plan.options import PlanOptions
from catbp_jit.plan.schedule import KernelPattern
from catbp_jit.semiring import SEMIRINGS
from conftest import CORPUS, REPO
from jit_helpers import assert_close, bit_identical, compile_case, inputs
from random_programs import cases, lane_sum_case, scale_case

# The simulator runs each GPU thread as Python: the default selection checks the smallest
# model in every semiring and dtype (z4_cycle) and one grid; the sweep over the whole
# corpus (about a minute on a 2-core machine, star5_d3 alone 51-95 s a semiring) is slow.
QUICK = {p.name for p in CORPUS if p.name.startswith("z4_cycle__")} | {"grid3_d2__logprob_float64"}
BUNDLES = [p if p.name in QUICK else pytest.param(p, marks=pytest.mark.slow) for p in CORPUS]

# The simulator computes with numpy scalars in threads of its own, where np.errstate does
# not reach: COUNT wraps around int64 and LOGPROB's -inf - -inf is NaN on purpose.
pytestmark = pytest.mark.filterwarnings(
    "ignore:overflow encountered in scalar:RuntimeWarning",
    "ignore:invalid value encountered in scalar:RuntimeWarning",
)

_MODULES = {}  # KernelPattern -> kernel module, loaded once per test process
_SCHEDULE_MODULES = {}  # kernel set -> schedule kernel module, likewise


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cuda_kernels")


def modules_for(schedule, directory):
    for pattern in schedule.patterns:
        if pattern not in _MODULES:
            _MODULES[pattern] = cuda_run.load_module(pattern, directory)
    return [_MODULES[p] for p in schedule.patterns]


def schedule_module_for(schedule, directory):
    key = (tuple(schedule.patterns), cuda_schedule.schedule_shapes(schedule))
    if key not in _SCHEDULE_MODULES:
        _SCHEDULE_MODULES[key] = cuda_run.load_schedule_module(schedule, directory)
    return _SCHEDULE_MODULES[key]


# ------------------------------------------------------------------------ running both


@dataclass
class Run:
    """A CPU session that keeps a copy of its arena as the first step sees it."""

    exe: object  # the Executable whose schedule runs (a batched one's bucket)
    session: object
    start: np.ndarray = None

    @classmethod
    def bind(cls, compiled, exe):
        run = cls(exe, None)

        def before(i, step):
            if i == 0:
                run.start = run.session.mem.copy()

        run.session = compiled.bind(before=before)
        return run

    def run(self, **values) -> None:
        self.start = None
        with np.errstate(over="ignore"):  # COUNT wraps around int64 on purpose
            self.session.run(**values)
        if self.start is None:  # no step ran: the arena is as the inputs left it
            self.start = self.session.mem.copy()


def on_device(exe, start: np.ndarray, directory, options=cuda_run.LaunchOptions(), walk=False):
    """The arena and the table after running exe's schedule on the device from `start`:
    a launch per step, or (walk) all in one launch of the schedule kernel."""
    d_mem = nb_cuda.to_device(start)
    d_P = nb_cuda.to_device(exe.schedule.table)
    if walk:
        if exe.schedule.steps:
            cuda_run.run_walk(schedule_module_for(exe.schedule, directory), exe.schedule, d_mem, d_P, options)
    else:
        cuda_run.run_schedule(modules_for(exe.schedule, directory), exe.schedule, d_mem, d_P, options)
    return d_mem.copy_to_host(), d_P.copy_to_host()


# The schedule kernel's launch in the simulator: one block (a grid that waits for itself
# must be resident at once; the simulator runs one), of few threads, since each is a
# Python thread that the simulator polls
WALK = cuda_run.LaunchOptions(4)
# ... and the per-step launches': blocks of 8, another shape than the walk's (a GPU's
# default 128 gives a small step 128 Python threads, most of them idle;
# test_launch_shapes_give_identical_bits runs 128 too)
PER_STEP = cuda_run.LaunchOptions(8)


def check_against_cpu(run: Run, semiring: str, directory, options=PER_STEP, walk=WALK, per_step: bool = True):
    """Run the device on the arena the CPU started from, a launch per step (per_step) and
    in one launch (walk: its launch options, None: not), and compare with the CPU's."""
    exe, cpu = run.exe, run.session.mem
    if per_step:
        mem, table = on_device(exe, run.start, directory, options)
    if walk is not None:
        walked, walked_table = on_device(exe, run.start, directory, walk, walk=True)
        if per_step:
            assert np.array_equal(walked.view(np.uint8), mem.view(np.uint8)), (
                "one launch != a launch per step"
            )
        else:
            mem, table = walked, walked_table
        assert np.array_equal(walked_table, exe.schedule.table), "the schedule kernel wrote into the table"
    regions, mem_cpu = exe.memory.regions, cpu[: exe.memory.total]
    for key, v in exe.fused.outputs.items():
        r = regions[v]
        assert_close(
            mem[r.offset : r.offset + r.size],
            mem_cpu[r.offset : r.offset + r.size],
            semiring,
            f"slot {key!r}",
        )
    if bit_identical(semiring):
        assert_close(mem, mem_cpu, semiring, "arena")
    assert np.array_equal(table, exe.schedule.table), "the device kernels wrote into the table"
    return mem


# -------------------------------------------------------------------------- the corpus


# the CPU plans whose tables the device kernels run: without repacked leaves or window
# words, as the CUDA target plans (its kernels read every leaf where it is, every gathered
# element through its offset)
CPU_PLAN = PlanOptions(repack=False, window_words=False)


def run_bundle(path):
    """The bundle, and a run of it on the CPU target (loop mode) with its inputs."""
    bundle = load_bundle(path)
    exe = catbp_jit.compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        mode="loop",
        options=CPU_PLAN,
    )
    run = Run.bind(exe, exe)
    factors, selectors = inputs(bundle)
    run.run(factors=factors, selectors=selectors)
    return bundle, run


# Past this arena the simulator takes a minute a path (star5_d3, 720k elements): those
# bundles run in one launch alone, the path users get; the per-step path shares every
# kernel's code with it, and is compared with it on every other bundle and program
BIG_ARENA = 100_000


@pytest.mark.parametrize("path", BUNDLES, ids=[p.name for p in CORPUS])
def test_corpus_bundle_matches_cpu(path, module_dir):
    bundle, run = run_bundle(path)
    check_against_cpu(run, bundle.semiring, module_dir, per_step=run.exe.memory.total <= BIG_ARENA)


# --------------------------------------------------------------------- random programs


def _settings(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
    )


def check_random_case(case, directory):
    note(case.listing())
    event(f"{case.semiring} {case.dtype.name}")
    exe = catbp_jit.compile(
        case.programs,
        case.sr(),
        factor_specs=case.factor_specs,
        selector_specs=case.selector_specs,
        slot_specs=case.slot_specs or None,
        mode="loop",
        options=CPU_PLAN,
    )
    run = Run.bind(exe, exe)
    for values in case.inputs:  # one session, two sets of inputs
        run.run(factors=values.factors, selectors=values.selectors, slots=values.slots)
        check_against_cpu(run, case.semiring, directory)


@_settings(20)  # 1,000 under -m slow (below)
@given(case=cases())
def test_random_programs_match_cpu(case, module_dir):
    check_random_case(case, module_dir)


# Split reductions (plan/split.py): a split plan's steps are ordinary steps, so the device
# gives the CPU's bits for them too (GEMM steps are the CPU's alone: off)
SPLIT = PlanOptions(
    exact=False, split_reductions=True, split_min_terms=2, gemm=False, repack=False, window_words=False
)


@_settings(15)  # (the simulator: 14 s of the default suite at 30)
@given(case=cases())
def test_split_reductions_match_cpu(case, module_dir):
    note(case.listing())
    exe = compile_case(case, "loop", options=SPLIT)
    run = Run.bind(exe, exe)
    values = case.inputs[0]
    run.run(factors=values.factors, selectors=values.selectors, slots=values.slots)
    check_against_cpu(run, case.semiring, module_dir)


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB", pytest.param("MAXLOG", marks=pytest.mark.slow)])
def test_normalize_totals_match_cpu(semiring, module_dir):
    """plan/totals.py: a normalize pass that also writes its total, as the CPU's does."""
    case = scale_case(semiring)
    exe = compile_case(case, "loop", options=PlanOptions(exact=False, gemm=False, window_words=False))
    assert any(seg.total is not None for seg in exe.plan.fused.segments)
    run = Run.bind(exe, exe)
    values = case.inputs[0]
    run.run(factors=values.factors, selectors=values.selectors, slots=values.slots)
    check_against_cpu(run, case.semiring, module_dir)


@pytest.mark.parametrize("name", ["two leaves", "one leaf, vectors"])
def test_sums_in_lanes_match_cpu(name, module_dir):
    """A CPU reassociating plan's sums in lanes (KernelPattern.terms_in_lanes: vectors of
    210 terms, each ending in a part of a line), in both device kernels: the CPU's bits."""
    case = lane_sum_case(name)
    exe = compile_case(
        case, "loop", options=PlanOptions(exact=False, gemm=False, split_reductions=False, window_words=False)
    )
    assert any(st.pattern.terms_in_lanes for st in exe.schedule.steps)
    run = Run.bind(exe, exe)
    values = case.inputs[0]
    run.run(factors=values.factors, selectors=values.selectors, slots=values.slots)
    check_against_cpu(run, case.semiring, module_dir)


def test_a_split_corpus_bundle_matches_cpu(module_dir):
    path = next((p for p in CORPUS if p.name == "z4_cycle__prob_float64_normalized"), None)
    if path is None:
        pytest.skip("z4_cycle__prob_float64_normalized is not in the corpus")
    bundle = load_bundle(path)
    exe = catbp_jit.compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        mode="loop",
        options=SPLIT,
    )
    plain = catbp_jit.executable.plan(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        exact=False,
    )
    assert len(exe.plan.fused.segments) > len(plain.fused.segments)  # something was split
    run = Run.bind(exe, exe)
    factors, selectors = inputs(bundle)
    run.run(factors=factors, selectors=selectors)
    check_against_cpu(run, bundle.semiring, module_dir)


@pytest.mark.slow  # (400: 93 s of CI's 15 minutes at 1000, in the simulator)
@_settings(400)
@given(case=cases())
def test_random_programs_match_cpu_many(case, module_dir):
    check_random_case(case, module_dir)


@_settings(50)
@given(data=st.data())
def test_random_batched_programs_match_cpu(data, module_dir):
    """Batched plans: NORMALIZE works per row (groups > 1), the batch axis innermost."""
    case = data.draw(cases())
    if not case.factor_specs:
        return
    batched = data.draw(st.sets(st.sampled_from(sorted(case.factor_specs)), min_size=1))
    rows = data.draw(st.integers(2, 3))
    note(f"{case.listing()}\nbatched factors {batched}, {rows} rows")
    try:
        compiled = catbp_jit.compile(
            case.programs,
            case.sr(),
            factor_specs=case.factor_specs,
            selector_specs=case.selector_specs,
            slot_specs=case.slot_specs or None,
            mode="loop",
            batched_factors=batched,
            buckets=(rows,),
            options=CPU_PLAN,
        )
    except BatchedCompileError:
        event("refused by the batch rewrite")
        return
    run = Run.bind(compiled, compiled.profiles[rows])
    rng = np.random.default_rng(0)
    factors = {
        k: (
            np.stack([v] + [rng.permutation(v.ravel()).reshape(v.shape) for _ in range(rows - 1)])
            if k in batched
            else v
        )
        for k, v in case.inputs[0].factors.items()
    }
    run.run(factors=factors, selectors=case.inputs[0].selectors, slots=case.inputs[0].slots)
    by_rows = any(step.params.groups[0] > 1 for step in run.exe.schedule.steps)
    event(f"{case.semiring}: {'a' if by_rows else 'no'} NORMALIZE by rows")
    check_against_cpu(run, case.semiring, module_dir)


G = AxisType.GEOMETRIC


def batched_normalize_program() -> Program:
    """bel = NORMALIZE(f0 ⊗ f1) per row; m = ⊕_{G0} bel."""
    a0, a1 = Axis(0, G, 3), Axis(1, G, 2)
    return Program(
        (
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
            Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": TensorSpec((a0, a1))}),
            Instruction(OpCode.NORMALIZE, None, {"src": 2}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("bel",), "src": 2}),
            Instruction(OpCode.ELIMINATE, 3, {"src": 2, "keep_keys": ((G, 1),)}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("m",), "src": 3}),
        ),
        "upward",
    )


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB", pytest.param("MAXLOG", marks=pytest.mark.slow)])
def test_normalize_per_row_matches_cpu(semiring, module_dir):
    """Four rows: four NORMALIZE groups, each summed alone, as the CPU sums them."""
    a0, a1 = Axis(0, G, 3), Axis(1, G, 2)
    specs = {0: TensorSpec((a0, a1)), 1: TensorSpec((a1,))}
    compiled = catbp_jit.compile(
        batched_normalize_program(),
        catbp_jit.make_semiring(semiring),
        factor_specs=specs,
        mode="loop",
        batched_factors={0},
        buckets=(4,),
        options=CPU_PLAN,
    )
    run = Run.bind(compiled, compiled.profiles[4])
    assert any(step.params.groups[0] == 4 for step in run.exe.schedule.steps)
    rng = np.random.default_rng(7)
    f0 = rng.uniform(0.1, 2.0, (4, 3, 2))
    f0[2] = 0.0  # a row of zeros: PROB leaves it, LOGPROB and MAXLOG give NaN
    f1 = rng.uniform(0.1, 2.0, (2,))
    sr = SEMIRINGS[semiring]
    run.run(factors={0: sr.potentials(f0, np.float64), 1: sr.potentials(f1, np.float64)})
    check_against_cpu(run, semiring, module_dir)


def many_reduced_axes_program() -> tuple:
    """Z[a6] = ⊕ f0[a0..a5] ⊗ f1[a5..a0, a6]: six reduced axes that cannot merge (f1
    holds them in reverse), more terms than one vector holds, so the reduction also
    walks axes outside them (the CPU's odometer), which no corpus bundle does."""
    axes = [Axis(i, G, n) for i, n in enumerate((2, 3, 4, 5, 6, 7, 2))]
    f0, f1 = TensorSpec(tuple(axes[:6])), TensorSpec(tuple(axes[5::-1]) + (axes[6],))
    program = Program(
        (
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
            Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": TensorSpec(tuple(axes))}),
            Instruction(OpCode.ELIMINATE, 3, {"src": 2, "keep_keys": ((G, 6),)}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("Z",), "src": 3}),
        ),
        "upward",
    )
    return program, {0: f0, 1: f1}


@pytest.mark.parametrize(
    "semiring", ["PROB", "LOGPROB", "SAT", "COUNT", pytest.param("MAXLOG", marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("across", ["reduced", "outputs"])
def test_reduction_past_the_vector_matches_cpu(semiring, across, module_dir):
    """Either CPU vector (plan/loops.py): the GPU's threads add the terms in its order."""
    program, specs = many_reduced_axes_program()
    sr = catbp_jit.make_semiring(semiring)
    compiled = catbp_jit.compile(
        program,
        sr,
        factor_specs=specs,
        mode="loop",
        options=PlanOptions(across=across, repack=False, window_words=False),
    )
    run = Run.bind(compiled, compiled)
    (step,) = [st_ for st_ in compiled.schedule.steps if st_.pattern.reduce]
    assert step.pattern.vector == across
    if across == "reduced":  # reduced axes walked outside the vector too
        outer = step.params.rank - step.params.block_axes - step.params.out_rank
        assert outer >= 2, step.params
    rng = np.random.default_rng(3)
    values = {}
    for f, spec in specs.items():
        x = rng.uniform(0.1, 2.0, spec.shape)
        # zeros, so that sums have fewer terms that differ in order; for SAT so many that
        # the first true term comes past the first pass over the tables
        x[rng.random(spec.shape) < (0.97 if sr.kind.reduction == "any" else 0.5)] = 0.0
        values[f] = sr.kind.potentials(x, sr.dtype)
    run.run(factors=values)
    check_against_cpu(run, semiring, module_dir)


# --------------------------------------------------------------------- launch shapes

SHAPES = [
    cuda_run.LaunchOptions(1, 1024),
    cuda_run.LaunchOptions(32, 1024),
    cuda_run.LaunchOptions(128, 1024),
    cuda_run.LaunchOptions(32, 1),
    cuda_run.LaunchOptions(1, 3),
]
WALK_SHAPES = [cuda_run.LaunchOptions(1), cuda_run.LaunchOptions(7), cuda_run.LaunchOptions(32)]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("grid3_d2__prob_float64_normalized", marks=pytest.mark.slow),  # 25 s
        "z4_cycle__prob_float32",
        "z4_cycle__logprob_float64_normalized",
    ],
)
def test_launch_shapes_give_identical_bits(name, module_dir):
    """Threads per block 1, 32, 128, and grids capped to 1 or 3 blocks (the grid-stride
    loop covers the rest): the same arena, bit for bit (LOGPROB too)."""
    path = next((p for p in CORPUS if p.name == name), None)
    if path is None:
        pytest.skip(f"bundle {name} is not in {CORPUS[0].parent if CORPUS else 'the corpus'}")
    bundle, run = run_bundle(path)
    first = None
    for options in SHAPES:
        mem = check_against_cpu(run, bundle.semiring, module_dir, options, walk=None)
        if first is None:
            first = mem
        assert np.array_equal(mem.view(np.uint8), first.view(np.uint8)), options
    for options in WALK_SHAPES:  # one launch: one block of 1, 7 or 32 threads
        walked, _ = on_device(run.exe, run.start, module_dir, options, walk=True)
        assert np.array_equal(walked.view(np.uint8), first.view(np.uint8)), options


# --------------------------------------------------------------------------- the source


def _patterns():
    return [
        KernelPattern(sr, dt, reduce, norm, False)
        for sr, dt in [
            ("PROB", "float64"),
            ("PROB", "float32"),
            ("LOGPROB", "float64"),
            ("SAT", "bool"),
            ("COUNT", "int64"),
        ]
        for reduce in (False, True)
        for norm in ((False, True) if SEMIRINGS[sr].normalizes else (False,))
    ]


# MAXLOG's (a product as LOGPROB's, a max, a subtraction of the largest entry)
MAXLOG_PATTERNS = [
    KernelPattern("MAXLOG", dt, reduce, norm, False)
    for dt in ("float64", "float32")
    for reduce in (False, True)
    for norm in (False, True)
]


def test_source_is_deterministic_and_ignores_parallel():
    for pattern in _patterns() + MAXLOG_PATTERNS:
        src = cuda.kernel_source(pattern)
        assert src == cuda.kernel_source(KernelPattern(**pattern.as_dict()))
        par = KernelPattern(**dict(pattern.as_dict(), parallel=True))
        assert cuda.kernel_source(par) == src, pattern.name
        compile(src, pattern.name, "exec")
        assert ("def normalize(" in src) == pattern.normalize, pattern.name
        assert "SCRATCH]" not in src and "CHUNKS]" not in src, pattern.name


def test_float_products_in_sums_are_rounded_alone():
    """Only float products that feed a sum go through libdevice's dmul_rn / fmul_rn (on a
    GPU; the simulator's stand-in is a plain product): NVVM would fuse them with the add."""
    for pattern in _patterns():
        src = cuda.kernel_source(pattern)
        sums_products = pattern.reduce and pattern.semiring == "PROB"
        assert ("mul_rn(x, mem[" in src) == sums_products, pattern.name
        if sums_products:
            rn = {"float64": "dmul_rn", "float32": "fmul_rn"}[pattern.dtype]
            assert f"from numba.cuda.libdevice import {rn}\n" in src
            assert f"{rn}(x, mem[" in src
            assert " * mem[" not in src, pattern.name


def test_schedule_kernel_source_names_its_kernels_and_waits_where_told():
    patterns = [p for p in _patterns() if p.dtype == "float64"]
    shapes = [((2, 1, 1), (3, 2, 0)) if p.reduce else ((2, 2, 0),) for p in patterns]
    src = cuda_schedule.schedule_source(patterns, shapes)
    assert src == cuda_schedule.schedule_source([KernelPattern(**p.as_dict()) for p in patterns], shapes)
    compile(src, "schedule", "exec")
    for k, pattern in enumerate(patterns):
        assert f"  {k}: {pattern.name}\n" in src  # the docstring lists the kernel ids
        for shape in shapes[k]:  # a device function per kernel id and step shape
            name = f"contract_{k}_k{shape[0]}_r{shape[1]}_q{shape[2]}"
            assert f"def {name}(mem, P, p, first, stride):" in src
            assert f"K == {shape[0]} and R == {shape[1]} and Q == {shape[2]}:\n                {name}(" in src
        assert (f"def normalize_groups_{k}(" in src) == pattern.normalize
    # a wait where the barriers say, and one inside each normalizing kernel's step
    assert src.count("grid.sync()") == 1 + sum(p.normalize for p in patterns)
    assert "cuda.local.array(" not in src  # offsets in registers, sizes read once per step
    with pytest.raises(ValueError, match="at least one pattern"):
        cuda_schedule.schedule_source([], [])
    with pytest.raises(ValueError, match="1 shape lists for 2 patterns"):
        cuda_schedule.schedule_source(patterns[:2], shapes[:1])


def test_shaped_function_reads_the_table_before_its_loop_only():
    """The shaped function's point: every size and stride in a register before the loop
    over the thread's outputs, nested loops over the reduced axes in C order."""
    pattern = KernelPattern("PROB", "float64", True, False, False)
    lines = cuda.shaped_contract_fn("f", pattern, (3, 2, 2))
    loop = lines.index("    while o < n_out:")
    assert not [line for line in lines[loop:] if "P[" in line]
    strides = [line for line in lines[:loop] if re.match(r" +s\d+_\d+ = P\[p \+ \d+\]$", line)]
    assert len(strides) == 3 * 4  # each leaf's stride on each axis
    body = "\n".join(lines[loop:])
    assert "for j2 in range(n2):" in body and "for j3 in range(n3):" in body
    assert body.index("for j2") < body.index("for j3")  # axis 2 outer: the CPU's order
    assert "x = dmul_rn(x, mem[c1_3])" in body and "x = dmul_rn(x, mem[c2_3])" in body


def test_unsupported_float_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match=r"contract_reduce_prob_float16_reduce.*float16"):
        cuda.kernel_source(KernelPattern("PROB", "float16", True, False, False))


def test_load_module_writes_the_source_it_imports(tmp_path):
    pattern = KernelPattern("LOGPROB", "float64", True, True, False)
    module = cuda_run.load_module(pattern, tmp_path)
    path = tmp_path / f"catbp_cuda_{pattern.name}.py"
    assert path.read_text(encoding="utf-8") == cuda.kernel_source(pattern)
    assert module.__file__ == str(path)
    assert callable(getattr(module, cuda.ENTRY)) and callable(getattr(module, cuda.NORMALIZE_ENTRY))
    # no temporary file left (on a GPU, Numba's own cache of the compiled kernel, cache=True,
    # goes into __pycache__ beside the source)
    assert [p.name for p in tmp_path.iterdir() if p.name != "__pycache__"] == [path.name]


@pytest.mark.parametrize("threads, blocks", [(0, 8), (1025, 8), (32, 0), (2.0, 8), (True, 8)])
def test_bad_launch_options_are_refused_by_name(threads, blocks):
    with pytest.raises(ValueError, match=r"LaunchOptions: (threads_per_block|max_blocks) must"):
        cuda_run.LaunchOptions(threads, blocks)


def test_launch_shape_counts_outputs_and_groups():
    params = abi.StepParams(
        out=0,
        out_rank=2,
        red_rank=1,
        chunks=1,
        block_axes=0,
        block_size=1,
        sizes=(3, 4, 5),
        out_strides=(4, 1),
        leaves=((0, (20, 5, 1)),),
        groups=(3, 4, 1, -1),
    )
    assert cuda.launch_shape(params) == (12, 3)
    assert cuda_run.LaunchOptions(32, 1024).blocks(12) == 1
    assert cuda_run.LaunchOptions(5, 1024).blocks(12) == 3
    assert cuda_run.LaunchOptions(5, 2).blocks(12) == 2


def test_launches_take_small_blocks_under_the_simulator_only(monkeypatch):
    from numba import config

    for simulated, threads in ((1, cuda_run.SIMULATOR_THREADS_PER_BLOCK), (0, cuda.THREADS_PER_BLOCK)):
        monkeypatch.setattr(config, "ENABLE_CUDASIM", simulated)  # (read when options are made)
        assert cuda_run.LaunchOptions().threads_per_block == threads
        assert cuda_run.LaunchOptions(32).threads_per_block == 32
    assert cuda_run.SIMULATOR_THREADS_PER_BLOCK < cuda.THREADS_PER_BLOCK == 128


# Lowers every pattern for a GPU (NUMBA_ENABLE_CUDASIM=0): Numba types and lowers the
# kernels to NVVM IR, which needs numba-cuda but neither a GPU nor NVRTC. The simulator
# runs kernels as plain Python and types nothing, so this is where a kernel that a GPU
# would refuse shows up without one.
LOWER_FOR_A_GPU = textwrap.dedent("""
    import importlib.util, json, os, re, sys, types as pytypes
    from numba import types
    from numba.cuda import dispatcher
    from numba.cuda.compiler import compile_cuda

    # a device function is compiled for the current GPU's compute capability, and asks
    # the driver for it: here there is none, so every compile is for compute 7.5
    dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=(7, 5))
    from catbp_jit.codegen import cuda, cuda_schedule
    from catbp_jit.plan.schedule import KernelPattern

    DTYPES = {"float64": types.float64, "float32": types.float32, "bool": types.boolean,
              "int64": types.int64}
    out = {}
    for fields in json.loads(sys.argv[1]):
        pattern = KernelPattern(**fields)
        path = os.path.join(sys.argv[2], pattern.name + ".py")
        with open(path, "w") as f:
            f.write(cuda.kernel_source(pattern))
        spec = importlib.util.spec_from_file_location(pattern.name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        args = (DTYPES[pattern.dtype][::1], types.int64[::1], types.int64)
        for entry in [cuda.ENTRY] + ([cuda.NORMALIZE_ENTRY] if pattern.normalize else []):
            ir = compile_cuda(getattr(module, entry).py_func, types.void, args,
                              cc=(7, 5)).library.get_llvm_str()
            out[pattern.name + "." + entry] = {
                "fmul": len(re.findall(r"= fmul ", ir)),
                "mul_rn": len(re.findall(r'call \\w+ @"__nv_[df]mul_rn"', ir))}
    # the schedule kernel of each dtype's patterns: every step in one launch
    for dtype in sorted({f["dtype"] for f in json.loads(sys.argv[1])}):
        patterns = [KernelPattern(**f) for f in json.loads(sys.argv[1]) if f["dtype"] == dtype]
        path = os.path.join(sys.argv[2], "schedule_" + dtype + ".py")
        with open(path, "w") as f:
            # a step of two leaves, one output axis and one reduced axis (none if it does not reduce)
            shapes = [[(2, 1, 1 if p.reduce else 0)] for p in patterns]
            f.write(cuda_schedule.schedule_source(patterns, shapes))
        spec = importlib.util.spec_from_file_location("schedule_" + dtype, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        args = (DTYPES[dtype][::1], types.int64[::1], types.int64[::1], types.int64, types.int64)
        cres = compile_cuda(module.run_steps.py_func, types.void, args, cc=(7, 5))
        ir = cres.library.get_llvm_str()
        out["schedule." + dtype] = {
            "mul_rn": len(re.findall(r'call \\w+ @"__nv_[df]mul_rn"', ir)),
            "cooperative": bool(cres.library.use_cooperative),
            "kernels": len(patterns)}
    print(json.dumps(out))
""")


# lowering takes about a second a pattern: PROB's and MAXLOG's in float64 (a rounded
# product; a max and a subtraction) by default, the rest when slow
FIRST_LOWERED = "PROB and MAXLOG float64"


@pytest.mark.parametrize("group", [FIRST_LOWERED, pytest.param("the others", marks=pytest.mark.slow)])
def test_kernels_lower_for_a_gpu(tmp_path, group):
    """Every pattern types and lowers for a real GPU; a float product that feeds a sum is a
    libdevice call there (never an fmul that NVVM could fuse with the add into an fma)."""
    # (Numba's own numba.cuda, there without the cuda extra, compiles under other names)
    pytest.importorskip("numba_cuda", reason="lowering for a GPU needs numba-cuda: pip install -e '.[cuda]'")
    patterns = _patterns() + [KernelPattern("LOGPROB", "float32", True, True, False)]
    # MAXLOG's max and its NORMALIZE (its product is LOGPROB's), in float64
    patterns += [p for p in MAXLOG_PATTERNS if p.reduce and p.normalize and p.dtype == "float64"]
    first = [p for p in patterns if p.dtype == "float64" and p.semiring in ("PROB", "MAXLOG")]
    patterns = first if group == FIRST_LOWERED else [p for p in patterns if p not in first]
    env = dict(
        os.environ,
        NUMBA_ENABLE_CUDASIM="0",
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    child = subprocess.run(
        [sys.executable, "-c", LOWER_FOR_A_GPU, json.dumps([p.as_dict() for p in patterns]), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(REPO),
        timeout=600,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    lowered = json.loads(child.stdout.strip().splitlines()[-1])
    for pattern in patterns:
        found = lowered[pattern.name + ".kernel"]
        if pattern.reduce and pattern.semiring == "PROB":  # one product, in the leaf loop
            assert found == {"fmul": 0, "mul_rn": 1}, (pattern.name, found)
        if pattern.normalize:
            assert pattern.name + ".normalize" in lowered
    for dtype in {p.dtype for p in patterns}:
        found = lowered["schedule." + dtype]
        assert found["cooperative"], f"the {dtype} schedule kernel waits for its grid: a cooperative launch"
        sums = sum(p.dtype == dtype and p.reduce and p.semiring == "PROB" for p in patterns)
        assert found["mul_rn"] == sums, (dtype, found)  # the same rounded products as alone
