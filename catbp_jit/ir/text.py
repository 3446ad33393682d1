"""The parser that reads program listings (ir/listing.py prints them) back into programs.

The parser never calls eval: each field value goes through `ast.parse` and a small
evaluator that knows only literals, axis-key names and TensorSpec dicts, so a listing is
data. For a canonical program p, `parse_program(format_program(p)) == p`.
"""

from __future__ import annotations

import ast
import functools
import io
import math
import re
import tokenize
from types import SimpleNamespace
from typing import Any

from ..errors import ProgramValueError
from .adapt import adapt_instruction
from .listing import format_instruction, format_program, format_programs, format_value, is_axis_key  # noqa: F401 (re-exported)
from .ops import Program
from .schema import Axis, AxisType, TensorSpec


class ListingError(ProgramValueError):
    """A listing that cannot be read back into programs; the reason starts with `line N:`."""


@functools.cache
def _listing_error(cls: type) -> type:
    """An adapt error's own type with ListingError mixed in, so either `except` catches it."""
    if cls is ProgramValueError or issubclass(cls, ListingError):
        return ListingError if cls is ProgramValueError else cls
    return type(cls.__name__, (ListingError, cls), {"__module__": __name__})


# ----------------------------------------------------------------------------- parsing

_KEY_NAME = re.compile(r"([GT])([0-9]+)")
_NAMES = {
    "GEOMETRIC": AxisType.GEOMETRIC,
    "TOPOLOGICAL": AxisType.TOPOLOGICAL,
    "inf": math.inf,
    "nan": math.nan,
}
_FIELDS = ("dst", "args", "spec")


def _evaluate(node: ast.AST) -> Any:
    """The value of a literal expression; anything else is a ValueError saying what."""
    if isinstance(node, ast.Constant) and (node.value is None or type(node.value) in (bool, int, float, str)):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_evaluate(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [_evaluate(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return _evaluate_dict(node)
    if isinstance(node, ast.Name):
        m = _KEY_NAME.fullmatch(node.id)
        if m:
            return (AxisType.GEOMETRIC if m[1] == "G" else AxisType.TOPOLOGICAL, int(m[2]))
        if node.id in _NAMES:
            return _NAMES[node.id]
        raise ValueError(f"unknown name {node.id!r}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _evaluate(node.operand)
        if type(v) in (int, float):
            return -v
        raise ValueError(f"cannot negate {v!r}")
    what = repr(node.value) if isinstance(node, ast.Constant) else type(node).__name__
    raise ValueError(f"{what} is not allowed in a listing (literals only)")


def _evaluate_dict(node: ast.Dict) -> Any:
    """A dict keyed by axis keys is a TensorSpec (`{G0: 2}`); any other dict is a dict."""
    if any(k is None for k in node.keys):
        raise ValueError("** is not allowed in a listing")
    keys = [_evaluate(k) for k in node.keys if k is not None]  # all of them (checked above)
    values = [_evaluate(v) for v in node.values]
    if keys and all(is_axis_key(k) for k in keys):
        if not all(type(s) is int for s in values):
            raise ValueError("the sizes of a TensorSpec {KEY: size, ...} must be integers")
        return TensorSpec(tuple(Axis(k[1], k[0], s) for k, s in zip(keys, values)))
    if any(is_axis_key(k) for k in keys):
        raise ValueError("a dict mixes axis keys with other keys")
    out = {}
    for k, v in zip(keys, values):
        try:
            if k in out:
                raise ValueError(f"duplicate key {format_value(k)}")
        except TypeError:
            raise ValueError(f"unhashable dict key {format_value(k)}") from None
        out[k] = v
    return out


def _parse_value(text: str) -> Any:
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError) as e:
        raise ValueError(f"bad syntax in {text.strip()!r}: {getattr(e, 'msg', e)}") from None
    return _evaluate(tree.body)


def _tokens(line: str) -> list[tokenize.TokenInfo]:
    """The tokens of one line, without comments; a line that does not tokenize is an error."""
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        raise ValueError(f"unbalanced brackets or unterminated string ({e.args[0]})") from None
    skip = (
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.ENDMARKER,
        tokenize.INDENT,
        tokenize.DEDENT,
    )
    for t in toks:
        if t.type == tokenize.ERRORTOKEN and not t.string.isspace():
            what = "unterminated string" if t.string[0] in "'\"" else f"unexpected {t.string!r}"
            raise ValueError(f"{what} at column {t.start[1] + 1}")
    return [t for t in toks if t.type not in skip and t.type != tokenize.ERRORTOKEN]


def _split_fields(line: str, toks) -> dict:
    """`dst=1 args={...}` -> {'dst': '1', 'args': '{...}'}: a top-level NAME '=' opens a field."""
    starts: list[tuple[str, int, int]] = []  # (field, where its name starts, where its value starts)
    depth = 0
    for i, t in enumerate(toks):
        if depth == 0 and t.type == tokenize.NAME and i + 1 < len(toks) and toks[i + 1].string == "=":
            if t.string not in _FIELDS:
                raise ValueError(f"unknown field {t.string}= (expected dst=, args=, spec=)")
            if any(f == t.string for f, _, _ in starts):
                raise ValueError(f"field {t.string}= given twice")
            starts.append((t.string, t.start[1], toks[i + 1].end[1]))
        elif not starts:
            raise ValueError(f"unexpected {t.string!r} before dst=, args= or spec=")
        elif t.type == tokenize.OP and t.string in ("(", "[", "{"):
            depth += 1
        elif t.type == tokenize.OP and t.string in (")", "]", "}"):
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {t.string!r} at column {t.start[1] + 1}")
    ends = [s for _, s, _ in starts[1:]] + [toks[-1].end[1] if toks else 0]
    fields = {}
    for (name, _, begin), end in zip(starts, ends):
        if not line[begin:end].strip():
            raise ValueError(f"{name}= has no value")
        fields[name] = line[begin:end]
    return fields


def _parse_instruction(line: str, toks, expected: int) -> tuple[int, str, SimpleNamespace]:
    """`[i] OPNAME fields...` -> (i, OPNAME, raw instruction for adapt_instruction)."""
    if not (
        len(toks) >= 4
        and toks[0].string == "["
        and toks[1].type == tokenize.NUMBER
        and toks[1].string.isdigit()
        and toks[2].string == "]"
        and toks[3].type == tokenize.NAME
    ):
        raise ValueError("expected `[i] OPNAME dst=.. args=.. spec=..` or `program NAME`")
    index, op = int(toks[1].string), toks[3].string
    if index != expected:
        raise ValueError(
            f"index [{index}] where [{expected}] was expected (a line lost, repeated or out of order?)"
        )
    values = {k: _parse_value(v) for k, v in _split_fields(line, toks[4:]).items()}
    args = values.get("args", {})
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise ValueError("args= must be a dict with string keys")
    spec = values.get("spec")
    if isinstance(args.get("out_spec"), dict) and not args["out_spec"]:
        args["out_spec"] = TensorSpec(())  # `{}` in a spec position is the empty spec
    if isinstance(spec, dict) and not spec:
        spec = TensorSpec(())
    return index, op, SimpleNamespace(op=op, dst=values.get("dst"), args=args, spec=spec)


def _header_name(line: str, toks) -> str | None:
    """`program` -> None, `program upward` -> 'upward', `program 'a b'` -> 'a b'."""
    if len(toks) == 1:
        return None
    if toks[1].type == tokenize.STRING:
        name = _parse_value(line[toks[1].start[1] : toks[-1].end[1]])
        if not isinstance(name, str):
            raise ValueError("a quoted program name must be one string")
        return name
    return line[toks[1].start[1] : toks[-1].end[1]]


def _parse(text: str) -> list[tuple[int, Program]]:
    """(first line, program) pairs. Instructions before any header form an unnamed program."""
    found: list[tuple[int, str | None, list]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        name = found[-1][1] if found else None
        index = op = None
        try:
            toks = _tokens(line)
            if not toks:
                continue
            if toks[0].type == tokenize.NAME and toks[0].string == "program":
                name = None  # an error here is no part of the program before
                found.append((lineno, _header_name(line, toks), []))
                continue
            if not found:
                found.append((lineno, None, []))
            instrs = found[-1][2]
            index, op, raw = _parse_instruction(line, toks, len(instrs))
            instrs.append(adapt_instruction(raw))
        except ProgramValueError as e:  # from adapt_instruction: keep its type, add the place
            cls: type = type(e)  # as `type`: mypy finds type[ProgramValueError] not Hashable
            raise _listing_error(cls)(
                f"line {lineno}: {e.reason}", program=name, index=index, op=op
            ) from None
        except (ValueError, TypeError) as e:  # ours, or adapt's on a badly shaped value
            raise ListingError(f"line {lineno}: {e}", program=name, index=index, op=op) from None
    return [(lineno, Program(tuple(instrs), name)) for lineno, name, instrs in found]


def parse_programs(text: str) -> list[Program]:
    return [p for _, p in _parse(text)]


def parse_program(text: str) -> Program:
    found = _parse(text)
    if len(found) != 1:
        where = (
            f"line {found[1][0]}: a second program starts here"
            if found
            else "line 1: the listing holds no program"
        )
        raise ListingError(f"{where}; expected exactly one program")
    return found[0][1]
