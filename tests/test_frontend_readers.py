"""The model readers: UAI (.uai, .evid, MAR), BIF, and the bnlearn network files.

The bnlearn tests compare every CPT with pyAgrum's reader for each network found in
bnlearn.data_dir() (set CATBP_JIT_BNLEARN_DIR, or run `python -m catbp_jit.frontend.bnlearn`);
they skip when the files or pyAgrum are missing.
"""

from __future__ import annotations

import gzip
import math
import re
import sys
import zipfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bn_helpers import pyagrum_network
from catbp_jit.frontend import bnlearn
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.graph import FactorGraphError, factor_graph
from catbp_jit.frontend.uai import format_mar, read_evidence, read_mar, read_uai, write_uai

# ---------------------------------------------------------------------------------------
# UAI

MARKOV = """MARKOV
3
2 2 3
3
1 0
2 0 1
2 1 2

2
 0.436 0.564

4
 0.128 0.872
 0.920 0.080

6
 0.210 0.333 0.457
 0.811 0.000 0.189
"""

# Odd spacing on purpose: tabs, blank lines, a table split across lines.
BAYES = "BAYES\n\n2\t\n2 3\n2\n1 0\n   2 0 1\n2 0.25\n0.75\n\n6 0.1 0.2 0.7\n\t0.3 0.3 0.4"


def test_read_markov():
    g = read_uai(MARKOV)
    assert g.variables == {"0": 2, "1": 2, "2": 3}
    assert [f.scope for f in g.factors] == [("0",), ("0", "1"), ("1", "2")]
    np.testing.assert_array_equal(g.factors[0].values, [0.436, 0.564])
    # The last scope variable varies fastest.
    np.testing.assert_array_equal(g.factors[2].values, [[0.210, 0.333, 0.457], [0.811, 0.000, 0.189]])
    assert g.name == "uai"


def test_read_bayes_with_odd_whitespace_and_gzip(tmp_path):
    g = read_uai(BAYES)
    assert g.variables == {"0": 2, "1": 3}
    assert [f.scope for f in g.factors] == [("0",), ("0", "1")]
    np.testing.assert_array_equal(g.factors[1].values, [[0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
    path = tmp_path / "net.uai.gz"
    path.write_bytes(gzip.compress(BAYES.encode()))
    for source in (path, str(path)):
        g2 = read_uai(source)
        assert g2.name == "net"
        np.testing.assert_array_equal(g2.factors[1].values, g.factors[1].values)


def test_read_uai_missing_file_is_not_parsed_as_text():
    with pytest.raises(FileNotFoundError):
        read_uai("no/such/model.uai")


@st.composite
def small_graphs(draw):
    n = draw(st.integers(1, 4))
    domains = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    names = [f"v{i}" for i in range(n)]
    factors = []
    for _ in range(draw(st.integers(0, 4))):
        order = draw(st.permutations(range(n)))
        scope = tuple(names[i] for i in order[: draw(st.integers(0, n))])
        size = math.prod(domains[names.index(v)] for v in scope)
        values = draw(
            st.lists(
                st.floats(0.0, 1e300, allow_nan=False, allow_infinity=False), min_size=size, max_size=size
            )
        )
        factors.append((scope, np.array(values, dtype=np.float64)))
    return factor_graph(dict(zip(names, domains)), factors)


@settings(max_examples=60, deadline=None)
@given(small_graphs())
def test_write_read_uai_round_trip(g):
    back = read_uai(write_uai(g))
    position = {v: str(i) for i, v in enumerate(g.variables)}
    assert list(back.variables.values()) == list(g.variables.values())
    assert len(back.factors) == len(g.factors)
    for f, b in zip(g.factors, back.factors):
        assert b.scope == tuple(position[v] for v in f.scope)
        np.testing.assert_array_equal(b.values, f.values)  # exact: repr round trips


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", {}),
        ("0", {}),
        ("1 0", {}),  # older layout: one sample, nothing observed
        ("2 0 1 2 2", {"0": 1, "2": 2}),  # modern: N v x ...
        ("1\n2 0 1 2 2\n", {"0": 1, "2": 2}),  # older: sample count first
        ("1 2 0", {"2": 0}),  # modern with N = 1 (odd count), not the older layout
        ("2 1 1 1 1", {"1": 1}),  # the same observation twice is harmless
    ],
)
def test_read_evidence_layouts(text, expected):
    assert read_evidence(text, read_uai(MARKOV)) == expected


@pytest.mark.parametrize(
    "text, message",
    [
        ("1 3 0", "variable index must be in [0, 3)"),
        ("1 2 3", "state of variable 2 ('2', domain size 3) must be in [0, 3)"),
        ("2 0 1", "the file has 3 numbers, which fits neither the modern layout"),
        ("1\n2 0 1", "the file has 4 numbers, which fits neither"),
        ("1 2 0 1", "fits neither"),
        ("2\n1 0 1\n1 1 1", "2 evidence samples (older layout)"),
        ("2 0 1 0 0", "observed twice with different states"),
        ("1 x 0", "expected a variable index (an integer)"),
    ],
)
def test_read_evidence_errors(tmp_path, text, message):
    path = tmp_path / "bad.evid"
    path.write_text(text)
    with pytest.raises(FactorGraphError) as err:
        read_evidence(path, read_uai(MARKOV))
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_format_mar():
    g = read_uai(MARKOV)
    marginals = {"0": np.array([0.25, 0.75]), "1": [1 / 3, 2 / 3], "2": np.array([0.1, 0.2, 0.7])}
    text = format_mar(g, marginals)
    lines = text.splitlines()
    assert lines[0] == "MAR"
    assert lines[1] == ("3 2 0.25 0.75 2 0.3333333333333333 0.6666666666666666 3 0.1 0.2 0.7")
    assert float(lines[1].split()[5]) == 1 / 3  # values read back exactly
    with pytest.raises(FactorGraphError, match="no marginal for variable '2'"):
        format_mar(g, {"0": [0.5, 0.5], "1": [0.5, 0.5]})
    with pytest.raises(FactorGraphError, match="has 2 values, its domain size is 3"):
        format_mar(g, {**marginals, "2": [0.5, 0.5]})


@pytest.mark.parametrize(
    "text, message",
    [
        ("MARKOV\n1\n2\n1\n1 0\n2\n0.5", "the file ends early, factor 0's table needs 2 entries"),
        (
            "MARKOV\n1\n2\n1\n1 0\n3\n0.5 0.5 0.5",
            "factor 0's table has 3 entries, its scope's domains (2,) give 2",
        ),
        (
            "MARKOV\n1\n2\n1\n1 0\n2\n0.5 -0.5",
            "factor 0's table: entry 1 must be a finite non-negative number",
        ),
        ("MARKOV\n1\n2\n1\n1 0\n2\n0.5 nan", "entry 1 must be a finite non-negative number"),
        ("MARKOV\n1\n2\n1\n1 0\n2\n0.5 abc", "entry 1 is not a number"),
        ("MARKOV\n1\n2\n1\n1 1\n2\n0.5 0.5", "a variable index in the scope of factor 0 must be in [0, 1)"),
        ("MARKOV\n2\n2 2\n1\n2 1 1\n4\n1 1 1 1", "factor 0 has a variable twice in its scope"),
        ("MARKOV\n1\n0\n0", "the domain size of variable 0 must be >= 1"),
        ("MARKOV\n1\n2\n1\n1 0\n2\n0.5 0.5 7", "unexpected text after the last of the 1 tables"),
        ("MARKOV\n2\n2", "the file ends early, expected the domain size of variable 1"),
        ("CSP\n1\n2\n0", "the file must start with MARKOV or BAYES"),
    ],
)
def test_read_uai_errors(tmp_path, text, message):
    path = tmp_path / "bad.uai"
    path.write_text(text)
    with pytest.raises(FactorGraphError) as err:
        read_uai(path)
    assert message in str(err.value)
    assert str(err.value).startswith(f"{path}:")


def test_read_uai_error_has_line_and_token():
    with pytest.raises(FactorGraphError, match=r"^<uai text>:7: at token '-0.5'"):
        read_uai("MARKOV\n1\n2\n1\n1 0\n2\n0.5 -0.5\n")


# ---------------------------------------------------------------------------------------
# BIF

SMALL_BIF = """
// A hand-written network: comments, properties, a table, rows, a default.
network "tiny net" {
  property author = me;
}
variable A { type discrete [ 3 ] { a0, a-1, a.2 }; }
variable B {
  type discrete [2] {<5, >=5};
  property position = (1, 2);
}
/* block comment
   spanning lines { } ; */
variable C {
  type discrete [ 2 ] { c+, c- };
}
variable D {
  type discrete [ 2 ] { yes, no };
}
probability ( A ) {
  table 0.2, 0.3, 0.5;
}
probability ( B ) {
  property note = "a string with ; and // inside";
  table 0.4, 0.6;
}
probability ( C | A, B ) {
  table 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.99, 0.98, 0.97, 0.96, 0.95, 0.94;
}
probability ( D | B, C ) {
  (>=5, c-) 0.7, 0.3;
  default 0.5, 0.5;
  (<5, c+) 0.1, 0.9;
}
"""


def test_read_small_bif():
    g = read_bif(SMALL_BIF)
    assert g.name == "tiny net"
    assert g.variables == {"A": 3, "B": 2, "C": 2, "D": 2}
    assert g.states == {"A": ("a0", "a-1", "a.2"), "B": ("<5", ">=5"), "C": ("c+", "c-"), "D": ("yes", "no")}
    assert [f.scope for f in g.factors] == [("A",), ("B",), ("C", "A", "B"), ("D", "B", "C")]
    np.testing.assert_array_equal(g.factors[0].values, [0.2, 0.3, 0.5])
    # table: child slowest, last parent fastest (as pyAgrum and pgmpy read it).
    c = g.factors[2].values
    assert c.shape == (2, 3, 2)
    assert c[0, 0, 0] == 0.01 and c[0, 0, 1] == 0.02 and c[0, 1, 0] == 0.03
    assert c[1, 2, 1] == 0.94
    np.testing.assert_allclose(c.sum(axis=0), 1.0)
    d = g.factors[3].values
    np.testing.assert_array_equal(d[:, 1, 1], [0.7, 0.3])
    np.testing.assert_array_equal(d[:, 0, 0], [0.1, 0.9])
    np.testing.assert_array_equal(d[:, 0, 1], [0.5, 0.5])  # default
    np.testing.assert_array_equal(d[:, 1, 0], [0.5, 0.5])


def test_bif_table_equals_rows():
    # The same 2-parent CPT written as a table and as rows (in shuffled order).
    head = """variable X { type discrete [ 3 ] { x0, x1, x2 }; }
variable P { type discrete [ 2 ] { p0, p1 }; }
variable Q { type discrete [ 2 ] { q0, q1 }; }
probability ( P ) { table 0.5, 0.5; }
probability ( Q ) { table 0.5, 0.5; }
"""
    rng = np.random.default_rng(0)
    cpt = rng.random((3, 2, 2))
    cpt /= cpt.sum(axis=0)
    table = ", ".join(repr(float(v)) for v in cpt.reshape(-1))
    rows = [
        f"(p{p}, q{q}) " + ", ".join(repr(float(v)) for v in cpt[:, p, q]) + ";"
        for q in (1, 0)
        for p in (1, 0)
    ]
    g_table = read_bif(head + f"probability ( X | P, Q ) {{ table {table}; }}", normalize=False)
    g_rows = read_bif(head + "probability ( X | P, Q ) {\n" + "\n".join(rows) + "\n}", normalize=False)
    np.testing.assert_array_equal(g_table.factors[0].values, cpt)  # exact float64
    np.testing.assert_array_equal(g_rows.factors[0].values, cpt)


def test_bif_table_order_matches_pyagrum(tmp_path):
    # The real networks use `table` only for parentless variables, so pin the order of a
    # parented table against pyAgrum directly (domains 3, 2, 4: any mix-up shows).
    gum = pytest.importorskip("pyagrum")
    values = np.arange(1, 25, dtype=np.float64)
    text = (
        """network order { }
variable C { type discrete [ 3 ] { c0, c1, c2 }; }
variable A { type discrete [ 2 ] { a0, a1 }; }
variable B { type discrete [ 4 ] { b0, b1, b2, b3 }; }
probability ( A ) { table 0.5, 0.5; }
probability ( B ) { table 0.25, 0.25, 0.25, 0.25; }
probability ( C | A, B ) { table """
        + ", ".join(map(repr, values.tolist()))
        + "; }\n"
    )
    ours = read_bif(text, normalize=False).factors[0]  # factors follow the variables: C first
    assert ours.scope == ("C", "A", "B")
    np.testing.assert_array_equal(ours.values, values.reshape(3, 2, 4))
    bn = pyagrum_network(gum, text, tmp_path)[0]  # keep bn alive: its CPTs live inside it
    cpt = bn.cpt("C")
    for c, a, b in np.ndindex(3, 2, 4):
        at = gum.Instantiation(cpt)
        at.chgVal("C", c), at.chgVal("A", a), at.chgVal("B", b)
        assert cpt.get(at) == ours.values[c, a, b]


def test_bif_rows_are_normalized_unless_asked_not_to():
    # rounded rows (within 1e-6 of 1) are normalized; rows further off: tests/test_bif_row_sums.py
    text = _TWO + "probability ( B | A ) { (a0) 0.3333333, 0.6666666; (a1) 0.1, 0.9; }\n"
    written = read_bif(text, normalize=False).factors[1].values
    np.testing.assert_array_equal(written[:, 0], [0.3333333, 0.6666666])
    rows = read_bif(text).factors[1].values
    np.testing.assert_allclose(rows.sum(axis=0), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_allclose(rows[:, 0], np.array([0.3333333, 0.6666666]) / 0.9999999, rtol=1e-15)
    with pytest.raises(FactorGraphError, match="sums to 0"):
        read_bif(_TWO + "probability ( B | A ) { (a0) 0, 0; (a1) 0.1, 0.9; }\n")


def test_read_bif_gz_path(tmp_path):
    path = tmp_path / "tiny.bif.gz"
    path.write_bytes(gzip.compress(SMALL_BIF.encode()))
    g = read_bif(path)
    assert g.name == "tiny"  # the file name wins over the network name
    assert read_bif(path, name="other").name == "other"


_TWO = """variable A { type discrete [ 2 ] { a0, a1 }; }
variable B { type discrete [ 2 ] { b0, b1 }; }
probability ( A ) { table 0.5, 0.5; }
"""


@pytest.mark.parametrize(
    "cpt, message",
    [
        (
            "probability ( B | A ) { (a0) 0.1, 0.9; (a2) 0.5, 0.5; }",
            "variable 'B': row (a2): 'a2' is not a state of parent 'A' (states: a0, a1)",
        ),
        ("probability ( B | A ) { (a0) 0.1, 0.9; }", "variable 'B': no row for (A=a1)"),
        (
            "probability ( B | A ) { (a0) 0.1, 0.9; (a1) 0.5; }",
            "variable 'B': row (a1) has 1 values, the child has 2 states",
        ),
        (
            "probability ( B | A ) { (a0) 0.1, 0.9; (a0) 0.5, 0.5; }",
            "variable 'B': this parent configuration already has a row",
        ),
        ("probability ( B | A ) { table 0.1, 0.9, 0.5; }", "variable 'B': table has 3 values, expected 4"),
        ("probability ( B | A ) { (a0) 0.1, 0.9; (a1) 0.5, x; }", "variable 'B': rows: 'x' is not a number"),
        (
            "probability ( B | A ) { (a0) 0.1, 0.9; (a1) -0.5, 1.5; }",
            "P(B=b0 | A=a1) = -0.5; CPT entries must be finite and non-negative",
        ),
        ("probability ( B | Z ) { table 0.5, 0.5; }", "variable 'B': unknown parent 'Z'"),
        ("probability ( B | A ) { (a0, a1) 0.1, 0.9; }", "gives 2 parent states, there are 1"),
        ("probability ( B | A ) { (a0) 0.1, 0.9 }", "missing ';'"),
        ("", "variable 'B' has no probability block"),
        (
            "probability ( B ) { table 0.5, 0.5; }\nprobability ( C ) { table 1; }",
            "probability block for undeclared variable 'C'",
        ),
        (
            "probability ( B ) { table 0.5, 0.5; }\nvariable B { type discrete [ 1 ] { b }; }",
            "variable 'B' is declared twice",
        ),
        (
            "probability ( B ) { table 0.5, 0.5; }\nvariable C { type discrete [ 3 ] { x, y }; }",
            "variable 'C': declares 3 states but lists 2",
        ),
        ("probability ( B ) { table 0.5, 0.5; }\nbogus", "expected 'network', 'variable' or"),
        ("probability ( B ) { table 0.5, 0.5;", "this '{' is never closed"),
    ],
)
def test_read_bif_errors(tmp_path, cpt, message):
    path = tmp_path / "bad.bif"
    path.write_text(_TWO + cpt)
    with pytest.raises(FactorGraphError) as err:
        read_bif(path)
    assert message in str(err.value)
    assert re.match(rf"{re.escape(str(path))}:\d+: ", str(err.value))


# ---------------------------------------------------------------------------------------
# The bnlearn networks, against pyAgrum


def _bnlearn_file(name):
    if name not in bnlearn.available():
        pytest.skip(f"{name} not in {bnlearn.data_dir()} (run python -m catbp_jit.frontend.bnlearn)")
    return bnlearn.network_path(name)


@pytest.mark.parametrize("name", bnlearn.NETWORKS)
def test_bnlearn_network_matches_pyagrum(name, tmp_path):
    path = _bnlearn_file(name)
    gum = pytest.importorskip("pyagrum")
    g = read_bif(path, normalize=False)
    assert g.name == name
    bn, label_of = pyagrum_network(gum, gzip.decompress(path.read_bytes()).decode(), tmp_path)

    assert set(bn.names()) == set(g.variables)
    assert len(g.factors) == len(g.variables)
    for factor in g.factors:
        child = factor.scope[0]
        var = bn.variableFromName(child)
        assert var.domainSize() == g.variables[child]
        assert tuple(label_of.get(s, s) for s in var.labels()) == g.states[child]
        cpt = bn.cpt(child)
        # pyAgrum's toarray() puts the axes in the reverse of variablesSequence() order.
        axes = [v.name() for v in reversed(cpt.variablesSequence())]
        theirs = cpt.toarray()
        assert theirs.shape == tuple(g.variables[v] for v in axes)
        assert sorted(axes) == sorted(factor.scope)
        assert axes[-1] == child  # pyAgrum keeps the child first in its sequence
        theirs = theirs.transpose([axes.index(v) for v in factor.scope])
        # pyAgrum keeps float32-rounded entries; ours are the written float64 values.
        np.testing.assert_allclose(
            factor.values, theirs, rtol=1e-6, atol=0, err_msg=f"{name}: CPT of {child}"
        )


@pytest.mark.parametrize("name", bnlearn.NETWORKS)
def test_bnlearn_cpts_are_normalized(name):
    _bnlearn_file(name)
    g = bnlearn.load_network(name)
    for factor in g.factors:
        np.testing.assert_allclose(
            factor.values.sum(axis=0), 1.0, rtol=0, atol=1e-6, err_msg=f"{name}: CPT of {factor.scope[0]}"
        )


# ---------------------------------------------------------------------------------------
# bnlearn: where the files come from


def test_network_path_missing_says_how_to_fetch(tmp_path, monkeypatch):
    monkeypatch.setenv("CATBP_JIT_BNLEARN_DIR", str(tmp_path))
    assert bnlearn.data_dir() == tmp_path
    assert bnlearn.available() == []
    with pytest.raises(FileNotFoundError) as err:
        bnlearn.network_path("alarm")
    assert "python -m catbp_jit.frontend.bnlearn" in str(err.value)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(FileNotFoundError, match="the bnlearn networks are: asia"):
        bnlearn.load_network("nonsense")


def _fake_wheel(path, skip=()):
    bif = gzip.compress(_TWO.encode() + b"probability ( B ) { table 0.5, 0.5; }")
    with zipfile.ZipFile(path, "w") as zf:
        for name in bnlearn.NETWORKS:
            if name not in skip:
                zf.writestr(f"pgmpy/utils/example_models/{name}.bif.gz", bif)
        zf.writestr("pgmpy/__init__.py", "")
        zf.writestr("pgmpy/utils/example_models/readme.txt", "")
    return path


def test_fetch_extracts_models_from_a_wheel(tmp_path, monkeypatch):
    wheel = _fake_wheel(tmp_path / "pgmpy-0.1.26-py3-none-any.whl")
    dest = tmp_path / "cache" / "bnlearn"
    assert bnlearn.fetch(dest, wheel=wheel) == dest
    assert sorted(p.name for p in dest.iterdir()) == sorted(f"{n}.bif.gz" for n in bnlearn.NETWORKS)
    assert [p.name for p in dest.parent.iterdir()] == ["bnlearn"]  # no temp dir left behind
    # Idempotent: a complete directory needs neither pip nor the wheel.
    assert bnlearn.fetch(dest, pip="/nonexistent/python", wheel=tmp_path / "gone.whl") == dest
    monkeypatch.setenv("CATBP_JIT_BNLEARN_DIR", str(dest))
    assert bnlearn.available() == list(bnlearn.NETWORKS)
    assert bnlearn.load_network("asia").variables == {"A": 2, "B": 2}

    # A partial directory is completed in place.
    (dest / "alarm.bif.gz").unlink()
    bnlearn.fetch(dest, wheel=wheel)
    assert (dest / "alarm.bif.gz").is_file()


def test_fetch_errors(tmp_path):
    dest = tmp_path / "models"
    with pytest.raises(RuntimeError, match=r"lacks the example models \['munin'\]"):
        bnlearn.fetch(dest, wheel=_fake_wheel(tmp_path / "w.whl", skip=("munin",)))
    assert not dest.exists()
    fake_python = tmp_path / "python"
    fake_python.write_text("#!/bin/sh\necho 'no route to the registry' >&2\nexit 3\n")
    fake_python.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"(?s)exited with status 3.*no route to the registry"):
        bnlearn.fetch(dest, pip=str(fake_python))
    with pytest.raises(RuntimeError, match="could not run"):
        bnlearn.fetch(dest, pip=str(tmp_path / "missing-python"))
    assert not dest.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".bnlearn")] == []


@pytest.mark.slow
def test_fetch_downloads_pgmpy_wheel(tmp_path, monkeypatch):
    dest = bnlearn.fetch(tmp_path / "bnlearn", pip=sys.executable)
    monkeypatch.setenv("CATBP_JIT_BNLEARN_DIR", str(dest))
    assert bnlearn.available() == list(bnlearn.NETWORKS)
    g = bnlearn.load_network("asia")
    assert len(g.variables) == 8 and g.states["asia"] == ("yes", "no")


def test_read_mar_round_trips_and_refuses_mismatches():
    g = factor_graph({"a": 2, "b": 3}, [])
    marg = {"a": np.array([0.25, 0.75]), "b": np.array([0.5, 0.25, 0.25])}
    back = read_mar(format_mar(g, marg), g)
    assert all(np.array_equal(back[v], marg[v]) for v in marg)
    with pytest.raises(FactorGraphError, match="marginals of 1 variables"):
        read_mar("MAR\n1 2 0.5 0.5", g)
    with pytest.raises(FactorGraphError, match="domain size is 3"):
        read_mar("MAR\n2 2 0.5 0.5 2 0.5 0.5", g)
    with pytest.raises(FactorGraphError, match="not a MAR file"):
        read_mar("MAR\n2 2 0.5 0.5 3 0.5", g)
