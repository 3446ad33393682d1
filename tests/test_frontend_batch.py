"""solve_batch: many evidence rows in one run equal the rows solved one at a time.

The oracle is CompiledModel.solve on each row (itself checked against enumeration in
test_frontend_solve.py). Random graphs and rows in every semiring, indicator and absorbed
evidence, row counts around the buckets (0, 1, a bucket, the largest + 1, several chunks),
rows as dicts and as integer tables, and the errors for rows that cannot be answered.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catbp_jit.frontend import compile_model, factor_graph
from catbp_jit.frontend.graph import FactorGraphError
from frontend_helpers import graphs, ising_grid

BUCKETS = (1, 4, 16)


def assert_rows_match(model, res, table):
    assert res.log_Z.shape == (len(table),)
    for i, row in enumerate(table):
        one = model.solve({v: int(s) for v, s in zip(model.evidence_columns, row) if s >= 0})
        if math.isinf(one.log_Z):
            assert res.log_Z[i] == one.log_Z
        else:
            assert res.log_Z[i] == pytest.approx(one.log_Z, rel=1e-12, abs=1e-12)
        for v in model.graph.names:
            got, want = res.marginals[v][i], one.marginals[v]
            assert got.shape == want.shape
            if model.semiring == "SAT":
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    if model.semiring in ("SAT", "COUNT") and len(table):
        assert list(res.Z) == [
            model.solve({v: int(s) for v, s in zip(model.evidence_columns, r) if s >= 0}).Z for r in table
        ]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(["prob", "logprob", "sat", "count"]), st.booleans(), st.data())
def test_batches_equal_rows_solved_one_at_a_time(ge, semiring, absorb, data):
    graph, _ = ge
    names = list(graph.variables)
    ev = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    model = compile_model(graph, semiring, evidence_vars=ev, absorb_evidence=absorb, buckets=BUCKETS)
    n = data.draw(st.sampled_from([0, 1, 3, 16, 17, 40]))
    lo = 0 if absorb else -1
    table = np.array(
        [[data.draw(st.integers(lo, graph.variables[v] - 1)) for v in ev] for _ in range(n)], dtype=np.int64
    ).reshape(n, len(ev))
    res = model.solve_batch(table)
    assert_rows_match(model, res, table)
    # the same rows as dicts, through the same session (bucket switches in between)
    rows = [{v: int(s) for v, s in zip(ev, r) if s >= 0} for r in table]
    again = model.solve_batch(rows)
    np.testing.assert_array_equal(again.log_Z, res.log_Z)


def test_scaled_prob_batches_on_a_grid_with_log_z_in_the_thousands():
    g = ising_grid(5, 5, 60.0, 11)
    ev = ["x0_0", "x2_2", "x4_4"]
    rng = np.random.default_rng(1)
    table = rng.integers(-1, 2, size=(20, 3))
    prob = compile_model(g, "prob", evidence_vars=ev, buckets=(8,))
    logprob = compile_model(g, "logprob", evidence_vars=ev, buckets=(8,))
    a, b = prob.solve_batch(table), logprob.solve_batch(table)
    assert np.all(a.log_Z > 1000)
    np.testing.assert_allclose(a.log_Z, b.log_Z, rtol=1e-9)
    for v in g.names:
        np.testing.assert_allclose(a.marginals[v], b.marginals[v], atol=1e-9)
    with pytest.raises(Exception, match="log_Z"):
        _ = a.Z  # beyond float64: Z per row would be inf


def test_impossible_rows_have_zero_z_and_no_marginals():
    g = factor_graph({"a": 2, "b": 2}, [(("a", "b"), [[1.0, 0.0], [0.0, 1.0]])])
    model = compile_model(g, "prob", evidence_vars=["a", "b"], buckets=(2,))
    res = model.solve_batch([{"a": 0, "b": 1}, {"a": 1, "b": 1}, {}])
    assert list(res.Z) == [0.0, 1.0, 2.0]
    assert np.isnan(res.marginals["a"][0]).all()
    np.testing.assert_array_equal(res.marginals["a"][1], [0.0, 1.0])


def test_rows_that_cannot_be_answered_are_refused_clearly():
    g = factor_graph({"a": 2, "b": 3}, [(("a", "b"), np.ones((2, 3)))])
    model = compile_model(g, "prob", evidence_vars=["b", "a"], buckets=(2,))
    assert model.evidence_columns == ("b", "a")
    with pytest.raises(FactorGraphError, match=r"row 1: b=3 is not a state of b"):
        model.solve_batch(np.array([[0, 0], [3, 1]]))
    with pytest.raises(FactorGraphError, match="shape"):
        model.solve_batch(np.zeros((2, 3), dtype=np.int64))
    with pytest.raises(FactorGraphError, match="observes 'c'"):
        model.solve_batch([{"c": 0}])
    absorbed = compile_model(g, "prob", evidence_vars=["a"], absorb_evidence=True, buckets=(2,))
    with pytest.raises(FactorGraphError, match="unobserved"):
        absorbed.solve_batch(np.array([[-1]]))


@pytest.mark.parametrize(
    "rows, got", [(None, "got NoneType"), (5, "got int"), ("a", "got str"), ({"a": 0}, r"got dict \(one row")]
)
def test_rows_that_are_no_sequence_of_rows_are_a_type_error(rows, got):
    g = factor_graph({"a": 2, "b": 3}, [(("a", "b"), np.ones((2, 3)))])
    model = compile_model(g, "prob", evidence_vars=["a"], target="reference")
    with pytest.raises(
        TypeError,
        match=r"^solve_batch: rows must be a sequence of "
        r"\{variable: state\} mappings, a 2-D integer "
        rf"array or a pandas DataFrame, {got}",
    ):
        model.solve_batch(rows)
    assert len(model.solve_batch(iter([{"a": 1}, {}]))) == 2  # any iterable of rows


def test_reference_target_answers_batches_row_by_row():
    g = factor_graph({"a": 2, "b": 2}, [(("a", "b"), [[0.3, 0.2], [0.1, 0.4]])])
    ref = compile_model(g, "prob", evidence_vars=["a"], target="reference")
    jit = compile_model(g, "prob", evidence_vars=["a"], buckets=(4,))
    table = np.array([[0], [1], [-1]])
    np.testing.assert_allclose(ref.solve_batch(table).log_Z, jit.solve_batch(table).log_Z, rtol=1e-15)


@pytest.mark.parametrize("semiring", ["prob", "logprob", "sat", "count"])
def test_answers_are_not_overwritten_by_the_next_batch(semiring):
    g = factor_graph({"a": 2, "b": 2}, [(("a", "b"), [[1.0, 0.0], [2.0, 3.0]])])
    model = compile_model(g, semiring, evidence_vars=["a"], buckets=(2,))
    first = model.solve_batch(np.array([[0], [1]]))
    kept = (
        first.log_Z.copy(),
        {v: m.copy() for v, m in first.marginals.items()},
        None if first.counts is None else first.counts.copy(),
    )
    model.solve_batch(np.array([[1], [1]]))
    model.solve_batch(np.array([[1], [0], [1]]))  # more rows than the bucket: chunks
    np.testing.assert_array_equal(first.log_Z, kept[0])
    for v in g.names:
        np.testing.assert_array_equal(first.marginals[v], kept[1][v])
    if kept[2] is not None:
        np.testing.assert_array_equal(first.counts, kept[2])


def test_large_models_batch_in_cache_sized_runs():
    g = ising_grid(4, 4, 1.0, 3)
    model = compile_model(g, "prob", evidence_vars=["x0_0"], buckets=(1, 8, 1 << 30))
    assert model.batch_buckets() == (1, 8)  # a run of 2^30 rows would not fit in BATCH_BYTES
