"""Batched executables (batched.py, ir/batch.py): results equal row-by-row runs.

The oracle is the unbatched executable run on each row: PROB, SAT, COUNT and MAXLOG bit
for bit (a batched kernel walks each row as the unbatched one walks its value), LOGPROB within
DESIGN tolerances. Rows come in every count that matters: 0, 1, fewer than a bucket (the
rest is padding, which must never show), a bucket exactly, more than the largest bucket
(chunks), and one session runs them in turn, switching buckets.
"""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
from catbp_jit.batched import BatchedCompileError
from catbp_jit.bundle import load_bundle
from catbp_jit.errors import InputMismatchError, UnknownInputError
from catbp_jit.ir.batch import batch_axis, batch_axis_id, batch_programs
from catbp_jit.testing.alloc_counter import NrtAllocCounter, NumpyAllocCounter, enable_nrt_stats
from conftest import CORPUS
from jit_helpers import assert_rows_equal, executable, inputs, rows_of, unbatched_rows
from random_programs import cases, random_values, selector_values

G = AxisType.GEOMETRIC


# --------------------------------------------------------------------- random programs


@settings(
    max_examples=80,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(st.data())
def test_random_programs_batched_equal_row_by_row(data):
    case = data.draw(cases())
    ids = [("f", k) for k in case.factor_specs] + [("s", k) for k in case.selector_specs]
    if not ids:
        event("no inputs to batch")
        return
    chosen = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    bf = {k for kind, k in chosen if kind == "f"}
    bs = {k for kind, k in chosen if kind == "s"}
    buckets = tuple(sorted(data.draw(st.sets(st.integers(1, 6), min_size=1, max_size=3))))
    mode = data.draw(st.sampled_from(["compiled", "loop"]))
    largest = buckets[-1]
    counts = data.draw(st.permutations([0, 1, max(1, largest - 1), largest + 1, 2 * largest + 3]))
    note(
        f"{case.listing()}\nbatched factors {bf}, selectors {bs}, buckets {buckets}, "
        f"rows {counts}, mode {mode}"
    )

    sr = case.sr()
    kw = dict(
        factor_specs=case.factor_specs,
        selector_specs=case.selector_specs,
        slot_specs=case.slot_specs or None,
        mode=mode,
    )
    plain = catbp_jit.compile(case.programs, sr, **kw).bind()
    try:
        sess = catbp_jit.compile(
            case.programs, sr, batched_factors=bf, batched_selectors=bs, buckets=buckets, **kw
        ).bind()
    except BatchedCompileError as e:  # a slot whose spec would change between writes
        assert "spec was fixed" in str(e) and any(
            ins.op == OpCode.STORE_SLOT for p in case.programs for ins in p.instructions
        ), e
        event("refused: a slot batched at one write, not at another")
        return
    event(f"{case.semiring} {case.dtype.name}, {len(sess.batched_slots)} batched slot(s)")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    base = case.inputs[0]
    for n in counts:
        factors = {
            k: rows_of(
                v, n, rng, lambda r, k=k: random_values(r, case.factor_specs[k], case.semiring, case.dtype)
            )
            if k in bf
            else v
            for k, v in base.factors.items()
        }
        selectors = {
            k: rows_of(
                v,
                n,
                rng,
                lambda r, k=k: selector_values(r, case.selector_specs[k], case.semiring, case.dtype),
            )
            if k in bs
            else v
            for k, v in base.selectors.items()
        }
        with np.errstate(all="ignore"):  # COUNT wraps around on purpose
            want = unbatched_rows(plain, factors, selectors, base.slots, bf, bs, n)
        got = sess.run(factors=factors, selectors=selectors, slots=base.slots)
        assert_rows_equal(got, want, sess.batched_slots, case.semiring, case.dtype)


# -------------------------------------------------------------------- hand-made programs

A0, A1 = Axis(0, G, 3), Axis(1, G, 2)


def sp(*axes):
    return TensorSpec(axes)


def normalize_program():
    """bel = NORMALIZE(f0 ⊗ f1); m = ⊕_{G0} bel; Z = ⊕ f1 (which no batched input reaches)."""
    return Program(
        [
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
            Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": sp(A0, A1)}),
            Instruction(OpCode.NORMALIZE, None, {"src": 2}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("bel",), "src": 2}),
            Instruction(OpCode.ELIMINATE, 3, {"src": 2, "keep_keys": ((G, 1),)}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("m",), "src": 3}),
            Instruction(OpCode.ELIMINATE, 4, {"src": 1, "keep_keys": ()}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("Z",), "src": 4}),
        ],
        "p",
    )


SPECS = {0: sp(A0), 1: sp(A0, A1)}


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB", pytest.param("MAXLOG", marks=pytest.mark.slow)])
def test_normalize_works_per_row(semiring):
    """Each row is normalized alone (the whole batched tensor normalized at once would
    give every row a share of one total)."""
    sr = catbp_jit.make_semiring(semiring, np.float64)
    plain = catbp_jit.compile([normalize_program()], sr, factor_specs=SPECS).bind()
    sess = catbp_jit.compile(
        [normalize_program()], sr, factor_specs=SPECS, batched_factors={0}, buckets=(4,)
    ).bind()
    rng = np.random.default_rng(1)
    f0, f1 = rng.uniform(0.1, 3.0, (3, 3)), rng.uniform(0.1, 3.0, (3, 2))
    got = sess.run(factors={0: f0, 1: f1})
    assert sess.batched_slots == {("bel",), ("m",)}
    assert got[("bel",)][0].shape == (3, 3, 2) and got[("Z",)][0].shape == ()
    want = unbatched_rows(plain, {0: f0, 1: f1}, {}, None, {0}, set(), 3)
    assert_rows_equal(got, want, sess.batched_slots, semiring, np.dtype(np.float64))


def test_rewrite_batches_only_what_depends_on_batched_inputs():
    ax = batch_axis(batch_axis_id([normalize_program()], SPECS.values()), 5)
    assert ax.id == 2  # ids 0 and 1 are taken
    progs, slots = batch_programs([normalize_program()], ax, {0}, set())
    ins = progs[0].instructions
    assert ins[2].args["out_spec"] == sp(A0, A1, ax)
    assert ins[5].args["keep_keys"] == ((G, 1), ax.key)
    assert ins[7].args["keep_keys"] == ()  # f1 is not batched
    assert slots == {("bel",), ("m",)}


def test_unbatched_inputs_keep_their_values_across_bucket_switches():
    sr = catbp_jit.vm_prob_semiring()
    plain = catbp_jit.compile([normalize_program()], sr, factor_specs=SPECS).bind()
    sess = catbp_jit.compile(
        [normalize_program()], sr, factor_specs=SPECS, batched_factors={0}, buckets=(1, 2, 4)
    ).bind()
    rng = np.random.default_rng(2)
    f1 = rng.uniform(0.1, 3.0, (3, 2))
    sess.run(factors={0: rng.random((1, 3)), 1: f1})
    for n in (3, 1, 2, 0, 4, 9, 1):  # f1 given once, above
        f0 = rng.uniform(0.1, 3.0, (n, 3))
        got = sess.run(factors={0: f0})
        want = unbatched_rows(plain, {0: f0, 1: f1}, {}, None, {0}, set(), n)
        assert_rows_equal(got, want, sess.batched_slots, "PROB", np.dtype(np.float64))


def test_batched_run_errors_are_clear():
    sr = catbp_jit.vm_prob_semiring()
    sess = catbp_jit.compile(
        [normalize_program()], sr, factor_specs=SPECS, batched_factors={0}, buckets=(2,)
    ).bind()
    f1 = np.ones((3, 2))
    with pytest.raises(UnknownInputError, match="batched input.*factor 0"):
        sess.run(factors={1: f1})
    with pytest.raises(InputMismatchError, match=r"factor 0: got float64\[3\].*\(n, \*\[3\]\)"):
        sess.run(factors={0: np.ones(3), 1: f1})
    with pytest.raises(InputMismatchError, match="factor 1"):
        sess.run(factors={0: np.ones((1, 3)), 1: np.ones((1, 3, 2))})
    with pytest.raises(UnknownInputError, match="no value given yet for factor 1"):
        sess.run(factors={0: np.ones((1, 3))})


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(batched_factors={7}), r"no factor spec for id\(s\) \[7\]"),
        (dict(batched_selectors={0}), r"no selector spec"),
        (dict(batched_factors={0}, buckets=(0, 4)), "buckets must be positive integers"),
        (dict(batched_factors={0}, buckets=()), "buckets must be positive integers"),
        (dict(buckets=(1, 8)), "no batched_factors or batched_selectors"),
    ],
)
def test_batched_compile_errors_are_clear(kw, match):
    with pytest.raises(BatchedCompileError, match=match):
        catbp_jit.compile([normalize_program()], catbp_jit.vm_prob_semiring(), factor_specs=SPECS, **kw)


def test_batched_executable_saves_and_loads(tmp_path):
    sr = catbp_jit.vm_prob_semiring()
    exe = catbp_jit.compile(
        [normalize_program()], sr, factor_specs=SPECS, batched_factors={0}, buckets=(2, 4)
    )
    exe.save(tmp_path / "x.json")
    loaded = catbp_jit.load(tmp_path / "x.json")
    assert loaded.buckets == (2, 4) and loaded.batched_factors == {0}
    assert loaded.as_text() == exe.as_text() and "bucket 2:" in exe.as_text()
    assert exe.stats()["buckets"] == (2, 4)
    f = {0: np.random.default_rng(4).random((3, 3)), 1: np.ones((3, 2))}
    a, b = exe.bind().run(factors=f), loaded.bind().run(factors=f)
    for key, (arr, spec) in a.items():
        assert np.array_equal(arr, b[key][0]) and spec == b[key][1]


def test_load_refuses_bad_batched_fields(tmp_path):
    from catbp_jit.executable import SavedExecutableError

    exe = catbp_jit.compile(
        [normalize_program()],
        catbp_jit.vm_prob_semiring(),
        factor_specs=SPECS,
        batched_factors={0},
        buckets=(2,),
    )
    exe.save(tmp_path / "x.json")
    doc = json.loads((tmp_path / "x.json").read_text())
    doc["buckets"] = ["2"]
    (tmp_path / "x.json").write_text(json.dumps(doc))
    with pytest.raises(SavedExecutableError, match="'buckets': expected an integer, got str"):
        catbp_jit.load(tmp_path / "x.json")


def test_buckets_share_their_kernels():
    """Sizes are runtime data: more buckets add plans, not kernels."""
    sr = catbp_jit.vm_prob_semiring()
    one = catbp_jit.compile([normalize_program()], sr, factor_specs=SPECS, batched_factors={0}, buckets=(3,))
    many = catbp_jit.compile(
        [normalize_program()], sr, factor_specs=SPECS, batched_factors={0}, buckets=(1, 2, 3, 5, 8)
    )
    assert many.stats()["kernels"] == one.stats()["kernels"] == len(one.largest.kernels)


# ------------------------------------------------------------------------------ corpus


# grid3_d2's seven bundles compile the largest kernels of the corpus (9-15 s each here):
# two run by default (a sum and a log-sum), the others with the slow tests
GRID3_DEFAULT = {"grid3_d2__prob_float64", "grid3_d2__logprob_float64_normalized"}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.slow)
        if p.name.startswith("grid3_d2__") and p.name not in GRID3_DEFAULT
        else p
        for p in CORPUS
    ],
    ids=[p.name for p in CORPUS],
)
def test_corpus_batched_over_one_factor(path):
    bundle = load_bundle(path)
    factors, selectors = inputs(bundle)
    fid = sorted(factors)[len(factors) // 2]
    plain = executable(bundle, "compiled").bind()
    sess = catbp_jit.compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        batched_factors={fid},
        buckets=(2, 4),
    ).bind()
    rng = np.random.default_rng(3)
    for n in (3, 5, 1):
        rows = np.stack(
            [factors[fid]]
            + [rng.permutation(factors[fid].ravel()).reshape(factors[fid].shape) for _ in range(n - 1)]
        )
        given = {**factors, fid: rows}
        want = unbatched_rows(plain, given, selectors, None, {fid}, set(), n)
        got = sess.run(factors=given, selectors=selectors)
        assert_rows_equal(got, want, sess.batched_slots, bundle.semiring, bundle.dtype)


# ------------------------------------------------------------------------- allocations


@pytest.mark.parametrize("mode", ["compiled", "loop"])
def test_switching_buckets_allocates_nothing(mode):
    enable_nrt_stats()
    sess = catbp_jit.compile(
        [normalize_program()],
        catbp_jit.vm_prob_semiring(),
        factor_specs=SPECS,
        batched_factors={0},
        buckets=(1, 2, 4),
        mode=mode,
    ).bind()
    f1 = np.ones((3, 2))
    rows = {n: {0: np.full((n, 3), 0.5)} for n in (0, 1, 2, 3, 4)}
    sess.run(factors={0: rows[1][0], 1: f1})
    for n in rows:  # warm up every bucket
        sess.run(factors=rows[n])
    nrt_counts = []
    with NumpyAllocCounter() as numpy_count:
        for n in (1, 4, 2, 3, 0, 4, 1):
            with NrtAllocCounter() as nrt:
                sess.run(factors=rows[n])
            nrt_counts.append((nrt.allocations, nrt.frees))
    assert numpy_count.allocations == 0, numpy_count
    assert len(set(nrt_counts)) == 1, nrt_counts


def test_slot_batched_at_one_write_and_not_another_is_refused():
    """A slot's spec is fixed at its first write: handed in unbatched, it cannot later hold
    a batched value (nor the other way round); the error names the instruction."""
    prog = Program(
        [
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("s",), "src": 0}),
        ],
        "up",
    )
    with pytest.raises(
        BatchedCompileError,
        match=r"program 'up', instruction \[1\] STORE_SLOT: slot \('s',\) "
        r"would hold a batched value.*handed in",
    ):
        catbp_jit.compile(
            [prog],
            catbp_jit.vm_prob_semiring(),
            factor_specs={0: sp(A0)},
            slot_specs={("s",): sp(A0)},
            batched_factors={0},
            buckets=(2,),
        )
    # the same slot, not handed in: batched from its first write, fine
    catbp_jit.compile(
        [prog], catbp_jit.vm_prob_semiring(), factor_specs={0: sp(A0)}, batched_factors={0}, buckets=(2,)
    )


def test_rows_sum_in_the_unbatched_order():
    """A reduction walks its biggest leaf in memory order. Counted with the batch axis, the
    batched f0 (4 rows of 4x4) would outgrow f1 (4x4x2) and turn the order of the sum
    around (G0 outer instead of G1): rows would differ from row-by-row runs in the last
    bits. The leaves are compared by the size of one row."""
    a0, a1, a2 = Axis(0, G, 4), Axis(1, G, 4), Axis(2, G, 2)
    prog = Program(
        [
            Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
            Instruction(OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": sp(a0, a1, a2)}),
            Instruction(OpCode.ELIMINATE, 3, {"src": 2, "keep_keys": ((G, 2),)}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("m",), "src": 3}),
        ],
        "p",
    )
    specs = {0: sp(a0, a1), 1: sp(a1, a0, a2)}
    sr = catbp_jit.vm_prob_semiring()
    plain = catbp_jit.compile([prog], sr, factor_specs=specs).bind()
    sess = catbp_jit.compile([prog], sr, factor_specs=specs, batched_factors={0}, buckets=(4,)).bind()
    rng = np.random.default_rng(5)
    for _ in range(5):
        f0, f1 = rng.random((4, 4, 4)) * 10, rng.random((4, 4, 2)) / 3
        got = sess.run(factors={0: f0, 1: f1})
        want = unbatched_rows(plain, {0: f0, 1: f1}, {}, None, {0}, set(), 4)
        assert_rows_equal(got, want, sess.batched_slots, "PROB", np.dtype(np.float64))


def test_a_refused_run_changes_nothing():
    sr = catbp_jit.vm_prob_semiring()
    sess = catbp_jit.compile(
        [normalize_program()], sr, factor_specs=SPECS, batched_factors={0}, buckets=(2, 4)
    ).bind()
    f0, f1 = np.full((3, 3), 0.5), np.full((3, 2), 2.0)
    before = {k: np.array(v, copy=True) for k, (v, _) in sess.run(factors={0: f0, 1: f1}).items()}
    for bad in (
        {0: np.ones((1, 3)), 1: np.ones((2, 3))},  # f1 of the wrong shape
        {0: np.ones(3), 1: np.ones((3, 2))},
    ):  # f0 without rows
        with pytest.raises(InputMismatchError):
            sess.run(factors=bad)
    for key, (view, _) in sess.run(factors={0: f0}).items():  # f1 kept: still 2.0
        assert np.array_equal(view, before[key]), key


def test_a_run_returns_only_the_slots_it_is_asked_to_read():
    """run(read=keys): those slots, the values a full run gives, in the same dict object;
    an unknown key is refused before anything changes."""
    b = load_bundle(next(p for p in CORPUS if p.name == "z4_cycle__prob_float64"))
    f, s = inputs(b)
    fid = sorted(f)[0]
    exe = catbp_jit.compile(
        b.programs,
        b.semiring_runtime(),
        factor_specs=b.factor_specs(),
        selector_specs=b.selector_specs(),
        batched_factors={fid},
        buckets=(2, 4),
    )
    sess = exe.bind()
    rows = np.random.default_rng(1).uniform(0.1, 2.0, (9,) + f[fid].shape)
    for n in (3, 9):  # a bucket; chunks of the largest
        given = {**f, fid: np.ascontiguousarray(rows[:n])}
        want = {k: np.array(v) for k, (v, _) in sess.run(factors=given, selectors=s).items()}
        keys = sorted(want)[-2:]
        slots = sess.slots
        got = sess.run(factors=given, selectors=s, read=keys)
        assert got is slots and sorted(got) == keys
        for k in keys:
            assert np.array_equal(got[k][0], want[k])
    with pytest.raises(UnknownInputError, match="no slot .*'nope'"):
        sess.run(factors={**f, fid: np.ascontiguousarray(rows[:2])}, selectors=s, read=[("nope",)])
