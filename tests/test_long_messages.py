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
    cpts = "".join(f"probability (v{i} | v{(i + 1) % n}) {{ table 1, 1, 1, 1; }}\n"
                   for i in range(n))
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
    text = (f"variable p {{ type discrete [10000] {{ {states} }}; }}\n"
            "variable c { type discrete [2] { x, y }; }\n"
            f"probability (p) {{ default {', '.join(['1e-4'] * 10_000)}; }}\n"
            "probability (c | p) { (nope) 0.5, 0.5; }")
    with pytest.raises(FactorGraphError, match=r"not a state of parent 'p' \(states: s0, s1, "
                                               r".*\.\.\. and 9,992 more\)") as err:
        read_bif(text)
    assert len(str(err.value)) < 1000


def test_a_megabyte_environment_value_is_shown_clipped(monkeypatch):
    from catbp_jit.environment import EnvironmentSettingError, max_bytes
    monkeypatch.setenv("CATBP_JIT_MAX_BYTES", "8e9" * 10**6)
    with pytest.raises(EnvironmentSettingError) as err:
        max_bytes()
    assert len(str(err.value)) < 1000 and "(3,000,000 characters)" in str(err.value)
