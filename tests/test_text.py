"""Program listings: the §7 example parses, and format -> parse is the identity."""

import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catbp_jit.errors import ProgramValueError, UnknownOpcodeError
from catbp_jit.ir.adapt import adapt_instruction, adapt_program
from catbp_jit.ir.ops import Instruction, OpCode, Program
from catbp_jit.ir.schema import Axis, AxisType, TensorSpec
from catbp_jit.ir.text import (
    ListingError,
    format_instruction,
    format_program,
    format_programs,
    parse_program,
    parse_programs,
)
from conftest import shared_dir

G, T = AxisType.GEOMETRIC, AxisType.TOPOLOGICAL
CORPUS = shared_dir() / "corpus"
BUNDLES = sorted(p for p in CORPUS.glob("*") if (p / "bundle.json").is_file())

# The IR spec's §7 example (chain A -> B), with its `...` filled in and both key spellings.
EXAMPLE = """
program upward        # chain A -> B
  [0] LOAD_FACTOR dst=1 args={'factor_id': 0}          # Load factor f_A
  [1] CONTRACT dst=2 args={'inputs': (1,), 'out_spec': {G0: 2}}   # Trivial contraction
  [2] ELIMINATE dst=3 args={'src': 2, 'keep_keys': ((GEOMETRIC, 0),)}
  [3] STORE_SLOT args={'slot': ('msg', 0, 1), 'src': 3}
  [4] FREE args={'srcs': (1, 2, 3)}

  [5] LOAD_FACTOR dst=4 args={'factor_id': 1}          # Load factor f_AB
  [6] LOAD_SLOT dst=5 args={'slot': ('msg', 0, 1)}     # Load A's message
\t[7] CONTRACT dst=6 args={'inputs': (4, 5), 'out_spec': {(GEOMETRIC, 0): 2, G1: 3}}
  [8] STORE_SLOT args={'slot': ('bel', 1), 'src': 6}   # Store root belief # twice
  [9] FREE args={'srcs': (4, 5, 6)}

program finalize
  [0] LOAD_SLOT dst=1 args={'slot': ('bel', 1)}
  [1] ELIMINATE dst=2 args={'src': 1, 'keep_keys': ()}
  [2] STORE_SLOT args={'slot': ('Z',), 'src': 2}
  [3] FREE args={'srcs': (1, 2)}
"""


def test_section7_example():
    a = TensorSpec((Axis(0, G, 2),))
    ab = TensorSpec((Axis(0, G, 2), Axis(1, G, 3)))
    upward = Program(
        (
            Instruction(OpCode.LOAD_FACTOR, 1, {"factor_id": 0}),
            Instruction(OpCode.CONTRACT, 2, {"inputs": (1,), "out_spec": a}, a),
            Instruction(OpCode.ELIMINATE, 3, {"src": 2, "keep_keys": ((G, 0),)}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("msg", 0, 1), "src": 3}),
            Instruction(OpCode.FREE, None, {"srcs": (1, 2, 3)}),
            Instruction(OpCode.LOAD_FACTOR, 4, {"factor_id": 1}),
            Instruction(OpCode.LOAD_SLOT, 5, {"slot": ("msg", 0, 1)}),
            Instruction(OpCode.CONTRACT, 6, {"inputs": (4, 5), "out_spec": ab}, ab),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("bel", 1), "src": 6}),
            Instruction(OpCode.FREE, None, {"srcs": (4, 5, 6)}),
        ),
        "upward",
    )
    finalize = Program(
        (
            Instruction(OpCode.LOAD_SLOT, 1, {"slot": ("bel", 1)}),
            Instruction(OpCode.ELIMINATE, 2, {"src": 1, "keep_keys": ()}),
            Instruction(OpCode.STORE_SLOT, None, {"slot": ("Z",), "src": 2}),
            Instruction(OpCode.FREE, None, {"srcs": (1, 2)}),
        ),
        "finalize",
    )
    assert parse_programs(EXAMPLE) == [upward, finalize]
    assert parse_programs(format_programs([upward, finalize])) == [upward, finalize]
    assert format_program(finalize).splitlines()[:2] == [
        "program finalize",
        "  [0] LOAD_SLOT dst=1 args={'slot': ('bel', 1)}",
    ]


def test_format_instruction_spelling():
    ins = Instruction(OpCode.ELIMINATE, 4, {"src": 3, "keep_keys": ((G, 8), (T, 32))})
    assert format_instruction(ins, 3) == "[3] ELIMINATE dst=4 args={'src': 3, 'keep_keys': (G8, T32)}"
    assert str(ins) == "ELIMINATE dst=4 args={'src': 3, 'keep_keys': (G8, T32)}"
    unit = Instruction(OpCode.UNIT, 1, {}, TensorSpec((Axis(8, G, 2), Axis(32, T, 1))))
    assert format_instruction(unit) == "UNIT dst=1 spec={G8: 2, T32: 1}"
    empty = adapt_instruction(
        SimpleNamespace(op="CONTRACT", dst=2, args={"inputs": (1,)}, spec=TensorSpec(()))
    )
    assert format_instruction(empty) == "CONTRACT dst=2 args={'inputs': (1,), 'out_spec': {}}"
    assert parse_program("[0] " + format_instruction(empty)).instructions == (empty,)
    assert format_program(Program((), None)) == "program"
    assert format_program(Program((), "a b")) == "program 'a b'"


def _load_bundle(path):
    data = json.loads((path / "bundle.json").read_text())
    return [
        adapt_program([SimpleNamespace(**ins) for ins in p["instructions"]], name=p["name"])
        for p in data["programs"]
    ]


@pytest.mark.parametrize("bundle", BUNDLES, ids=lambda p: p.name)
def test_corpus_round_trip(bundle):
    programs = _load_bundle(bundle)
    assert programs
    for p in programs:
        text = format_program(p)
        back = parse_program(text)
        assert back == p
        assert format_program(back) == text
    text = format_programs(programs)
    assert parse_programs(text) == programs
    assert format_programs(parse_programs(text)) == text


# ---------------------------------------------------------------- random instructions

kinds = st.sampled_from(list(AxisType))
ids = st.integers(-2, 300)
keys = st.tuples(kinds, ids)
regs = st.integers(0, 10**6)
specs = st.lists(st.builds(Axis, ids, kinds, st.integers(0, 1000)), max_size=4).map(TensorSpec)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=False), st.text(max_size=6)
)
# Anywhere but a spec position, `{}` is a dict: nested specs are non-empty.
nested = st.recursive(
    st.one_of(scalars, keys, specs.filter(lambda s: s.ndim > 0)),
    lambda c: st.one_of(
        st.lists(c, max_size=3).map(tuple),
        st.lists(c, max_size=3),
        st.dictionaries(st.one_of(st.text(max_size=4), regs), c, max_size=3),
    ),
    max_leaves=8,
)
slot_keys = st.lists(
    st.one_of(
        st.text(max_size=5),
        st.integers(-5, 10**9),
        st.lists(st.one_of(st.text(max_size=3), regs), max_size=2).map(tuple),
    ),
    max_size=4,
).map(tuple)
NEEDS_DST = {
    OpCode.UNIT,
    OpCode.LOAD_FACTOR,
    OpCode.LOAD_SELECTOR,
    OpCode.LOAD_SLOT,
    OpCode.CONTRACT,
    OpCode.ELIMINATE,
}


@st.composite
def instructions(draw):
    op = draw(st.sampled_from(list(OpCode)))
    dst = draw(regs) if op in NEEDS_DST else draw(st.none() | regs)
    spec = draw(specs) if op == OpCode.UNIT else draw(st.none() | specs)
    args = {}
    if op == OpCode.LOAD_FACTOR:
        args["factor_id"] = draw(regs)
    elif op == OpCode.LOAD_SELECTOR:
        args[draw(st.sampled_from(["selector_id", "mode_axis_id"]))] = draw(regs)
    elif op in (OpCode.LOAD_SLOT, OpCode.STORE_SLOT):
        args["slot"] = draw(slot_keys)
        if op == OpCode.STORE_SLOT:
            args["src"] = draw(regs)
    elif op == OpCode.CONTRACT:
        args["inputs"] = tuple(draw(st.lists(regs, max_size=4)))
        args["out_spec"] = draw(specs)
    elif op == OpCode.ELIMINATE:
        args["src"] = draw(regs)
        if draw(st.booleans()):
            args["keep_keys"] = tuple(draw(st.lists(keys, max_size=4)))
        else:
            args["drop"] = tuple(draw(st.lists(ids, max_size=3)))
    elif op in (OpCode.NORMALIZE, OpCode.FREE):
        args["src" if op == OpCode.NORMALIZE else "srcs"] = draw(
            regs if op == OpCode.NORMALIZE else st.lists(regs, max_size=4).map(tuple)
        )
    if draw(st.booleans()):
        args["note"] = draw(nested)
    return adapt_instruction(SimpleNamespace(op=op.name, dst=dst, args=args, spec=spec))


names = st.none() | st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True) | st.text(max_size=8)
programs = st.builds(Program, st.lists(instructions(), max_size=6).map(tuple), names)


@settings(max_examples=300, deadline=None)
@given(programs)
def test_random_round_trip(p):
    text = format_program(p)
    back = parse_program(text)
    assert back == p
    assert format_program(back) == text


@settings(max_examples=50, deadline=None)
@given(st.lists(programs, max_size=4))
def test_random_programs_round_trip(ps):
    text = format_programs(ps)
    assert parse_programs(text) == ps


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    "line, reason",
    [
        ("[0] FROBNICATE dst=1", "unknown opcode"),
        ("[0] LOAD_FACTOR dst=1 args={'factor_id': }", "bad syntax"),
        ("[0] LOAD_FACTOR dst=1 args={'factor_id': x}", "unknown name 'x'"),
        ("[0] LOAD_FACTOR dst=1 args={'factor_id': __import__('os').system('true')}", "Call"),
        ("[0] LOAD_FACTOR dst=__import__('os') args={'factor_id': 0}", "Call"),
        ("[0] LOAD_FACTOR dst=1 args={'factor_id': 0} spec={G0: 2", "unbalanced"),
        ("[0] LOAD_FACTOR dst=1 args={'factor_id': 'abc}", "unterminated"),
        ("[0] LOAD_FACTOR dst=1 args={'factor_id': 0} foo=3", "unknown field"),
        ("[0] LOAD_FACTOR dst=1 dst=2 args={'factor_id': 0}", "twice"),
        ("[0] LOAD_FACTOR 1 args={'factor_id': 0}", "unexpected"),
        ("[0] LOAD_FACTOR args={'factor_id': 0}", "dst"),
        ("[0] ELIMINATE dst=2 args={'src': 1, 'keep_keys': 5}", "line 3"),
        ("[0] UNIT dst=1 spec={G0: 2, 'a': 1}", "mixes"),
        ("[0] UNIT dst=1 spec={G0: 2.5}", "integers"),
        ("LOAD_FACTOR dst=1 args={'factor_id': 0}", "expected `[i] OPNAME"),
        ("[1] LOAD_FACTOR dst=1 args={'factor_id': 0}", "index [1] where [0]"),
    ],
)
def test_errors_name_the_line(line, reason):
    text = f"program p\n  # a comment line\n  {line}   # trailing comment\n"
    with pytest.raises(ListingError) as info:
        parse_program(text)
    assert isinstance(info.value, ProgramValueError)
    assert "line 3" in str(info.value) and "'p'" in str(info.value)
    assert reason in str(info.value)


def test_unknown_opcode_keeps_its_type():
    with pytest.raises(UnknownOpcodeError, match="line 2"):
        parse_program("program p\n[0] FROBNICATE dst=1")


def test_lost_line_is_caught():
    text = format_program(parse_program(EXAMPLE.split("\n\nprogram finalize")[0]))
    lines = text.splitlines()
    del lines[4]
    with pytest.raises(ListingError, match=r"line 5: index \[4\] where \[3\]"):
        parse_program("\n".join(lines))


def test_parse_program_wants_exactly_one():
    with pytest.raises(ListingError, match="line 15: a second program"):
        parse_program(EXAMPLE)
    with pytest.raises(ListingError, match="no program"):
        parse_program("# nothing here\n\n")
    assert parse_programs("") == []
