"""Opcodes, instructions and programs (CatBP's IR specification; docs/ir.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, Optional, Tuple

from .schema import TensorSpec

RegID = int
SlotKey = Tuple[Any, ...]


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
class Instruction:
    op: OpCode
    dst: Optional[RegID]
    args: Dict[str, Any] = field(default_factory=dict)
    spec: Optional[TensorSpec] = None

    def __str__(self) -> str:
        from .text import format_instruction

        return format_instruction(self)


@dataclass(frozen=True)
class Program:
    instructions: Tuple[Instruction, ...]
    name: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.instructions, tuple):
            object.__setattr__(self, "instructions", tuple(self.instructions))

    def __len__(self) -> int:
        return len(self.instructions)

    def __str__(self) -> str:
        from .text import format_program

        return format_program(self)
