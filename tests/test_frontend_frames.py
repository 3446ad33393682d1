"""pandas in and out (frontend/frames.py, cells.py): evidence frames, answers as frames,
and the batched predict / predict_proba against pgmpy's own, row for row."""

import gzip
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from catbp_jit.frontend import compile_model
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.cells import cell_states
from catbp_jit.frontend.graph import FactorGraphError, factor_graph

pd = pytest.importorskip("pandas")

ASIA = Path(__file__).resolve().parents[1] / "examples" / "asia.bif"
# pgmpy uses a BIF's rows as written; our reader normalizes rounded rows unless told not to
GRAPH = read_bif(ASIA, normalize=False)
EVIDENCE = ["dysp", "smoke", "xray", "tub", "either"]


@pytest.fixture(scope="module")
def asia():
    return compile_model(GRAPH, "prob", evidence_vars=EVIDENCE, target="reference")


def test_cells_read_names_indices_text_and_missing_values():
    g = factor_graph({"a": 3}, [(("a",), [1, 1, 1])], states={"a": ["lo", "mid", "hi"]})
    cells = np.array(["lo", " HI ", "2", 1, 0.0, None, np.nan, pd.NA, "", "?", "NA", -1, "x", 3, 1.5], object)
    want = [0, 2, 2, 1, 0, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1]
    for given in (cells, pd.Series(cells)):  # pandas' factorize; a Series factorized in place
        states, bad = cell_states(g, "a", given)
        assert states.tolist() == want and bad.tolist() == [False] * 12 + [True] * 3
    with pytest.MonkeyPatch.context() as mp:  # a CSV chunk without pandas loaded: a dict
        mp.setitem(sys.modules, "pandas", None)
        states, bad = cell_states(g, "a", cells)
    assert states.tolist() == want and bad.tolist() == [False] * 12 + [True] * 3
    for numbers in (np.array([0, 2, -1, 3, -2]), np.array([0.0, 2.0, np.nan, 3.0, 0.5])):
        states, bad = cell_states(g, "a", numbers)
        assert states[:3].tolist() == [0, 2, -1] and bad.tolist() == [False] * 3 + [True] * 2


def test_a_frame_is_read_as_the_same_rows_given_as_mappings(asia):
    frame = pd.DataFrame(
        {
            "dysp": ["yes", None, "no", "NA"],  # names, missing
            "smoke": pd.array([0, 1, pd.NA, 1], dtype="Int64"),  # indices, pandas' NA
            "xray": pd.Categorical(["no", "yes", "no", None]),
            "either": [np.nan, 1.0, 0.0, np.nan],  # indices as floats, NaN missing
        },
        index=[10, 11, 12, 13],
    )
    rows = [
        {"dysp": "yes", "smoke": 0, "xray": "no"},
        {"smoke": 1, "xray": "yes", "either": 1},
        {"dysp": "no", "xray": "no", "either": 0},
        {"smoke": 1},
    ]
    got, want = asia.solve_batch(frame), asia.solve_batch(rows)
    np.testing.assert_array_equal(got.states, want.states)
    np.testing.assert_array_equal(got.log_Z, want.log_Z)
    for v in GRAPH.variables:
        np.testing.assert_array_equal(got.marginals[v], want.marginals[v])
    wide = got.to_pandas()
    assert list(wide.index) == [10, 11, 12, 13]
    assert list(wide.columns[:3]) == ["log_Z", "asia=yes", "asia=no"]
    np.testing.assert_array_equal(wide["lung=yes"], want.marginals["lung"][:, 0])
    assert list(want.to_pandas().index) == [0, 1, 2, 3]  # rows given as mappings: 0..n-1


def test_posteriors_as_a_long_frame(asia):
    res = asia.solve_batch(pd.DataFrame({"dysp": ["yes", "no"]}, index=["a", "b"]))
    long = res.to_pandas(variables=["lung", "tub"], long=True)
    assert list(long.columns) == ["row", "variable", "state", "probability"]
    assert long[["row", "variable", "state"]].values.tolist() == [
        [r, v, s] for r in "ab" for v in ("lung", "tub") for s in ("yes", "no")
    ]
    np.testing.assert_array_equal(
        long["probability"].to_numpy().reshape(2, 2, 2)[:, 0], res.marginals["lung"]
    )


def test_sat_and_count_frames_carry_z_exactly():
    for semiring, dtype in (("sat", bool), ("count", np.int64)):
        g = factor_graph({"a": 2, "b": 2}, [(("a", "b"), [[1, 0], [1, 1]])])
        m = compile_model(g, semiring, evidence_vars=["a"], target="reference")
        frame = m.solve_batch(pd.DataFrame({"a": [0, 1, None]})).to_pandas()
        assert frame["Z"].dtype == dtype and frame["Z"].tolist() == (
            [True] * 3 if dtype is bool else [1, 2, 3]
        )


def test_mpe_rows_as_a_frame_with_an_impossible_row(asia):
    # either = tub or lung: tub=yes with either=no is impossible
    frame = pd.DataFrame({"tub": ["yes", "no"], "either": ["no", None]}, index=["x", "y"])
    best = asia.mpe_batch(frame)
    named = best.to_pandas()
    assert list(named.index) == ["x", "y"] and named.loc["x", "log_value"] == -math.inf
    assert pd.isna(named.loc["x", "lung"]) and named.loc["y", "lung"] == "no"
    indices = best.to_pandas(variables=["lung", "tub"], names=False)
    assert str(indices["lung"].dtype) == "Int64" and indices["lung"].isna().tolist() == [True, False]
    assert indices.loc["y", "tub"] == 1


def test_predict_on_impossible_rows_leaves_their_cells_empty(asia):
    # a full row (the absorbing companion) and one with a missing cell (the model itself)
    frame = pd.DataFrame({"tub": ["yes", "yes"], "either": ["no", "no"], "xray": ["no", None]})
    got = asia.predict(frame)
    assert got[["lung", "dysp", "asia"]].isna().all().all() and got["xray"].isna().tolist() == [False, True]
    assert asia.predict_proba(frame).isna().all().all()


def test_bad_frames_are_one_clear_error(asia):
    with pytest.raises(
        FactorGraphError, match=r"asia: evidence row 'r2': dysp='maybe' is not a state of dysp"
    ):
        asia.solve_batch(pd.DataFrame({"dysp": ["yes", "maybe"]}, index=["r1", "r2"]))
    with pytest.raises(FactorGraphError, match=r"evidence row 1: smoke=2.5 is not a state"):
        asia.solve_batch(pd.DataFrame({"smoke": [0, 2.5]}))
    with pytest.raises(FactorGraphError, match=r"evidence row 0: smoke=7 is not a state of smoke \(0..1 or"):
        asia.solve_batch(pd.DataFrame({"smoke": [7]}))
    with pytest.raises(FactorGraphError, match=r"unknown or repeated: 'lung' \(compile with evidence_vars="):
        asia.predict(pd.DataFrame({"lung": ["yes"]}))
    with pytest.raises(TypeError, match="predict: expected a pandas DataFrame of evidence, got list"):
        asia.predict([{"dysp": "yes"}])
    with pytest.raises(TypeError, match="rows must be .* or a pandas DataFrame, got str"):
        asia.solve_batch("dysp=yes")


def test_predict_fills_missing_cells_and_the_absent_variables(asia):
    frame = pd.DataFrame({"dysp": ["yes", "no", "yes"], "smoke": [0, None, 0]}, index=[5, 6, 7])
    got = asia.predict(frame)
    assert list(got.columns) == ["dysp", "smoke", "asia", "tub", "lung", "bronc", "either", "xray"]
    assert list(got.index) == [5, 6, 7] and got.loc[5, "smoke"] == 0 and got.loc[6, "smoke"] == "no"
    assert got.loc[5].tolist() == got.loc[7].tolist()  # a repeated row: solved once, answered twice
    for i, row in zip(frame.index, [{"dysp": "yes", "smoke": 0}, {"dysp": "no"}]):
        best = asia.mpe(row).named()
        assert all(got.loc[i, v] == best[v] for v in GRAPH.variables if v not in row)
    proba = asia.predict_proba(frame)
    assert list(proba.columns) == [f"{v}={s}" for v in got.columns[2:] for s in ("yes", "no")]
    want = asia.solve({"dysp": "no"}).marginals
    np.testing.assert_allclose(proba.loc[6, ["lung=yes", "lung=no"]], want["lung"], rtol=1e-12)


@pytest.mark.slow  # compiles a PROB and a MAXLOG batch (25 s cold); the frames are target-blind
def test_predict_compiled_equals_the_reference(asia):
    frame = pd.DataFrame({"dysp": ["yes", "no", None], "xray": ["no", "yes", "yes"]})
    compiled = compile_model(GRAPH, "prob", evidence_vars=EVIDENCE)
    assert compiled.predict(frame).equals(asia.predict(frame))
    np.testing.assert_allclose(compiled.predict_proba(frame), asia.predict_proba(frame), rtol=1e-12)


# -- pgmpy's own predict and predict_probability, row for row --------------------------------


@pytest.fixture(scope="module")
def pgmpy_models():
    pytest.importorskip("pgmpy")
    from pgmpy.readwrite import BIFReader

    from catbp_jit.frontend import bnlearn
    from catbp_jit.interop import from_pgmpy

    # ours converted from pgmpy's own model, as a pgmpy user would (test_interop.py checks
    # the conversion against read_bif)
    out = {"asia": BIFReader(str(ASIA)).get_model()}
    if "alarm" in bnlearn.available():  # the test fetches nothing (test_frontend_bnlearn does)
        path = bnlearn.network_path("alarm")
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
        out["alarm"] = BIFReader(string=text).get_model()
    return {name: (from_pgmpy(model, name=name), model) for name, model in out.items()}


@pytest.mark.parametrize(
    "name, missing", [("asia", ["lung", "either", "tub"]), ("alarm", ["HR", "LVFAILURE", "HYPOVOLEMIA"])]
)
def test_predict_matches_pgmpy_row_for_row(pgmpy_models, name, missing):
    if name not in pgmpy_models:
        pytest.skip(f"{name} is not fetched (python -m catbp_jit.frontend.bnlearn)")
    graph, theirs = pgmpy_models[name]
    columns = [v for v in graph.variables if v not in missing]
    states = compile_model(graph, "prob", target="reference").sample(30, seed=7)
    frame = pd.DataFrame(
        {
            v: np.array(graph.states[v], dtype=object)[states[:, j]]
            for j, v in enumerate(graph.variables)
            if v in columns
        }
    )
    ours = compile_model(graph, "prob", evidence_vars=columns, target="reference")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgmpy's deprecation and progress noise
        want = theirs.predict(frame, n_jobs=1)
        want_proba = theirs.predict_probability(frame)
    got = ours.predict(frame)
    assert list(got.index) == list(want.index)
    for v in missing:  # ties broken alike (none here; the values would be equal at a tie)
        assert got[v].tolist() == want[v].tolist(), v
    proba = ours.predict_proba(frame)
    for column in want_proba.columns:  # pgmpy names them var_state
        v, state = column.rsplit("_", 1)
        np.testing.assert_allclose(proba[f"{v}={state}"], want_proba[column], rtol=1e-10, atol=1e-15)
