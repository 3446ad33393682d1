"""A GEMM step's copies (codegen/cpu_gemm.py's strided_copy, the dividing
strided_copy_divided; plan/copies.py's StridedCopy and GroupedCopy) and PROB's NORMALIZE
total in ranges of lanes: checked alone against numpy, on the generated module itself (no
plan around it), serial and parallel; and the numpy tier's totals in that order."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from catbp_jit import abi
from catbp_jit.codegen.cpu_gemm import kernel_source
from catbp_jit.codegen.totals import LANES, TOTAL_PARTS
from catbp_jit.numpy_steps import in_order_sum, lane_totals
from catbp_jit.plan.copies import COLUMNS, ROWS, copy_params
from catbp_jit.plan.gemm import _c_order
from catbp_jit.plan.steps import KernelPattern
from jit_helpers import settings

MODULES: dict[bool, object] = {}


def gemm_module(tmp_path_factory, parallel: bool):
    """PROB float64's normalizing GEMM module, imported from its generated source."""
    if parallel not in MODULES:
        pattern = KernelPattern("PROB", "float64", True, True, parallel, template="gemm")
        path = tmp_path_factory.mktemp("gemm") / f"gemm_copies_{int(parallel)}.py"
        path.write_text(kernel_source(pattern))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        MODULES[parallel] = module
    return MODULES[parallel]


def copy_case(sizes, src_order, dst_order, divisor=None, grouped=None):
    """mem holding a source tensor laid out in src_order (its axes outermost first),
    then room for the destination in dst_order; the copy's parameters; the expected
    destination region (each element / divisor, if given)."""
    total = math.prod(sizes)
    src_at, dst_at = 3, 3 + total + 5  # not aligned on purpose
    mem = np.full(dst_at + total + 4, -7.0)
    mem[src_at : src_at + total] = np.arange(1.0, total + 1.0)
    src_strides, dst_strides = _strides(sizes, src_order), _strides(sizes, dst_order)
    copy = copy_params(src_at, dst_at, sizes, src_strides, dst_strides, grouped)
    logical = np.lib.stride_tricks.as_strided(
        mem[src_at:], shape=sizes, strides=[8 * s for s in src_strides]
    ).copy()
    want = mem.copy()
    moved = logical.transpose(dst_order).ravel()
    want[dst_at : dst_at + total] = moved if divisor is None else moved / divisor
    return mem, np.array(copy.pack(), dtype=np.int64), want


@st.composite
def copies(draw):
    rank = draw(st.integers(1, 8))  # (many axes: the rows' odometer wraps often)
    sizes = draw(st.lists(st.integers(1, 37), min_size=rank, max_size=rank))
    for cap in (9, 4, 2):
        if math.prod(sizes) > 60_000:
            sizes = [min(n, cap) for n in sizes]
    src_order = draw(st.permutations(range(rank)))
    dst_order = draw(st.permutations(range(rank)))
    return tuple(sizes), tuple(src_order), tuple(dst_order)


@pytest.mark.parametrize("grouped", [None, False, True], ids=["chosen", "strided", "grouped"])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize(
    "sizes, src_order, dst_order",
    [
        ((1771,), (0,), (0,)),  # one dense run
        ((11, 133, 21), (0, 1, 2), (1, 0, 2)),  # dense runs, blocks of 16 and a rest
        ((121, 11), (1, 0), (0, 1)),  # a transpose, tiles with a rest
        ((3, 5, 17, 19), (2, 0, 3, 1), (1, 3, 0, 2)),  # rows placed by div/mod, tiles
        ((1, 1), (0, 1), (1, 0)),
        # a grid's: many binary axes, blocks of 2 x 2, rows by an odometer across parts
        ((2,) * 13, (3, 0, 7, 1, 12, 5, 9, 2, 11, 4, 8, 6, 10), (12, 4, 0, 9, 1, 6, 3, 11, 2, 8, 5, 10, 7)),
        ((1331, 11, 11, 11), (1, 3, 0, 2), (0, 1, 2, 3)),  # rows: the source's densest innermost
        # a grid's: the densest axes of each side short, taken together (grouped when chosen)
        ((2, 4, 512, 32, 2, 2), (1, 0, 3, 2, 5, 4), (4, 0, 1, 3, 2, 5)),
        ((2, 2, 2, 3, 2, 2, 5, 2), (7, 2, 5, 0, 1, 6, 3, 4), (3, 0, 6, 2, 7, 1, 5, 4)),
    ],
)
def test_strided_copies_move_every_element_and_nothing_else(
    tmp_path_factory, parallel, sizes, src_order, dst_order, grouped
):
    module = gemm_module(tmp_path_factory, parallel)
    mem, P, want = copy_case(sizes, src_order, dst_order, grouped=grouped)
    end = module.strided_copy(mem, P, 0)
    assert end == len(P)
    np.testing.assert_array_equal(mem, want)


def test_short_axes_make_a_grouped_copy_and_long_ones_a_strided_one():
    """plan/copies.py's choice: a grid's binary axes (a StridedCopy would tile 2 x 2
    elements) give a GroupedCopy whose block holds at least COLUMNS x ROWS elements, its
    columns written one after another; 11-state axes, and dense runs, a StridedCopy."""
    sizes, order = (2,) * 12, (3, 0, 7, 1, 11, 5, 9, 2, 10, 4, 8, 6)
    copy = copy_params(0, 0, sizes, _strides(sizes, tuple(range(12))), _strides(sizes, order))
    assert isinstance(copy, abi.GroupedCopy) and copy.dense
    assert copy.pack()[abi.COPY_RANK] == abi.COPY_GROUPED and len(copy.pack()) == copy.size()
    assert len(copy.col_src) >= COLUMNS and len(copy.row_src) >= ROWS
    sizes = (11,) * 6
    copy = copy_params(0, 0, sizes, _strides(sizes, (1, 3, 0, 2, 5, 4)), _strides(sizes, tuple(range(6))))
    assert isinstance(copy, abi.StridedCopy)
    runs = copy_params(0, 0, (2, 2, 64), (64, 128, 1), (128, 64, 1))  # (the last axis dense on both sides)
    assert isinstance(runs, abi.StridedCopy)


def _strides(sizes, order):
    """C strides of `sizes` laid out with `order`'s axes outermost first."""
    strides = [0] * len(sizes)
    for d, s in zip(order, _c_order([sizes[d] for d in order])):
        strides[d] = s
    return strides


@settings(60)
@given(case=copies(), parallel=st.booleans(), grouped=st.sampled_from([None, False, True]))
def test_random_strided_copies_move_every_element_and_nothing_else(tmp_path_factory, case, parallel, grouped):
    module = gemm_module(tmp_path_factory, parallel)
    mem, P, want = copy_case(*case, grouped=grouped)
    module.strided_copy(mem, P, 0)
    np.testing.assert_array_equal(mem, want)


@pytest.mark.parametrize("size, es", [(0, 1), (5, 1), (8, 1), (1001, 1), (77, 3)])
def test_the_normalize_total_adds_in_lanes_in_a_fixed_order(tmp_path_factory, size, es):
    """Element o goes to lane o % LANES, the lanes are added pairwise, then the rest: the
    bits depend on the sizes alone (and are within rounding of any other order)."""
    module = gemm_module(tmp_path_factory, False)
    rng = np.random.default_rng(size)
    mem = rng.random(4 + size * es) * 10.0 ** rng.integers(-3, 4, 4 + size * es)
    x = mem[4 : 4 + size * es : es]
    whole = size - size % LANES
    lanes = [0.0] * LANES
    for o in range(whole):
        lanes[o % LANES] += x[o]
    rest = 0.0
    for o in range(whole, size):
        rest += x[o]
    want = (
        ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
        + rest
    )
    got = module.lane_total(mem, 4, es, size)
    assert got == want
    assert got == pytest.approx(math.fsum(x), rel=1e-14)


@pytest.mark.parametrize("grouped", [False, True], ids=["strided", "grouped"])
@pytest.mark.parametrize("divisor", [3.7, 0.0])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize(
    "sizes, src_order, dst_order",
    [((1771,), (0,), (0,)), ((121, 11), (1, 0), (0, 1)), ((3, 5, 17, 19), (2, 0, 3, 1), (1, 3, 0, 2))],
)
def test_a_dividing_copy_divides_each_element_as_it_moves_it(
    tmp_path_factory, parallel, sizes, src_order, dst_order, divisor, grouped
):
    """The NORMALIZE fused into a GEMM step's copy out: the same division as a pass over
    the output after the copy would make, element by element (the same bits). A total of
    0 divides nothing: the kernel's plain copies are this one with a total of 0."""
    module = gemm_module(tmp_path_factory, parallel)
    mem, P, want = copy_case(sizes, src_order, dst_order, divisor=divisor or None, grouped=grouped)
    module.strided_copy_divided(mem, P, 0, divisor)
    np.testing.assert_array_equal(mem, want)


def lanes_order_total(x) -> float:
    """x summed in LANES lanes, as in the test above."""
    whole = len(x) - len(x) % LANES
    lanes = [0.0] * LANES
    for o in range(whole):
        lanes[o % LANES] += x[o]
    rest = 0.0
    for o in range(whole, len(x)):
        rest += x[o]
    low = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
    return (low + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))) + rest


def parts_order_total(x) -> float:
    """TOTAL_PARTS ranges of x, each summed in lanes, the ranges' sums added in order."""
    n = len(x)
    total = 0.0
    for c in range(TOTAL_PARTS):
        total += lanes_order_total(x[n * c // TOTAL_PARTS : n * (c + 1) // TOTAL_PARTS])
    return total


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("size, es", [(0, 1), (5, 1), (16, 1), (17, 1), (1001, 1), (4099, 3)])
def test_the_normalize_total_adds_ranges_of_lanes_in_a_fixed_order(tmp_path_factory, parallel, size, es):
    """parts_total: the same bits serial and parallel (whatever the thread count), and
    within rounding of any other order."""
    module = gemm_module(tmp_path_factory, parallel)
    rng = np.random.default_rng(size)
    mem = rng.random(4 + size * es) * 10.0 ** rng.integers(-3, 4, 4 + size * es)
    x = mem[4 : 4 + size * es : es]
    got = module.parts_total(mem, 4, es, size)
    assert got == parts_order_total(list(x))
    assert got == pytest.approx(math.fsum(x), rel=1e-14)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 127, 128, 129, 1000, 4099])
def test_the_numpy_tier_adds_its_totals_in_parts_totals_order(n):
    """numpy_steps.lane_totals, row by row, against the order stated above (a loop
    kernel's reassociating NORMALIZE and its numpy tier: tests/test_lane_totals.py)."""
    terms = np.random.default_rng(n).uniform(-1.0, 1.0, (3, n))  # (signs mixed: the order shows)
    got = lane_totals(terms)
    want = np.array([parts_order_total([float(x) for x in row]) for row in terms])
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
    if n >= 1000:  # another order than the elements' (else this test would not tell them apart)
        assert not np.array_equal(got, in_order_sum(terms))
