"""The reference virtual machine: CatBP's VM specification (docs/ir.md), numpy only.

This is the oracle every fast path is tested against, so it keeps the spec's semantics
exactly: registers and slots hold arrays by reference (LOAD_SLOT and STORE_SLOT share
arrays), NORMALIZE rebinds its register to a new array and never mutates a slot, FREE
drops registers, and loads cast to the semiring dtype without copying when they can.
The one addition: a fault is re-raised with the program, the instruction index and the
operand that caused it, keeping the exception type (KeyError, ValueError) of the spec.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

import numpy as np

from ..errors import (
    CatbpError,
    ProgramKeyError,
    ProgramValueError,
    UnwrittenSlotError,
    UseBeforeDefinitionError,
)
from ..ir.adapt import adapt_program, adapt_slot_key, adapt_spec
from ..ir.ops import Instruction, RegID, SlotKey
from ..ir.schema import TensorSpec
from ..semiring import VMSemiringRuntime, adapt_semiring
from .kernels import keep_keys_from_drop, vm_contract, vm_eliminate_keep, vm_unit

Provider = Callable[[int], tuple[np.ndarray, Any]]


class RegisterBank:
    def __init__(self) -> None:
        self.data: dict[RegID, np.ndarray] = {}
        self.spec: dict[RegID, TensorSpec] = {}
        self.next_id: int = 0

    def alloc(self, arr: np.ndarray, spec: TensorSpec) -> RegID:
        rid = self.next_id
        self.next_id += 1
        self.put(rid, arr, spec)
        return rid

    def put(self, rid: RegID, arr: np.ndarray, spec: TensorSpec) -> None:
        self.data[rid] = arr
        self.spec[rid] = spec

    def get(self, rid: RegID) -> tuple[np.ndarray, TensorSpec]:
        if rid not in self.data:
            raise UseBeforeDefinitionError(f"register r{rid} is not defined (never written, or freed)")
        return self.data[rid], self.spec[rid]

    def free(self, rid: RegID) -> None:
        self.data.pop(rid, None)
        self.spec.pop(rid, None)

    def has(self, rid: RegID) -> bool:
        return rid in self.data

    __contains__ = has

    def __len__(self) -> int:
        return len(self.data)


class SlotStore:
    def __init__(self, data: dict[SlotKey, tuple[np.ndarray, TensorSpec]] | None = None) -> None:
        self.data: dict[SlotKey, tuple[np.ndarray, TensorSpec]] = {} if data is None else data

    def set(self, key: SlotKey, arr: np.ndarray, spec: TensorSpec) -> None:
        self.data[key] = (arr, spec)

    def get(self, key: SlotKey) -> tuple[np.ndarray, TensorSpec]:
        if key not in self.data:
            raise UnwrittenSlotError(f"slot {key!r} not found (never stored)")
        return self.data[key]

    def has(self, key: SlotKey) -> bool:
        return key in self.data

    __contains__ = has


def _load(provider: Provider, ident: int, sr: VMSemiringRuntime) -> tuple[np.ndarray, TensorSpec]:
    arr, spec = provider(ident)
    return np.asarray(arr).astype(sr.dtype, copy=False), _given_spec(spec)


def _given_spec(spec: Any) -> TensorSpec:
    """The spec of a loaded input or a slot handed in, as ours. A provider (or slots=) must
    give one; a None given against that is kept, and fails where it is used, as in CatBP."""
    return cast(TensorSpec, adapt_spec(spec))


class VirtualMachine:
    def __init__(self, sr: Any) -> None:
        self.sr = adapt_semiring(sr)
        self.regs = RegisterBank()
        self.slots = SlotStore()

    def run(self, program: Any, factor_provider: Provider, selector_provider: Provider) -> None:
        prog = adapt_program(program)  # canonical spellings even for a hand-built Program
        for index, ins in enumerate(prog.instructions):
            try:
                self._execute(ins, factor_provider, selector_provider)
            except CatbpError as e:
                if e.index is not None:
                    raise
                raise type(e)(
                    e.reason, program=prog.name, index=index, op=ins.op.name, operand=e.operand
                ) from e
            except KeyError as e:
                what = repr(e.args[0]) if e.args else "(unnamed)"
                raise ProgramKeyError(
                    f"missing key {what}", program=prog.name, index=index, op=ins.op.name
                ) from e
            except ValueError as e:
                raise ProgramValueError(str(e), program=prog.name, index=index, op=ins.op.name) from e

    def _get(self, rid: RegID, operand: str) -> tuple[np.ndarray, TensorSpec]:
        try:
            return self.regs.get(rid)
        except CatbpError as e:
            e.operand = operand
            raise

    # One method per opcode, as in the spec's dispatch (§7.1).
    def _execute(self, ins: Instruction, fp: Provider, sp: Provider) -> None:
        getattr(self, "_op_" + ins.op.name.lower())(ins, fp, sp)

    def _op_unit(self, ins, fp, sp):
        self.regs.put(ins.dst, vm_unit(ins.spec, self.sr), ins.spec)

    def _op_load_factor(self, ins, fp, sp):
        self.regs.put(ins.dst, *_load(fp, ins.args["factor_id"], self.sr))

    def _op_load_selector(self, ins, fp, sp):
        self.regs.put(ins.dst, *_load(sp, ins.args["selector_id"], self.sr))

    def _op_load_slot(self, ins, fp, sp):
        arr, spec = self.slots.get(ins.args["slot"])
        self.regs.put(ins.dst, arr, spec)

    def _op_store_slot(self, ins, fp, sp):
        arr, spec = self._get(ins.args["src"], "src")
        self.slots.set(ins.args["slot"], arr, spec)

    def _op_contract(self, ins, fp, sp):
        inputs = [self._get(rid, f"inputs[{i}]") for i, rid in enumerate(ins.args["inputs"])]
        out_spec = ins.args["out_spec"]
        self.regs.put(ins.dst, vm_contract(inputs, out_spec, self.sr), out_spec)

    def _op_eliminate(self, ins, fp, sp):
        arr, in_spec = self._get(ins.args["src"], "src")
        keep = ins.args.get("keep_keys")
        if keep is None:
            keep = keep_keys_from_drop(in_spec, ins.args.get("drop", ()))
        out, out_spec = vm_eliminate_keep(arr, in_spec, keep, self.sr)
        self.regs.put(ins.dst, out, out_spec)

    def _op_normalize(self, ins, fp, sp):
        if self.sr.supports_normalize():
            src = ins.args["src"]
            arr, spec = self._get(src, "src")
            normalize = self.sr.normalize
            assert normalize is not None  # (what supports_normalize checks)
            self.regs.put(src, normalize(arr, None), spec)

    def _op_free(self, ins, fp, sp):
        for rid in ins.args.get("srcs", ()):
            self.regs.free(rid)


def adapt_slots(
    slots: dict[Any, tuple[np.ndarray, Any]] | None,
) -> dict[SlotKey, tuple[np.ndarray, TensorSpec]]:
    """Slots handed in by a user: keys as hashable tuples, specs as ours, arrays as given."""
    if not slots:
        return {}
    return {adapt_slot_key(k): (arr, _given_spec(spec)) for k, (arr, spec) in slots.items()}


def run_program(
    program: Any,
    sr: Any,
    factor_provider: Provider,
    selector_provider: Provider,
    *,
    slots: dict[Any, tuple[np.ndarray, Any]] | None = None,
) -> dict[SlotKey, tuple[np.ndarray, TensorSpec]]:
    """Run one program on a fresh VM whose slots start as `slots`; return all slots."""
    vm = VirtualMachine(sr)
    vm.slots.data.update(adapt_slots(slots))
    vm.run(program, factor_provider, selector_provider)
    return vm.slots.data


def run_programs(
    programs: Iterable[Any],
    sr: Any,
    factor_provider: Provider,
    selector_provider: Provider,
    *,
    slots: dict[Any, tuple[np.ndarray, Any]] | None = None,
) -> dict[SlotKey, tuple[np.ndarray, TensorSpec]]:
    """Run linked programs in order (upward, downward, finalize), slots carried over."""
    for p in programs:
        slots = run_program(p, sr, factor_provider, selector_provider, slots=slots)
    return slots if slots is not None else {}
