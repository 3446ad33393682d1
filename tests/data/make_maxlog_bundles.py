"""Writes the MAXLOG bundles of tests/data/corpus (`*__maxlog_*`).

CatBP has no MAXLOG semiring, so these bundles are ours: each takes the programs, the
log-domain factors and the selectors (0 and -inf, MAXLOG's one and zero as LOGPROB's) of a
LOGPROB bundle of the corpus, cast to its dtype, and its expected slots are what
catbp_jit's reference interpreter computes (`catbp_jit.reference.run_program`, the three
programs in order with the slots carried over). Run from the repository root:

    .venv/bin/python tests/data/make_maxlog_bundles.py
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from catbp_jit.bundle import load_bundle, save_bundle
from catbp_jit.reference import run_program
from catbp_jit.semiring import make_semiring

CORPUS = Path(__file__).resolve().parent / "corpus"
# name -> (the LOGPROB bundle it is made from, dtype). Few, and float64 only: every
# corpus test runs every bundle (batched, through the CLI, between barriers, on the CUDA
# simulator, ...), and float32's kernels would cost the suite some 10 s of compiling; the
# random programs cover the rest (an all -inf max, ties), the slow tests float32. One:
# a second (grid3_d2's) cost the default suite some 30 s of compiling across those tests
BUNDLES = {
    "z4_cycle__maxlog_float64_normalized": ("z4_cycle__logprob_float64_normalized", "float64"),
}


def maxlog_bundle(name: str, source: str, dtype: str):
    b = load_bundle(CORPUS / source)
    assert b.semiring == "LOGPROB", source
    dt = np.dtype(dtype)

    def cast(table):
        return {k: (np.asarray(a, dtype=dt), spec) for k, (a, spec) in table.items()}

    b = replace(
        b, name=name, semiring="MAXLOG", dtype=dt, factors=cast(b.factors), selectors=cast(b.selectors)
    )
    slots: dict = {}
    with np.errstate(invalid="ignore"):  # an all -inf NORMALIZE gives NaN, as LOGPROB's
        for program in b.programs:
            slots = run_program(
                program, make_semiring("MAXLOG", dt), b.factor_provider, b.selector_provider, slots=slots
            )
    expected = {k: (np.asarray(a, dtype=dt), spec) for k, (a, spec) in slots.items()}
    return replace(
        b, expected_slots=expected, expected_Z=float(expected[("Z",)][0]), Z_bruteforce=None, path=None
    )


if __name__ == "__main__":
    for name, (source, dtype) in BUNDLES.items():
        print(save_bundle(maxlog_bundle(name, source, dtype), CORPUS / name))
