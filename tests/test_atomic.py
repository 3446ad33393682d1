"""catbp_jit.atomic: a file or directory is replaced whole, or not at all."""

from __future__ import annotations

import os

import pytest

from catbp_jit.atomic import replacing, replacing_dir


def test_a_file_is_replaced_only_when_the_block_succeeds(tmp_path):
    path = tmp_path / "out.csv"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with replacing(path) as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".csv" and tmp.exists()
            tmp.write_text("half")
            raise RuntimeError("failed halfway")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.csv"]
    with replacing(path) as tmp:
        tmp.write_text("new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["out.csv"]


def test_a_new_file_gets_the_mode_open_gives(tmp_path):
    with replacing(tmp_path / "new.json") as tmp:
        tmp.write_text("{}")
    (tmp_path / "plain").write_text("")
    assert (tmp_path / "new.json").stat().st_mode == (tmp_path / "plain").stat().st_mode


def test_a_missing_directory_is_named_as_asked(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "no" / "out.csv")):
        with replacing(tmp_path / "no" / "out.csv"):
            pass


def test_a_directory_is_replaced_only_when_the_block_succeeds(tmp_path):
    path = tmp_path / "parts"
    path.mkdir()
    (path / "old.parquet").write_text("old")
    with pytest.raises(RuntimeError):
        with replacing_dir(path) as tmp:
            (tmp / "part.0.parquet").write_text("half")
            raise RuntimeError("failed halfway")
    assert os.listdir(tmp_path) == ["parts"] and os.listdir(path) == ["old.parquet"]
    with replacing_dir(path) as tmp:
        (tmp / "part.0.parquet").write_text("new")
    assert os.listdir(tmp_path) == ["parts"] and os.listdir(path) == ["part.0.parquet"]


def test_a_directory_in_the_way_is_named_before_any_work(tmp_path):
    (tmp_path / "out.csv").mkdir()
    with pytest.raises(IsADirectoryError, match=f"Is a directory, not a file: '{tmp_path / 'out.csv'}'"):
        with replacing(tmp_path / "out.csv"):
            raise AssertionError("not reached")
    assert os.listdir(tmp_path) == ["out.csv"]
