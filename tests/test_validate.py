"""The validator (docs/ir.md) and the located errors of the reference VM.

Each ill-formed program must raise its OWN error class, which is also the builtin type
CatBP raises for the fault (ValueError or KeyError), with the program name, the
instruction index and the reason in str(e). Random valid programs must pass and run on
the reference VM with exactly the slot specs the validator inferred; one random
rule-breaking mutation of such a program must raise the matching class and nothing else.
"""

import dataclasses
from enum import Enum
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catbp_jit import (
    AlignmentError,
    Axis,
    AxisType,
    CatbpError,
    DoubleDefinitionError,
    Instruction,
    MissingArgumentError,
    OpCode,
    Program,
    ProgramValueError,
    SpecError,
    TensorSpec,
    UnknownInputError,
    UnknownOpcodeError,
    UnknownRegisterFreeError,
    UnwrittenSlotError,
    UseBeforeDefinitionError,
    adapt_program,
    make_semiring,
    validate_programs,
    vm_prob_semiring,
)
from catbp_jit.reference import run_program, run_programs
from catbp_jit.semiring import SEMIRING_NAMES

G, T = AxisType.GEOMETRIC, AxisType.TOPOLOGICAL
I = Instruction  # noqa: E741 (I(...) reads as an instruction of a listing)
OP = OpCode


def sp(*axes):
    """sp((G, 0, 2), (T, 3, 4)) -> TensorSpec of those (kind, id, size) axes."""
    return TensorSpec(tuple(Axis(aid, kind, size) for kind, aid, size in axes))


S2 = sp((G, 0, 2))
S23 = sp((G, 0, 2), (G, 1, 3))


def unit(dst, spec):
    return I(OP.UNIT, dst, {}, spec)


def load(dst, fid):
    return I(OP.LOAD_FACTOR, dst, {"factor_id": fid})


def contract(dst, inputs, out_spec):
    return I(OP.CONTRACT, dst, {"inputs": tuple(inputs), "out_spec": out_spec}, out_spec)


def elim(dst, src, keep):
    return I(OP.ELIMINATE, dst, {"src": src, "keep_keys": tuple(keep)})


def store(slot, src):
    return I(OP.STORE_SLOT, None, {"slot": slot, "src": src})


def load_slot(dst, slot):
    return I(OP.LOAD_SLOT, dst, {"slot": slot})


def free(*srcs):
    return I(OP.FREE, None, {"srcs": tuple(srcs)})


def normalize(src):
    return I(OP.NORMALIZE, None, {"src": src})


def expect(exc_cls, builtin, fn, *, program, index, reason):
    """fn() raises exactly exc_cls, a `builtin`, located at (program, index), with reason."""
    with pytest.raises(CatbpError) as ei:
        fn()
    e = ei.value
    assert type(e) is exc_cls, (type(e), str(e))
    assert isinstance(e, builtin)
    msg = str(e)
    assert e.program == program and e.index == index, msg
    assert f"program {program!r}" in msg, msg
    assert f"instruction [{index}]" in msg, msg
    assert reason in msg, msg
    return e


def validate(instrs, name="prog", **kw):
    return validate_programs([Program(tuple(instrs), name)], **kw)


# --- registers ---------------------------------------------------------------------------


def test_use_before_definition():
    e = expect(
        UseBeforeDefinitionError,
        KeyError,
        lambda: validate([unit(0, S2), contract(1, (0, 5), S2)]),
        program="prog",
        index=1,
        reason="r5 is used before it is defined",
    )
    assert e.operand == "inputs[1]"
    expect(
        UseBeforeDefinitionError,
        KeyError,
        lambda: validate([elim(1, 0, ()), unit(0, S2)]),
        program="prog",
        index=0,
        reason="before it is defined",
    )
    expect(
        UseBeforeDefinitionError,
        KeyError,
        lambda: validate([unit(0, S2), store(("s",), 3)]),
        program="prog",
        index=1,
        reason="r3",
    )
    expect(
        UseBeforeDefinitionError,
        KeyError,
        lambda: validate([unit(0, S2), normalize(2)]),
        program="prog",
        index=1,
        reason="r2",
    )


def test_registers_do_not_cross_programs():
    p0 = Program((unit(0, S2), store(("s",), 0)), "first")
    p1 = Program((elim(1, 0, ()),), "second")
    expect(
        UseBeforeDefinitionError,
        KeyError,
        lambda: validate_programs([p0, p1]),
        program="second",
        index=0,
        reason="r0",
    )


def test_use_after_free():
    expect(
        UseBeforeDefinitionError,
        KeyError,
        lambda: validate([unit(0, S2), unit(1, S2), free(0), contract(2, (1, 0), S2)]),
        program="prog",
        index=3,
        reason="r0 is used after FREE at [2]",
    )


def test_double_definition():
    expect(
        DoubleDefinitionError,
        ValueError,
        lambda: validate([unit(0, S2), load(1, 0), unit(0, S2)]),
        program="prog",
        index=2,
        reason="r0 is defined twice (first at [0])",
    )
    # re-using a register id after FREE is still a second definition (single assignment)
    expect(
        DoubleDefinitionError,
        ValueError,
        lambda: validate([unit(0, S2), free(0), contract(0, (), S2)]),
        program="prog",
        index=2,
        reason="defined twice",
    )


def test_free_of_unknown_or_freed_register():
    expect(
        UnknownRegisterFreeError,
        KeyError,
        lambda: validate([unit(0, S2), free(0, 7)]),
        program="prog",
        index=1,
        reason="r7, never defined",
    )
    expect(
        UnknownRegisterFreeError,
        KeyError,
        lambda: validate([unit(0, S2), free(0), free(0)]),
        program="prog",
        index=2,
        reason="already freed at [1]",
    )
    expect(
        UnknownRegisterFreeError,
        KeyError,
        lambda: validate([unit(0, S2), free(0, 0)]),
        program="prog",
        index=1,
        reason="already freed at [1]",
    )


# --- slots -------------------------------------------------------------------------------


def test_unwritten_slot():
    expect(
        UnwrittenSlotError,
        KeyError,
        lambda: validate([unit(0, S2), load_slot(1, ("m", 1))]),
        program="prog",
        index=1,
        reason="('m', 1)",
    )
    # written later in the same program: still a read before write
    expect(
        UnwrittenSlotError,
        KeyError,
        lambda: validate([load_slot(1, ("m", 1)), unit(0, S2), store(("m", 1), 0)]),
        program="prog",
        index=0,
        reason="read before any STORE_SLOT",
    )
    # written by a LATER program: still an error, in the reading program
    p0 = Program((load_slot(0, ("m",)),), "reader")
    p1 = Program((unit(0, S2), store(("m",), 0)), "writer")
    expect(
        UnwrittenSlotError,
        KeyError,
        lambda: validate_programs([p0, p1]),
        program="reader",
        index=0,
        reason="('m',)",
    )


def test_slot_written_earlier_or_given_is_fine():
    p0 = Program((unit(0, S23), store(("m", 1), 0), free(0)), "up")
    p1 = Program((load_slot(0, ("m", 1)), elim(1, 0, [(G, 1)]), store(("out",), 1), free(0, 1)), "down")
    v = validate_programs([p0, p1])
    assert v.slot_specs == {("m", 1): S23, ("out",): sp((G, 1, 3))}
    assert v.value_specs[1][:2] == [S23, sp((G, 1, 3))]
    # given up front, with a spec or with an unknown (None) spec; JSON-ish list keys too
    v = validate([load_slot(0, ("m", 1)), contract(1, (0,), S23)], slot_specs={("m", 1): S2})
    assert v.value_specs[0][:2] == [S2, S23]
    v = validate([load_slot(0, ("m", 1)), contract(1, (0,), S23)], slot_specs={("m", 1): None})
    assert v.value_specs[0][0] is None
    validate([load_slot(0, ("m", 1))], slot_specs={("m", 1): S2})
    # ...but a given slot's spec is still checked against the CONTRACT
    expect(
        AlignmentError,
        ValueError,
        lambda: validate([load_slot(0, ("m",)), contract(1, (0,), sp((G, 5, 2)))], slot_specs={("m",): S2}),
        program="prog",
        index=1,
        reason="G0",
    )


def test_slot_rewritten_with_a_different_spec():
    e = expect(
        ProgramValueError,
        ValueError,
        lambda: validate([unit(0, S2), unit(1, S23), store(("s",), 0), store(("s",), 1)]),
        program="prog",
        index=3,
        reason="a slot's spec is fixed at its first write",
    )
    assert not isinstance(e, KeyError)
    # across programs and against slot_specs too
    p0 = Program((unit(0, S2), store(("s",), 0)), "a")
    p1 = Program((unit(0, S23), store(("s",), 0)), "b")
    expect(
        ProgramValueError,
        ValueError,
        lambda: validate_programs([p0, p1]),
        program="b",
        index=1,
        reason="fixed at its first write",
    )
    expect(
        ProgramValueError,
        ValueError,
        lambda: validate([unit(0, S23), store(("s",), 0)], slot_specs={("s",): S2}),
        program="prog",
        index=1,
        reason="fixed at its first write",
    )
    # the same spec again is fine
    validate([unit(0, S2), unit(1, S2), store(("s",), 0), store(("s",), 1)])


# --- alignment and specs -----------------------------------------------------------------


def test_contract_alignment_errors():
    expect(
        AlignmentError,
        ValueError,
        lambda: validate([unit(0, S23), contract(1, (0,), S2)]),
        program="prog",
        index=1,
        reason="G1 (size 3) is not in the output spec",
    )
    expect(
        AlignmentError,
        ValueError,
        lambda: validate(
            [load(0, 0), unit(1, S2), contract(2, (1, 0), S2)], factor_specs={0: sp((T, 0, 2))}
        ),  # (T,0) is not (G,0)
        program="prog",
        index=2,
        reason="T0",
    )
    e = expect(
        AlignmentError,
        ValueError,
        lambda: validate([unit(0, S2), contract(1, (0,), sp((G, 0, 3)))]),
        program="prog",
        index=1,
        reason="size mismatch for axis G0",
    )
    assert e.operand == "inputs[0]"
    # an extra singleton axis is fine
    v = validate([unit(0, sp((G, 0, 2), (T, 4, 1))), contract(1, (0,), sp((G, 7, 3), (G, 0, 2)))])
    assert v.value_specs[0][1] == sp((G, 7, 3), (G, 0, 2))


@pytest.mark.parametrize(
    "bad, reason",
    [
        (sp((G, 0, 0)), "has size 0"),
        (sp((G, 0, 2), (T, 1, -1)), "has size -1"),
        (sp((G, 0, 2), (G, 0, 2)), "appears twice"),
        (sp((T, 3, 2), (G, 1, 2), (T, 3, 2)), "appears twice"),
        (sp((G, 0, 2**32), (G, 1, 2**32)), "overflow int64"),
        (sp((G, 0, 2**31), (G, 1, 2**31), (G, 2, 2)), "overflow int64"),
    ],
)
def test_bad_specs(bad, reason):
    expect(
        SpecError,
        ValueError,
        lambda: validate([unit(0, S2), unit(1, bad)]),
        program="prog",
        index=1,
        reason=reason,
    )
    expect(
        SpecError,
        ValueError,
        lambda: validate([unit(0, S2), contract(1, (0,), bad)]),
        program="prog",
        index=1,
        reason=reason,
    )


def test_spec_over_max_bytes():
    big = sp((G, 0, 10), (G, 1, 10))  # 100 elements, 800 bytes at itemsize 8
    validate([unit(0, big)], max_bytes=800)
    expect(
        SpecError,
        ValueError,
        lambda: validate([unit(0, big)], max_bytes=799),
        program="prog",
        index=0,
        reason="exceed the limit of 799",
    )
    expect(
        SpecError,
        ValueError,
        lambda: validate([unit(0, big)], itemsize=16, max_bytes=1000),
        program="prog",
        index=0,
        reason="1600 bytes",
    )
    # 2**40 elements is fine for int64 but not for the default byte limit
    expect(
        SpecError,
        ValueError,
        lambda: validate([unit(0, sp((G, 0, 2**20), (G, 1, 2**20)))]),
        program="prog",
        index=0,
        reason="exceed the limit",
    )


def test_bad_factor_spec_is_reported_with_its_id():
    with pytest.raises(SpecError) as ei:
        validate([load(0, 4)], factor_specs={4: sp((G, 0, 0))})
    assert isinstance(ei.value, ValueError)
    assert "factor 4" in str(ei.value) and "size 0" in str(ei.value)


def test_unknown_factor():
    e = expect(
        UnknownInputError,
        KeyError,
        lambda: validate([load(0, 0), load(1, 3)], factor_specs={0: S2}),
        program="prog",
        index=1,
        reason="no factor with id 3",
    )
    assert e.operand == "factor_id"
    # without factor_specs, loads are accepted and their specs are unknown
    v = validate([load(0, 3), elim(1, 0, ())])
    assert v.value_specs[0] == [None, None]


def test_keep_keys_repeating_an_axis():
    expect(
        ProgramValueError,
        ValueError,
        lambda: validate([unit(0, S23), elim(1, 0, [(G, 0), (G, 0)])]),
        program="prog",
        index=1,
        reason="repeat an axis",
    )


# --- opcodes and arguments (adapt_program and validate_programs) -------------------------


class ForeignOp(Enum):
    FROB = 42


@pytest.mark.parametrize("op", [ForeignOp.FROB, SimpleNamespace(name="FROB")])
def test_unknown_opcode(op):
    prog = Program((unit(0, S2), Instruction(op, 1, {})), "prog")
    for fn in (lambda: adapt_program(prog), lambda: validate_programs([prog])):
        e = expect(UnknownOpcodeError, ValueError, fn, program="prog", index=1, reason="unknown opcode")
        assert "FROB" in str(e)


MISSING = [
    ("CONTRACT without inputs", I(OP.CONTRACT, 1, {"out_spec": S2}, S2), "inputs"),
    ("CONTRACT without out_spec", I(OP.CONTRACT, 1, {"inputs": (0,)}), "out_spec"),
    ("ELIMINATE without src", I(OP.ELIMINATE, 1, {"keep_keys": ()}), "src"),
    ("LOAD_FACTOR without factor_id", I(OP.LOAD_FACTOR, 1, {}), "factor_id"),
    ("UNIT without spec", I(OP.UNIT, 1, {}), "spec"),
    ("LOAD_SLOT without dst", I(OP.LOAD_SLOT, None, {"slot": ("s",)}), "dst"),
    ("LOAD_SLOT without slot", I(OP.LOAD_SLOT, 1, {}), "slot"),
    ("STORE_SLOT without src", I(OP.STORE_SLOT, None, {"slot": ("s",)}), "src"),
    ("NORMALIZE without src", I(OP.NORMALIZE, None, {}), "src"),
    ("LOAD_SELECTOR without selector_id", I(OP.LOAD_SELECTOR, 1, {}), "selector_id"),
]


@pytest.mark.parametrize("what, ins, reason", MISSING, ids=[m[0] for m in MISSING])
def test_missing_argument(what, ins, reason):
    prog = Program((unit(0, S2), ins), "prog")
    for fn in (lambda: adapt_program(prog), lambda: validate_programs([prog])):
        expect(MissingArgumentError, ValueError, fn, program="prog", index=1, reason=reason)


def test_unnamed_program_is_named_in_adapt_errors_too():
    p = Program((unit(0, S2), I(OP.UNIT, 1, {})))  # UNIT without spec, no program name
    with pytest.raises(MissingArgumentError) as ei:
        validate_programs([p])
    assert "'p0'" in str(ei.value)


def test_unnamed_programs_are_named_by_position():
    p0 = Program((unit(0, S2), store(("s",), 0)))
    p1 = Program((unit(0, S2), free(0), free(0)))
    expect(
        UnknownRegisterFreeError,
        KeyError,
        lambda: validate_programs([p0, p1]),
        program="p1",
        index=2,
        reason="already freed",
    )


# --- runtime errors of the reference VM --------------------------------------------------


def fp_table(table):
    return lambda i: table[i]


def test_vm_missing_slot_is_a_located_key_error():
    prog = Program((unit(0, S2), load_slot(1, ("nowhere", 2))), "rt")
    with pytest.raises(KeyError) as ei:
        run_program(prog, vm_prob_semiring(), fp_table({}), fp_table({}))
    e = ei.value
    assert isinstance(e, UnwrittenSlotError)
    assert "program 'rt'" in str(e) and "instruction [1]" in str(e) and "nowhere" in str(e)


def test_vm_missing_register_is_a_located_key_error():
    prog = Program((unit(0, S2), contract(1, (0, 9), S2)), "rt")
    with pytest.raises(KeyError) as ei:
        run_program(prog, vm_prob_semiring(), fp_table({}), fp_table({}))
    assert isinstance(ei.value, UseBeforeDefinitionError)
    assert "program 'rt'" in str(ei.value) and "instruction [1]" in str(ei.value)
    assert "r9" in str(ei.value)


def test_vm_illegal_alignment_is_a_located_value_error():
    fac = {0: (np.arange(3.0), sp((G, 0, 3)))}
    prog = Program((load(0, 0), unit(1, sp((G, 1, 2))), contract(2, (1, 0), sp((G, 1, 2)))), "rt")
    with pytest.raises(ValueError) as ei:
        run_program(prog, vm_prob_semiring(), fp_table(fac), fp_table({}))
    assert isinstance(ei.value, AlignmentError)
    assert "program 'rt'" in str(ei.value) and "instruction [2]" in str(ei.value)
    assert "G0" in str(ei.value)
    # a size mismatch too
    prog = Program((load(0, 0), contract(1, (0,), sp((G, 0, 4)))), "rt2")
    with pytest.raises(ValueError) as ei:
        run_program(prog, vm_prob_semiring(), fp_table(fac), fp_table({}))
    assert "program 'rt2'" in str(ei.value) and "instruction [1]" in str(ei.value)
    assert "size mismatch" in str(ei.value)


def test_vm_provider_key_error_is_located():
    prog = Program((unit(0, S2), load(1, 5)), "rt")
    with pytest.raises(KeyError) as ei:
        run_program(prog, vm_prob_semiring(), fp_table({}), fp_table({}))
    assert "program 'rt'" in str(ei.value) and "instruction [1]" in str(ei.value)


def test_vm_bare_key_error_from_provider_stays_a_key_error():
    def provider(i):
        raise KeyError()

    prog = Program((load(0, 5),), "rt")
    with pytest.raises(KeyError) as ei:
        run_program(prog, vm_prob_semiring(), provider, provider)
    assert "instruction [0]" in str(ei.value)


# --- random valid programs, then one mutation ---------------------------------------------

POOL = [(G, 0), (G, 1), (G, 2), (T, 2), (T, 0)]


@dataclasses.dataclass
class Generated:
    programs: list
    sizes: dict
    factors: dict  # id -> (array, spec)
    init_slots: dict  # slot key -> (array, spec)
    expected_values: list  # per program, per instruction: spec or None
    expected_slots: dict


def rand_spec(draw, sizes, min_size=0):
    perm = draw(st.permutations(POOL))
    keys = perm[: draw(st.integers(min_size, len(perm)))]
    return TensorSpec(tuple(Axis(aid, kind, sizes[(kind, aid)]) for kind, aid in keys))


@st.composite
def valid_programs(draw):
    sizes = {k: draw(st.integers(1, 3)) for k in POOL}
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    factors = {}
    for fid in range(draw(st.integers(1, 3))):
        s = rand_spec(draw, sizes)
        factors[fid] = (rng.uniform(0.0, 2.0, size=s.shape), s)
    slots = {}
    init_slots = {}
    if draw(st.booleans()):
        s = rand_spec(draw, sizes)
        init_slots[("init",)] = (rng.uniform(0.0, 2.0, size=s.shape), s)
        slots[("init",)] = s
    programs, expected_values = [], []
    for p in range(draw(st.integers(1, 3))):
        live = {}
        next_rid = draw(st.integers(0, 5))
        instrs, exp = [], []

        def define(ins, spec, instrs=instrs, exp=exp, live=live):  # bound: this program's
            nonlocal next_rid
            instrs.append(ins)
            exp.append(spec)
            live[ins.dst] = spec
            next_rid += draw(st.integers(1, 3))  # register ids need not be dense

        # start with a definition so that every program defines something
        fid = draw(st.sampled_from(sorted(factors)))
        define(load(next_rid, fid), factors[fid][1])
        for _ in range(draw(st.integers(1, 10))):
            choices = [
                "load",
                "unit",
                "contract",
                "eliminate",
                "normalize",
                "store",
                "free",
                "load_slot",
                "store",
                "load_slot",
            ]  # slots twice as often
            kind = draw(st.sampled_from(choices))
            if kind == "load":
                fid = draw(st.sampled_from(sorted(factors)))
                define(load(next_rid, fid), factors[fid][1])
            elif kind == "unit":
                s = rand_spec(draw, sizes)
                define(unit(next_rid, s), s)
            elif kind == "load_slot" and slots:
                key = draw(st.sampled_from(sorted(slots)))
                define(load_slot(next_rid, key), slots[key])
            elif kind == "contract":
                srcs = draw(st.lists(st.sampled_from(sorted(live)), max_size=3)) if live else []
                required = []
                for r in srcs:
                    for ax in live[r].axes:
                        if ax.size > 1 and ax.key not in required:
                            required.append(ax.key)
                optional = [k for k in POOL if k not in required]
                extra = draw(st.lists(st.sampled_from(optional), unique=True)) if optional else []
                keys = draw(st.permutations(required + extra))
                out = TensorSpec(tuple(Axis(aid, k, sizes[(k, aid)]) for k, aid in keys))
                define(contract(next_rid, srcs, out), out)
            elif kind == "eliminate" and live:
                src = draw(st.sampled_from(sorted(live)))
                in_spec = live[src]
                if draw(st.booleans()):
                    keep = tuple(draw(st.permutations(POOL))[: draw(st.integers(0, len(POOL)))])
                    ins = elim(next_rid, src, keep)
                else:
                    drop = tuple(draw(st.lists(st.sampled_from([0, 1, 2]), unique=True)))
                    ins = I(OP.ELIMINATE, next_rid, {"src": src, "drop": drop})
                    keep = tuple(ax.key for ax in in_spec.axes if ax.id not in drop)
                out = TensorSpec(tuple(ax for k in keep for ax in in_spec.axes if ax.key == k))
                define(ins, out)
            elif kind == "normalize" and live:
                src = draw(st.sampled_from(sorted(live)))
                instrs.append(normalize(src))
                exp.append(live[src])
            elif kind == "store" and live:
                src = draw(st.sampled_from(sorted(live)))
                same = [k for k, s in slots.items() if s == live[src]]
                if same and draw(st.booleans()):
                    key = draw(st.sampled_from(sorted(same)))  # rewrite with the same spec
                else:
                    key = ("s", p, len(instrs))
                instrs.append(store(key, src))
                exp.append(None)
                slots[key] = live[src]
            elif kind == "free" and live:
                rids = draw(st.lists(st.sampled_from(sorted(live)), unique=True, min_size=1))
                instrs.append(free(*rids))
                exp.append(None)
                for r in rids:
                    del live[r]
        if live:  # complete cleanup: every register is freed at the end
            instrs.append(free(*sorted(live)))
            exp.append(None)
        programs.append(Program(tuple(instrs), f"prog{p}"))
        expected_values.append(exp)
    return Generated(programs, sizes, factors, init_slots, expected_values, dict(slots))


DEFINING = (OP.UNIT, OP.LOAD_FACTOR, OP.LOAD_SLOT, OP.CONTRACT, OP.ELIMINATE)


def reads(ins):
    a = ins.args
    if ins.op == OP.CONTRACT:
        return tuple(a["inputs"])
    if ins.op in (OP.ELIMINATE, OP.NORMALIZE, OP.STORE_SLOT):
        return (a["src"],)
    if ins.op == OP.FREE:
        return tuple(a["srcs"])
    return ()


def validate_generated(g, programs=None):
    return validate_programs(
        g.programs if programs is None else programs,
        factor_specs={k: s for k, (_, s) in g.factors.items()},
        slot_specs={k: s for k, (_, s) in g.init_slots.items()},
    )


GEN_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@GEN_SETTINGS
@given(valid_programs(), st.sampled_from(SEMIRING_NAMES))
def test_random_valid_programs_validate_and_run(g, sr_name):
    v = validate_generated(g)
    assert v.value_specs == g.expected_values
    assert v.slot_specs == g.expected_slots
    sr = make_semiring(sr_name)
    fp = fp_table(g.factors)
    slots = run_programs(g.programs, sr, fp, fp, slots=dict(g.init_slots))
    assert set(slots) == set(v.slot_specs)
    for key, spec in v.slot_specs.items():
        arr, run_spec = slots[key]
        assert run_spec == spec, key
        assert np.asarray(arr).shape == spec.shape, key


def mutations(g):
    """Every applicable (name, programs, expected class, program name, index)."""
    out = []
    for p, prog in enumerate(g.programs):
        ins = list(prog.instructions)

        def with_(new, p=p, prog=prog):
            progs = list(g.programs)
            progs[p] = Program(tuple(new), prog.name)
            return progs

        for j, x in enumerate(ins):
            if x.op in DEFINING:
                # delete the definition: the first later reference fails
                k = next(k for k in range(j + 1, len(ins)) if x.dst in reads(ins[k]))
                cls = UnknownRegisterFreeError if ins[k].op == OP.FREE else UseBeforeDefinitionError
                out.append(("delete def", with_(ins[:j] + ins[j + 1 :]), cls, prog.name, k - 1))
                # duplicate the definition: a second write of the same dst
                out.append(
                    (
                        "duplicate dst",
                        with_(ins[: j + 1] + [x] + ins[j + 1 :]),
                        DoubleDefinitionError,
                        prog.name,
                        j + 1,
                    )
                )
            if x.op == OP.FREE:
                out.append(
                    (
                        "free twice",
                        with_(ins[: j + 1] + [x] + ins[j + 1 :]),
                        UnknownRegisterFreeError,
                        prog.name,
                        j + 1,
                    )
                )
            if x.op == OP.CONTRACT:
                # the keys of the inputs, from the specs the generator tracked
                in_keys = set()
                for r in x.args["inputs"]:
                    d = next(i for i in range(j) if ins[i].op in DEFINING and ins[i].dst == r)
                    in_keys |= set(g.expected_values[p][d].keys)
                for a, ax in enumerate(x.args["out_spec"].axes):
                    axes = list(x.args["out_spec"].axes)
                    if ax.key in in_keys:
                        axes[a] = Axis(ax.id, ax.kind, ax.size + 1)
                        bad = TensorSpec(tuple(axes))
                        y = I(OP.CONTRACT, x.dst, {"inputs": x.args["inputs"], "out_spec": bad}, bad)
                        out.append(
                            (
                                "corrupt size",
                                with_(ins[:j] + [y] + ins[j + 1 :]),
                                AlignmentError,
                                prog.name,
                                j,
                            )
                        )
                    axes[a] = Axis(ax.id, ax.kind, 0)
                    bad = TensorSpec(tuple(axes))
                    y = I(OP.CONTRACT, x.dst, {"inputs": x.args["inputs"], "out_spec": bad}, bad)
                    out.append(("zero size", with_(ins[:j] + [y] + ins[j + 1 :]), SpecError, prog.name, j))
    # delete the only STORE_SLOT of a slot that a later LOAD_SLOT reads
    for p, prog in enumerate(g.programs):
        for j, x in enumerate(prog.instructions):
            if x.op != OP.STORE_SLOT or x.args["slot"] in g.init_slots:
                continue
            key = x.args["slot"]
            stores = [
                (q, i)
                for q, pr in enumerate(g.programs)
                for i, y in enumerate(pr.instructions)
                if y.op == OP.STORE_SLOT and y.args["slot"] == key
            ]
            loads = [
                (q, i)
                for q, pr in enumerate(g.programs)
                for i, y in enumerate(pr.instructions)
                if y.op == OP.LOAD_SLOT and y.args["slot"] == key
            ]
            if len(stores) != 1 or not loads:
                continue
            q, i = loads[0]
            progs = list(g.programs)
            progs[p] = Program(prog.instructions[:j] + prog.instructions[j + 1 :], prog.name)
            out.append(
                ("delete store", progs, UnwrittenSlotError, g.programs[q].name, i - 1 if q == p else i)
            )
    return out


@GEN_SETTINGS
@given(valid_programs(), st.data())
def test_one_mutation_raises_the_matching_error(g, data):
    muts = mutations(g)
    assert muts  # a program always has a definition to delete
    # pick the kind of mutation first, so that the rarer kinds are drawn as often
    kind = data.draw(st.sampled_from(sorted({m[0] for m in muts})))
    name, progs, cls, prog_name, index = data.draw(st.sampled_from([m for m in muts if m[0] == kind]))
    expect(
        cls,
        KeyError if issubclass(cls, KeyError) else ValueError,
        lambda: validate_generated(g, progs),
        program=prog_name,
        index=index,
        reason="",
    )


def test_validator_and_vm_agree_on_non_canonical_own_program():
    p = Program(
        (
            unit(0, S2),
            I(OP.CONTRACT, 1, {"inputs": (0,)}, S2),
            I(OP.STORE_SLOT, None, {"slot": "m", "src": 1}),
        ),
        "x",
    )
    v = validate_programs([p])
    slots = run_program(p, vm_prob_semiring(), fp_table({}), fp_table({}))
    assert set(slots) == set(v.slot_specs) == {("m",)}
