"""Reading and writing catbp-bundles: every shared bundle loads, and save/load round-trips."""

import json
import shutil

import numpy as np
import pytest

from catbp_jit.bundle import (
    Bundle,
    bundle_differences,
    load_bundle,
    program_from_json,
    program_to_json,
    save_bundle,
)
from catbp_jit.errors import UnknownInputError
from catbp_jit.ir.ops import OpCode, Program
from catbp_jit.ir.schema import AxisType, TensorSpec
from conftest import BENCH, CORPUS, shared_dir

ALL = CORPUS + BENCH
PROGRAM_NAMES = ["upward", "downward", "finalize"]
# Small bundles covering every semiring and dtype, -inf in LOGPROB, and a bench bundle.
ROUND_TRIP = [
    "grid3_d2__prob_float64",
    "grid3_d2__prob_float32",
    "grid3_d2__count_int64",
    "grid3_d2__sat_bool",
    "hard_cycle5_d4__logprob_float64",
    "z4_cycle__logprob_float64_normalized",
]
SMALL = "z4_cycle__prob_float64"


def corpus(name):
    d = shared_dir() / "corpus" / name
    if not (d / "bundle.json").exists():
        pytest.skip(f"corpus bundle {name} not present")
    return d


def test_shared_bundles_found():
    assert CORPUS, f"no corpus bundles under {shared_dir() / 'corpus'}"


@pytest.mark.parametrize("d", ALL, ids=[f"{p.parent.name}/{p.name}" for p in ALL])
def test_load_shared_bundle(d):
    raw = json.loads((d / "bundle.json").read_text())
    b = load_bundle(d)
    assert isinstance(b, Bundle)
    assert b.name == raw["name"] == d.name
    assert b.path == d
    assert b.semiring == raw["semiring"]
    assert b.dtype == np.dtype(raw["dtype"])
    assert len(b.factors) == len(raw["factors"])
    assert len(b.selectors) == len(raw["selectors"])
    assert [p.name for p in b.programs] == PROGRAM_NAMES
    assert [len(p) for p in b.programs] == [len(p["instructions"]) for p in raw["programs"]]
    assert b.semiring_runtime().dtype == b.dtype

    for table in (b.factors, b.selectors, b.expected_slots or {}):
        for arr, spec in table.values():
            assert isinstance(arr, np.ndarray) and isinstance(spec, TensorSpec)
            assert arr.shape == spec.shape
            assert arr.dtype == b.dtype  # stored already in the semiring's domain

    if d.parent.name == "corpus":
        assert len(b.expected_slots) == len(raw["expected"]["slots"])
        z = b.expected_slots[("Z",)][0]
        assert z.shape == ()
        assert np.array_equal(z, np.asarray(b.expected_Z, dtype=b.dtype), equal_nan=True)
    else:  # bench bundles ship no expected slots, only the exact Z
        assert b.expected_slots is None and b.expected_Z is None
        assert isinstance(b.Z_bruteforce, float)


def test_providers_and_specs():
    b = load_bundle(corpus(SMALL))
    fid = next(iter(b.factors))
    arr, spec = b.factor_provider(fid)
    assert arr is b.factors[fid][0] and b.factor_specs()[fid] == spec
    sid = next(iter(b.selectors))
    assert b.selector_provider(sid)[1] == b.selector_specs()[sid]
    with pytest.raises(UnknownInputError, match=f"{SMALL}.*factor 9999"):
        b.factor_provider(9999)
    with pytest.raises(KeyError, match="selector 9999"):  # UnknownInputError is a KeyError
        b.selector_provider(9999)


def test_instructions_are_canonical():
    b = load_bundle(corpus("grid3_d2__prob_float64"))
    ops = {ins.op for p in b.programs for ins in p.instructions}
    assert OpCode.CONTRACT in ops and OpCode.ELIMINATE in ops
    for p in b.programs:
        for ins in p.instructions:
            if ins.op == OpCode.CONTRACT:
                assert isinstance(ins.args["out_spec"], TensorSpec)
                assert ins.args["inputs"] == tuple(ins.args["inputs"])
            elif ins.op == OpCode.ELIMINATE:
                assert all(isinstance(k[0], AxisType) for k in ins.args["keep_keys"])
            elif ins.op in (OpCode.LOAD_SLOT, OpCode.STORE_SLOT):
                assert isinstance(ins.args["slot"], tuple)
    assert all(isinstance(k, tuple) for k in b.expected_slots)
    assert ("Z",) in b.expected_slots


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip(name, tmp_path):
    d = corpus(name)
    b = load_bundle(d)
    out = save_bundle(b, tmp_path / "copy" / name)  # creates missing parents
    b2 = load_bundle(out)
    assert bundle_differences(b, b2) == []
    assert b2.programs == b.programs
    # The JSON we write is the corpus's own, byte for byte (-inf as -Infinity included).
    assert (out / "bundle.json").read_text() == (d / "bundle.json").read_text()
    assert not list(out.glob(".*.tmp"))  # temp files renamed away


def test_round_trip_bench(tmp_path):
    if not BENCH:
        pytest.skip("no bench bundles")
    d = min(BENCH, key=lambda p: (p / "arrays.npz").stat().st_size)
    b = load_bundle(d)
    b2 = load_bundle(save_bundle(b, tmp_path / d.name))
    assert bundle_differences(b, b2) == []
    assert b2.Z_bruteforce == b.Z_bruteforce and b2.expected_slots is None


def test_load_accepts_bundle_json_path():
    d = corpus(SMALL)
    assert bundle_differences(load_bundle(d / "bundle.json"), load_bundle(d)) == []


def test_differences_are_reported():
    d = corpus(SMALL)
    a, b = load_bundle(d), load_bundle(d)
    key = next(iter(b.expected_slots))
    arr, spec = b.expected_slots[key]
    b.expected_slots[key] = (arr + 1, spec)
    assert bundle_differences(a, b) == [f"expected slot {key!r}: arrays differ"]


def test_nan_arrays_compare_equal(tmp_path):
    b = load_bundle(corpus(SMALL))
    fid = next(iter(b.factors))
    arr, spec = b.factors[fid]
    arr = arr.copy()
    arr.flat[0] = np.nan
    b.factors[fid] = (arr, spec)
    b.expected_Z = float("nan")
    b2 = load_bundle(save_bundle(b, tmp_path / "nan"))
    assert bundle_differences(b, b2) == []


def test_program_json_round_trip():
    b = load_bundle(corpus("grid3_d2__prob_float64"))
    for p in b.programs:
        obj = program_to_json(p)
        json.dumps(obj)  # plain JSON, nothing numpy or enum left
        assert program_from_json(json.loads(json.dumps(obj))) == p


def test_program_from_json_other_spellings():
    # The CatBP VM's alternative argument names are canonicalized on load.
    p = program_from_json(
        {
            "name": "x",
            "instructions": [
                {"op": "LOAD_SELECTOR", "dst": 1, "args": {"mode_axis_id": 3}, "spec": None},
                {"op": "STORE_SLOT", "dst": None, "args": {"slot_key": ["msg", 1, 2], "src": 1}},
                {"op": "FREE", "dst": None, "args": {"src": 1}},
            ],
        }
    )
    assert p == Program(
        (
            program_from_json(
                {
                    "instructions": [
                        {"op": "LOAD_SELECTOR", "dst": 1, "args": {"selector_id": 3}},
                        {"op": "STORE_SLOT", "dst": None, "args": {"slot": ["msg", 1, 2], "src": 1}},
                        {"op": "FREE", "dst": None, "args": {"srcs": [1]}},
                    ]
                }
            ).instructions
        ),
        "x",
    )


# ---------------------------------------------------------------------------------------
# Broken bundles give clear errors


@pytest.fixture
def small_copy(tmp_path):
    dst = tmp_path / SMALL
    shutil.copytree(corpus(SMALL), dst)
    return dst


def _edit_json(d, edit):
    meta = json.loads((d / "bundle.json").read_text())
    edit(meta)
    (d / "bundle.json").write_text(json.dumps(meta, indent=1))


def test_wrong_version(small_copy):
    _edit_json(small_copy, lambda m: m.update(version=2))
    with pytest.raises(ValueError, match="version 2"):
        load_bundle(small_copy)


def test_wrong_format(small_copy):
    _edit_json(small_copy, lambda m: m.update(format="something-else"))
    with pytest.raises(ValueError, match="format is 'something-else'"):
        load_bundle(small_copy)


def test_missing_array(small_copy):
    with np.load(small_copy / "arrays.npz") as z:
        arrays = {k: z[k] for k in z.files}
    name = sorted(k for k in arrays if k.startswith("selector/"))[0]
    del arrays[name]
    np.savez_compressed(small_copy / "arrays.npz", **arrays)
    with pytest.raises(ValueError, match=f"{SMALL}.*selector .*{name}.*missing"):
        load_bundle(small_copy)


def test_shape_mismatch(small_copy):
    fid = next(iter(json.loads((small_copy / "bundle.json").read_text())["factors"]))

    def grow_first_axis(meta):
        meta["factors"][fid]["spec"][0][2] += 1

    _edit_json(small_copy, grow_first_axis)
    with pytest.raises(ValueError, match=rf"{SMALL}.*factor {fid}:.*has shape .* but its spec"):
        load_bundle(small_copy)


def test_slot_shape_mismatch(small_copy):
    _edit_json(small_copy, lambda m: m["expected"]["slots"][0].update(spec=[["GEOMETRIC", 0, 7]]))
    with pytest.raises(ValueError, match=r"expected slot \('Z',\).*\(\).*\(7,\)"):
        load_bundle(small_copy)


def test_bad_instruction_names_bundle(small_copy):
    _edit_json(small_copy, lambda m: m["programs"][1]["instructions"][0].update(op="JUMP"))
    with pytest.raises(ValueError, match=rf"{SMALL}.*downward.*\[0\].*JUMP"):
        load_bundle(small_copy)


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_bundle(tmp_path / "nope")


def test_missing_npz(small_copy):
    (small_copy / "arrays.npz").unlink()
    with pytest.raises(FileNotFoundError, match="arrays.npz"):
        load_bundle(small_copy)
