"""BIF CPT rows: rounding is normalized away, anything more is kept and warned about once."""

import warnings

import numpy as np
import pytest

from catbp_jit.cli import main
from catbp_jit.frontend.bif import CPTSumWarning, read_bif

AB = "variable a { type discrete [2] { x, y }; }\nvariable b { type discrete [2] { x, y }; }\n"


def _values(graph, i):
    return np.asarray(graph.factors[i].values)


def test_rounded_rows_are_normalized_silently():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = read_bif(
            AB + "probability (a) { table 0.3, 0.7000004; }\n"
            "probability (b | a) { (x) 0.5, 0.5; (y) 0.2, 0.7999995; }"
        )
    np.testing.assert_allclose(_values(g, 0).sum(axis=0), 1, rtol=0, atol=1e-15)
    np.testing.assert_allclose(_values(g, 1).sum(axis=0), 1, rtol=0, atol=1e-15)


def test_rows_beyond_rounding_are_kept_with_one_warning_naming_the_cpts():
    text = AB + ("probability (a) { table 0.3, 0.9; }\nprobability (b | a) { (x) 0.5, 0.5; (y) 0.2, 0.2; }")
    with pytest.warns(CPTSumWarning) as caught:
        g = read_bif(text)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert "the CPTs of a, b have rows that do not sum to 1" in message
    assert "used as written" in message
    np.testing.assert_array_equal(_values(g, 0), [0.3, 0.9])
    np.testing.assert_array_equal(_values(g, 1), [[0.5, 0.2], [0.5, 0.2]])  # [b, a]


def test_only_the_rows_beyond_rounding_are_kept():
    with pytest.warns(CPTSumWarning, match="the CPTs of b have"):
        g = read_bif(
            AB + "probability (a) { table 0.5, 0.5; }\n"
            "probability (b | a) { (x) 0.5, 0.5000005; (y) 0.3, 0.3; }"
        )
    np.testing.assert_allclose(_values(g, 1)[:, 0].sum(), 1, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(_values(g, 1)[:, 1], [0.3, 0.3])


def test_normalize_false_keeps_every_row_as_written():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = read_bif(
            AB + "probability (a) { table 0.3, 0.7000004; }\n"
            "probability (b | a) { table 0.5, 0.2, 0.5, 0.9; }",
            normalize=False,
        )
    np.testing.assert_array_equal(_values(g, 0), [0.3, 0.7000004])
    np.testing.assert_array_equal(_values(g, 1), [[0.5, 0.2], [0.5, 0.9]])


def test_the_command_line_prints_the_warning_as_one_line(tmp_path, capsys):
    path = tmp_path / "off.bif"
    path.write_text(
        AB + "probability (a) { table 0.3, 0.9; }\nprobability (b | a) { table 0.5, 0.2, 0.5, 0.8; }"
    )
    assert main(["solve", str(path), "--target", "reference", "-q"]) == 0
    err = capsys.readouterr().err
    assert err == (
        f"catbp-jit: warning: {path}: the CPTs of a have rows that do not sum to 1 "
        "(a row of a's sums to 1.2); they are used as written, not normalized\n"
    )
