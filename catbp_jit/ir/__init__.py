"""The CatBP IR: axes, specs, instructions, programs, and the passes that read them."""

from .adapt import (
    adapt_axis,
    adapt_axis_type,
    adapt_instruction,
    adapt_key,
    adapt_opcode,
    adapt_program,
    adapt_programs,
    adapt_slot_key,
    adapt_spec,
)
from .ops import Instruction, OpCode, Program, RegID, SlotKey
from .schema import Axis, AxisKey, AxisType, TensorSpec, element_count, format_key, format_spec

__all__ = [
    "Axis",
    "AxisKey",
    "AxisType",
    "Instruction",
    "OpCode",
    "Program",
    "RegID",
    "SlotKey",
    "TensorSpec",
    "adapt_axis",
    "element_count",
    "adapt_axis_type",
    "adapt_instruction",
    "adapt_key",
    "adapt_opcode",
    "adapt_program",
    "adapt_programs",
    "adapt_slot_key",
    "adapt_spec",
    "format_key",
    "format_spec",
]
