"""Streaming stores (abi.STREAMED): which steps write their output with non-temporal
stores, the intrinsics that do it at every alignment, and that a plan whose every
contiguous output streams gives the bits of the plan without."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, event, given, note
from hypothesis import strategies as st
from numba import njit

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec, abi
from catbp_jit.bundle import load_bundle
from catbp_jit.codegen.intrinsics import (
    LINE_BYTES,
    fence_stores,
    line_rest,
    prefetch_for_write,
    store_line,
    store_part,
)
from catbp_jit.executable import plan_options
from catbp_jit.plan.loops import ACROSS_REDUCED
from catbp_jit.plan.options import PlanOptions
from conftest import DATA
from jit_helpers import assert_same_bits, compile_bundle, inputs, settings, slot_copies, summed_products


@njit(cache=False)
def streamed_copy(dst, at, src, n):
    """dst[at : at + n] = src[:n] as codegen/cpu.py's store writes a STREAMED output."""
    head = min(n, line_rest(dst, at))
    store_part(dst, at, src, 0, head)
    v = head
    width = LINE_BYTES // dst.itemsize
    while v + width <= n:
        store_line(dst, at + v, src, v)
        v += width
    store_part(dst, at + v, src, v, n - v)
    fence_stores()


@njit(cache=False)
def rest_of(arr, i):
    return line_rest(arr, i)


@pytest.mark.parametrize(
    "dtype, sums",
    # (float64 sums into float32 outputs: a float32 kernel's sums across outputs)
    [
        (np.float64, np.float64),
        (np.float32, np.float32),
        (np.float32, np.float64),
        (np.int64, np.int64),
        (np.bool_, np.bool_),
    ],
)
def test_streamed_stores_write_exactly_their_elements_at_every_alignment(dtype, sums):
    rng = np.random.default_rng(7)
    src = (rng.uniform(0, 9, 300) * (1 + 1e-9)).astype(sums)
    space = np.zeros(512 + 64, dtype)
    # a line-aligned start, so that `at` walks every position in a line
    aligned = space[(-space.ctypes.data % LINE_BYTES) // space.itemsize :]
    width = LINE_BYTES // space.itemsize
    assert [rest_of(aligned, i) for i in range(width + 1)] == [0] + list(range(width - 1, -1, -1))
    for at in range(2 * width):
        for n in (0, 1, width - 1, width, width + 1, 3 * width + 5, 243):
            dst = aligned.copy()
            dst[:] = 0
            streamed_copy(dst, at, src, n)  # `at` walks every place in a line, whatever dst's
            want = np.zeros_like(dst)
            want[at : at + n] = src[:n]  # (numpy rounds float64 to float32 as LLVM's fptrunc)
            assert np.array_equal(dst, want), (at, n)


def test_only_the_cpu_target_streams_and_the_bar_is_checked():
    assert PlanOptions().streaming_store_bytes == 32 << 20
    assert plan_options("cpu", None).streaming_store_bytes == 32 << 20
    assert plan_options("cuda", None).streaming_store_bytes is None
    assert plan_options("cuda", PlanOptions(streaming_store_bytes=0)).streaming_store_bytes is None
    # products a line at a time in registers: the CPU's kernels alone
    assert plan_options("cpu", None).line_products
    assert not plan_options("cuda", PlanOptions(line_products=True)).line_products
    for bad in (-1, 1.5, True, "32M"):
        with pytest.raises(ValueError, match="streaming_store_bytes"):
            PlanOptions(streaming_store_bytes=bad)


# ---------------------------------------------------------------- the same bits, a grid


@pytest.fixture(scope="module")
def grid():
    return load_bundle(DATA / "bench" / "grid4x8_d2__prob_float64")


def output_kinds(exe) -> list[int]:
    return [st.params.accesses[-1].kind for st in exe.schedule.steps if isinstance(st.params, abi.StepParams)]


@pytest.mark.parametrize("mode", ["compiled", "loop"])
def test_a_grid_whose_outputs_all_stream_keeps_its_bits(grid, mode):
    factors, selectors = inputs(grid)
    plain = compile_bundle(grid, mode, streaming_store_bytes=None)
    assert abi.STREAMED not in output_kinds(plain)
    # the default bar (32 MiB) is far above this grid's values: nothing streams
    assert output_kinds(compile_bundle(grid, mode)) == output_kinds(plain)
    exe = compile_bundle(grid, mode, streaming_store_bytes=0)
    kinds = output_kinds(exe)
    # every output that was CONTIGUOUS now streams, but where a kernel stores one element
    # at a time (sums across reduced axes)
    for step, was, now in zip(
        (s for s in exe.schedule.steps if isinstance(s.params, abi.StepParams)), output_kinds(plain), kinds
    ):
        one_at_a_time = step.pattern.reduce and step.pattern.vector == ACROSS_REDUCED
        assert now == (abi.STREAMED if was == abi.CONTIGUOUS and not one_at_a_time else was)
        # a streamed product computes its lines in registers (codegen/cpu_lines.py)
        if now == abi.STREAMED and not step.pattern.reduce and not step.pattern.normalize:
            assert step.pattern.template == "contract_lines"
    assert kinds.count(abi.STREAMED) > 20  # (77 of 120 steps when written)
    want = slot_copies(plain.bind().run(factors=factors, selectors=selectors))
    sess = exe.bind()
    assert_same_bits(want, slot_copies(sess.run(factors=factors, selectors=selectors)), "streamed")
    assert_same_bits(want, slot_copies(sess.run()), "streamed, run again")
    numpy = exe.bind(numpy_only=True)
    assert_same_bits(want, slot_copies(numpy.run(factors=factors, selectors=selectors)), "numpy tier")


def test_float32_sums_across_outputs_stream_in_their_dtype():
    """A float32 kernel sums in float64 (`sums`) and stores float32: a streamed store
    rounds as the plain one does. (PROB alone: LOGPROB's float64 `tops` are stored by the
    same store, and its float32 kernels would cost the suite's cold run ~18 s.)"""
    sr = catbp_jit.make_semiring("PROB", "float32")
    G = AxisType.GEOMETRIC
    a, b, c = Axis(0, G, 37), Axis(1, G, 5), Axis(2, G, 11)
    specs = {0: TensorSpec((a, b, c)), 1: TensorSpec((b, c))}
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins.append(Instruction(OpCode.CONTRACT, 10, {"inputs": (0, 1), "out_spec": TensorSpec((a, b, c))}))
    ins.append(Instruction(OpCode.ELIMINATE, 11, {"src": 10, "keep_keys": (a.key, c.key)}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 11}))
    program = Program(tuple(ins), "upward")
    rng = np.random.default_rng(3)
    values = {f: sr.kind.potentials(rng.uniform(0.1, 2.0, spec.shape), sr.dtype) for f, spec in specs.items()}

    def exe(bar):
        options = PlanOptions(across="outputs", streaming_store_bytes=bar)
        return catbp_jit.compile(program, sr, factor_specs=specs, mode="loop", options=options)

    streaming = exe(0)
    step = next(s for s in streaming.schedule.steps if s.pattern.reduce)
    assert step.pattern.vector != ACROSS_REDUCED and step.params.accesses[-1].kind == abi.STREAMED
    want = slot_copies(exe(None).bind().run(factors=values))
    assert want[("x",)].dtype == np.float32
    assert_same_bits(want, slot_copies(streaming.bind().run(factors=values)), "float32")


# ------------------------------------------------------ the same bits, random products


@st.composite
def products(draw):
    """A product of 1-3 leaves over 2-5 axes of sizes 1-7 (rows of any length, so lines
    cut anywhere), each leaf on some of them in an order of its own, summed over some
    or none."""
    program, specs = draw(summed_products(sizes=(1, 7), axes=(2, 5), leaves=(1, 3)))
    across = draw(st.sampled_from([None, "outputs", "both"]))
    parallel = draw(st.booleans())
    block = draw(st.sampled_from([8, 256]))
    return program, specs, across, parallel, block


@settings(40)
@given(products(), st.integers(0, 2**32 - 1))
def test_streamed_outputs_give_the_bits_of_plain_stores(product, seed):
    """Every contiguous output streamed (the bar at 0), serial and parallel (3 chunks, so
    that chunks end inside lines): the bits of the plan with plain stores, and the
    reference's values."""
    from catbp_jit.reference import run_program

    program, specs, across, parallel, block = product
    note(f"{program}\nacross {across}, parallel {parallel}, block {block}")
    # (PROB alone: the store is the same loop for every semiring)
    sr = catbp_jit.make_semiring("PROB")
    rng = np.random.default_rng(seed)
    values = {f: sr.kind.potentials(rng.uniform(0.1, 2.0, spec.shape), sr.dtype) for f, spec in specs.items()}
    knobs = dict(across=across, block=block, chunks=3)
    if parallel:
        knobs["parallel_min_work"] = 1

    def exe(**options):
        options = PlanOptions(**knobs, **options)
        return catbp_jit.compile(program, sr, factor_specs=specs, mode="loop", options=options)

    streaming = exe(streaming_store_bytes=0)
    event(f"streams: {abi.STREAMED in output_kinds(streaming)}")
    want = slot_copies(exe(streaming_store_bytes=None).bind().run(factors=values))
    assert_same_bits(want, slot_copies(streaming.bind().run(factors=values)), "kernels")
    ref = np.asarray(run_program(program, sr, lambda f: (values[f], specs[f]), lambda s: None)[("x",)][0])
    assert np.allclose(want[("x",)], ref, rtol=1e-12, atol=0), (want, ref)


# A streamed product's ⊗ in each of its forms: float `*` (PROB), float `+` (LOGPROB; MAXLOG's
# is the same), int64 `*` that wraps (COUNT), `&` of bools (SAT, 64 lanes to a line). Other
# dtypes' lines: test_lines.py (each kind here is two kernels more to compile cold)
KINDS = [("PROB", "float64"), ("LOGPROB", "float64"), ("SAT", "bool"), ("COUNT", "int64")]


@st.composite
def plain_products(draw):
    """A product of 1-4 leaves over 2-4 axes of sizes 1-9, nothing summed (each leaf on
    some axes, in an order of its own: every access kind), and how it is planned."""
    program, specs = draw(summed_products(sizes=(1, 9), axes=(2, 4), leaves=(1, 4)))
    every = program.instructions[-2].args["src"]
    ins = list(program.instructions)
    axes = ins[-3].args["out_spec"].axes
    ins[-2] = Instruction(OpCode.ELIMINATE, 11, {"src": every, "keep_keys": tuple(a.key for a in axes)})
    kind = draw(st.sampled_from(KINDS))
    parallel, block, repack = draw(st.booleans()), draw(st.sampled_from([8, 256])), draw(st.booleans())
    return normalized(draw, ins, kind), specs, kind, parallel, block, repack


def normalized(draw, ins: list[Instruction], kind: tuple[str, str]) -> Program:
    """The program of `ins`, its result (value 11) NORMALIZEd before it is stored, or not
    (PROB and LOGPROB: SAT and COUNT do not normalize)."""
    if kind[0] in ("PROB", "LOGPROB") and draw(st.booleans()):
        ins = ins[:-1] + [Instruction(OpCode.NORMALIZE, None, {"src": 11}), ins[-1]]
    return Program(tuple(ins), "upward")


def potentials(kind, spec, rng) -> np.ndarray:
    """Values of a leaf: zeros among them (-inf in logs), int64 counts that overflow."""
    name, dtype = kind
    if name == "COUNT":
        return rng.integers(-(2**40), 2**40, spec.shape)
    if name == "SAT":
        return rng.random(spec.shape) < 0.7
    sr = catbp_jit.make_semiring(name, dtype)
    raw = rng.uniform(0.1, 2.0, spec.shape) * (rng.random(spec.shape) < 0.9)
    return sr.kind.potentials(raw, sr.dtype)


def planned(program, specs, kind, parallel, block, repack, seed, **knobs):
    """The factors' values (potentials, from seed) and a compile of the program in loop
    mode with these knobs, in 3 chunks (chunks end inside lines) if parallel, and the
    options each call adds."""
    name, dtype = kind
    note(f"{program}\n{name} {dtype}, parallel {parallel}, block {block}, repack {repack}, {knobs}")
    sr = catbp_jit.make_semiring(name, dtype)
    rng = np.random.default_rng(seed)
    values = {f: np.asarray(potentials(kind, spec, rng), dtype=sr.dtype) for f, spec in specs.items()}
    knobs.update(
        block=block,
        chunks=3,
        repack=repack,
        parallel_min_work=1 if parallel else PlanOptions().parallel_min_work,
    )

    def exe(**options):
        options = PlanOptions(**knobs, **options)
        return catbp_jit.compile(program, sr, factor_specs=specs, mode="loop", options=options)

    return values, exe


@settings(20)  # (20 s of the default suite at 30)
@given(plain_products(), st.integers(0, 2**32 - 1))
def test_line_products_keep_the_bits_of_buffered_ones_in_every_semiring(product, seed):
    """contract_lines's lines in registers, whole and in parts, streamed or not, in every
    semiring, NORMALIZEd or not: the bits of contract_reduce's products through buf,
    serial and in chunks that end inside lines."""
    values, exe = planned(*product, seed)
    buffered = exe(streaming_store_bytes=None, line_products=False)
    assert "contract_lines" not in {s.pattern.template for s in buffered.schedule.steps}
    want = slot_copies(buffered.bind().run(factors=values))
    for bar in (0, None):
        lines = exe(streaming_store_bytes=bar)
        kinds = {
            s.params.accesses[-1].kind for s in lines.schedule.steps if s.pattern.template == "contract_lines"
        }
        event(f"streamed {bar == 0}: line products' outputs {sorted(kinds)}")
        event(f"NORMALIZEd in lines: {any(s.pattern.normalize for s in lines.schedule.steps)}")
        assert_same_bits(want, slot_copies(lines.bind().run(factors=values)), f"lines, bar {bar}")


def line_sums(exe) -> list:
    return [s for s in exe.schedule.steps if s.pattern.template == "contract_lines" and s.pattern.reduce]


@st.composite
def reductions(draw):
    """A product of 1-4 leaves over 2-5 axes of sizes 1-9 summed over some of them, across
    outputs (rows of any length, chunks that end inside lines), in PROB or COUNT."""
    program, specs = draw(summed_products(sizes=(1, 9), axes=(2, 5), leaves=(1, 4)))
    kept, every = program.instructions[-2].args["keep_keys"], program.instructions[-3].args["out_spec"].axes
    assume(len(kept) < len(every))  # (something summed)
    kind = draw(st.sampled_from([("PROB", "float64"), ("COUNT", "int64")]))
    parallel, block, repack = draw(st.booleans()), draw(st.sampled_from([8, 256])), draw(st.booleans())
    return normalized(draw, list(program.instructions), kind), specs, kind, parallel, block, repack


@settings(20)
@given(reductions(), st.integers(0, 2**32 - 1))
def test_line_sums_keep_the_bits_of_buffered_ones(reduction, seed):
    """contract_lines's reductions across outputs (sums of lines of products, whole and in
    parts, to outputs contiguous or scattered, NORMALIZEd or not): the bits of
    contract_reduce's kernel across outputs, serial and in chunks, and every output summed
    once however its row is cut."""
    values, exe = planned(*reduction, seed, across="outputs")
    buffered = exe(line_products=False, streaming_store_bytes=None)
    want = slot_copies(buffered.bind().run(factors=values))
    for bar in (0, None):  # every contiguous output streamed, and none
        lines = exe(streaming_store_bytes=bar)
        sums = line_sums(lines)
        kinds = sorted({s.params.accesses[-1].kind for s in sums})
        event(f"bar {bar}: line sums {len(sums)}, outputs {kinds}")
        event(f"NORMALIZEd line sums: {sum(s.pattern.normalize for s in sums)}")
        assert_same_bits(want, slot_copies(lines.bind().run(factors=values)), f"line sums, bar {bar}")


def test_a_grid_sums_across_outputs_in_lines():
    """grid4x8_d2's exact plan: its reductions across outputs are contract_lines kernels,
    with the bits of contract_reduce's (contiguous outputs: rows of whole lines and parts)."""
    bundle = load_bundle(DATA / "bench" / "grid4x8_d2__prob_float64")
    factors, selectors = inputs(bundle)
    lines = compile_bundle(bundle, "loop")
    sums = line_sums(lines)
    assert len(sums) > 20  # (58 of 468 steps when written)
    assert not [s for s in lines.schedule.steps if s.pattern.name.endswith("_across_outputs")]
    buffered = compile_bundle(bundle, "loop", line_products=False)
    want = slot_copies(buffered.bind().run(factors=factors, selectors=selectors))
    assert_same_bits(want, slot_copies(lines.bind().run(factors=factors, selectors=selectors)), "grid4x8_d2")


def test_line_kernels_stream_with_non_temporal_stores():
    """The machine code of a line kernel has streaming stores (x86-64), for its STREAMED
    outputs: LLVM once merged them with the plain stores of the other branch, dropping
    their mark (codegen/lines.py: put_line)."""
    import platform

    from catbp_jit.codegen.loader import cpu_source, scratch_compile
    from catbp_jit.plan.steps import KernelPattern

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("streaming stores are x86-64's")
    asm = scratch_compile(
        cpu_source(KernelPattern("PROB", "float64", False, False, False, template="contract_lines"))
    )
    assert "vmovntpd" in asm or "movntpd" in asm


def test_line_kernels_ask_for_the_lines_where_rows_meet():
    """A line kernel prefetches, for writing, the output's line where two rows meet a few
    rows ahead (codegen/cpu_lines.py: AHEAD): those lines take masked stores, which waited
    for them from memory. x86-64 has an instruction for it (prefetchw, or prefetcht0 on a
    core without it)."""
    import platform

    from catbp_jit.codegen.loader import cpu_source, scratch_compile
    from catbp_jit.plan.steps import KernelPattern

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the instruction checked is x86-64's")
    for reduce in (False, True):
        source = cpu_source(KernelPattern("PROB", "float64", reduce, False, False, template="contract_lines"))
        assert "prefetch_for_write(mem, o_off + AHEAD * V)" in source
        asm = scratch_compile(source)
        assert "prefetchw" in asm or "prefetcht0" in asm, reduce


@njit(cache=False)
def prefetched_sum(arr, at):
    for i in at:
        prefetch_for_write(arr, i)
    return arr.sum()


def test_a_prefetch_moves_nothing_and_never_faults():
    """prefetch_for_write is a hint: it writes nothing, and an index outside the array
    (a row AHEAD rows past an output's end, in the arena or beyond it) does not fault."""
    arr = np.arange(64.0)
    want = arr.copy()
    at = np.array([0, 63, 64, 1000, 1 << 20, -1, -(1 << 20)], dtype=np.int64)
    assert prefetched_sum(arr, at) == want.sum()
    assert arr.tobytes() == want.tobytes()


def test_line_products_where_every_product_can_be_or_its_output_streams():
    """schedule.in_lines: every product is a line product, with a NORMALIZE or not,
    whatever its output's access. Reductions across outputs too, where every one of them
    can be (KernelPattern.sums_in_lines, rows of at most abi.LINE_SUMS_MAX elements, with
    a NORMALIZE or not); never those across reduced axes."""
    from types import SimpleNamespace

    from catbp_jit.plan.loops import ACROSS_OUTPUTS
    from catbp_jit.plan.schedule import in_lines
    from catbp_jit.plan.steps import KernelPattern, Step

    def step(kind, reduce=False, normalize=False, vector=ACROSS_OUTPUTS, V=64, kind_of=("PROB", "float64")):
        accesses = (abi.Access(abi.CONTIGUOUS, 1), abi.Access(kind, 1))
        params = SimpleNamespace(accesses=accesses, block_size=V)
        return Step(None, KernelPattern(*kind_of, reduce, normalize, False, vector), params, 1)

    def templates(steps, **options):
        return [st.pattern.template for st in in_lines(steps, PlanOptions(**options))]

    lines, buf = "contract_lines", "contract_reduce"
    fit = [step(abi.CONTIGUOUS), step(abi.STREAMED), step(abi.GATHERED), step(abi.STRIDED)]
    fit.append(step(abi.CONTIGUOUS, reduce=True, vector=ACROSS_REDUCED))
    assert templates(fit) == [lines, lines, lines, lines, buf]
    assert templates(fit + [step(abi.CONTIGUOUS, normalize=True)]) == [lines] * 4 + [buf, lines]
    assert templates(fit, line_products=False) == [buf] * 5
    sums = [step(abi.CONTIGUOUS, reduce=True), step(abi.GATHERED, reduce=True, V=abi.LINE_SUMS_MAX)]
    assert templates(sums) == [lines, lines]
    assert templates(sums + [step(abi.STREAMED, reduce=True, normalize=True)]) == [lines] * 3
    assert templates(sums, line_products=False) == [buf, buf]
    assert templates([step(abi.CONTIGUOUS, reduce=True, kind_of=("COUNT", "int64"))]) == [lines]
    assert templates(sums + [step(abi.CONTIGUOUS, reduce=True, V=abi.LINE_SUMS_MAX + 1)]) == [buf] * 3
    others = (("PROB", "float32"), ("LOGPROB", "float64"), ("SAT", "bool"), ("MAXLOG", "float64"))
    for other in others:
        assert templates([step(abi.CONTIGUOUS, reduce=True, kind_of=other)]) == [buf]


def scattered_product(reduce: bool) -> tuple[Program, dict]:
    """Z[b, a] = the product of 16 leaves f[a, b] (or, reduce: Z[b, a] = sum over c of the
    product of f[c, a, b]): each leaf contiguous where Z is not. 16 contiguous leaves cost
    less than 16 gathered ones, so the vector is the leaves' order and Z is scattered."""
    G = AxisType.GEOMETRIC
    a, b, c = Axis(0, G, 4), Axis(1, G, 64), Axis(2, G, 3)
    held = (c, a, b) if reduce else (a, b)
    specs = {f: TensorSpec(held) for f in range(16)}
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    every = TensorSpec((b, a, c) if reduce else (b, a))
    ins.append(Instruction(OpCode.CONTRACT, 100, {"inputs": tuple(specs), "out_spec": every}))
    if reduce:
        ins.append(Instruction(OpCode.ELIMINATE, 101, {"src": 100, "keep_keys": (b.key, a.key)}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": ins[-1].dst}))
    return Program(tuple(ins), "upward"), specs


@pytest.mark.parametrize("reduce", [False, True])
@pytest.mark.parametrize("exact", [True, False])
def test_line_kernels_scatter_an_output_gathered_along_the_vector(exact, reduce):
    """A product (and a sum across outputs) whose output is GATHERED along the vector (its
    layout is not the loop's order): a line kernel writes it a lane at a time
    (codegen/cpu_lines.py: scatter), the bits of the buffered kernel's."""
    program, specs = scattered_product(reduce)
    sr = catbp_jit.make_semiring("PROB")
    rng = np.random.default_rng(7)
    values = {f: rng.uniform(0.5, 1.5, spec.shape) for f, spec in specs.items()}

    def exe(**options):
        options = PlanOptions(max_leaves=16, across="outputs" if reduce else None, **options)
        return catbp_jit.compile(program, sr, factor_specs=specs, mode="loop", exact=exact, options=options)

    lines = exe()
    scattered = [
        s
        for s in lines.schedule.steps
        if s.pattern.template == "contract_lines" and s.params.accesses[-1].kind == abi.GATHERED
    ]
    assert [s.pattern.reduce for s in scattered] == [reduce]
    want = slot_copies(exe(line_products=False).bind().run(factors=values))
    assert_same_bits(want, slot_copies(lines.bind().run(factors=values)), "scattered")
