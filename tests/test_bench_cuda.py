"""perf/bench_cuda.py in its quickest setting, on one small corpus bundle: without a GPU it
still measures the CPU and says once why the GPU rows are skipped; under the simulator the
GPU rows agree with the CPU's; its check tells different answers apart."""

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


def test_script_under_the_simulator(tmp_path):
    pytest.importorskip("numba_cuda", reason="the CUDA target needs numba-cuda")
    text, rows = run_script(tmp_path, "--simulate")
    assert "simulator" in text and "GPU rows skipped" not in text
    assert_cpu_measured(rows)
    assert all(r["check"] == "ok" and float(r["gpu_inputs_s"]) > 0 for r in rows), rows


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
