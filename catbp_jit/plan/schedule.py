"""Lowering: each segment becomes a kernel pattern plus a row of integer parameters.

A kernel is specialized on its pattern only (plan/steps.py: semiring, dtype, reduce,
normalize, parallel, vector), never on sizes or its number of leaves: sizes, strides,
leaves and arena offsets are runtime data in one int64 table, so segments of one pattern
share one compiled kernel across programs and models. To keep patterns few, the loop space is put in a
canonical form first: size-1 axes are dropped and neighbouring axes that are contiguous in
every operand are merged, as numpy's iterator does.

The table's layout, the kernel ABI, is defined in abi.py: one (kernel id, parameter
offset) row per step, then the parameters, then the offset tables, then scratch space for
the kernels' loop counters.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from .. import abi
from ..ir.schema import TensorSpec, element_count
from ..progress import Progress, ticker
from ..semiring import SEMIRINGS
from .arena import MemoryPlan
from .fusion import Fused, Segment
from .gemm import gemm_step
from .loops import ACROSS_OUTPUTS, ACROSS_REDUCED, canonical_loops, loop_nest
from .options import PlanOptions
from .steps import KernelPattern, Step, c_strides, normalize_groups, total_offset  # noqa: F401 (re-exported)


@dataclass
class Schedule:
    steps: list[Step]
    patterns: list[KernelPattern]  # distinct patterns, sorted by name
    table: np.ndarray  # int64, see the module docstring

    def kernel_id(self, i: int) -> int:
        return int(self.table[abi.STEP_ROW * i + abi.STEP_KERNEL])

    def param_offset(self, i: int) -> int:
        return int(self.table[abi.STEP_ROW * i + abi.STEP_PARAMS])


def lower_segment(
    seg: Segment,
    fused: Fused,
    memory: MemoryPlan,
    dtype: str,
    layouts: dict[int, TensorSpec],
    batch_key: tuple | None = None,
    options: PlanOptions = PlanOptions(),
) -> Step:
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
    # The reduced axes are walked in the biggest leaf's memory order, which fixes the order
    # of a sum's terms for every target and mode (loops.py). Counted without the batch
    # axis: a batched segment walks each row in the order the unbatched one does, so its
    # sums round alike.
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
    )
    sizes, operands, nb = nest.sizes, nest.operands, nest.nb
    out_rank, red_rank = nest.out_rank, len(sizes) - nest.out_rank
    block_sizes = nest.vector_sizes()
    leaf_rows = operands[1:]
    accesses = tuple(nest.access(i) for i in range(1, len(operands))) + (nest.access(0),)

    n_out = int(np.prod(sizes[:out_rank], dtype=np.int64))
    n_red = int(np.prod(sizes[out_rank:], dtype=np.int64))
    # a chunk of work: output elements, or rows (positions outside the vector)
    n_work = n_out if nest.across == ACROSS_REDUCED else int(np.prod(sizes[: nest.end - nb], dtype=np.int64))
    work = n_out * n_red * max(1, len(seg.leaves))
    parallel = n_work >= 8 and work >= options.parallel_min_work
    pattern = KernelPattern(
        fused.semiring, dtype, reduce, seg.normalize, parallel, nest.across if reduce else ACROSS_OUTPUTS
    )
    chunks = min(n_work, options.chunks) if parallel else 1
    params = abi.StepParams(
        out=memory.regions[seg.out].offset,
        out_rank=out_rank,
        red_rank=red_rank,
        chunks=chunks,
        block_axes=nb,
        block_size=int(np.prod(block_sizes, dtype=np.int64)),
        sizes=tuple(sizes),
        out_strides=tuple(operands[0][:out_rank]),
        leaves=tuple((memory.regions[leaf].offset, tuple(row)) for leaf, row in zip(seg.leaves, leaf_rows)),
        groups=normalize_groups(seg, layouts[seg.out], batch_key, total_offset(seg, memory.regions)),
        accesses=accesses,
    )
    return Step(seg, pattern, params, work)


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


def lower_segments(
    fused: Fused,
    memory: MemoryPlan,
    dtype: str,
    layouts: dict[int, TensorSpec],
    batch_key: tuple | None,
    options: PlanOptions,
    progress: Progress | None = None,
) -> list[Step]:
    """Every segment's Step. Segments of one shape are lowered once (shape_key) and each
    given its own offsets: the cost model was most of the time a long program planned."""
    tick = ticker(progress, "planning: segments lowered", len(fused.segments))
    lowered: dict[tuple, Step] = {}
    steps = []
    regions = memory.regions
    for i, seg in enumerate(fused.segments):
        tick(i)
        gemm = gemm_step(i, seg, fused, memory, dtype, layouts, batch_key, options)
        if gemm is not None:
            steps.append(gemm)
            continue
        key = shape_key(seg, fused, layouts, batch_key)
        first = lowered.get(key)
        if first is None:
            lowered[key] = step = lower_segment(seg, fused, memory, dtype, layouts, batch_key, options)
        else:
            first_params = cast(abi.StepParams, first.params)  # (lower_segment makes no GEMM step)
            leaves = tuple(
                (regions[leaf].offset, row) for leaf, (_, row) in zip(seg.leaves, first_params.leaves)
            )
            groups = first_params.groups[:-1] + (total_offset(seg, regions),)
            params = replace(first_params, out=regions[seg.out].offset, leaves=leaves, groups=groups)
            step = Step(seg, first.pattern, params, first.work)
        steps.append(step)
    return steps


def build_schedule(
    fused: Fused,
    memory: MemoryPlan,
    dtype: str,
    layouts: dict[int, TensorSpec] | None = None,
    batch_key: tuple | None = None,
    options: PlanOptions = PlanOptions(),
    progress: Progress | None = None,
) -> Schedule:
    """batch_key: the batch axis of programs rewritten by ir/batch.py, if any."""
    layouts = layouts if layouts is not None else dict(fused.specs)
    steps = lower_segments(fused, memory, dtype, layouts, batch_key, options, progress)
    # kernels in a canonical order, so that schedules using the same kernels share one
    # compiled dispatcher
    patterns = sorted({st.pattern for st in steps}, key=lambda p: p.name)
    ids: dict[KernelPattern, int] = {p: i for i, p in enumerate(patterns)}
    # laid out in order: step rows, parameters, offset tables, scratch
    cursor = abi.STEP_ROW * len(steps) + sum(st.params.size() for st in steps)
    # each step's params, its offset tables placed
    with_tables: list[abi.StepParams | abi.GemmParams] = []
    tables: list[int] = []
    for st in steps:
        step_params = st.params
        if any(acc.kind == abi.GATHERED for acc in step_params.accesses):
            accesses = []
            for acc in step_params.accesses:
                if acc.kind == abi.GATHERED:
                    acc = replace(acc, table=cursor)
                    cursor += len(acc.offsets)
                    tables += acc.offsets
                accesses.append(acc)
            step_params = replace(step_params, accesses=tuple(accesses))
        with_tables.append(step_params)
    placed = []
    for st, step_params in zip(steps, with_tables):
        if isinstance(step_params, abi.StepParams):  # (a GEMM step keeps no counters)
            step_params = replace(step_params, scratch=cursor)
            cursor += step_params.scratch_size()
        placed.append(Step(st.segment, st.pattern, step_params, st.work))
    head: list[int] = []
    params: list[int] = []
    for st in placed:
        head += [ids[st.pattern], abi.STEP_ROW * len(placed) + len(params)]
        params += st.params.pack()
    table = np.zeros(cursor, dtype=np.int64)
    body = head + params + tables
    table[: len(body)] = body
    return Schedule(placed, patterns, table)
