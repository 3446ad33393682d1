"""Emit a contraction tree as CatBP programs: the contraction (upward) and its adjoint.

upward, children first: each internal node CONTRACTs its two children over their joint
variables and ELIMINATEs to its own (the JIT fuses the two: the joint space is looped
over, never stored); it stores ("t", n). The root's is a scalar, stored as ("Z",).

downward, root first: the adjoint of a node is the contraction of every tensor outside
its subtree, over the node's variables that the rest of the network holds. A child's
adjoint is its parent's adjoint times its sibling's tensor, eliminated to the child's
variables (reverse-mode differentiation of Z, as ∂Z/∂T is for a product). A variable's
unnormalized marginal is its home tensor times that tensor's adjoint, eliminated to the
variable; adjoints are computed only on the paths from the root to the homes.

Scaled (PROB, see emit.py): every tensor but the root's is normalized as it is computed,
its total stored first in ("scale", n), so Z is the root times every scale; adjoints are
normalized too (their scales are not needed: marginals are read normalized).

Slots and factor ids are the junction tree's (emit.py): graph factor f is factor f, the
k-th evidence indicator (ascending variable) is factor n_factors + k; ("Z",) and
("marg", v) are what the model reads.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Program
from .contraction import ContractionTree
from .emit import _Emitter, spec_of


def _load(e: _Emitter, tree: ContractionTree, n: int, n_factors: int, indicator: dict[int, int]) -> int:
    """A register holding node n's tensor."""
    node = tree.nodes[n]
    if node.leaf is None:
        return e.load_slot(("t", n))
    if node.leaf.kind == "factor":
        return e.load_factor(node.leaf.ident)
    if node.leaf.kind == "indicator":
        return e.load_factor(n_factors + indicator[node.leaf.ident])
    return e.contract([], spec_of(tree, node.variables))  # "unit": ones (UNIT)


def emit_contraction_upward(
    tree: ContractionTree, n_factors: int, evidence: Sequence[int] = (), scaled: bool = False
) -> Program:
    e = _Emitter("upward")
    indicator = {v: k for k, v in enumerate(sorted(evidence))}
    for node in tree.internal:
        regs = [_load(e, tree, c, n_factors, indicator) for c in node.children]
        joint = e.contract(regs, spec_of(tree, tree.loop_variables(node.id)))
        out = e.eliminate(joint, node.variables)
        if node.id == tree.root:
            e.store(("Z",), out)
        else:
            if scaled:
                e.store(("scale", node.id), e.eliminate(out, ()))
                e.normalize(out)
            e.store(("t", node.id), out)
        e.free()
    if not tree.nodes[tree.root].children:  # a single tensor: Z is its sum
        e.store(("Z",), e.eliminate(_load(e, tree, tree.root, n_factors, indicator), ()))
        e.free()
    return e.program()


def emit_contraction_downward(
    tree: ContractionTree, n_factors: int, evidence: Sequence[int] = (), scaled: bool = False
) -> Program:
    e = _Emitter("downward")
    indicator = {v: k for k, v in enumerate(sorted(evidence))}
    parent = tree.parents()
    homed: dict[int, list[int]] = {}
    for v, n in enumerate(tree.home):
        homed.setdefault(n, []).append(v)
    needed = tree.on_paths_to_homes(parent)
    adjoint: dict[int, int | None] = {tree.root: None}  # None: the scalar one
    stack = [tree.root]
    while stack:
        n = stack.pop()
        node = tree.nodes[n]
        adj = adjoint.pop(n)
        mine = [] if adj is None else [adj]  # registers to drop once n is done
        if n in homed:
            t = _load(e, tree, n, n_factors, indicator)
            joint = e.contract([t] + mine, spec_of(tree, node.variables))
            for v in homed[n]:
                e.store(("marg", v), e.eliminate(joint, (v,)))
            mine += [t, joint]
        for c in node.children:
            if c not in needed:
                continue
            (sibling,) = [s for s in node.children if s != c]
            s = _load(e, tree, sibling, n_factors, indicator)
            over = sorted(set(tree.adjoint_variables(n, parent)) | set(tree.nodes[sibling].variables))
            joint = e.contract(([] if adj is None else [adj]) + [s], spec_of(tree, over))
            a = e.eliminate(joint, tree.adjoint_variables(c, parent))
            if scaled:
                e.normalize(a)
            adjoint[c] = a
            stack.append(c)
            mine += [s, joint]
        # what n used; the children's adjoints stay until they are reached
        # in definition order, which is register order (a scan of e.live, which holds
        # every register not yet freed, made this quadratic in the tree's size)
        e.release(sorted(r for r in set(mine) if r in e.live))
    e.free()
    return e.program()


def emit_contraction_programs(
    tree: ContractionTree, n_factors: int, evidence: Sequence[int] = (), scaled: bool = False
) -> tuple[Program, Program]:
    return (
        emit_contraction_upward(tree, n_factors, evidence, scaled),
        emit_contraction_downward(tree, n_factors, evidence, scaled),
    )


def contraction_scale_slots(tree: ContractionTree) -> tuple[tuple, ...]:
    """The slots a scaled upward program stores: one per internal node but the root."""
    return tuple(("scale", n.id) for n in tree.internal if n.id != tree.root)
