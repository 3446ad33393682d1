"""Opcodes, instructions and programs (CatBP's IR specification; docs/ir.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .listing import format_instruction, format_program
from .opcodes import OpCode
from .schema import TensorSpec

RegID = int
SlotKey = Tuple[Any, ...]


@dataclass(frozen=True)
class Instruction:
    op: OpCode
    dst: Optional[RegID]
    args: Dict[str, Any] = field(default_factory=dict)
    spec: Optional[TensorSpec] = None

    def __str__(self) -> str:
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
        return format_program(self)
