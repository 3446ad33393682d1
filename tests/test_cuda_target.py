"""target="cuda" end to end: compile, bind, run, read back, batches, save/load, the kernel
cache, the front end and the command line, against the CPU target bit for bit.

Runs under Numba's CUDA simulator unless the environment says otherwise (conftest.py sets
NUMBA_ENABLE_CUDASIM=1 when it is not set: NUMBA_ENABLE_CUDASIM=0 runs the same tests on a
real GPU). The kernels themselves are checked on the whole corpus and on random programs
in test_cuda_kernels.py; here it is everything around them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba_cuda", reason="the CUDA target needs numba-cuda: pip install -e '.[cuda]'")

import catbp_jit  # noqa: E402
from catbp_jit.bundle import load_bundle  # noqa: E402
from catbp_jit.cache import CacheMissError, KernelCache  # noqa: E402
from conftest import shared_dir  # noqa: E402
from jit_helpers import assert_close, bit_identical  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASIA = str(REPO / "examples" / "asia.bif")
# small bundles the simulator runs in well under a second each: every semiring and dtype,
# normalized messages, a CONTRACT of many leaves
FAST = [
    "z4_cycle__prob_float64_normalized",
    "z4_cycle__count_int64",
    "z4_cycle__prob_float32",
    "grid3_d2__logprob_float64_normalized",
    "chain8__sat_bool",
    "coloring_cycle5__prob_float64",
]


def bundle(name):
    return load_bundle(shared_dir() / "corpus" / name)


def inputs(b):
    return (
        {f: np.ascontiguousarray(a, dtype=b.dtype) for f, (a, _) in b.factors.items()},
        {s: np.ascontiguousarray(a, dtype=b.dtype) for s, (a, _) in b.selectors.items()},
    )


def compile_for(b, target, **kw):
    return catbp_jit.compile(
        b.programs,
        b.semiring_runtime(),
        factor_specs=b.factor_specs(),
        selector_specs=b.selector_specs(),
        target=target,
        **kw,
    )


def snapshot(slots):
    return {k: np.array(slots[k][0], copy=True) for k in slots}


def assert_same(a, b, what, semiring="PROB"):
    """The same bits, except where exp and log are involved (LOGPROB): on a GPU those are
    libdevice's, not libm's, and may differ in the last bits (jit_helpers.assert_close)."""
    assert a.keys() == b.keys(), what
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (what, k)
        if bit_identical(semiring):
            assert np.array_equal(a[k], b[k], equal_nan=True), (what, k, a[k], b[k])
        else:
            assert_close(b[k], a[k], semiring, f"{what} {k!r}")


@pytest.mark.parametrize("name", FAST)
def test_session_gives_the_cpu_bits(name):
    b = bundle(name)
    f, s = inputs(b)
    want = snapshot(compile_for(b, "cpu").bind().run(factors=f, selectors=s))
    exe = compile_for(b, "cuda")
    assert exe.target == "cuda" and exe.stats()["target"] == "cuda"
    sess = exe.bind()
    got = snapshot(sess.run(factors=f, selectors=s))
    assert_same(want, got, f"{name} cuda vs cpu", b.semiring)
    # a second run with nothing given reuses the inputs already on the device: its bits
    assert_same(got, snapshot(sess.run()), f"{name} second run")
    # every result is on the device too, readable without a copy by CuPy or PyTorch
    from numba import config

    for key, (dev, spec) in sess.device_slots.items():
        assert dev.shape == spec.shape
        if not config.ENABLE_CUDASIM:  # (the simulator's arrays are numpy arrays inside)
            assert dev.__cuda_array_interface__["shape"] == spec.shape
        assert np.array_equal(dev.copy_to_host(), got[key], equal_nan=True)


def test_results_are_copied_back_only_when_read_and_refreshed_by_each_run():
    b = bundle("coloring_cycle5__prob_float64")
    f, s = inputs(b)
    cpu, sess = compile_for(b, "cpu").bind(), compile_for(b, "cuda").bind()
    sess.run(factors=f, selectors=s)
    assert sess._fresh == set()  # nothing copied back yet
    key = next(iter(sess.slots))
    first = sess.slots[key][0]
    assert sess._fresh == {key}
    # other inputs: the same host view now holds the new run's values
    f2 = {k: np.ascontiguousarray(v[::-1].copy() if v.ndim else v) for k, v in f.items()}
    f2 = {k: v * (1.0 + 0.5 * i) for i, (k, v) in enumerate(f2.items())}
    sess.run(factors=f2)
    assert sess._fresh == set()
    want = snapshot(cpu.run(factors=f2, selectors=s))
    assert sess.slots[key][0] is first
    assert_same(want, snapshot(sess.slots), "after new inputs")
    sess.run_call()()  # (a run without binding, perf/roofline.py's): copied back when read
    assert sess._fresh == set()
    assert_same(want, snapshot(sess.slots), "run_call")


def test_bad_input_changes_nothing():
    b = bundle("z4_cycle__prob_float64")
    f, s = inputs(b)
    sess = compile_for(b, "cuda").bind()
    before = snapshot(sess.run(factors=f, selectors=s))
    fid = next(iter(f))
    with pytest.raises(catbp_jit.errors.InputMismatchError, match=f"factor {fid}"):
        sess.run(factors={fid: np.zeros((9, 9))})
    assert_same(before, snapshot(sess.run()), "after a refused run")


@pytest.mark.parametrize(
    "name, buckets, counts",
    [
        ("z4_cycle__prob_float64_normalized", (1, 4), (1, 3, 5, 2)),
        pytest.param(
            "grid3_d2__prob_float64_normalized", (1, 4, 8), (1, 3, 8, 11, 2), marks=pytest.mark.slow
        ),
    ],
)  # 31 s in the simulator on a 2-core machine
def test_batched_profiles_on_cuda_equal_the_cpu_rows(name, buckets, counts):
    b = bundle(name)
    f, s = inputs(b)
    fid = sorted(f)[0]
    rng = np.random.default_rng(3)
    rows = rng.uniform(0.1, 2.0, (max(counts),) + f[fid].shape)
    kw = dict(batched_factors={fid}, buckets=buckets)
    cpu = compile_for(b, "cpu", **kw).bind()
    gpu_exe = compile_for(b, "cuda", **kw)
    gpu = gpu_exe.bind()
    for n in counts:  # bucket switches, chunks past the largest
        given = {**f, fid: np.ascontiguousarray(rows[:n])}
        assert_same(
            snapshot(cpu.run(factors=given, selectors=s)),
            snapshot(gpu.run(factors=given, selectors=s)),
            f"{n} rows",
        )


def test_save_and_load_a_cuda_executable(tmp_path):
    b = bundle("z4_cycle__count_int64")
    f, s = inputs(b)
    exe = compile_for(b, "cuda")
    path = tmp_path / "exe.json"
    exe.save(path)
    assert json.loads(path.read_text())["target"] == "cuda"
    loaded = catbp_jit.load(path)
    assert loaded.target == "cuda" and [k.key for k in loaded.kernels] == [k.key for k in exe.kernels]
    assert_same(
        snapshot(exe.bind().run(factors=f, selectors=s)),
        snapshot(loaded.bind().run(factors=f, selectors=s)),
        "loaded",
    )


def test_cuda_kernels_go_through_the_kernel_cache(tmp_path):
    """Keyed apart from the CPU's, refused under strict when cold, served when warm: the
    kernels and the gather kernel, and in mode "compiled" the schedule kernel with them."""
    b = bundle("z4_cycle__prob_float64")
    directory = str(tmp_path / "cache")
    with pytest.raises(CacheMissError, match="strict"):
        compile_for(b, "cuda", cache=KernelCache(directory, policy="strict"))
    loop = compile_for(b, "cuda", mode="loop", cache=KernelCache(directory, policy="fallback"))
    assert loop.cache_stats["misses"] == len(loop.kernels) + 1 and loop.dispatcher is None
    with pytest.raises(CacheMissError, match="kernel 'cuda_schedule' .*strict"):  # the kernels are there
        compile_for(b, "cuda", cache=KernelCache(directory, policy="strict"))
    warm = compile_for(b, "cuda", cache=KernelCache(directory, policy="fallback"))
    assert warm.cache_stats["misses"] == 1 and warm.cache_stats["hits"] == len(warm.kernels) + 1
    again = compile_for(b, "cuda", cache=KernelCache(directory, policy="strict"))
    assert again.cache_stats["hits"] == len(again.kernels) + 2 and again.cache_stats["misses"] == 0
    cpu_keys = {k.key for k in compile_for(b, "cpu").kernels}
    assert cpu_keys.isdisjoint(k.key for k in again.kernels)
    for k in again.kernels:
        assert "cuda.jit" in k.source and again.kernel_source(k.pattern.name) == k.source


def test_front_end_solve_and_solve_batch_on_cuda():
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.bif import read_bif

    graph = read_bif(ASIA)
    for semiring in ("prob", "logprob", "sat", "count"):
        # (in the GPU's models' mode, exact: Target.model_exact; the CPU's default regroups
        # sums, so its bits are its own)
        cpu = compile_model(graph, semiring, evidence_vars=["dysp", "xray"], exact=True)
        gpu = compile_model(graph, semiring, evidence_vars=["dysp", "xray"], target="cuda")
        for ev in ({}, {"dysp": "yes"}, {"dysp": "no", "xray": "yes"}):
            a, c = cpu.solve(ev), gpu.solve(ev)
            assert a.log_Z == c.log_Z or (np.isnan(a.log_Z) and np.isnan(c.log_Z)), (semiring, ev)
            for v in a.marginals:
                assert np.array_equal(a.marginals[v], c.marginals[v], equal_nan=True), (semiring, v)
    table = np.array([[0, 1], [1, -1], [-1, 0], [1, 1], [0, 0]], dtype=np.int64)
    cpu = compile_model(graph, "prob", evidence_vars=["dysp", "xray"], buckets=(1, 4), exact=True)
    gpu = compile_model(graph, "prob", evidence_vars=["dysp", "xray"], buckets=(1, 4), target="cuda")
    a, c = cpu.solve_batch(table), gpu.solve_batch(table)
    assert np.array_equal(a.log_Z, c.log_Z)
    for v in a.marginals:
        assert np.array_equal(a.marginals[v], c.marginals[v], equal_nan=True)


def test_command_line_solve_on_cuda(capsys):
    from catbp_jit.cli import main

    assert main(["solve", ASIA, "--observe", "dysp=yes", "--format", "json", "-q"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert main(["solve", ASIA, "--observe", "dysp=yes", "--format", "json", "-q", "--target", "cuda"]) == 0
    got = json.loads(capsys.readouterr().out)
    del got["times"], want["times"]
    # each target's models in its own mode (Target.model_exact): the CPU's regroups sums,
    # within 1e-12 of exact mode's answers (docs/frontend.md), the GPU's is exact mode
    numbers = ("Z", "log_Z", "marginals")
    assert {k: v for k, v in got.items() if k not in numbers} == {
        k: v for k, v in want.items() if k not in numbers
    }
    assert np.isclose(got["Z"], want["Z"], rtol=1e-12, atol=0) and np.isclose(
        got["log_Z"], want["log_Z"], rtol=1e-12
    )
    assert got["marginals"].keys() == want["marginals"].keys()
    for v, p in want["marginals"].items():
        assert np.allclose(got["marginals"][v], p, rtol=1e-12, atol=0), v


UNAVAILABLE = textwrap.dedent("""
    import sys
    if sys.argv[1] == "no-package":  # as if numba-cuda were not installed
        sys.modules["numba_cuda"] = None
    import catbp_jit
    from catbp_jit.bundle import load_bundle
    b = load_bundle(sys.argv[2])
    try:
        catbp_jit.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(),
                          selector_specs=b.selector_specs(), target="cuda")
    except catbp_jit.errors.CudaUnavailableError as e:
        print("REFUSED", e)
""")


@pytest.mark.parametrize(
    "case, env, says",
    [
        ("no-package", {}, "numba-cuda package, which is not installed"),
        ("no-gpu", {"NUMBA_ENABLE_CUDASIM": "0"}, "needs an NVIDIA GPU"),
    ],
)
def test_cuda_unavailable_is_one_clear_error(case, env, says):
    from numba import cuda

    if case == "no-gpu" and os.environ.get("NUMBA_ENABLE_CUDASIM") == "0" and cuda.is_available():
        pytest.skip("a GPU is here: there is no missing GPU to report")
    env = dict(os.environ, **env)
    proc = subprocess.run(
        [sys.executable, "-c", UNAVAILABLE, case, str(shared_dir() / "corpus" / "z4_cycle__prob_float64")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("REFUSED") and says in line, line
    if case == "no-package":
        assert "pip install -e '.[cuda]'" in line


def test_a_numba_cuda_that_cannot_lower_with_this_numpy_is_one_clear_error(monkeypatch):
    """numba-cuda 0.30.4 under numpy 2.5 (seen on a GPU machine) fails when it imports its
    lowering, at the first kernel's compilation: target 'cuda' says so by name first."""
    import importlib.abc

    from numba import config

    from catbp_jit.codegen import cuda_build
    from catbp_jit.errors import CudaUnavailableError

    class Broken(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "numba.cuda.cudaimpl":
                raise AttributeError("module 'numpy' has no attribute 'row_stack'")
            return None

    monkeypatch.delitem(sys.modules, "numba.cuda.cudaimpl", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Broken(), *sys.meta_path])
    monkeypatch.setattr(config, "ENABLE_CUDASIM", False)  # the check is for a real GPU
    with pytest.raises(
        CudaUnavailableError, match=r"numba-cuda \S+ cannot compile kernels with numpy .*row_stack"
    ):
        cuda_build._check_lowering()


def test_command_line_run_on_cuda(capsys):
    from catbp_jit.cli import main

    assert (
        main(["run", str(REPO / "examples" / "grid3_d2__prob_float64"), "--target", "cuda", "--repeat", "1"])
        == 0
    )
    out = capsys.readouterr().out
    assert "target cuda" in out and "expected slots: 62/62 match" in out


def test_aot_for_cuda_then_a_strict_load_compiles_nothing(tmp_path):
    """catbp-jit aot --target cuda fills a cache of its own; a new process under the
    strict policy loads the profile from it (every bucket) without compiling."""
    grid = REPO / "examples" / "grid3_d2__prob_float64"
    profile = tmp_path / "grid.cuda.json"
    env = dict(os.environ, CATBP_JIT_CACHE_DIR=str(tmp_path / "cache"))
    aot = subprocess.run(
        [
            sys.executable,
            "-m",
            "catbp_jit",
            "aot",
            str(grid),
            "--buckets",
            "1,4",
            "--batched-factors",
            "0",
            "--target",
            "cuda",
            "-o",
            str(profile),
            "-q",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert aot.returncode == 0, aot.stderr[-2000:]
    compiled = re.search(r"\b(\d+) kernels \(\1 compiled now, 0 already cached\)", aot.stdout)
    assert compiled, aot.stdout
    assert json.loads(profile.read_text())["target"] == "cuda"
    script = (
        "import catbp_jit as cj, sys\n"
        "exe = cj.load(sys.argv[1])\n"
        "print(exe.largest.target, sum(p.cache_stats.get('hits', 0) for p in exe.profiles.values()))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(profile)],
        env=dict(env, CATBP_JIT_CACHE="strict"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    target, hits = done.stdout.split()
    assert target == "cuda" and int(hits) >= int(compiled.group(1))


def test_drop_in_virtual_machine_on_cuda():
    """CatBP's VirtualMachine API with target="cuda": program by program, slots carried
    over, the CPU drop-in's results bit for bit."""
    b = bundle("grid3_d2__logprob_float64_normalized")
    results = {}
    for target in ("cpu", "cuda"):
        vm = catbp_jit.VirtualMachine(b.semiring_runtime(), target=target)
        for p in b.programs:
            vm.run(p, b.factor_provider, b.selector_provider)
        results[target] = {k: np.array(a) for k, (a, _) in vm.slots.data.items()}
    assert results["cpu"].keys() == results["cuda"].keys()
    for k, a in results["cpu"].items():
        np.testing.assert_allclose(results["cuda"][k], a, rtol=1e-12, atol=0)


def test_kernel_source_and_listing_on_cuda():
    b = bundle("z4_cycle__prob_float64")
    exe = compile_for(b, "cuda")
    text = exe.as_text()
    assert "target cuda" in text and f"kernels ({len(exe.kernels)})" in text
    for i, k in enumerate(exe.kernels):
        assert exe.kernel_source(i) == exe.kernel_source(k.pattern.name) == k.source
        assert "@cuda.jit(cache=True)" in k.source and "def kernel(mem, P, p)" in k.source
    # mode "compiled": the schedule kernel walks the steps (the CPU's dispatcher's part)
    walk = exe.kernel_source("dispatcher")
    assert "def run_steps(mem, P, B, first, last):" in walk and walk == exe.dispatcher_source
    for k, pattern in enumerate(exe.schedule.patterns):
        assert f"  {k}: {pattern.name}\n" in walk
    loop = compile_for(b, "cuda", mode="loop")
    with pytest.raises(KeyError, match="in mode 'loop' has no compiled dispatcher"):
        loop.kernel_source("dispatcher")


# ------------------------------------------------------------------ one launch per run


class Launches:
    """The kernels launched from the host under the simulator, by name and arguments (a
    device function, or a kernel called inside a kernel, is no launch)."""

    def __init__(self, monkeypatch):
        from numba import config

        if not config.ENABLE_CUDASIM:
            pytest.skip("counts the simulator's launches (NUMBA_ENABLE_CUDASIM=1)")
        from numba.cuda.simulator import kernel as sim

        self.calls: list[tuple[str, tuple]] = []
        call = sim.FakeCUDAKernel.__call__

        def spy(kernel, *args):
            if not kernel._device and sim._kernel_context is None:
                self.calls.append((kernel.__name__, args[3:]))  # after mem, P, (B or p)
            return call(kernel, *args)

        monkeypatch.setattr(sim.FakeCUDAKernel, "__call__", spy)

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def chain_model(n: int, target: str):
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.uai import read_uai
    from frontend_helpers import chain_uai

    return compile_model(read_uai(chain_uai(n)), "prob", target=target)


@pytest.mark.slow  # (~8 s: a thousand steps in the simulator, twice)
def test_a_run_of_a_1000_step_program_is_one_launch(monkeypatch):
    """Mode "compiled": sess.run() is one launch of the schedule kernel, whatever the steps;
    its results are the per-step path's (and the CPU's), bit for bit."""
    from catbp_jit.codegen.cuda_run import LaunchOptions

    model = chain_model(202, "cuda")
    exe, values = model.executable, model.built.values
    steps = len(exe.schedule.steps)
    assert steps >= 1000 and exe.mode == "compiled"
    launches = Launches(monkeypatch)
    sess = exe.bind(launch=LaunchOptions(1))  # (the simulator runs a thread as a Python thread)
    got = snapshot(sess.run(factors=values))
    assert launches.names() == ["run_steps"], launches.names()[:5]
    assert sess.launches_per_run == 1
    assert launches.calls[0][1] == (0, steps)  # rows first..last-1: all of them
    again = snapshot(sess.run())
    assert launches.names() == ["run_steps"] * 2
    # the per-step path (a hook asks for it): a launch per step, the same bits
    launches.calls.clear()
    per_step = exe.bind(launch=LaunchOptions(1), after=lambda i, step: None)
    want = snapshot(per_step.run(factors=values))
    assert len(launches.calls) == per_step.launches_per_run and "run_steps" not in launches.names()
    assert steps <= per_step.launches_per_run <= 2 * steps
    assert_same(want, got, "one launch vs a launch per step")
    assert_same(want, again, "second run")
    cpu = chain_model(202, "cpu")
    assert_same(snapshot(cpu.executable.bind().run(factors=cpu.built.values)), got, "cuda vs cpu")


def test_one_launch_starts_at_the_first_dynamic_step(monkeypatch):
    """Partial evaluation: the first run walks every step; a run with other evidence starts
    the schedule kernel at the first dynamic step, and reads the evidence-independent
    results the first run left on the device (the CPU's answers, bit for bit)."""
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.bif import read_bif

    graph = read_bif(ASIA)
    cpu = compile_model(graph, "prob", evidence_vars=["dysp", "xray"], exact=True)  # (the GPU's mode)
    gpu = compile_model(graph, "prob", evidence_vars=["dysp", "xray"], target="cuda")
    exe = gpu.executable
    n_static, steps = exe.plan.n_static, len(exe.schedule.steps)
    assert 0 < n_static < steps
    launches = Launches(monkeypatch)
    for evidence in ({"dysp": "yes"}, {"dysp": "no", "xray": "yes"}, {}):
        want, got = cpu.solve(evidence), gpu.solve(evidence)
        assert got.log_Z == want.log_Z, evidence
        for var in want.marginals:
            assert np.array_equal(got.marginals[var], want.marginals[var]), (evidence, var)
    walks = [args for name, args in launches.calls if name == "run_steps"]
    assert walks == [(0, steps), (n_static, steps), (n_static, steps)]
    # each solve: its answers gathered on the device, one launch (and one copy back)
    assert launches.names() == ["run_steps", "gather"] * 3


def test_hooks_and_loop_mode_launch_each_step(monkeypatch):
    """before/after hooks see every step: such a session launches them one by one, as mode
    "loop" does; both give the one-launch bits."""
    b = bundle("z4_cycle__prob_float64_normalized")
    f, s = inputs(b)
    one = snapshot(compile_for(b, "cuda").bind().run(factors=f, selectors=s))
    launches = Launches(monkeypatch)
    seen: list[int] = []
    hooked = compile_for(b, "cuda").bind(before=lambda i, step: seen.append(i))
    assert_same(one, snapshot(hooked.run(factors=f, selectors=s)), "hooked")
    loop_exe = compile_for(b, "cuda", mode="loop")
    assert loop_exe.dispatcher is None
    assert_same(one, snapshot(loop_exe.bind().run(factors=f, selectors=s)), "loop mode")
    steps = len(loop_exe.schedule.steps)
    assert seen == list(range(steps)) and "run_steps" not in launches.names()
    assert len(launches.calls) >= 2 * steps


def test_answers_are_gathered_on_the_device_in_one_copy():
    """CudaSession.gatherer: the executable's gather kernel reads many slots' elements on
    the device into one buffer, copied back at once; the same values as reading the slots."""
    b = bundle("z4_cycle__prob_float64_normalized")
    f, s = inputs(b)
    exe = compile_for(b, "cuda")
    assert exe.gather is not None
    sess = exe.bind()
    index = np.concatenate(
        [np.arange(bd.offset, bd.offset + bd.size) for bd in exe.plan.bindings if bd.kind == "result"]
    )
    gather = sess.gatherer(index[::-1])
    out = sess.run(factors=f, selectors=s)
    got = gather().copy()
    want = np.concatenate([np.ravel(out[bd.ident][0]) for bd in exe.plan.bindings if bd.kind == "result"])
    assert np.array_equal(got, want[::-1], equal_nan=True)
    with pytest.raises(ValueError, match="outside the arena"):
        sess.gatherer(np.array([exe.memory.total + 1]))


def test_a_batched_run_reads_back_only_the_slots_asked_for(monkeypatch):
    """BatchedSession.run(read=keys): those slots alone, gathered on the device into one
    copy per run (a chunk past the largest bucket: one per chunk), the same values as a run
    that reads everything; an unknown key is refused before anything runs."""
    b = bundle("z4_cycle__prob_float64_normalized")
    f, s = inputs(b)
    fid = sorted(f)[0]
    rows = np.random.default_rng(5).uniform(0.1, 2.0, (11,) + f[fid].shape)
    kw = dict(batched_factors={fid}, buckets=(1, 4))
    everything = compile_for(b, "cuda", **kw).bind()
    sess = compile_for(b, "cuda", **kw).bind()
    keys = sorted(everything.slot_specs)[:2]
    launches = Launches(monkeypatch)
    for n in (3, 11):  # one bucket; three chunks of the largest
        given = {**f, fid: np.ascontiguousarray(rows[:n])}
        want = snapshot(everything.run(factors=given, selectors=s))
        launches.calls.clear()
        got = snapshot(sess.run(factors=given, selectors=s, read=keys))
        assert sorted(got) == keys
        assert_same({k: want[k] for k in keys}, got, f"{n} rows")
        runs = -(-n // 4)
        assert launches.names() == ["run_steps", "gather"] * runs, launches.names()
    with pytest.raises(catbp_jit.errors.UnknownInputError, match="no slot .*'nope'"):
        sess.run(factors={**f, fid: np.ascontiguousarray(rows[:2])}, selectors=s, read=[("nope",)])


def test_a_schedule_kernel_that_cannot_compile_falls_back_to_launches_per_step(tmp_path):
    """A toolkit that cannot link the grid sync (no cudadevrt): one warning naming why, and
    every step launched from Python, with the same bits."""
    from catbp_jit.errors import CudaScheduleWarning

    class NoGridSync(KernelCache):  # the cache compiles: it refuses the schedule kernel
        def get(self, identity, source, entry, **kw):
            if identity.get("template") == "cuda_schedule":
                raise RuntimeError("libcudadevrt.a not found")
            return super().get(identity, source, entry, **kw)

    b = bundle("z4_cycle__prob_float64_normalized")
    f, s = inputs(b)
    want = snapshot(compile_for(b, "cuda").bind().run(factors=f, selectors=s))
    with pytest.warns(
        CudaScheduleWarning, match="RuntimeError: libcudadevrt.a not found.*launched from Python"
    ):
        exe = compile_for(b, "cuda", cache=NoGridSync(str(tmp_path / "cache")))
    assert exe.mode == "compiled" and exe.dispatcher is None
    sess = exe.bind()
    assert sess.launches_per_run == len(exe.schedule.steps) + sum(
        st.pattern.normalize for st in exe.schedule.steps
    )
    assert_same(want, snapshot(sess.run(factors=f, selectors=s)), "per step after the fallback")
