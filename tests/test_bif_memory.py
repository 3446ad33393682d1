"""The BIF reader's memory is bounded by its input's size, whatever the input."""

import re
import tracemalloc

import pytest

from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.graph import FactorGraphError

N = 1_000_000  # characters: a MB (tracemalloc slows the reader some 20-fold: seconds a case)
A = "variable a { type discrete [2] { x, y }; }\n"
AB = A + "variable b { type discrete [2] { x, y }; }\nprobability (a) { table 1, 1; }\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ('network n { property p = "' + "a" * N, "this string ('\"') is never closed"),
        ('network n { property p = "' + "\\a" * (N // 2), "this string ('\"') is never closed"),
        ('network n { property p = "' + "a" * N + '"; }', None),
        ("network n { } /* " + "c " * (N // 2), "this comment ('/*') is never closed"),
        ("variable a { type discrete [2] { x, y };" + ";" * N + "}", "has no probability block"),
        (A + "probability (a) { table " + "1," * (N // 2) + "; }", f"table has {N // 2} values"),
        (
            AB + "probability (b | a) { default 1, 1; " + "(x) 1 1;" * (N // 8) + "}",
            "this parent configuration already has a row",
        ),
    ],
)
def test_peak_memory_is_a_small_multiple_of_the_input(text, message):
    tracemalloc.start()
    try:
        if message is None:
            read_bif(text)
        else:
            with pytest.raises(FactorGraphError, match=re.escape(message)):
                read_bif(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10 * len(text), f"peak {peak:,} bytes for {len(text):,} characters"
