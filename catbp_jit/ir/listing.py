"""The printed form of programs: one line per instruction, that ir/text.py reads back.

    program upward
      [0] LOAD_FACTOR dst=1 args={'factor_id': 0}
      [1] ELIMINATE dst=2 args={'src': 1, 'keep_keys': (G0, T9)}

Here and not in text.py so that `str(program)` (ops.py) needs no parser, and the parser's
imports (adapt.py, which builds programs) do not come back to ops.py.
"""

from __future__ import annotations

import numbers
import re
from typing import TYPE_CHECKING, Any

from .opcodes import OpCode
from .schema import AxisType, TensorSpec, format_key, format_spec

if TYPE_CHECKING:  # for annotations only
    from .ops import Instruction, Program


def is_axis_key(v: Any) -> bool:
    return (
        isinstance(v, tuple)
        and len(v) == 2
        and isinstance(v[0], AxisType)
        and isinstance(v[1], int)
        and not isinstance(v[1], bool)
    )


def _format_key(key) -> str:
    # `G-1` would read back as a subtraction: negative ids keep the long spelling.
    return format_key(key) if key[1] >= 0 else f"({key[0].name}, {key[1]})"


def format_value(v: Any) -> str:
    """A Python-literal-like spelling of an argument value that `_evaluate` reads back."""
    if isinstance(v, TensorSpec):
        if all(ax.id >= 0 for ax in v.axes):
            return format_spec(v)
        return "{" + ", ".join(f"{_format_key(ax.key)}: {ax.size}" for ax in v.axes) + "}"
    if is_axis_key(v):
        return _format_key(v)
    if isinstance(v, AxisType):
        return v.name
    if isinstance(v, tuple):
        return f"({format_value(v[0])},)" if len(v) == 1 else "(" + ", ".join(map(format_value, v)) + ")"
    if isinstance(v, list):
        return "[" + ", ".join(map(format_value, v)) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{format_value(k)}: {format_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return str(int(v))  # numpy ints print as plain ints
    if isinstance(v, numbers.Real) and not isinstance(v, bool):
        return repr(float(v))
    return repr(v)  # str, bool, None (anything else prints, but does not read back)


def format_instruction(ins: Instruction, index: int | None = None) -> str:
    parts = [] if index is None else [f"[{index}]"]
    parts.append(ins.op.name)
    if ins.dst is not None:
        parts.append(f"dst={format_value(ins.dst)}")
    if ins.args:
        parts.append(f"args={format_value(dict(ins.args))}")
    # A canonical CONTRACT has spec == args['out_spec']: print it once, inside args.
    if ins.spec is not None and not (ins.op == OpCode.CONTRACT and ins.spec == ins.args.get("out_spec")):
        parts.append(f"spec={format_value(ins.spec)}")
    return " ".join(parts)


def format_program(program: Program) -> str:
    name = program.name
    if name is None:
        header = "program"
    else:
        bare = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name)
        header = f"program {name if bare else repr(name)}"
    return "\n".join(
        [header] + [f"  {format_instruction(ins, i)}" for i, ins in enumerate(program.instructions)]
    )


def format_programs(programs) -> str:
    return "\n\n".join(format_program(p) for p in programs)
