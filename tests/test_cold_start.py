"""Cold start: what a first run compiles, and compiling it in worker processes.

Uses the example bundle that ships with the repository (README command 1), in cache
directories of its own: one filled in compiled mode in this process, one filled in loop
mode by worker processes.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

import catbp_jit
from catbp_jit.bundle import load_bundle
from catbp_jit.cache import KernelCache
from catbp_jit.codegen import cpu_build
from catbp_jit.codegen import workers as workers_mod
from catbp_jit.codegen.loader import CompileUnit
from catbp_jit.codegen.workers import KernelCompileError, WorkerOptions, compile_in_workers
from catbp_jit.environment import EnvironmentSettingError
from jit_helpers import inputs

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "grid3_d2__prob_float64"


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(str(EXAMPLE))


def compile_into(bundle, directory, mode, workers, policy="fallback", progress=None):
    return catbp_jit.compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        mode=mode,
        cache=KernelCache(str(directory), policy),
        workers=workers,
        progress=progress,
    )


def results(exe, bundle):
    factors, selectors = inputs(bundle)
    slots = exe.bind().run(factors=factors, selectors=selectors)
    return {key: view.copy() for key, (view, _) in slots.items()}


class Filled(NamedTuple):
    directory: Path
    exe: catbp_jit.Executable
    progress: list[str]


@pytest.fixture(scope="module")
def serial(bundle, tmp_path_factory):
    """Compiled mode, everything compiled in this process."""
    directory = tmp_path_factory.mktemp("serial_cache")
    return Filled(directory, compile_into(bundle, directory, "compiled", workers=0), [])


@pytest.fixture(scope="module")
def parallel(bundle, tmp_path_factory):
    """Loop mode, cold kernels compiled by this process and one worker process."""
    if workers_mod.available_cpus() < 2:
        pytest.skip("one CPU: kernels compile in this process only")
    directory = tmp_path_factory.mktemp("parallel_cache")
    lines = []
    exe = compile_into(bundle, directory, "loop", workers=2, progress=lines.append)
    return Filled(directory, exe, lines)


def test_a_cold_compile_compiles_each_function_once(serial):
    """Per kernel its one entry (its chunk function is inlined), plus the dispatcher and
    the one callee it compiles apart (walk_tracks: inlined at its call sites, it made the
    dispatcher's cold compile 2 s longer): no loop-mode-only entry point, no second
    specialization of a callee (a literal argument once made Numba compile every chunk
    function twice), no second (parallel) variant of a kernel for the steps that are cut
    in chunks."""
    exe = serial.exe
    assert not any(k.pattern.parallel for k in exe.kernels)
    assert exe.cache_stats["misses"] == len(exe.kernels) + 1, exe.cache_stats
    assert exe.cache_stats["compiled"] == len(exe.kernels) + 2, exe.cache_stats
    module = sys.modules[exe.dispatcher.py_func.__module__]
    functions = {name: getattr(fn, "overloads", None) for name, fn in vars(module).items()}
    compiled = {name: list(sigs) for name, sigs in functions.items() if sigs}
    assert sorted(compiled) == ["run_schedule", "walk_tracks"], compiled
    assert all(len(sigs) == 1 for sigs in compiled.values()), compiled
    for k in exe.kernels:
        module = sys.modules[k.entry.py_func.__module__]
        compiled = {
            name: list(fn.overloads)
            for name, fn in vars(module).items()
            if hasattr(fn, "overloads") and fn.overloads
        }
        assert sorted(compiled) == ["kernel"], (k.pattern.name, compiled)
        assert all(len(sigs) == 1 for sigs in compiled.values()), (k.pattern.name, compiled)
        assert k.address and k.address == int(exe.kernel_addresses[exe.kernels.index(k)])


def test_other_mode_needs_nothing_compiled_even_strict(serial, bundle):
    exe = serial.exe
    loop = compile_into(bundle, serial.directory, "loop", workers=0, policy="strict")
    assert loop.cache_stats["compiled"] == 0 and loop.cache_stats["misses"] == 0, loop.cache_stats
    want, got = results(exe, bundle), results(loop, bundle)
    assert want.keys() == got.keys()
    for key in want:
        assert want[key].tobytes() == got[key].tobytes(), key
    z = want[("Z",)]
    assert np.isclose(z, bundle.expected_slots[("Z",)][0], rtol=1e-12, atol=0).all()


def test_parallel_compile_gives_the_same_kernels_and_bits(serial, parallel, bundle):
    exe, par = serial.exe, parallel.exe
    assert par.cache_stats["compiled_in_workers"] >= 1, par.cache_stats
    assert par.cache_stats["misses"] == len(par.kernels) + 1, par.cache_stats
    assert [k.key for k in par.kernels] == [k.key for k in exe.kernels]
    compiled_lines = [line for line in parallel.progress if line.startswith("compiled ")]
    for name in [k.pattern.name for k in par.kernels] + ["dispatcher"]:  # one line each
        assert sum(line.split()[1] == name for line in compiled_lines) == 1, (name, compiled_lines)
    want, got = results(exe, bundle), results(par, bundle)
    for key in want:
        assert want[key].tobytes() == got[key].tobytes(), key


STRICT_CHILD = textwrap.dedent("""
    import json, sys
    import catbp_jit
    from catbp_jit.bundle import load_bundle
    from catbp_jit.cache import KernelCache
    b = load_bundle(sys.argv[1])
    cache = KernelCache(sys.argv[2], "strict")
    exe = catbp_jit.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(),
                            selector_specs=b.selector_specs(), mode=sys.argv[3], cache=cache)
    f = {k: a for k, (a, _) in b.factors.items()}
    s = {k: a for k, (a, _) in b.selectors.items()}
    z = exe.bind().run(factors=f, selectors=s)[("Z",)][0]
    print(json.dumps({"stats": cache.stats, "Z": float(z)}))
""")


def test_no_workers_for_a_cache_directory_that_cannot_be_written(tmp_path, monkeypatch):
    # Workers hand their kernels over through the disk: with no disk to share, a worker
    # would compile in vain (and this process again), so this process compiles alone.
    # (That such a compile still answers: test_hostile_input's unusable cache directories.)
    if workers_mod.available_cpus() < 2:
        pytest.skip("one CPU: kernels compile in this process only")
    pools = []
    monkeypatch.setattr(cpu_build, "compile_in_workers", lambda units, cache, n, done: pools.append(n) or 0)
    units = [tiny_unit(c) for c in range(3)]
    writable = KernelCache(str(tmp_path / "cache"))
    said: list[str] = []
    assert cpu_build._compile_cold_in_workers(units, writable, WorkerOptions(2), said.append) == 0
    assert pools == [2], said  # three cold kernels, two CPUs: a pool (the case below differs in one thing)
    blocker = tmp_path / "file"
    blocker.write_text("")
    blocked = KernelCache(str(blocker))
    assert cpu_build._compile_cold_in_workers(units, blocked, WorkerOptions(2), said.append) == 0
    assert pools == [2] and len(said) == 1 and blocked.bypassed, (said, blocked.bypassed)


@pytest.mark.parametrize("filled_by, mode", [("serial", "loop"), ("parallel", "compiled")])
def test_a_cache_filled_in_one_mode_serves_the_other_strict_in_a_new_process(
    filled_by, mode, request, bundle
):
    """What an ahead-of-time fill promises: a later process under CATBP_JIT_CACHE=strict
    compiles nothing, whichever mode filled the cache and whichever it runs."""
    directory, exe, _ = request.getfixturevalue(filled_by)
    env = {k: v for k, v in os.environ.items() if k != "CATBP_JIT_CACHE"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    proc = subprocess.run(
        [sys.executable, "-c", STRICT_CHILD, str(EXAMPLE), str(directory), mode],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["stats"]["compiled"] == 0 and out["stats"]["misses"] == 0, out["stats"]
    assert out["Z"] == float(results(exe, bundle)[("Z",)])


def broken_unit(name, source):
    return CompileUnit(name, {"template": "test_broken", "name": name}, source, "kernel", "(int64,)")


def test_failures_name_every_kernel(tmp_path):
    units = [broken_unit(f"broken_k{i}", f"raise RuntimeError('broken on purpose {i}')\n") for i in range(3)]
    with pytest.raises(KernelCompileError) as info:
        compile_in_workers(units, KernelCache(str(tmp_path)), 2)
    msg = str(info.value)
    assert "kernel broken_k0" in msg and "RuntimeError: broken on purpose 0" in msg, msg
    assert "broken_k1" in msg and "broken_k2" in msg, msg


def test_a_worker_that_dies_is_reported_with_its_status(tmp_path):
    # Exits only inside a worker (workers run with CATBP_JIT_COMPILE_WORKERS=0).
    source = "import os\nif os.environ.get('CATBP_JIT_COMPILE_WORKERS') == '0':\n    os._exit(3)\n"
    worker = workers_mod._Worker(str(tmp_path))
    try:
        reply = worker.compile(broken_unit("dies_k1", source))
    finally:
        worker.close()
    assert not reply["ok"] and "exited with status 3" in reply["error"], reply


def test_worker_options(monkeypatch):
    monkeypatch.setenv(workers_mod.ENV, "3")
    assert WorkerOptions.resolve().workers == 3
    assert WorkerOptions.resolve(0).workers == 0  # an explicit value wins
    monkeypatch.setenv(workers_mod.ENV, "many")
    with pytest.raises(EnvironmentSettingError, match=workers_mod.ENV):
        WorkerOptions.resolve()
    monkeypatch.delenv(workers_mod.ENV)
    assert WorkerOptions.resolve().workers == workers_mod.available_cpus()
    with pytest.raises(ValueError):
        WorkerOptions.resolve(-1)
    assert WorkerOptions(8).pool_size(1) == 0  # one cold kernel: no worker is worth starting
    assert WorkerOptions(1).pool_size(10) == 0
    cpus = workers_mod.available_cpus()
    assert WorkerOptions(8).pool_size(10) == (min(8, cpus) if cpus > 1 else 0)


def test_cli_reports_a_bad_worker_count_in_one_line(monkeypatch, capsys):
    from catbp_jit.cli import main

    monkeypatch.setenv(workers_mod.ENV, "two")
    assert main(["run", str(EXAMPLE)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and workers_mod.ENV in err and "'two'" in err, err


def tiny_unit(c):
    source = f"import numba\n\n\n@numba.njit(cache=True)\ndef kernel(a):\n    return a + {c}\n"
    return CompileUnit(f"tiny_{c}", {"template": "test_tiny", "c": c}, source, "kernel", "(int64,)")


def test_no_worker_can_start_then_this_process_compiles_everything(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no_such_python"))
    cache = KernelCache(str(tmp_path / "cache"))
    units = [tiny_unit(c) for c in range(3)]
    assert compile_in_workers(units, cache, 2) == 0  # nothing compiled by a worker
    assert all(cache.check(u.identity, u.source)[0] == "ok" for u in units)
