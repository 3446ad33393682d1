"""Look-alikes of CatBP's own IR classes, for drop-in tests.

They are separate classes and enums (so identity never matches ours), and they use the
other argument spellings the CatBP VM accepts, so adapting them exercises every path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from catbp_jit.ir import OpCode as OurOpCode


class AxisType(Enum):
    GEOMETRIC = 1
    TOPOLOGICAL = 2


class OpCode(Enum):
    UNIT = 1
    LOAD_FACTOR = 2
    LOAD_SELECTOR = 3
    LOAD_SLOT = 4
    STORE_SLOT = 5
    CONTRACT = 6
    ELIMINATE = 7
    NORMALIZE = 8
    FREE = 9


@dataclass(frozen=True)
class Axis:
    id: int
    kind: AxisType
    size: int

    @property
    def key(self):
        return (self.kind, self.id)


@dataclass(frozen=True)
class TensorSpec:
    axes: tuple[Axis, ...]


@dataclass(frozen=True)
class Instruction:
    op: OpCode
    dst: int | None
    args: dict[str, Any] = field(default_factory=dict)
    spec: TensorSpec | None = None


@dataclass(frozen=True)
class Program:
    instructions: tuple[Instruction, ...]


@dataclass(frozen=True)
class SemiringRuntime:  # only what an adapter may read
    name: str
    dtype: np.dtype


def spec(ours) -> TensorSpec | None:
    if ours is None:
        return None
    return TensorSpec(tuple(Axis(a.id, AxisType[a.kind.name], a.size) for a in ours.axes))


def key(k):
    return (AxisType[k[0].name], k[1])


def instruction(ins, variant: int) -> Instruction:
    """Our instruction in CatBP's classes; `variant` picks among the accepted spellings."""
    op, a = ins.op, dict(ins.args)
    alt = variant % 2 == 1
    if op == OurOpCode.LOAD_SELECTOR and alt:
        a["mode_axis_id"] = a.pop("selector_id")
    if op in (OurOpCode.LOAD_SLOT, OurOpCode.STORE_SLOT):
        slot = a.pop("slot")
        a["slot_key" if alt else "slot"] = list(slot) if variant % 3 == 0 else slot
    the_spec = spec(ins.spec)
    if op == OurOpCode.CONTRACT:
        # out_spec in args and spec / in args only / in spec only: all are accepted
        out_spec = spec(a.pop("out_spec"))
        a["inputs"] = list(a["inputs"]) if alt else a["inputs"]
        if variant % 3 != 2:
            a["out_spec"] = out_spec
        the_spec = None if variant % 3 == 1 else out_spec
    if op == OurOpCode.ELIMINATE and "keep_keys" in a:
        keys = tuple(key(k) for k in a.pop("keep_keys"))
        a["keep_axis_keys" if alt else "keep_keys"] = keys
    if op == OurOpCode.FREE:
        srcs = a.pop("srcs")
        if alt and len(srcs) == 1:
            a["src"] = srcs[0]
        else:
            a["srcs"] = srcs
    return Instruction(OpCode[op.name], ins.dst, a, the_spec)


def program(ours, variant: int = 0) -> Program:
    """A program in CatBP's classes, each instruction with a different mix of spellings."""
    return Program(tuple(instruction(ins, variant + i) for i, ins in enumerate(ours.instructions)))


def provider(table):
    """A provider returning CatBP-class specs, as a CatBP user's would."""
    return lambda ident: (table[ident][0], spec(table[ident][1]))
