"""perf/bench_uai.py on the UAI 2014 instances shipped in tests/data: rows, ratios,
refusals, timeouts, and pyAgrum's network built from ours."""

import csv
import math
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "perf"))

import bench_uai  # noqa: E402
from catbp_jit.frontend import compile_model, factor_graph  # noqa: E402

UAI = REPO / "tests" / "data" / "uai2014"
SHIPPED = ["CSP_12", "Grids_11", "Pedigree_11", "Promedus_11"]


def rows_of(out: Path) -> dict:
    with open(out / "bench_uai.csv") as f:
        return {r["name"]: r for r in csv.DictReader(f)}


def test_the_shipped_instances(tmp_path):
    """With greedy plans (--plan-time 0), CSP_12 fits 0.05 GiB and is answered right; the
    other three are refused at planning (their largest cliques hold 2^23 to 2^25 states)."""
    code = bench_uai.main(
        [
            str(UAI),
            "--quick",
            "--max-gib",
            "0.05",
            "--timeout",
            "900",
            "--plan-time",
            "0",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0
    rows = rows_of(tmp_path)
    assert sorted(rows) == SHIPPED
    csp = rows["CSP_12"]
    assert float(csp["prob_mar_err"]) < 1e-5 and float(csp["logprob_mar_err"]) < 1e-5
    assert float(csp["log_Z_rel"]) < 1e-9 and not csp["wrong"]
    assert float(csp["prob_best_s"]) <= float(csp["prob_median_s"])
    assert float(csp["prob_first_s"]) > 0
    assert csp["published_library"] == "JunctionTrees_v2"  # 9.33 ms in published_times.csv
    assert math.isclose(float(csp["ratio"]), float(csp["published_s"]) / float(csp["prob_best_s"]))
    if csp["pyagrum_s"]:  # pyAgrum installed: its answers are right too
        assert float(csp["pyagrum_mar_err"]) < 1e-5
    for name in SHIPPED[1:]:
        assert f"{name}:" in rows[name]["refused"] and "limit" in rows[name]["refused"]
    md = (tmp_path / "bench_uai.md").read_text()
    assert "| CSP_12 |" in md
    assert "geometric mean of virtual best / ours over 1 instances" in md
    assert "- refused: Grids_11, Pedigree_11, Promedus_11" in md


def test_an_instance_past_its_timeout_is_a_row(tmp_path):
    code = bench_uai.main(
        [str(UAI), "--only", "Pedigree_11", "--timeout", "1", "--skip-pyagrum", "--out", str(tmp_path)]
    )
    assert code == 0
    row = rows_of(tmp_path)["Pedigree_11"]
    assert row["status"] == "timeout (1 s)" and not row["prob_best_s"]
    assert "- no answer: Pedigree_11" in (tmp_path / "bench_uai.md").read_text()


GRANDCHILD = """
import subprocess, sys, time
print('{"started": true}', flush=True)
# a grandchild that holds the child's stdout open, as cotengra's worker processes do
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
time.sleep(600)
"""


def test_a_timeout_kills_the_childs_children_too():
    """Reading a killed child's output to the end waits for every process holding its
    pipes: its children must die with it (a CI run once hung here for an hour)."""
    import time

    t0 = time.monotonic()
    fields = bench_uai.run_json_child([sys.executable, "-c", GRANDCHILD], 3)
    assert time.monotonic() - t0 < 60
    assert fields == {"started": True, "status": "timeout (3 s)"}


def test_bad_arguments(tmp_path, capsys):
    assert bench_uai.main([str(tmp_path / "nowhere")]) == 2
    assert bench_uai.main([str(UAI), "--only", "Nope_1"]) == 2
    err = capsys.readouterr().err
    assert "no such directory" in err and "no instance Nope_1" in err


def test_pyagrum_network_reads_tables_in_uai_order():
    """pyAgrum's own UAI reader takes a table's first variable as the fastest (the
    format's last): the network built from our graph must give our marginals."""
    gum = pytest.importorskip("pyagrum")
    rng = np.random.default_rng(3)
    graph = factor_graph(
        {"a": 2, "b": 3, "c": 4},
        [
            (("b", "a"), rng.random((3, 2))),
            (("a", "b"), rng.random((2, 3))),
            (("c", "a", "b"), rng.random((4, 2, 3))),
            (("c",), rng.random(4)),
        ],
    )
    mrf = bench_uai.pyagrum_mrf(gum, graph)
    ie = gum.ShaferShenoyMRFInference(mrf)
    ie.setEvidence({"c": 2})
    ie.makeInference()
    ours = compile_model(graph, "prob", evidence_vars=["c"], absorb_evidence=True, target="reference").solve(
        {"c": 2}
    )
    for v in graph.names:
        assert np.allclose(ie.posterior(v).toarray(), ours.marginals[v], atol=1e-12), v


def test_summary_and_wrong_answers():
    rows = [
        {"name": "A", "ratio": 4.0, "prob_best_s": 1e-3, "prob_median_s": 2e-3, "prob_finite": True},
        {
            "name": "Promedus_26",
            "ratio": 0.25,
            "prob_best_s": 1.25e-4,
            "prob_median_s": 1.5e-4,
            "published_s": 6.28e-4,
        },
        {"name": "B", "refused": "B: too large"},
        {"name": "C", "status": "timeout (5 s)"},
        {
            "name": "D",
            "prob_best_s": 1.0,
            "prob_finite": True,
            "prob_mar_err": 2e-5,
            "logprob_best_s": 1.0,
            "logprob_finite": False,
            "log_Z_rel": 1e-6,
        },
    ]
    rows[-1]["wrong"] = bench_uai.wrong(rows[-1])
    assert rows[-1]["wrong"] == "prob MAR error 2.0e-05; logprob not finite; log Z rel 1.0e-06"
    assert not bench_uai.wrong(rows[0])
    lines = bench_uai.summary(rows)
    assert lines[0].startswith("- geometric mean of virtual best / ours over 2 instances: 1x")
    assert lines[1].startswith("- worst: Promedus_26 at 0.25x")
    assert lines[2].startswith("- Promedus_26: 0.125 ms best, 0.15 ms median")
    assert lines[3:] == ["- refused: B", "- no answer: C", "- WRONG: D"]
