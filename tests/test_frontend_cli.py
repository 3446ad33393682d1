"""catbp-jit solve / plan on model files."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from catbp_jit.cli import main
from catbp_jit.frontend import solve
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.uai import write_uai

ASIA = str(Path(__file__).resolve().parents[1] / "examples" / "asia.bif")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_solve_text_shows_log_z_and_marginals(capsys, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_PROGRESS_AFTER", "0")  # (else only after 2 s)
    code, out, err = run(capsys, "solve", ASIA, "--observe", "dysp=yes")
    assert code == 0
    assert "compiling" in err and "kernel" in err  # progress on stderr
    p_dysp = 0.4359706  # P(dysp = yes), the textbook value
    log_z = float(next(line for line in out.splitlines() if line.startswith("log Z:")).split()[-1])
    assert log_z == pytest.approx(math.log(p_dysp), rel=1e-6)
    assert "  dysp    yes=1  no=0" in out
    assert "bronc   yes=0.833967" in out


def test_solve_json_matches_the_api(capsys):
    code, out, _ = run(capsys, "solve", ASIA, "--format", "json", "--observe", "xray=0", "-q")
    assert code == 0
    doc = json.loads(out)
    want = solve(read_bif(ASIA), evidence={"xray": 0})
    assert doc["Z"] == want.Z and doc["log_Z"] == want.log_Z
    for v, m in want.marginals.items():
        assert doc["marginals"][v] == m.tolist()
    assert doc["states"]["xray"] == ["yes", "no"]


def test_solve_uai_model_with_evid_file_prints_mar(capsys, tmp_path):
    graph = read_bif(ASIA)
    model = tmp_path / "asia.uai"
    model.write_text(write_uai(graph))
    evid = tmp_path / "asia.uai.evid"
    evid.write_text("1 7 0\n")  # variable 7 (dysp) observed in state 0
    code, out, _ = run(capsys, "solve", str(model), "--evidence", str(evid), "--format", "uai", "-q")
    assert code == 0
    lines = out.split("\n")
    assert lines[0] == "MAR"
    tokens = lines[1].split()
    assert tokens[0] == "8"
    want = solve(graph, evidence={"dysp": 0})
    values = iter(tokens[1:])
    for v in graph.variables:
        d = int(next(values))
        got = [float(next(values)) for _ in range(d)]
        np.testing.assert_allclose(got, want.marginals[v], rtol=1e-15)


def test_solve_json_evidence_and_other_semirings(capsys, tmp_path):
    ev = tmp_path / "ev.json"
    for bom in (b"", b"\xef\xbb\xbf"):  # as Notepad saves it: a byte-order mark first
        ev.write_bytes(bom + json.dumps({"either": "yes"}).encode())
        code, out, _ = run(capsys, "solve", ASIA, "--evidence", str(ev), "--semiring", "sat", "-q")
        assert code == 0 and "Z:         True" in out
        assert "tub     yes=True  no=True" in out
    code, out, _ = run(capsys, "solve", ASIA, "--semiring", "count", "-q", "--format", "json")
    # every CPT entry is positive except either's, which fixes either given lung and tub
    assert json.loads(out)["Z"] == 2**7
    code, out, _ = run(capsys, "solve", ASIA, "--semiring", "logprob", "--target", "reference", "-q")
    log_z = float(next(line for line in out.splitlines() if line.startswith("log Z:")).split()[-1])
    assert code == 0 and abs(log_z) < 1e-12


def test_plan_prints_statistics_and_listing(capsys):
    code, out, _ = run(capsys, "plan", ASIA)
    assert code == 0
    assert "cliques:            6" in out and "max clique:         8 states, 3 variables" in out
    assert "program upward" in out and "program finalize" in out
    assert "STORE_SLOT args={'slot': ('Z',)" in out
    code, out, _ = run(capsys, "plan", ASIA, "--no-listing")
    assert "program upward" not in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["solve", "no/such/model.bif"], "no such file"),
        (["solve", ASIA, "--observe", "nope=1"], "unknown variable"),
        (["solve", ASIA, "--observe", "dysp"], "expected VAR=STATE"),
        (["solve", ASIA, "--observe", "dysp=maybe"], "not a state of dysp"),
        (["solve", ASIA, "--evidence", "missing.evid"], "no such evidence file"),
    ],
)
def test_errors_are_one_line_and_exit_2(capsys, argv, message):
    code, out, err = run(capsys, *argv, "-q")
    assert code == 2
    assert message in err and err.count("\n") == 1
