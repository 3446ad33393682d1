"""Layouts: the axis order in which each materialized value is stored.

Inputs and constants are stored in their spec's order (users hand them in), and so are
results, except where a GEMM step writes or reads one (below). A computed workspace value
is ours to lay out: when a reducing segment reads it, store it with that segment's kept
axes outermost (in the segment's output order), then its reduced axes in the order the
segment adds them (Segment.red_axes, plan/schedule.py), so that for each output element the
reduction walks one contiguous stretch of memory, in order. Among several such readers the
one with the most work wins (work per batch row, in batched programs: so the same reader
wins as in the unbatched program, and each row's sums run in the same order). A batch axis
(ir/batch.py) stays innermost, as in every batched spec, so each row is laid out as the
unbatched value is. The layout changes addresses only.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import permutations

from ..ir.schema import TensorSpec, element_count
from .fusion import Fused, Segment
from .gemm import GemmGroups

# A pairwise reduction that cannot be a GEMM step reads its leaves where they lie. For a
# leaf beyond the last-level cache (2^22 float64 elements, 32 MiB) it states its order:
# grid5_d3's reassociating plan sums 115 MB products to 531441 outputs of 27 terms each,
# which read them gathered along the vector in their producer's order (10-19 ms each; a
# run 201 -> 185 ms). A smaller leaf stays in the order its producer walks: stated for
# every leaf, UAI 2014's Alchemy_11 (leaves of up to 16 MB) solved in 10.6-10.7 ms
# against 9.4-9.7
LARGE_VALUE = 1 << 22


def choose_layouts(
    fused: Fused,
    batch_key: tuple | None = None,
    gemm_groups: Callable[[Segment], GemmGroups | None] | None = None,
    result_layouts: bool = True,
    read_cost: Callable[[Segment, dict[int, TensorSpec]], float] | None = None,
) -> dict[int, TensorSpec]:
    """gemm_groups: the reductions that may run as GEMM steps and their groups of axes
    (plan/gemm.gemm_groups). Those state no order for the other readers' sake (nor do the
    other pairwise reductions, for leaves under LARGE_VALUE); a value no other reduction
    prefers an order for is then stored, in program order (a value's leaves are settled
    before it):
    - written by a GEMM step: as its products come out (batch axes outermost, then its
      rows and columns as its leaves hold them; as the value's own order where a leaf is
      no matrix as it lies, which the step copies into one), so that it copies no output, in the
      order that most of the GEMM steps reading it can read without a copy either; of
      those, the one its other readers' loops cost least in (read_cost: the loop-order
      cost model, plan/schedule.read_cost), else its spec's order first, where that is one;
    - read by a GEMM step: as the reader's matrix (the reader with the most work), its
      summed axes in the order of the reader's other leaf if that one is settled and a
      matrix as it lies (else their own order: the step copies the other leaf);
    - else as its producer reads its largest leaf of the same axes (a product then walks
      both in memory order); a result in its spec's order.
    A GEMM step copies whatever is not so into its workspace (plan/gemm.py). Results too
    (belief propagation's messages are results) unless result_layouts is off
    (PlanOptions.gemm_result_layouts): their slots are then views in their spec's order
    (plan/pipeline.Binding). ObjectDetection_11's GEMM steps copied 26.5 M elements in
    and 15.5 M out a solve with every result and product in its own order, 19.9 M and 0
    so (best solve 142-174 ms -> 113-132 ms). Batched programs keep their batch axis
    innermost and their results in their own order: their values stay as the last rule
    puts them."""
    outputs = set(fused.outputs.values())
    groups: dict[int, GemmGroups] = {}
    for i, seg in enumerate(fused.segments):
        g = gemm_groups(seg) if gemm_groups is not None and seg.red_axes else None
        if g is not None:
            groups[i] = g
    best: dict[int, tuple] = {}  # value -> (work, segment index)
    for i, seg in enumerate(fused.segments):
        if not seg.red_axes or i in groups:
            continue
        pairwise = gemm_groups is not None and len(seg.leaves) == 2
        work = _work(seg, batch_key)
        for leaf in seg.leaves:
            if pairwise and element_count(fused.specs[leaf]) < LARGE_VALUE:
                continue  # (below: stored as its producer reads its leaves)
            if fused.kinds[leaf] == "computed" and leaf not in outputs:
                if leaf not in best or work > best[leaf][0]:
                    best[leaf] = (work, i)
    layouts = {v: spec for v, spec in fused.specs.items()}

    def store(v: int, kept: list) -> None:
        spec = fused.specs[v]
        kept = [k for k in kept if spec.has_key(k) and k != batch_key]
        rest = [k for k in spec.keys if k not in kept and k != batch_key]
        last = [batch_key] if batch_key is not None and spec.has_key(batch_key) else []
        layouts[v] = TensorSpec(tuple(spec.get_axis(k) for k in kept + rest + last))

    for v, (_, i) in best.items():
        seg = fused.segments[i]
        store(v, list(seg.out_spec.keys) + [ax.key for ax in seg.red_axes])
    if gemm_groups is None:
        return layouts
    readers: dict[int, list[int]] = {}  # value -> the GEMM steps that may read it
    for i in groups:
        for leaf in dict.fromkeys(fused.segments[i].leaves):
            readers.setdefault(leaf, []).append(i)
    # (a result is the program's: it lies in its own order only where a GEMM step writes or
    # reads it, and a batched program's all do)
    settled = {v for v in fused.specs if fused.kinds.get(v) != "computed"} | set(best)
    if batch_key is not None or not result_layouts:
        settled |= outputs

    def reads(i: int, v: int) -> tuple[int, tuple | None]:
        """(which leaf of GEMM step i value v is, the keys of its other leaf if settled)."""
        leaves = fused.segments[i].leaves
        other = leaves[1 - leaves.index(v)]
        return leaves.index(v), layouts[other].keys if other in settled else None

    # the readers that are not GEMM steps, whose loops read a GEMM step's products where
    # they lie: among the orders the GEMM step writes without a copy, theirs decides. The
    # 12 x 12 3-state grid's reassociating sums of two 531441-element GEMM products into
    # 531441 and 81 outputs read them gathered in the first such order: 1.51-1.58 and
    # 1.62-1.69 ms; 1.25-1.26 and 1.25-1.34 ms in the order their costs choose
    loop_readers: dict[int, list[int]] = {}
    for i, seg in enumerate(fused.segments):
        if i not in groups:
            for leaf in dict.fromkeys(seg.leaves):
                loop_readers.setdefault(leaf, []).append(i)

    def cost_of(v: int, keys: list, others: list[Segment], cost: Callable) -> float:
        store(v, keys)
        return sum((cost(seg, layouts) for seg in others), 0.0)

    for i, seg in enumerate(fused.segments):
        v = seg.out
        if v in settled or fused.kinds.get(v) != "computed":
            continue
        settled.add(v)
        keys = list(fused.specs[v].keys)
        if not seg.red_axes and v not in outputs:  # (as it reads its largest leaf of the same axes)
            same = [leaf for leaf in seg.leaves if set(fused.specs[leaf].keys) == set(keys)]
            if same:
                keys = list(layouts[max(same, key=lambda leaf: element_count(fused.specs[leaf]))].keys)
        if batch_key is None and i in groups:
            g, leaves = groups[i], (layouts[leaf].keys for leaf in seg.leaves)
            candidates = _written_orders(keys, g, *leaves)
            fits = [sum(_fits(c, groups[r], *reads(r, v)) for r in readers.get(v, ())) for c in candidates]
            tied = [c for c, n in zip(candidates, fits) if n == max(fits)]
            others = [fused.segments[r] for r in loop_readers.get(v, ())]
            if len(tied) > 1 and others and read_cost is not None:
                keys = min(tied, key=lambda c: cost_of(v, c, others, read_cost))
            else:
                keys = tied[0]
        elif batch_key is None and v in readers:
            r = max(readers[v], key=lambda r: (_work(fused.segments[r], None), -r))
            keys = _read_order(keys, groups[r], *reads(r, v))
        store(v, keys)
    return layouts


def _work(seg: Segment, batch_key: tuple | None) -> int:
    """A reduction's work per batch row (so that a batched program's rows are laid out as
    the unbatched program's values)."""
    work = 1
    for ax in tuple(seg.out_spec.axes) + tuple(seg.red_axes):
        work *= ax.size if ax.key != batch_key else 1
    return work


# a GEMM step's batch axes may lie in any order: beyond this many, only one is tried
MAX_BATCH_ORDERS = 4


def _written_orders(keys: list, g: GemmGroups, keys0: tuple, keys1: tuple) -> list[list]:
    """The orders a GEMM step of groups g writes its products in without a copy, its leaves
    stored as keys0 and keys1: (axes of size 1,) batch axes in any order, then rows and
    columns each in the order of the leaf that has them, either first. `keys` first if it
    is one, then those with the batch axes as they are in `keys`."""
    # (a leaf that is no matrix as it lies is copied into one, in any order: it sets none)
    rows = [k for k in (keys0 if _fits(keys0, g, 0, None) else keys) if k in g.only0]
    cols = [k for k in (keys1 if _fits(keys1, g, 1, None) else keys) if k in g.only1]
    ones = [k for k in keys if k not in g.shared and k not in g.only0 and k not in g.only1]
    batch = [k for k in keys if k in g.shared]
    orders = [tuple(batch)]
    if len(batch) <= MAX_BATCH_ORDERS:
        orders += [o for o in permutations(batch) if o != tuple(batch)]
    found = [ones + list(o) + inner for o in orders for inner in (rows + cols, cols + rows)]
    big = [k for k in keys if k not in ones]
    return sorted(found, key=lambda c: c[len(ones) :] != big)  # (`keys` first where it is one)


def _fits(keys: list | tuple, g: GemmGroups, leaf: int, other: tuple | None) -> bool:
    """Whether a value stored as `keys` is, for a GEMM step of groups g that reads it as
    leaf `leaf`, a matrix per batch position (batch axes outside it), its summed axes in
    the order of its other leaf (stored as `other`; None: not settled, any order)."""
    mine = set(g.only0 if leaf == 0 else g.only1)
    big = [k for k in keys if k in g.shared or k in mine or k in g.red]
    n = len(g.shared)
    if set(big[:n]) != set(g.shared):
        return False
    rest = big[n:]
    if set(rest[: len(mine)]) != mine and set(rest[: len(g.red)]) != g.red:
        return False
    return other is None or [k for k in big if k in g.red] == [k for k in other if k in g.red]


def _read_order(keys: list, g: GemmGroups, leaf: int, other: tuple | None) -> list:
    """`keys` made a matrix for a GEMM step of groups g that reads it as leaf `leaf`:
    (axes of size 1,) batch axes, then its own and the summed group, each in the order it
    has in `keys` (the summed one in `other`'s, where settled and a matrix), the group of the innermost
    of them last (a product that writes it then reads its leaves in much the same order)."""
    mine = g.only0 if leaf == 0 else g.only1
    own = [k for k in keys if k in mine]
    # (the other leaf's summed order where it is a matrix as it lies: else it is copied
    # into one, in any order)
    order = other if other is not None and _fits(other, g, 1 - leaf, None) else keys
    red = [k for k in order if k in g.red]
    ones = [k for k in keys if k not in g.shared and k not in mine and k not in g.red]
    batch = [k for k in keys if k in g.shared]
    inner = [k for k in keys if k in mine or k in g.red]
    return ones + batch + (red + own if inner and inner[-1] in mine else own + red)
