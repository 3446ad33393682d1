"""Narrowed values: a computed value is stored without the axes none of its leaves has.

A CONTRACT names its output's axes, and programs often name a clique's whole space for a
product of a few of its small factors: grid5_d3 multiplies four leaves of 3 to 2187
elements over fifteen axes of 3 (115 MB), so each distinct element is written 2187 times,
and summed or multiplied as many times by the steps that read it. Along an axis that no
leaf has, every element of such a value is the same: stored once, its readers read it with
a stride of 0 along that axis and see the same element, in the same place of their
products and sums, as before. So the same bits in every mode, and the value costs its
distinct elements in memory, time and cache.

Kept whole: slot results (a slot shows its whole spec), NORMALIZE segments (a group's
total counts every copy) and segments that write a total, and the batch axis (a row's
value stays the row's). Segments are visited in order, so a reader whose leaves were
narrowed is narrowed in turn when its own output then has axes none of them has.
"""

from __future__ import annotations

from dataclasses import replace

from ..ir.schema import TensorSpec
from .fusion import Fused, Segment


def narrow_values(fused: Fused, batch_key: tuple | None = None) -> Fused:
    """fused, each computed value without the axes (of size > 1) that none of its segment's
    leaves has."""
    outputs = set(fused.outputs.values())
    specs = dict(fused.specs)
    segments: list[Segment] = []
    for seg in fused.segments:
        kept = seg.out in outputs or seg.normalize or seg.total is not None
        spec = None if kept else _narrowed(seg, specs, batch_key)
        if spec is None:
            segments.append(seg)
            continue
        specs[seg.out] = spec
        segments.append(replace(seg, out_spec=spec))
    return replace(fused, segments=segments, specs=specs)


def _narrowed(seg: Segment, specs: dict[int, TensorSpec], batch_key: tuple | None) -> TensorSpec | None:
    """seg's output spec without the axes none of its leaves has, or None if it has none
    such (or no leaves: a constant keeps its spec)."""
    if not seg.leaves:
        return None
    held = {ax.key for leaf in seg.leaves for ax in specs[leaf].axes}
    kept = tuple(ax for ax in seg.out_spec.axes if ax.key in held or ax.size == 1 or ax.key == batch_key)
    return None if len(kept) == len(seg.out_spec.axes) else TensorSpec(kept)
