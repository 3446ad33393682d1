"""The front end's default mode: on the CPU the reassociating one (exact=False: contraction
paths, BLAS GEMM), chosen because it is the faster and its answers stay within 1e-12
relative of exact mode's on every model tried (docs/frontend.md). Checked here on the
models that ship with the repository, with their evidence; exact=True stays selectable and
is what the other targets run by default."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from catbp_jit.frontend import compile_model, factor_graph
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.uai import read_evidence, read_uai
from catbp_jit.plan.pipeline import RESULT
from frontend_helpers import ising_grid

HERE = Path(__file__).parent
UAI = HERE / "data" / "uai2014" / "problems"
RTOL = 1e-12


def uai(name):
    graph = read_uai(UAI / name / f"{name}.uai")
    evid = UAI / name / f"{name}.uai.evid"
    return graph, (read_evidence(evid, graph) if evid.exists() else {})


MODELS = {
    **{name: (lambda name=name: uai(name)) for name in ("CSP_12", "Grids_11", "Pedigree_11", "Promedus_11")},
    "asia": lambda: (read_bif(HERE.parent / "examples" / "asia.bif"), {"asia": "yes"}),
    "ising7x7": lambda: (ising_grid(7, 7, 60.0, 0), {}),
}


def assert_within(got, want, rtol):
    assert abs(got.log_Z - want.log_Z) <= rtol, (got.log_Z, want.log_Z)  # Z within rtol
    for v, m in want.marginals.items():
        np.testing.assert_allclose(got.marginals[v], m, rtol=rtol, atol=1e-300, err_msg=v)


SLOW = {"CSP_12", "Grids_11", "Pedigree_11", "Promedus_11"}  # 8-16 s each: two modes compiled


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(MODELS)]
)
def test_default_mode_within_1e12_of_exact(name):
    graph, evidence = MODELS[name]()
    fast = compile_model(graph, "prob", evidence_vars=list(evidence), plan_time=0)
    exact = compile_model(graph, "prob", evidence_vars=list(evidence), plan_time=0, exact=True)
    assert fast.executable.plan.options.exact is False and exact.executable.plan.options.exact
    assert_within(fast.solve(evidence), exact.solve(evidence), RTOL)


def test_other_targets_default_to_exact():
    graph, evidence = MODELS["asia"]()
    model = compile_model(graph, "prob", target="reference")
    assert math.isfinite(model.solve().log_Z)
    assert compile_model(graph, "prob", exact=True).executable.plan.options.exact


def test_results_stored_as_gemm_steps_take_them_answer_as_exact():
    """A 3 x 3 grid of 24-state variables: its contraction tree's GEMM steps write some of
    its results in their own order (plan/layout.py), which exact mode keeps in their
    specs' order; the answers are exact mode's."""
    rng = np.random.default_rng(5)
    n, d = 3, 24
    domains = {f"x{i}{j}": d for i in range(n) for j in range(n)}
    factors = [
        ((f"x{i}{j}", f"x{i + di}{j + dj}"), rng.uniform(0.5, 2.0, (d, d)))
        for i in range(n)
        for j in range(n)
        for di, dj in ((1, 0), (0, 1))
        if i + di < n and j + dj < n
    ]
    graph = factor_graph(domains, factors)
    fast, exact = (
        compile_model(graph, "prob", plan_time=0, plan_kind="contraction", exact=e) for e in (False, True)
    )
    assert any(b.layout is not None for b in fast.executable.plan.bound(RESULT))
    assert not any(b.layout is not None for b in exact.executable.plan.bound(RESULT))
    assert_within(fast.solve(), exact.solve(), RTOL)


def test_models_on_the_cpu_do_not_split_their_sums():
    """compile(exact=False) splits a long sum into few outputs on the CPU (plan/split.py);
    a model does not, in either mode: a split sum is more accurate, so further from exact
    mode's order (Grids_11's log Z moved 4.1e-12), and the default mode's answers stay
    within 1e-12 of exact mode's. `catbp-jit aot MODEL` plans as compile_model does."""
    from catbp_jit.executable import model_options, plan_options

    assert plan_options("cpu", None, exact=False).split_reductions
    assert not model_options("cpu", False).split_reductions
    assert not model_options("cpu", True).split_reductions
    assert model_options("cuda", False).split_reductions  # a GPU needs the threads
    graph, evidence = MODELS["asia"]()
    for exact in (None, False):
        model = compile_model(graph, "prob", evidence_vars=list(evidence), exact=exact)
        assert not model.executable.plan.options.split_reductions
