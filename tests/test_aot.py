"""catbp-jit aot: compile ahead of time, then a strict cache in a new process compiles nothing."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from catbp_jit.aot import kernel_units
from catbp_jit.bundle import load_bundle
from catbp_jit.cli import main
from conftest import REPO

GRID = REPO / "examples" / "grid3_d2__prob_float64"
ASIA = REPO / "examples" / "asia.bif"

# Run in a new process under a strict cache: every bucket of the saved profile, each
# row compared bit for bit with an unbatched run of that row.
STRICT_RUN = """
import sys, numpy as np, catbp_jit as cj
from catbp_jit.bundle import load_bundle
b = load_bundle(sys.argv[1])
exe = cj.load(sys.argv[2])
plain = cj.compile(b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(),
                   selector_specs=b.selector_specs()).bind()
sess = exe.bind()
f = {i: np.ascontiguousarray(a, dtype=b.dtype) for i, (a, _) in b.factors.items()}
sel = {i: np.ascontiguousarray(a, dtype=b.dtype) for i, (a, _) in b.selectors.items()}
rng = np.random.default_rng(0)
for n in (1, 3, 8, 9):
    rows = {i: f[i][None] * rng.uniform(0.5, 2.0, (n,) + f[i].shape) for i in (0, 1)}
    got = {k: np.array(v) for k, (v, _) in sess.run(factors={**f, **rows}, selectors=sel).items()}
    for r in range(n):
        want = plain.run(factors={**f, 0: rows[0][r], 1: rows[1][r]}, selectors=sel)
        for k, (v, _) in want.items():
            assert np.array_equal(got[k][r] if k in sess.batched_slots else got[k], v), (n, r, k)
print("ok", exe.buckets, sum(p.cache_stats.get("compiled", 0) for p in exe.profiles.values()))
"""


def strict_env():
    return dict(os.environ, CATBP_JIT_CACHE="strict")


@pytest.mark.slow  # (~15 s: every bucket's kernels, then a process that loads them)
def test_aot_then_a_strict_run_of_every_bucket_compiles_nothing(tmp_path, capsys):
    profile = tmp_path / "grid.profile.json"
    assert (
        main(["aot", str(GRID), "--buckets", "1,8", "--batched-factors", "0,1", "-o", str(profile), "-q"])
        == 0
    )
    out = capsys.readouterr().out
    # every unit the planner names (batch 8 adds reductions vectorized across outputs,
    # plan/loops.py, which contract_lines computes: schedule.in_lines), and the dispatcher
    b = load_bundle(GRID)
    units = kernel_units(
        b.programs,
        b.semiring_runtime(),
        factor_specs=b.factor_specs(),
        selector_specs=b.selector_specs(),
        batched_factors=(0, 1),
        buckets=(1, 8),
    )
    assert "contract_lines_prob_float64_reduce" in {u.name for u in units}
    assert f"grid3_d2__prob_float64: {len(units)} kernels" in out and "buckets 1,8" in out
    assert json.loads(profile.read_text())["buckets"] == [1, 8]
    done = subprocess.run(
        [sys.executable, "-c", STRICT_RUN, str(GRID), str(profile)],
        env=strict_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ok", "(1,", "8)", "0"]


@pytest.mark.slow  # (~13 s: a model's three buckets, then a process that loads them)
def test_aot_of_a_model_covers_solve_and_solve_batch_under_strict(tmp_path, capsys):
    profile = tmp_path / "asia.profile.json"
    assert main(["aot", str(ASIA), "--evidence-vars", "dysp,smoke", "-o", str(profile), "-q"]) == 0
    assert "buckets 1,64,1024" in capsys.readouterr().out
    # the profile names its model, so that catbp_jit.dask can compile it on workers
    entry = json.loads(profile.read_text())["model"]
    assert entry["sha256"] == hashlib.sha256(ASIA.read_bytes()).hexdigest()
    assert (entry["evidence_vars"], entry["buckets"]) == (["dysp", "smoke"], [1, 64, 1024])
    script = (
        "from catbp_jit.frontend import compile_model\n"
        "from catbp_jit.frontend.bif import read_bif\n"
        f"m = compile_model(read_bif({str(ASIA)!r}), 'prob', evidence_vars=['dysp', 'smoke'],"
        " buckets=(1, 64, 1024))\n"
        "r = m.solve_batch([{'dysp': 'yes'}, {'smoke': 'no'}])\n"
        "print(round(float(m.solve({'dysp': 'yes'}).log_Z - r.log_Z[0]), 12))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=strict_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() in ("0.0", "-0.0")


def test_kernel_units_cover_every_bucket_and_the_unbatched_plan():
    b = load_bundle(GRID)
    units = kernel_units(
        b.programs,
        b.semiring_runtime(),
        factor_specs=b.factor_specs(),
        selector_specs=b.selector_specs(),
        batched_factors=(0, 1),
        buckets=(1, 8),
    )
    names = [u.name for u in units]
    assert names.count("dispatcher") == 1 and len(names) == len(
        set(u.name + u.identity.get("source_sha256", "") for u in units)
    )
    plain = kernel_units(
        b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(), selector_specs=b.selector_specs()
    )
    assert {u.name for u in plain} <= set(names)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--buckets", "1,x"], "--buckets must be comma-separated integers"),
        (["--batched-factors", "999"], "no factor spec for id(s) [999]"),
    ],
)
def test_aot_errors_are_one_line(tmp_path, capsys, argv, message):
    code = main(["aot", str(GRID), *argv, "-o", str(tmp_path / "p.json"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_aot_of_something_that_is_no_input(tmp_path, capsys):
    code = main(["aot", str(tmp_path / "missing.uai"), "-q"])
    assert code == 2 and "missing.uai" in capsys.readouterr().err


def test_a_failed_aot_leaves_the_old_profile(tmp_path, capsys, monkeypatch):
    from catbp_jit.frontend import model_source

    profile = tmp_path / "asia.profile.json"
    profile.write_text("the user's old profile")

    def disk_full(path, entry):  # the model entry is the profile's last write
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(model_source, "add_profile_entry", disk_full)
    code = main(["aot", str(ASIA), "--evidence-vars", "dysp", "--buckets", "1", "-o", str(profile), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and err.count("\n") == 1
    assert profile.read_text() == "the user's old profile"
    assert [p.name for p in tmp_path.iterdir()] == [profile.name]


def test_a_failed_save_leaves_no_temporary_file(tmp_path, monkeypatch):
    import catbp_jit as cj

    b = load_bundle(GRID)
    exe = cj.compile(
        b.programs, b.semiring_runtime(), factor_specs=b.factor_specs(), selector_specs=b.selector_specs()
    )
    path = tmp_path / "exe.json"
    path.write_text("old")

    def half(doc, f):
        f.write('{"format": ')
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(json, "dump", half)
    with pytest.raises(OSError, match="No space left"):
        exe.save(path)
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["exe.json"]


def test_aot_plans_every_bucket_once():
    """compile_ahead plans the unbatched program and each bucket once, and builds the
    executable from those plans (counted: calls of the planner)."""
    import cProfile
    import pstats

    from catbp_jit.aot import compile_ahead

    b = load_bundle(GRID)
    profile = cProfile.Profile()
    profile.enable()
    exe, report = compile_ahead(
        b.programs,
        b.semiring_runtime(),
        factor_specs=b.factor_specs(),
        selector_specs=b.selector_specs(),
        batched_factors=(0, 1),
        buckets=(1, 8),  # (kernels from the suite's cache; cold ones in worker processes)
    )
    profile.disable()
    stats = pstats.Stats(profile)
    planned = sum(
        row[1] for (path, _, fn), row in stats.stats.items() if fn == "plan" and path.endswith("pipeline.py")
    )
    assert planned == 1 + 2, planned  # the unbatched program, then buckets 1 and 8
    assert exe.buckets == (1, 8) and report.kernels >= len(exe.largest.kernels) + 1
