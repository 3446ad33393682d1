"""Steps cut in chunks, shared with the pool's threads (catbp_jit/pool.py,
codegen/dispatch.py): the same bits as one thread, the loop mode and the reference, a
NORMALIZE after its chunks, runs in several threads at once, and nothing left holding
the pool after a run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numba
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec, abi
from catbp_jit.bundle import load_bundle
from catbp_jit.plan.options import PlanOptions
from catbp_jit.pool import the_pool
from catbp_jit.reference import run_program
from jit_helpers import (
    assert_same_bits,
    catbp_jit_inputs,
    compile_bundle,
    count_allocations,
    inputs,
    random_factors,
    session_results,
    settings,
    slot_copies,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grid3_d2__prob_float64"
CHUNKED = {"parallel_min_work": 1 << 6, "chunks": 5}  # (5: chunks cut rows and lane groups anywhere)


def chunked_steps(exe) -> int:
    return sum(exe.schedule.chunks(i) > 1 for i in range(len(exe.schedule.steps)))


@pytest.fixture(scope="module")
def example():
    return load_bundle(EXAMPLE)


@pytest.fixture(scope="module")
def serial_bits(example):
    """The example's slots with no step cut in chunks."""
    exe = compile_bundle(example, "compiled")
    assert chunked_steps(exe) == 0
    factors, selectors = inputs(example)
    return slot_copies(exe.bind().run(factors=factors, selectors=selectors))


def test_chunked_steps_give_the_bits_of_one_thread_in_both_modes(example, serial_bits):
    if numba.get_num_threads() < 2:
        pytest.skip("this process has fewer than 2 Numba threads")
    factors, selectors = inputs(example)
    for mode in ("compiled", "loop"):
        exe = compile_bundle(example, mode, **CHUNKED)
        assert chunked_steps(exe) >= 10, chunked_steps(exe)
        # the rows say so, and the kernels are the serial steps' (no parallel variant)
        assert all(
            exe.schedule.chunks(i) == 1 or st.params.chunks == exe.schedule.chunks(i)
            for i, st in enumerate(exe.schedule.steps)
        )
        assert not any(k.pattern.parallel for k in exe.kernels)
        sess = exe.bind()
        for threads in (2, 1, 2):
            numba.set_num_threads(threads)
            try:
                got = slot_copies(sess.run(factors=factors, selectors=selectors))
            finally:
                numba.set_num_threads(2)
            assert_same_bits(got, serial_bits, f"{mode}, {threads} threads")
        np_count, per_run = count_allocations(sess, factors, selectors, 5)
        assert np_count.allocations == 0 and len(set(per_run)) == 1, (np_count, per_run)
    pool = the_pool()
    assert pool.control[abi.POOL_OWNER] == 0, "a run left the pool held"


def test_runs_in_several_threads_at_once_keep_their_bits(example, serial_bits):
    """Sessions run from several Python threads at once: one holds the pool, the others
    run their chunks alone; every run gives the one-thread bits."""
    exe = compile_bundle(example, "compiled", **CHUNKED)
    factors, selectors = inputs(example)
    sessions = [exe.bind() for _ in range(3)]
    bad: list = []

    def runs(sess):
        for _ in range(20):
            got = slot_copies(sess.run(factors=factors, selectors=selectors))
            if any(got[k].tobytes() != serial_bits[k].tobytes() for k in serial_bits):
                bad.append(sess)

    threads = [threading.Thread(target=runs, args=(s,)) for s in sessions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    assert the_pool().control[abi.POOL_OWNER] == 0


def test_a_run_wakes_the_pool_threads_that_wait_in_python_only(example, serial_bits):
    """A pool thread returns to Python once no run has held the pool for a while; the next
    run's helpers() sets its Event, and it comes back (it clears the Event). A thread that
    still serves in compiled code gets no wake (setting an Event costs every run
    microseconds). Runs after the threads went back to Python keep their bits."""
    if numba.get_num_threads() < 2:
        pytest.skip("this process has fewer than 2 Numba threads")
    exe = compile_bundle(example, "compiled", **CHUNKED)
    factors, selectors = inputs(example)
    sess = exe.bind()
    pool = the_pool()
    for _ in range(3):
        sess.run(factors=factors, selectors=selectors)  # (the pool started)
        deadline = time.monotonic() + 10
        while not all(pool._waiting) and time.monotonic() < deadline:
            time.sleep(0.001)  # (a thread serves until it has spun SPIN_PAUSES with no job)
        assert all(pool._waiting), "the pool's threads did not go back to Python"
        assert pool.helpers() >= 1
        assert pool._wake[0].is_set() or not pool._waiting[0]
        while pool._wake[0].is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
        assert not pool._wake[0].is_set(), "a woken pool thread did not take its wake"
        got = slot_copies(sess.run(factors=factors, selectors=selectors))
        assert_same_bits(got, serial_bits, "a run after the pool's threads went back to Python")
    # a thread that serves gets no wake: shown on one that waits (it stays there until
    # woken), marked as serving
    deadline = time.monotonic() + 10
    while not (all(pool._waiting) and not pool._wake[0].is_set()) and time.monotonic() < deadline:
        time.sleep(0.001)  # (the last run's wake taken, and the thread back in Python)
    assert all(pool._waiting) and not pool._wake[0].is_set()
    pool._waiting[0] = False
    try:
        pool.helpers()
        assert not pool._wake[0].is_set()
    finally:
        pool._waiting[0] = True


def test_step_call_runs_one_step_as_a_run_does(example, serial_bits):
    exe = compile_bundle(example, "compiled", **CHUNKED)
    factors, selectors = inputs(example)
    sess = exe.bind()
    sess.run(factors=factors, selectors=selectors)
    sess.mem[:] = 0  # every step again, one call each (the inputs copied back first)
    sess.run(factors=factors, selectors=selectors)
    keep = sess.mem.copy()
    sess.mem[:] = 0
    sess._bind_inputs(factors, selectors, None)
    for c in sess.exe.plan.bound("constant"):
        sess.mem[c.offset : c.offset + c.size] = keep[c.offset : c.offset + c.size]
    for i in range(len(exe.schedule.steps)):
        sess.step_call(i)()
    assert sess.mem.tobytes() == keep.tobytes()


def test_steps_call_walks_steps_as_a_run_does(example, serial_bits):
    """Session.steps_call(first, last): the dispatcher walking steps first..last-1 (what
    perf/roofline.py times): walked in two parts, or step by step, the run's bits; an
    empty walk writes nothing; a range outside the schedule is refused."""
    exe = compile_bundle(example, "loop", **CHUNKED)  # (the dispatcher walks in any mode)
    factors, selectors = inputs(example)
    sess = exe.bind()
    sess.run(factors=factors, selectors=selectors)
    keep = sess.mem.copy()
    n = len(exe.schedule.steps)
    assert any(exe.schedule.chunks(i) > 1 for i in range(n))  # the pool takes part
    for walks in ([(0, n // 2), (n // 2, n)], [(i, i + 1) for i in range(n)]):
        sess.mem[:] = 0
        sess._bind_inputs(factors, selectors, None)
        for c in exe.plan.bound("constant"):
            sess.mem[c.offset : c.offset + c.size] = keep[c.offset : c.offset + c.size]
        before = sess.mem.copy()
        sess.steps_call(3, 3)()
        assert sess.mem.tobytes() == before.tobytes()
        for first, last in walks:
            sess.steps_call(first, last)()
        assert sess.mem.tobytes() == keep.tobytes()
    for first, last in ((-1, 2), (2, 1), (0, n + 1)):
        with pytest.raises(ValueError, match=f"this schedule has {n} steps"):
            sess.steps_call(first, last)


def test_steps_call_puts_blas_on_one_thread_where_a_run_does(example):
    """A walk runs inside the session's OneBlasThread, as run() does (blas_threads.py):
    timed without it, a reassociating grid10x10_d3 walked in 36 ms against its runs' 22."""
    exe = compile_bundle(example, "compiled")
    factors, selectors = inputs(example)
    sess = exe.bind()
    sess.run(factors=factors, selectors=selectors)
    calls: list[str] = []

    class Recorder:  # stands in for the session's OneBlasThread
        def enter(self) -> None:
            calls.append("enter")

        def exit(self) -> None:
            calls.append("exit")

    sess._one_blas_thread = Recorder()
    sess.run()
    sess.steps_call(0, 1)()
    assert calls == ["enter", "exit", "enter", "exit"]


G = AxisType.GEOMETRIC


@given(
    sizes=st.lists(st.integers(3, 9), min_size=3, max_size=4),  # (8 rows at least)
    chunks=st.integers(2, 7),
    seed=st.integers(0, 3),
    semiring=st.sampled_from(["PROB", "LOGPROB"]),
)
@settings(12)
def test_a_normalize_after_its_chunks(sizes, chunks, seed, semiring):
    """bel = NORMALIZE(f0 ⊗ f1), cut in chunks: the kernel normalizes once every chunk is
    done (chunk == chunks, abi.py): the bits of the step in one chunk, in both modes, and
    the reference's values (a mutation that normalizes in every chunk fails it)."""
    axes = [Axis(i, G, n) for i, n in enumerate(sizes)]
    # (f1 transposed: gathered along the vector, which `block` then keeps short, so the
    # step has rows to cut)
    specs = {0: TensorSpec(tuple(axes[:1])), 1: TensorSpec(tuple(reversed(axes)))}
    program = Program(
        [
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
            Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": TensorSpec(tuple(axes))}),
            Instruction(OpCode.NORMALIZE, None, {"src": 2}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("bel",), "src": 2}),
        ],
        "p",
    )
    sr = catbp_jit.make_semiring(semiring, "float64")
    values = random_factors(specs, sr, seed=seed, zeros=0.1)
    want = run_program(program, sr, lambda f: (values[f], specs[f]), lambda s: None)
    one = catbp_jit.compile(program, sr, factor_specs=specs)
    assert one.schedule.chunks(0) == 1
    whole = session_results(one.bind(), catbp_jit_inputs(values))[("bel",)][0]
    # (within rounding: numpy's total of a NORMALIZE goes pairwise, the kernels' in order)
    assert np.allclose(whole, np.asarray(want[("bel",)][0]), rtol=1e-12, atol=1e-300, equal_nan=True)
    options = PlanOptions(parallel_min_work=1, chunks=chunks, block=1)
    for mode in ("compiled", "loop"):
        exe = catbp_jit.compile(program, sr, factor_specs=specs, mode=mode, options=options)
        (step,) = exe.schedule.steps
        assert step.pattern.normalize and exe.schedule.chunks(0) == chunks
        got = session_results(exe.bind(), catbp_jit_inputs(values))[("bel",)][0]
        assert_same_bits({"bel": got}, {"bel": whole}, f"{mode}, {chunks} chunks")


def test_options_refuse_chunk_settings_below_one():
    for name in ("parallel_min_work", "chunks", "gemm_parallel_min_work"):
        for bad in (0, -1, True, 1.5):
            with pytest.raises(ValueError, match=name):
                PlanOptions(**{name: bad})
