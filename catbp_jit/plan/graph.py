"""Link a list of programs into one typed SSA graph.

Registers are renamed into values (one per definition; NORMALIZE's in-place rewrite makes
a new value), LOAD_SLOT reads whatever value the slot holds at that point, STORE_SLOT
rebinds the slot, and FREE vanishes: slots and frees are planning facts, not operations.
What remains is a DAG of value-producing nodes whose specs are all known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ..ir.ops import OpCode, SlotKey
from ..ir.schema import TensorSpec
from ..ir.validate import ValidatedPrograms
from ..semiring import SEMIRINGS

# Node ops. Inputs come from outside the schedule; the others compute.
FACTOR, SELECTOR, SLOT_IN = "factor", "selector", "slot_in"
UNIT, CONTRACT, ELIMINATE, NORMALIZE = "unit", "contract", "eliminate", "normalize"
VIEW = "view"  # a re-alignment of its input (made by passes.eliminate_copies)
INPUT_OPS = (FACTOR, SELECTOR, SLOT_IN)


@dataclass(frozen=True)
class Node:
    id: int
    op: str
    spec: TensorSpec
    inputs: tuple[int, ...] = ()
    attr: Any = None  # factor id, selector id, slot key, or ELIMINATE's kept keys
    origin: tuple[tuple[str, int], ...] = ()  # (program, instruction index) it came from


@dataclass
class Graph:
    nodes: dict[int, Node]  # in a topological order (definition order)
    outputs: dict[SlotKey, int]  # every slot after the last program -> its value
    semiring: str

    def consumers(self) -> dict[int, int]:
        """How many times each value is read (as an input or as a slot result)."""
        count = {nid: 0 for nid in self.nodes}
        for node in self.nodes.values():
            for i in node.inputs:
                count[i] += 1
        for nid in self.outputs.values():
            count[nid] += 1
        return count


def build_graph(
    checked: ValidatedPrograms, semiring: str, slot_specs: Mapping[SlotKey, TensorSpec] | None = None
) -> Graph:
    """The SSA graph of validated programs (specs must all be known: compile needs them)."""
    nodes: dict[int, Node] = {}
    loaded: dict[tuple[str, Any], int] = {}  # one input node per factor/selector/slot id

    def add(op, spec, inputs=(), attr=None, origin=()) -> int:
        nid = len(nodes)
        nodes[nid] = Node(nid, op, spec, tuple(inputs), attr, origin)
        return nid

    def load(op, ident, spec, origin) -> int:
        if (op, ident) not in loaded:
            loaded[(op, ident)] = add(op, spec, attr=ident, origin=origin)
        return loaded[(op, ident)]

    slots: dict[SlotKey, int] = {}
    for key, slot_spec in (slot_specs or {}).items():
        slots[key] = load(SLOT_IN, key, slot_spec, ())

    normalizes = SEMIRINGS[semiring].normalizes
    for prog, specs in zip(checked.programs, checked.value_specs):
        regs: dict[int, int] = {}
        for index, ins in enumerate(prog.instructions):
            where = ((prog.name, index),)
            spec = specs[index]
            op, a = ins.op, ins.args
            dst = cast(int, ins.dst)  # (adapt_instruction gave each op that defines one a dst)
            if (
                op
                in (OpCode.UNIT, OpCode.LOAD_FACTOR, OpCode.LOAD_SELECTOR, OpCode.CONTRACT, OpCode.ELIMINATE)
                and spec is None
            ):
                raise ValueError(
                    f"program {prog.name!r}, instruction [{index}]: spec unknown; "
                    "compiling needs the factor, selector and slot specs"
                )
            if op == OpCode.UNIT:
                regs[dst] = add(UNIT, spec, origin=where)
            elif op == OpCode.LOAD_FACTOR:
                regs[dst] = load(FACTOR, a["factor_id"], spec, where)
            elif op == OpCode.LOAD_SELECTOR:
                regs[dst] = load(SELECTOR, a["selector_id"], spec, where)
            elif op == OpCode.LOAD_SLOT:
                regs[dst] = slots[a["slot"]]
            elif op == OpCode.STORE_SLOT:
                slots[a["slot"]] = regs[a["src"]]
            elif op == OpCode.CONTRACT and not a["inputs"]:
                regs[dst] = add(UNIT, spec, origin=where)  # the reference returns vm_unit
            elif op == OpCode.CONTRACT:
                regs[dst] = add(CONTRACT, spec, [regs[r] for r in a["inputs"]], origin=where)
            elif op == OpCode.ELIMINATE:
                src = regs[a["src"]]
                assert spec is not None  # (checked above)
                regs[dst] = add(ELIMINATE, spec, [src], attr=spec.keys, origin=where)
            elif op == OpCode.NORMALIZE:
                if normalizes:
                    src = regs[a["src"]]
                    regs[a["src"]] = add(NORMALIZE, nodes[src].spec, [src], origin=where)
            elif op == OpCode.FREE:
                pass  # registers die here; liveness is recomputed from uses
    return Graph(nodes, dict(slots), semiring)


def describe(node: Node) -> str:
    """A short readable form of a node, for listings and error messages."""
    if node.op in INPUT_OPS:
        return f"v{node.id} = {node.op} {node.attr!r} : {node.spec}"
    args = ", ".join(f"v{i}" for i in node.inputs)
    return f"v{node.id} = {node.op}({args}) : {node.spec}"
