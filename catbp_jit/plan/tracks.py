"""Tracks: a CPU schedule's dynamic segments split into sequences that threads walk side by side.

Belief propagation on a grid computes many messages that do not depend on each other, in
steps mostly too small to pay for sharing one step's chunks between threads (grid4x8_d2:
355 segments, most of them 0.1-5 us). Two threads can instead each walk a track: a
subsequence of the schedule, in schedule order, whose segments wait only for the
segments of other tracks they depend on.

  simulate        assigns each dynamic segment a track by list scheduling on estimated
                  costs (work, and a price for reading what another track wrote: those
                  lines move between cores), data dependencies only, and says when each
                  would start and finish (plan_memory then lets values share memory only
                  where these times keep them apart, so that reused memory rarely orders
                  the tracks: arena.track_fit)
  track_waits     every segment's waits, from the arena as planned: for each other track,
                  how many of its segments must be done first, the last one that writes
                  memory this segment reads or writes, or reads memory it writes. These,
                  not the estimates, keep a run correct: any interleaving that honours
                  them computes every value from the same inputs, with the same kernels,
                  so the same bits
  tracks_section  the tracks' part of the schedule's table (abi.py), walked by the
                  dispatcher (codegen/dispatch.py)

Tracks are used where the estimate gains (TRACKS_GAIN) and no step is a GEMM (BLAS calls
from two tracks at once are not taken on here). Static segments (plan/static.py) run
first, in turn, when they run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from math import prod

import numpy as np

from .. import abi
from ..ir.schema import element_count
from ..semiring import semiring
from .arena import MemoryPlan, SideBySide
from .fusion import Fused
from .loops import ACROSS_BOTH, ACROSS_OUTPUTS, ACROSS_REDUCED
from .options import PlanOptions
from .schedule import Schedule, SegmentLoops
from .steps import Step

# Estimated cost of a segment, in ns, by its kernel's kind: a call, and its work (output
# elements x reduced elements x leaves; a repacked leaf's copies weigh
# REPACK_NS_PER_ELEMENT each). Fitted (relative least squares) to grid4x8_d2's steps each
# walked alone by the dispatcher (perf/roofline.py), both modes: products 80-96 ns + 0.19-0.21
# a unit, sums across outputs 131-158 + 0.25-0.42, sums across reduced axes 201-225 +
# 0.27-0.32 (one price for all, 50 + 0.15, had the sums at a third of their time)
PRODUCT = "product"
CALL_NS = {PRODUCT: 85.0, ACROSS_OUTPUTS: 140.0, ACROSS_BOTH: 140.0, ACROSS_REDUCED: 210.0}
NS_PER_WORK = {PRODUCT: 0.19, ACROSS_OUTPUTS: 0.30, ACROSS_BOTH: 0.30, ACROSS_REDUCED: 0.27}
REPACK_NS_PER_ELEMENT = 0.25
# A sum into fewer outputs than abi.LANES, on one thread (plan/early.py), is a chain of
# dependent additions: the 12 x 12 3-state grid's total of 129 M terms took 230 ms (an
# addition's latency, with the terms streamed from memory). Priced so from
# PlanOptions.chain_min_terms terms (below, the work's estimate stands)
CHAIN_NS = 1.8
# A LOGPROB sum also takes an exp per term, the C library's, one at a time: 4.2 ns
# measured, 28 work units. Counted, the tracks balance LOGPROB's messages better: grid4x8
# exact 630 -> 567 us, reassociating 268 -> 257; grid6_d2 5.28 -> 5.17 ms, 1.77 -> 1.69
EXP_NS = 4.0
# Reading what another track wrote: a wait on another core's progress, and the bytes' lines
# from that core's cache (on the 2-core machine of the notes, a few GB/s). Lower prices
# spread chains across the tracks: grid4x8_d2 ran 280-305 us at 0.1 ns/byte, 242-248 at
# 0.33; without CROSS_NS chain200_d2's 1197 segments of ~0.1 us took 248 us in tracks
# against 131 us in turn. Priced anew with the costs by kind (below): a run's kernels take
# longer in tracks than the plan's time in turn splits (grid4x8_d2 reassociating: 128-131 us
# walked by one thread, 86-91 on two with every wait between tracks dropped, a test run
# of wrong results; two processes running it in turn side by side lose 3%), most of it
# lines crossing cores. 800 ns and 1 ns/byte against 400 and 0.33, alternating processes:
# grid4x8_d2 PROB reassociating 94.3-96.9 -> 88.9-91.1 us, exact 209-212 -> 204-209,
# LOGPROB reassociating 177-179 -> 171; grid6_d2 within its noise (+0-2% exact)
CROSS_NS = 800.0
CROSS_NS_PER_BYTE = 1.0
# List scheduling is greedy: a segment takes the track where it starts first, and where
# crossing looks cheap that spreads chains over both tracks and moves their values between
# cores. So tracks are also chosen with crossings priced these times higher, and each
# choice timed at the price above; the shortest makespan is kept. Measured with the costs
# by kind (alternating processes, medians): grid4x8_d2 PROB 95.7-101.7 -> 93.7-94.2 us
# reassociating, 219-224 -> 205-212 exact (by kind alone: 91.4-95.9 and 216-224, its exact
# tracks crossing twice the bytes); grid6_d2 the same; grid4x8_d2 LOGPROB reassociating
# 172-178 -> 167-169 us
CROSS_PRICES = (1.0, 1.5, 2.0, 3.0)
# Memory that segments of other tracks used is taken again only once they finished, by the
# estimate, this share of the makespan before: the first of these whose memory plan is
# affordable (below). grid6_d2 ran 1.88 ms at 0.25 (arena 13.3 MiB), 1.99 ms at 0.1 (11.6
# MiB), 2.04 ms at 0.02 (10.6 MiB), 2.53-2.66 ms in turn (9.3 MiB); grid5_d3 197 ms at 0.25
# (647 MB, not affordable) and at 0.1 (573 MB), 207 ms in turn (499 MB)
REUSE_SLACKS = (0.25, 0.1)
# Tracks are used when their estimated makespan, plus what starting the second thread
# costs a run, is below this share of the segments' time in turn ...
TRACKS_GAIN = 0.8
# (in the estimate's ns, which run above a run's in turn on small programs: their steps
# are walked with warm caches. Measured, grids of perf/grid_family.py, PROB, exact /
# reassociating, estimated makespan and time in turn, then a run in turn and in tracks:
#   5x5 of 2 states:  11.1 / 20.1 us est.,  9.4 /  14.2 us;  10.3 / 16.1,  9.7 / 16.9
#   6x6 of 2 states:  17.8 / 31.3,         16.5 /  22.3;    14.7 / 25.2, 16.6 / 24.9
#   7x7 of 2 states:  28.1 / 46.2,         30.9 /  34.3;    26.2 / 37.9, 30.0 / 33.2
#   8x8 of 2 states:  43.9 / 72.7,         55.6 /  53.5;    39.9 / 59.6, 51.5 / 55.8
#   6x6 of 3 states:  46.2 / 70.0,         90.0 /  70.7;    40.6 / 60.1, 78.1 / 74.3
#   10x10 of 2 states: 123 / 205,           215 /   181;     125 /  180,  186 /  162
# 8 us keeps 6x6 of 3 states in tracks and puts 7x7 of 2 states (exact) there too; the
# others as they ran best. grid4x8_d2 is ~80 / 150 us est., ~150 / ~95 us; a 6-variable
# chain in LOGPROB: 0.7 against 1.0 est. under the last model, 2.8 and 5.7 us)
TRACKS_START_NS = 8000.0
# ... and their memory plan grows the arenas by at most this share, or these bytes
MEMORY_GROWTH = 0.25
MEMORY_GROWTH_BYTES = 64 << 20


@dataclass(frozen=True)
class TrackTimes:
    """A track for every segment (static ones: 0) and its estimated start and finish, in
    ns from the start of a run; makespan: when the last finishes; serial: the dynamic
    segments' time walked in turn."""

    tracks: int
    track: tuple[int, ...]
    start: tuple[float, ...]
    finish: tuple[float, ...]
    makespan: float
    serial: float

    def gains(self) -> bool:
        return self.makespan + TRACKS_START_NS < TRACKS_GAIN * self.serial

    def side_by_side(self, n_static: int, slack: float, pools: bool) -> SideBySide:
        """What the memory plan needs to know (arena.SideBySide), with a slack of this share
        of the makespan (REUSE_SLACKS), and a pool of memory per track or not (memory_plans)."""
        track = [-1] * n_static + list(self.track[n_static:])
        return SideBySide(track, self.start, self.finish, slack * self.makespan, pools)


def segment_cost(loops: SegmentLoops, exp_sums: bool = False, chain_min_terms: int | None = None) -> float:
    """A loop segment's estimated time in ns (its repack step's included). exp_sums: the
    semiring's sums take an exp per term (LOGPROB); chain_min_terms: a sum into fewer
    outputs than abi.LANES of at least this many terms, on one thread, takes CHAIN_NS a
    term (its outputs' chains side by side where it sums in lanes)."""
    kind = loops.nest.across if loops.pattern.reduce else PRODUCT
    cost = CALL_NS[kind] + NS_PER_WORK[kind] * loops.work + REPACK_NS_PER_ELEMENT * loops.workspace
    terms = prod(loops.nest.sizes)
    if exp_sums and loops.pattern.reduce:
        cost += EXP_NS * terms
    if chain_min_terms is not None and terms >= chain_min_terms and loops.pattern.reduce:
        outputs = prod(loops.nest.sizes[: loops.nest.out_rank])
        one_thread = loops.chunks == 1 and loops.nest.across == ACROSS_REDUCED
        if one_thread and outputs < abi.LANES:
            side = outputs if loops.pattern.sums_in_lanes else 1
            if loops.pattern.terms_in_lanes:  # (and each output's terms in LANES chains)
                side *= abi.SUM_LANES
            cost = max(cost, CHAIN_NS * terms / max(1, side))
    return cost


def choose_tracks(
    fused: Fused, loops: dict[int, SegmentLoops], n_static: int, options: PlanOptions, itemsize: int
) -> TrackTimes | None:
    """The tracks' estimate if the schedule is to run in tracks, else None: one track asked,
    a GEMM step, or no gain estimated (and tracks not asked for always)."""
    n = len(fused.segments)
    if options.tracks < 2 or n - n_static < 2 or len(loops) < n:
        return None
    exp_sums = semiring(fused.semiring).is_log  # (⊕ takes an exp per term)
    costs = [segment_cost(loops[i], exp_sums, options.chain_min_terms) for i in range(n)]
    times = shortest(fused, costs, n_static, options.tracks, itemsize)
    return times if times.gains() or options.tracks_always else None


def shortest(fused: Fused, costs: list[float], n_static: int, tracks: int, itemsize: int) -> TrackTimes:
    """Of the tracks list scheduling chooses with crossings priced at each of CROSS_PRICES
    times CROSS_NS (and CROSS_NS_PER_BYTE), each timed at 1 time that price, those of the
    shortest makespan."""
    choices = {simulate(fused, costs, n_static, tracks, itemsize, price).track for price in CROSS_PRICES}
    timed = [simulate(fused, costs, n_static, tracks, itemsize, given=track) for track in choices]
    return min(timed, key=lambda t: (t.makespan, t.track))


def memory_plans(options: PlanOptions) -> list[tuple[bool, float]]:
    """The tracks' memory plans to try, in turn, until one is affordable: (a pool of memory
    per track, the slack). A pool per track first (PlanOptions.track_pools): memory that
    another core wrote last comes to the writer's core line by line, and the kernels of
    grid4x8_d2's tracks ran slower than the same kernels in turn (docs/architecture.md
    §8)."""
    pooled = [(True, REUSE_SLACKS[0])] if options.track_pools else []
    return pooled + [(False, slack) for slack in REUSE_SLACKS]


def affordable(tracked: MemoryPlan, plain: MemoryPlan) -> bool:
    """Whether the tracks' memory plan is worth its extra bytes (MEMORY_GROWTH)."""
    grown = tracked.total_bytes - plain.total_bytes
    return grown <= max(MEMORY_GROWTH * plain.total_bytes, MEMORY_GROWTH_BYTES)


def with_tracks(
    schedule: Schedule, fused: Fused, memory: MemoryPlan, times: TrackTimes, n_static: int
) -> Schedule:
    """The schedule with its tracks section at the end of its table."""
    at = len(schedule.table)
    section = tracks_section(schedule.steps, fused, memory, times.track, n_static, times.tracks, at)
    table = np.concatenate([schedule.table, np.array(section, dtype=np.int64)])
    return replace(schedule, table=table, tracks=at)


def producers(fused: Fused) -> dict[int, int]:
    """Value -> the index of the segment that writes it."""
    return {v: i for i, seg in enumerate(fused.segments) for v in seg.writes}


def simulate(
    fused: Fused,
    costs: list[float],
    n_static: int,
    tracks: int,
    itemsize: int,
    price: float = 1.0,
    given: tuple[int, ...] | None = None,
) -> TrackTimes:
    """Tracks by list scheduling in schedule order: each dynamic segment goes where it would
    start first, after the segments whose values it reads (and a price for those another
    track wrote, times `price`). costs: each segment's estimate (ns). given: the tracks
    already chosen, to be timed. (A step cut in chunks counts whole: it shares them with the
    other tracks only when they have nothing ready, a joint step, codegen/dispatch.py.)"""
    n = len(fused.segments)
    writer = producers(fused)
    track = [0] * n
    start = [0.0] * n
    finish = [0.0] * n
    clock = 0.0
    for i in range(n_static):  # (in turn, before every dynamic segment)
        start[i], clock = clock, clock + costs[i]
        finish[i] = clock
    free = [clock] * tracks
    for j in range(n_static, n):
        seg = fused.segments[j]
        dynamic = [v for v in seg.leaves if writer.get(v, -1) >= n_static]
        reads = [(writer[v], element_count(fused.specs[v]) * itemsize) for v in dynamic]
        best = (float("inf"), 0)
        for k in range(tracks) if given is None else (given[j],):
            begin = free[k]
            for i, size in reads:
                crossing = price * (CROSS_NS + size * CROSS_NS_PER_BYTE) if track[i] != k else 0.0
                begin = max(begin, finish[i] + crossing)
            best = min(best, (begin, k))
        start[j], track[j] = best
        finish[j] = start[j] + costs[j]
        free[track[j]] = finish[j]
    serial = sum(costs[n_static:])
    makespan = max(free) - clock
    return TrackTimes(tracks, tuple(track), tuple(start), tuple(finish), makespan, serial)


def segment_ranges(
    fused: Fused, memory: MemoryPlan, i: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The arena ranges (first element, end) segment i reads and writes: its leaves; its
    outputs and its workspace (a GEMM's or repacked leaves' copies)."""
    seg = fused.segments[i]
    regions = memory.regions
    reads = [(regions[v].offset, regions[v].offset + regions[v].size) for v in seg.leaves]
    writes = [(regions[v].offset, regions[v].offset + regions[v].size) for v in seg.writes]
    if i in memory.scratch:
        r = memory.scratch[i]
        writes.append((r.offset, r.offset + r.size))
    return reads, writes


def track_waits(
    fused: Fused, memory: MemoryPlan, track: tuple[int, ...], n_static: int, tracks: int
) -> list[tuple[int, ...]]:
    """For each dynamic segment (from n_static), how many segments of each track must be
    done before it runs: the last one before it in schedule order that writes memory it
    reads or writes, or reads memory it writes (0 for its own track, walked in order)."""
    n = len(fused.segments)
    ranges = {i: segment_ranges(fused, memory, i) for i in range(n_static, n)}
    # distinct ranges, and which of them overlap (memory reused by values of disjoint lives)
    distinct = sorted({r for reads, writes in ranges.values() for r in reads + writes})
    overlaps: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    open_: list[tuple[int, int]] = []
    for r in distinct:  # sorted by start: a sweep
        open_ = [o for o in open_ if o[1] > r[0]]
        for o in open_:
            overlaps[r].append(o)
            overlaps[o].append(r)
        overlaps[r].append(r)
        open_.append(r)
    # per range and track: position + 1 of the last segment that wrote it, that read it
    last_write: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0] * tracks)
    last_read: dict[tuple[int, int], list[int]] = defaultdict(lambda: [0] * tracks)
    done = [0] * tracks  # segments of each track so far
    waits = []
    for i in range(n_static, n):
        reads, writes = ranges[i]
        wait = [0] * tracks
        for r in reads:
            for o in overlaps[r]:
                wait = [max(a, b) for a, b in zip(wait, last_write[o])]
        for r in writes:
            for o in overlaps[r]:
                wait = [max(a, b, c) for a, b, c in zip(wait, last_write[o], last_read[o])]
        k = track[i]
        wait[k] = 0
        waits.append(tuple(wait))
        done[k] += 1
        for r in reads:
            last_read[r][k] = done[k]
        for r in writes:
            last_write[r][k] = done[k]
    return waits


def tracks_section(
    steps: list[Step],
    fused: Fused,
    memory: MemoryPlan,
    track: tuple[int, ...],
    n_static: int,
    tracks: int,
    at: int,
) -> list[int]:
    """The table's tracks section, placed at offset `at` (abi.py: header, each track's
    tasks, then the tracks' state words): a task is a dynamic segment's steps (its repack
    step, then its own) and its waits."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    index = {id(seg): i for i, seg in enumerate(fused.segments)}
    for s, st in enumerate(steps):
        i = index[id(st.segment)]
        first.setdefault(i, s)
        last[i] = s + 1
    waits = track_waits(fused, memory, track, n_static, tracks)
    tasks: list[list[int]] = [[] for _ in range(tracks)]
    for i, wait in zip(range(n_static, len(fused.segments)), waits):
        tasks[track[i]] += [first[i], last[i], *wait]
    row = abi.task_row(tracks)
    header = abi.TRACKS_HEADER + abi.TRACK_FIELDS * tracks
    state = at + header + sum(len(t) for t in tasks)
    state += -state % abi.TRACK_STRIDE  # (each track's word on a line of its own)
    section = [tracks, state]
    cursor = at + header
    for t in tasks:
        section += [cursor, len(t) // row]
        cursor += len(t)
    for t in tasks:
        section += t
    section += [0] * (state - at - len(section) + abi.TRACK_STRIDE * tracks * (1 + abi.JOINT_LINES))
    return section


def read_tracks(table: np.ndarray, at: int) -> list[list[tuple[int, int, tuple[int, ...]]]]:
    """A table's tracks section as written: per track, its tasks (first step, last step,
    waits per track)."""
    n = int(table[at + abi.TRACKS_COUNT])
    row = abi.task_row(n)
    out = []
    for k in range(n):
        head = at + abi.TRACKS_HEADER + abi.TRACK_FIELDS * k
        start, count = int(table[head + abi.TRACK_TASKS]), int(table[head + abi.TRACK_COUNT])
        rows = table[start : start + row * count].reshape(count, row)
        out.append(
            [
                (int(r[abi.TASK_FIRST]), int(r[abi.TASK_LAST]), tuple(int(x) for x in r[abi.TASK_WAITS :]))
                for r in rows
            ]
        )
    return out
