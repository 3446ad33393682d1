"""Saved executables, profiles, bundles and JSON evidence refuse hostile JSON with one error
(found by perf/hostile_fuzz.py): a number of 10^6 digits is a ValueError that is no
JSONDecodeError, arrays nested 10^5 deep a RecursionError, and a saved program that does
not check is a SavedExecutableError naming the file."""

import shutil
from pathlib import Path

import pytest

from catbp_jit.cli import main
from catbp_jit.compiler import load
from catbp_jit.executable import SavedExecutableError
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
    for argv in (
        ["list", str(tmp_path / "b")],
        ["solve", ASIA, "--evidence", str(path), "--target", "reference", "-q"],
    ):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and "not valid JSON" in err and len(err.splitlines()) == 1, err


def test_a_saved_executable_whose_program_does_not_check_names_the_file(tmp_path):
    import json

    from catbp_jit.executable import SAVE_FORMAT

    doc = {
        "format": SAVE_FORMAT,
        "version": 1,
        "semiring": "PROB",
        "dtype": "float64",
        "mode": "compiled",
        "target": "cpu",
        "factor_specs": {},
        "selector_specs": {},
        "slot_specs": [],
        "programs": [
            {"name": "p", "instructions": [{"op": "STORE_SLOT", "args": {"src": 8, "slot": ["x"]}}]}
        ],
    }
    path = tmp_path / "exe.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(
        SavedExecutableError,
        match=r"exe.json': program 'p', instruction \[0\] "
        "STORE_SLOT, operand src: register r8 is used "
        "before it is defined",
    ):
        load(path)
