"""Opcodes, instructions and programs (CatBP's IR specification; docs/ir.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .listing import format_instruction, format_program
from .opcodes import OpCode
from .schema import TensorSpec

RegID = int
SlotKey = tuple[Any, ...]


@dataclass(frozen=True)
class Instruction:
    op: OpCode
    dst: RegID | None
    args: dict[str, Any] = field(default_factory=dict)
    spec: TensorSpec | None = None

    def __str__(self) -> str:
        return format_instruction(self)


@dataclass(frozen=True)
class Program:
    instructions: tuple[Instruction, ...]
    name: str | None = None

    def __post_init__(self):
        if not isinstance(self.instructions, tuple):
            object.__setattr__(self, "instructions", tuple(self.instructions))

    def __len__(self) -> int:
        return len(self.instructions)

    def __str__(self) -> str:
        return format_program(self)
