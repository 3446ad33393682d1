"""How a GEMM step's copy walks its elements (plan/gemm.py makes the copies, the kernel's
strided_copy in codegen/cpu_gemm.py runs them).

A copy moves an operand between its region and a C-order matrix in the step's workspace,
its axes permuted. The kernel reads and writes whole cache lines when the two axes it
tiles are each a few cache lines long: the destination's densest axis (its writes run
along it) and the source's densest (its reads). ObjectDetection's 11-state axes give
such tiles (a StridedCopy: `walked`). A grid's binary axes do not: there the densest
axes hold 2 or 4 elements, and a block of a tile moved a few elements between its
div/mod-placed rows (Grids_16's copies of 2 M elements: 7-17 ms each). There the copy is
a GroupedCopy (`grouped`): its block's columns are the destination's densest axes taken
together until they hold COLUMNS elements, its rows the source's densest of the others
until ROWS, each a table of offsets, so that a block reads and writes runs of whole lines
(Grids_16's copies, one at a time on one thread: 107 ms strided, 67 ms so).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from .. import abi

# a GroupedCopy's block: at least this many columns, and rows (elements; 16 float64 are
# two cache lines), the axes taken whole
COLUMNS = ROWS = 16
# a table longer than this (one long axis) keeps the copy a StridedCopy, whose tiles walk
# a long axis in pieces: the tables live in the step's row of P
MAX_TABLE = 2048
# a StridedCopy's tile is narrow when either of its two axes is shorter than this
NARROW = 8


def copy_params(
    src: int, dst: int, sizes, src_strides, dst_strides, grouped: bool | None = None
) -> abi.GemmCopy:
    """The copy of the elements at src (src_strides) to dst (dst_strides) over `sizes`, as
    the kernel walks it best: a GroupedCopy where the StridedCopy's tile would be narrow
    (and the tables stay short), else the StridedCopy. `grouped` forces one or the other
    (tests)."""
    strided = walked(src, dst, sizes, src_strides, dst_strides)
    if grouped is None:
        narrow = len(strided.sizes) > 1 and min(strided.sizes[-2:]) < NARROW
        runs = strided.src_strides[-1] == 1 and strided.dst_strides[-1] == 1  # (moved as whole runs)
        # (the tables' lengths from the groups' sizes: a long axis's table is never built)
        short = all(
            prod(sizes[d] for d in g) <= MAX_TABLE for g in _groups(sizes, src_strides, dst_strides)[:2]
        )
        grouped = narrow and not runs and short
    return grouped_copy(src, dst, sizes, src_strides, dst_strides) if grouped else strided


def walked(src: int, dst: int, sizes, src_strides, dst_strides) -> abi.StridedCopy:
    """The StridedCopy with its axes in the order the kernel walks them best: the
    destination's densest axis last, the source's densest of the others before it (the
    kernel tiles those two), then the source's densest of the rest, so that the rows next
    to each other read the same pages; the rest outermost by the destination's strides.
    (Its rows by the destination's strides alone: ObjectDetection_11's copies of 11-state
    axes took 29.9 ms, one core, against 23.6 ms this way; a 1331 x 11 x 11 x 11 transpose
    5.0 against 1.6 ms.) Axes of one element are left out: they move nothing, and the
    kernel's row counters (abi.MAX_LEAVES of them) then always suffice."""
    axes = [d for d in range(len(sizes)) if sizes[d] > 1] or [0]
    last = min(axes, key=lambda d: (abs(dst_strides[d]), -d))
    rest = [d for d in axes if d != last]
    order = [last]
    if rest:
        tile = min(rest, key=lambda d: (abs(src_strides[d]), -d))
        rows = [d for d in rest if d != tile]
        inner = [min(rows, key=lambda d: (abs(src_strides[d]), -d))] if rows else []
        outer = sorted((d for d in rows if d not in inner), key=lambda d: -abs(dst_strides[d]))
        order = outer + inner + [tile, last]
    assert len(order) <= abi.MAX_LEAVES + 2, "a copy's rows have more axes than its kernel counts"
    return abi.StridedCopy(src, dst, *_picked(order, sizes, src_strides, dst_strides))


def grouped_copy(src: int, dst: int, sizes, src_strides, dst_strides) -> abi.GroupedCopy:
    """The GroupedCopy: columns the destination's densest axes until they hold COLUMNS
    elements, rows the source's densest of the others until ROWS, both tables in their
    own side's memory order; the other axes outermost by the source's strides, so that
    blocks one after another read neighbouring lines."""
    cols, rows, outer = _groups(sizes, src_strides, dst_strides)
    assert len(outer) <= abi.MAX_LEAVES, "a copy's outer axes are more than its kernel counts"
    row_src, row_dst = _offsets([(sizes[d], src_strides[d], dst_strides[d]) for d in rows])
    col_src, col_dst = _offsets([(sizes[d], src_strides[d], dst_strides[d]) for d in cols])
    n, ss, ds = _picked(outer, sizes, src_strides, dst_strides)
    return abi.GroupedCopy(src, dst, n, ss, ds, row_src, row_dst, col_src, col_dst)


def _picked(order: Sequence[int], *per_axis: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Each of per_axis's values at the axes of `order`, in that order."""
    return tuple(tuple(values[d] for d in order) for values in per_axis)


def _groups(sizes, src_strides, dst_strides) -> tuple[list[int], list[int], list[int]]:
    """A GroupedCopy's column axes, row axes and outer axes (grouped_copy says which)."""
    axes = [d for d in range(len(sizes)) if sizes[d] > 1]
    cols = _densest(axes, sizes, dst_strides, COLUMNS)
    rest = [d for d in axes if d not in cols]
    rows = _densest(rest, sizes, src_strides, ROWS)
    outer = sorted((d for d in rest if d not in rows), key=lambda d: (-abs(src_strides[d]), d))
    return cols, rows, outer


def _densest(axes: Sequence[int], sizes, strides, at_least: int) -> list[int]:
    """The axes of the smallest strides until they hold `at_least` elements, outermost
    (largest stride) first."""
    taken: list[int] = []
    for d in sorted(axes, key=lambda d: (abs(strides[d]), -d)):
        if prod(sizes[x] for x in taken) >= at_least:
            break
        taken.append(d)
    return sorted(taken, key=lambda d: (-abs(strides[d]), d))


def _offsets(axes: Sequence[tuple[int, int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Source and destination offsets of every index over (size, source stride,
    destination stride) axes, the last fastest."""
    src, dst = [0], [0]
    for n, s, d in axes:
        src = [x + i * s for x in src for i in range(n)]
        dst = [x + i * d for x in dst for i in range(n)]
    return tuple(src), tuple(dst)
