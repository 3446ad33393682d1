"""Hoisting: a product's first leaves, computed once over their own axes, not per element.

A segment multiplies its leaves left to right, ((l0 ⊗ l1) ⊗ l2) ⊗ ..., once per point of
its loop space. When its first leaves l0..lj together hold few of the space's axes, their
product takes few distinct values but is recomputed at every point, j + 1 loads each.
This pass makes that prefix a segment of its own, over the axes its leaves hold, and the
segment reads the product as one leaf:

    out = ⊕_r l0 ⊗ l1 ⊗ l2 ⊗ l3 ⊗ l4    becomes    p = l0 ⊗ l1 ⊗ l2 ;  out = ⊕_r p ⊗ l3 ⊗ l4

Bit-identical: p holds exactly the rounded values the kernel's buffer held after l2 (the
same ⊗ in the same order, in the arena's dtype, which is the buffer's), and the sum adds
the same terms in the same order. Like fusion's partial products (fusion.narrow), p is a
workspace value the memory planner places and frees; when every leaf of a prefix is a
static input, plan/static.py moves its segment ahead with the other static ones, so it runs
only when those inputs change.

The prefix is taken where it saves the most: a point of the space saves j loads; the
prefix costs its own points times its leaves, and a kernel launch.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.schema import Axis, TensorSpec
from .fusion import Fused, Segment

LAUNCH_POINTS = 512  # a kernel launch costs about as much as this many loads
MAX_SHARE = 16  # a prefix has at most 1/MAX_SHARE of the segment's points
# ... and fits in a core's L2 cache: written out and read back from memory, a big prefix
# costs more than the loads it saves, which are mostly of small leaves the L1 holds
# (measured on grid5_d3: prefixes of up to 3.5M elements made it 1.7x slower)
MAX_POINTS = 1 << 15


def hoist_prefixes(fused: Fused) -> Fused:
    """Every segment whose leading leaves pay to be multiplied apart, split (repeatedly:
    a prefix may have a prefix worth hoisting)."""
    segments: list[Segment] = []
    specs, kinds = dict(fused.specs), dict(fused.kinds)
    next_id = max(specs, default=-1) + 1
    for seg in fused.segments:
        pending = [seg]
        done: list[Segment] = []
        while pending:
            s = pending.pop()
            j, space = best_prefix(s, specs)
            if j is None:
                done.append(s)
                continue
            prefix = Segment(next_id, TensorSpec(space), (), s.leaves[: j + 1], False, False, s.nodes)
            specs[next_id], kinds[next_id] = prefix.out_spec, "computed"
            pending += [replace(s, leaves=(next_id,) + s.leaves[j + 1 :]), prefix]
            next_id += 1
        segments += done  # prefixes first (popped first): each before the segment reading it
    return replace(fused, segments=segments, specs=specs, kinds=kinds)


def best_prefix(seg: Segment, specs) -> tuple[int | None, tuple[Axis, ...]]:
    """(j, the prefix's axes) for the prefix l0..lj that saves the most, or (None, ())."""
    loop = tuple(seg.out_spec.axes) + tuple(seg.red_axes)
    points = _points(loop)
    best: tuple[int | None, tuple[Axis, ...]] = (None, ())
    best_gain = 0
    held: set = set()
    for j, leaf in enumerate(seg.leaves[:-1]):
        spec = specs[leaf]
        held |= {
            ax.key
            for ax in loop
            if ax.size > 1 and spec.has_key(ax.key) and spec.get_axis(ax.key).size == ax.size
        }
        if j == 0:
            continue  # one leaf alone is already one load
        space = tuple(ax for ax in loop if ax.key in held)
        size = _points(space)
        if size * MAX_SHARE > points or size > MAX_POINTS:
            break  # the union only grows
        gain = points * j - size * (j + 2) - LAUNCH_POINTS
        if gain > best_gain:
            best, best_gain = (j, space), gain
    return best


def _points(axes) -> int:
    n = 1
    for ax in axes:
        n *= ax.size
    return n
