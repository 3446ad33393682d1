"""Permuted twins: a segment that computes what an earlier one did, in another axis order.

Two segments with the same leaves in the same ⊗ order, the same reduced axes in the same
order and the same output axes compute the same value for every output element: the same
terms, multiplied in the same order and added in the same order (a sum's order is its
reduced axes' order, whatever the loop nest or the layouts: plan/schedule.py). Only the
order their outputs are stored in may differ. The reassociating mode's contraction paths
make such twins wherever two messages of one clique end in the same pairwise product
(grid5_d3: five pairs of 14.3 M-term reductions), and a program may write one itself.

The later twin is not computed again: its readers read the earlier one's output instead
(a leaf is aligned to its segment's loop space by axis key, in any layout), and where its
output is a slot result, which users see in its spec's order, it becomes a copy of the
earlier output. Twins of twins follow, as a twin's readers read the earlier value first.
The bits are the same in the exact mode; in the reassociating mode a twin's sum that ran
as a GEMM step, whose rounding may depend on its operands' layouts, now has the earlier
twin's, which is within the same documented tolerance. A NORMALIZE divides by a total
summed in its output's memory order, so normalizing segments are left alone.

Only sums are shared: a product's twin costs what a copy would, and the exact mode's
twins are small hoisted prefixes (plan/hoist.py), each laid out for the product that reads
it; read in another's layout instead, grid4x8_d2 ran 233 -> 250 us and grid6_d2 1.79 ->
1.90 ms.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from .fusion import Fused, Segment


def share_permuted(fused: Fused) -> Fused:
    outputs = set(fused.outputs.values())
    first: dict[tuple, int] = {}  # what a segment computes -> its index in `kept`
    same: dict[int, int] = {}  # a dropped twin's output -> the earlier twin's
    kept: list[Segment] = []
    changed = False
    for seg in fused.segments:
        leaves = tuple(same.get(leaf, leaf) for leaf in seg.leaves)
        if leaves != seg.leaves:
            seg = replace(seg, leaves=leaves)
        if seg.normalize or seg.total is not None or prod(ax.size for ax in seg.red_axes) < 2:
            kept.append(seg)
            continue
        what = (leaves, tuple(seg.red_axes), frozenset(seg.out_spec.axes))
        at = first.get(what)
        if at is None:
            first[what] = len(kept)
            kept.append(seg)
            continue
        changed = True
        twin = kept[at]
        if seg.out in outputs:  # a copy in the slot's order
            kept.append(Segment(seg.out, seg.out_spec, (), (twin.out,), False, False, seg.nodes))
        else:
            same[seg.out] = twin.out
            kept[at] = replace(twin, nodes=twin.nodes + seg.nodes)  # (listings name both)
    if not changed:
        return fused
    specs = {v: s for v, s in fused.specs.items() if v not in same}
    kinds = {v: k for v, k in fused.kinds.items() if v not in same}
    return replace(fused, segments=kept, specs=specs, kinds=kinds)
