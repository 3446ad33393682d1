"""Turn IR objects from anywhere (CatBP's own classes, JSON lists, ours) into ours.

Foreign objects are matched by attribute names and enum `.name`, never by identity, so a
user holding CatBP's classes passes them unchanged. Every argument spelling the CatBP VM
accepts is mapped to one canonical spelling:

    LOAD_SELECTOR  selector_id | mode_axis_id      -> selector_id
    LOAD/STORE_SLOT slot | slot_key                -> slot (a hashable tuple)
    CONTRACT       args["out_spec"] | ins.spec      -> both set, args["out_spec"] wins
    ELIMINATE      keep_keys | keep_axis_keys       -> keep_keys ((AxisType, id), ...)
                   drop (legacy axis ids)           -> kept as drop (needs the input spec)
    FREE           srcs | src (int or tuple)        -> srcs (tuple)
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import MissingArgumentError, ProgramValueError, SpecError, UnknownOpcodeError, shown
from .ops import Instruction, OpCode, Program
from .schema import Axis, AxisKey, AxisType, TensorSpec


def _name_of(x: Any) -> str | None:
    if isinstance(x, str):
        return x
    name = getattr(x, "name", None)
    return name if isinstance(name, str) else None


def adapt_axis_type(x: Any) -> AxisType:
    if isinstance(x, AxisType):
        return x
    name = _name_of(x)
    if name is not None and name.upper() in AxisType.__members__:
        return AxisType[name.upper()]
    if name is not None and name.upper() in ("G", "T"):
        return AxisType.GEOMETRIC if name.upper() == "G" else AxisType.TOPOLOGICAL
    raise SpecError(f"unknown axis kind {shown(x)} (expected GEOMETRIC or TOPOLOGICAL)")


def _integral(x: Any) -> int | None:
    """x as an int when it is an integer (numpy's too) and not a bool, else None."""
    if type(x) is int:  # the common case, without the slow ABC check below
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        return None
    return int(x)


def _as_int(x: Any, what: str) -> int:
    n = _integral(x)
    if n is None:
        raise SpecError(f"{what} must be an integer, got {shown(x)}")
    return n


def adapt_axis(x: Any) -> Axis:
    if isinstance(x, Axis):
        return x
    if isinstance(x, (tuple, list)) and len(x) == 3:  # the bundle's [KIND, id, size]
        kind, aid, size = x
    elif all(hasattr(x, a) for a in ("id", "kind", "size")):
        kind, aid, size = x.kind, x.id, x.size
    else:
        raise SpecError(f"cannot read an axis from {shown(x)}")
    return Axis(_as_int(aid, "axis id"), adapt_axis_type(kind), _as_int(size, "axis size"))


def adapt_spec(x: Any) -> TensorSpec | None:
    if x is None or isinstance(x, TensorSpec):
        return x
    axes = getattr(x, "axes", x)
    if isinstance(axes, (str, bytes)) or not isinstance(axes, Iterable):
        raise SpecError(f"cannot read a TensorSpec from {shown(x)}")
    return TensorSpec(tuple(adapt_axis(a) for a in axes))


def adapt_key(x: Any) -> AxisKey:
    if isinstance(x, (tuple, list)) and len(x) == 2:
        return (adapt_axis_type(x[0]), _as_int(x[1], "axis id"))
    key = getattr(x, "key", None)  # an Axis given where a key is expected
    if key is not None and not callable(key):
        return adapt_key(key)
    raise SpecError(f"cannot read an axis key (kind, id) from {shown(x)}")


def adapt_slot_key(x: Any) -> tuple:
    """Slot keys are compared by value: lists (from JSON) become tuples, numpy ints ints."""
    if isinstance(x, (list, tuple)):
        return tuple(adapt_slot_key(v) if isinstance(v, (list, tuple)) else _plain(v) for v in x)
    return (_plain(x),)


def _plain(v: Any) -> Any:
    if type(v) is int or type(v) is str:
        return v
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    return v


def adapt_opcode(x: Any) -> OpCode:
    if isinstance(x, OpCode):
        return x
    name = _name_of(x)
    if name is not None and name in OpCode.__members__:
        return OpCode[name]
    raise UnknownOpcodeError(f"unknown opcode {shown(x)} (known: {', '.join(OpCode.__members__)})")


def _reg(x: Any, what: str) -> int:
    n = _integral(x)
    if n is None:
        raise ProgramValueError(f"{what} must be a register id (int), got {shown(x)}")
    return n


def _regs(x: Any, what: str) -> tuple:
    if type(x) is tuple and all(type(r) is int for r in x):  # already canonical
        return x
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return (int(x),)
    if isinstance(x, (str, bytes)) or not isinstance(x, Iterable):
        raise ProgramValueError(f"{what} must be a tuple of register ids, got {shown(x)}")
    return tuple(_reg(r, what) for r in x)


def _require(args: dict, names: Sequence[str], what: str) -> Any:
    for n in names:
        if n in args:
            return args[n]
    spelled = " or ".join(repr(n) for n in names)
    raise MissingArgumentError(f"missing argument {spelled} ({what})")


def adapt_instruction(ins: Any) -> Instruction:
    """One instruction in canonical form. Errors carry no location; callers add it."""
    op = adapt_opcode(getattr(ins, "op", None))
    dst = getattr(ins, "dst", None)
    dst = None if dst is None else _reg(dst, "dst")
    raw = getattr(ins, "args", None)
    raw = dict(raw) if raw is not None else {}
    spec = adapt_spec(getattr(ins, "spec", None))
    args = dict(raw)

    if (
        op
        in (
            OpCode.UNIT,
            OpCode.LOAD_FACTOR,
            OpCode.LOAD_SELECTOR,
            OpCode.LOAD_SLOT,
            OpCode.CONTRACT,
            OpCode.ELIMINATE,
        )
        and dst is None
    ):
        raise MissingArgumentError(f"{op.name} needs a destination register (dst)")

    if op == OpCode.UNIT:
        if spec is None:
            raise MissingArgumentError("UNIT needs a spec (the shape of the unit tensor)")
    elif op == OpCode.LOAD_FACTOR:
        args["factor_id"] = _as_int(_require(raw, ("factor_id",), "the factor to load"), "factor_id")
    elif op == OpCode.LOAD_SELECTOR:
        sid = _require(raw, ("selector_id", "mode_axis_id"), "the selector to load")
        args.pop("mode_axis_id", None)
        args["selector_id"] = _as_int(sid, "selector_id")
    elif op in (OpCode.LOAD_SLOT, OpCode.STORE_SLOT):
        key = _require(raw, ("slot", "slot_key"), "the slot key")
        args.pop("slot_key", None)
        args["slot"] = adapt_slot_key(key)
        if op == OpCode.STORE_SLOT:
            args["src"] = _reg(_require(raw, ("src",), "the register to store"), "src")
    elif op == OpCode.CONTRACT:
        args["inputs"] = _regs(_require(raw, ("inputs",), "the registers to multiply"), "inputs")
        out_spec = adapt_spec(raw.get("out_spec")) if raw.get("out_spec") is not None else spec
        if out_spec is None:
            raise MissingArgumentError("CONTRACT needs args['out_spec'] or spec")
        args["out_spec"] = out_spec
        spec = out_spec
    elif op == OpCode.ELIMINATE:
        args["src"] = _reg(_require(raw, ("src",), "the register to reduce"), "src")
        if "keep_keys" in raw or "keep_axis_keys" in raw:
            keys = raw["keep_keys"] if "keep_keys" in raw else raw["keep_axis_keys"]
            args.pop("keep_axis_keys", None)
            args["keep_keys"] = tuple(adapt_key(k) for k in keys)
        elif "drop" in raw:
            args["drop"] = tuple(_as_int(i, "drop axis id") for i in raw["drop"])
        else:
            args["drop"] = ()  # the reference's legacy default: drop nothing
    elif op == OpCode.NORMALIZE:
        args["src"] = _reg(_require(raw, ("src",), "the register to normalize"), "src")
    elif op == OpCode.FREE:
        srcs = raw["srcs"] if "srcs" in raw else raw.get("src", ())
        args.pop("src", None)
        args["srcs"] = _regs(srcs, "srcs")
    return Instruction(op, dst, args, spec)


def adapt_program(p: Any, name: str | None = None) -> Program:
    """A Program from a Program-like object (`.instructions`) or a list of instructions."""
    if name is None:
        name = getattr(p, "name", None)
        name = name if isinstance(name, str) else None
    instrs = getattr(p, "instructions", p)
    out: list[Instruction] = []
    for i, ins in enumerate(instrs):
        try:
            out.append(adapt_instruction(ins))
        except ProgramValueError as e:
            op = getattr(getattr(ins, "op", None), "name", None)
            raise type(e)(e.reason, program=name, index=i, op=op) from None
    return Program(tuple(out), name)


def adapt_programs(programs: Any) -> list[Program]:
    """A list of programs; a single program is a list of one. Unnamed ones get p0, p1, ..."""
    if hasattr(programs, "instructions"):
        programs = [programs]
    out = []
    for i, p in enumerate(programs):
        name = getattr(p, "name", None)
        out.append(adapt_program(p, name if isinstance(name, str) else f"p{i}"))
    return out
