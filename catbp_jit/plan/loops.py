"""The loop-order cost model: which axes a kernel walks innermost, as one flat vector.

A kernel (codegen/cpu.py) walks its loop space in two layers: odometers over most axes,
and a few innermost axes as one flat vector of V elements. Along the vector each operand
is one of four accesses (abi.py): CONSTANT (its strides there are all 0), CONTIGUOUS
(+v), STRIDED (+v * step) or GATHERED (+table[v], a table made here). The kernel computes
the ⊗-product of the leaves for the whole vector one leaf at a time, into a buffer on its
stack: one plain loop per leaf and access kind, which LLVM turns into SIMD loads and
multiplies (a CONSTANT leaf is one broadcast, a GATHERED one a hardware gather), instead
of one scalar product per element with an index computation per leaf.

Which axes form the vector:
  - a segment that does not reduce: any output axes. Each output element is computed alone
    from the same leaves in the same ⊗ order whatever the loop order, so `vector_order`
    chooses the order by the cost below.
  - a segment that reduces: the order in which a sum adds its terms decides its rounding,
    so the reduced axes keep the order plan/schedule.py fixes for them, and the vector is
    either their innermost ones (ACROSS_REDUCED: each output element sums its vector's
    terms in order, one after the other) or the innermost output axes (ACROSS_OUTPUTS: V
    output elements at once, each adding its terms in that same order, the reduced axes
    all walked by the odometer; the additions of different outputs are independent, so
    they vectorize too). The cheaper (nest_cost, which also counts a big leaf's cache lines
    per term). Or, when asked (PlanOptions.across), both (ACROSS_BOTH: S output lanes, the
    output axes innermost in the biggest leaf, beside J positions of the innermost reduced
    axes, one vector of J x S elements, element j * S + s; each lane adds its J terms in
    the order above, then the odometer steps the outer reduced axes): it reads a big leaf
    whose inner axes mix outputs and reduced axes a line at a time, where summing across
    reduced axes takes a few elements from each line per output and comes back for the
    rest.
Either way the results are bit-identical to those of any other choice, mode or thread
count. An axis that does not fit in the vector whole is split in two (C order is kept:
(n, s) becomes (n / b, b) with strides (s * b, s)) so that the vector can fill up.

The cost of a vector, per element: each leaf's access plus the output's store (ACCESS_COST
and STORE_COST, relative costs measured on one x86-64 core: a broadcast is nearly free, a
contiguous load a fraction of a gather, a scattered store far worse than a gathered load
from a small leaf), the sum (SUM_COST), and the per-vector overhead (calling each leaf's
loop) spread over V.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from math import prod

from .. import abi
from ..abi import BUFFER

ACCESS_COST = {abi.CONSTANT: 0.05, abi.CONTIGUOUS: 0.15, abi.STRIDED: 0.6, abi.GATHERED: 0.8}
# A GATHERED access whose every line (8 elements from the vector's start) lies within 8
# elements of the line's first: one load and a permute where the machine has AVX-512
# (codegen/lines.py), lane by lane elsewhere as any gather. The plan is the same on every
# machine. grid4x8_d2's reassociating run 82.7-85.1 -> 76.5-81.0 us (five rounds), its
# sums of 16 terms into 16 outputs across outputs now; grid6_d2's exact run 1379-1441 ->
# 1342-1368 us, its reassociating one 417-433 -> 430-455 us (its products' longer vectors
# repack more); grid5_d3 and the 12 x 12 3-state grid within their noise
WINDOW_COST = 0.5
WINDOW = 8
# a scattered store into a large output touches a cache line per element (measured: ~30x
# a contiguous one)
STORE_COST = {abi.CONSTANT: 0.2, abi.CONTIGUOUS: 0.2, abi.STRIDED: 6.0, abi.GATHERED: 6.0}
# per operand and vector: setting up its loop and stepping the odometer, in the same units.
# Measured on whole programs: a UAI Promedus instance whose largest steps ran vectors of 8
# elements between broadcast axes took 80 ms at 5.0 and 68 ms at 20 (longer vectors, with
# gathers); the bench programs and UAI grids, whose vectors are long anyway, moved by
# under 3% either way
VECTOR_COST = 20.0
ACROSS_REDUCED, ACROSS_OUTPUTS, ACROSS_BOTH = "reduced", "outputs", "both"
# a sum in order is a chain of dependent additions (one per ~4 cycles); sums of different
# outputs are independent (across both: lanes of outputs too, as plan/schedule.read_cost
# prices such nests for the layout pass)
SUM_COST = {ACROSS_REDUCED: 1.0, ACROSS_OUTPUTS: 0.2, ACROSS_BOTH: 0.2}
# a leaf bigger than this (float64 elements, 4 MiB) is read from memory, not the caches:
# each of its cache lines a term touches costs this much (a 64-byte line at ~20 GB/s).
# 4, not 3: grid5_d3's reductions of its 115 MB product whose sums take a reduced axis of
# stride 6561 innermost ran 15.7-16.7 ms across outputs (0.58 lines a term, the choice at
# 3) and 9.1-9.2 ms across reduced axes (0.16); a run 228-230 -> 205-213 ms. The UAI
# models moved within their noise (same plans, alternating runs)
CACHED_ELEMENTS = 1 << 19
LINE_COST = 4.0
# one output's terms of that leaf (float64) stay in a core's cache for the next output
SWEEP_CACHE_BYTES = 1 << 19
# A core's L1 data cache: L1_SETS sets of L1_WAYS 64-byte lines (32 KiB, 8-way: AMD's
# cores since Zen, Intel's before Ice Lake). Vector elements a multiple of 4 KiB apart put
# their lines in one set, and many more than L1_WAYS of them evict each other at every
# term: grid6_d2's reductions of a 1 MiB leaf whose 256 outputs lie 4 KiB apart ran 3.9 ns
# a term across outputs, against 1.75 across reduced axes (each output's terms in a row).
# Twice the ways cost little (two leaves of 16 lines a set: 154 us across outputs against
# 245 us across reduced axes), so only sets of more lines than that count
L1_SETS, L1_WAYS = 64, 8
L1_ELEMENTS = L1_SETS * L1_WAYS * 8  # (float64)
CONFLICT_COST = 4.0
PARALLEL_ROWS = 8  # a parallel step keeps at least this many rows outside its vector
# Below this many terms a reduction keeps its vector across reduced axes whatever the
# cost, unless the program compiles the kernel across outputs anyway (small_by_cost): the
# difference is a microsecond or two, and a second kernel per pattern would cost every
# cold start a compile (about a second each). When that kernel is there, the cost
# decides: grid4x8_d2's reductions of 128 outputs of 8 terms each took 2.6 us across
# reduced axes (32 groups of 4 lanes, 8-element vectors) and 0.8 us across outputs.
SMALL_REDUCTION = 1 << 12
# ... and where at least this many of a program's small reductions would take the kernel
# across outputs, the program compiles it for them: their microseconds add up
MANY_SMALL_REDUCTIONS = 32


@dataclass
class LoopNest:
    """A segment's loop space as a kernel walks it: axes in loop order (output axes, then
    reduced ones), each operand's strides (the output first), and the vector: the nb axes
    ending at `end` (the last axis, or with ACROSS_OUTPUTS and ACROSS_BOTH the last output
    axis), with ACROSS_BOTH after the red_nb last reduced axes (the vector's outer part)."""

    sizes: list[int]
    groups: list[int]  # 0: output axis, 1: reduced axis
    operands: list[list[int]]
    nb: int
    across: str
    red_nb: int = 0

    @property
    def out_rank(self) -> int:
        return self.groups.count(0)

    @property
    def end(self) -> int:
        return len(self.sizes) if self.across == ACROSS_REDUCED else self.out_rank

    def vector_positions(self) -> list[int]:
        """The vector's axes, outermost first."""
        outer = list(range(len(self.sizes) - self.red_nb, len(self.sizes)))
        return outer + list(range(self.end - self.nb, self.end))

    def vector_sizes(self) -> list[int]:
        return [self.sizes[d] for d in self.vector_positions()]

    def access(self, i: int) -> abi.Access:
        """Operand i's access along the vector (0: the output)."""
        return access_of(self.vector_sizes(), [self.operands[i][d] for d in self.vector_positions()])


def loop_nest(
    sizes: list[int],
    groups: list[int],
    operands: list[list[int]],
    reduce: bool,
    main: int,
    limit: int,
    parallel: bool,
    across: str | None = None,
    small_by_cost: bool = False,
    lanes: bool = False,
) -> LoopNest:
    """The loop nest of a segment in canonical form (plan/schedule.canonical_loops), its
    reduced axes in the order given (C order over them is the order of each sum's terms).
    main: the operand whose memory order the output axes follow and whose cache lines the
    cost counts (the biggest leaf); limit: most
    elements a vector with a GATHERED access may have; parallel: the step will run on all
    threads, so keep rows outside the vector; across: force a reducing nest's vector
    (ACROSS_REDUCED, ACROSS_OUTPUTS, or ACROSS_BOTH where the nest has one, else
    ACROSS_OUTPUTS; None: the cheapest by nest_cost); small_by_cost: a reduction of fewer
    than SMALL_REDUCTION terms is decided by the cost too (else it stays across reduced
    axes); lanes: the kernel sums across reduced axes in lanes (nest_cost)."""
    if not sizes:
        sizes, groups, operands = [1], [0], [op + [0] for op in operands]
    out_rank = groups.count(0)
    if not reduce:

        def products(order: list[int]) -> LoopNest:
            s, g, o = canonical_loops(*_permute(order, sizes, groups, operands))
            s, g, o = _pad(s, g, o, 0)
            return _filled(s, g, o, 0, len(s), limit, parallel, ACROSS_OUTPUTS)

        return min((products(order) for order in output_orders(sizes, operands, limit)), key=filled_cost)
    # the output axes in main's memory order (largest stride first); the reduced ones as
    # given: their order is the order of each sum's terms, which the caller fixes
    order = sorted(range(out_rank), key=lambda d: -operands[main][d]) + list(range(out_rank, len(sizes)))
    sizes, groups, operands = canonical_loops(*_permute(order, sizes, groups, operands))
    out_rank = groups.count(0)
    sizes, groups, operands = _pad(sizes, groups, operands, 1)
    across_reduced = _filled(sizes, groups, operands, out_rank, len(sizes), limit, False, ACROSS_REDUCED)
    if (
        out_rank == 0
        or across == ACROSS_REDUCED
        or (across is None and prod(sizes) < SMALL_REDUCTION and not small_by_cost)
    ):
        return across_reduced
    if across == ACROSS_BOTH:
        across_both = _tiled(sizes, groups, operands, main, limit, parallel)
        if across_both is not None:
            return across_both
    candidates = []
    # (the orders that read main again from L1 for float sums (lanes) only: grid6_d2's
    # exact LOGPROB plan took them, where each term's exp is the cost, and ran 3.90-3.92 ->
    # 4.03-4.05 ms; its PROB one 1.60-1.63 -> 1.59-1.60 ms, grid5_d3's exact PROB within
    # noise; the 12 x 12 3-state grid's reassociating sum of 531441 outputs from a leaf
    # without its outermost axis 1.1-1.2 -> 0.97-1.03 ms)
    reuse = main if lanes else None
    fill = _elements(sizes, operands[main]) > CACHED_ELEMENTS
    for head in output_orders(sizes[:out_rank], [op[:out_rank] for op in operands], limit, reuse, fill):
        order = head + list(range(out_rank, len(sizes)))
        s2, g2, o2 = canonical_loops(*_permute(order, sizes, groups, operands))
        if 0 in g2:
            candidates.append(_filled(s2, g2, o2, 0, g2.count(0), limit, parallel, ACROSS_OUTPUTS))
    if not candidates:
        return across_reduced
    across_outputs = min(candidates, key=lambda nest: nest_cost(nest, main, lanes))
    if across in (ACROSS_OUTPUTS, ACROSS_BOTH):
        return across_outputs
    # Across both is taken only when asked (PlanOptions.across): it saved grid5_d3 2 x 4
    # ms per run (its 27-output reductions of a 115 MB leaf, 29 -> 25 ms each) and cost
    # its cold start a kernel more (8.0 -> 10.2 s, over the 20% that compile time may
    # grow); on cached leaves it gathers more than the others and was no faster
    return min((across_reduced, across_outputs), key=lambda nest: nest_cost(nest, main, lanes))


def nest_cost(nest: LoopNest, main: int, lanes: bool = False) -> float:
    """Cost per term of a reducing nest across reduced axes or across outputs (for
    choosing between them); main: the biggest leaf, whose cache lines it counts; lanes:
    the kernel sums across reduced axes in lanes (steps.KernelPattern.sums_in_lanes)."""
    positions = nest.vector_positions()
    columns = [[op[d] for d in positions] for op in nest.operands]
    columns[0] = [0] * len(positions)  # the output is written once per sum, not per term:
    store = STORE_COST[nest.access(0).kind] if nest.across != ACROSS_REDUCED else 0.0
    terms = prod(n for n, g in zip(nest.sizes, nest.groups) if g == 1)
    beyond_caches = _elements(nest.sizes, nest.operands[main]) > CACHED_ELEMENTS
    if lanes and whole_lanes(nest) and beyond_caches:
        cost = ACCESS_COST[abi.CONTIGUOUS] + (SUM_COST[ACROSS_REDUCED] + VECTOR_COST / terms) / abi.LANES
    elif lanes and nest.across == ACROSS_REDUCED and beyond_caches:
        # the lanes' chains overlap here too, each output's terms swept through the buffer
        # a vector at a time: a split's partial sums of a 1 GB leaf, 19683 outputs of 6561
        # terms in a row each, 136 ms across outputs (a stride of 6561 along the vector),
        # 57 ms across reduced axes (one x86-64, two threads)
        cost = vector_cost(nest.vector_sizes(), columns) + SUM_COST[ACROSS_REDUCED] / abi.LANES
    else:
        cost = vector_cost(nest.vector_sizes(), columns) + SUM_COST[nest.across] + store / terms
    if _elements(nest.sizes, nest.operands[main]) > CACHED_ELEMENTS:
        cost += LINE_COST * lines_per_term(nest, main)
    return cost + CONFLICT_COST * sum(set_conflicts(nest, i) for i in range(1, len(nest.operands)))


def whole_lanes(nest: LoopNest) -> bool:
    """A sum in lanes of one leaf CONTIGUOUS along a vector of every reduced axis: each
    lane adds its terms where they lie in memory, no buffer, no sweep (codegen/cpu.py,
    _lanes_reduction). grid5_d3's reassociating sums of a 115 MB belief to 531441
    outputs of 27 terms: 6.0-6.5 ms, against 10.4 across outputs (a stride of 27 along
    the vector) and 11.8 through the buffer. Counted so for a leaf beyond the caches
    only: on cached ones (grid6_d2, grid4x8_d2: sums of 8-64 terms) the sums across
    outputs stayed faster (reassociating runs 1.40 -> 1.57 ms and 206 -> 236 us with
    whole lanes chosen there too)."""
    return (
        nest.across == ACROSS_REDUCED
        and len(nest.operands) == 2
        and nest.nb == len(nest.sizes) - nest.out_rank
        and nest.access(1).kind == abi.CONTIGUOUS
    )


def set_conflicts(nest: LoopNest, i: int) -> float:
    """The share of operand i's vector elements (float64) whose cache lines cannot all
    stay in L1 while the vector is read: those in sets that more than twice L1_WAYS of
    the vector's lines map to."""
    offsets = [0]
    for d in nest.vector_positions():
        offsets = [o + k * nest.operands[i][d] for o in offsets for k in range(nest.sizes[d])]
    lines = {o // 8 for o in offsets}
    per_set: dict[int, int] = {}
    for line in lines:
        per_set[line % L1_SETS] = per_set.get(line % L1_SETS, 0) + 1
    return sum(1 for o in offsets if per_set[(o // 8) % L1_SETS] > 2 * L1_WAYS) / len(offsets)


def _elements(sizes: Sequence[int], strides: Sequence[int]) -> int:
    """Elements of an operand with these strides over axes of these sizes."""
    return prod(n for n, st in zip(sizes, strides) if st)


def lines_per_term(nest: LoopNest, main: int) -> float:
    """Cache lines of operand `main` (float64) per term that the vector and the innermost
    axis outside it touch: 1/8 when they walk it a line at a time, more when they take a
    few elements from each line and other vectors come back for the rest (by then, in a
    leaf larger than the cache, from memory again)."""
    vector = nest.vector_positions()
    offsets = [0]
    for d in vector:
        offsets = [o + i * nest.operands[main][d] for o in offsets for i in range(nest.sizes[d])]
    # the odometer's innermost axis (in every kind the last axis outside the vector): the
    # next vectors may take the rest of these lines. Across reduced axes, when one output's
    # terms fit in the cache, the next output's sum finds them there: its axis then.
    outside = [d for d in range(len(nest.sizes)) if d not in vector and nest.sizes[d] > 1]
    if nest.across == ACROSS_REDUCED:
        terms = prod(n for n, g in zip(nest.sizes, nest.groups) if g == 1)
        if terms * 8 <= SWEEP_CACHE_BYTES:
            outside = [d for d in outside if nest.groups[d] == 0]
    if outside:
        d = outside[-1]
        steps = min(nest.sizes[d], max(2, (1 << 16) // len(offsets)))
        offsets = [o + i * nest.operands[main][d] for i in range(steps) for o in offsets]
        # and the axes main lacks just outside that one, while what they read again
        # stays in L1: at each of their positions main's lines come from L1
        for d in reversed(outside[:-1]) if steps == nest.sizes[outside[-1]] else ():
            if nest.operands[main][d] or len(offsets) * nest.sizes[d] > L1_ELEMENTS:
                break
            offsets = offsets * nest.sizes[d]
    return len({o // 8 for o in offsets}) / len(offsets)


def _tiled(sizes, groups, operands, main: int, limit: int, parallel: bool) -> LoopNest | None:
    """The ACROSS_BOTH nest of a reducing loop space (outputs in main's memory order, then
    the reduced axes in the order of the sums), or None where it has none. Its vector: lanes first, the
    output axes innermost in main, as many as fit with one reduced axis beside them (and,
    for a parallel step, leave PARALLEL_ROWS rows); then the innermost reduced axes while
    the vector fits in `limit` (and the kernels' buffer), the outermost of them split if
    it does not fit whole. Lanes make it fast: each output's sum is a chain of dependent
    additions, and the S outputs' chains run side by side (measured on one core, 14.3 M
    terms, the sums alone: 17.5 ms with 3 lanes, 7.3 ms with 9, 5.0 ms with 27)."""
    out_rank, D = groups.count(0), len(sizes)
    limit = min(limit, BUFFER)
    if out_rank == D:
        return None
    S, o, rows = 1, out_rank - 1, prod(sizes[:out_rank])
    while o >= 0 and S * sizes[o] * min(sizes[-1], 2) <= limit:
        if parallel and rows // sizes[o] < PARALLEL_ROWS:
            break
        S, rows, o = S * sizes[o], rows // sizes[o], o - 1
    if S == 1:
        return None
    sizes, groups, operands = list(sizes), list(groups), [list(op) for op in operands]
    J, r = 1, D - 1
    while r >= out_rank and S * J * sizes[r] <= limit:
        J, r = J * sizes[r], r - 1
    if r >= out_rank:  # split the next reduced axis (n, s) into (n / b, b), strides (s * b, s)
        b = max((b for b in range(2, limit // (S * J) + 1) if sizes[r] % b == 0), default=1)
        if b > 1:
            sizes[r : r + 1] = [sizes[r] // b, b]
            groups.insert(r, 1)
            for op in operands:
                op[r : r + 1] = [op[r] * b, op[r]]
            J *= b
            D += 1
    if J == 1:
        return None
    red_nb = sum(1 for d in range(out_rank, D) if prod(sizes[d:]) <= J)
    return LoopNest(sizes, groups, operands, out_rank - 1 - o, ACROSS_BOTH, red_nb)


def _pad(sizes, groups, operands, group):
    """A size-1 axis of `group` if it has none: the hot axes are never empty."""
    if group in groups:
        return sizes, groups, operands
    return sizes + [1], groups + [group], [op + [0] for op in operands]


def _permute(order, sizes, groups, operands):
    return (
        [sizes[d] for d in order],
        [groups[d] for d in order],
        [[op[d] for d in order] for op in operands],
    )


def _filled(
    sizes, groups, operands, first: int, end: int, limit: int, parallel: bool, across: str
) -> LoopNest:
    """The vector over axes first..end-1 (innermost first), after splitting the first
    axis that does not fit whole, so that it can fill up to `limit` elements."""
    if parallel:  # rows outside the vector for the threads to share
        space = prod(sizes[first:end])
        limit = max(1, min(limit, space // PARALLEL_ROWS))
    sizes, groups, operands = list(sizes), list(groups), [list(op) for op in operands]
    V, d = 1, end - 1
    while d >= first and V * sizes[d] <= limit:
        V, d = V * sizes[d], d - 1
    if d >= first:
        b = max((b for b in range(2, limit // V + 1) if sizes[d] % b == 0), default=1)
        if b > 1 and (d < end - 1 or b >= 16):
            sizes[d : d + 1] = [sizes[d] // b, b]
            groups.insert(d, groups[d])
            for op in operands:
                op[d : d + 1] = [op[d] * b, op[d]]
            end += 1
    nb = vector_axes(sizes, first, end, operands, limit)
    return LoopNest(sizes, groups, operands, nb, across)


def canonical_loops(sizes: list[int], groups: list[int], operands: list[list[int]]):
    """Drop size-1 axes, then merge neighbours of one group contiguous in every operand."""
    keep = [d for d, n in enumerate(sizes) if n > 1]
    sizes = [sizes[d] for d in keep]
    groups = [groups[d] for d in keep]
    operands = [[op[d] for d in keep] for op in operands]
    d = len(sizes) - 2
    while d >= 0:
        if groups[d] == groups[d + 1] and all(op[d] == op[d + 1] * sizes[d + 1] for op in operands):
            sizes[d] *= sizes[d + 1]
            for op in operands:
                op[d] = op[d + 1]
                del op[d + 1]
            del sizes[d + 1], groups[d + 1]
        d -= 1
    return sizes, groups, operands


def access_kind(sizes: Sequence[int], strides: Sequence[int]) -> tuple[int, int]:
    """(kind, step) of an operand with these strides over vector axes of these sizes."""
    if prod(sizes) == 1:
        return abi.CONTIGUOUS, 1  # one element: the same whatever the kind; this one stores
    if not any(strides):
        return abi.CONSTANT, 0
    step = strides[-1]
    span = 1
    for n, st in zip(reversed(sizes), reversed(strides)):
        if st != step * span:
            return abi.GATHERED, 0
        span *= n
    return (abi.CONTIGUOUS, 1) if step == 1 else (abi.STRIDED, step)


@lru_cache(maxsize=1 << 16)
def access_cost(sizes: tuple[int, ...], strides: tuple[int, ...]) -> float:
    """ACCESS_COST of an operand with these strides over vector axes of these sizes, a
    GATHERED one within windows WINDOW_COST (the planner asks again for the same vectors)."""
    kind = access_kind(sizes, strides)[0]
    if kind != abi.GATHERED:
        return ACCESS_COST[kind]
    offsets = access_of(sizes, strides).offsets
    for j in range(0, len(offsets), WINDOW):
        if any(not 0 <= o - offsets[j] < WINDOW for o in offsets[j : j + WINDOW]):
            return ACCESS_COST[kind]
    return WINDOW_COST


def access_of(sizes: Sequence[int], strides: Sequence[int]) -> abi.Access:
    """The operand's access along the vector; a GATHERED one carries its offsets."""
    kind, step = access_kind(sizes, strides)
    if kind != abi.GATHERED:
        return abi.Access(kind, step)
    offsets = []
    for v in range(prod(sizes)):
        off, rem = 0, v
        for n, st in zip(reversed(sizes), reversed(strides)):
            off += (rem % n) * st
            rem //= n
        offsets.append(off)
    return abi.Access(kind, 0, tuple(offsets))


def vector_axes(
    sizes: Sequence[int], first: int, end: int, operands: Sequence[Sequence[int]], limit: int
) -> int:
    """How many axes ending at `end` (none before `first`) form the vector: outward while
    they fit in `limit` elements (a GATHERED access needs a table of V entries) and make
    it cheaper per element. One axis always does, however long: along one axis every
    access is an affine one, and the kernel walks a long vector in pieces.
    operands: the output's strides, then the leaves'."""

    def column(start):
        return [op[start:end] for op in operands]

    nb, V = 1, sizes[end - 1]
    cost = vector_cost(sizes[end - 1 : end], column(end - 1))
    for d in range(end - 2, first - 1, -1):
        if V * sizes[d] > limit:
            break
        wider = vector_cost(sizes[d:end], column(d))
        if wider >= cost:
            break
        nb, V, cost = nb + 1, V * sizes[d], wider
    return nb


def vector_cost(sizes: Sequence[int], operands: Sequence[Sequence[int]], overhead: bool = True) -> float:
    """Cost per element of a vector over axes of these sizes; operands[0] is the output,
    its strides over the vector axes, then the leaves'. overhead: count the per-vector
    cost too (spread over V)."""
    cost = STORE_COST[access_kind(sizes, operands[0])[0]]
    cost += sum(access_cost(tuple(sizes), tuple(op)) for op in operands[1:])
    return cost + (VECTOR_COST * len(operands) / prod(sizes) if overhead else 0.0)


def output_orders(
    sizes: Sequence[int],
    operands: Sequence[Sequence[int]],
    limit: int,
    main: int | None = None,
    fill: bool = False,
) -> list[list[int]]:
    """The loop orders worth costing for axes whose order does not change results:
    vector_order's, and the output's own memory order (its innermost axes the vector,
    written contiguous). vector_order picks whole axes, so an axis too long for the vector
    never joins it; the vector is then filled with axes that scatter the output (a
    4-element contiguous vector pays its overhead 64 times over); filling the output's
    own order (_filled) splits such an axis instead. The cheaper by the cost is kept.
    grid6_d2's products of 8192 elements whose output axis of stride 4 is 512 long: 16 x
    2 x 2 x 4 elements scattered, 21 us each on one thread; 64 x 4 contiguous, 2.6 us
    (and 2 us to repack a leaf that is now gathered)."""
    greedy = vector_order(sizes, operands, limit)
    by_output = sorted(range(len(sizes)), key=lambda d: (-operands[0][d], d))
    orders = [greedy] if by_output == greedy else [greedy, by_output]
    if main is None:
        return orders
    # With `main` (a leaf): each order again with the axes main lacks moved in, just outside
    # its innermost axis, so that main's lines the vector reads serve every position of
    # those axes while they are in L1 (lines_per_term counts them so); a leaf beyond the
    # caches is otherwise read from memory once per position of such an axis outside
    lacks = [d for d in range(len(sizes)) if operands[main][d] == 0 and sizes[d] > 1]
    for order in list(orders):
        rest = [d for d in order if d not in lacks]
        if not (lacks and rest):
            continue
        # ... and where asked (fill: main beyond the caches), just outside as many of the
        # innermost axes as a vector holds (the 12 x 12 3-state grid's sum of 531441
        # outputs: rows of 243 instead of 81)
        inner = 1
        while fill and inner < len(rest) and prod(sizes[d] for d in rest[-inner - 1 :]) <= limit:
            inner += 1
        for k in sorted({1, inner}):
            moved = rest[:-k] + [d for d in order if d in lacks] + rest[-k:]
            if moved not in orders:
                orders.append(moved)
    return orders


def filled_cost(nest: LoopNest) -> float:
    """vector_cost of a nest's vector (its overhead counted)."""
    positions = nest.vector_positions()
    return vector_cost(nest.vector_sizes(), [[op[d] for d in positions] for op in nest.operands])


def vector_order(sizes: Sequence[int], operands: Sequence[Sequence[int]], limit: int) -> list[int]:
    """A loop order for axes whose order does not change results: the vector's axes last,
    chosen greedily from the innermost out (each the axis that makes the vector cheapest
    per element, while it fits in `limit` and lowers the cost with the per-vector overhead
    counted), and the other axes
    outside it in the output's memory order, so that consecutive vectors write nearby."""
    rank = len(sizes)

    def column(axes):
        return [[op[d] for d in axes] for op in operands]

    by_output = sorted(range(rank), key=lambda d: (-operands[0][d], d))
    # the innermost axis by its cost per element alone: with the overhead, a long axis
    # would win however it is walked (a short one pays the overhead until others join it)
    best = min(reversed(by_output), key=lambda d: vector_cost([sizes[d]], column([d]), False))
    block, V = [best], sizes[best]
    cost = vector_cost([sizes[best]], column(block))
    while V < limit:
        # the next axis by cost per element alone (each choice fills the vector further,
        # so the overhead would favour long axes however they are walked), kept if the
        # cost with the overhead goes down
        options = []  # (cost, rank in the output's order, axis): ties go to the nearer axis
        for i, d in enumerate(by_output):
            if d not in block and V * sizes[d] <= limit:
                axes = [d] + block
                options.append((vector_cost([sizes[a] for a in axes], column(axes), False), -i, d))
        if not options:
            break
        _, _, d = min(options)
        wider = vector_cost([sizes[a] for a in [d] + block], column([d] + block))
        if wider >= cost:
            break
        cost, block, V = wider, [d] + block, V * sizes[d]
    return [d for d in by_output if d not in block] + block
