"""Live intervals of the values segments write, in schedule (segment) order."""

from __future__ import annotations

from dataclasses import dataclass

from .fusion import Segment


@dataclass(frozen=True)
class Interval:
    value: int
    start: int  # index of the segment that writes it
    end: int  # index of the last segment that reads it (== start if none does)


def live_intervals(segments: list[Segment]) -> dict[int, Interval]:
    """Intervals are closed: a segment's output never shares memory with its own leaves."""
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for i, seg in enumerate(segments):
        for v in seg.writes:
            start[v] = i
            end.setdefault(v, i)
        for leaf in seg.leaves:
            if leaf in start:
                end[leaf] = max(end[leaf], i)
    return {v: Interval(v, start[v], end[v]) for v in start}
