"""perf/grid_family.py writes grid bundles that load, whose programs the reference
interpreter runs to the grid's marginals (summed over every assignment here), and that
bench.py --dirs measures with every slot checked against the reference."""

import csv
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "perf"))

import bench  # noqa: E402
import grid_family  # noqa: E402
from catbp_jit.bundle import load_bundle  # noqa: E402
from catbp_jit.reference import run_programs  # noqa: E402


def brute_force_marginals(rows: int, cols: int, states: int, seed: int) -> list:
    graph = grid_family.grid_graph(rows, cols, states, seed)
    names = list(graph.variables)
    marginals = np.zeros((len(names), states))
    for values in itertools.product(range(states), repeat=len(names)):
        at = dict(zip(names, values))
        term = 1.0
        for f in graph.factors:
            term *= float(f.values[tuple(at[v] for v in f.scope)])
        marginals[np.arange(len(names)), values] += term
    return [m / m.sum() for m in marginals]


def test_a_grid_bundle_runs_to_its_marginals(tmp_path, capsys):
    assert grid_family.main(["--out", str(tmp_path), "3x2:2"]) == 0
    bundle = load_bundle(tmp_path / "grid3x2_d2__prob_float64")
    assert bundle.model == "grid3x2_d2" and bundle.semiring == "PROB" and not bundle.selectors
    providers = bundle.factor_provider, bundle.selector_provider
    slots = run_programs(bundle.programs, bundle.semiring_runtime(), *providers)
    want = brute_force_marginals(3, 2, 2, seed=0)
    for i, m in enumerate(want):  # (the programs' marginals are scaled: normalized here)
        got = np.asarray(slots[("marg", i)][0])
        assert np.allclose(got / got.sum(), m, rtol=1e-12, atol=0), (i, got, m)


@pytest.mark.slow  # (bench.py compiles and times every mode: ~20 s)
def test_bench_measures_your_own_bundles(tmp_path, capsys):
    assert grid_family.main(["--out", str(tmp_path / "grids"), "3x2:2"]) == 0
    code = bench.main(["--dirs", str(tmp_path / "grids"), "--quick", "--out", str(tmp_path / "out")])
    assert code == 0  # every slot of every mode matched the reference
    assert "grid3x2_d2__prob_float64" in (tmp_path / "out" / "bench.md").read_text()
    # and says how many are its bits exactly: a count of the reference's slots, each mode
    rows = list(csv.DictReader((tmp_path / "out" / "bench.csv").read_text(encoding="utf-8").splitlines()))
    assert {r["mode"] for r in rows} == {"compiled", "loop"} and len(rows) == 3
    for r in rows:
        assert int(r["ref_slots"]) > 0 and 0 <= int(r["same_bits_slots"]) <= int(r["ref_slots"]), r
