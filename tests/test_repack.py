"""Repacked leaves (plan/repack.py): which leaves a step copies into its vector's order,
where the copies go, and that every way of running a plan with them gives the bits the
plan without them gives. (That a run allocates nothing, copies included, is
test_jit_invariants.py's test on the grids, which repack.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import abi
from catbp_jit.bundle import load_bundle
from catbp_jit.plan.loops import ACROSS_OUTPUTS, LoopNest
from catbp_jit.plan.options import PlanOptions
from catbp_jit.plan.repack import choose_repacks, copy_strides, workspace_elements
from conftest import DATA
from jit_helpers import (
    assert_runs_give,
    assert_same_bits,
    compile_bundle,
    inputs,
    slot_copies,
    summed_products,
)

# ------------------------------------------------------------------------ the choice


def nest_of(leaves: list[list[int]]) -> LoopNest:
    """Six binary output axes, the last three the vector (8 elements), a product of
    leaves with these strides (the output C-contiguous)."""
    out = [32, 16, 8, 4, 2, 1]
    return LoopNest([2] * 6, [0] * 6, [out] + leaves, 3, ACROSS_OUTPUTS)


def accesses_of(nest: LoopNest) -> tuple[abi.Access, ...]:
    return tuple(nest.access(i) for i in range(1, len(nest.operands))) + (nest.access(0),)


def test_a_small_gathered_leaf_read_again_is_repacked():
    # leaf 0 moves along axis 0 outside the vector and is gathered along it (strides not
    # in C order); leaf 1 is contiguous; leaf 2 gathered but moves along every axis
    # outside the vector, so each copied vector would be read once
    nest = nest_of([[1, 0, 0, 2, 0, 4], [0, 0, 0, 4, 2, 1], [32, 16, 8, 1, 2, 4]])
    accesses = accesses_of(nest)
    assert [a.kind for a in accesses] == [abi.GATHERED, abi.CONTIGUOUS, abi.GATHERED, abi.CONTIGUOUS]
    (choice,) = choose_repacks(nest, accesses, max_elements=1 << 15, min_reuse=4, min_terms=64)
    assert (choice.j, choice.axes, choice.elements, choice.at) == (0, (0,), 2 * 8, 0)
    # the copy: position i of axis 0 at 8 * i, the vector in C order inside it
    assert copy_strides(nest, choice) == (8, 0, 0, 4, 2, 1)
    assert workspace_elements((choice,)) == 16
    # read 4 times each (8 vectors, 2 copied): not with a higher bar, nor a smaller copy,
    # nor in a step of fewer terms than asked (it has 64)
    assert choose_repacks(nest, accesses, max_elements=1 << 15, min_reuse=5, min_terms=64) == ()
    assert choose_repacks(nest, accesses, max_elements=15, min_reuse=4, min_terms=64) == ()
    assert choose_repacks(nest, accesses, max_elements=1 << 15, min_reuse=4, min_terms=65) == ()
    # leaf 2 too when a copied vector need only be read once
    both = choose_repacks(nest, accesses, max_elements=1 << 15, min_reuse=1, min_terms=64)
    assert [(c.j, c.at) for c in both] == [(0, 0), (2, 16)]  # each copy on 64 bytes
    assert workspace_elements(both) == 16 + 64


# ---------------------------------------------------------------- the same bits, a grid


@pytest.fixture(scope="module")
def grid():
    return load_bundle(DATA / "bench" / "grid4x8_d2__prob_float64")


@pytest.mark.parametrize("mode", ["compiled", "loop"])
def test_a_grid_repacks_leaves_and_keeps_its_bits(grid, mode):
    factors, selectors = inputs(grid)
    plain_exe = compile_bundle(grid, mode, repack=False)
    plain = slot_copies(plain_exe.bind().run(factors=factors, selectors=selectors))
    exe = compile_bundle(grid, mode)
    schedule = exe.schedule
    repacks = [i for i, step in enumerate(schedule.steps) if step.pattern.template == "repack"]
    assert len(repacks) > 50  # (120 steps, 197 copies on this grid when written)
    # the segments of the plan without copies, each once, and a repack step before some
    assert len(schedule.steps) == len(exe.fused.segments) + len(repacks)
    for i in repacks:
        params, reader = schedule.steps[i].params, schedule.steps[i + 1]
        assert abi.unpack_repack(schedule.table, schedule.param_offset(i)) == params
        assert reader.segment is schedule.steps[i].segment and isinstance(reader.params, abi.StepParams)
        scratch = exe.memory.scratch[exe.fused.segments.index(reader.segment)]
        for copy in params.copies:
            # the reader reads the copy, contiguous along its vector, from its workspace
            offset, _ = reader.params.leaves[copy.leaf]
            assert offset == copy.positions.dst and reader.params.accesses[copy.leaf].kind == abi.CONTIGUOUS
            assert (
                scratch.offset <= offset
                and offset + workspace_of(copy, params) <= scratch.offset + scratch.size
            )
            # from the leaf's own region
            leaf = reader.segment.leaves[copy.leaf]
            assert copy.positions.src == exe.memory.regions[leaf].offset
            assert len(copy.offsets) == params.block_size == reader.params.block_size
    assert_runs_give(plain, exe, factors, selectors, "repacked")


def test_a_repack_step_cut_in_chunks_copies_each_position_once(grid):
    """A repack step with much to copy is cut into chunks (schedule.repack_chunks): right
    after it ran (its chunks shared with the pool), each chunk alone, the last first,
    writes what the step wrote, and the call after the chunks writes nothing; a run gives
    the bits of the plan without copies."""
    factors, selectors = inputs(grid)
    bare = compile_bundle(grid, "loop", repack=False)
    plain = slot_copies(bare.bind().run(factors=factors, selectors=selectors))
    # (the grid's copies are small: a low bar cuts them)
    exe = compile_bundle(grid, "loop", parallel_min_work=1 << 12)
    schedule = exe.schedule
    chunked = {
        i for i, st in enumerate(schedule.steps) if st.pattern.template == "repack" and schedule.chunks(i) > 1
    }
    assert len(chunked) > 20, len(chunked)
    checked = []

    def after(i, step):
        if i not in chunked:
            return
        params, p, chunks = step.params, schedule.param_offset(i), schedule.chunks(i)
        assert params.chunks == chunks <= params.rows()
        assert abi.unpack_repack(sess.table, p) == params
        done = sess.mem.copy()
        for copy in params.copies:  # the copies' elements made NaN, then made again
            sess.mem[written(copy, params)] = np.nan
        entry = exe.kernels[schedule.kernel_id(i)].entry
        for chunk in reversed(range(chunks + 1)):  # (chunk == chunks: nothing to do)
            entry(*sess._addresses[:4], p, chunk, chunks)
        assert sess.mem.tobytes() == done.tobytes(), f"step {i}: {chunks} chunks"
        checked.append(i)

    sess = exe.bind(after=after)
    assert_same_bits(plain, slot_copies(sess.run(factors=factors, selectors=selectors)), "chunked copies")
    assert sorted(checked) == sorted(chunked)


def written(copy: abi.GatheredCopy, params: abi.RepackParams) -> np.ndarray:
    """The arena indices a copy writes: at each position (dst + Σ i_d dst_d), V of them."""
    c = copy.positions
    at = np.full((), c.dst, np.int64)
    for n, stride in zip(c.sizes, c.dst_strides):
        at = (at[..., None] + stride * np.arange(n)).reshape(-1)
    return (at.reshape(-1, 1) + np.arange(params.block_size)).ravel()


def workspace_of(copy: abi.GatheredCopy, params: abi.RepackParams) -> int:
    """Elements a copy spans: its positions' extent, then a whole vector."""
    c = copy.positions
    return sum((n - 1) * s for n, s in zip(c.sizes, c.dst_strides)) + params.block_size


# ------------------------------------------------------ the same bits, random products

SETTINGS = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


@st.composite
def products(draw):
    """A product of 2-4 leaves over 4-6 axes of sizes 2-3, each leaf on some of them in
    an order of its own (so gathered along a vector of several axes), summed over some."""
    program, specs = draw(summed_products(sizes=(2, 3), axes=(4, 6), leaves=(2, 4)))
    across = draw(st.sampled_from([None, "reduced", "outputs", "both"]))
    return program, specs, across


@settings(max_examples=40, **SETTINGS)
@given(products(), st.integers(0, 2**32 - 1))
def test_repacked_products_give_the_bits_of_the_plan_without_slot_copies(product, seed):
    """Every gathered leaf that moves outside the vector repacked (the bars at their
    lowest, short vectors so that there are many): loop kernels and the numpy tier give
    the bits of the plan without copies, and the reference's values."""
    from catbp_jit.reference import run_program

    program, specs, across = product
    note(f"{program}\nacross {across}")
    # (PROB alone: a copy moves values whatever the semiring, and every semiring's kernels
    # read a CONTIGUOUS leaf with the same loop; a MAXLOG kernel per vector kind would cost
    # the suite's cold run a compile each)
    sr = catbp_jit.make_semiring("PROB")
    rng = np.random.default_rng(seed)
    values = {f: sr.kind.potentials(rng.uniform(0.1, 2.0, spec.shape), sr.dtype) for f, spec in specs.items()}

    def results(sess) -> dict:
        return slot_copies(sess.run(factors=values))

    def exe(**options):
        return catbp_jit.compile(
            program, sr, factor_specs=specs, mode="loop", options=PlanOptions(across=across, **options)
        )

    repacking = exe(repack_min_reuse=1, repack_min_terms=1, block=8)
    event(f"repacks a leaf: {any(st.pattern.template == 'repack' for st in repacking.schedule.steps)}")
    want = results(exe(repack=False, block=8).bind())
    assert_same_bits(want, results(repacking.bind()), "kernels")
    assert_same_bits(want, results(repacking.bind(numpy_only=True)), "numpy tier")
    ref = np.asarray(run_program(program, sr, lambda f: (values[f], specs[f]), lambda s: None)[("x",)][0])
    # numpy sums pairwise: the reference's last bits differ
    assert np.allclose(want[("x",)], ref, rtol=1e-12, atol=0), (want, ref)


def test_a_plan_over_the_memory_limit_drops_its_copies_first(grid):
    """The copies' workspace is speed, not need: a plan that fits only without it is made
    without repacking (and one that does not fit either way is refused, as before)."""
    from catbp_jit.executable import plan
    from catbp_jit.memory import PlanTooLargeError

    def planned(**kw):
        specs = dict(factor_specs=grid.factor_specs(), selector_specs=grid.selector_specs())
        return plan(grid.programs, grid.semiring_runtime(), **specs, **kw)

    full, bare = planned(), planned(options=PlanOptions(repack=False))
    assert bare.memory.total_bytes < full.memory.total_bytes
    tight = planned(options=PlanOptions(max_total_bytes=bare.memory.total_bytes))
    assert not tight.options.repack and tight.memory.total_bytes == bare.memory.total_bytes
    assert [st.pattern for st in tight.schedule.steps] == [st.pattern for st in bare.schedule.steps]
    with pytest.raises(PlanTooLargeError):
        planned(options=PlanOptions(max_total_bytes=bare.memory.total_bytes - 1))


def test_equal_offset_tables_are_placed_once(grid):
    """A grid's steps repeat a few shapes: every GATHERED access and repack copy with the
    same offsets (and windows or not, abi.windowed_table) reads one table in P (grid4x8:
    916 tables, 157 distinct), which holds those offsets."""
    schedule = compile_bundle(grid, "compiled").schedule
    placed: dict[tuple, set] = {}
    every = 0  # entries, had each table its own place
    for step in schedule.steps:
        tables = [(a.offsets, a.step, a.table) for a in step.params.accesses if a.kind == abi.GATHERED]
        if isinstance(step.params, abi.RepackParams):
            tables += [(c.offsets, c.step, c.table) for c in step.params.copies]
        for offsets, windows, at in tables:
            every += len(offsets)
            placed.setdefault((offsets, windows), set()).add(at)
            table = [int(x) for x in schedule.table[at : at + len(offsets)]]
            assert abi.table_offsets(table, windows) == offsets
    assert sum(len(at) for at in placed.values()) == len(placed) < 300, len(placed)
    assert sum(len(o) for o, _ in placed) < every / 2


# A copy moves a line at a time (codegen/cpu_repack.py: a gather and a store per line) in
# float64, int64 and float32 (16 elements to a line), an element at a time in bools
KINDS = [("PROB", "float64"), ("COUNT", "int64"), ("PROB", "float32"), ("SAT", "bool")]


@settings(max_examples=16, **SETTINGS)
@given(products(), st.sampled_from(KINDS), st.sampled_from([8, 24, 256]), st.integers(0, 2**32 - 1))
def test_copies_a_line_at_a_time_in_every_dtype(product, kind, block, seed):
    """Vectors of whole lines and parts of lines (block 8, 24, 256: a part of a float32
    line, one float64 line, lines and a part): the bits of the plan without copies."""
    program, specs, across = product
    note(f"{program}\nacross {across}, {kind}, block {block}")
    sr = catbp_jit.make_semiring(*kind)
    rng = np.random.default_rng(seed)
    values = {
        f: sr.kind.potentials(rng.uniform(0.1, 2.0, spec.shape) * (rng.random(spec.shape) < 0.8), sr.dtype)
        for f, spec in specs.items()
    }

    def exe(**options):
        options = PlanOptions(across=across, block=block, **options)
        return catbp_jit.compile(program, sr, factor_specs=specs, mode="loop", options=options)

    repacking = exe(repack_min_reuse=1, repack_min_terms=1)
    event(f"repacks a leaf: {any(st.pattern.template == 'repack' for st in repacking.schedule.steps)}")
    want = slot_copies(exe(repack=False).bind().run(factors=values))
    assert_same_bits(want, slot_copies(repacking.bind().run(factors=values)), f"{kind} block {block}")
