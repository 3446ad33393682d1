"""Tracks (plan/tracks.py): a schedule's dynamic segments walked by threads side by side.

Whatever the threads and their timing, a run in tracks gives the bits of the same schedule
walked in turn: every segment computes its value with the same kernel from the same
inputs, once the segments it depends on (the arena as planned says which) are done.
Checked on grids, whose messages the estimate puts in tracks, on random programs in
tracks whatever the estimate, with one thread, with static inputs, with steps whose
chunks the tracks share, and with two sessions at once; and the table's waits against
every pair of segments that touch the same memory.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numba
import numpy as np
import pytest
from hypothesis import event, given

import catbp_jit
from catbp_jit import abi
from catbp_jit.bundle import load_bundle
from catbp_jit.executable import plan_options
from catbp_jit.ir.schema import Axis, AxisType, TensorSpec
from catbp_jit.plan import early, tracks
from catbp_jit.plan.arena import SideBySide, track_fit
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.liveness import Interval
from catbp_jit.plan.loops import ACROSS_BOTH, ACROSS_OUTPUTS, ACROSS_REDUCED
from catbp_jit.plan.options import PlanOptions
from jit_helpers import (
    assert_same_bits,
    assert_same_slots,
    compile_case,
    count_allocations,
    run_reference,
    session_results,
    settings,
)
from random_programs import cases

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "perf"))

import grid_family  # noqa: E402

ALWAYS = PlanOptions(tracks_always=True)
IN_TURN = PlanOptions(tracks=1)


@pytest.fixture(scope="module")
def grids(tmp_path_factory):
    """A 4x4 grid of two states, a 4x8 one, and a 1x12 one (a chain)."""
    out = tmp_path_factory.mktemp("grids")
    assert grid_family.main(["--out", str(out), "4x4:2", "4x8:2", "1x12:2"]) == 0
    names = ("grid4x4_d2", "grid4x8_d2", "grid1x12_d2")
    return {name: load_bundle(out / f"{name}__prob_float64") for name in names}


def compiled(bundle, options: PlanOptions | None = None, **kw):
    exe = catbp_jit.compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        options=options,
        **kw,
    )
    exe.wait()
    return exe


def factors(bundle, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {f: rng.uniform(0.1, 2.0, a.shape) for f, (a, _) in bundle.factors.items()}


def results(sess, **inputs) -> dict:
    return {k: v.copy() for k, (v, _) in sess.run(**inputs).items()}


def tasks(exe) -> list[list[tuple[int, int, tuple[int, ...]]]]:
    """The table's tracks section: per track, its tasks (first step, last step, waits)."""
    return tracks.read_tracks(exe.schedule.table, exe.schedule.tracks)


def assert_waits_cover_conflicts(exe, some: bool = True) -> None:
    """Every pair of dynamic segments in different tracks that touch the same memory (one
    of them writing it) is ordered: the later one waits for the earlier one (some: and
    there is such a pair)."""
    plan = exe.plan
    fused, memory, n_static = plan.fused, plan.memory, plan.n_static
    index = {id(seg): i for i, seg in enumerate(fused.segments)}
    where = {}  # segment -> (track, its position + 1 in its track), waits
    for k, track in enumerate(tasks(exe)):
        for pos, (first, last, waits) in enumerate(track):
            segs = {index[id(exe.schedule.steps[s].segment)] for s in range(first, last)}
            assert len(segs) == 1, "a task is one segment's steps"
            where[segs.pop()] = (k, pos + 1, waits)
    dynamic = range(n_static, len(fused.segments))
    assert set(where) == set(dynamic), "every dynamic segment in one track"
    ranges = {i: tracks.segment_ranges(fused, memory, i) for i in dynamic}

    def meet(a, b) -> bool:
        return any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b)

    pairs = 0
    for j in dynamic:
        rj, wj = ranges[j]
        kj, _, waits = where[j]
        for i in range(n_static, j):
            ri, wi = ranges[i]
            ki, pos, _ = where[i]
            if ki != kj and (meet(wi, rj + wj) or meet(ri, wj)):
                pairs += 1
                assert waits[ki] >= pos, f"segment {j} (track {kj}) does not wait for {i} (track {ki})"
    assert pairs or not some, "the tracks share memory somewhere"


def test_a_grid_runs_in_tracks_to_the_bits_in_turn(grids):
    grid = grids["grid4x4_d2"]
    exe, plain = compiled(grid, ALWAYS), compiled(grid, IN_TURN)
    assert exe.schedule.tracks >= 0 and plain.schedule.tracks == -1
    assert all(tasks(exe)), "both tracks have tasks"
    text = exe.as_text()  # the listing says which track runs each step
    sizes = " and ".join(str(len(t)) for t in tasks(exe))
    assert f"in 2 tracks side by side, of {sizes} segments" in text
    assert re.search(r"\] K\d+ t0 ", text) and re.search(r"\] K\d+ t1 ", text)
    sess, ref = exe.bind(), plain.bind()
    for seed in (0, 1):
        f = factors(grid, seed)
        want = results(ref, factors=f)
        assert_same_bits(results(sess, factors=f), want, f"seed {seed}")
        assert_same_bits(results(sess), want, f"seed {seed}, run again")
    assert_waits_cover_conflicts(exe)


def test_a_chain_runs_in_turn(grids):
    """A chain's segments each wait for the last: the estimate finds nothing to gain."""
    exe = compiled(grids["grid1x12_d2"])
    assert exe.schedule.tracks == -1


def test_one_thread_walks_every_track(grids):
    grid = grids["grid4x4_d2"]
    f = factors(grid)
    want = results(compiled(grid, IN_TURN).bind(), factors=f)
    sess = compiled(grid).bind()
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        got = results(sess, factors=f)
    finally:
        numba.set_num_threads(before)
    assert_same_bits(got, want)


def test_two_sessions_at_once(grids):
    """Sessions in two threads: one holds the pool, the other walks its tracks alone."""
    grid = grids["grid4x4_d2"]
    exe = compiled(grid)
    inputs = [factors(grid, seed) for seed in (2, 3)]
    plain = compiled(grid, IN_TURN).bind()
    want = [results(plain, factors=f) for f in inputs]
    got: list[list[dict]] = [[], []]

    def work(i: int) -> None:
        sess = exe.bind()
        for _ in range(20):
            got[i].append(results(sess, factors=inputs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in (0, 1):
        assert len(got[i]) == 20
        for g in got[i]:
            assert_same_bits(g, want[i], f"session {i}")


def test_static_inputs_run_before_the_tracks(grids):
    grid = grids["grid4x4_d2"]
    static = sorted(grid.factors)[: len(grid.factors) // 2]
    exe = compiled(grid, ALWAYS, static_factors=static)
    plain = compiled(grid, IN_TURN, static_factors=static)
    assert exe.plan.n_static_steps > 0 and exe.schedule.tracks >= 0
    sess, ref = exe.bind(), plain.bind()
    f0, f1 = factors(grid, 0), factors(grid, 1)
    dynamic_only = {k: v for k, v in f1.items() if k not in static}
    for given_factors in (f0, dynamic_only, f1):  # static steps run, skipped, run again
        assert_same_bits(results(sess, factors=given_factors), results(ref, factors=given_factors))
    assert_waits_cover_conflicts(exe)


def test_steps_cut_in_chunks_are_shared(grids):
    """A step the plan cuts in chunks (here every step of 64 terms or more) is posted as a
    joint step that the other track's thread helps with."""
    grid = grids["grid4x4_d2"]
    options = PlanOptions(tracks_always=True, parallel_min_work=64)
    exe = compiled(grid, options)
    chunked = [s for s in range(len(exe.schedule.steps)) if exe.schedule.chunks(s) > 1]
    assert chunked and exe.schedule.tracks >= 0
    f = factors(grid)
    want = results(compiled(grid, PlanOptions(tracks=1, parallel_min_work=64)).bind(), factors=f)
    sess = exe.bind()
    for _ in range(5):
        assert_same_bits(results(sess, factors=f), want)


@pytest.mark.parametrize("exact", [True, False])
def test_a_normalize_cut_in_chunks_is_shared_in_tracks(grids, exact):
    """A step whose NORMALIZE is cut in chunks too (abi.SPLIT_FINISH: here every chunked
    one) posts its two passes as joint steps after its chunks: the bits of the NORMALIZE
    on one thread, in turn."""
    grid = grids["grid4x4_d2"]
    knobs = dict(exact=exact, parallel_min_work=64)
    exe = compiled(grid, PlanOptions(tracks_always=True, split_finish_min_elements=1, **knobs))
    split = [i for i, _ in enumerate(exe.schedule.steps) if exe.schedule.finish(i) == abi.SPLIT_FINISH]
    assert split and exe.schedule.tracks >= 0
    f = factors(grid)
    one = PlanOptions(tracks=1, split_finish_min_elements=None, **knobs)
    want = results(compiled(grid, one).bind(), factors=f)
    sess = exe.bind()
    for _ in range(5):
        assert_same_bits(results(sess, factors=f), want)


def test_a_run_in_tracks_allocates_nothing(grids):
    grid = grids["grid4x4_d2"]
    sess = compiled(grid).bind()
    f = factors(grid)
    sess.run(factors=f)
    in_turn = compiled(grid, IN_TURN).bind()
    in_turn.run(factors=f)
    _, plain = count_allocations(in_turn, f, {}, 5)
    np_count, per_run = count_allocations(sess, f, {}, 5)
    assert np_count.allocations == 0, np_count
    assert per_run == plain, (per_run, plain)  # (the dispatcher's own, as in turn)


@given(cases())
@settings(25)
def test_random_programs_in_tracks(case):
    exe = compile_case(case, "compiled", options=ALWAYS)
    ref = compile_case(case, "compiled", options=IN_TURN).bind()
    sess = exe.bind()
    for which in range(len(case.inputs)):
        got = session_results(sess, case.inputs[which])
        assert_same_slots(run_reference(case, which), got, case, f"tracks, inputs {which}")
        want = session_results(ref, case.inputs[which])
        assert_same_bits({k: v for k, (v, _) in got.items()}, {k: v for k, (v, _) in want.items()})
    if exe.schedule.tracks >= 0:
        event("in tracks")
        assert_waits_cover_conflicts(exe, some=False)


def test_options():
    with pytest.raises(ValueError, match="tracks"):
        PlanOptions(tracks=0)
    assert PlanOptions().tracks == 2
    assert plan_options("cuda", PlanOptions(tracks=2)).tracks == 1


def test_memory_another_track_used_is_taken_after_the_slack():
    """track_fit. Segments 0, 1, 2 and 4 in track 0, segment 3 in track 1; segment i writes
    value i, segment 2 reads value 0, segment 3 reads value 1. Value 0's users (segments 0
    and 2, track 0) are done by 30 ns: value 4 (track 0, after them, at 40 ns) may take its
    memory whatever the slack, value 3 (track 1, at 100 ns) only if 30 + slack <= 100."""
    sizes = dict.fromkeys(range(5), 8)
    users = {0: [0, 2], 1: [1, 3], 2: [2], 3: [3], 4: [4]}
    intervals = [Interval(0, 0, 2), Interval(1, 1, 3)] + [Interval(v, v, v) for v in (2, 3, 4)]
    start, finish = [0.0, 10.0, 20.0, 100.0, 40.0], [10.0, 20.0, 30.0, 110.0, 50.0]
    track = [0, 0, 0, 1, 0]

    def placed(slack: float) -> dict[int, int]:
        return track_fit(intervals, sizes, 8, users, SideBySide(track, start, finish, slack))[0]

    near, far = placed(slack=90.0), placed(slack=50.0)
    for p in (near, far):
        assert len({p[0], p[1], p[2]}) == 3  # live at once
    assert far[3] == far[0]  # 30 + 50 <= 100: free for track 1
    assert near[3] not in (near[0], near[1], near[2])  # 30 + 90 > 100: not yet
    assert near[4] in (near[0], near[2])  # the same track, after every user: free


def test_a_pool_of_memory_per_track():
    """track_fit with a pool per track (the setting of the test above): each track's values
    take memory of their own, side by side, whatever the slack; a track's values still
    share theirs (value 4 after every user of value 0 or 2)."""
    sizes = dict.fromkeys(range(5), 8)
    users = {0: [0, 2], 1: [1, 3], 2: [2], 3: [3], 4: [4]}
    intervals = [Interval(0, 0, 2), Interval(1, 1, 3)] + [Interval(v, v, v) for v in (2, 3, 4)]
    start, finish = [0.0, 10.0, 20.0, 100.0, 40.0], [10.0, 20.0, 30.0, 110.0, 50.0]
    track = [0, 0, 0, 1, 0]
    for slack in (50.0, 90.0):
        side = SideBySide(track, start, finish, slack, pools=True)
        p, high = track_fit(intervals, sizes, 8, users, side)
        first = [p[v] for v in (0, 1, 2, 4)]
        assert len({p[0], p[1], p[2]}) == 3  # live at once
        assert p[4] in (p[0], p[2])  # the same track, after every user: free
        assert p[3] >= max(first) + 8 and high == p[3] + 8  # track 1's pool after track 0's


def test_each_workspace_line_is_written_by_one_track(grids):
    """A 4x8 grid in tracks: a pool of memory per track (PlanOptions.track_pools; its plan
    is affordable), so no two segments of different tracks write the same memory, which
    they do without the pools; the table, as a session holds it, starts a cache line, and
    so does each step's scratch (loop counters that threads write side by side)."""

    def crossings(exe) -> int:
        plan = exe.plan
        written: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
        index = {id(seg): i for i, seg in enumerate(plan.fused.segments)}
        for k, track in enumerate(tasks(exe)):
            for first, _, _ in track:
                i = index[id(exe.schedule.steps[first].segment)]
                written[k] += tracks.segment_ranges(plan.fused, plan.memory, i)[1]
        assert written[0] and written[1]
        return sum(a0 < b1 and b0 < a1 for a0, a1 in written[0] for b0, b1 in written[1])

    grid = grids["grid4x8_d2"]
    exe = compiled(grid, ALWAYS)
    assert crossings(exe) == 0
    assert crossings(compiled(grid, ALWAYS.with_(track_pools=False))) > 0
    sess = exe.bind()
    assert sess.table.ctypes.data % 64 == 0
    scratch = [st.params.scratch for st in exe.schedule.steps if hasattr(st.params, "scratch")]
    assert scratch and all(at % abi.LINE_INT64S == 0 for at in scratch)
    f = factors(grid)
    assert_same_bits(results(sess, factors=f), results(compiled(grid, IN_TURN).bind(), factors=f))


def test_run_call_runs_the_tracks_in_either_mode(grids):
    """Session.run_call: the whole schedule as a compiled run walks it (roofline.py's
    `run`), in loop mode too; the numpy tier has no such walk."""
    grid = grids["grid4x4_d2"]
    f = factors(grid)
    want = results(compiled(grid).bind(), factors=f)
    for mode in ("compiled", "loop"):
        sess = compiled(grid, mode=mode).bind()
        sess.run(factors=f)
        for v, _ in sess.slots.values():
            v[...] = 0
        sess.run_call()()
        assert_same_bits({k: v.copy() for k, (v, _) in sess.slots.items()}, want, mode)
    with pytest.raises(RuntimeError, match="numpy"):
        compiled(grid).bind(numpy_only=True).run_call()


MORE_THREADS = """
import numba, numpy as np, catbp_jit
from catbp_jit.bundle import load_bundle
from catbp_jit.plan.options import PlanOptions
assert numba.config.NUMBA_NUM_THREADS == {threads}
b = load_bundle({path!r})
f = {{k: np.random.default_rng(0).uniform(0.1, 2.0, a.shape) for k, (a, _) in b.factors.items()}}
out = []
in_turn = PlanOptions(tracks=1, parallel_min_work=64)
for options in (in_turn, PlanOptions(tracks_always=True, parallel_min_work=64)):
    exe = catbp_jit.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(), options=options)
    exe.wait()
    sess = exe.bind()
    runs = [{{k: v.copy() for k, (v, _) in sess.run(factors=f).items()}} for _ in range(5)]
    out.append(runs)
assert exe.schedule.tracks >= 0
for runs in out[1:]:
    for got in runs:
        for k, want in out[0][0].items():
            assert want.tobytes() == got[k].tobytes(), k
print("same bits")
"""


@pytest.mark.parametrize("threads", [4, pytest.param(6, marks=pytest.mark.slow)])  # (6: ~10 s more)
def test_threads_beyond_the_tracks_take_joint_chunks(grids, threads):
    """With more threads than tracks (NUMBA_NUM_THREADS=4 or 6: three or five pool threads,
    two tracks), the threads that own no track share the joint steps' chunks: the same
    bits. (With 6, a thread numbered 3 or more once looked at a third track that is not
    there, in the memory after the tracks' state lines, and the run never ended.)"""
    script = MORE_THREADS.format(path=str(grids["grid4x4_d2"].path), threads=threads)
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "same bits" in done.stdout, done.stderr[-3000:]


@pytest.mark.slow  # (~10 s)
def test_two_sessions_posting_jobs_at_once_never_count_a_chunk_twice(grids):
    """Two threads, each running a session whose steps are cut in chunks (one in tracks,
    one in turn), 20000 runs each, every run's bits checked. A pool thread that read the
    claim of a job just done and was descheduled could take a chunk of the next job under
    the old job's number, the chunk counted done twice, and a run went on before one of
    its chunks was done (dispatch.close_claim): 2 runs in 180000 gave wrong bits in three
    such processes at once, 0 in 360000 since."""
    grid = grids["grid4x4_d2"]
    f = factors(grid)
    want = results(compiled(grid, IN_TURN).bind(), factors=f)
    exes = [
        compiled(grid, PlanOptions(tracks_always=True, parallel_min_work=64)),
        compiled(grid, PlanOptions(tracks=1, parallel_min_work=64)),
    ]
    bad = [0, 0]

    def work(i: int) -> None:
        sess = exes[i].bind()
        sess.run(factors=f)
        for _ in range(20000):
            got = sess.run()
            if any(got[k][0].tobytes() != want[k].tobytes() for k in want):
                bad[i] += 1

    threads = [threading.Thread(target=work, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bad == [0, 0]


def test_a_logprob_sum_costs_an_exp_per_term():
    """The estimate weighs LOGPROB's sums by their terms too (each an exp); products, and
    the other semirings' sums, by their work alone."""

    def loops(reduce: bool):  # what segment_cost reads of a SegmentLoops
        return SimpleNamespace(
            work=3 * 64,
            workspace=0,
            pattern=SimpleNamespace(reduce=reduce),
            nest=SimpleNamespace(sizes=[4, 16], across=ACROSS_OUTPUTS),
        )

    def plain(kind: str) -> float:
        return tracks.CALL_NS[kind] + tracks.NS_PER_WORK[kind] * 3 * 64

    assert tracks.segment_cost(loops(True)) == pytest.approx(plain(ACROSS_OUTPUTS))
    assert tracks.segment_cost(loops(True), exp_sums=True) == pytest.approx(
        plain(ACROSS_OUTPUTS) + tracks.EXP_NS * 64
    )
    assert tracks.segment_cost(loops(False), exp_sums=True) == pytest.approx(plain(tracks.PRODUCT))


def test_sums_cost_more_than_products_of_the_same_work():
    """The estimate by kernel kind: a sum's call and work cost more than a product's, a
    sum across reduced axes (a chain per output) more than one across outputs."""

    def cost(reduce: bool, across: str) -> float:
        return tracks.segment_cost(
            SimpleNamespace(
                work=1024,
                workspace=0,
                pattern=SimpleNamespace(reduce=reduce),
                nest=SimpleNamespace(sizes=[16, 64], across=across),
            )
        )

    product, outputs, reduced = (
        cost(False, ACROSS_REDUCED),
        cost(True, ACROSS_OUTPUTS),
        cost(True, ACROSS_REDUCED),
    )
    assert product < outputs < reduced
    assert cost(True, ACROSS_BOTH) == outputs


def test_a_long_sum_into_few_outputs_costs_its_chain():
    """A sum into fewer outputs than LANES, on one thread, from chain_min_terms terms on:
    CHAIN_NS a term (its outputs side by side where it sums in lanes); cut in chunks, or
    under the bar, its work's estimate."""

    def loops(
        chunks: int = 1,
        outputs: int = 1,
        lanes: bool = False,
        terms_in_lanes: bool = False,
        work: int = 1 << 22,
    ):
        return SimpleNamespace(
            work=work,
            workspace=0,
            chunks=chunks,
            pattern=SimpleNamespace(reduce=True, sums_in_lanes=lanes, terms_in_lanes=terms_in_lanes),
            nest=SimpleNamespace(sizes=[outputs, (1 << 22) // outputs], out_rank=1, across=ACROSS_REDUCED),
        )

    terms = 1 << 22
    plain = tracks.CALL_NS[ACROSS_REDUCED] + tracks.NS_PER_WORK[ACROSS_REDUCED] * terms
    assert tracks.segment_cost(loops(), chain_min_terms=terms) == pytest.approx(tracks.CHAIN_NS * terms)
    assert tracks.segment_cost(loops(outputs=2, lanes=True), chain_min_terms=1) == pytest.approx(
        tracks.CHAIN_NS * terms / 2
    )
    # (each output's terms in abi.SUM_LANES chains too: KernelPattern.terms_in_lanes)
    # (a work estimate below that: the chain's price is the higher)
    in_lanes = loops(lanes=True, terms_in_lanes=True, work=1 << 20)
    assert tracks.segment_cost(in_lanes, chain_min_terms=1) == pytest.approx(
        tracks.CHAIN_NS * terms / abi.SUM_LANES
    )
    assert tracks.segment_cost(loops(), chain_min_terms=terms + 1) == pytest.approx(plain)
    assert tracks.segment_cost(loops(), chain_min_terms=None) == pytest.approx(plain)
    assert tracks.segment_cost(loops(chunks=2), chain_min_terms=1) == pytest.approx(plain)
    assert tracks.segment_cost(loops(outputs=abi.LANES), chain_min_terms=1) == pytest.approx(plain)


def test_tracks_are_chosen_at_several_crossing_prices():
    """S0 and S3 read a factor, S1 and S2 read S0's value (x: the price of its crossing).
    Greedy at the base price, S2 (cheap) crosses to the idle track 1 after waiting for
    S0's value, and S3 (long, needing nothing) waits behind it there: 6.1 x. At 1.5 times
    the price S2 stays after S1 in track 0 and S3 starts at once in track 1: 4 x, timed
    at the base price; kept."""
    G = AxisType.GEOMETRIC
    one, wide = TensorSpec(()), TensorSpec((Axis(2, G, 512),))
    specs = {0: TensorSpec((Axis(1, G, 8),)), 1: one, 2: wide, 3: one, 4: wide}
    segments = [
        Segment(1, one, (), (0,), False, False, (1,)),
        Segment(2, wide, (), (1,), False, False, (2,)),
        Segment(3, one, (), (1,), False, False, (3,)),
        Segment(4, wide, (), (0,), False, False, (4,)),
    ]
    kinds = {0: "factor"} | {v: "computed" for v in range(1, 5)}
    fused = Fused(segments, specs, kinds, {}, {}, "PROB")
    x = tracks.CROSS_NS + 8 * tracks.CROSS_NS_PER_BYTE
    assert 1.5 in tracks.CROSS_PRICES
    costs = [x, 1.25 * x, 0.1 * x, 4 * x]
    greedy = tracks.simulate(fused, costs, 0, 2, 8)
    assert greedy.track == (0, 0, 1, 1) and greedy.makespan == pytest.approx(6.1 * x)
    chosen = tracks.shortest(fused, costs, 0, 2, 8)
    assert chosen.track == (0, 0, 0, 1) and chosen.makespan == pytest.approx(4 * x)
    assert tracks.simulate(fused, costs, 0, 2, 8, given=chosen.track) == chosen


def test_a_long_sum_starts_right_after_its_inputs():
    """plan/early.py: [P, Q, R, S], S summing P's value to a scalar, becomes [P, S, Q, R];
    a sum under the bar, or into LANES outputs or more, stays where it is."""
    G = AxisType.GEOMETRIC
    a, b = Axis(1, G, 64), Axis(2, G, 8)
    big, row, one = TensorSpec((a, b)), TensorSpec((b,)), TensorSpec(())
    P = Segment(2, big, (), (0, 1), False, False, (2,))
    Q = Segment(3, row, (a,), (0,), True, False, (3,))
    R = Segment(4, row, (), (3, 3), False, False, (4,))
    S = Segment(5, one, (a, b), (2,), True, False, (5,))
    wide = Segment(6, row, (a,), (2,), True, False, (6,))  # (8 outputs: LANES or more)
    specs = {0: big, 1: big, 2: big, 3: row, 4: row, 5: one, 6: row}
    kinds = {0: "factor", 1: "factor"} | {v: "computed" for v in range(2, 7)}
    fused = Fused([P, Q, R, S, wide], specs, kinds, {}, {("s",): 5, ("r",): 4, ("w",): 6}, "PROB")
    assert early.chain_terms(S) == 512 and early.chain_terms(wide) == 0 and early.chain_terms(P) == 0
    assert early.start_early(fused, 512).segments == [P, S, Q, R, wide]
    assert early.start_early(fused, 513).segments == [P, Q, R, S, wide]
    assert early.start_early(fused, None) is fused


@pytest.mark.parametrize("exact", [True, False])
def test_a_grid_with_its_sums_early_keeps_its_bits(grids, exact):
    """The 4x4 grid with every sum into few outputs moved early (its totals and marginals:
    chain_min_terms=1), in tracks: another order of segments, the bits in turn."""
    grid = grids["grid4x4_d2"]
    moved = compiled(grid, PlanOptions(exact=exact, tracks_always=True, chain_min_terms=1))
    kept = compiled(grid, PlanOptions(exact=exact, tracks_always=True, chain_min_terms=None))
    assert [s.out for s in moved.plan.fused.segments] != [s.out for s in kept.plan.fused.segments]
    assert moved.schedule.tracks >= 0
    f = factors(grid)
    want = results(compiled(grid, PlanOptions(exact=exact, tracks=1)).bind(), factors=f)
    sess = moved.bind()
    for _ in range(3):
        assert_same_bits(results(sess, factors=f), want)


@given(cases())
@settings(6)
def test_random_programs_with_their_sums_early(case):
    """Every sum into few outputs moved early (chain_min_terms=1), in tracks: the bits of
    the schedule in program order, in turn, and the reference's."""
    exe = compile_case(case, "compiled", options=PlanOptions(tracks_always=True, chain_min_terms=1))
    ref = compile_case(case, "compiled", options=IN_TURN).bind()
    sess = exe.bind()
    order = [seg.out for seg in exe.plan.fused.segments]
    event(f"moved: {order != [seg.out for seg in ref.exe.plan.fused.segments]}")
    for which in range(len(case.inputs)):
        got = session_results(sess, case.inputs[which])
        assert_same_slots(run_reference(case, which), got, case, f"early, inputs {which}")
        want = session_results(ref, case.inputs[which])
        assert_same_bits({k: v for k, (v, _) in got.items()}, {k: v for k, (v, _) in want.items()})


def test_tracks_are_used_where_they_gain_more_than_starting_them_costs():
    """Estimates of grids of the bench family, exact mode, in ns: 6x6 of 2 states (slower
    in tracks), 6x6 of 3 states (faster in tracks)."""

    def times(makespan: float, serial: float) -> tracks.TrackTimes:
        return tracks.TrackTimes(2, (), (), (), makespan, serial)

    assert not times(17819.0, 31318.0).gains()
    assert times(46171.0, 69987.0).gains()
    assert not times(90.0, 100.0).gains()  # (the share alone: TRACKS_GAIN)


def test_a_small_grid_runs_in_turn_by_default(grids):
    assert compiled(grids["grid4x4_d2"]).schedule.tracks == -1
