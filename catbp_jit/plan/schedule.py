"""Lowering: each segment becomes a kernel pattern plus a row of integer parameters.

A kernel is specialized on its pattern only (plan/steps.py: semiring, dtype, reduce,
normalize, vector; parallel for GEMM steps), never on sizes or its number of leaves: sizes, strides,
leaves and arena offsets are runtime data in one int64 table, so segments of one pattern
share one compiled kernel across programs and models. To keep patterns few, the loop space is put in a
canonical form first: size-1 axes are dropped and neighbouring axes that are contiguous in
every operand are merged, as numpy's iterator does.

The table's layout, the kernel ABI, is defined in abi.py: one (kernel id, parameter
offset, chunks) row per step, then the parameters, then the offset tables, then scratch
space for the kernels' loop counters. A loop step with work enough for several threads
(PlanOptions.parallel_min_work) is cut into fixed chunks that the CPU dispatcher's threads
share (codegen/dispatch.py); its kernel is the one a serial step of its pattern runs. So
is a repack step with much to copy (repack_chunks).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from math import prod
from typing import cast

import numpy as np

from .. import abi
from ..ir.schema import TensorSpec, element_count
from ..progress import Progress, ticker
from ..semiring import SEMIRINGS
from .arena import MemoryPlan
from .fusion import Fused, Segment
from .gemm import gemm_shape, gemm_step
from .loops import (
    ACROSS_OUTPUTS,
    ACROSS_REDUCED,
    MANY_SMALL_REDUCTIONS,
    SMALL_REDUCTION,
    LoopNest,
    canonical_loops,
    filled_cost,
    loop_nest,
    nest_cost,
)
from .options import PlanOptions
from .repack import RepackChoice, choose_repacks, repacked, workspace_elements
from .steps import KernelPattern, Step, c_strides, normalize_groups, total_offset  # noqa: F401 (re-exported)

# An element a repack step copies weighs this much of a loop step's work (elements x
# reduced x leaves) when its chunks are decided, so copies of 16384 elements and more are
# cut. Measured (medians of 1000 runs, alternating): 4 took grid6_d2 2.97-3.02 -> 2.80-2.89
# ms; 8 also cut grid4x8's 8192-element copies, which then lost (0.46-0.51 -> 0.51-0.54 ms)
REPACK_WORK = 4


@dataclass
class Schedule:
    steps: list[Step]
    patterns: list[KernelPattern]  # distinct patterns, sorted by name
    table: np.ndarray  # int64, see the module docstring
    tracks: int = -1  # where the table's tracks section starts (plan/tracks.py); -1: none

    def kernel_id(self, i: int) -> int:
        return int(self.table[abi.STEP_ROW * i + abi.STEP_KERNEL])

    def param_offset(self, i: int) -> int:
        return int(self.table[abi.STEP_ROW * i + abi.STEP_PARAMS])

    def chunks(self, i: int) -> int:
        return int(self.table[abi.STEP_ROW * i + abi.STEP_CHUNKS])

    def finish(self, i: int) -> int:
        """abi.ONE_FINISH or abi.SPLIT_FINISH (a NORMALIZE cut in chunks too)."""
        return int(self.table[abi.STEP_ROW * i + abi.STEP_FINISH])


@dataclass(frozen=True)
class SegmentLoops:
    """What lowering decides about a segment before its memory is placed: the loop nest
    and kernel pattern, and the leaves it repacks (plan/repack.py), whose copies take
    `workspace` elements of the step's workspace."""

    nest: LoopNest
    accesses: tuple[abi.Access, ...]  # the leaves' along the vector, then the output's
    pattern: KernelPattern
    chunks: int
    work: int  # output elements x reduced elements x leaves
    repacks: tuple[RepackChoice, ...]
    main: int = 1  # the operand the cost model reads cache lines of (its biggest leaf)

    @property
    def workspace(self) -> int:
        return workspace_elements(self.repacks)


def segment_loops(
    seg: Segment,
    fused: Fused,
    dtype: str,
    layouts: dict[int, TensorSpec],
    batch_key: tuple | None = None,
    options: PlanOptions = PlanOptions(),
    small_by_cost: bool = False,
) -> SegmentLoops:
    """The loop nest, pattern, chunks and repacks of a loop segment; small_by_cost: see
    loops.loop_nest (a small reduction's vector decided by the cost too)."""
    loop_axes = list(seg.out_spec.axes) + list(seg.red_axes)
    groups = [0] * seg.out_spec.ndim + [1] * len(seg.red_axes)
    sizes = [ax.size for ax in loop_axes]
    out_strides = c_strides(layouts[seg.out])
    operands = [[out_strides[ax.key] if g == 0 else 0 for ax, g in zip(loop_axes, groups)]]
    for leaf in seg.leaves:
        spec = fused.specs[leaf]
        st = c_strides(layouts[leaf])
        row = []
        for ax in loop_axes:
            if spec.has_key(ax.key) and spec.get_axis(ax.key).size > 1:
                if spec.get_axis(ax.key).size != ax.size:
                    raise AssertionError(f"leaf v{leaf} axis {ax.key} size mismatch in segment v{seg.out}")
                row.append(st[ax.key])
            else:
                row.append(0)
        operands.append(row)

    # Output axes in the output's memory order, so that writes are sequential.
    order = sorted(range(len(sizes)), key=lambda d: (groups[d], -operands[0][d]))
    sizes, groups = [sizes[d] for d in order], [groups[d] for d in order]
    operands = [[op[d] for d in order] for op in operands]
    sizes, groups, operands = canonical_loops(sizes, groups, operands)
    # logsumexp of one element is not the identity for +inf (it gives NaN): keep it.
    reduce = 1 in groups or (seg.reduce and not SEMIRINGS[fused.semiring].single_term_reduction_is_identity)
    # The reduced axes keep the order of the ELIMINATE's input (seg.red_axes: the reference
    # interpreter's, which sums a product laid out in that order), the order of a sum's
    # terms for every target and mode (loops.py). The biggest leaf, counted without the
    # batch axis, orders the output axes and is what the cost model reads lines of.
    main = 1 + max(
        range(len(seg.leaves)), key=lambda j: (row_count(fused.specs[seg.leaves[j]], batch_key), -j)
    )
    space = int(np.prod(sizes, dtype=np.int64)) * max(1, len(seg.leaves))
    nest = loop_nest(
        sizes,
        groups,
        operands,
        reduce,
        main,
        options.block,
        space >= options.parallel_min_work,
        options.across,
        small_by_cost,
        KernelPattern(fused.semiring, dtype, True, False, False, ACROSS_REDUCED).sums_in_lanes,
    )
    n_out = int(np.prod(nest.sizes[: nest.out_rank], dtype=np.int64))
    n_red = int(np.prod(nest.sizes[nest.out_rank :], dtype=np.int64))
    # a chunk of work: output elements, or rows (positions outside the vector)
    rows = int(np.prod(nest.sizes[: nest.end - nest.nb], dtype=np.int64))
    n_work = n_out if nest.across == ACROSS_REDUCED else rows
    work = n_out * n_red * max(1, len(seg.leaves))
    parallel = n_work >= 8 and work >= options.parallel_min_work
    # (a parallel loop step is cut in chunks that the dispatcher's threads share: its
    # kernel is the serial one's, KernelPattern.parallel stays False)
    sr = SEMIRINGS[fused.semiring]
    lane_total = not options.exact and options.lane_totals and sr.normalization == "divide_by_total"
    pattern = KernelPattern(
        fused.semiring,
        dtype,
        reduce,
        seg.normalize,
        False,
        nest.across if reduce else ACROSS_OUTPUTS,
        total_in_lanes=seg.normalize and lane_total,
    )
    if pattern.sums_in_lanes and dtype == "float64" and not options.exact and options.lane_sums:
        pattern = replace(pattern, terms_in_lanes=True)
    accesses = tuple(nest.access(i) for i in range(1, len(nest.operands))) + (nest.access(0),)
    one_at_a_time = reduce and nest.across == ACROSS_REDUCED
    if streams(options, accesses[-1], n_out * np.dtype(dtype).itemsize, one_at_a_time):
        accesses = accesses[:-1] + (abi.Access(abi.STREAMED, 1),)
    repacks: tuple[RepackChoice, ...] = ()
    if options.repack:
        bars = options.repack_max_elements, options.repack_min_reuse, options.repack_min_terms
        repacks = choose_repacks(nest, accesses, *bars)
    # a chunk of a kernel that sums in lanes holds LANES outputs at least (a chunk of one
    # output would have no lanes)
    per_chunk = abi.LANES if pattern.sums_in_lanes else 1
    # (a chunk costs a kernel call, ~0.1 us to place its odometer: half the bar's work each)
    most = max(2, 2 * work // options.parallel_min_work)
    # (one at least: were LANES over 8, a parallel step could have fewer outputs than it)
    chunks = max(1, min(n_work // per_chunk, options.chunks, most)) if parallel else 1
    return SegmentLoops(nest, accesses, pattern, chunks, work, repacks, main)


def read_cost(
    seg: Segment,
    layouts: dict[int, TensorSpec],
    fused: Fused,
    dtype: str,
    batch_key: tuple | None,
    options: PlanOptions,
) -> float:
    """What the cost model (loops.py) says a loop segment costs in all, its values stored
    as `layouts` says: per term (per element, for a product) x its terms. For the layout
    pass to choose between the orders it may store a value in (the loop nest is the one
    lowering would choose for those layouts; repacks are not counted)."""
    loops = segment_loops(seg, fused, dtype, layouts, batch_key, options)
    nest, terms = loops.nest, prod(loops.nest.sizes)
    if loops.pattern.reduce:
        return nest_cost(nest, loops.main, loops.pattern.sums_in_lanes) * terms
    return filled_cost(nest) * terms


def streams(options: PlanOptions, out: abi.Access, out_bytes: int, one_at_a_time: bool) -> bool:
    """Whether a step writes its output with non-temporal stores (abi.STREAMED): a large
    output written contiguous along the vector, by a kernel that stores a vector at a time
    (one that sums across reduced axes stores an element at a time)."""
    bar = options.streaming_store_bytes
    return bar is not None and out.kind == abi.CONTIGUOUS and out_bytes >= bar and not one_at_a_time


def lower_segment(
    seg: Segment,
    fused: Fused,
    memory: MemoryPlan,
    dtype: str,
    layouts: dict[int, TensorSpec],
    batch_key: tuple | None = None,
    options: PlanOptions = PlanOptions(),
    loops: SegmentLoops | None = None,
    work: int = -1,
) -> list[Step]:
    """The Step of a loop segment, after the repack step that copies the leaves it
    repacks (plan/repack.py) if any. loops: its segment_loops, if known; work: the arena
    offset of its workspace (memory.scratch), where those copies go."""
    if loops is None:
        loops = segment_loops(seg, fused, dtype, layouts, batch_key, options)
    nest = loops.nest
    sizes, operands, nb = nest.sizes, nest.operands, nest.nb
    leaves = tuple((memory.regions[leaf].offset, tuple(row)) for leaf, row in zip(seg.leaves, operands[1:]))
    if loops.repacks and work < 0:
        raise AssertionError(f"segment v{seg.out} repacks leaves but has no workspace")
    leaves, accesses, repack = repacked(nest, loops.repacks, leaves, loops.accesses, work)
    if repack is not None:
        repack = replace(repack, chunks=repack_chunks(repack, options))
    params = abi.StepParams(
        out=memory.regions[seg.out].offset,
        out_rank=nest.out_rank,
        red_rank=len(sizes) - nest.out_rank,
        chunks=loops.chunks,
        block_axes=nb,
        block_size=int(np.prod(nest.vector_sizes(), dtype=np.int64)),
        sizes=tuple(sizes),
        out_strides=tuple(operands[0][: nest.out_rank]),
        leaves=leaves,
        groups=normalize_groups(seg, layouts[seg.out], batch_key, total_offset(seg, memory.regions)),
        accesses=accesses,
    )
    step = Step(seg, loops.pattern, params, loops.work)
    if repack is None:
        return [step]
    return [Step(seg, repack_pattern(fused.semiring, dtype), repack, loops.workspace), step]


def repack_chunks(params: abi.RepackParams, options: PlanOptions) -> int:
    """The chunks of a repack step, as a loop step's (segment_loops) with its elements
    copied as its work, each weighing REPACK_WORK."""
    rows = params.rows()
    work = REPACK_WORK * rows * params.block_size
    if rows < 2 or work < options.parallel_min_work:
        return 1
    return max(1, min(rows, options.chunks, 2 * work // options.parallel_min_work))


def repack_pattern(semiring: str, dtype: str) -> KernelPattern:
    """The kernel of repack steps (codegen/cpu_repack.py): copies, whatever the semiring."""
    return KernelPattern(semiring, dtype, False, False, False, template="repack")


def row_count(spec: TensorSpec, batch_key: tuple | None) -> int:
    """Elements of one batch row of a value (all of them if it is not batched)."""
    return element_count(TensorSpec(tuple(ax for ax in spec.axes if ax.key != batch_key)))


def shape_key(seg: Segment, fused: Fused, layouts: dict[int, TensorSpec], batch_key: tuple | None) -> tuple:
    """Everything lower_segment reads about a segment but its arena offsets, with axes
    named by first appearance (lowering matches axes by key, never orders by it): the
    segments of one shape (a chain's links, a grid's rows) have equal keys and lower to
    the same pattern and row, offsets aside."""
    names = {batch_key: -1}  # the batch axis is told apart (normalize_groups)

    def spec(s: TensorSpec) -> tuple:
        return tuple((names.setdefault(ax.key, len(names)), ax.size) for ax in s.axes)

    return (
        spec(seg.out_spec),
        spec(TensorSpec(seg.red_axes)),
        seg.reduce,
        seg.normalize,
        seg.total is None,
        spec(layouts[seg.out]),
        tuple((spec(fused.specs[leaf]), spec(layouts[leaf])) for leaf in seg.leaves),
    )


def loop_segments(
    fused: Fused,
    dtype: str,
    layouts: dict[int, TensorSpec],
    batch_key: tuple | None,
    options: PlanOptions,
    known: dict[tuple, SegmentLoops] | None = None,
) -> dict[int, SegmentLoops]:
    """Segment index -> its SegmentLoops, for every segment that is not a GEMM step (plan/
    gemm.py), before memory is planned. Segments of one shape are decided once (shape_key)
    in `known`, which build_schedule then reuses: the cost model was most of the time a
    long program planned."""
    known = {} if known is None else known
    keys: dict[int, tuple] = {}
    first: dict[tuple, Segment] = {}  # a segment of each shape decided here
    for i, seg in enumerate(fused.segments):
        if gemm_shape(seg, fused, layouts, dtype, options) is not None:
            continue
        key = keys[i] = shape_key(seg, fused, layouts, batch_key)
        if key not in known:
            known[key] = segment_loops(seg, fused, dtype, layouts, batch_key, options)
            first[key] = seg
    # A small reduction stays across reduced axes so as not to compile the kernel across
    # outputs for it alone (loops.SMALL_REDUCTION); where the program compiles that kernel
    # anyway, the cost decides, and it may take it
    if options.across is not None:
        return {i: known[key] for i, key in keys.items()}
    compiled = {lp.pattern for lp in known.values()}
    by_cost: dict[tuple, SegmentLoops] = {}
    for key, seg in first.items():
        lp = known[key]
        if lp.pattern.reduce and lp.nest.out_rank and prod(lp.nest.sizes) < SMALL_REDUCTION:
            other = segment_loops(seg, fused, dtype, layouts, batch_key, options, small_by_cost=True)
            if other.pattern != lp.pattern:
                by_cost[key] = other
    # ... and so does it where many small reductions would take it (grid4x8_d2: 171 of
    # its 205, a run 2x faster than with all of them across reduced axes)
    uses = Counter(keys.values())
    many = sum(uses[key] for key in by_cost) >= MANY_SMALL_REDUCTIONS
    for key, other in by_cost.items():
        if other.pattern in compiled or many:
            known[key] = other
    return {i: known[key] for i, key in keys.items()}


def repack_workspace(loops: dict[int, SegmentLoops]) -> dict[int, int]:
    """Segment index -> elements of workspace its repacked leaves' copies need."""
    return {i: lp.workspace for i, lp in loops.items() if lp.workspace}


def lower_segments(
    fused: Fused,
    memory: MemoryPlan,
    dtype: str,
    layouts: dict[int, TensorSpec],
    batch_key: tuple | None,
    options: PlanOptions,
    progress: Progress | None = None,
    known: dict[tuple, SegmentLoops] | None = None,
) -> list[Step]:
    """Every segment's Steps (a repack step, then the segment's). Segments of one shape
    are lowered once (shape_key) and each given its own offsets. known: SegmentLoops by
    shape_key (loop_segments), if decided."""
    tick = ticker(progress, "planning: segments lowered", len(fused.segments))
    if known is None:  # (decided where every shape is seen: a small reduction's vector)
        known = {}
        loop_segments(fused, dtype, layouts, batch_key, options, known)
    # the first steps of a shape, their workspace, the leaves they read from copies
    lowered: dict[tuple, tuple[list[Step], int, set[int]]] = {}
    steps: list[Step] = []
    regions = memory.regions
    for i, seg in enumerate(fused.segments):
        tick(i)
        gemm = gemm_step(i, seg, fused, memory, dtype, layouts, batch_key, options)
        if gemm is not None:
            steps.append(gemm)
            continue
        key = shape_key(seg, fused, layouts, batch_key)
        work = memory.scratch[i].offset if i in memory.scratch else -1
        if key not in lowered:
            firsts = lower_segment(seg, fused, memory, dtype, layouts, batch_key, options, known[key], work)
            copied = {c.leaf for st in firsts[:-1] for c in cast(abi.RepackParams, st.params).copies}
            lowered[key] = (firsts, work, copied)
            steps += firsts
        else:
            firsts, first_work, copied = lowered[key]
            steps += [placed(first, first_work, seg, regions, work, copied) for first in firsts]
    return steps


def placed(first: Step, first_work: int, seg: Segment, regions, work: int, copied: set[int]) -> Step:
    """The Step of `seg`, a segment of first's shape: first's, with seg's offsets (its
    copies at the same place in its own workspace, which starts at `work`; copied: the
    leaves read from copies)."""
    if isinstance(first.params, abi.RepackParams):
        copies = tuple(
            replace(
                copy,
                positions=replace(
                    copy.positions,
                    src=regions[seg.leaves[copy.leaf]].offset,
                    dst=work + copy.positions.dst - first_work,
                ),
            )
            for copy in first.params.copies
        )
        return Step(seg, first.pattern, replace(first.params, copies=copies), first.work)
    params = cast(abi.StepParams, first.params)  # (lower_segment makes no GEMM step)
    leaves = tuple(
        (work + offset - first_work if j in copied else regions[leaf].offset, row)
        for j, (leaf, (offset, row)) in enumerate(zip(seg.leaves, params.leaves))
    )
    groups = params.groups[:-1] + (total_offset(seg, regions),)
    params = replace(params, out=regions[seg.out].offset, leaves=leaves, groups=groups)
    return Step(seg, first.pattern, params, first.work)


def in_lines(steps: list[Step], options: PlanOptions) -> list[Step]:
    """The steps, with the products computed a cache line at a time in registers given the
    template contract_lines (codegen/cpu_lines.py): every product (through a buffer, a
    streamed output's stores would wait behind the streaming ones: grid5_d3's 115 MB
    product 9.0 -> 3.6 ms; chain200's exact run -20%, grid6_d2's reassociating -12%). So
    too the reductions across outputs, their lines of products in registers, where every
    one of them can be (KernelPattern.sums_in_lines, a row of at most abi.LINE_SUMS_MAX
    elements), not some: a program would compile both kernels across outputs. grid4x8_d2's
    exact ones of 64 outputs and 128 terms 4.0-4.3 -> 3.1 us, grid6_d2's exact run -12%.
    A NORMALIZE is no bar (the same `finish` after the lines): a 12 x 12 3-state grid's
    exact run 509 -> 459 ms, its sums of 86-258 M terms with or beside one 9.7-34.6 ->
    6.8-31.7 ms."""
    if not options.line_products:
        return steps
    loops = [st.pattern.template == "contract_reduce" for st in steps]
    products = [loop and not st.pattern.reduce for st, loop in zip(steps, loops)]
    sums = [
        loop and st.pattern.reduce and st.pattern.vector == ACROSS_OUTPUTS for st, loop in zip(steps, loops)
    ]
    every_sum = all(
        st.pattern.sums_in_lines and cast(abi.StepParams, st.params).block_size <= abi.LINE_SUMS_MAX
        for st, s in zip(steps, sums)
        if s
    )
    return [
        replace(st, pattern=replace(st.pattern, template="contract_lines"))
        if product or (s and every_sum)
        else st
        for st, product, s in zip(steps, products, sums)
    ]


def splits_finish(st: Step, semiring_name: str, options: PlanOptions) -> bool:
    """Whether loop step st does its NORMALIZE in chunks too (abi.SPLIT_FINISH): a division
    (PROB) of at least options.split_finish_min_elements elements in one group, by a step
    cut in chunks."""
    bar, p = options.split_finish_min_elements, st.params
    if bar is None or not isinstance(p, abi.StepParams) or p.chunks < 2 or not st.segment.normalize:
        return False
    n_out = prod(p.sizes[: p.out_rank])
    return SEMIRINGS[semiring_name].normalization == "divide_by_total" and p.groups[0] == 1 and n_out >= bar


def windowed(offsets: tuple[int, ...], highest: int, total: int) -> tuple[int, ...] | None:
    """The windowed table of a GATHERED access's offsets (abi.windowed_table) whose leaf's
    highest element is `highest`, if its lines each lie in a window and a window's load
    from that element stays in the buffer's `total` elements: a window holds elements past
    those it reads (a window starts at its lowest element, so none ends further)."""
    words = abi.window_words(offsets)
    if words is None or highest + abi.W_WINDOW > total:
        return None
    return abi.windowed_table(offsets, words)


def rows_start_lines(params: abi.StepParams) -> bool:
    """Whether every row of a line kernel's step starts its vector on a cache line (its
    lines are then at multiples of abi.W_WINDOW along the vector, codegen/cpu_lines.py):
    its output written in lines from a line's start, rows a whole number of lines apart
    (a scattered output's rows always start at lane 0)."""
    if params.accesses[-1].kind not in (abi.CONTIGUOUS, abi.STREAMED):
        return True
    rows = params.out_rank - params.block_axes  # the row axes: the output's outer ones
    return all(x % abi.W_WINDOW == 0 for x in (params.out, *params.out_strides[:rows]))


def leaf_highest(params: abi.StepParams, j: int) -> int:
    """The highest element of the buffer that leaf j of a step holds."""
    offset, strides = params.leaves[j]
    return offset + sum(max(0, (n - 1) * s) for n, s in zip(params.sizes, strides))


def copy_highest(copy: abi.GatheredCopy) -> int:
    """The highest element of the buffer that a repack copy reads."""
    at = copy.positions
    moved = sum(max(0, (n - 1) * s) for n, s in zip(at.sizes, at.src_strides))
    return at.src + moved + max(copy.offsets, default=0)


def build_schedule(
    fused: Fused,
    memory: MemoryPlan,
    dtype: str,
    layouts: dict[int, TensorSpec] | None = None,
    batch_key: tuple | None = None,
    options: PlanOptions = PlanOptions(),
    progress: Progress | None = None,
    known: dict[tuple, SegmentLoops] | None = None,
) -> Schedule:
    """batch_key: the batch axis of programs rewritten by ir/batch.py, if any. known: the
    SegmentLoops that planning the memory decided (loop_segments), by shape_key."""
    layouts = layouts if layouts is not None else dict(fused.specs)
    steps = in_lines(
        lower_segments(fused, memory, dtype, layouts, batch_key, options, progress, known), options
    )
    # kernels in a canonical order, so that schedules using the same kernels share one
    # compiled dispatcher
    patterns = sorted({st.pattern for st in steps}, key=lambda p: p.name)
    ids: dict[KernelPattern, int] = {p: i for i, p in enumerate(patterns)}
    # laid out in order: step rows, parameters, offset tables, scratch
    cursor = abi.STEP_ROW * len(steps) + sum(st.params.size() for st in steps)
    # each step's params, its offset tables placed
    with_tables: list[abi.StepParams | abi.GemmParams | abi.RepackParams] = []
    tables: list[int] = []
    # equal offset tables are placed once: a grid's steps repeat a few shapes (grid4x8:
    # 916 tables, 157 distinct; its table 837 -> 369 kB, which every session copies)
    placed: dict[tuple[int, ...], int] = {}

    def place(offsets: tuple[int, ...]) -> int:
        nonlocal cursor
        if offsets not in placed:
            placed[offsets] = cursor
            cursor += len(offsets)
            tables.extend(offsets)
        return placed[offsets]

    # (lines of W_WINDOW elements: 8-byte ones)
    windows = options.window_words and np.dtype(dtype).itemsize == abi.WINDOW_ITEMSIZE
    for st in steps:
        step_params = st.params
        if isinstance(step_params, abi.StepParams) and any(
            acc.kind == abi.GATHERED for acc in step_params.accesses
        ):
            lined = windows and st.pattern.template == "contract_lines" and rows_start_lines(step_params)
            accesses = list(step_params.accesses)
            for j, acc in enumerate(accesses):
                if acc.kind != abi.GATHERED:
                    continue
                leaf = j < len(accesses) - 1  # (an output is never read in lines)
                words = (
                    windowed(acc.offsets, leaf_highest(step_params, j), memory.total)
                    if lined and leaf
                    else None
                )
                if words:
                    accesses[j] = replace(acc, step=abi.WINDOWED, table=place(words))
                else:
                    accesses[j] = replace(acc, table=place(acc.offsets))
            step_params = replace(step_params, accesses=tuple(accesses))
        if isinstance(step_params, abi.RepackParams):  # a copy reads its leaf by the table
            copies = []
            for copy in step_params.copies:
                words = windowed(copy.offsets, copy_highest(copy), memory.total) if windows else None
                copies.append(
                    replace(copy, table=place(words), step=abi.WINDOWED)
                    if words
                    else replace(copy, table=place(copy.offsets))
                )
            step_params = replace(step_params, copies=tuple(copies))
        with_tables.append(step_params)
    laid = []
    for st, step_params in zip(steps, with_tables):
        if isinstance(step_params, abi.StepParams) and splits_finish(st, fused.semiring, options):
            step_params = replace(step_params, split_finish=True)
        if isinstance(step_params, abi.StepParams | abi.RepackParams):  # (a GEMM step keeps none)
            cursor += -cursor % abi.LINE_INT64S  # (a line of its own: steps on two threads)
            step_params = replace(step_params, scratch=cursor)
            cursor += step_params.scratch_size()
            cursor += -cursor % abi.LINE_INT64S
        laid.append(Step(st.segment, st.pattern, step_params, st.work))
    head: list[int] = []
    params: list[int] = []
    for st in laid:
        chunks = st.params.chunks if isinstance(st.params, abi.StepParams | abi.RepackParams) else 1
        split = isinstance(st.params, abi.StepParams) and st.params.split_finish
        finish = abi.SPLIT_FINISH if split else abi.ONE_FINISH
        head += [ids[st.pattern], abi.STEP_ROW * len(laid) + len(params), chunks, finish]
        params += st.params.pack()
    table = np.zeros(cursor, dtype=np.int64)
    body = head + params + tables
    table[: len(body)] = body
    return Schedule(laid, patterns, table)
