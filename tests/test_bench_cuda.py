"""perf/bench_cuda.py in its quickest setting, on one small corpus bundle: without a GPU it
still measures the CPU and says once why the GPU rows are skipped; under the simulator the
GPU rows agree with the CPU's, the one-launch run with the per-step run, and the launches
are counted; its check tells different answers apart. The UAI table runs on a tiny
generated instance: the smallest of shared/uai2014 (Grids_11) took over 10 minutes in the
simulator, and 25 s on the CPU alone with a cold kernel cache and the plan search."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import shared_dir
from frontend_helpers import chain_uai

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "perf" / "bench_cuda.py"
BUNDLE = "z4_cycle__prob_float64"  # two bundles match: it and its _normalized twin
QUICKEST = [
    "--quick",
    "--budget",
    "0.01",
    "--shared",
    str(shared_dir()),
    "--only",
    "corpus",
    "--bundles",
    BUNDLE,
    "--batch-bundles",
    "--networks",
    "",
]


def load_script():
    spec = importlib.util.spec_from_file_location("bench_cuda", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def script_with_a_gpu():
    """The script, to run in this process: under the simulator here (conftest), on the
    GPU on a GPU machine; the test skipped when target "cuda" cannot run."""
    module = load_script()
    reason, _ = module.gpu_status()
    if reason is not None:
        pytest.skip(reason)
    return module


def run_script(tmp_path, *extra, **env):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *QUICKEST, "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
            **env,
        },
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(out / "bench_cuda.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert (out / "bench_cuda.md").read_text(encoding="utf-8") in proc.stdout
    return proc.stdout, rows


def assert_cpu_measured(rows):
    assert sorted(r["name"] for r in rows) == [BUNDLE, BUNDLE + "_normalized"]
    for r in rows:
        assert r["part"] == "bundle"
        assert float(r["cpu_inputs_s"]) > 0 and float(r["cpu_bound_s"]) > 0


def test_without_a_gpu_the_cpu_rows_and_one_skip_message(tmp_path, monkeypatch, capsys):
    bench_cuda = load_script()
    monkeypatch.setattr(bench_cuda, "gpu_status", lambda: ("no GPU in this test", None))
    assert bench_cuda.main(QUICKEST + ["--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.count("GPU rows skipped") == 1
    assert "GPU rows skipped: no GPU in this test" in text
    with open(tmp_path / "bench_cuda.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert_cpu_measured(rows)
    assert all(r["check"] == "cpu only" and r["gpu_inputs_s"] == "" for r in rows)


def test_script_without_the_simulator(tmp_path):
    """Here (no GPU, or no numba-cuda) the reason it is unavailable; on a GPU machine, GPU
    rows that agree with the CPU's."""
    text, rows = run_script(tmp_path, NUMBA_ENABLE_CUDASIM="0")
    assert_cpu_measured(rows)
    if "GPU rows skipped: " in text:
        assert text.count("GPU rows skipped") == 1 and "target 'cuda' needs" in text
        assert all(r["check"] == "cpu only" for r in rows)
    else:
        assert all(r["check"] == "ok" and float(r["gpu_bound_s"]) > 0 for r in rows), rows


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """(text, CSV rows) of the quickest run under the simulator, run once for the tests
    that read it."""
    pytest.importorskip("numba_cuda", reason="the CUDA target needs numba-cuda")
    return run_script(tmp_path_factory.mktemp("simulated"), "--simulate")


def test_script_under_the_simulator(simulated):
    text, rows = simulated
    assert "simulator" in text and "GPU rows skipped" not in text
    assert_cpu_measured(rows)
    assert all(r["check"] == "ok" and float(r["gpu_inputs_s"]) > 0 for r in rows), rows


def test_the_bundle_rows_compare_one_launch_with_per_step_launches(simulated):
    text, rows = simulated
    assert "| launches | run() per-step gpu | one launch / per step | per-step launches |" in text
    for r in rows:
        assert r["check"] == "ok", r
        assert int(r["gpu_launches"]) == 1  # the schedule kernel
        assert int(r["gpu_loop_launches"]) >= int(r["steps"])  # a step, its normalizing
        assert float(r["gpu_loop_bound_s"]) > 0
        assert float(r["ratio_launch"]) == pytest.approx(
            float(r["gpu_bound_s"]) / float(r["gpu_loop_bound_s"])
        )


def test_a_per_step_run_that_differs_from_the_one_launch_run_fails(tmp_path, monkeypatch, capsys):
    bench_cuda = script_with_a_gpu()
    per_step = bench_cuda.bench_bundle_per_step

    def one_ulp_off(bundle, args):
        part, slots = per_step(bundle, args)
        key = min(slots)
        slots[key] = np.nextafter(slots[key], np.inf)
        return part, slots

    monkeypatch.setattr(bench_cuda, "bench_bundle_per_step", one_ulp_off)
    assert bench_cuda.main(QUICKEST + ["--out", str(tmp_path)]) == 1
    assert "per step vs one launch" in capsys.readouterr().out
    with open(tmp_path / "bench_cuda.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["check"] == "FAIL" and "per step vs one launch" in r["detail"] for r in rows)


# ---------------------------------------------------------------------------------------
# The UAI table

UAI_ONLY = ["--quick", "--budget", "0.01", "--bundles", "--batch-bundles", "--networks", ""]


def tiny_uai_shared(root: Path) -> Path:
    """A shared directory holding one UAI instance: a chain of 5 binary variables, one of
    them observed."""
    problem = root / "uai2014" / "problems" / "chain5"
    problem.mkdir(parents=True)
    (problem / "chain5.uai").write_text(chain_uai(5), encoding="utf-8")
    (problem / "chain5.uai.evid").write_text("1 2 1\n", encoding="utf-8")
    return root


def uai_rows(bench_cuda, tmp_path) -> tuple:
    shared = tiny_uai_shared(tmp_path / "shared")
    out = tmp_path / "out"
    status = bench_cuda.main(UAI_ONLY + ["--shared", str(shared), "--uai", "chain", "--out", str(out)])
    with open(out / "bench_cuda.csv", newline="", encoding="utf-8") as f:
        return status, list(csv.DictReader(f))


def test_the_uai_table_on_the_cpu_alone(tmp_path, monkeypatch, capsys):
    bench_cuda = load_script()
    monkeypatch.setattr(bench_cuda, "gpu_status", lambda: ("no GPU in this test", None))
    status, rows = uai_rows(bench_cuda, tmp_path)
    assert status == 0
    assert "## UAI 2014 (contraction trees / junction trees, MAR)" in capsys.readouterr().out
    [row] = rows
    assert row["part"] == "uai" and row["name"] == "chain5" and row["check"] == "cpu only"
    assert row["plan_kind"] in ("junction", "contraction") and int(row["steps"]) > 0
    assert float(row["cpu_compile_s"]) > 0 and float(row["cpu_solve_s"]) > 0
    assert row["gpu_solve_s"] == row["gpu_launches"] == ""


def test_the_uai_table_under_the_simulator(tmp_path):
    status, rows = uai_rows(script_with_a_gpu(), tmp_path)
    assert status == 0
    [row] = rows
    assert row["check"] == "ok", row  # log Z and every marginal, bit for bit
    assert int(row["gpu_launches"]) == 1
    assert float(row["gpu_solve_s"]) > 0 and float(row["ratio_solve"]) > 0


def test_the_uai_instances_by_default(monkeypatch):
    parse = load_script().parse_args
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "0")
    assert parse([])[1].uai is None  # every instance
    assert parse(["--quick"])[1].uai == []
    assert parse(["--uai"])[1].uai == []
    assert parse(["--uai", "Grids", "CSP"])[1].uai == ["Grids", "CSP"]
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert parse([])[1].uai == []


def test_the_check_tells_different_answers_apart():
    compare = load_script().compare_results
    a = np.array([0.25, 1.0, np.nan])
    one_ulp = np.nextafter(a, 2.0)
    assert compare({("Z",): a}, {("Z",): a.copy()}, "PROB", a.dtype) == []
    assert compare({("Z",): a}, {("Z",): one_ulp}, "PROB", a.dtype) == ["('Z',): 2 of 3 entries differ"]
    assert compare({("Z",): a}, {("Z",): a.astype(np.float32)}, "PROB", a.dtype)
    assert compare({("Z",): a}, {}, "PROB", a.dtype) == ["('Z',): missing on the GPU"]
    # LOGPROB: exp and log differ between the GPU's libdevice and the CPU's libm
    assert compare({("Z",): a}, {("Z",): one_ulp}, "LOGPROB", a.dtype) == []
    assert compare({("Z",): a}, {("Z",): a * 1.001}, "LOGPROB", a.dtype)
    counts = np.array([3, -(2**63)])
    assert compare({("Z",): counts}, {("Z",): counts + 1}, "COUNT", counts.dtype)
