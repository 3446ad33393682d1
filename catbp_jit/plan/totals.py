"""Totals (reassociating mode): a NORMALIZE that also writes the total it divides by.

The front end keeps every tensor near 1 (frontend/scaling.py) by emitting, per tensor v,

    s = ELIMINATE(v, ())      (its total, stored as a scale)
    NORMALIZE(v)              (v / its total)

Fused as written, that is three passes over v after the segment that computes it: the
total (a reduction), then a copy of v normalized (v has two readers, so the NORMALIZE
cannot work on it in place), whose kernel sums v again before dividing. Here the segment
computing v takes the NORMALIZE in, and its normalize pass writes the total it found as s:
one pass of the product, one sum, one division, and v is never stored unnormalized.

The total is a sum in another order than the separate reduction's (the normalize pass walks
the output in its memory order), so this is done only when sums may be regrouped
(PlanOptions.exact=False). With a batch axis (ir/batch.py) each row is normalized alone and
s keeps the batch axis: row g's total goes to s[g].
"""

from __future__ import annotations

from dataclasses import replace

from ..semiring import semiring
from .fusion import Fused, Segment


def normalize_totals(fused: Fused, batch_key: tuple | None = None) -> Fused:
    if not semiring(fused.semiring).normalizes:
        return fused
    readers: dict[int, list[int]] = {}
    writer: dict[int, int] = {}
    for i, seg in enumerate(fused.segments):
        writer[seg.out] = i
        for leaf in set(seg.leaves):
            readers.setdefault(leaf, []).append(i)
    outputs = set(fused.outputs.values())
    segments: list[Segment | None] = list(fused.segments)
    gone: set[int] = set()
    for i, norm in enumerate(fused.segments):
        if not (norm.normalize and not norm.reduce and len(norm.leaves) == 1):
            continue
        v = norm.leaves[0]
        at = writer.get(v)
        if at is None or v in outputs or fused.specs[v] != norm.out_spec:
            continue
        made = fused.segments[at]
        others = [j for j in readers[v] if j != i]
        if made.normalize or made.total is not None or len(others) != 1:
            continue
        total = fused.segments[others[0]]
        if not _is_total_of(total, v, fused, batch_key) or others[0] > i:
            continue
        segments[at] = Segment(
            norm.out,
            norm.out_spec,
            made.red_axes,
            made.leaves,
            made.reduce,
            True,
            made.nodes + total.nodes + norm.nodes,
            total=total.out,
        )
        segments[i] = segments[others[0]] = None
        gone.add(v)
    if not gone:
        return fused
    specs = {k: s for k, s in fused.specs.items() if k not in gone}
    kinds = {k: s for k, s in fused.kinds.items() if k not in gone}
    return replace(fused, segments=[s for s in segments if s is not None], specs=specs, kinds=kinds)


def _is_total_of(seg: Segment, v: int, fused: Fused, batch_key: tuple | None) -> bool:
    """Whether `seg` sums v over every axis but the batch axis, and nothing else."""
    if not seg.reduce or seg.normalize or seg.leaves != (v,) or seg.total is not None:
        return False
    kept = [ax.key for ax in seg.out_spec.axes if ax.size > 1]
    batch = [ax.key for ax in fused.specs[v].axes if ax.key == batch_key and ax.size > 1]
    return kept == batch and len(seg.out_spec.axes) == len(kept)
