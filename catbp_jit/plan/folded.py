"""Folded sums: a product whose one reader sums it alone is computed inside that sum.

fuse() computes a CONTRACT inside the ELIMINATE that reads it, so in the graph as written
a product read by one sum is never written. Later passes make new such pairs: the
reassociating mode's contraction paths end a clique's product where its readers' sums of
its private axes begin (plan/reassociate.py), and once twin sums are computed once
(plan/permuted.py) the product may have one reader left. Written out, it costs a pass
over memory and a read back (grid5_d3: 38 MB products, each summed by one step).

Folding multiplies the product's leaves, in their order, inside the sum's loop, and the
sum adds its terms in its reduced axes' order as before: each term is the same product,
each sum the same sum, so the bits are the same in both modes.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from .fusion import Fused, Segment


def fold_sums(fused: Fused, max_leaves: int) -> Fused:
    outputs = set(fused.outputs.values())
    readers: dict[int, list[int]] = {}
    for i, seg in enumerate(fused.segments):
        for leaf in set(seg.leaves):
            readers.setdefault(leaf, []).append(i)
    segments: list[Segment | None] = list(fused.segments)
    gone: set[int] = set()
    for i, product in enumerate(fused.segments):
        if product.red_axes or product.reduce or product.normalize or product.total is not None:
            continue
        if product.out in outputs or len(readers.get(product.out, [])) != 1:
            continue
        (j,) = readers[product.out]
        total = segments[j]
        if total is None or total.leaves != (product.out,) or prod(ax.size for ax in total.red_axes) < 2:
            continue
        if len(product.leaves) > max_leaves:
            continue
        segments[j] = replace(total, leaves=product.leaves, reduce=True, nodes=product.nodes + total.nodes)
        segments[i] = None
        gone.add(product.out)
    if not gone:
        return fused
    specs = {v: s for v, s in fused.specs.items() if v not in gone}
    kinds = {v: k for v, k in fused.kinds.items() if v not in gone}
    return replace(fused, segments=[s for s in segments if s is not None], specs=specs, kinds=kinds)
