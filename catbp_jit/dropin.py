"""Drop-in replacements for CatBP's `VirtualMachine` and `run_program`, on the JIT.

Same signatures, same results as the reference. Each call reads the inputs' specs from the
providers, finds (or compiles, once) an executable for that program structure and those
specs in an in-memory cache, copies the inputs in and runs it, so a CatBP user's repeated
`run_program` calls compile once. Results are copies (a Session's views would be
overwritten by its next run); slots handed in and not rewritten come back as given.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .compiler import compile
from .executable import Executable
from .ir.adapt import adapt_program, adapt_spec
from .ir.ops import OpCode, Program
from .plan.pipeline import RESULT, SLOT_INPUT
from .reference.vm import SlotStore, adapt_slots
from .semiring import VMSemiringRuntime, adapt_semiring

if TYPE_CHECKING:
    from .session import Session

Provider = Callable[[int], tuple[np.ndarray, Any]]
MAX_EXECUTABLES = 64

# (executable, its session, untouched_slots(executable))
_executables: OrderedDict[tuple, tuple[Executable, Session, frozenset]] = OrderedDict()
_programs: dict[bytes, _Shape] = {}  # program fingerprint -> what run_program needs


@dataclass(frozen=True)
class _Shape:
    """What run_program needs to know of a program, worked out once per program object."""

    program: Program  # canonical
    digest: str  # of its structure
    factor_ids: tuple[int, ...]
    selector_ids: tuple[int, ...]
    slots_read: frozenset


def _fingerprint(program: Any) -> bytes | None:
    """A digest of the program's whole content, recomputed per call: a program mutated in
    place between calls (an instruction's args, a replaced instruction) gets a new one,
    where id(program) would return the old program's executable. pickle walks the
    objects in C (several times faster than adapting them); nothing is ever unpickled.
    None for a program that cannot be pickled (then nothing is cached for it)."""
    try:
        content = (getattr(program, "name", None), getattr(program, "instructions", program))
        data = pickle.dumps(content, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # foreign objects pickle cannot reach (lambdas, locals)
        return None
    return hashlib.blake2b(data, digest_size=32).digest()


def _shape(program: Any) -> _Shape:
    fingerprint = _fingerprint(program)
    hit = _programs.get(fingerprint) if fingerprint is not None else None
    if hit is not None:
        return hit
    from .bundle import program_to_json

    prog = adapt_program(program)
    digest = hashlib.sha256(json.dumps(program_to_json(prog)["instructions"]).encode()).hexdigest()

    def ids(op: OpCode, arg: str) -> tuple[int, ...]:
        return tuple(sorted({ins.args[arg] for ins in prog.instructions if ins.op == op}))

    shape = _Shape(
        prog,
        digest,
        ids(OpCode.LOAD_FACTOR, "factor_id"),
        ids(OpCode.LOAD_SELECTOR, "selector_id"),
        frozenset(ins.args["slot"] for ins in prog.instructions if ins.op == OpCode.LOAD_SLOT),
    )
    if fingerprint is not None:
        if len(_programs) > 4 * MAX_EXECUTABLES:
            _programs.clear()
        _programs[fingerprint] = shape
    return shape


def run_program(
    program: Any,
    sr: Any,
    factor_provider: Provider,
    selector_provider: Provider,
    *,
    slots: dict[Any, tuple[np.ndarray, Any]] | None = None,
    target: str = "cpu",
    mode: str = "compiled",
) -> dict[tuple, tuple[np.ndarray, Any]]:
    """CatBP's run_program on the JIT: a dict slot key -> (array, spec), as the reference."""
    sr = adapt_semiring(sr)
    shape = _shape(program)
    prog = shape.program
    factors = {fid: _input(factor_provider(fid), sr) for fid in shape.factor_ids}
    selectors = {sid: _input(selector_provider(sid), sr) for sid in shape.selector_ids}
    given = adapt_slots(slots)
    slot_in = {
        k: (np.asarray(a).astype(sr.dtype, copy=False), s)
        for k, (a, s) in given.items()
        if k in shape.slots_read
    }

    key = (
        shape.digest,
        sr.name,
        sr.dtype.str,
        target,
        mode,
        tuple((f, s) for f, (_, s) in factors.items()),
        tuple((i, s) for i, (_, s) in selectors.items()),
        tuple((k, s) for k, (_, s) in slot_in.items()),
    )
    entry = _executables.get(key)
    if entry is None:
        exe = cast(
            Executable,
            compile(  # (no batched inputs: not a BatchedExecutable)
                prog,
                sr,
                factor_specs={f: s for f, (_, s) in factors.items()},
                selector_specs={i: s for i, (_, s) in selectors.items()},
                slot_specs={k: s for k, (_, s) in slot_in.items()},
                target=target,
                mode=mode,
            ),
        )
        entry = (exe, exe.bind(), untouched_slots(exe))
        _executables[key] = entry
        while len(_executables) > MAX_EXECUTABLES:
            _executables.popitem(last=False)
    else:
        _executables.move_to_end(key)
    exe, session, untouched = entry
    out = session.run(
        factors={f: a for f, (a, _) in factors.items()},
        selectors={i: a for i, (a, _) in selectors.items()},
        slots={k: a for k, (a, _) in slot_in.items()},
    )
    result = dict(given)
    for k, (view, spec) in out.items():
        if k not in untouched:  # (untouched: the caller's own array, as the reference does)
            result[k] = (view.copy(), spec)
    return result


def untouched_slots(exe: Executable) -> frozenset:
    """Slots a program hands back as they were handed in: results stored in the region of
    their own slot input."""
    handed_in = {(b.ident, b.offset) for b in exe.plan.bound(SLOT_INPUT)}
    return frozenset(b.ident for b in exe.plan.bound(RESULT) if (b.ident, b.offset) in handed_in)


def _input(pair: tuple[np.ndarray, Any], sr: VMSemiringRuntime) -> tuple[np.ndarray, Any]:
    arr, spec = pair
    return np.asarray(arr).astype(sr.dtype, copy=False), adapt_spec(spec)


class VirtualMachine:
    """CatBP's VirtualMachine on the JIT: `run` one program at a time; `vm.slots.data`."""

    def __init__(self, sr: Any, target: str = "cpu", mode: str = "compiled") -> None:
        self.sr = adapt_semiring(sr)
        self.target, self.mode = target, mode
        self.slots = SlotStore()

    def run(self, program: Any, factor_provider: Provider, selector_provider: Provider) -> None:
        self.slots.data = run_program(
            program,
            self.sr,
            factor_provider,
            selector_provider,
            slots=self.slots.data,
            target=self.target,
            mode=self.mode,
        )


def clear_cache() -> None:
    """Forget every executable compiled by run_program (the disk cache is kept)."""
    _executables.clear()
    _programs.clear()
