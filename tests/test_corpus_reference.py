"""The reference interpreter reproduces every slot CatBP's VM produced on the corpus.

Two promises (docs/ir.md, "Same machine, other machines"):

1. On one machine, bit for bit: the programs as loaded, printed to the listing and parsed
   back, and handed over as CatBP's own classes (foreign objects with the other argument
   spellings) give the same bits, all run live here (np.array_equal, NaN-aware), with the
   same dtype and spec.
2. Against the results stored in the bundles, computed by CatBP's VM on another machine:
   SAT, COUNT and PROB bit for bit (no transcendental: every operation is IEEE-exact and
   numpy sums in the same order on every x86-64 CPU); LOGPROB within STORED_LOGPROB_TOL,
   because numpy's exp and log take other SIMD code paths on CPUs with and without
   AVX-512 and differ there in the last few ulps.
"""

import numpy as np
import pytest

import foreign
from catbp_jit.bundle import load_bundle
from catbp_jit.ir.adapt import adapt_program
from catbp_jit.ir.listing import format_programs
from catbp_jit.ir.text import parse_programs
from catbp_jit.ir.validate import validate_programs
from catbp_jit.reference import run_program
from conftest import CORPUS

IDS = [p.name for p in CORPUS]

# |ours - stored| <= tol * max(1, |stored|): relative for |x| >= 1, absolute below (a
# log's absolute error is its probability's relative error, so a log near 0 is held to
# an absolute bound). Measured: at most 4 ulp (7.8e-16 relative, 1.8e-15 absolute)
# between an AVX-512 and an AVX2 CPU; the bound leaves room for a chain of such steps.
STORED_LOGPROB_TOL = {np.dtype(np.float64): 4e-15, np.dtype(np.float32): 2e-6}


def run_linked(programs, sr, fp, sp):
    slots = None
    for p in programs:
        slots = run_program(p, sr, fp, sp, slots=slots)
    return slots


def assert_same_keys_and_specs(got, expected):
    assert set(got) == set(expected), set(got) ^ set(expected)
    for key, (want, want_spec) in expected.items():
        arr, spec = np.asarray(got[key][0]), got[key][1]
        assert spec == want_spec, key
        assert arr.dtype == np.asarray(want).dtype, (key, arr.dtype, np.asarray(want).dtype)
        assert arr.shape == np.asarray(want).shape, key


def assert_same_bits(got, want_slots):
    """Promise 1: two live runs on this machine."""
    assert_same_keys_and_specs(got, want_slots)
    for key, (want, _) in want_slots.items():
        want = np.asarray(want)
        assert np.array_equal(np.asarray(got[key][0]), want, equal_nan=want.dtype.kind == "f"), key


def assert_matches_stored(got, bundle):
    """Promise 2: a live run against the bundle's stored results."""
    assert_same_keys_and_specs(got, bundle.expected_slots)
    for key, (want, _) in bundle.expected_slots.items():
        arr = np.asarray(got[key][0])
        if bundle.semiring != "LOGPROB":
            assert np.array_equal(arr, want, equal_nan=want.dtype.kind == "f"), key
            continue
        # -inf (an empty sum) and NaN (a normalized empty message) are exact
        assert np.array_equal(np.isnan(arr), np.isnan(want)), (key, "NaN positions")
        fin = np.isfinite(want)
        assert np.array_equal(arr[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)]), (key, "inf")
        a, w = arr[fin].astype(np.float64), want[fin].astype(np.float64)
        bound = STORED_LOGPROB_TOL[want.dtype] * np.maximum(1.0, np.abs(w))
        assert np.all(np.abs(a - w) <= bound), (key, float(np.max(np.abs(a - w) / bound)), "x the bound")


@pytest.fixture(params=CORPUS, ids=IDS, scope="module")
def bundle(request):
    return load_bundle(request.param)


@pytest.fixture(scope="module")
def live(bundle):
    """The reference's slots for the bundle's programs as loaded, run here."""
    return run_linked(
        bundle.programs, bundle.semiring_runtime(), bundle.factor_provider, bundle.selector_provider
    )


def test_reference_reproduces_corpus(bundle, live):
    assert_matches_stored(live, bundle)
    z = np.asarray(live[("Z",)][0])
    assert z.shape == ()
    if bundle.expected_Z is not None:  # the stored Z field is the stored Z slot
        assert np.array_equal(
            np.asarray(bundle.expected_Z, dtype=z.dtype), bundle.expected_slots[("Z",)][0], equal_nan=True
        )


def test_reference_is_deterministic(bundle, live):
    again = run_linked(
        bundle.programs, bundle.semiring_runtime(), bundle.factor_provider, bundle.selector_provider
    )
    assert_same_bits(again, live)


def test_reference_after_print_and_parse(bundle, live):
    text = format_programs(bundle.programs)
    programs = parse_programs(text)
    assert programs == bundle.programs
    got = run_linked(programs, bundle.semiring_runtime(), bundle.factor_provider, bundle.selector_provider)
    assert_same_bits(got, live)


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_reference_on_foreign_objects(bundle, live, variant):
    progs = [foreign.program(p, variant) for p in bundle.programs]
    # adapting CatBP's classes gives back exactly our canonical programs
    assert [adapt_program(p).instructions for p in progs] == [p.instructions for p in bundle.programs]
    sr = foreign.SemiringRuntime(bundle.semiring, bundle.dtype)
    got = run_linked(progs, sr, foreign.provider(bundle.factors), foreign.provider(bundle.selectors))
    assert_same_bits(got, live)


def test_stored_bound_is_tight_enough_to_fail():
    """A LOGPROB result one part in 1e-14 off the stored one is refused: the bound is a
    few ulp, not a tolerance that would pass a wrong engine."""
    logprob = [p for p in CORPUS if "__logprob_float64" in p.name]
    assert logprob, "the corpus has LOGPROB float64 bundles"
    b = load_bundle(logprob[0])
    off = {
        k: (np.where(np.isfinite(w), w + 1e-14 * np.maximum(1.0, np.abs(w)), w), spec)
        for k, (w, spec) in b.expected_slots.items()
    }
    with pytest.raises(AssertionError):
        assert_matches_stored(off, b)
    assert_matches_stored(dict(b.expected_slots), b)


def test_corpus_is_well_formed(bundle):
    checked = validate_programs(
        bundle.programs, factor_specs=bundle.factor_specs(), selector_specs=bundle.selector_specs()
    )
    for key, (_, spec) in bundle.expected_slots.items():
        assert checked.slot_specs[key] == spec
