"""The reference interpreter reproduces every slot CatBP's VM produced on the corpus.

Bit for bit (np.array_equal, NaN-aware), with the same dtype and spec, in three ways:
programs as loaded, programs printed to the listing and parsed back, and programs handed
over as CatBP's own classes (foreign objects with the other argument spellings).
"""

import numpy as np
import pytest

from catbp_jit.bundle import load_bundle
from catbp_jit.ir.adapt import adapt_program
from catbp_jit.ir.text import format_programs, parse_programs
from catbp_jit.ir.validate import validate_programs
from catbp_jit.reference import run_program

from conftest import CORPUS
import foreign

IDS = [p.name for p in CORPUS]


def run_linked(programs, sr, fp, sp):
    slots = None
    for p in programs:
        slots = run_program(p, sr, fp, sp, slots=slots)
    return slots


def assert_slots_exact(got, bundle):
    expected = bundle.expected_slots
    assert set(got) == set(expected), set(got) ^ set(expected)
    for key, (want, want_spec) in expected.items():
        arr, spec = got[key]
        arr = np.asarray(arr)
        assert spec == want_spec, key
        assert arr.dtype == want.dtype, (key, arr.dtype, want.dtype)
        assert arr.shape == want.shape, key
        assert np.array_equal(arr, want, equal_nan=want.dtype.kind == "f"), key


@pytest.fixture(params=CORPUS, ids=IDS, scope="module")
def bundle(request):
    return load_bundle(request.param)


def test_reference_reproduces_corpus(bundle):
    got = run_linked(bundle.programs, bundle.semiring_runtime(), bundle.factor_provider,
                     bundle.selector_provider)
    assert_slots_exact(got, bundle)
    z = np.asarray(got[("Z",)][0])
    assert z.shape == ()
    if bundle.expected_Z is not None:
        assert np.array_equal(z, np.asarray(bundle.expected_Z, dtype=z.dtype), equal_nan=True)


def test_reference_after_print_and_parse(bundle):
    text = format_programs(bundle.programs)
    programs = parse_programs(text)
    assert programs == bundle.programs
    got = run_linked(programs, bundle.semiring_runtime(), bundle.factor_provider,
                     bundle.selector_provider)
    assert_slots_exact(got, bundle)


@pytest.mark.parametrize("variant", [0, 1, 2])
def test_reference_on_foreign_objects(bundle, variant):
    progs = [foreign.program(p, variant) for p in bundle.programs]
    # adapting CatBP's classes gives back exactly our canonical programs
    assert [adapt_program(p).instructions for p in progs] == [p.instructions for p in bundle.programs]
    sr = foreign.SemiringRuntime(bundle.semiring, bundle.dtype)
    got = run_linked(progs, sr, foreign.provider(bundle.factors), foreign.provider(bundle.selectors))
    assert_slots_exact(got, bundle)


def test_corpus_is_well_formed(bundle):
    checked = validate_programs(bundle.programs, factor_specs=bundle.factor_specs(),
                                selector_specs=bundle.selector_specs())
    for key, (_, spec) in bundle.expected_slots.items():
        assert checked.slot_specs[key] == spec
