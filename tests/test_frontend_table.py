"""catbp-jit solve MODEL --evidence-table FILE: one posterior row per evidence row.

Each output row must equal solve() on that row's evidence; CSV and Parquet, state names,
indices and empty cells (unobserved), impossible rows, and the errors for bad tables.
"""

from __future__ import annotations

import csv
import io
import math

import pytest

from catbp_jit.cli import main
from catbp_jit.frontend import compile_model
from catbp_jit.frontend.bif import read_bif
from conftest import REPO

ASIA = REPO / "examples" / "asia.bif"


def run(capsys, *argv):
    code = main(["solve", str(ASIA), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_each_output_row_is_the_solution_of_its_evidence(tmp_path, capsys):
    table = tmp_path / "cases.csv"
    table.write_text("dysp,smoke,xray\nyes,no,\n,yes,yes\n0,1,0\nyes,,no\n,,\n")
    code, out, err = run(capsys, "--evidence-table", str(table))
    assert code == 0 and "5 rows solved" in err
    rows = list(csv.reader(io.StringIO(out)))
    graph = read_bif(ASIA)
    header = rows[0]
    assert header[:2] == ["row", "log_Z"] and "dysp=yes" in header and "asia=no" in header
    model = compile_model(graph, "prob", evidence_vars=["dysp", "smoke", "xray"])
    cases = [
        {"dysp": "yes", "smoke": "no"},
        {"smoke": "yes", "xray": "yes"},
        {"dysp": 0, "smoke": 1, "xray": 0},
        {"dysp": "yes", "xray": "no"},
        {},
    ]
    for i, (case, row) in enumerate(zip(cases, rows[1:])):
        want = model.solve(case)
        assert int(row[0]) == i
        assert float(row[1]) == pytest.approx(want.log_Z, rel=1e-12)
        got = dict(zip(header, row))
        for v, states in graph.states.items():
            for k, s in enumerate(states):
                assert float(got[f"{v}={s}"]) == pytest.approx(want.marginals[v][k], abs=1e-14)


def test_parquet_in_and_out(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")  # the parquet extra (installed with [test])
    import pyarrow.parquet as pq

    src, dst = tmp_path / "cases.parquet", tmp_path / "post.parquet"
    pq.write_table(pa.table({"dysp": ["yes", None, "no"], "either": ["yes", "no", None]}), src)
    code, _, err = run(capsys, "--evidence-table", str(src), "-o", str(dst), "-q")
    assert code == 0 and err == ""
    back = pq.read_table(dst).to_pydict()
    assert back["row"] == [0, 1, 2]
    model = compile_model(read_bif(ASIA), "prob", evidence_vars=["dysp", "either"])
    for i, case in enumerate([{"dysp": "yes", "either": "yes"}, {"either": "no"}, {"dysp": "no"}]):
        assert back["log_Z"][i] == pytest.approx(model.solve(case).log_Z, rel=1e-12)


def test_an_impossible_row_has_empty_posteriors(tmp_path, capsys):
    table = tmp_path / "cases.csv"
    table.write_text("tub,either\nyes,no\nno,no\n")  # either = tub or lung: row 0 is impossible
    code, out, err = run(capsys, "--evidence-table", str(table))
    assert code == 0 and "1 with impossible evidence" in err
    rows = list(csv.reader(io.StringIO(out)))
    assert float(rows[1][1]) == -math.inf and set(rows[1][2:]) == {""}
    assert all(x != "" for x in rows[2])


@pytest.mark.parametrize(
    "text, message",
    [
        ("dysp,nope\nyes,no\n", "unknown or repeated: 'nope'"),
        ("dysp,dysp\nyes,no\n", "distinct variables"),
        ("dysp,smoke\nyes,no\nmaybe,no\n", "line 3: 'maybe' is not a state of 'dysp'"),
        ("dysp,smoke\nyes\n", "line 2 has 1 cells"),
        ("", "needs a header"),
    ],
)
def test_bad_tables_are_one_line_errors(tmp_path, capsys, text, message):
    table = tmp_path / "cases.csv"
    table.write_text(text)
    code, out, err = run(capsys, "--evidence-table", str(table), "-q")
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "name, data, message",
    [
        (
            "big.csv",
            b"dysp\nyes\n" + b"y" * 10**6 + b"\n",
            "big.csv: line 3: not a readable CSV table (field larger than field limit",
        ),
        ("head.csv", b"d" * 10**6 + b"\nyes\n", "head.csv: line 1: not a readable CSV table"),
        ("latin1.csv", b"dysp\nyes\nno\n\xe9\n", "latin1.csv: line 4: byte 0xe9 is not UTF-8"),
        ("header.csv", b"dy\xe9sp\nyes\n", "header.csv: line 1: byte 0xe9 is not UTF-8"),
        ("utf16.csv", "dysp\nyes\n".encode("utf-16"), "utf16.csv: line 1: byte 0xff is not UTF-8"),
        (
            "fake.parquet",
            b"dysp\nyes\n",
            "fake.parquet: not a readable Parquet file (Parquet magic bytes not found",
        ),
    ],
)
def test_unreadable_tables_are_one_line_errors(tmp_path, capsys, name, data, message):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    table = tmp_path / name
    table.write_bytes(data)
    code, out, err = run(capsys, "--evidence-table", str(table), "-q")
    assert code == 2 and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_parquet_file_with_a_damaged_footer_is_one_line(tmp_path, capsys):
    """pyarrow raises a plain OSError ending in a newline for a footer it cannot decode
    ("Couldn't deserialize thrift"): still one line naming the file."""
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"dysp": ["yes", "no"]}), good)
    data = bytearray(good.read_bytes())
    footer = int.from_bytes(data[-8:-4], "little")  # the footer's length, then b"PAR1"
    data[-8 - footer : -8] = bytes(b ^ 0xA5 for b in data[-8 - footer : -8])
    table = tmp_path / "damaged.parquet"
    table.write_bytes(bytes(data))
    code, out, err = run(capsys, "--evidence-table", str(table), "-q")
    assert code == 2 and "damaged.parquet: not a readable Parquet file (" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_parquet_string_column_that_is_not_utf8_is_one_line(tmp_path, capsys):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    states = pa.array([b"yes", b"n\xef"], type=pa.binary()).view(pa.string())  # unchecked
    table = tmp_path / "latin.parquet"
    pq.write_table(pa.table({"dysp": states}), table)
    code, out, err = run(capsys, "--evidence-table", str(table), "-q")
    assert code == 2 and "latin.parquet: not a readable Parquet file (a string column" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "data",
    [
        b"\xef\xbb\xbfdysp,smoke\r\nyes,no\r\n,yes\r\n",  # Excel's "CSV UTF-8": a BOM, CRLF
        b"dysp,smoke\ryes,no\r,yes\r",  # old Mac line ends
    ],
)
def test_excel_csv_reads_as_plain_csv(tmp_path, capsys, data):
    plain = tmp_path / "plain.csv"
    plain.write_text("dysp,smoke\nyes,no\n,yes\n")
    excel = tmp_path / "excel.csv"
    excel.write_bytes(data)
    want = run(capsys, "--evidence-table", str(plain), "-q")
    got = run(capsys, "--evidence-table", str(excel), "-q")
    assert want[0] == 0 and got == want


def test_a_table_is_not_combined_with_other_evidence(tmp_path, capsys):
    table = tmp_path / "cases.csv"
    table.write_text("dysp\nyes\n")
    code, _, err = run(capsys, "--evidence-table", str(table), "--observe", "smoke=yes")
    assert code == 2 and "cannot be combined" in err


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_failed_table_leaves_the_old_output_untouched(tmp_path, capsys, suffix):
    if suffix == ".parquet":
        pytest.importorskip("pyarrow")
    table = tmp_path / "cases.csv"  # a bad row after the first chunk has been written
    table.write_text("dysp,smoke\n" + "yes,no\n" * 9000 + "maybe,no\n")
    out = tmp_path / f"post{suffix}"
    out.write_bytes(b"the user's old file")
    code, _, err = run(capsys, "--evidence-table", str(table), "-o", str(out), "-q")
    assert code == 2 and "line 9002: 'maybe' is not a state of 'dysp'" in err
    assert out.read_bytes() == b"the user's old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.csv", f"post{suffix}"]
    table.write_text("dysp,smoke\nyes,no\n")  # and a good table replaces it
    assert run(capsys, "--evidence-table", str(table), "-o", str(out), "-q")[0] == 0
    assert out.read_bytes() != b"the user's old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cases.csv", f"post{suffix}"]
