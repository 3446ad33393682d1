"""Every JSON reader refuses hostile JSON with one error (found by perf/hostile_fuzz.py): a
number of 10^6 digits is a ValueError that is no JSONDecodeError, and arrays nested 10^5
deep a RecursionError."""

import shutil
from pathlib import Path

import pytest

from catbp_jit.cli import main
from catbp_jit.executable import SavedExecutableError, load
from catbp_jit.frontend.graph import FactorGraphError
from catbp_jit.frontend.model_source import model_source

REPO = Path(__file__).resolve().parents[1]
ASIA = str(REPO / "examples" / "asia.bif")
BUNDLE = REPO / "examples" / "grid3_d2__prob_float64"
HOSTILE = [b'{"format": ' + b"9" * 10**6 + b"}", b"[" * 10**5]


@pytest.mark.parametrize("content", HOSTILE, ids=["long number", "deep nesting"])
def test_saved_executables_and_profiles(tmp_path, content):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    with pytest.raises(SavedExecutableError, match="not JSON"):
        load(path)
    with pytest.raises(FactorGraphError, match="not JSON"):
        model_source(path)


@pytest.mark.parametrize("content", HOSTILE, ids=["long number", "deep nesting"])
def test_bundles_and_json_evidence_on_the_command_line(tmp_path, capsys, content):
    path = tmp_path / "x.json"
    path.write_bytes(content)
    (tmp_path / "b").mkdir()
    shutil.copy(BUNDLE / "arrays.npz", tmp_path / "b")
    (tmp_path / "b" / "bundle.json").write_bytes(content)
    for argv in (["list", str(tmp_path / "b")],
                 ["solve", ASIA, "--evidence", str(path), "--target", "reference", "-q"]):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "not valid JSON" in err and len(err.splitlines()) == 1, err
