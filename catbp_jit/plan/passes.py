"""Graph passes: plain functions from a Graph to a Graph (IR spec §4.1's allowed rewrites).

None of them changes what any element computes: products keep their written order, and a
re-alignment only moves elements.
"""

from __future__ import annotations

from dataclasses import replace

from ..semiring import SEMIRINGS
from .graph import CONTRACT, ELIMINATE, INPUT_OPS, NORMALIZE, UNIT, VIEW, Graph, Node


def _rebuild(g: Graph, keep, remap: dict[int, int]) -> Graph:
    if not remap and len(keep) == len(g.nodes):  # nothing dropped or renamed
        return g
    nodes = {}
    for nid, node in g.nodes.items():
        if nid in keep:
            nodes[nid] = Node(
                nid, node.op, node.spec, tuple(remap.get(i, i) for i in node.inputs), node.attr, node.origin
            )
    outputs = {k: remap.get(v, v) for k, v in g.outputs.items()}
    return replace(g, nodes=nodes, outputs=outputs)


def dead_code_elimination(g: Graph) -> Graph:
    """Drop every node no slot result depends on."""
    live = set(g.outputs.values())
    for nid in reversed(list(g.nodes)):
        if nid in live:
            live.update(g.nodes[nid].inputs)
    return _rebuild(g, live, {})


def common_subexpressions(g: Graph) -> Graph:
    """Merge nodes with the same op, inputs, attribute and spec."""
    seen: dict[tuple, int] = {}
    remap: dict[int, int] = {}
    keep = set()
    for nid, node in g.nodes.items():
        inputs = tuple(remap.get(i, i) for i in node.inputs)
        sig = (node.op, inputs, node.attr, node.spec)
        if node.op not in INPUT_OPS and sig in seen:
            remap[nid] = seen[sig]
            continue
        seen.setdefault(sig, nid)
        keep.add(nid)
    return _rebuild(g, keep, remap)


def is_realignment(g: Graph, node: Node) -> bool:
    """Does the node only move elements (transpose, broadcast, drop singleton axes)?

    A one-input CONTRACT copies its aligned input. An ELIMINATE that drops no axis of size
    above one reduces over single elements, which is the identity for sum and any; for
    logsumexp it is too (x + log(1)), except that +inf becomes NaN, so in LOGPROB only an
    ELIMINATE that drops nothing at all is a re-alignment.
    """
    if node.op == CONTRACT:
        return len(node.inputs) == 1
    if node.op == ELIMINATE:
        src = g.nodes[node.inputs[0]].spec
        kept = set(node.spec.keys)
        dropped = [ax for ax in src.axes if ax.key not in kept]
        if not SEMIRINGS[g.semiring].single_term_reduction_is_identity:
            return not dropped
        return all(ax.size == 1 for ax in dropped)
    return False


def eliminate_copies(g: Graph) -> Graph:
    """Turn re-alignments into VIEW nodes: addressing facts, not kernels."""
    nodes = {}
    for nid, node in g.nodes.items():
        if is_realignment(g, node):
            node = Node(nid, VIEW, node.spec, node.inputs, None, node.origin)
        nodes[nid] = node
    return replace(g, nodes=nodes, outputs=dict(g.outputs))


def drop_unit_factors(g: Graph) -> Graph:
    """Remove UNIT inputs from products that have other inputs: x ⊗ 1 = x exactly.

    (×1.0 is exact in IEEE arithmetic, +0.0 too but for -0.0 + 0.0 = +0.0, which compares
    equal; `and True` and integer ×1 are exact.) The output spec still fixes the shape.
    """
    nodes = {}
    for nid, node in g.nodes.items():
        if node.op == CONTRACT:
            rest = tuple(i for i in node.inputs if g.nodes[i].op != UNIT)
            if rest and len(rest) < len(node.inputs):
                node = Node(nid, CONTRACT, node.spec, rest, node.attr, node.origin)
        nodes[nid] = node
    return replace(g, nodes=nodes, outputs=dict(g.outputs))


def _same_elements(a, b) -> bool:
    """Do two specs hold the same elements in another order (up to singleton axes)?"""

    def big(spec):
        return sorted((ax.kind.value, ax.id, ax.size) for ax in spec.axes if ax.size > 1)

    return big(a) == big(b)


def fold_views(g: Graph) -> Graph:
    """Let a producer write directly in the layout of the one view that reads it.

    A view of a computed value that nothing else reads costs a copy if it is a slot
    result; instead the producer computes in the view's spec. For a CONTRACT any view
    works (every leaf is aligned by key, broadcast axes included); for ELIMINATE and
    NORMALIZE only a permutation does (a broadcast would change what is reduced).
    """
    consumers = g.consumers()
    outputs = set(g.outputs.values())
    nodes = dict(g.nodes)
    remap: dict[int, int] = {}
    for nid, node in g.nodes.items():
        if node.op != VIEW:
            continue
        src = remap.get(node.inputs[0], node.inputs[0])
        prod = nodes[src]
        if prod.op not in (CONTRACT, ELIMINATE, NORMALIZE) or consumers[node.inputs[0]] != 1:
            continue
        if src in outputs or (prod.op == CONTRACT and len(prod.inputs) == 1):
            continue
        if prod.op != CONTRACT and not _same_elements(prod.spec, node.spec):
            continue
        if prod.op == NORMALIZE:
            continue  # NORMALIZE's input keeps the old layout; keep it simple and exact
        attr = node.spec.keys if prod.op == ELIMINATE else prod.attr
        nodes[nid] = Node(nid, prod.op, node.spec, prod.inputs, attr, prod.origin + node.origin)
        del nodes[src]
        remap[src] = nid
    # the folded producer moved to the view's place in the order: still topological,
    # since the view came after everything the producer reads.
    ordered = {
        nid: Node(nid, n.op, n.spec, tuple(remap.get(i, i) for i in n.inputs), n.attr, n.origin)
        for nid, n in sorted(nodes.items())
    }
    outs = {k: remap.get(v, v) for k, v in g.outputs.items()}
    return replace(g, nodes=ordered, outputs=outs)


def optimize(g: Graph) -> Graph:
    g = dead_code_elimination(g)
    g = drop_unit_factors(g)
    g = common_subexpressions(g)
    g = eliminate_copies(g)
    g = fold_views(g)
    return dead_code_elimination(g)
