"""Well-formedness of a linked list of programs (CatBP's IR specification; docs/ir.md), checked up front.

Registers live per program (each program runs on fresh registers, as `run_program` does);
slots live across the list. Every value's TensorSpec is inferred where the input specs are
known, so alignment faults are found here rather than deep inside numpy or a kernel.
Each fault raises its own error type (see catbp_jit.errors) naming the program, the
instruction index, the operand and the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ..errors import (
    AlignmentError,
    CatbpError,
    DoubleDefinitionError,
    ProgramValueError,
    SpecError,
    UnknownInputError,
    UnknownRegisterFreeError,
    UnwrittenSlotError,
    UseBeforeDefinitionError,
)
from .adapt import adapt_programs, adapt_slot_key, adapt_spec
from .ops import Instruction, OpCode, Program, SlotKey
from .schema import TensorSpec, format_key

INT64_MAX = np.iinfo(np.int64).max
DEFAULT_MAX_BYTES = 1 << 34  # 16 GiB for one tensor: far beyond any sane program here


@dataclass
class ValidatedPrograms:
    programs: list[Program]
    # value_specs[p][i]: the spec of the value instruction i of program p defines (its dst,
    # or the src NORMALIZE rewrites), None where it defines none or an input spec is unknown.
    value_specs: list[list[TensorSpec | None]]
    slot_specs: dict[SlotKey, TensorSpec | None]  # every slot after the last program


def check_spec(
    spec: TensorSpec, *, itemsize: int = 8, max_bytes: int = DEFAULT_MAX_BYTES, what: str = "spec"
) -> None:
    """Sizes positive, no axis twice, element count within int64 and the byte limit."""
    seen = set()
    count = 1
    for ax in spec.axes:
        if ax.size <= 0:
            raise SpecError(f"{what} {spec}: axis {format_key(ax.key)} has size {ax.size} (must be positive)")
        if ax.key in seen:
            raise SpecError(f"{what} {spec}: axis {format_key(ax.key)} appears twice")
        seen.add(ax.key)
        count *= ax.size  # Python ints: no overflow while we check
    if count > INT64_MAX:
        raise SpecError(f"{what} {spec}: {count} elements overflow int64")
    if count * itemsize > max_bytes:
        raise SpecError(f"{what} {spec}: {count * itemsize} bytes exceed the limit of {max_bytes}")


def check_alignment(in_spec: TensorSpec, out_spec: TensorSpec) -> None:
    """The reference's alignment rules, on specs: extra axes singleton, shared sizes equal."""
    out_pos = out_spec.axis_pos()
    for ax in in_spec.axes:
        if ax.key not in out_pos:
            if ax.size != 1:
                raise AlignmentError(
                    f"input axis {format_key(ax.key)} (size {ax.size}) is not in "
                    f"the output spec {out_spec} and is not a singleton"
                )
        elif out_spec.axes[out_pos[ax.key]].size != ax.size:
            said = out_spec.axes[out_pos[ax.key]].size
            raise AlignmentError(
                f"size mismatch for axis {format_key(ax.key)}: input has "
                f"{ax.size}, output spec {out_spec} says {said}"
            )


def eliminate_spec(in_spec: TensorSpec, ins: Instruction) -> TensorSpec:
    keep = ins.args.get("keep_keys")
    if keep is None:
        drop = set(ins.args.get("drop", ()))
        keep = tuple(ax.key for ax in in_spec.axes if ax.id not in drop)
    present = [k for k in keep if in_spec.has_key(k)]
    if len(set(present)) != len(present):
        raise ProgramValueError(f"keep_keys {tuple(format_key(k) for k in keep)} repeat an axis")
    return in_spec.subset(present)


class _Unknown:
    """Marker for a defined register whose spec is not known (no input specs given)."""


UNKNOWN = _Unknown()


def validate_programs(
    programs: Any,
    *,
    factor_specs: Mapping[int, Any] | None = None,
    selector_specs: Mapping[int, Any] | None = None,
    slot_specs: Mapping[Any, Any] | None = None,
    itemsize: int = 8,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ValidatedPrograms:
    """Adapt and check a linked list of programs; return them with every value's spec.

    factor_specs / selector_specs: when given, every LOAD_* must name a known id. When None,
    loads are accepted and the specs downstream of them are unknown (checked at run time).
    slot_specs: slots that exist before the first program (the `slots=` of run_program).
    """
    return check_programs(
        adapt_programs(programs),
        factor_specs=factor_specs,
        selector_specs=selector_specs,
        slot_specs=slot_specs,
        itemsize=itemsize,
        max_bytes=max_bytes,
    )


def check_programs(
    progs: list[Program],
    *,
    factor_specs: Mapping[int, Any] | None = None,
    selector_specs: Mapping[int, Any] | None = None,
    slot_specs: Mapping[Any, Any] | None = None,
    itemsize: int = 8,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> ValidatedPrograms:
    """validate_programs for programs adapt_programs made (compile() has adapted them
    already: a second pass over a long program costs seconds)."""
    fspecs = None if factor_specs is None else {int(k): adapt_spec(v) for k, v in factor_specs.items()}
    sspecs = None if selector_specs is None else {int(k): adapt_spec(v) for k, v in selector_specs.items()}
    slots: dict[SlotKey, Any] = {}
    for k, v in (slot_specs or {}).items():
        slots[adapt_slot_key(k)] = UNKNOWN if v is None else adapt_spec(v)
    limits = dict(itemsize=itemsize, max_bytes=max_bytes)
    for table, kind in ((fspecs, "factor"), (sspecs, "selector")):
        for ident, spec in (table or {}).items():
            try:
                if spec is None:  # (check_spec would fail on it with an AttributeError)
                    raise SpecError(f"{kind} {ident} has no spec (None)")
                check_spec(spec, what=f"{kind} {ident}", **limits)
            except CatbpError as e:
                raise type(e)(e.reason, operand=f"{kind} {ident}") from None

    all_specs = []
    for prog in progs:
        specs = []
        checker = _ProgramChecker(prog, fspecs, sspecs, slots, limits)
        for index, ins in enumerate(prog.instructions):
            try:
                spec = checker.step(index, ins)
            except CatbpError as e:
                raise type(e)(
                    e.reason, program=prog.name, index=index, op=ins.op.name, operand=e.operand
                ) from None
            specs.append(None if spec is UNKNOWN else spec)
        all_specs.append(specs)
    return ValidatedPrograms(progs, all_specs, {k: (None if v is UNKNOWN else v) for k, v in slots.items()})


class _ProgramChecker:
    """Walks one program, tracking live registers (id -> spec) and where each was freed."""

    def __init__(self, prog: Program, fspecs, sspecs, slots, limits):
        self.prog = prog
        self.fspecs, self.sspecs, self.slots, self.limits = fspecs, sspecs, slots, limits
        self.live: dict[int, Any] = {}
        self.defined_at: dict[int, int] = {}
        self.freed_at: dict[int, int] = {}

    def read(self, rid: int, operand: str):
        if rid in self.live:
            return self.live[rid]
        if rid in self.freed_at:
            reason = f"register r{rid} is used after FREE at [{self.freed_at[rid]}]"
        else:
            reason = f"register r{rid} is used before it is defined"
        raise UseBeforeDefinitionError(reason, operand=operand)

    def define(self, index: int, rid: int, spec) -> None:
        if rid in self.defined_at:
            raise DoubleDefinitionError(
                f"register r{rid} is defined twice (first at [{self.defined_at[rid]}]); "
                "registers are single-assignment",
                operand="dst",
            )
        self.defined_at[rid] = index
        self.live[rid] = spec

    def load(self, table, ident: int, kind: str):
        if table is None:
            return UNKNOWN
        if ident not in table:
            raise UnknownInputError(
                f"no {kind} with id {ident} (known: {sorted(table)[:20]})", operand=f"{kind}_id"
            )
        return table[ident]

    def step(self, index: int, ins: Instruction):
        op, args = ins.op, ins.args
        # adapt_instruction gave every op that defines a register its dst, and UNIT its spec
        dst = cast(int, ins.dst)
        if op == OpCode.UNIT:
            unit_spec = cast(TensorSpec, ins.spec)
            check_spec(unit_spec, what="UNIT spec", **self.limits)
            self.define(index, dst, unit_spec)
            return unit_spec
        if op == OpCode.LOAD_FACTOR:
            spec = self.load(self.fspecs, args["factor_id"], "factor")
            self.define(index, dst, spec)
            return spec
        if op == OpCode.LOAD_SELECTOR:
            spec = self.load(self.sspecs, args["selector_id"], "selector")
            self.define(index, dst, spec)
            return spec
        if op == OpCode.LOAD_SLOT:
            key = args["slot"]
            if key not in self.slots:
                raise UnwrittenSlotError(
                    f"slot {key!r} is read before any STORE_SLOT wrote it", operand="slot"
                )
            self.define(index, dst, self.slots[key])
            return self.slots[key]
        if op == OpCode.STORE_SLOT:
            key, spec = args["slot"], self.read(args["src"], "src")
            old = self.slots.get(key, UNKNOWN)
            if spec is not UNKNOWN and old is not UNKNOWN and old != spec:
                raise ProgramValueError(
                    f"slot {key!r} was written with spec {old}, now {spec}: "
                    "a slot's spec is fixed at its first write",
                    operand="slot",
                )
            self.slots[key] = spec
            return None
        if op == OpCode.CONTRACT:
            out_spec = args["out_spec"]
            check_spec(out_spec, what="out_spec", **self.limits)
            for i, rid in enumerate(args["inputs"]):
                in_spec = self.read(rid, f"inputs[{i}]")
                if in_spec is not UNKNOWN:
                    try:
                        check_alignment(in_spec, out_spec)
                    except AlignmentError as e:
                        raise AlignmentError(f"r{rid}: {e.reason}", operand=f"inputs[{i}]") from None
            self.define(index, dst, out_spec)
            return out_spec
        if op == OpCode.ELIMINATE:
            in_spec = self.read(args["src"], "src")
            spec = UNKNOWN if in_spec is UNKNOWN else eliminate_spec(in_spec, ins)
            self.define(index, dst, spec)
            return spec
        if op == OpCode.NORMALIZE:
            return self.read(args["src"], "src")  # rewrites src in place: same spec
        if op == OpCode.FREE:
            for i, rid in enumerate(args["srcs"]):
                if rid not in self.live:
                    why = (
                        f"already freed at [{self.freed_at[rid]}]"
                        if rid in self.freed_at
                        else "never defined"
                    )
                    raise UnknownRegisterFreeError(f"FREE of register r{rid}, {why}", operand=f"srcs[{i}]")
                del self.live[rid]
                self.freed_at[rid] = index
            return None
        raise ProgramValueError(f"no validation rule for {op.name}")  # unreachable: adapt checked
