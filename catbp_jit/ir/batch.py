"""Batching: rewrite linked programs so that chosen inputs carry a batch axis.

The batch axis is one more GEOMETRIC axis, with an id no spec or instruction of the
programs uses, put last in the spec of every batched factor and selector. Each value
computed from a batched value gets it too, last: a CONTRACT that reads one has it
appended to its out_spec, an ELIMINATE of one keeps it (last in keep_keys), NORMALIZE
rewrites in place, and a slot holds whatever was stored last. Values that depend on no
batched input are left exactly as written, so the planner computes them once per run and
every batch element shares them.

Last, because it measured fastest (innermost, a kernel's tight loop runs over the batch
with unit stride: 1.2-1.4x faster than outermost on the bench bundles, see batched.py);
the session shows it first, (n, *spec.shape), through strided views. With the batch axis
innermost, the other axes keep their relative strides, so a batched kernel reduces, and
NORMALIZE sums, each row in the order the unbatched program would: PROB, SAT and COUNT
results equal row-by-row runs bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace

from ..errors import CatbpError
from .ops import Instruction, OpCode, Program
from .schema import Axis, AxisType, TensorSpec


class BatchedCompileError(CatbpError, ValueError):
    """Batched inputs, buckets or programs that a batched compile cannot use."""


def batch_axis_id(programs: list[Program], specs: Iterable[TensorSpec]) -> int:
    """An axis id used by no axis of either kind anywhere in the programs or input specs
    (legacy ELIMINATE `drop` lists ids of both kinds, so both namespaces count)."""
    used = {ax.id for spec in specs for ax in spec.axes}
    for prog in programs:
        for ins in prog.instructions:
            for spec in (ins.spec, ins.args.get("out_spec")):
                if isinstance(spec, TensorSpec):
                    used.update(ax.id for ax in spec.axes)
            used.update(aid for _, aid in ins.args.get("keep_keys", ()))
            used.update(ins.args.get("drop", ()))
    return max(used, default=-1) + 1


def batch_axis(aid: int, size: int) -> Axis:
    return Axis(aid, AxisType.GEOMETRIC, size)


def batched_spec(spec: TensorSpec, axis: Axis) -> TensorSpec:
    return TensorSpec(tuple(spec.axes) + (axis,))


def is_batched(spec: TensorSpec, axis: Axis) -> bool:
    return bool(spec.axes) and spec.axes[-1].key == axis.key


def unbatched_spec(spec: TensorSpec, axis: Axis) -> TensorSpec:
    """The spec as the user sees one row of it (the batch axis, if any, is last)."""
    return TensorSpec(spec.axes[:-1]) if is_batched(spec, axis) else spec


def batch_programs(
    programs: list[Program],
    axis: Axis,
    batched_factors: AbstractSet[int],
    batched_selectors: AbstractSet[int],
    outside_slots: Iterable[tuple] = (),
) -> tuple[list[Program], set[tuple]]:
    """The programs rewritten for the batch axis, and the slots that end up batched.

    A slot's spec is fixed at its first write (outside_slots: handed in, unbatched), so a
    slot that would hold a batched value at one time and an unbatched one at another is
    refused, naming the program and instruction."""
    slots: set[tuple] = set()
    first: dict = {key: "handed in to run() unbatched" for key in outside_slots}
    out: list[Program] = []
    for pi, prog in enumerate(programs):
        regs: set[int] = set()  # registers holding a batched value
        rewritten = []
        for index, ins in enumerate(prog.instructions):
            ins, batched = _rewrite(ins, axis, regs, slots, batched_factors, batched_selectors)
            if ins.op == OpCode.STORE_SLOT:
                key = ins.args["slot"]
                where = f"program {prog.name or f'p{pi}'!r}, instruction [{index}] STORE_SLOT"
                was = first.setdefault(key, f"{'' if batched else 'un'}batched at {where}")
                if was.startswith("batched") != batched:
                    raise BatchedCompileError(
                        f"{where}: slot {key!r} would hold a {'' if batched else 'un'}batched "
                        f"value, but its spec was fixed {was}: batch an input it depends on, "
                        f"or none"
                    )
                (slots.add if batched else slots.discard)(key)
            elif ins.op == OpCode.FREE:
                regs.difference_update(ins.args["srcs"])
            elif ins.dst is not None and ins.op != OpCode.NORMALIZE:
                (regs.add if batched else regs.discard)(ins.dst)
            rewritten.append(ins)
        out.append(Program(tuple(rewritten), prog.name))
    return out, slots


def _rewrite(
    ins: Instruction,
    axis: Axis,
    regs: set[int],
    slots: set[tuple],
    factors: AbstractSet[int],
    selectors: AbstractSet[int],
) -> tuple[Instruction, bool]:
    """(the instruction for the batched programs, whether what it defines is batched)."""
    op, args = ins.op, ins.args
    if op == OpCode.LOAD_FACTOR:
        return ins, args["factor_id"] in factors
    if op == OpCode.LOAD_SELECTOR:
        return ins, args["selector_id"] in selectors
    if op == OpCode.LOAD_SLOT:
        return ins, args["slot"] in slots
    if op in (OpCode.STORE_SLOT, OpCode.NORMALIZE):
        return ins, args["src"] in regs
    if op == OpCode.CONTRACT:
        if not any(r in regs for r in args["inputs"]):
            return ins, False
        spec = batched_spec(args["out_spec"], axis)
        return replace(ins, args={**args, "out_spec": spec}, spec=spec), True
    if op == OpCode.ELIMINATE:
        if args["src"] not in regs:
            return ins, False
        if "keep_keys" in args:  # (legacy `drop` keeps every axis it does not name)
            ins = replace(ins, args={**args, "keep_keys": tuple(args["keep_keys"]) + (axis.key,)})
        return ins, True
    return ins, False  # UNIT, FREE


def batch_input_specs(specs: Mapping[int, TensorSpec], batched: AbstractSet[int], axis: Axis) -> dict:
    return {k: batched_spec(v, axis) if k in batched else v for k, v in specs.items()}
