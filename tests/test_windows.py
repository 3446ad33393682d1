"""Window words (abi.window_words, PlanOptions.window_words): a line kernel's GATHERED leaf
and a repack step's copy whose lines each lie in a window of 8 elements read each line
from a word the plan packs, one load and a permute. Which accesses get them, that every
window stays in the buffer, and that runs give the bits of the plan without them.
(codegen/lines.py's loaders themselves: test_lines.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from catbp_jit import abi
from catbp_jit.bundle import load_bundle
from catbp_jit.executable import plan_options
from catbp_jit.plan.options import PlanOptions
from catbp_jit.plan.schedule import copy_highest, leaf_highest, rows_start_lines, windowed
from catbp_jit.session import Session, aligned_empty
from conftest import DATA
from jit_helpers import assert_runs_give, assert_same_bits, compile_bundle, inputs, slot_copies


@pytest.fixture(scope="module")
def grid():
    return load_bundle(DATA / "bench" / "grid4x8_d2__prob_float64")


def windowed_reads(exe):
    """The windowed leaves (step, leaf) of loop steps, and the windowed copies (step,
    copy) of repack steps."""
    leaves, copies = [], []
    for i, st in enumerate(exe.schedule.steps):
        if isinstance(st.params, abi.RepackParams):
            copies += [(i, c) for c in st.params.copies if c.step == abi.WINDOWED]
        elif isinstance(st.params, abi.StepParams):
            accesses = enumerate(st.params.accesses)
            leaves += [(i, j) for j, a in accesses if a.kind == abi.GATHERED and a.step == abi.WINDOWED]
    return leaves, copies


@pytest.mark.parametrize("mode", ["compiled", "loop"])
def test_a_grid_reads_windows_and_keeps_its_bits(grid, mode):
    """grid4x8_d2 reassociating: most gathered leaves of its line kernels and most copies
    are windowed, each in a step whose rows start on a line, its table the offsets with a
    word at each line's start, every window inside the buffer; runs (and the numpy tier)
    give the bits of the plan without words."""
    factors, selectors = inputs(grid)
    plain_exe = compile_bundle(grid, mode, exact=False, window_words=False)
    assert windowed_reads(plain_exe) == ([], [])
    plain = slot_copies(plain_exe.bind().run(factors=factors, selectors=selectors))
    exe = compile_bundle(grid, mode, exact=False)
    schedule, total = exe.schedule, exe.memory.total
    leaves, copies = windowed_reads(exe)
    assert len(leaves) > 300 and len(copies) > 20, (len(leaves), len(copies))
    for i, j in leaves:
        st = schedule.steps[i]
        acc = st.params.accesses[j]
        assert st.pattern.template == "contract_lines" and j < len(st.params.leaves)
        assert rows_start_lines(st.params) and acc.kind == abi.GATHERED
        table = tuple(int(x) for x in schedule.table[acc.table : acc.table + st.params.block_size])
        assert abi.table_offsets(table, abi.WINDOWED) == acc.offsets
        assert leaf_highest(st.params, j) + abi.W_WINDOW <= total
        assert abi.unpack(schedule.table, schedule.param_offset(i)).accesses[j] == acc
    for i, copy in copies:
        assert copy_highest(copy) + abi.W_WINDOW <= total
        assert copy in abi.unpack_repack(schedule.table, schedule.param_offset(i)).copies
    assert_runs_give(plain, exe, factors, selectors, "windows")


def test_a_grids_exact_plan_keeps_its_bits_too(grid):
    """Exact mode (a plan of other vectors and copies): the same bits with and without."""
    factors, selectors = inputs(grid)
    plain_exe = compile_bundle(grid, "compiled", window_words=False)
    plain = plain_exe.bind().run(factors=factors, selectors=selectors)
    exe = compile_bundle(grid, "compiled")
    assert all(windowed_reads(exe))
    got = exe.bind().run(factors=factors, selectors=selectors)
    assert_same_bits(slot_copies(plain), slot_copies(got), "exact, windows")


def test_a_window_must_end_in_the_buffer():
    """A window is loaded whole from its lowest element: where a leaf's highest element
    is fewer than 8 from the buffer's end, a window could reach past it, so its table
    stays plain. So does one whose lines do not lie in windows."""
    offsets = (0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 4, 5, 6, 7)
    table = windowed(offsets, 92, 100)
    assert table is not None and abi.table_offsets(table, abi.WINDOWED) == offsets
    assert table[1:8] == offsets[1:8] and table[0] == abi.window_words(offsets)[0]
    assert windowed(offsets, 93, 100) is None
    assert windowed((0, 8) + offsets[2:], 10, 100) is None


def test_rows_start_lines_where_the_output_and_its_row_strides_do():
    def step(out: int, out_strides: tuple[int, ...], kind: int = abi.CONTIGUOUS) -> abi.StepParams:
        leaf = (0, (0, 1, 0))
        access = abi.Access(abi.GATHERED, 0, tuple(range(16)))
        sizes = (3, 4, 4)  # a row: the last two axes (16 elements)
        accesses = (access, abi.Access(kind, 1))
        return abi.StepParams(out, 3, 0, 1, 2, 16, sizes, out_strides, (leaf,), (1, 0, 1, -1), accesses)

    assert rows_start_lines(step(64, (16, 4, 1)))
    assert not rows_start_lines(step(60, (16, 4, 1)))  # (the output from mid-line)
    assert not rows_start_lines(step(64, (20, 4, 1)))  # (rows 20 elements apart)
    assert rows_start_lines(step(60, (20, 5, 1), abi.STRIDED))  # a scattered output: lane 0


def test_a_session_buffer_must_start_on_a_line(grid):
    """The plan counts on the buffer's element 0 starting a cache line (rows that start on
    a line read windows): a buffer handed in that does not is refused."""
    exe = compile_bundle(grid, "compiled", exact=False)
    space = aligned_empty(exe.memory.total + 1, exe.dtype)
    with pytest.raises(ValueError, match="64-byte boundary"):
        Session(exe, mem=space[1:])
    Session(exe, mem=space[:-1])
    assert np.asarray(space).ctypes.data % 64 == 0


def test_only_the_cpu_target_plans_words():
    """The CUDA target's kernels read a gathered element through its offset: its plans
    have no window words, whatever the options ask."""
    assert plan_options("cpu", None).window_words
    assert not plan_options("cuda", None).window_words
    assert not plan_options("cuda", PlanOptions(window_words=True)).window_words
