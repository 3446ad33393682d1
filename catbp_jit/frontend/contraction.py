"""Contraction trees: the model's tensor network contracted two tensors at a time.

A junction tree multiplies every table of a clique at every one of the clique's states.
When a clique gathers many small tables that is most of the work: Alchemy_11's largest
clique (2^20 states) multiplies about two thousand tables per state, where contracting
the same tables two at a time, small ones first, costs about 2^21 in all. A contraction
tree does that: each internal node contracts its two children and sums out every variable
that no tensor outside its subtree holds (the JIT fuses the product with the sum, so the
pair's joint space is looped over, never stored).

The tree comes from an elimination order (the one the planner chose, greedy or searched)
by bucket elimination: at each variable in turn, the tensors holding it are contracted
two at a time, the pair with the smallest result first, until one is left. Variables held
by one tensor alone are summed out at that tensor's next contraction. What is left at the
end is contracted into the root, a scalar: Z.

Nodes are numbered leaves first (factors, evidence indicators, then a unit tensor for
each variable that nothing else holds, so its marginal and its factor in Z are right),
then internal nodes in contraction order, children before parents.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# a pair contracted by the bucket elimination is the cheapest among at most this many
# tensors; beyond, the smallest two (a bucket that large is rare, and pairs are quadratic)
PAIR_SEARCH_LIMIT = 48


@dataclass(frozen=True)
class Leaf:
    kind: str  # "factor" (graph factor id), "indicator" (evidence variable), "unit" (variable)
    ident: int  # the factor id, or the variable


@dataclass(frozen=True)
class Node:
    id: int
    variables: tuple[int, ...]  # the tensor's axes, ascending (a leaf: its scope)
    children: tuple[int, ...]  # () for a leaf, else the two contracted nodes
    leaf: Leaf | None = None


@dataclass(frozen=True)
class ContractionTree:
    sizes: tuple[int, ...]
    nodes: tuple[Node, ...]  # leaves first, then internal nodes, children before parents
    root: int
    home: tuple[int, ...]  # per variable: the node whose tensor its marginal is read from

    def states(self, n: int) -> int:
        return math.prod(self.sizes[v] for v in self.nodes[n].variables)

    def loop_variables(self, n: int) -> tuple[int, ...]:
        """The variables an internal node's contraction loops over: its children's union."""
        return tuple(sorted({v for c in self.nodes[n].children for v in self.nodes[c].variables}))

    def loop_states(self, n: int) -> int:
        return math.prod(self.sizes[v] for v in self.loop_variables(n))

    @property
    def internal(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.children)

    def parents(self) -> dict[int, int]:
        return {c: n.id for n in self.nodes for c in n.children}

    def on_paths_to_homes(self, parent: dict[int, int]) -> set[int]:
        """The nodes whose adjoints the marginals need: the homes and their ancestors."""
        needed: set[int] = set()
        for n in set(self.home):
            while n not in needed:
                needed.add(n)
                if n == self.root:
                    break
                n = parent[n]
        return needed

    def adjoint_variables(self, n: int, parent: dict[int, int]) -> tuple[int, ...]:
        """The axes of node n's adjoint (the contraction of everything outside its subtree):
        its variables that its parent or its sibling holds; the root's is a scalar."""
        if n == self.root:
            return ()
        p = self.nodes[parent[n]]
        (sibling,) = [c for c in p.children if c != n]
        outside = set(p.variables) | set(self.nodes[sibling].variables)
        return tuple(v for v in self.nodes[n].variables if v in outside)

    def stats(self) -> dict[str, int]:
        internal = self.internal
        loops = [self.loop_states(n.id) for n in internal] or [self.states(self.root)]
        stored = [self.states(n.id) for n in internal]
        return {
            "variables": len(self.sizes),
            "contractions": len(internal),
            "max_loop_states": max(loops),
            "max_stored_states": max(stored, default=1),
            "stored_states": sum(stored),
        }


class _Builder:
    """Leaves, then merges: each merge keeps what another active tensor still holds."""

    def __init__(self, sizes: Sequence[int], scopes: Sequence[Sequence[int]], evidence: Sequence[int]):
        self.sizes = tuple(sizes)
        nodes: list[Node] = []
        for f, scope in enumerate(scopes):
            nodes.append(Node(len(nodes), tuple(sorted(set(scope))), (), Leaf("factor", f)))
        for v in sorted(evidence):
            nodes.append(Node(len(nodes), (v,), (), Leaf("indicator", v)))
        if not nodes and not self.sizes:  # nothing at all: Z is the empty product
            nodes.append(Node(0, (), (), Leaf("unit", -1)))
        held = {v for n in nodes for v in n.variables}
        for v in range(len(sizes)):
            if v not in held:
                nodes.append(Node(len(nodes), (v,), (), Leaf("unit", v)))
        self.nodes = nodes
        self.holders: dict[int, set[int]] = {v: set() for v in range(len(sizes))}
        for n in nodes:
            for v in n.variables:
                self.holders[v].add(n.id)
        self.active: set[int] = {n.id for n in nodes}

    def states(self, variables: Iterable[int]) -> int:
        return math.prod(self.sizes[v] for v in variables)

    def merge(self, a: int, b: int) -> int:
        union = set(self.nodes[a].variables) | set(self.nodes[b].variables)
        # summed out here: what no other active tensor holds
        keep = tuple(sorted(v for v in union if self.holders[v] - {a, b}))
        n = len(self.nodes)
        self.nodes.append(Node(n, keep, (a, b)))
        for v in union:
            self.holders[v] -= {a, b}
        for v in keep:
            self.holders[v].add(n)
        self.active.difference_update((a, b))
        self.active.add(n)
        return n

    def contract_all(self, group: list[int]) -> int:
        """Contract a group two at a time, the cheapest pair first; the last node."""
        group = list(group)
        while len(group) > 1:
            a, b = _cheapest_pair(group, self.nodes, self.states)
            group.remove(a)
            group.remove(b)
            group.append(self.merge(a, b))
        return group[0]

    def finish(self) -> ContractionTree:
        # what is left holds no shared variable: components, or scalars
        root = self.contract_all(sorted(self.active))  # a scalar, or the only tensor
        # each marginal from the smallest tensor holding the variable
        home: list[tuple[int, int]] = [(0, -1)] * len(self.sizes)
        for n in self.nodes:
            s = self.states(n.variables)
            for v in n.variables:
                if home[v][1] < 0 or s < home[v][0]:
                    home[v] = (s, n.id)
        return ContractionTree(self.sizes, tuple(self.nodes), root, tuple(h for _, h in home))


def contraction_tree(
    sizes: Sequence[int], scopes: Sequence[Sequence[int]], order: Sequence[int], evidence: Sequence[int] = ()
) -> ContractionTree:
    """The contraction tree of `order` (bucket elimination); factor f is scopes[f], the
    evidence indicators follow in ascending variable order (as emit.factor_specs numbers
    them)."""
    b = _Builder(sizes, scopes, evidence)
    for v in order:
        if len(b.holders[v]) > 1:
            b.contract_all(sorted(b.holders[v]))
    return b.finish()


def tree_from_path(
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    path: Sequence[tuple[int, int]],
    evidence: Sequence[int] = (),
) -> ContractionTree:
    """The contraction tree of a path found for the factors alone (plan search, in
    cotengra's single-assignment form: inputs are the factors with a non-empty scope, in
    order, numbered from 0; each pair contracted is numbered next). Each evidence
    indicator is first contracted into the smallest factor holding its variable (at no
    more than that factor's cost); what the path leaves apart is contracted last."""
    b = _Builder(sizes, scopes, evidence)
    current = {f: f for f, scope in enumerate(scopes)}  # factor -> the node that holds it now
    by_variable: dict[int, list[int]] = {}
    for f, scope in enumerate(scopes):
        for v in set(scope):
            by_variable.setdefault(v, []).append(f)
    for node in list(b.nodes):
        if node.leaf is not None and node.leaf.kind == "indicator" and node.leaf.ident in by_variable:
            f = min(by_variable[node.leaf.ident], key=lambda f: (b.states(b.nodes[current[f]].variables), f))
            current[f] = b.merge(current[f], node.id)
    ssa = [current[f] for f, scope in enumerate(scopes) if scope]
    for i, j in path:
        ssa.append(b.merge(ssa[i], ssa[j]))
    return b.finish()


def _cheapest_pair(
    group: list[int], nodes: list[Node], states: Callable[[Iterable[int]], int]
) -> tuple[int, int]:
    if len(group) > PAIR_SEARCH_LIMIT:
        a, b = sorted(group, key=lambda n: (states(nodes[n].variables), n))[:2]
        return a, b
    best: tuple[int, int, int] | None = None
    for i, a in enumerate(group):
        va = set(nodes[a].variables)
        for b in group[i + 1 :]:
            key = (states(va | set(nodes[b].variables)), a, b)
            if best is None or key < best:
                best = key
    assert best is not None  # a group of two tensors at least
    return best[1], best[2]
