"""Shared by the JIT tests: executables compiled once per process, a bundle's inputs, and
the running and comparing the differential tests share (tolerances, the reference run,
slot comparisons, batched rows, the memory plan's invariants, allocation counts)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import HealthCheck, event
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
from catbp_jit.plan.arena import ALIGN_BYTES, CLASSES
from catbp_jit.reference import run_program as reference_run_program
from catbp_jit.semiring import SEMIRINGS
from catbp_jit.testing.alloc_counter import NrtAllocCounter, NumpyAllocCounter
from random_programs import Case, Inputs

_EXECUTABLES = {}


def executable(bundle, mode):
    """Compiled once per process (kernels come from the memo or the session's disk cache)."""
    key = (bundle.name, mode)
    if key not in _EXECUTABLES:
        _EXECUTABLES[key] = compile_bundle(bundle, mode)
    return _EXECUTABLES[key]


def compile_bundle(bundle, mode, **options):
    """The bundle's programs compiled afresh, with PlanOptions(**options) if any given
    (else the target's defaults)."""
    from catbp_jit.plan.options import PlanOptions

    return catbp_jit.compile(
        bundle.programs,
        bundle.semiring_runtime(),
        factor_specs=bundle.factor_specs(),
        selector_specs=bundle.selector_specs(),
        mode=mode,
        options=PlanOptions(**options) if options else None,
    )


def slot_copies(slots) -> dict:
    """A run's slots, copied out of the session's arena (the next run overwrites them)."""
    return {k: np.array(v, copy=True) for k, (v, _) in slots.items()}


@st.composite
def summed_products(draw, sizes: tuple[int, int], axes: tuple[int, int], leaves: tuple[int, int]):
    """(program, factor specs): a product of leaves (a count in the range `leaves`) over
    axes (a count in `axes`, each of a size in `sizes`), each leaf on some of them in an
    order of its own, then summed over some or none, stored in slot ("x",)."""
    G = AxisType.GEOMETRIC
    every = [Axis(i, G, draw(st.integers(*sizes))) for i in range(draw(st.integers(*axes)))]
    specs = {}
    for f in range(draw(st.integers(*leaves))):
        held = draw(st.lists(st.sampled_from(every), min_size=1, max_size=len(every), unique=True))
        specs[f] = TensorSpec(tuple(held))
    kept = draw(st.lists(st.sampled_from(every), min_size=1, max_size=len(every), unique=True))
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins.append(
        Instruction(OpCode.CONTRACT, 10, {"inputs": tuple(specs), "out_spec": TensorSpec(tuple(every))})
    )
    ins.append(Instruction(OpCode.ELIMINATE, 11, {"src": 10, "keep_keys": tuple(a.key for a in kept)}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 11}))
    return Program(tuple(ins), "upward"), specs


def inputs(bundle):
    """The bundle's factors and selectors in the semiring dtype, as Session.run wants them."""
    dt = bundle.dtype
    return (
        {f: np.ascontiguousarray(a, dtype=dt) for f, (a, _) in bundle.factors.items()},
        {s: np.ascontiguousarray(a, dtype=dt) for s, (a, _) in bundle.selectors.items()},
    )


# ------------------------------------------------------- random programs and hand-written ones

# (rtol, atol). PROB float64: rtol 1e-9, no absolute slack (PROB never subtracts, so
# relative error stays small); float32: rtol 1e-5, atol for denormals only. LOGPROB also
# gets an absolute 1e-10: logsumexp and NORMALIZE (x - logsumexp x) cancel, so a result
# near 0 carries its operands' absolute rounding (seen: a NORMALIZE then a full logsumexp
# gives -3.2e-16 in numpy and +3.5e-16 in the JIT, i.e. log 1 either way). An absolute
# error d in log space is a relative error d of the probability, so this is still stricter
# than the PROB tolerance.
TOLERANCES = {
    ("PROB", "float64"): (1e-9, 0.0),
    ("PROB", "float32"): (1e-5, 1e-30),
    ("LOGPROB", "float64"): (1e-9, 1e-10),
    ("LOGPROB", "float32"): (1e-5, 1e-5),
}
# MAXLOG has none: its ⊕ is a max, exact in any order, and every path gives the
# reference's bits (assert_same_bits)


def settings(n: int):
    """Hypothesis settings for n examples, no deadline, no example database."""
    return hypothesis_settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


def run_reference(case: Case, which: int = 0) -> dict:
    slots = {k: (a.copy(), s) for k, (a, s) in case.initial_slots(which).items()}
    sr = case.sr()
    with np.errstate(over="ignore"):  # COUNT wraps around int64 on purpose
        for p in case.programs:
            slots = reference_run_program(
                p, sr, case.factor_provider(which), case.selector_provider(which), slots=slots
            )
    return slots


def compile_case(case: Case, mode: str, **options):
    return catbp_jit.compile(
        case.programs,
        case.sr(),
        factor_specs=case.factor_specs,
        selector_specs=case.selector_specs,
        slot_specs=case.slot_specs or None,
        mode=mode,
        **options,
    )


def session_results(sess, inputs: Inputs) -> dict:
    out = sess.run(factors=inputs.factors, selectors=inputs.selectors, slots=inputs.slots)
    return {k: (np.array(v, copy=True), s) for k, (v, s) in out.items()}


def positive_factors(specs: dict, semiring: str, seed: int) -> dict:
    """Random factor values in [0.1, 2) (their logs for LOGPROB), by factor id."""
    rng = np.random.default_rng(seed)
    values = {f: rng.uniform(0.1, 2.0, s.shape) for f, s in specs.items()}
    return {f: np.log(x) for f, x in values.items()} if semiring == "LOGPROB" else values


def same_bits_as(want_exe, got_exe, factors: dict) -> dict:
    """Checks that got_exe's kernels and its numpy tier give want_exe's bits on these
    factors; returns those results (slot -> array)."""
    inputs = Inputs(factors, {}, {})

    def bits(exe, **bind) -> dict:
        return {k: v for k, (v, _) in session_results(exe.bind(**bind), inputs).items()}

    want = bits(want_exe)
    assert_same_bits(want, bits(got_exe), "kernels")
    assert_same_bits(want, bits(got_exe, numpy_only=True), "numpy tier")
    return want


def run_dropin(case: Case, which: int, mode: str) -> dict:
    sr = case.sr()
    slots = dict(case.initial_slots(which))
    for p in case.programs:
        slots = catbp_jit.run_program(
            p, sr, case.factor_provider(which), case.selector_provider(which), slots=slots, mode=mode
        )
    return slots


def run_dropin_vm(case: Case, which: int, mode: str) -> dict:
    vm = catbp_jit.VirtualMachine(case.sr(), mode=mode)
    vm.slots.data.update(case.initial_slots(which))
    for p in case.programs:
        vm.run(p, case.factor_provider(which), case.selector_provider(which))
    return vm.slots.data


def assert_same_slots(ref: dict, got: dict, case: Case, what: str = "jit") -> None:
    dtype = case.dtype
    assert set(got) == set(ref), (
        f"{what}: slot keys differ: missing {set(ref) - set(got)}, extra {set(got) - set(ref)}"
    )
    for key in ref:
        want, want_spec = ref[key]
        have, have_spec = got[key]
        want, have = np.asarray(want), np.asarray(have)
        where = f"{what}: slot {key!r}"
        assert have_spec == want_spec, f"{where}: spec {have_spec} != reference {want_spec}"
        assert want.shape == want_spec.shape, f"{where}: reference shape {want.shape} vs its spec"
        assert have.shape == want_spec.shape, f"{where}: shape {have.shape} != {want_spec.shape}"
        assert want.dtype == dtype, f"{where}: reference dtype {want.dtype} (oracle), expected {dtype}"
        assert have.dtype == dtype, f"{where}: dtype {have.dtype} != {dtype}"
        if dtype.kind in "bi":
            assert np.array_equal(have, want), f"{where}: values differ\nref {want!r}\njit {have!r}"
            continue
        if SEMIRINGS[case.semiring].is_max:
            assert_same_bits({key: have}, {key: want}, where)
            continue
        for name, pred in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
            assert np.array_equal(pred(have), pred(want)), (
                f"{where}: {name} positions differ\nref {want!r}\njit {have!r}"
            )
        rtol, atol = TOLERANCES[(case.semiring, dtype.name)]
        fin = np.isfinite(want)
        if not np.allclose(have[fin], want[fin], rtol=rtol, atol=atol):
            err = np.abs(have[fin] - want[fin]) / np.maximum(np.abs(want[fin]), np.finfo(dtype).tiny)
            raise AssertionError(
                f"{where}: values differ (max relative error {err.max():.3g}, "
                f"rtol {rtol}, atol {atol})\nref {want!r}\njit {have!r}"
            )


def record(case: Case) -> None:
    """Hypothesis statistics (--hypothesis-show-statistics): what the examples covered."""
    event(f"{case.semiring} {case.dtype.name}")
    event(f"{len(case.programs)} program(s)")
    if case.slot_specs:
        event("slots given from outside")
    if case.selector_specs:
        event("selectors")


# ------------------------------------------------------------------ corpus bundles

RTOL = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-5}


def compare_slots(got, bundle):
    """Assert `got` reproduces bundle.expected_slots within §1's tolerances.

    Returns the largest relative error seen over the float slots (0.0 for exact ones)."""
    expected = bundle.expected_slots
    assert set(got) == set(expected), sorted(map(repr, set(got) ^ set(expected)))
    worst = 0.0
    for key, (want, want_spec) in expected.items():
        arr, spec = got[key]
        arr = np.asarray(arr)
        assert spec == want_spec, (key, spec, want_spec)
        assert arr.dtype == want.dtype, (key, arr.dtype, want.dtype)
        assert arr.shape == want.shape, (key, arr.shape, want.shape)
        if want.dtype.kind not in "fc":
            assert np.array_equal(arr, want), (key, arr, want)
            continue
        # non-finite values: the same positions, the same values (NaN, +inf or -inf)
        a_nan, w_nan = np.isnan(arr), np.isnan(want)
        assert np.array_equal(a_nan, w_nan), (key, "NaN positions differ", arr, want)
        a_inf, w_inf = np.isinf(arr), np.isinf(want)
        assert np.array_equal(a_inf, w_inf), (key, "inf positions differ", arr, want)
        assert np.array_equal(arr[a_inf], want[w_inf]), (key, "inf signs differ", arr, want)
        fin = np.isfinite(want)
        a, w = arr[fin].astype(np.float64), want[fin].astype(np.float64)
        diff = np.abs(a - w)
        rtol = RTOL[want.dtype]
        # atol 0: where the expected value is 0 the result must be exactly 0
        assert np.all(diff <= rtol * np.abs(w)), (
            key,
            "beyond rtol",
            rtol,
            float(np.max(diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny))),
        )
        nz = w != 0
        if nz.any():
            worst = max(worst, float(np.max(diff[nz] / np.abs(w[nz]))))
    return worst


# ------------------------------------------------------------------ batched runs


def rows_of(arr: np.ndarray, n: int, rng: np.random.Generator, make) -> np.ndarray:
    """n rows: the first is `arr` itself, the others fresh values of its kind."""
    out = np.empty((n,) + arr.shape, arr.dtype)
    for i in range(n):
        out[i] = arr if i == 0 else make(rng)
    return out


def assert_rows_equal(got: dict, want_rows: list, batched: set, semiring: str, dtype) -> None:
    """got: one batched run's slots; want_rows: the unbatched run's slots per row."""
    for i, want in enumerate(want_rows):
        assert set(got) == set(want)
        for key, (w, wspec) in want.items():
            arr, spec = got[key]
            assert spec == wspec, (key, spec, wspec)
            have = arr[i] if key in batched else arr
            assert have.shape == w.shape and have.dtype == w.dtype, (key, have.shape, w.shape)
            if semiring == "LOGPROB":
                rtol, atol = TOLERANCES[(semiring, np.dtype(dtype).name)]
                assert np.array_equal(np.isnan(have), np.isnan(w)), (key, i, have, w)
                assert np.allclose(have, w, rtol=rtol, atol=atol, equal_nan=True), (key, i, have, w)
            else:
                assert np.array_equal(have, w, equal_nan=dtype.kind == "f"), (key, i, have, w)
    for key in batched:
        assert got[key][0].shape[0] == len(want_rows), (key, got[key][0].shape)


def unbatched_rows(plain, factors, selectors, slots, batched_f, batched_s, n) -> list:
    out = []
    for i in range(n):
        f = {k: (v[i, ...] if k in batched_f else v) for k, v in factors.items()}
        s = {k: (v[i, ...] if k in batched_s else v) for k, v in selectors.items()}
        res = plain.run(factors=f, selectors=s, slots=slots)
        out.append({k: (np.array(v, copy=True), spec) for k, (v, spec) in res.items()})
    return out


# ------------------------------------------------------------------------- CUDA


def assert_same_bits(a: dict, b: dict, what: str = "") -> None:
    """Every element's bits equal, NaN's sign and payload aside: NaN in the same places
    (x86's NaN from -inf - -inf is negative, a GPU's is not, and which NaN a sum of two
    passes on depends on the order of its operands, which numpy and a kernel need not
    share)."""
    assert set(a) == set(b), what
    for k in a:
        x, y = np.asarray(a[k]).reshape(-1), np.asarray(b[k]).reshape(-1)
        assert x.dtype == y.dtype and x.shape == y.shape, (what, k)
        if x.dtype.kind == "f":
            nan = np.isnan(x)
            assert np.array_equal(nan, np.isnan(y)), (what, k, x, y)
            x, y = x[~nan], y[~nan]
        assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), (what, k, x, y)


def assert_runs_give(plain: dict, exe, factors, selectors, what: str) -> None:
    """exe's runs give the slots `plain`: a run, a run again without inputs (kept), and
    the numpy tier's run."""
    sess = exe.bind()
    assert_same_bits(plain, slot_copies(sess.run(factors=factors, selectors=selectors)), what)
    assert_same_bits(plain, slot_copies(sess.run()), f"{what}, run again")
    numpy = exe.bind(numpy_only=True)
    ran = numpy.run(factors=factors, selectors=selectors)
    assert_same_bits(plain, slot_copies(ran), f"{what}, numpy tier")


def bit_identical(semiring: str) -> bool:
    """Whether a GPU must give the CPU's bits: yes unless exp and log are involved, whose
    libdevice and libm versions differ in the last bits."""
    sr = SEMIRINGS[semiring]
    return sr.reduction != "logsumexp" and sr.normalization != "subtract_logsumexp"


def assert_close(got: np.ndarray, want: np.ndarray, semiring: str, what: str) -> None:
    """Bit for bit, except with exp and log (LOGPROB): NaN and ±inf in the same places,
    the rest within TOLERANCES."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if bit_identical(semiring):
        assert_same_bits({what: got}, {what: want}, "differs")
        return
    rtol, atol = TOLERANCES[(semiring, want.dtype.name)]
    assert np.array_equal(np.isnan(got), np.isnan(want)), (what, "NaN positions", got, want)
    inf = np.isinf(want)
    assert np.array_equal(np.isinf(got), inf) and np.array_equal(got[inf], want[inf]), (
        what,
        "inf positions or signs",
        got,
        want,
    )
    assert np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True), (what, got, want)


# ------------------------------------------------------- memory plan, allocations


def check_memory_plan(exe, base_address):
    """exe's memory plan: arenas and regions aligned (from base_address), disjoint where
    they live at once, and every value a step touches placed."""
    m = exe.memory
    item = m.itemsize
    fused = exe.fused
    assert set(m.regions) == set(fused.specs)
    # arenas: aligned, disjoint, in CLASSES order, inside the buffer
    arenas = {}
    for c in CLASSES:
        lo = m.class_base[c]
        hi = lo + m.class_size[c]
        assert (base_address + lo * item) % ALIGN_BYTES == 0, ("arena", c)
        arenas[c] = (lo, hi)
    spans = sorted(arenas.values())
    for (_, hi1), (lo2, _) in zip(spans, spans[1:]):
        assert hi1 <= lo2, ("arenas overlap", arenas)
    assert max(hi for _, hi in arenas.values()) <= m.total

    for v, r in m.regions.items():
        assert r.size >= max(1, int(np.prod(fused.specs[v].shape, dtype=np.int64)))
        assert (base_address + r.offset * item) % ALIGN_BYTES == 0, (v, r)
        lo, hi = arenas[r.cls]
        assert lo <= r.offset and r.offset + r.size <= hi, ("outside its arena", v, r, arenas[r.cls])
        assert 0 <= r.offset and r.offset + r.size <= m.total, ("outside the buffer", v, r)

    def overlap(r1, r2):
        return r1.offset < r2.offset + r2.size and r2.offset < r1.offset + r1.size

    # inputs, constants and slots: never any overlap (they all live the whole run)
    fixed = sorted(((r.offset, r.size, v) for v, r in m.regions.items() if r.cls != "workspace"))
    for (o1, s1, v1), (o2, _, v2) in zip(fixed, fixed[1:]):
        assert o1 + s1 <= o2, ("fixed regions overlap", v1, m.regions[v1], v2, m.regions[v2])

    # workspace: values live at once (closed intervals) never share bytes
    work = [v for v, r in m.regions.items() if r.cls == "workspace"]
    for v in work:
        assert v in m.intervals, v
    for v1, v2 in itertools.combinations(work, 2):
        i1, i2 = m.intervals[v1], m.intervals[v2]
        if i1.start <= i2.end and i2.start <= i1.end:
            assert not overlap(m.regions[v1], m.regions[v2]), (
                "live workspace values share memory",
                v1,
                i1,
                m.regions[v1],
                v2,
                i2,
                m.regions[v2],
            )

    # every value a step writes or reads has a region
    for step in exe.schedule.steps:
        assert step.segment.out in m.regions
        for leaf in step.segment.leaves:
            assert leaf in m.regions
    # what the class bytes report
    assert m.class_bytes() == {c: m.class_size[c] * item for c in CLASSES}
    assert m.total_bytes == m.total * item


def count_allocations(sess, factors, selectors, runs):
    """numpy data buffers allocated over `runs` runs (inputs given each time), and the
    Numba NRT allocations of each run."""
    per_run = [0] * runs
    with NumpyAllocCounter() as np_count, NrtAllocCounter(enable=True) as nrt:
        for i in range(runs):
            before = nrt.current()
            sess.run(factors=factors, selectors=selectors)
            per_run[i] = nrt.current() - before
    assert nrt.allocations == sum(per_run)
    return np_count, per_run


def random_factors(specs, sr, seed: int, zeros: float) -> dict:
    """A factor per spec: uniform in [0.1, 2), a share `zeros` of them 0, in sr's kind."""
    rng = np.random.default_rng(seed)
    values = {}
    for f, spec in specs.items():
        x = rng.uniform(0.1, 2.0, spec.shape)
        x[rng.random(spec.shape) < zeros] = 0.0
        values[f] = sr.kind.potentials(x, sr.dtype)
    return values


def catbp_jit_inputs(factors):
    return Inputs(factors=factors, selectors={}, slots={})
