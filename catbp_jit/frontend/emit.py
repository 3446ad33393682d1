"""Emit a tree plan as CatBP programs: upward, downward (prefix/suffix or halving), finalize.

These are ordinary programs in our IR (docs/ir.md) with CatBP's slot conventions:
("msg", u, v) is the message from clique u to clique v, ("bel", a) clique a's belief,
("Z",) the partition function. Finalize also stores ("marg", v): variable v's
unnormalized marginal, read from the smallest clique that holds v.

Scaled messages (PROB): a product of potentials overflows or underflows float64 once log Z
is in the hundreds (Markov grids), so with `scaled=True` every message is normalized as it
is computed (NORMALIZE, which divides by its total) and each upward message stores that
total in ("scale", u, v) first. The root's total times every upward scale is Z: model.py
adds their logs. Downward messages are normalized too; their scales are not needed, since
beliefs below the root are only read normalized.

Factor ids: graph factor f is factor f; the evidence indicator of the k-th evidence
variable (ascending variable index) is factor n_factors + k. Evidence is data: a new
observation on the same variables only rebinds those indicator factors (absorbed evidence
has no indicators: the plan is over a graph without the observed variables).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from ..ir import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
from .plan import TreePlan


class HasSizes(Protocol):
    """What spec_of reads of a plan: the domain size per variable index (a TreePlan, or a
    contraction tree: emit_tree.py)."""

    @property
    def sizes(self) -> Sequence[int]: ...


def axis_key(v: int) -> tuple[AxisType, int]:
    return (AxisType.GEOMETRIC, v)


def spec_of(plan: HasSizes, variables: Sequence[int]) -> TensorSpec:
    return TensorSpec(tuple(Axis(v, AxisType.GEOMETRIC, plan.sizes[v]) for v in variables))


def factor_specs(
    plan: TreePlan, scopes: Sequence[Sequence[int]], evidence: Sequence[int]
) -> dict[int, TensorSpec]:
    """The spec of every factor the programs load (graph factors, then indicators)."""
    specs = {f: spec_of(plan, scope) for f, scope in enumerate(scopes)}
    for k, v in enumerate(sorted(evidence)):
        specs[len(scopes) + k] = spec_of(plan, (v,))
    return specs


class _Emitter:
    """Appends instructions with fresh registers; `free()` drops what a step used."""

    def __init__(self, name: str):
        self.name = name
        self.instructions: list[Instruction] = []
        self.next_reg = 1
        self.live: dict[int, None] = {}  # an ordered set: FREE lists them in definition order

    def _def(self, op: OpCode, args: dict, spec: TensorSpec | None = None) -> int:
        r = self.next_reg
        self.next_reg += 1
        self.instructions.append(Instruction(op, r, args, spec))
        self.live[r] = None
        return r

    def load_factor(self, fid: int) -> int:
        return self._def(OpCode.LOAD_FACTOR, {"factor_id": fid})

    def load_slot(self, slot: tuple) -> int:
        return self._def(OpCode.LOAD_SLOT, {"slot": slot})

    def contract(self, inputs: Sequence[int], spec: TensorSpec) -> int:
        if not inputs:
            return self._def(OpCode.UNIT, {}, spec)
        return self._def(OpCode.CONTRACT, {"inputs": tuple(inputs), "out_spec": spec}, spec)

    def eliminate(self, src: int, keep: Sequence[int]) -> int:
        return self._def(OpCode.ELIMINATE, {"src": src, "keep_keys": tuple(axis_key(v) for v in keep)})

    def normalize(self, src: int) -> None:
        self.instructions.append(Instruction(OpCode.NORMALIZE, None, {"src": src}))

    def store(self, slot: tuple, src: int) -> None:
        self.instructions.append(Instruction(OpCode.STORE_SLOT, None, {"slot": slot, "src": src}))

    def release(self, regs: Sequence[int]) -> None:
        """FREE some registers now (the reference VM holds every register until freed)."""
        self.instructions.append(Instruction(OpCode.FREE, None, {"srcs": tuple(regs)}))
        for r in regs:
            self.live.pop(r, None)

    def free(self) -> None:
        if self.live:
            self.instructions.append(Instruction(OpCode.FREE, None, {"srcs": tuple(self.live)}))
            self.live = {}

    def program(self) -> Program:
        return Program(tuple(self.instructions), self.name)


def _local_inputs(
    e: _Emitter, plan: TreePlan, a: int, n_factors: int, evidence_index: dict[int, int]
) -> list[int]:
    clique = plan.cliques[a]
    regs = [e.load_factor(f) for f in clique.factors]
    regs += [e.load_factor(n_factors + evidence_index[v]) for v in clique.evidence]
    return regs


def _send(e: _Emitter, slot: tuple, msg: int, scale_slot: tuple | None = None, scaled: bool = False) -> None:
    """Store a message; scaled: normalized first, its total kept in scale_slot if given."""
    if scaled:
        if scale_slot is not None:
            e.store(scale_slot, e.eliminate(msg, ()))
        e.normalize(msg)
    e.store(slot, msg)


def emit_upward(
    plan: TreePlan, n_factors: int, evidence: Sequence[int], scaled: bool = False, keep_beliefs: bool = False
) -> Program:
    """Messages to the root. keep_beliefs: every clique also stores ("bel", a), its local
    factors times its children's messages (its subtree's weight; the root's is whole):
    what a pass down the tree reads to choose states (descend.py), with no downward pass."""
    e = _Emitter("upward")
    ev = {v: k for k, v in enumerate(sorted(evidence))}
    for a in plan.postorder:
        clique = plan.cliques[a]
        inputs = _local_inputs(e, plan, a, n_factors, ev)
        inputs += [e.load_slot(("msg", c, a)) for c in clique.children]
        acc = e.contract(inputs, spec_of(plan, clique.variables))
        if clique.parent is None or keep_beliefs:
            e.store(("bel", a), acc)
        if clique.parent is not None:
            p = clique.parent
            _send(e, ("msg", a, p), e.eliminate(acc, plan.separator(a, p)), ("scale", a, p), scaled)
        e.free()
    return e.program()


def emit_downward(plan: TreePlan, n_factors: int, evidence: Sequence[int], scaled: bool = False) -> Program:
    """Beliefs of every clique but the root (upward stored it) and messages to children.

    With k children, the message to child i excludes that child's own message:
    prefix[i] = base ⊗ msg(c0) ⊗ … ⊗ msg(c(i-1)), suffix[i] = msg(ci) ⊗ … ⊗ msg(c(k-1)),
    to child i: prefix[i] ⊗ suffix[i+1], eliminated to the separator. Linear in k, where
    excluding one message from the full product at a time would be quadratic. When the
    suffix products are too large to keep (see _suffixes), the children are halved
    instead (_send_halving): k log k message reads and 2k products.
    """
    e = _Emitter("downward")
    ev = {v: k for k, v in enumerate(sorted(evidence))}
    for a in plan.preorder:
        clique = plan.cliques[a]
        kids = clique.children
        if clique.parent is not None or kids:
            spec = spec_of(plan, clique.variables)
            base = _local_inputs(e, plan, a, n_factors, ev)
            if clique.parent is not None:
                base.append(e.load_slot(("msg", clique.parent, a)))
            msgs = [e.load_slot(("msg", c, a)) for c in kids]
            if kids and not _suffixes_fit(plan, a, kids):
                _send_halving(e, plan, a, spec, base, kids, msgs, clique.parent is not None, scaled)
                e.free()
                continue
            suffix = _suffixes(e, plan, a, kids, msgs)
            prefix = base
            for i, c in enumerate(kids):
                excl = e.contract(prefix + suffix[i + 1], spec)
                _send(e, ("msg", a, c), e.eliminate(excl, plan.separator(a, c)), scaled=scaled)
                prefix = [e.contract(prefix + [msgs[i]], spec)] if i + 1 < len(kids) else prefix + [msgs[i]]
            if clique.parent is not None:
                e.store(("bel", a), e.contract(prefix, spec))
            e.free()
    return e.program()


def _suffix_unions(plan: TreePlan, a: int, kids: Sequence[int]) -> list[tuple[tuple[int, ...], int]]:
    """Per i: the variables of suffix[i], the union of the separators of children i.., and
    its states. One pass from the last child, a new tuple only where the union grows (at
    most once per variable): linear in k, where taking each union afresh was quadratic."""
    unions: list[tuple[tuple[int, ...], int]] = [((), 1)] * len(kids)
    seen: set = set()
    variables: tuple[int, ...] = ()
    states = 1
    for i in range(len(kids) - 1, -1, -1):
        new = [v for v in plan.separator(a, kids[i]) if v not in seen]
        if new:
            seen.update(new)
            variables = tuple(sorted(seen))
            states *= math.prod(plan.sizes[v] for v in new)
        unions[i] = (variables, states)
    return unions


def _suffixes_fit(plan: TreePlan, a: int, kids: Sequence[int]) -> bool:
    """Can every suffix of two or more messages be kept within half the clique's size?"""
    unions = _suffix_unions(plan, a, kids)
    return sum(states for _, states in unions[1 : len(kids) - 1]) <= plan.states(a) // 2


def _send_halving(
    e: _Emitter,
    plan: TreePlan,
    a: int,
    spec: TensorSpec,
    rest: list[int],
    kids: Sequence[int],
    msgs: Sequence[int],
    belief: bool,
    scaled: bool,
) -> None:
    """Send each child the product of `rest` and the other children's messages.

    Each half of the children gets `rest` times the other half's messages as its new
    `rest`, materialized, then recurses: every level reads each message once (k log k in
    all) and log k such products are alive at once. With `belief`, the first child's
    leaf also stores the clique's belief, its `rest` times its own message.
    """
    if len(kids) == 1:
        src = rest[0] if len(rest) == 1 else e.contract(rest, spec)
        _send(e, ("msg", a, kids[0]), e.eliminate(src, plan.separator(a, kids[0])), scaled=scaled)
        if belief:
            e.store(("bel", a), e.contract(rest + [msgs[0]], spec))
        return
    h = len(kids) // 2
    for lo, hi, other in ((0, h, msgs[h:]), (h, len(kids), msgs[:h])):
        part = e.contract(rest + list(other), spec)
        _send_halving(e, plan, a, spec, [part], kids[lo:hi], msgs[lo:hi], belief and lo == 0, scaled)
        e.release([part])


def _suffixes(
    e: _Emitter, plan: TreePlan, a: int, kids: Sequence[int], msgs: Sequence[int]
) -> list[list[int]]:
    """suffix[i]: registers whose ⊗ is msg(ci) ⊗ … ⊗ msg(c(k-1)); suffix[k] is empty.

    A suffix product lives until the first messages are sent, so all of them are alive at
    once. It is materialized only while those buffers stay within half the clique's size
    (they span the union of the children's separators, often the whole clique: munin1
    would hold eight 600 MB suffixes); beyond that the messages are multiplied in
    directly, which reads small separator-sized tensors instead.
    """
    budget = plan.states(a) // 2
    unions = _suffix_unions(plan, a, kids)
    suffix: list[list[int]] = [[] for _ in range(len(kids) + 1)]
    for i in range(len(kids) - 1, 0, -1):  # suffix[0] is never used
        rest = [msgs[i]] + suffix[i + 1]
        union, states = unions[i]
        if len(rest) > 1 and states <= budget:
            budget -= states
            suffix[i] = [e.contract(rest, spec_of(plan, union))]
        else:
            suffix[i] = rest
    return suffix


def emit_finalize(plan: TreePlan) -> Program:
    e = _Emitter("finalize")
    bel = {}
    for a in sorted(set(plan.home) | {plan.root}):
        bel[a] = e.load_slot(("bel", a))
    e.store(("Z",), e.eliminate(bel[plan.root], ()))
    for v, a in enumerate(plan.home):
        e.store(("marg", v), e.eliminate(bel[a], (v,)))
    e.free()
    return e.program()


def emit_upward_programs(
    plan: TreePlan, n_factors: int, evidence: Sequence[int] = ()
) -> tuple[Program, Program]:
    """The upward pass keeping every clique's belief, and a finalize that stores ("Z",):
    what MPE and sampling read (tasks.py), a third of the work of all three passes."""
    e = _Emitter("finalize")
    e.store(("Z",), e.eliminate(e.load_slot(("bel", plan.root)), ()))
    e.free()
    return emit_upward(plan, n_factors, evidence, keep_beliefs=True), e.program()


def emit_programs(
    plan: TreePlan, n_factors: int, evidence: Sequence[int] = (), scaled: bool = False
) -> tuple[Program, Program, Program]:
    return (
        emit_upward(plan, n_factors, evidence, scaled),
        emit_downward(plan, n_factors, evidence, scaled),
        emit_finalize(plan),
    )


def scale_slots(plan: TreePlan) -> tuple[tuple, ...]:
    """The slots a scaled upward program stores: one per upward message."""
    return tuple(("scale", c.id, c.parent) for c in plan.cliques if c.parent is not None)
