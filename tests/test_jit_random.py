"""The JIT agrees with the reference interpreter on random valid linked programs.

Hypothesis draws linked lists of 1-3 programs (random axes of both kinds and sizes 1-4,
CONTRACT / ELIMINATE / NORMALIZE / UNIT / slot traffic, slots handed in from outside) and
their inputs in every semiring and dtype (tests/random_programs.py); each is run through
`catbp_jit.reference` and through the JIT, and every slot must agree: same keys, spec,
shape and dtype; bool and int64 exactly; floats to a tight tolerance (TOLERANCES, in
tests/jit_helpers.py) with NaN and ±inf in the same places. A bound session is run
twice, on two different sets of inputs.

Cost: kernels are compiled once per pattern (semiring, dtype, reduce, normalize, vector)
and cached on disk, a few dozen in all whatever the programs. Loop mode draws the most
programs: 500 by default and 1,500 more under -m slow (new ones each run: there is no
example database); compiled mode and the drop-in API, which also walk the schedule
through the dispatcher and (the drop-in) copy results, draw fewer.

Bugs these tests found keep a plain regression test each.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import AxisType, Instruction, OpCode, Program
from jit_helpers import (
    assert_same_slots,
    compile_case,
    record,
    run_dropin,
    run_dropin_vm,
    run_reference,
    session_results,
    settings,
)
from random_programs import (
    SEMIRINGS,
    Case,
    Inputs,
    cases,
    contract,
    elim,
    load,
    load_slot,
    normalize,
    sp,
    store,
    unit,
)

G, T = AxisType.GEOMETRIC, AxisType.TOPOLOGICAL
OP = OpCode


# ---------------------------------------------------------------------------- comparing


def check_executable(case: Case, mode: str) -> None:
    exe = compile_case(case, mode)
    for i in range(len(exe.schedule.steps)):
        if exe.schedule.chunks(i) > 1:
            event("a step cut in chunks")
            break
    sess = exe.bind()
    for which in range(len(case.inputs)):  # the same session, another set of inputs
        ref = run_reference(case, which)
        got = session_results(sess, case.inputs[which])
        assert_same_slots(ref, got, case, f"{mode} mode, inputs {which}")


def check_dropin(case: Case, mode: str) -> None:
    for which in range(len(case.inputs)):
        ref = run_reference(case, which)
        got = run_dropin(case, which, mode)
        assert_same_slots(ref, got, case, f"drop-in run_program ({mode}), inputs {which}")
        got = run_dropin_vm(case, which, mode)
        assert_same_slots(ref, got, case, f"drop-in VirtualMachine ({mode}), inputs {which}")


# --------------------------------------------------------------------- random programs


@settings(250)  # (1,750 more under -m slow: below)
@given(cases())
def test_random_programs_loop_mode(case):
    note(case.listing())
    record(case)
    check_executable(case, "loop")


@pytest.mark.slow
@settings(1750)
@given(cases())
def test_many_random_programs_loop_mode(case):
    note(case.listing())
    record(case)
    check_executable(case, "loop")


@settings(120)
@given(cases())
def test_random_programs_compiled_mode(case):
    note(case.listing())
    record(case)
    check_executable(case, "compiled")


@settings(100)
@given(cases(), st.sampled_from(["compiled", "loop"]))
def test_random_programs_dropin(case, mode):
    note(case.listing())
    record(case)
    check_dropin(case, mode)


# --------------------------------------------------------------------------- edge cases


def hand_case(
    semiring: str, dtype, programs, factors: dict[int, tuple], slots: dict[tuple, tuple] | None = None
) -> Case:
    dtype = np.dtype(dtype)
    if isinstance(programs, Program):
        programs = [programs]
    slots = slots or {}
    inputs = Inputs(
        {f: np.asarray(a).astype(dtype) for f, (a, _) in factors.items()},
        {},
        {k: np.asarray(a).astype(dtype) for k, (a, _) in slots.items()},
    )
    return Case(
        semiring,
        dtype,
        list(programs),
        {f: s for f, (_, s) in factors.items()},
        {},
        {k: s for k, (_, s) in slots.items()},
        [inputs],
    )


def check_all_paths(case: Case) -> dict:
    """The case agrees with the reference in both modes and through the drop-in API."""
    for mode in ("loop", "compiled"):
        exe = catbp_jit.compile(
            case.programs,
            case.sr(),
            factor_specs=case.factor_specs,
            selector_specs=case.selector_specs,
            slot_specs=case.slot_specs or None,
            mode=mode,
        )
        got = session_results(exe.bind(), case.inputs[0])
        assert_same_slots(run_reference(case), got, case, f"{mode} mode")
        assert_same_slots(run_reference(case), run_dropin(case, 0, mode), case, "drop-in")
        assert_same_slots(run_reference(case), run_dropin_vm(case, 0, mode), case, "drop-in VM")
    return run_reference(case)


S23 = sp((G, 0, 2), (T, 0, 3))


@pytest.mark.parametrize("semiring, dtype", SEMIRINGS)
def test_contract_without_inputs_is_unit(semiring, dtype):
    """Regression (dcf19fd): fuse() read inputs[0] of an empty CONTRACT (IndexError)."""
    prog = Program((contract(1, (), S23), store(("u",), 1)), "upward")
    case = hand_case(semiring, dtype, prog, {})
    slots = run_reference(case)
    assert np.array_equal(slots[("u",)][0], case.sr().one(S23.shape))
    check_all_paths(case)


def test_transposed_eliminate_with_both_axis_kinds():
    """Regression (dcf19fd): fold_views sorted axis keys, and AxisType does not order."""
    spec = sp((G, 0, 2), (T, 0, 3), (G, 1, 2))
    prog = Program(
        (load(0, 0), elim(1, 0, [(G, 0), (T, 0)]), elim(2, 1, [(T, 0), (G, 0)]), store(("out",), 2)), "upward"
    )
    case = hand_case("PROB", "float64", prog, {0: (np.arange(12.0).reshape(2, 3, 2), spec)})
    check_all_paths(case)


@pytest.mark.parametrize("semiring, dtype", [(s, d) for s, d in SEMIRINGS])
def test_eliminate_of_a_0d_tensor(semiring, dtype):
    vals = {"PROB": 0.75, "LOGPROB": -1.5, "SAT": True, "COUNT": 7, "MAXLOG": -1.5}[semiring]
    prog = Program(
        (
            load(0, 0),
            unit(1, sp()),
            elim(2, 0, ()),
            elim(3, 0, [(G, 0)]),
            elim(4, 1, ()),
            Instruction(OP.ELIMINATE, 5, {"src": 0, "drop": (0,)}),
            contract(6, (2, 5), sp()),
            store(("a",), 2),
            store(("b",), 3),
            store(("c",), 4),
            store(("d",), 5),
            store(("e",), 6),
        ),
        "upward",
    )
    case = hand_case(semiring, dtype, prog, {0: (np.array(vals), sp())})
    slots = check_all_paths(case)
    assert np.asarray(slots[("a",)][0]).shape == ()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_normalize_of_all_zero_prob_is_unchanged(dtype):
    prog = Program(
        (
            load(0, 0),
            normalize(0),
            store(("n",), 0),
            load(1, 1),
            contract(2, (0, 1), S23),
            normalize(2),
            store(("m",), 2),
            elim(3, 1, [(T, 0)]),
            normalize(3),
            store(("e",), 3),
        ),
        "upward",
    )
    case = hand_case(
        "PROB", dtype, prog, {0: (np.zeros((2, 3)), S23), 1: (np.arange(6.0).reshape(2, 3), S23)}
    )
    slots = check_all_paths(case)
    assert not np.any(slots[("n",)][0]) and not np.any(slots[("m",)][0])
    assert np.allclose(slots[("e",)][0], np.array([3, 5, 7]) / 15)


@pytest.mark.parametrize("semiring", ["LOGPROB", "MAXLOG"])
def test_normalize_of_all_neg_inf_is_nan(semiring):
    prog = Program(
        (
            load(0, 0),
            normalize(0),
            store(("n",), 0),
            elim(1, 0, [(G, 0)]),
            normalize(1),
            store(("en",), 1),
            load(2, 1),
            elim(3, 2, [(G, 0)]),
            normalize(3),
            store(("e",), 3),
        ),
        "upward",
    )
    part = np.array([[-np.inf, -np.inf, -np.inf], [0.0, -1.0, -np.inf]])
    case = hand_case(semiring, "float64", prog, {0: (np.full((2, 3), -np.inf), S23), 1: (part, S23)})
    slots = check_all_paths(case)
    assert np.all(np.isnan(slots[("n",)][0]))  # -inf - logsumexp(all -inf) = -inf - -inf (or max)
    assert np.all(np.isnan(slots[("en",)][0]))  # fused with the ELIMINATE too
    e = slots[("e",)][0]
    assert np.isneginf(e[0]) and e[1] == 0.0  # one -inf row is fine: only all -inf is NaN


# float32: its kernels compile for this test alone (the corpus has a float32 MAXLOG bundle)
@pytest.mark.parametrize("dtype", ["float64", pytest.param("float32", marks=pytest.mark.slow)])
def test_maxlog_reduces_and_normalizes_as_numpys_max(dtype):
    """MAXLOG's ⊕ is numpy's max, the same bits on every path: a NaN term makes its max
    NaN wherever it is, +inf wins, ties and the 0 of log 1 stay, an all -inf max is -inf;
    NORMALIZE subtracts the largest entry (NaN where that is -inf or NaN); float32 stays
    float32 throughout (the reference's np.max and subtraction are float32's)."""
    spec = sp((G, 0, 4), (T, 1, 5))
    x = np.array(
        [
            [np.nan, 1.0, 2.0, 3.0, -np.inf],  # a NaN first
            [1.0, 2.0, np.inf, 0.5, np.nan],  # ... last, after +inf
            [-np.inf] * 5,
            [-2.5, 0.1, 0.1, -np.inf, 0.0],  # a tie
        ]
    )
    y = np.log(np.arange(1.0, 21.0)).reshape(4, 5) / 3
    prog = Program(
        (
            load(0, 0),
            load(1, 1),
            elim(2, 1, [(G, 0)]),
            elim(3, 1, [(T, 1)]),
            elim(4, 1, ()),
            contract(5, (0, 1), spec),
            elim(6, 5, [(G, 0)]),  # fused: max of products, across the reduced axis
            elim(7, 5, [(T, 1)]),  # ... across the outputs
            elim(8, 0, [(T, 1)]),
            store(("rows",), 2),
            store(("cols",), 3),
            store(("all",), 4),
            store(("fused",), 6),
            store(("fused_cols",), 7),
            store(("nan_cols",), 8),
            normalize(1),
            store(("y",), 1),
            normalize(8),
            store(("nan_cols_n",), 8),
            normalize(6),
            store(("fused_n",), 6),
        ),
        "upward",
    )
    case = hand_case("MAXLOG", dtype, prog, {0: (x, spec), 1: (y, spec)})
    slots = check_all_paths(case)
    x, y = case.inputs[0].factors[0], case.inputs[0].factors[1]
    rows = slots[("fused",)][0]
    assert rows.dtype == dtype and np.isnan(rows[0]) and np.isnan(rows[1]) and np.isneginf(rows[2])
    assert rows[3] == np.max(x[3] + y[3])
    assert np.array_equal(slots[("y",)][0], y - np.max(y))  # the best entry becomes 0
    assert slots[("y",)][0].max() == 0.0
    assert np.all(np.isnan(slots[("fused_n",)][0]))  # the max is NaN: every entry NaN
    assert np.isposinf(slots[("nan_cols",)][0][2]) and np.isnan(slots[("nan_cols_n",)][0][2])


def test_count_wraps_around_int64():
    big = 2**62
    spec = sp((G, 0, 4))
    prog = Program(
        (
            load(0, 0),
            contract(1, (0, 0), spec),
            elim(2, 0, ()),
            elim(3, 1, ()),
            store(("sq",), 1),
            store(("sum",), 2),
            store(("sumsq",), 3),
        ),
        "upward",
    )
    vals = np.array([big, big, big, 3], dtype=np.int64)
    case = hand_case("COUNT", "int64", prog, {0: (vals, spec)})
    slots = check_all_paths(case)
    with np.errstate(over="ignore"):
        assert np.array_equal(slots[("sq",)][0], vals * vals)
        assert int(slots[("sum",)][0]) == int(np.sum(vals))
    assert int(slots[("sum",)][0]) == 3 * big + 3 - 2**64  # wrapped
    assert int(slots[("sumsq",)][0]) == 9  # (2**62)**2 wraps to 0


def test_sat_any_with_early_exit():
    # reduced rows: True first, True last, all False, all True; the kernel may stop at the
    # first True of a row but must still compute every other row.
    spec = sp((G, 0, 4), (T, 1, 5))
    x = np.zeros((4, 5), dtype=bool)
    x[0, 0] = True
    x[1, 4] = True
    x[3, :] = True
    prog = Program(
        (
            load(0, 0),
            elim(1, 0, [(G, 0)]),
            elim(2, 0, [(T, 1)]),
            elim(3, 0, ()),
            load(4, 1),
            contract(5, (0, 4), spec),
            elim(6, 5, [(G, 0)]),
            store(("rows",), 1),
            store(("cols",), 2),
            store(("all",), 3),
            store(("fused",), 6),
        ),
        "upward",
    )
    mask = np.ones((4, 5), dtype=bool)
    mask[0, 0] = False
    case = hand_case("SAT", "bool", prog, {0: (x, spec), 1: (mask, spec)})
    slots = check_all_paths(case)
    assert slots[("rows",)][0].tolist() == [True, True, False, True]
    assert slots[("cols",)][0].tolist() == [True, True, True, True, True]
    assert bool(slots[("all",)][0])
    assert slots[("fused",)][0].tolist() == [False, True, False, True]


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB", "MAXLOG"])
def test_slot_stored_before_normalize_keeps_the_old_value(semiring):
    up = Program(
        (
            load(0, 0),
            contract(1, (0, 0), S23),
            store(("raw",), 1),
            normalize(1),
            store(("norm",), 1),
            normalize(1),
            store(("twice",), 1),
        ),
        "upward",
    )
    down = Program(
        (load_slot(0, ("raw",)), elim(1, 0, [(T, 0)]), store(("bel",), 1), normalize(0), store(("raw2",), 0)),
        "downward",
    )
    x = np.arange(1.0, 7.0).reshape(2, 3)
    x = x if semiring == "PROB" else np.log(x)
    case = hand_case(semiring, "float64", [up, down], {0: (x, S23)})
    slots = check_all_paths(case)
    raw = slots[("raw",)][0]
    assert np.allclose(raw, x * x if semiring == "PROB" else 2 * x)  # not normalized
    assert not np.allclose(raw, slots[("norm",)][0])


def test_same_register_stored_to_two_slots():
    up = Program(
        (
            load(0, 0),
            load(1, 1),
            contract(2, (0, 1), S23),
            store(("a",), 2),
            store(("b",), 2),
            elim(3, 2, [(T, 0)]),
            store(("c",), 3),
            store(("d",), 3),
        ),
        "upward",
    )
    down = Program(
        (
            load_slot(0, ("a",)),
            load_slot(1, ("b",)),
            contract(2, (0, 1), S23),
            store(("a",), 2),
            store(("ab",), 2),
        ),
        "downward",
    )
    f = np.arange(6.0).reshape(2, 3)
    case = hand_case("PROB", "float64", [up, down], {0: (f, S23), 1: (f + 1, S23)})
    slots = check_all_paths(case)
    assert np.array_equal(slots[("b",)][0], f * (f + 1))
    assert np.array_equal(slots[("a",)][0], (f * (f + 1)) ** 2)  # rewritten by downward
    assert np.array_equal(slots[("c",)][0], slots[("d",)][0])


def test_slot_given_from_outside_and_rewritten():
    given_spec = sp((T, 0, 3), (G, 0, 2))
    prog = Program(
        (
            load_slot(0, ("given",)),
            load(1, 0),
            contract(2, (1, 0), S23),
            elim(3, 2, [(T, 0), (G, 0)]),
            store(("given",), 3),
            store(("out",), 2),
        ),
        "upward",
    )
    g = np.arange(1.0, 7.0).reshape(3, 2)
    f = np.arange(6.0).reshape(2, 3)
    case = hand_case("PROB", "float64", prog, {0: (f, S23)}, slots={("given",): (g, given_spec)})
    slots = check_all_paths(case)
    assert np.array_equal(slots[("given",)][0], (f * g.T).T)


def _dead_given_slot():
    """A program that reads a given slot, never uses the value, and overwrites the slot."""
    spec = sp((G, 0, 2))
    prog = Program((load_slot(0, ("m",)), load(1, 0), store(("m",), 1)), "downward")
    return hand_case(
        "PROB", "float64", prog, {0: (np.array([1.0, 2.0]), spec)}, slots={("m",): (np.zeros(2), spec)}
    )


def test_session_accepts_a_declared_slot_that_is_dead():
    """Regression (dcf19fd): Session.run refused a declared slot whose input was dead."""
    case = _dead_given_slot()
    exe = catbp_jit.compile(
        case.programs, case.sr(), factor_specs=case.factor_specs, slot_specs=case.slot_specs, mode="loop"
    )
    got = session_results(exe.bind(), case.inputs[0])
    assert_same_slots(run_reference(case), got, case)


def test_dropin_with_a_slot_read_unused_and_overwritten():
    """Regression (dcf19fd): the drop-in handed such a slot to Session.run, which refused it."""
    case = _dead_given_slot()
    assert_same_slots(run_reference(case), run_dropin(case, 0, "loop"), case)


@pytest.mark.parametrize("mode", ["loop", "compiled"])
def test_dropin_slot_rebound_to_another_given_slot(mode):
    """Regression (7f27b9b): the drop-in handed back the caller's old array for a slot
    rebound to the unchanged value of another given slot."""
    spec = sp((G, 0, 2))
    prog = Program((load_slot(0, ("b",)), store(("a",), 0)), "upward")
    case = hand_case(
        "PROB",
        "float64",
        prog,
        {},
        slots={("a",): (np.array([1.0, 2.0]), spec), ("b",): (np.array([3.0, 4.0]), spec)},
    )
    ref = run_reference(case)
    assert np.array_equal(ref[("a",)][0], [3.0, 4.0])
    assert_same_slots(ref, run_dropin(case, 0, mode), case, f"drop-in ({mode})")


def test_wide_products_run_as_chains_of_partial_products():
    """A product of more than PlanOptions.max_leaves leaves (a clique with many children) is
    split into a chain of materialized partial products: no kernel multiplies more leaves,
    the results agree with the reference, and the product is bit for bit the unsplit one
    (the same left-to-right order)."""
    from catbp_jit.executable import build, plan
    from catbp_jit.plan.options import PlanOptions

    axes = [(G, 0, 2), (G, 1, 3), (G, 2, 2), (T, 0, 3)]
    full = sp(*axes)
    rng = np.random.default_rng(4)
    factors = {}
    for f in range(20):
        chosen = sorted(rng.choice(len(axes), size=int(rng.integers(1, 4)), replace=False))
        spec = sp(*(axes[i] for i in chosen))
        factors[f] = (rng.uniform(0.5, 1.5, spec.shape), spec)
    ins = [load(f, f) for f in range(20)]
    ins += [
        contract(20, range(20), full),
        store(("product",), 20),
        contract(21, range(19, -1, -1), full),
        elim(22, 21, [(G, 1)]),
        store(("marginal",), 22),
    ]
    chain = 0
    for i in range(1, 13):  # a left-deep chain of binary CONTRACTs, fused into one segment
        ins.append(contract(22 + i, (chain, i), full))
        chain = 22 + i
    ins += [elim(40, chain, [(T, 0), (G, 0)]), store(("chain",), 40)]
    case = hand_case("PROB", "float64", Program(tuple(ins), "upward"), factors)
    check_all_paths(case)

    split = compile_case(case, "loop")

    def widest(exe):
        return max(len(seg.leaves) for seg in exe.fused.segments)

    assert widest(split) == PlanOptions().max_leaves
    wide = plan(case.programs, case.sr(), factor_specs=case.factor_specs, options=PlanOptions(max_leaves=64))
    whole = build(wide, mode="loop")
    assert widest(whole) == 20
    a, b = session_results(split.bind(), case.inputs[0]), session_results(whole.bind(), case.inputs[0])
    assert np.array_equal(a[("product",)][0], b[("product",)][0])
    for key in (("marginal",), ("chain",)):
        np.testing.assert_allclose(a[key][0], b[key][0], rtol=1e-13)
