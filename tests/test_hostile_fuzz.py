"""perf/hostile_fuzz.py, briefly: 200 hostile cases over every reader, none may fail.

The full run (`python perf/hostile_fuzz.py --count 10000`) is for outside CI; this one
keeps the readers from regressing (about 30 s: most of it the `catbp-jit aot` that makes
the saved profile)."""

import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # (~10 s; tests/test_hostile_input.py keeps the readers' cases in the default run)
def test_two_hundred_hostile_cases_fail_nowhere(tmp_path, monkeypatch):
    # imported by name: its worker processes (spawned) import it again from sys.path
    monkeypatch.syspath_prepend(str(REPO / "perf"))
    fuzz = importlib.import_module("hostile_fuzz")
    lines = []
    result = fuzz.fuzz(200, seed=0, workers=2, timeout=10.0, out=tmp_path / "reproducers", log=lines.append)
    fuzz.report(result, log=lines.append)
    assert not result["failures"], "\n".join(lines)
    readers = {reader for reader, _ in result["counts"]}
    assert readers >= set(fuzz.READERS) - {"parquet"}  # (parquet: with pyarrow only)
