"""perf/roofline.py on one small shipped corpus bundle, with --quick's tiny calibration:
one CSV row per step of the schedule, each with its traffic, work, time and bound."""

import csv
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "perf"))

import roofline  # noqa: E402

from catbp_jit.bundle import load_bundle  # noqa: E402
from catbp_jit.executable import compile  # noqa: E402

DATA = REPO / "tests" / "data"
BUNDLE = "grid3_d2__logprob_float64_normalized"  # LOGPROB: both kinds of bound


def schedule_of(name: str):
    bundle = load_bundle(DATA / "corpus" / name)
    exe = compile(bundle.programs, bundle.semiring_runtime(),
                  factor_specs=bundle.factor_specs(), selector_specs=bundle.selector_specs(),
                  mode="loop")
    return exe


def test_one_row_per_step(tmp_path, capsys):
    code = roofline.main(["--shared", str(DATA), "--group", "corpus", "--only", BUNDLE,
                          "--quick", "--out", str(tmp_path)])
    assert code == 0
    with open(tmp_path / "roofline.csv") as f:
        rows = list(csv.DictReader(f))
    exe = schedule_of(BUNDLE)
    steps = exe.schedule.steps
    assert [int(r["step"]) for r in rows] == list(range(len(steps)))
    assert {r["bundle"] for r in rows} == {BUNDLE}
    itemsize = exe.memory.itemsize
    for r, step in zip(rows, steps):
        assert r["kernel"] == step.pattern.name
        assert int(r["ops"]) == step.work > 0
        # the traffic model: output plus each distinct leaf, once
        values = {step.segment.out, *step.segment.leaves}
        assert int(r["bytes"]) == itemsize * sum(exe.memory.regions[v].size for v in values)
        assert float(r["time_exact_s"]) > 0
        bound = float(r["bound_s"])
        assert bound == max(float(r["memory_bound_s"]), float(r["arith_bound_s"])) > 0
        assert r["bound"] == ("bandwidth" if float(r["memory_bound_s"]) >= float(r["arith_bound_s"])
                              else "arithmetic")
        # time / bound; a small step's data sits in cache, faster than the DRAM bandwidth
        # the bound assumes, but not by orders of magnitude
        assert float(r["ratio_exact"]) == pytest.approx(float(r["time_exact_s"]) / bound)
        assert float(r["ratio_exact"]) > 0.01
        want = ("exp" if step.pattern.semiring == "LOGPROB" and step.pattern.reduce
                else "multiply-add")
        assert r["arith_kind"] == want
    assert {r["arith_kind"] for r in rows} == {"exp", "multiply-add"}

    md = (tmp_path / "roofline.md").read_text()
    assert "## Summary" in md and f"| {BUNDLE} | {len(steps)} |" in md
    out = capsys.readouterr()
    assert "GB/s" in out.out
    png = tmp_path / "roofline.png"
    assert png.is_file() or "(matplotlib not installed: no plot)" in out.err


def test_summary_counts_slow_steps_against_the_bar():
    rows = [{"bound_s": 1e-3, "time_exact_s": 2e-3, "ratio_exact": 2.0},   # slow, within
            {"bound_s": 1e-4, "time_exact_s": 5e-3, "ratio_exact": 50.0},  # slow, far
            {"bound_s": 1e-7, "time_exact_s": 1e-5, "ratio_exact": 100.0}]  # fast: not judged
    s = roofline.summary("b", rows)
    assert s["steps"] == 3 and s["slow_exact"] == 2 and s["within_exact"] == 1
    assert s["time_exact_s"] == pytest.approx(7.01e-3)
    assert not s["meets_bar"]
    assert roofline.summary("b", rows[:1])["meets_bar"]


def test_no_bundle_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        roofline.main(["--shared", str(DATA), "--group", "corpus", "--only", "no_such_model",
                       "--quick", "--out", str(tmp_path)])
    assert e.value.code == 2
    assert "no corpus bundles found" in capsys.readouterr().err


def test_a_broken_bundle_is_a_problem_line_not_a_traceback(tmp_path, capsys):
    corpus = tmp_path / "shared" / "corpus"
    shutil.copytree(DATA / "corpus" / "chain8__prob_float64", corpus / "chain8__prob_float64")
    broken = corpus / "chain8__broken"
    shutil.copytree(DATA / "corpus" / "chain8__prob_float64", broken)
    (broken / "bundle.json").write_text("{ not json")
    code = roofline.main(["--shared", str(tmp_path / "shared"), "--group", "corpus", "--quick",
                          "--out", str(tmp_path / "out")])
    assert code == 1
    md = (tmp_path / "out" / "roofline.md").read_text()
    assert "- chain8__broken: BundleError:" in md and "not valid JSON" in md
    with open(tmp_path / "out" / "roofline.csv") as f:
        assert {r["bundle"] for r in csv.DictReader(f)} == {"chain8__prob_float64"}
