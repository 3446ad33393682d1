"""MAXLOG's GEMM steps (plan/gemm.py, codegen/cpu_gemm.py): max-plus products
out[i][j] = max_k a[i][k] + b[k][j] in a kernel of our own, tiles of outputs in
registers where no term can be NaN, row by row with the loop kernels' sticky max where
one can. Every result is the reference's bits (tests/jit_helpers.assert_same_bits), with
the tiles' remainders, transposed and copied operands, batch axes, NORMALIZE, ties, -inf,
+inf and NaN; on any number of threads; and no run allocates."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType
from catbp_jit.codegen.cpu_gemm import COLS, ROWS, kernel_source
from catbp_jit.plan.steps import KernelPattern
from jit_helpers import assert_same_slots, count_allocations, run_reference, session_results, settings
from random_programs import AB, gemm_case

G = AxisType.GEOMETRIC
# rows and columns that leave remainders of tiles (ROWS x COLS) and of BUFFER
AM, AN, AL = Axis(30, G, 2 * ROWS + 3), Axis(31, G, 2 * COLS["float64"] + 5), Axis(32, G, 37)


def max_values(rng, specials: float = 0.0):
    """Log potentials: normal, -inf in places, often integers (ties, exact sums), and with
    `specials` a share of +inf and NaN."""

    def make(shape):
        x = rng.normal(0.0, 3.0, shape)
        if rng.random() < 0.3:
            x = rng.integers(-3, 1, size=shape).astype(np.float64)
        x[rng.random(shape) < 0.3] = -np.inf
        if specials:
            x[rng.random(shape) < specials] = rng.choice([np.inf, np.nan])
        return x

    return make


def compiled(case, **options):
    """The case compiled in the reassociating mode with its GEMM steps at any size."""
    import catbp_jit.plan.gemm as gemm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemm, "MIN_WORK", 1)
        mp.setattr(gemm, "MIN_REUSE", 0)
        mp.setattr(gemm, "LOOP_TERM_NS", float("inf"))
        return catbp_jit.compile(
            case.programs,
            case.sr(),
            factor_specs=case.factor_specs,
            mode="loop",
            options=catbp_jit.PlanOptions(exact=False, gemm_program_min_terms=1, **options),
        )


def gemm_steps(exe) -> list:
    return [st for st in exe.schedule.steps if st.pattern.template == "gemm"]


# each dtype's kernels (normalized or not, serial or parallel) take 20 s to compile here:
# float64's by default, float32's with the slow tests
DTYPES = ["float64", pytest.param("float32", marks=pytest.mark.slow)]


@st.composite
def max_plus_products(draw, dtypes=("float64",)):
    """max_k a + b with random groups of row, column, summed and batch axes (0-2 each,
    sizes 1-4, or one long axis that leaves tile remainders), each operand's axes in a
    random order, float64 or float32, maybe normalized, maybe with +inf and NaN."""
    sizes = iter(draw(st.lists(st.integers(1, 4), min_size=8, max_size=8)))
    counter = iter(range(20, 40))

    def group(long: Axis | None = None):
        axes = [Axis(next(counter), G, next(sizes)) for _ in range(draw(st.integers(0, 2)))]
        return axes + ([long] if long is not None and draw(st.booleans()) else [])

    rows, cols, ks, batch = group(AM), group(AN), group(AL), group()
    if not any(x.size > 1 for x in ks):
        ks.append(Axis(next(counter), G, 3))

    def order(axes):
        return tuple(draw(st.permutations(axes)))

    rng = np.random.default_rng(draw(st.integers(0, 99)))
    specials = draw(st.sampled_from([0.0, 0.0, 0.02, 0.2]))
    return gemm_case(
        "MAXLOG",
        draw(st.sampled_from(dtypes)),
        order(batch + rows + ks),
        order(batch + ks + cols),
        order(batch + rows + cols),
        norm=draw(st.booleans()),
        values=max_values(rng, specials),
        seed=draw(st.integers(0, 99)),
    )


@pytest.mark.slow  # (23 s of compiles: the default suite's budget; the slow set also draws 300 below)
@settings(30)  # (float64 only; the slow set draws 300 of both dtypes)
@given(max_plus_products(), st.booleans())
def test_random_max_plus_products_give_the_reference_bits(case, parallel):
    check_random_product(case, parallel)


@pytest.mark.slow
@settings(300)
@given(max_plus_products(dtypes=("float64", "float32")), st.booleans())
def test_many_random_max_plus_products_give_the_reference_bits(case, parallel):
    check_random_product(case, parallel)


def check_random_product(case, parallel):
    note(case.listing())
    exe = compiled(case, gemm_parallel_min_work=1 if parallel else 1 << 62)
    event("GEMM" if gemm_steps(exe) else "loop kernels")
    for step in gemm_steps(exe):
        assert not step.params.b_t  # the kernel reads b's rows
        assert step.pattern.parallel == parallel
    got = session_results(exe.bind(), case.inputs[0])
    assert_same_slots(run_reference(case), got, case, "max-plus gemm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "a_axes, b_axes, keep",
    [
        ((AM, AL), (AL, AN), (AM, AN)),  # matrices in place
        ((AL, AM), (AN, AL), (AN, AM)),  # a stored [K][M], b [N][K] (copied), out^T
        ((AB, AM, AL), (AL, AB, AN), (AN, AB, AM)),  # batch axis, every operand copied
    ],
    ids=["in-place", "transposed", "batch"],
)
@pytest.mark.parametrize("specials", [0.0, 0.01])
def test_max_plus_tiles_and_rows_give_the_reference_bits_on_any_threads(
    a_axes, b_axes, keep, dtype, specials
):
    """Tiles, their remainders (rows and columns) and the rows that may hold a NaN term:
    the reference's bits, serial and parallel, on one thread and on all, no allocation."""
    case = gemm_case(
        "MAXLOG",
        dtype,
        a_axes,
        b_axes,
        keep,
        norm=True,
        values=max_values(np.random.default_rng(7), specials),
    )
    want = run_reference(case)
    for gemm_parallel_min_work in (1, 1 << 62):
        exe = compiled(case, gemm_parallel_min_work=gemm_parallel_min_work)
        (step,) = gemm_steps(exe)
        assert step.pattern.parallel == (gemm_parallel_min_work == 1)
        sess = exe.bind()
        assert_same_slots(want, session_results(sess, case.inputs[0]), case, "max-plus gemm")
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            assert_same_slots(want, session_results(sess, case.inputs[0]), case, "one thread")
        finally:
            numba.set_num_threads(threads)
        np_count, per_run = count_allocations(sess, case.inputs[0].factors, {}, 3)
        assert np_count.allocations == 0 and set(per_run) == {0}, (np_count, per_run)


@pytest.mark.parametrize("in_b", [False, True], ids=["in-a", "in-b"])
def test_a_nan_term_sticks_and_plus_inf_meeting_minus_inf_is_one(in_b):
    """A NaN in a or b, or +inf meeting -inf, makes that output NaN, as numpy's max. In a
    (b clean): the rows of a that hold them run alone, the other rows in tiles; in b:
    every row runs alone."""
    case = gemm_case(
        "MAXLOG", "float64", (AM, AL), (AL, AN), (AM, AN), values=max_values(np.random.default_rng(3))
    )
    a, b = case.inputs[0].factors[0], case.inputs[0].factors[1]
    a[:, 2] = -np.inf
    a[1, 5] = np.nan
    a[6, 2], b[2, :] = np.inf, -np.inf
    b[2, 7] = 0.0
    if in_b:
        b[9, 3] = np.nan
    exe = compiled(case)
    assert gemm_steps(exe)
    got = session_results(exe.bind(), case.inputs[0])
    assert_same_slots(run_reference(case), got, case, "NaN terms")
    (out, _) = got[("out",)]
    assert np.isnan(out[1]).all() and np.isnan(out[:, 3]).all() == in_b
    assert np.isnan(out[6]).sum() == AN.size - 1 and out[6, 7] == np.inf


def test_large_max_plus_products_are_gemm_steps_by_default():
    """Without lifting any threshold, a 130 x 130 x 130 product of MAXLOG in the reassociating
    mode is a parallel GEMM step; exact mode keeps its loop kernels (and the numpy tier)."""
    big = [Axis(40 + i, G, 130) for i in range(3)]
    # (normalized: the kernel the tiles' test compiles, ~5 s less of the default suite)
    case = gemm_case("MAXLOG", "float64", (big[0], big[1]), (big[1], big[2]), (big[0], big[2]), norm=True)
    kw = dict(factor_specs=case.factor_specs, mode="loop")
    loose = catbp_jit.compile(case.programs, case.sr(), exact=False, **kw)
    assert [st.pattern.name for st in gemm_steps(loose)] == ["gemm_maxlog_float64_reduce_norm_par"]
    exact = catbp_jit.compile(case.programs, case.sr(), exact=True, **kw)
    assert not gemm_steps(exact)
    assert_same_slots(run_reference(case), session_results(loose.bind(), case.inputs[0]), case)


@pytest.mark.slow  # (a kernel compiled again for its assembly: ~5 s of the default suite)
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_max_plus_tile_is_vectorized(dtype):
    """LLVM keeps a tile in packed registers: the kernel's assembly has packed maxima."""
    case = gemm_case("MAXLOG", dtype, (AM, AL), (AL, AN), (AM, AN))
    exe = compiled(case, gemm_parallel_min_work=1 << 62)
    (step,) = gemm_steps(exe)
    asm = exe.kernel_asm(step.pattern.name)
    assert ("maxpd" if dtype == "float64" else "maxps") in asm


def test_other_semirings_gemm_sources_are_unchanged_by_max_plus():
    """MAXLOG's template is its own: PROB's and LOGPROB's GEMM modules never mention it."""
    for name in ("PROB", "LOGPROB"):
        src = kernel_source(KernelPattern(name, "float64", True, False, False, template="gemm"))
        assert "max_dot" not in src and "np.dot" in src


def test_the_cost_model_keeps_loop_kernels_where_copies_of_short_axes_cost_more():
    """plan/gemm.max_plus_ns: a 32 x 32 x 32 product of binary axes is a max-plus step
    where its operands lie as matrices; where every operand's axes interleave (three
    copies of rows of four elements, each placed by div/mod over eight axes) the copies
    would cost more than the loop kernel saves."""
    import catbp_jit.plan.gemm
    from catbp_jit.executable import plan

    rows, cols, ks = ([Axis(50 + 3 * i + g, G, 2) for i in range(5)] for g in range(3))

    def steps(a_axes, b_axes, keep):
        case = gemm_case("MAXLOG", "float64", tuple(a_axes), tuple(b_axes), tuple(keep))
        p = plan(case.programs, case.sr(), factor_specs=case.factor_specs, exact=False)
        # (a loop step may have a repack step before it: a copy, not a contraction)
        return {st.pattern.template for st in p.schedule.steps} - {"repack"}

    def mix(x, y):
        return [v for pair in zip(x, y) for v in pair]

    assert steps(rows + ks, ks + cols, rows + cols) == {"gemm"}
    assert steps(mix(rows, ks), mix(ks, cols), mix(rows, cols)) == {"contract_reduce"}
    with pytest.MonkeyPatch.context() as mp:  # (the cost decides, nothing else)
        mp.setattr(catbp_jit.plan.gemm, "LOOP_TERM_NS", float("inf"))
        assert steps(mix(rows, ks), mix(ks, cols), mix(rows, cols)) == {"gemm"}
