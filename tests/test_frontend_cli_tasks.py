"""catbp-jit solve --task PR|MPE|MAP and --samples: the UAI result formats, JSON, CSV."""

import csv
import io
import json
import math
from pathlib import Path

import pytest

from catbp_jit.cli import main
from catbp_jit.frontend import compile_model
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.uai import read_query, write_uai

ASIA = str(Path(__file__).resolve().parents[1] / "examples" / "asia.bif")
# the CLI's plumbing on the reference interpreter (the compiled tasks: test_frontend_tasks.py)
REF = ("--target", "reference")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_mpe_in_the_uai_format_matches_the_api(capsys, tmp_path):
    graph = read_bif(ASIA)
    model = tmp_path / "asia.uai"
    model.write_text(write_uai(graph))
    evid = tmp_path / "asia.uai.evid"
    evid.write_text("1 7 0\n")  # dysp = yes
    code, out, _ = run(
        capsys, "solve", str(model), "--evidence", str(evid), "--task", "mpe", "--format", "uai", "-q", *REF
    )
    assert code == 0
    want = compile_model(read_bif(ASIA), "prob", target="reference", evidence_vars=["dysp"]).mpe({"dysp": 0})
    assert out == "MPE\n8 " + " ".join(str(want.assignment[v]) for v in graph.variables) + "\n"


def test_mpe_text_and_json(capsys):
    code, out, _ = run(capsys, "solve", ASIA, "--task", "MPE", "--observe", "dysp=yes", "-q", *REF)
    assert code == 0
    assert "task:      MPE" in out and "  bronc   yes" in out
    code, out, _ = run(
        capsys, "solve", ASIA, "--task", "MPE", "--observe", "dysp=yes", "--format", "json", "-q", *REF
    )
    doc = json.loads(out)
    assert doc["states"]["dysp"] == "yes" and doc["assignment"]["dysp"] == 0
    assert doc["log_value"] == pytest.approx(-1.6038708373925255, rel=1e-12)


def test_map_with_names_and_a_query_file(capsys, tmp_path):
    def map_of(query):
        return run(
            capsys,
            "solve",
            ASIA,
            "--task",
            "MAP",
            "--query",
            query,
            "--observe",
            "dysp=yes",
            "--format",
            "uai",
            "-q",
            *REF,
        )

    code, out, _ = map_of("lung,bronc")
    assert code == 0
    assert out == "MMAP\n2 3 1 4 0\n"  # lung = no, bronc = yes
    query = tmp_path / "asia.uai.query"
    query.write_text("2 3 4\n")
    assert read_query(query, read_bif(ASIA)) == ("lung", "bronc")
    code, out2, _ = map_of(str(query))
    assert code == 0 and out2 == out


def test_pr_prints_log10_z(capsys):
    code, out, _ = run(
        capsys, "solve", ASIA, "--task", "PR", "--observe", "dysp=yes", "--format", "uai", "-q", *REF
    )
    assert code == 0
    head, value = out.split()
    assert head == "PR" and float(value) == pytest.approx(math.log10(0.4359706), rel=1e-6)


def test_samples_are_csv_of_state_names(capsys):
    code, out, _ = run(
        capsys, "solve", ASIA, "--samples", "50", "--seed", "4", "--observe", "dysp=yes", "-q", *REF
    )
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == list(read_bif(ASIA).variables) and len(rows) == 51
    assert {r[7] for r in rows[1:]} == {"yes"}
    code, again, _ = run(
        capsys, "solve", ASIA, "--samples", "50", "--seed", "4", "--observe", "dysp=yes", "-q", *REF
    )
    assert again == out


def test_evidence_table_with_mpe(capsys, tmp_path):
    table = tmp_path / "cases.csv"
    table.write_text("dysp,xray\nyes,\nno,yes\n")
    code, out, _ = run(capsys, "solve", ASIA, "--task", "MPE", "--evidence-table", str(table), "-q", *REF)
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["row", "log_value"] + list(read_bif(ASIA).variables)
    model = compile_model(read_bif(ASIA), "prob", target="reference", evidence_vars=["dysp", "xray"])
    for row, evidence in zip(rows[1:], [{"dysp": 0}, {"dysp": 1, "xray": 0}]):
        want = model.mpe(evidence)
        assert [int(x) for x in row[2:]] == list(want.assignment.values())
        assert float(row[1]) == pytest.approx(want.log_value, rel=1e-12)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--task", "MAP"], "needs --query"),
        (["--query", "lung"], "--task MAP only"),
        (["--task", "MAP", "--query", "nope"], "no variable"),
        (["--samples", "3", "--task", "MPE"], "--samples"),
    ],
)
def test_task_errors_are_one_line(capsys, argv, message):
    code, _, err = run(capsys, "solve", ASIA, "-q", *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1
