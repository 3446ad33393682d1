"""Tiers (catbp_jit/tiers.py, numpy_steps.py): answers from the first run while kernels
compile, the same bits in both tiers, and a switch between runs that changes nothing.

The numpy tier computes each step as its kernel does (the same order of terms, float64
sums, the C library's exp and log), so every comparison here is bit for bit, in every
semiring and dtype, LOGPROB included.
"""

import logging
import os
import tempfile
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import catbp_jit
from catbp_jit.bundle import load_bundle
from catbp_jit.cache import KernelCache
from catbp_jit.codegen.loader import dispatcher_unit, kernel_unit
from catbp_jit.codegen.workers import compile_detached
from catbp_jit.environment import EnvironmentSettingError
from catbp_jit.executable import Executable
from catbp_jit.ir.batch import BatchedCompileError
from catbp_jit.tiers import KernelBuild, TierError, numpy_tier_fits, resolve_tier, start_build
from conftest import BENCH, CORPUS, REPO
from jit_helpers import assert_same_bits, executable, inputs, rows_of
from random_programs import cases, random_values

IDS = [p.name for p in CORPUS]
SETTINGS = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)


def copies(slots) -> dict:
    return {k: np.array(v, copy=True) for k, (v, _) in slots.items()}


# ------------------------------------------------------------------- the same bits, corpus


@pytest.mark.parametrize("path", CORPUS, ids=IDS)
def test_numpy_tier_gives_the_kernels_bits_on_the_corpus(path):
    b = load_bundle(path)
    exe = executable(b, "compiled")
    factors, selectors = inputs(b)
    kernels = copies(exe.bind().run(factors=factors, selectors=selectors))
    sess = exe.bind(numpy_only=True)
    assert not sess.compiled
    assert_same_bits(kernels, copies(sess.run(factors=factors, selectors=selectors)), b.name)
    assert_same_bits(kernels, copies(sess.run()), f"{b.name}, run again")


@settings(max_examples=150, **SETTINGS)
@given(cases())
def test_numpy_tier_gives_the_kernels_bits_on_random_programs(case):
    note(case.listing())
    exe = catbp_jit.compile(
        case.programs,
        case.sr(),
        factor_specs=case.factor_specs,
        selector_specs=case.selector_specs,
        slot_specs=case.slot_specs or None,
        mode="loop",
    )
    kernels, numpy = exe.bind(), exe.bind(numpy_only=True)
    for which, given_inputs in enumerate(case.inputs):
        kw = dict(factors=given_inputs.factors, selectors=given_inputs.selectors, slots=given_inputs.slots)
        with np.errstate(all="ignore"):  # COUNT wraps around on purpose
            want = copies(kernels.run(**kw))
            got = copies(numpy.run(**kw))
        assert_same_bits(want, got, f"inputs {which}")


@settings(max_examples=60, **SETTINGS)
@given(st.data())
def test_numpy_tier_gives_the_kernels_bits_in_batches(data):
    case = data.draw(cases())
    if not case.factor_specs:
        return
    bf = set(data.draw(st.lists(st.sampled_from(sorted(case.factor_specs)), min_size=1, unique=True)))
    buckets = tuple(sorted(data.draw(st.sets(st.integers(1, 5), min_size=1, max_size=2))))
    note(f"{case.listing()}\nbatched factors {bf}, buckets {buckets}")
    try:
        exe = catbp_jit.compile(
            case.programs,
            case.sr(),
            factor_specs=case.factor_specs,
            selector_specs=case.selector_specs,
            slot_specs=case.slot_specs or None,
            batched_factors=bf,
            buckets=buckets,
        )
    except BatchedCompileError:
        return
    kernels, numpy = exe.bind(), exe.bind(numpy_only=True)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    base = case.inputs[0]
    for n in (1, buckets[-1], 2 * buckets[-1] + 1):
        factors = {
            k: rows_of(
                v, n, rng, lambda r, k=k: random_values(r, case.factor_specs[k], case.semiring, case.dtype)
            )
            if k in bf
            else v
            for k, v in base.factors.items()
        }
        kw = dict(factors=factors, selectors=base.selectors, slots=base.slots)
        with np.errstate(all="ignore"):
            assert_same_bits(copies(kernels.run(**kw)), copies(numpy.run(**kw)), f"{n} rows")


# --------------------------------------------------------------- switching between tiers


def held_build(exe_like, cache, gate: threading.Event) -> KernelBuild:
    """A background build of the executable's (warm) kernels that completes only once
    `gate` is set: the test says when the kernels arrive."""
    patterns = sorted({p for plan in exe_like for p in plan.schedule.patterns}, key=lambda p: p.name)
    rendered = {p: kernel_unit(p) for p in patterns}
    build = start_build(rendered, dispatcher_unit(), [], cache, 1, lambda line: None)
    held = KernelBuild(lambda: (build.wait(), gate.wait()), lambda: build.result)
    return held


def in_numpy_tier(exe: Executable, cache, gate: threading.Event) -> Executable:
    return Executable(
        exe.plan,
        exe.mode,
        "cpu",
        [],
        cache_stats={},
        tier="numpy",
        kernel_build=held_build([exe.plan], cache, gate),
    )


@pytest.fixture(scope="module")
def grid():
    return load_bundle(REPO / "examples" / "grid3_d2__prob_float64")


@pytest.mark.parametrize("mode", ["compiled", "loop"])
def test_a_switch_between_runs_changes_nothing(grid, mode, caplog):
    plain = executable(grid, mode)
    factors, selectors = inputs(grid)
    want = copies(plain.bind().run(factors=factors, selectors=selectors))
    gate = threading.Event()
    exe = in_numpy_tier(plain, catbp_jit.cache.default_cache(), gate)
    sess = exe.bind()
    assert exe.tier == "numpy" and exe.stats()["tier"] == "numpy" and not sess.compiled
    assert "compiling; steps run in numpy" in exe.as_text()
    assert "def kernel" in exe.kernel_source(0)  # known before it is compiled
    assert_same_bits(want, copies(sess.run(factors=factors, selectors=selectors)), "numpy")
    gate.set()
    with caplog.at_level(logging.INFO, logger="catbp_jit.tiers"):
        assert exe.wait(timeout=120)
    assert exe.tier == "compiled" and len(exe.kernels) == len(exe.schedule.patterns)
    assert any(getattr(r, "catbp_jit", {}).get("tier") == "compiled" for r in caplog.records)
    assert not sess.compiled  # the session takes the kernels at its next run
    assert_same_bits(want, copies(sess.run()), "first compiled run")
    assert sess.compiled and exe.stats()["tier"] == "compiled"
    assert_same_bits(want, copies(sess.run(factors=factors, selectors=selectors)), "again")


def test_a_switch_in_the_middle_of_a_batched_run_changes_nothing(grid):
    fid = sorted(grid.factor_specs())[0]
    kw = dict(
        factor_specs=grid.factor_specs(),
        selector_specs=grid.selector_specs(),
        batched_factors={fid},
        buckets=(1, 4),
    )
    plain = catbp_jit.compile(grid.programs, grid.semiring_runtime(), **kw)
    factors, selectors = inputs(grid)
    rng = np.random.default_rng(7)
    factors[fid] = factors[fid][None] * rng.uniform(0.5, 2.0, (11,) + factors[fid].shape)
    want = copies(plain.bind().run(factors=factors, selectors=selectors))

    gate = threading.Event()
    build = held_build(list(p.plan for p in plain.profiles.values()), catbp_jit.cache.default_cache(), gate)
    for b, p in plain.profiles.items():  # the same plans, in the numpy tier, one build
        plain.profiles[b] = Executable(
            p.plan, p.mode, "cpu", [], cache_stats={}, tier="numpy", kernel_build=build
        )
    chunks = []

    def after(i, step):  # the last step of the first chunk lets the kernels in
        if i == len(plain.largest.schedule.steps) - 1 and not chunks:
            chunks.append(i)
            gate.set()
            build.wait(120)

    sess = plain.bind(after=after)
    got = copies(sess.run(factors=factors, selectors=selectors))  # 11 rows: chunks of 4
    assert chunks and plain.profiles[4].tier == "compiled"
    big = sess.sessions[4]
    assert big.compiled  # switched between the chunks of one run
    assert_same_bits(want, got, "switched in the middle of a batched run")


def test_a_failed_background_build_keeps_the_numpy_tier(grid):
    plain = executable(grid, "compiled")
    factors, selectors = inputs(grid)
    want = copies(plain.bind().run(factors=factors, selectors=selectors))

    def fail():
        raise catbp_jit.codegen.workers.KernelCompileError("kernel k failed to compile: test")

    exe = Executable(
        plain.plan,
        "compiled",
        "cpu",
        [],
        cache_stats={},
        tier="numpy",
        kernel_build=KernelBuild(fail, lambda: None),
    )
    exe.kernel_build.wait(60)
    with pytest.warns(RuntimeWarning, match="keeps running in the numpy tier") as said:
        sess = exe.bind()
        got = copies(sess.run(factors=factors, selectors=selectors))
        sess.run()
    assert len(said) == 1  # said once
    assert_same_bits(want, got)
    assert exe.tier == "numpy" and not sess.compiled
    with pytest.raises(catbp_jit.codegen.workers.KernelCompileError, match="test"):
        exe.wait()


# ------------------------------------------------------------------ when a tier is used


def test_tier_names_are_checked(monkeypatch):
    assert resolve_tier("compiled") == "compiled" and resolve_tier("auto") == "auto"
    with pytest.raises(TierError, match="tier must be one of auto, compiled, not 'fast'"):
        resolve_tier("fast")
    monkeypatch.setenv("CATBP_JIT_TIER", "numpy")
    with pytest.raises(EnvironmentSettingError, match="CATBP_JIT_TIER='numpy': expected one of"):
        resolve_tier()


def plan_of(b):
    return catbp_jit.executable.plan(
        b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(), selector_specs=b.selector_specs()
    )


def test_big_programs_wait_for_their_kernels():
    assert numpy_tier_fits(plan_of(load_bundle(CORPUS[0])))
    big = [p for p in BENCH if "grid5_d3" in p.name]  # (tests/data ships it too)
    assert big and not numpy_tier_fits(plan_of(load_bundle(big[0])))


def test_warm_kernels_and_the_strict_policy_never_use_the_numpy_tier(grid, tmp_path):
    executable(grid, "compiled")  # warm in the session's cache
    exe = catbp_jit.compile(
        grid.programs,
        grid.semiring_runtime(),
        factor_specs=grid.factor_specs(),
        selector_specs=grid.selector_specs(),
        tier="auto",
    )
    assert exe.tier == "compiled"  # nothing was cold
    strict = KernelCache(str(tmp_path / "empty"), policy="strict")
    with pytest.raises(catbp_jit.cache.CacheMissError):
        catbp_jit.compile(
            grid.programs,
            grid.semiring_runtime(),
            factor_specs=grid.factor_specs(),
            selector_specs=grid.selector_specs(),
            tier="auto",
            cache=strict,
        )


def test_detached_workers_compile_each_unit_once(tmp_path):
    """Two workers, each handed the whole list: the one unit is compiled once, the other
    worker finds it done (or waits on its lock), and no unit file is left behind."""
    cache = KernelCache(str(tmp_path / "cache"), policy="fallback")
    before = set(os.listdir(tempfile.gettempdir()))
    seen = []
    compile_detached([dispatcher_unit()], cache, 2, lambda unit, s: seen.append(unit.name))
    assert seen == ["dispatcher"]
    assert cache.check(dispatcher_unit().identity, dispatcher_unit().source)[0] == "ok"
    left = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("catbp_jit_units_")}
    assert not left


def test_detached_workers_share_the_list_and_answer_for_every_unit(tmp_path):
    """Three units, two workers, each starting with a unit of its own and putting off the
    ones the other is compiling: every unit is compiled, and reported, once."""
    from catbp_jit.plan.steps import KernelPattern

    cache = KernelCache(str(tmp_path / "cache"), policy="fallback")
    units = [
        kernel_unit(KernelPattern(sr, dtype, False, False, False, template="repack"))
        for sr, dtype in (("PROB", "float64"), ("LOGPROB", "float64"), ("COUNT", "int64"))
    ]
    seen = []
    compile_detached(units, cache, 2, lambda unit, s: seen.append(unit.name))
    assert sorted(seen) == sorted(u.name for u in units)
    assert all(cache.check(u.identity, u.source)[0] == "ok" for u in units)


class Busy:
    """A cache whose `busy` says which units another worker compiles now."""

    def __init__(self, names):
        self.names = names

    def busy(self, identity, source):
        return identity["name"] in self.names


def test_a_worker_puts_off_the_units_another_one_compiles():
    from catbp_jit.codegen.loader import CompileUnit
    from catbp_jit.codegen.workers import _in_turn

    units = [CompileUnit(n, {"name": n}, "", "kernel", "") for n in "abcd"]
    order = [(at, u.name) for at, u in _in_turn(units, Busy({"b", "c"}))]
    assert order == [(0, "a"), (3, "d"), (1, "b"), (2, "c")]


def test_busy_says_whether_another_holds_the_kernels_lock(tmp_path):
    """`busy` asks without waiting: false when nobody holds the lock (taking it and giving
    it back), true while another thread or another process holds it."""
    cache = KernelCache(str(tmp_path / "cache"), policy="fallback")
    unit = dispatcher_unit()
    assert not cache.busy(unit.identity, unit.source)
    from catbp_jit.cache.entry import _Entry

    lock = _Entry(cache.directory, cache.key_for(unit.identity), cache._prepare_dir()).lock.file_lock
    holding, done = threading.Event(), threading.Event()

    def hold():
        lock.acquire(5.0)
        holding.set()
        done.wait(10)
        lock.release()

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        assert cache.busy(unit.identity, unit.source)
    finally:
        done.set()
        thread.join()
    assert not cache.busy(unit.identity, unit.source)
    import subprocess
    import sys

    hold = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('held', flush=True); time.sleep(60)"
    )
    other = subprocess.Popen([sys.executable, "-c", hold, lock.path], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        assert cache.busy(unit.identity, unit.source)
    finally:
        other.kill()
        other.wait()
    assert not cache.busy(unit.identity, unit.source)
