"""Layouts: the axis order in which each materialized value is stored.

Slot results, inputs and constants are stored in their spec's order (users see them).
A computed workspace value is ours to lay out: when a reducing segment reads it, store it
with that segment's kept axes outermost (in the segment's output order), then its reduced
axes in the order the segment adds them (Segment.red_axes, plan/schedule.py), so that for
each output element the reduction walks one contiguous stretch of memory, in order. Among several such
readers the one with the most work wins (work per batch row, in batched programs: so the
same reader wins as in the unbatched program, and each row's sums run in the same order).
A batch axis (ir/batch.py) stays innermost, as in every batched spec, so each row is laid
out as the unbatched value is. The layout changes addresses only.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ir.schema import TensorSpec, element_count
from .fusion import Fused, Segment

# A pairwise reduction that cannot be a GEMM step reads its leaves where they lie. For a
# leaf beyond the last-level cache (2^22 float64 elements, 32 MiB) it states its order:
# grid5_d3's reassociating plan sums 115 MB products to 531441 outputs of 27 terms each,
# which read them gathered along the vector in their producer's order (10-19 ms each; a
# run 201 -> 185 ms). A smaller leaf stays in the order its producer walks: stated for
# every leaf, UAI 2014's Alchemy_11 (leaves of up to 16 MB) solved in 10.6-10.7 ms
# against 9.4-9.7
LARGE_VALUE = 1 << 22


def choose_layouts(
    fused: Fused, batch_key: tuple | None = None, gemm_reader: Callable[[Segment], bool] | None = None
) -> dict[int, TensorSpec]:
    """gemm_reader: which reductions may run as GEMM steps (plan/gemm.may_run_as_gemm),
    which copy an operand into whatever order they need: they state no preference (nor do
    the other pairwise reductions, for leaves under LARGE_VALUE), and a value no reduction
    prefers an order for is stored as its producer reads its largest leaf of the same axes
    (a product then walks both in memory order)."""
    outputs = set(fused.outputs.values())
    best: dict[int, tuple] = {}  # value -> (work, segment index)
    for i, seg in enumerate(fused.segments):
        if not seg.red_axes or (gemm_reader is not None and gemm_reader(seg)):
            continue
        pairwise = gemm_reader is not None and len(seg.leaves) == 2
        work = 1
        for ax in tuple(seg.out_spec.axes) + tuple(seg.red_axes):
            work *= ax.size if ax.key != batch_key else 1
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
    if gemm_reader is not None:  # (segments in order: a leaf's layout is settled before its reader's)
        for seg in fused.segments:
            v = seg.out
            if v in best or v in outputs or seg.red_axes or fused.kinds.get(v) != "computed":
                continue
            same = [leaf for leaf in seg.leaves if set(fused.specs[leaf].keys) == set(fused.specs[v].keys)]
            if same:
                big = max(same, key=lambda leaf: element_count(fused.specs[leaf]))
                store(v, list(layouts[big].keys))
    return layouts
