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

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

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


def first_fit(intervals: list[Interval], sizes: dict[int, int], step: int) -> tuple[dict[int, int], int]:
    """Linear scan by start; each value takes the lowest aligned gap among live values."""
    placed: dict[int, int] = {}
    active: list[tuple[int, int, int]] = []  # (offset, size, end)
    high = 0
    for iv in sorted(intervals, key=lambda iv: (iv.start, iv.value)):
        active = [a for a in active if a[2] >= iv.start]  # closed intervals
        need = _round_up(sizes[iv.value], step)
        offset = 0
        for a_off, a_size, _ in sorted(active):
            if a_off - offset >= need:
                break
            offset = max(offset, _round_up(a_off + a_size, step))
        placed[iv.value] = offset
        active.append((offset, need, iv.end))
        high = max(high, offset + need)
    return placed, high


def plan_memory(
    fused: Fused,
    itemsize: int,
    align_bytes: int = ALIGN_BYTES,
    persistent: AbstractSet[int] = frozenset(),
    scratch: Mapping[int, int] | None = None,
) -> MemoryPlan:
    """persistent: values that keep their own region across runs (plan/static.py).
    scratch: segment index -> elements it needs while it runs (live at that index only)."""
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
    work, used["workspace"] = first_fit(live, sizes, step)
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
