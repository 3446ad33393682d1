"""plan/barriers.py: the waits the schedule kernel needs (one launch runs every step).

Between two barriers the steps of one launch may run in any order and overlap. So the
check runs each barrier-free phase in reverse order, step by step with the CPU kernels, from
the arena a session starts from, and asks for the in-order run's bits: a missing barrier
lets a step read an input before it is written or overwrite one still to be read. The
check has teeth: with no barriers at all, the reversed order gives other results.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, note

import catbp_jit
from catbp_jit.bundle import load_bundle
from catbp_jit.plan.barriers import MAX_OPEN_SPANS, barriers
from catbp_jit.session import aligned_empty
from conftest import corpus_sample
from jit_helpers import compile_case, inputs, settings
from random_programs import cases


def started(exe, **values):
    """The arena as the first step sees it, and the arena after an in-order run (by the
    kernels: a cold executable's numpy tier waited out)."""
    assert exe.wait()
    start = {}

    def before(i, step):
        if i == 0:
            start["mem"] = session.mem.copy()

    session = exe.bind(before=before)
    with np.errstate(all="ignore"):  # COUNT wraps around int64 on purpose
        session.run(**values)
    return start.get("mem", session.mem.copy()), session.mem.copy()


def reversed_phases(wait: np.ndarray) -> list[int]:
    """Step indexes, each barrier-free phase in reverse order."""
    order, phase = [], []
    for i, w in enumerate(wait):
        if w:
            order += phase[::-1]
            phase = []
        phase.append(i)
    return order + phase[::-1]


def run_in_order(exe, start: np.ndarray, order: list[int]) -> np.ndarray:
    """exe's steps in `order`, each by its CPU kernel, on a copy of `start`."""
    mem = aligned_empty(start.size, start.dtype)
    mem[:] = start
    table = exe.schedule.table.copy()  # (the kernels keep loop counters in its tail)
    with np.errstate(all="ignore"):
        for i in order:
            kernel, chunks = exe.kernels[exe.schedule.kernel_id(i)], exe.schedule.chunks(i)
            at = (mem.ctypes.data, mem.size, table.ctypes.data, table.size, exe.schedule.param_offset(i))
            for c in range(chunks):
                kernel.entry(*at, c, chunks)
            if chunks > 1:  # what follows the chunks (abi.py)
                kernel.entry(*at, chunks, chunks)
    return mem


def check(exe, **values) -> int:
    """The barriers placed (asserts the reversed phases give the in-order bits)."""
    start, done = started(exe, **values)
    wait = barriers(exe.schedule.steps)
    assert wait.dtype == np.int64 and wait.shape == (len(exe.schedule.steps),)
    assert not wait[:1].any(), "step 0 waits for nothing"
    got = run_in_order(exe, start, reversed_phases(wait))
    assert got.tobytes() == done.tobytes(), "a barrier is missing"
    return int(wait.sum())


@pytest.mark.slow  # (26 s: the default suite's budget; the corpus bundles' case stays in it)
@settings(40)
@given(case=cases())
def test_random_programs_run_alike_in_any_order_between_barriers(case):
    note(case.listing())
    exe = compile_case(case, "loop")
    values = case.inputs[0]
    placed = check(exe, factors=values.factors, selectors=values.selectors, slots=values.slots)
    event(f"{'some steps overlap' if placed < len(exe.schedule.steps) - 1 else 'a barrier before each step'}")


@pytest.mark.parametrize("path", corpus_sample())
def test_corpus_bundles_run_alike_in_any_order_between_barriers(path):
    bundle = load_bundle(path)
    exe = catbp_jit.compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        mode="loop",
    )
    factors, selectors = inputs(bundle)
    check(exe, factors=factors, selectors=selectors)


def chain_executable():
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.uai import read_uai
    from frontend_helpers import chain_uai

    model = compile_model(read_uai(chain_uai(40)), "prob")
    return model.executable, model.built.values


def test_without_barriers_the_reversed_order_is_wrong():
    """The check's teeth: a chain's messages read each other, and a phase of every step run
    backwards reads messages not yet written."""
    exe, values = chain_executable()
    start, done = started(exe, factors=values)
    everything = run_in_order(exe, start, list(range(len(exe.schedule.steps)))[::-1])
    assert everything.tobytes() != done.tobytes()
    wait = barriers(exe.schedule.steps)
    assert 0 < wait.sum() < len(wait)  # neither none nor everywhere: some steps overlap
    assert run_in_order(exe, start, reversed_phases(wait)).tobytes() == done.tobytes()


def test_a_long_run_of_independent_steps_is_cut():
    """Past MAX_OPEN_SPANS spans since the last barrier one is placed anyway (the test
    between spans is quadratic in them)."""
    exe, _ = chain_executable()
    wait = barriers(exe.schedule.steps)
    since = 0
    for i, step in enumerate(exe.schedule.steps):
        since = 0 if wait[i] else since
        since += 1 + len(getattr(step.params, "leaves", ()))
        assert since <= MAX_OPEN_SPANS
