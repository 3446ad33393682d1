"""The catbp-jit command line: run, list, exit statuses and error reporting."""

import subprocess
import sys

import numpy as np
import pytest

from catbp_jit.bundle import load_bundle, save_bundle
from catbp_jit.cli import compare_slot, main

from conftest import CORPUS, REPO, shared_dir

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


@pytest.mark.parametrize("d", CORPUS, ids=IDS)
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


@pytest.mark.parametrize("argv", [[], ["run"], ["frobnicate"],
                                  ["run", "x", "--engine", "nonesuch"],
                                  ["run", "x", "--repeat", "many"]])
def test_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "usage" in capsys.readouterr().err


def test_repeat_must_be_positive(capsys):
    assert main(["run", str(corpus("z4_cycle__sat_bool")), "--repeat", "0"]) == 2
    assert "--repeat" in capsys.readouterr().err


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
    r = subprocess.run([sys.executable, "-m", "catbp_jit", "run", str(d), "--repeat", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "match" in r.stdout
