"""Errors that list names stay short: the first few names, then how many more."""

import pytest

from catbp_jit.errors import clip, name_list
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.graph import FactorGraphError, factor_graph


def test_name_list_cuts_long_lists_and_long_names():
    assert name_list("abc") == "a, b, c"
    assert name_list(range(10_000)) == "0, 1, 2, 3, 4, 5, 6, 7, ... and 9,992 more"
    assert name_list("ab", repr, sep=" -> ") == "'a' -> 'b'"
    assert clip("x" * 10**6) == "x" * 80 + "... (1,000,000 characters)"


def _cycle_bif(n: int) -> str:
    variables = "".join(f"variable v{i} {{ type discrete [2] {{ x, y }}; }}\n" for i in range(n))
    cpts = "".join(f"probability (v{i} | v{(i + 1) % n}) {{ table 1, 1, 1, 1; }}\n" for i in range(n))
    return variables + cpts


def test_a_ten_thousand_variable_cycle_is_one_short_line():
    with pytest.raises(FactorGraphError) as err:
        read_bif(_cycle_bif(10_000))
    message = str(err.value)
    assert len(message) < 1000 and "\n" not in message
    assert "the parents form a cycle, " in message and "... and 9,993 more" in message


def test_a_factor_over_ten_thousand_variables_names_a_few():
    domains = {f"v{i}": 1 for i in range(10_000)}
    with pytest.raises(FactorGraphError) as err:
        factor_graph(domains, [(tuple(domains) + ("nope",), None)])
    assert len(str(err.value)) < 1000 and "... and 9,993 more" in str(err.value)


def test_a_parent_with_ten_thousand_states_is_listed_short():
    states = ", ".join(f"s{i}" for i in range(10_000))
    text = (
        f"variable p {{ type discrete [10000] {{ {states} }}; }}\n"
        "variable c { type discrete [2] { x, y }; }\n"
        f"probability (p) {{ default {', '.join(['1e-4'] * 10_000)}; }}\n"
        "probability (c | p) { (nope) 0.5, 0.5; }"
    )
    with pytest.raises(
        FactorGraphError,
        match=r"not a state of parent 'p' \(states: s0, s1, "
        r".*\.\.\. and 9,992 more\)",
    ) as err:
        read_bif(text)
    assert len(str(err.value)) < 1000


def test_a_megabyte_environment_value_is_shown_clipped(monkeypatch):
    from catbp_jit.environment import EnvironmentSettingError, max_bytes

    monkeypatch.setenv("CATBP_JIT_MAX_BYTES", "8e9" * 10**6)
    with pytest.raises(EnvironmentSettingError) as err:
        max_bytes()
    assert len(str(err.value)) < 1000 and "(3,000,000 characters)" in str(err.value)


def _huge_axis_kind(text: str) -> str:
    return text.replace('"GEOMETRIC"', '"' + "G" * 10**6 + '"', 1)


def test_a_megabyte_value_in_a_bundle_is_shown_clipped(tmp_path):
    import shutil
    from pathlib import Path

    from catbp_jit.bundle import BundleError, load_bundle

    seed = Path(__file__).parent / "data" / "corpus" / "coloring_cycle5__sat_bool"
    shutil.copytree(seed, tmp_path / "b")
    path = tmp_path / "b" / "bundle.json"
    path.write_text(_huge_axis_kind(path.read_text()))
    with pytest.raises(BundleError, match="unknown axis kind 'GGG") as err:
        load_bundle(tmp_path / "b")
    assert len(str(err.value)) < 1000


def test_a_megabyte_value_in_a_saved_executable_is_shown_clipped(tmp_path):
    import json

    from catbp_jit.compiler import load
    from catbp_jit.executable import SAVE_FORMAT, SavedExecutableError

    # a saved executable's programs are read before anything is planned or compiled
    doc = {
        "format": SAVE_FORMAT,
        "version": 1,
        "dtype": "float64",
        "programs": [
            {
                "name": "p" * 10**6,
                "instructions": [
                    {"op": "LOAD_FACTOR", "dst": 1, "args": {"factor_id": 0}, "spec": [["G" * 10**6, 0, 2]]}
                ],
            }
        ],
    }
    path = tmp_path / "exe.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SavedExecutableError, match="unknown axis kind 'GGG") as err:
        load(path)
    assert len(str(err.value)) < 1000


AB = (
    "variable a { type discrete [2] { x, y }; }\n"
    "variable b { type discrete [2] { x, y }; }\n"
    "probability (a) { table 0.5, 0.5; }\n"
)


@pytest.mark.parametrize(
    "text",
    [
        AB + "probability (b | a) { (" + "x" * 10**6 + ") 0.5, 0.5; }",  # not a state
        AB + "probability (b | a) { (x " + "x" * 10**6 + ") 0.5, 0.5; }",  # two states, one parent
        AB + "probability (b | " + "a" * 10**6 + ") { table 1, 1, 1, 1; }",  # unknown parent
        "variable " + "v" * 10**6 + " { type discrete [2] { x, y }; }",  # no probability block
    ],
)
def test_megabyte_names_in_a_bif_are_shown_clipped(text):
    with pytest.raises(FactorGraphError) as err:
        read_bif(text)
    assert len(str(err.value)) < 1000 and "(1,000,00" in str(err.value)


def test_a_megabyte_state_in_json_evidence_is_shown_clipped(tmp_path, capsys):
    from pathlib import Path

    from catbp_jit.cli import main

    asia = Path(__file__).resolve().parents[1] / "examples" / "asia.bif"
    path = tmp_path / "e.json"
    path.write_text('{"smoke": "' + "n" * 10**6 + '"}')
    assert main(["solve", str(asia), "--evidence", str(path), "--target", "reference", "-q"]) == 2
    err = capsys.readouterr().err
    assert "evidence smoke='nnn" in err and len(err) < 1000


def test_a_header_over_several_lines_is_quoted_on_one_line():
    with pytest.raises(FactorGraphError, match=r"probability \(b c \| a\): expected one child"):
        read_bif(AB + "probability (b\n c\n|\n\n a) { table 1, 1; }")


def test_every_catbp_error_is_bounded_keeping_its_end():
    from catbp_jit.errors import CatbpError

    message = str(CatbpError("x" * 10**6 + ": expected y"))
    assert len(message) < 1100 and message.endswith("x: expected y")
    assert "...(999,0" in message


def test_a_thousand_digit_evidence_count_is_shown_clipped():
    from catbp_jit.frontend.uai import read_evidence, read_uai

    graph = read_uai("MARKOV 1 2 1 1 0 2 0.5 0.5")
    with pytest.raises(FactorGraphError, match="fits neither the modern layout") as err:
        read_evidence("1" * 1200, graph)
    assert len(str(err.value)) < 500


def test_a_megabyte_dtype_in_a_saved_executable_is_shown_clipped(tmp_path):
    import json

    from catbp_jit.compiler import load
    from catbp_jit.executable import SAVE_FORMAT, SavedExecutableError

    path = tmp_path / "exe.json"
    path.write_text(json.dumps({"format": SAVE_FORMAT, "version": 1, "dtype": "f" * 10**6}))
    with pytest.raises(SavedExecutableError, match="'dtype': data type") as err:
        load(path)
    assert len(str(err.value)) < 500
