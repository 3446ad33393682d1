"""The catbp-jit command line: run, list, exit statuses and error reporting."""

import os
import subprocess
import sys

import numpy as np
import pytest

from catbp_jit.bundle import load_bundle, save_bundle
from catbp_jit.cli import compare_slot, main
from conftest import CORPUS, REPO, corpus_sample, shared_dir

IDS = [p.name for p in CORPUS]


def corpus(name):
    d = shared_dir() / "corpus" / name
    if not (d / "bundle.json").exists():
        pytest.skip(f"corpus bundle {name} not present")
    return d


def test_run_prints_summary(capsys, monkeypatch):
    # (no progress lines on stderr, which a cold compile past 2 s would print)
    monkeypatch.setenv("CATBP_JIT_PROGRESS_AFTER", "3600")
    d = corpus("grid3_d2__prob_float64")
    n = len(load_bundle(d).expected_slots)
    assert main(["run", str(d), "--repeat", "2"]) == 0
    out, err = capsys.readouterr()
    assert "grid3_d2__prob_float64" in out
    assert "PROB (float64)" in out
    assert "Z:" in out and "0.00717976729381" in out
    assert f"slots:     {n}" in out
    assert "best" in out and "median" in out and "over 2 runs" in out
    assert f"expected slots: {n}/{n} match" in out
    assert err == ""


@pytest.mark.parametrize("d", corpus_sample())
def test_run_every_corpus_bundle_matches(d, capsys):
    assert main(["run", str(d), "--repeat", "1", "--quiet"]) == 0
    assert capsys.readouterr().out == ""  # --quiet prints nothing when all match


def test_run_zero_Z_logprob(capsys):
    assert main(["run", str(corpus("hard_cycle5_d4__logprob_float64")), "--repeat", "1"]) == 0
    assert "Z:         -inf" in capsys.readouterr().out


def test_run_mismatch_exits_1(tmp_path, capsys):
    b = load_bundle(corpus("z4_cycle__prob_float64"))
    arr, spec = b.expected_slots[("Z",)]
    b.expected_slots[("Z",)] = (arr * (1 + 1e-6), spec)  # beyond rtol 1e-9
    d = save_bundle(b, tmp_path / "bad")
    assert main(["run", str(d), "--repeat", "1", "--quiet"]) == 1
    out = capsys.readouterr().out
    n = len(b.expected_slots)
    assert f"expected slots: {n - 1}/{n} match" in out
    assert "('Z',)" in out and "max abs diff" in out


def test_compare_slot_tolerances():
    a = np.array([1.0, 2.0, np.nan])
    assert compare_slot(a * (1 + 1e-12), a, np.dtype("float64")) is None
    assert compare_slot(a * (1 + 1e-7), a, np.dtype("float64")) is not None
    f32 = a.astype(np.float32)
    assert compare_slot(f32 * np.float32(1 + 1e-6), f32, np.dtype("float32")) is None
    assert compare_slot(np.array([-np.inf]), np.array([-np.inf]), np.dtype("float64")) is None
    i = np.array([1, 2], dtype=np.int64)
    assert compare_slot(i, i, np.dtype("int64")) is None
    assert "1 of 2" in compare_slot(i + [0, 1], i, np.dtype("int64"))
    assert "shape" in compare_slot(i[:1], i, np.dtype("int64"))


def test_missing_directory_exits_2(tmp_path, capsys):
    missing = tmp_path / "no_such_bundle"
    assert main(["run", str(missing)]) == 2
    out, err = capsys.readouterr()
    assert "no_such_bundle" in err and "does not exist" in err
    assert "Traceback" not in err and out == ""


def test_bad_bundle_exits_2(tmp_path, capsys):
    (tmp_path / "bundle.json").write_text('{"format": "catbp-bundle", "version": 7}')
    (tmp_path / "arrays.npz").write_bytes(b"")
    assert main(["run", str(tmp_path)]) == 2
    assert "version 7" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [[], ["run"], ["frobnicate"], ["run", "x", "--engine", "nonesuch"], ["run", "x", "--repeat", "many"]],
)
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "usage" in capsys.readouterr().err


def test_repeat_must_be_positive(capsys):
    assert main(["run", str(corpus("z4_cycle__sat_bool")), "--repeat", "0"]) == 2
    assert "--repeat" in capsys.readouterr().err


GRID = REPO / "examples" / "grid3_d2__prob_float64"
ASIA = REPO / "examples" / "asia.bif"


@pytest.mark.parametrize(
    "argv, message",
    [
        # a bundle has its own semiring and batches its factor ids
        (
            ["aot", GRID, "--semiring", "logprob", "--evidence-vars", "x", "-o", "OUT"],
            "--semiring, --evidence-vars: for a model only; ",
        ),
        (["aot", GRID, "--semiring", "prob", "-o", "OUT"], "--semiring: for a model only"),
        (
            ["aot", GRID, "--buckets", "1,8", "-o", "OUT"],
            "--buckets: there is no batch axis to plan them for; give --batched-factors or "
            "--batched-selectors",
        ),
        # a model batches its evidence variables
        (["aot", ASIA, "--batched-factors", "1", "-o", "OUT"], "--batched-factors: for a bundle only"),
        (["aot", ASIA, "--batched-selectors", "0", "-o", "OUT"], "--batched-selectors: for a bundle"),
        (
            ["aot", ASIA, "--buckets", "1,8", "-o", "OUT"],
            "--buckets: there is no batch axis to plan them for; give --evidence-vars",
        ),
        # solve: -o writes an evidence table's posteriors, --format one model's answer
        (
            ["solve", ASIA, "--observe", "dysp=yes", "-o", "OUT"],
            "-o/--output applies to --evidence-table only",
        ),
        (
            ["solve", ASIA, "--evidence-table", "T.csv", "--format", "text", "-o", "OUT"],
            "--format does not apply",
        ),
        # the numpy tier stands in for CPU kernels only
        (["run", GRID, "--target", "cuda", "--tier", "auto"], "--tier applies to the CPU target"),
        # an output that is a directory: said before the work, not after
        (["aot", ASIA, "-o", "DIR"], "is a directory; the profile is a file"),
        (["solve", ASIA, "--evidence-table", "T.csv", "-o", "DIR"], "Is a directory, not a file"),
    ],
)
def test_options_that_do_not_apply_are_refused(tmp_path, capsys, argv, message):
    (tmp_path / "T.csv").write_text("dysp\nyes\n")
    out = tmp_path / "out.json"
    (tmp_path / "DIR").mkdir()
    names = {"OUT": out, "T.csv": tmp_path / "T.csv", "DIR": tmp_path / "DIR"}
    code = main([str(names.get(a, a)) for a in argv] + ["-q"])
    _, err = capsys.readouterr()
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["DIR", "T.csv"]


def test_help_exits_0(capsys):
    assert main(["run", "--help"]) == 0
    assert "--engine" in capsys.readouterr().out


def test_list(capsys):
    pytest.importorskip("catbp_jit.ir.text")
    d = corpus("z4_cycle__prob_float64")
    assert main(["list", str(d)]) == 0
    out = capsys.readouterr().out
    for name in ("upward", "downward", "finalize"):
        assert name in out
    assert "CONTRACT" in out


def test_python_dash_m():
    d = corpus("z4_cycle__sat_bool")
    r = subprocess.run(
        [sys.executable, "-m", "catbp_jit", "run", str(d), "--repeat", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "match" in r.stdout


@pytest.mark.parametrize("option", [["--mode", "loop"], ["--target", "cpu"], ["--tier", "auto"]])
def test_jit_options_refused_with_the_reference_engine(option, capsys):
    d = corpus("z4_cycle__sat_bool")
    assert main(["run", str(d), "--engine", "reference", *option]) == 2
    assert f"{option[0]} apply to the jit engine only" in capsys.readouterr().err


def test_run_cold_answers_from_numpy_then_checks_the_kernels(tmp_path):
    """A cold cache under --tier auto: the first runs come from the numpy tier, then the run
    waits for the kernels, runs with them and finds the same bits. A new process: this one
    holds kernels in memory that other tests loaded."""
    env = {k: v for k, v in os.environ.items() if k != "CATBP_JIT_TIER"}
    env["CATBP_JIT_CACHE_DIR"] = str(tmp_path / "cold")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "catbp_jit",
            "run",
            str(corpus("z4_cycle__sat_bool")),
            "--tier",
            "auto",
            "--repeat",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=str(REPO),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "jit:       ready in" in done.stdout and "tier:      numpy" in done.stdout
    assert "compiled:  kernels ready" in done.stdout and "gave the same bits" in done.stdout


def test_an_error_is_one_bounded_line_whatever_its_message(capsys):
    """Errors from the front end's commands (paths, --observe values) are not CatbpErrors
    and were not clipped: the command line itself keeps every error to one short line."""
    name = "x" * 100_000 + "\nsecond line"
    assert main(["run", name]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 1200 and "characters" in err
