"""Long chains early: a sum that one thread adds in order moved to right after its inputs.

A reduction into fewer outputs than a kernel sums side by side (abi.LANES) is a chain of
dependent additions that no thread can share: the chunks of a step are ranges of its
outputs, and exact mode adds each output's terms in order. Where it has millions of terms
it is the longest thing in a run (the 12 x 12 3-state grid's final marginal: the total of
a 129 M-element belief, 230 ms on one core, while its other steps take two). In program
order it comes last, when nothing is left to run beside it. Moved to right after the
segments whose values it reads, the tracks (plan/tracks.py, which price it as the chain it
is) run it on one thread while the other walks the rest of the schedule.

Every segment still computes its value from the same inputs with the same kernel: the
same bits. Only the order of the schedule changes, and with it which values the memory
plan lets share an arena (the moved sum's leaf dies sooner).
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from .. import abi
from .fusion import Fused, Segment


def chain_terms(seg: Segment) -> int:
    """The terms of a reduction into fewer than abi.LANES outputs (0 for any other
    segment): how long its one thread's chain of additions is, outputs times terms."""
    outputs = prod(ax.size for ax in seg.out_spec.axes)
    if not seg.red_axes or outputs >= abi.LANES:
        return 0
    return outputs * prod(ax.size for ax in seg.red_axes)


def start_early(fused: Fused, min_terms: int | None) -> Fused:
    """Each segment of chain_terms >= min_terms (None: none) moved to right after the last
    segment that writes one of its leaves (the schedule stays in dependency order: every
    other segment keeps its place relative to the rest)."""
    if min_terms is None:
        return fused
    segments = list(fused.segments)
    for seg in [s for s in fused.segments if chain_terms(s) >= min_terms]:
        at = segments.index(seg)
        writer = {v: i for i, s in enumerate(segments[:at]) for v in s.writes}
        first = 1 + max((writer.get(leaf, -1) for leaf in seg.leaves), default=-1)
        segments.insert(first, segments.pop(at))
    return replace(fused, segments=segments)
