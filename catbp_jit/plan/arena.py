"""Memory plan: every materialized value gets an aligned region of one buffer (64 bytes by
default, PlanOptions.align_bytes: 256 for CUDA).

The buffer is split into arenas by class, each starting on such a boundary:
  inputs     factors and selectors, written by `Session.run` before the schedule runs
  constants  UNIT tensors, written once at bind time
  slots      slot results (and slots handed in), which must survive the whole run
  static     values of static segments that dynamic ones read (plan/static.py): they must
             survive from the run that computed them to every later run, so nothing shares
             their memory
  workspace  every other value, placed by linear-scan first fit over live intervals, so
             values whose lifetimes do not overlap share memory; and the scratch space a
             step needs while it runs (a LOGPROB GEMM's exponentials, plan/gemm.py)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from ..ir.schema import element_count
from .fusion import Fused
from .graph import FACTOR, SELECTOR, SLOT_IN, UNIT
from .liveness import Interval, live_intervals
from .options import ALIGN_BYTES

CLASSES = ("inputs", "constants", "slots", "static", "workspace")


@dataclass(frozen=True)
class Region:
    cls: str
    offset: int  # in elements from the start of the whole buffer
    size: int  # in elements


@dataclass
class MemoryPlan:
    itemsize: int
    regions: dict[int, Region]
    class_base: dict[str, int]  # element offset of each arena
    class_size: dict[str, int]  # elements used by each arena (before padding)
    total: int  # elements in the whole buffer
    intervals: dict[int, Interval] = field(default_factory=dict)
    scratch: dict[int, Region] = field(default_factory=dict)  # segment index -> its scratch

    def class_bytes(self) -> dict[str, int]:
        return {c: n * self.itemsize for c, n in self.class_size.items()}

    @property
    def total_bytes(self) -> int:
        return self.total * self.itemsize


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def value_classes(fused: Fused, persistent: AbstractSet[int] = frozenset()) -> dict[int, str]:
    """The arena each value lives in (persistent: see plan/static.py)."""
    stored = set(fused.outputs.values())
    classes = {}
    for value in fused.specs:
        kind = fused.kinds[value]
        if kind in (FACTOR, SELECTOR):
            classes[value] = "inputs"
        elif kind == UNIT:
            classes[value] = "constants"
        elif kind == SLOT_IN or value in stored:
            classes[value] = "slots"
        elif value in persistent:
            classes[value] = "static"
        else:
            classes[value] = "workspace"
    return classes


def lowest_gap(taken: list[tuple[int, int]], need: int, step: int) -> int:
    """The lowest aligned offset where `need` elements fit among the (offset, size) regions
    taken."""
    offset = 0
    for a_off, a_size in sorted(taken):
        if a_off - offset >= need:
            break
        offset = max(offset, _round_up(a_off + a_size, step))
    return offset


def first_fit(intervals: list[Interval], sizes: dict[int, int], step: int) -> tuple[dict[int, int], int]:
    """Linear scan by start; each value takes the lowest aligned gap among live values."""
    placed: dict[int, int] = {}
    active: list[tuple[int, int, int]] = []  # (offset, size, end)
    high = 0
    for iv in sorted(intervals, key=lambda iv: (iv.start, iv.value)):
        active = [a for a in active if a[2] >= iv.start]  # closed intervals
        need = _round_up(sizes[iv.value], step)
        offset = lowest_gap([(a_off, a_size) for a_off, a_size, _ in active], need, step)
        placed[iv.value] = offset
        active.append((offset, need, iv.end))
        high = max(high, offset + need)
    return placed, high


@dataclass(frozen=True)
class SideBySide:
    """Segments that run in tracks side by side (plan/tracks.py): each one's track (-1: a
    static segment, run before them all) and estimated start and finish in ns. A value may
    take memory another had only once every segment that used it ran before, in the same
    track, or finished (by the estimate) `slack` ns before the new value's writer starts:
    reused memory orders its users, so tracks that share it wait for each other."""

    track: Sequence[int]
    start: Sequence[float]
    finish: Sequence[float]
    slack: float
    # each track's values in memory of its own (a pool per track, side by side): a line is
    # then written by one core only; memory another core wrote last comes to the writer's
    # core line by line, which made the tracks' kernels slower than the same kernels in
    # turn (grid4x8_d2, docs/architecture.md §8)
    pools: bool = False


def track_fit(
    intervals: list[Interval],
    sizes: dict[int, int],
    step: int,
    users: Mapping[int, Sequence[int]],
    side: SideBySide,
) -> tuple[dict[int, int], int]:
    """first_fit for segments run side by side: each value (by its writer's index) takes the
    lowest aligned gap among the values whose memory it may not take (SideBySide).
    users: value -> the segments that write or read it."""
    if side.pools:  # (static segments' values with the first track's: they run before all)
        pools: dict[int, list[Interval]] = {}
        for iv in intervals:
            pools.setdefault(max(0, side.track[iv.start]), []).append(iv)
        shared = replace(side, pools=False)
        pooled: dict[int, int] = {}
        base = 0
        for k in sorted(pools):
            here, high = track_fit(pools[k], sizes, step, users, shared)
            pooled.update({v: base + offset for v, offset in here.items()})
            base += _round_up(high, step)
        return pooled, base
    n = len(side.start)
    later_start = [float("inf")] * (n + 1)  # the earliest start of segments i.. (suffix minimum)
    for i in reversed(range(n)):
        later_start[i] = min(later_start[i + 1], side.start[i])
    # per value: its last user, and per track the last estimated finish of its users there
    last = {v: max(us) for v, us in users.items()}
    finish: dict[int, dict[int, float]] = {}
    for v, us in users.items():
        by_track: dict[int, float] = {}
        for u in us:
            if side.track[u] >= 0:
                by_track[side.track[u]] = max(by_track.get(side.track[u], 0.0), side.finish[u])
        finish[v] = by_track

    def free(v: int, writer: int) -> bool:
        track = side.track[writer]
        return last[v] < writer and all(
            k == track or t + side.slack <= side.start[writer] for k, t in finish[v].items()
        )

    placed: dict[int, int] = {}
    active: list[tuple[int, int, int]] = []  # (offset, size, value)
    high = 0
    for iv in sorted(intervals, key=lambda iv: (iv.start, iv.value)):
        writer = iv.start
        # (a value free for every later writer is dropped for good)
        active = [
            a
            for a in active
            if not (
                last[a[2]] < writer
                and all(t + side.slack <= later_start[writer] for t in finish[a[2]].values())
            )
        ]
        need = _round_up(sizes[iv.value], step)
        taken = [(a_off, a_size) for a_off, a_size, a_value in active if not free(a_value, writer)]
        offset = lowest_gap(taken, need, step)
        placed[iv.value] = offset
        active.append((offset, need, iv.value))
        high = max(high, offset + need)
    return placed, high


def plan_memory(
    fused: Fused,
    itemsize: int,
    align_bytes: int = ALIGN_BYTES,
    persistent: AbstractSet[int] = frozenset(),
    scratch: Mapping[int, int] | None = None,
    side: SideBySide | None = None,
) -> MemoryPlan:
    """persistent: values that keep their own region across runs (plan/static.py).
    scratch: segment index -> elements it needs while it runs (live at that index only).
    side: the segments' tracks and estimated times, when they run side by side
    (plan/tracks.py): workspace is then shared only as SideBySide allows."""
    step = max(1, align_bytes // itemsize)  # elements per alignment unit
    sizes = {v: max(1, element_count(spec)) for v, spec in fused.specs.items()}
    classes = value_classes(fused, persistent)
    by_class: dict[str, list[int]] = {c: [] for c in CLASSES}
    for v in fused.specs:
        by_class[classes[v]].append(v)

    intervals = live_intervals(fused.segments)
    local: dict[int, int] = {}
    used: dict[str, int] = {}
    for cls in ("inputs", "constants", "slots", "static"):
        cursor = 0
        for v in sorted(by_class[cls]):
            local[v] = cursor
            cursor += _round_up(sizes[v], step)
        used[cls] = cursor
    # scratch takes ids below every value's (values are >= 0), so one first fit places both
    scratch_id = {i: -1 - i for i in (scratch or {})}
    sizes.update({scratch_id[i]: max(1, n) for i, n in (scratch or {}).items()})
    live = [intervals[v] for v in by_class["workspace"]]
    live += [Interval(v, i, i) for i, v in scratch_id.items()]
    if side is None:
        work, used["workspace"] = first_fit(live, sizes, step)
    else:
        users: dict[int, list[int]] = {v: [i] for i, v in scratch_id.items()}
        for i, seg in enumerate(fused.segments):
            for v in seg.writes + seg.leaves:
                users.setdefault(v, []).append(i)
        work, used["workspace"] = track_fit(live, sizes, step, users, side)
    local.update(work)

    base: dict[str, int] = {}
    cursor = 0
    for cls in CLASSES:
        base[cls] = cursor
        cursor += _round_up(used[cls], step)
    regions = {v: Region(classes[v], base[classes[v]] + local[v], sizes[v]) for v in fused.specs}
    scratch_regions = {
        i: Region("workspace", base["workspace"] + local[v], sizes[v]) for i, v in scratch_id.items()
    }
    return MemoryPlan(itemsize, regions, base, used, max(cursor, step), intervals, scratch_regions)
