"""Folded products: a product with one reader is computed inside that reader.

fuse() computes a CONTRACT inside the ELIMINATE that reads it, and a CONTRACT read first
by its one reader inside that reader, so in the graph as written such a product is never
written. Later passes make new such pairs: the reassociating mode's contraction paths end
a clique's product where its readers' sums of its private axes begin, or build a product
in pairwise steps whose intermediates are as large as the result (plan/reassociate.py),
and once twin sums are computed once (plan/permuted.py) a product may have one reader
left. Written out, such a product costs a pass over memory and a read back (grid5_d3:
115 MB and 38 MB products).

Folded: the product's leaves are multiplied, in their order, first in the reader's loop,
which then multiplies its other leaves and sums as before. Where the product was the
reader's first leaf (or its only one, summed), each term is the same product and each
sum the same sum: the same bits in both modes. Where products may be regrouped (the
reassociating mode), a product read in another place is folded too (rounding only). A
sum of the product and other leaves is left as the path optimizer chose it, and so is a
product much smaller than its reader's loop space (RECOMPUTED), which the reader
broadcasts: that is what hoisting (plan/hoist.py) makes on purpose.

Where products may be regrouped, a product folded into a sum of it alone whose leaves
include some without any summed axis is split as ⊗ distributes over ⊕ (sum_inside): the
leaves with summed axes are summed first, in a segment of their own, and the reader
multiplies the others by that sum (grid4x8_d2: sums of 4,096 terms, 2.0 us each, where
one 128-element leaf held every summed axis).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import replace
from math import prod

from ..ir.schema import TensorSpec, element_count
from .fusion import Fused, Segment

# a product is folded into a reader whose loop space is at most this many times its own
# (so each element is recomputed a few times at most)
RECOMPUTED = 4
# a step's call and set-up, in units of work (loop-space elements x leaves): ~50 ns
STEP_WORK = 300


def fold_products(
    fused: Fused, max_leaves: int, regroup: bool = False, static: AbstractSet[int] = frozenset()
) -> Fused:
    """regroup: products may be regrouped (the reassociating mode, where the semiring allows
    it: plan/reassociate.py), so a product read by one product but not first may be folded
    into it too. static: the values a run need not recompute (plan/static.py): a static
    product read by a dynamic reader stays, computed when its inputs change, not every run."""
    outputs = set(fused.outputs.values())
    readers: dict[int, list[int]] = {}
    for i, seg in enumerate(fused.segments):
        for leaf in set(seg.leaves):
            readers.setdefault(leaf, []).append(i)
    segments: list[Segment | None] = list(fused.segments)
    gone: set[int] = set()
    specs, kinds = dict(fused.specs), dict(fused.kinds)
    before: dict[int, list[Segment]] = {}  # segments made here, to run before segment j
    next_id = max(list(fused.specs) + [seg.out for seg in fused.segments], default=-1) + 1
    for i in range(len(segments)):
        product = segments[i]  # (as folded into so far: products of products fold in turn)
        if product is None or product.red_axes or product.reduce or product.normalize:
            continue
        if product.total is not None:
            continue
        if product.out in outputs or len(readers.get(product.out, [])) != 1:
            continue
        (j,) = readers[product.out]
        reader = segments[j]
        if reader is None or reader.leaves.count(product.out) != 1:
            continue
        if product.out in static and reader.out not in static:
            continue
        rest = tuple(leaf for leaf in reader.leaves if leaf != product.out)
        if len(product.leaves) + len(rest) > max_leaves:
            continue
        if reader.leaves == (product.out,):
            if prod(ax.size for ax in reader.red_axes) < 2:
                continue  # (a copy)
        elif reader.red_axes:
            continue  # a product summed with other leaves: plan/reassociate.py's choice
        elif reader.leaves[0] != product.out and not regroup:
            continue  # (exact: only (p0 ⊗ p1) ⊗ r... is the order written)
        space = prod(ax.size for ax in tuple(reader.out_spec.axes) + tuple(reader.red_axes))
        if space > RECOMPUTED * element_count(fused.specs[product.out]):
            continue  # a small product the reader broadcasts: hoisted (plan/hoist.py), keep it
        leaves = product.leaves + rest
        folded = replace(reader, leaves=leaves, nodes=product.nodes + reader.nodes)
        segments[j], segments[i] = folded, None
        gone.add(product.out)
        for leaf in set(product.leaves):  # its leaves are read by the reader now
            readers[leaf] = sorted({j if k == i else k for k in readers[leaf]})
        split = sum_inside(folded, specs, next_id) if regroup and reader.leaves == (product.out,) else None
        if split is not None:  # (the inner sum runs just before the reader, which reads it)
            inner, segments[j] = split
            before.setdefault(j, []).append(inner)
            specs[inner.out], kinds[inner.out], readers[inner.out] = inner.out_spec, "computed", [j]
            next_id += 1
    if not gone:
        return fused
    specs = {v: s for v, s in specs.items() if v not in gone}
    kinds = {v: k for v, k in kinds.items() if v not in gone}
    ordered = [s for j, seg in enumerate(segments) for s in before.get(j, []) + ([seg] if seg else [])]
    return replace(fused, segments=ordered, specs=specs, kinds=kinds)


def sum_inside(seg: Segment, specs: dict, value: int) -> tuple[Segment, Segment] | None:
    """A sum of a product, Σ_r l_0 ⊗ ... ⊗ l_k, whose leaves without any of the summed
    axes r are constant across its sum, as (inner, outer): inner = Σ_r of the leaves that
    have some (a new value, `value`), outer = the product of the others and inner, over
    the same output (⊗ distributes over ⊕: rounding only, the reassociating mode). None
    when that costs as much work as the sum (counted as plan/reassociate.py counts it)."""
    summed = {ax.key for ax in seg.red_axes if ax.size > 1}
    keys = [{ax.key for ax in specs[leaf].axes if ax.size > 1} for leaf in seg.leaves]
    inside = tuple(leaf for leaf, k in zip(seg.leaves, keys) if k & summed)
    outside = tuple(leaf for leaf, k in zip(seg.leaves, keys) if not k & summed)
    if not inside or not outside:
        return None
    kept = set().union(*(k for leaf, k in zip(seg.leaves, keys) if leaf in inside)) - summed
    spec = TensorSpec(tuple(ax for ax in seg.out_spec.axes if ax.key in kept))
    n_out, n_sum = element_count(seg.out_spec), prod(ax.size for ax in seg.red_axes)
    n_inner = element_count(spec)
    folded = n_out * n_sum * len(seg.leaves) + n_out
    split = n_inner * n_sum * len(inside) + n_inner + n_out * (len(outside) + 1) + n_out
    if split + STEP_WORK >= folded:
        return None
    inner = Segment(value, spec, seg.red_axes, inside, True, False, seg.nodes)
    outer = replace(seg, red_axes=(), leaves=outside + (value,), reduce=False)
    return inner, outer
