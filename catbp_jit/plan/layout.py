"""Layouts: the axis order in which each materialized value is stored.

Slot results, inputs and constants are stored in their spec's order (users see them).
A computed workspace value is ours to lay out: when a reducing segment reads it, store it
with that segment's kept axes outermost (in the segment's output order), so that for each
output element the reduction walks one contiguous stretch of memory. Among several such
readers the one with the most work wins (work per batch row, in batched programs: so the
same reader wins as in the unbatched program, and each row's sums run in the same order).
A batch axis (ir/batch.py) stays innermost, as in every batched spec, so each row is laid
out as the unbatched value is. The layout changes addresses only.
"""

from __future__ import annotations

from ..ir.schema import TensorSpec
from .fusion import Fused


def choose_layouts(fused: Fused, batch_key: tuple | None = None) -> dict[int, TensorSpec]:
    outputs = set(fused.outputs.values())
    best: dict[int, tuple] = {}  # value -> (work, segment index)
    for i, seg in enumerate(fused.segments):
        if not seg.red_axes:
            continue
        work = 1
        for ax in tuple(seg.out_spec.axes) + tuple(seg.red_axes):
            work *= ax.size if ax.key != batch_key else 1
        for leaf in seg.leaves:
            if fused.kinds[leaf] == "computed" and leaf not in outputs:
                if leaf not in best or work > best[leaf][0]:
                    best[leaf] = (work, i)
    layouts = {v: spec for v, spec in fused.specs.items()}
    for v, (_, i) in best.items():
        spec = fused.specs[v]
        kept = [k for k in fused.segments[i].out_spec.keys if spec.has_key(k) and k != batch_key]
        rest = [k for k in spec.keys if k not in kept and k != batch_key]
        last = [batch_key] if batch_key is not None and spec.has_key(batch_key) else []
        layouts[v] = TensorSpec(tuple(spec.get_axis(k) for k in kept + rest + last))
    return layouts
