"""Errors that say where a program went wrong: program, instruction index, operand, reason.

Each keeps the exception type the CatBP reference raises for the same fault (ValueError
for an illegal alignment or a malformed instruction, KeyError for a missing slot or
register), so code written against CatBP catches them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

# Messages list names (variables, states, columns): a model can have 10^4 of them, and a
# name can be a megabyte long, but an error must stay a line a person reads.
LISTED_NAMES = 8
NAME_CHARS = 80
MESSAGE_CHARS = 1000  # the most an error's message shows, whatever it quotes


def clip(text: str, limit: int = NAME_CHARS) -> str:
    """`text` cut to its first `limit` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def bounded(message: str, limit: int = MESSAGE_CHARS) -> str:
    """`message` whole when short, else its start and its end (which often says what was
    expected): the last guard against a quoted piece of a file no other check clipped."""
    if len(message) <= limit:
        return message
    head, tail = message[: limit * 3 // 4], message[-(limit // 4) :]
    return f"{head} ...({len(message) - len(head) - len(tail):,} characters)... {tail}"


def one_line(text: str, limit: int = NAME_CHARS) -> str:
    """`text` (a piece of a file) clipped, its runs of white space made single spaces."""
    short = " ".join(text[:limit].split())
    return short if len(text) <= limit else f"{short}... ({len(text):,} characters)"


def shown(value: Any) -> str:
    """repr(value) clipped: a value read from a hostile file, as an error shows it."""
    return clip(repr(value))


def name_list(
    names: Iterable[Any], fmt: Callable[[Any], str] = str, sep: str = ", ", limit: int = LISTED_NAMES
) -> str:
    """The first `limit` names, each formatted by `fmt` and clipped, then how many more:
    "a, b, c, ... and 9,990 more". ASCII only: stderr may not take an ellipsis character."""
    names = list(names)
    text = sep.join(one_line(fmt(n)) for n in names[:limit])
    rest = len(names) - limit
    return text + (f"{sep}... and {rest:,} more" if rest > 0 else "")


class CatbpError(Exception):
    """Base of every catbp_jit error about a program or its inputs."""

    def __init__(
        self,
        reason: str,
        *,
        program: Any = None,
        index: int | None = None,
        op: str | None = None,
        operand: str | None = None,
    ):
        self.reason = reason
        self.program = program
        self.index = index
        self.op = op
        self.operand = operand
        super().__init__(self._message())

    def _message(self) -> str:
        where = []
        if self.program is not None:
            where.append(f"program {shown(self.program)}")
        if self.index is not None:
            where.append(f"instruction [{self.index}]" + (f" {self.op}" if self.op else ""))
        if self.operand:
            where.append(f"operand {self.operand}")
        return bounded((", ".join(where) + ": " if where else "") + self.reason)

    def __str__(self) -> str:  # KeyError would otherwise print the repr of the message
        return self._message()


class ProgramValueError(CatbpError, ValueError):
    """A malformed program (the reference would raise ValueError or fail later)."""


class ProgramKeyError(CatbpError, KeyError):
    """A read of something that does not exist (register, slot, factor, selector)."""


class UnknownOpcodeError(ProgramValueError):
    pass


class MissingArgumentError(ProgramValueError):
    pass


class AlignmentError(ProgramValueError):
    """An input cannot be aligned to an output spec (extra non-singleton axis, size mismatch)."""


class SpecError(ProgramValueError):
    """A TensorSpec that cannot describe a tensor (non-positive size, repeated axis, too big)."""


class UseBeforeDefinitionError(ProgramKeyError):
    pass


class DoubleDefinitionError(ProgramValueError):
    pass


class UnwrittenSlotError(ProgramKeyError):
    pass


class UnknownRegisterFreeError(ProgramKeyError):
    pass


class UnknownInputError(ProgramKeyError):
    """LOAD_FACTOR / LOAD_SELECTOR of an id with no spec or array."""


class InputMismatchError(ProgramValueError):
    """An input array whose shape or dtype does not match its declared spec."""


class CudaUnavailableError(CatbpError, RuntimeError):
    """target="cuda" asked for where it cannot run: numba-cuda missing, or no GPU."""


class CudaScheduleWarning(UserWarning):
    """target="cuda", mode "compiled": the schedule kernel (one launch per run) could not be
    built here, so each step is launched from Python: the same results, more slowly."""
