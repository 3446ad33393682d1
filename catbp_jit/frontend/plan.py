"""Tree plans: an elimination order, its cliques, and one junction tree over them.

The plan is pure structure (variable indices and domain sizes); no values. Steps:
1. `elimination_order`: greedy elimination on the interaction graph, the best of
   weighted min-fill, min-fill and min-weight.
2. `junction_tree`: one clique per eliminated variable, linked to the clique of the
   first-eliminated variable among its other members, non-maximal cliques merged away;
   the trees of disconnected components are hung under one root with empty separators
   (their messages are scalars), so the whole graph is one tree with one Z.
3. each factor goes to the smallest clique holding its scope, each evidence variable to the
   smallest clique holding it, and each variable reads its marginal from the smallest
   clique holding it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple


@dataclass(frozen=True)
class Clique:
    id: int
    variables: Tuple[int, ...]  # variable indices, ascending: the belief's axis order
    parent: Optional[int]
    children: Tuple[int, ...]
    factors: Tuple[int, ...]  # indices into the graph's factors, in graph order
    evidence: Tuple[int, ...]  # variables whose evidence indicator this clique loads


@dataclass(frozen=True)
class TreePlan:
    sizes: Tuple[int, ...]  # domain size per variable index
    order: Tuple[int, ...]  # the elimination order
    cliques: Tuple[Clique, ...]
    root: int
    postorder: Tuple[int, ...]  # children before parents
    home: Tuple[int, ...]  # per variable: the clique its marginal is read from

    @property
    def preorder(self) -> Tuple[int, ...]:
        return tuple(reversed(self.postorder))

    def separator(self, a: int, b: int) -> Tuple[int, ...]:
        """The variables two adjacent cliques share, in ascending order."""
        vb = set(self.cliques[b].variables)
        return tuple(v for v in self.cliques[a].variables if v in vb)

    def states(self, c: int) -> int:
        return math.prod(self.sizes[v] for v in self.cliques[c].variables)

    def stats(self) -> Dict[str, int]:
        states = [self.states(c.id) for c in self.cliques]
        return {"variables": len(self.sizes), "cliques": len(self.cliques),
                "max_clique_variables": max(len(c.variables) for c in self.cliques),
                "max_clique_states": max(states), "total_states": sum(states),
                "separator_states": sum(
                    math.prod(self.sizes[v] for v in self.separator(c.id, c.parent))
                    for c in self.cliques if c.parent is not None)}


def interaction_graph(n: int, scopes: Sequence[Sequence[int]]) -> List[Set[int]]:
    adj: List[Set[int]] = [set() for _ in range(n)]
    for scope in scopes:
        for u in scope:
            adj[u].update(w for w in scope if w != u)
    return adj


# Each heuristic scores a variable by (fill, missing, log_weight): the state count of the
# fill edges its elimination adds (Σ size(a)·size(b) over missing neighbour pairs), how many
# edges that is, and the log of the states of the clique it forms.
HEURISTICS = {
    "weighted-min-fill": lambda fill, missing, log_w: (fill, log_w),
    "min-fill": lambda fill, missing, log_w: (missing, log_w),
    "min-weight": lambda fill, missing, log_w: (log_w, fill),
}


def elimination_order(sizes: Sequence[int], scopes: Sequence[Sequence[int]],
                      heuristic: str = "best") -> Tuple[int, ...]:
    """A greedy elimination order; "best" runs every heuristic and keeps the order whose
    cliques hold the fewest states in all (no single heuristic wins on every network:
    weighted min-fill on munin1 and barley, min-fill on mildew, min-weight on munin2)."""
    if heuristic != "best":
        return greedy_order(sizes, scopes, HEURISTICS[heuristic])[0]
    runs = [greedy_order(sizes, scopes, score) for score in HEURISTICS.values()]
    return min(runs, key=lambda run: run[1])[0]


def greedy_order(sizes: Sequence[int], scopes: Sequence[Sequence[int]],
                 score) -> Tuple[Tuple[int, ...], int]:
    """Eliminate the lowest-scoring variable until none is left (ties: lowest index).

    Returns the order and the total states of the cliques it forms. Scores are updated
    only for the variables an elimination can affect: its neighbours and theirs.
    """
    n = len(sizes)
    adj = interaction_graph(n, scopes)
    log_size = [math.log(s) for s in sizes]

    def cost(v: int):
        nb = list(adj[v])
        fill, missing = 0, 0
        for i, a in enumerate(nb):
            adj_a = adj[a]
            for b in nb[i + 1:]:
                if b not in adj_a:
                    fill += sizes[a] * sizes[b]
                    missing += 1
        return (*score(fill, missing, log_size[v] + sum(log_size[a] for a in nb)), v)

    current = [cost(v) for v in range(n)]
    heap = list(current)
    heapq.heapify(heap)
    done = [False] * n
    order: List[int] = []
    total = 0
    while heap:
        entry = heapq.heappop(heap)
        v = entry[-1]
        if done[v] or entry != current[v]:
            continue  # stale entry
        done[v] = True
        order.append(v)
        nb = adj[v]
        total += sizes[v] * math.prod(sizes[a] for a in nb)
        for a in nb:
            adj[a].discard(v)
            adj[a].update(w for w in nb if w != a)
        # fill edges change the cost of v's neighbours and of their neighbours
        touched = set(nb)
        for a in nb:
            touched.update(adj[a])
        adj[v] = set()
        for a in touched:
            if not done[a]:
                current[a] = cost(a)
                heapq.heappush(heap, current[a])
    return tuple(order), total


def elimination_cliques(n: int, scopes: Sequence[Sequence[int]],
                        order: Sequence[int]) -> Tuple[List[Set[int]], List[Optional[int]]]:
    """The clique each elimination forms and its parent (by position in `order`)."""
    adj = interaction_graph(n, scopes)
    pos = {v: i for i, v in enumerate(order)}
    cliques: List[Set[int]] = []
    for v in order:
        nb = adj[v]
        cliques.append({v} | nb)
        for a in nb:
            adj[a].discard(v)
            adj[a].update(w for w in nb if w != a)
        adj[v] = set()
    parents: List[Optional[int]] = []
    for i, v in enumerate(order):
        rest = [pos[w] for w in cliques[i] if w != v]
        parents.append(min(rest) if rest else None)
    return cliques, parents


def junction_tree(sizes: Sequence[int], scopes: Sequence[Sequence[int]],
                  order: Optional[Sequence[int]] = None,
                  evidence: Sequence[int] = ()) -> TreePlan:
    n = len(sizes)
    order = tuple(order) if order is not None else elimination_order(sizes, scopes)
    if sorted(order) != list(range(n)):
        raise ValueError("an elimination order must list every variable once")
    sets, parent = elimination_cliques(n, scopes, order)
    if not sets:  # no variables: one empty clique, which the constant factors scale
        sets, parent = [set()], [None]
    m = len(sets)

    # Merge away non-maximal cliques: when one end of a tree edge contains the other,
    # contracting the edge keeps the running intersection property.
    alive = [True] * m
    children: List[List[int]] = [[] for _ in range(m)]
    for i, p in enumerate(parent):
        if p is not None:
            children[p].append(i)
    for i in range(m):  # ascending position: each child is visited before its parent
        while alive[i] and parent[i] is not None:
            p = parent[i]
            if sets[i] <= sets[p]:
                _merge(i, into=p, parent=parent, children=children, alive=alive)
            elif sets[p] <= sets[i]:
                _merge(p, into=i, parent=parent, children=children, alive=alive)
                continue  # i has a new parent: it may contain that one too
            break

    ids = [i for i in range(m) if alive[i]]
    renum = {old: new for new, old in enumerate(ids)}
    roots = [renum[i] for i in ids if parent[i] is None]
    # one tree: component roots hang under the first root, with empty separators
    root = max(roots, key=lambda r: (len(sets[ids[r]]), -r)) if roots else 0
    par: List[Optional[int]] = [renum[parent[i]] if parent[i] is not None else None for i in ids]
    for r in roots:
        if r != root:
            par[r] = root
    kids: List[List[int]] = [[] for _ in ids]
    for c, p in enumerate(par):
        if p is not None:
            kids[p].append(c)
    variables = [tuple(sorted(sets[i])) for i in ids]
    states = [math.prod(sizes[v] for v in vs) for vs in variables]

    holding: Dict[int, List[int]] = {}
    for c, vs in enumerate(variables):
        for v in vs:
            holding.setdefault(v, []).append(c)
    home = tuple(min(holding[v], key=lambda c: (states[c], c)) for v in range(n))

    assigned: List[List[int]] = [[] for _ in ids]
    for f, scope in enumerate(scopes):
        if scope:
            cands = set(holding[scope[0]])
            for v in scope[1:]:
                cands &= set(holding[v])
            c = min(cands, key=lambda c: (states[c], c))
        else:
            c = root  # a constant factor scales Z; any clique will do
        assigned[c].append(f)
    ev: List[List[int]] = [[] for _ in ids]
    for v in sorted(set(evidence)):
        ev[home[v]].append(v)

    postorder: List[int] = []
    stack = [(root, False)]
    while stack:
        c, expanded = stack.pop()
        if expanded:
            postorder.append(c)
        else:
            stack.append((c, True))
            stack.extend((k, False) for k in reversed(kids[c]))
    cliques = tuple(Clique(c, variables[c], par[c], tuple(kids[c]), tuple(assigned[c]),
                           tuple(ev[c])) for c in range(len(ids)))
    return TreePlan(tuple(sizes), order, cliques, root, tuple(postorder), home)


def _merge(gone: int, *, into: int, parent: List[Optional[int]], children: List[List[int]],
           alive: List[bool]) -> None:
    """Contract the tree edge gone–into; `into` takes gone's other neighbours."""
    alive[gone] = False
    if parent[into] == gone:  # a child absorbs its parent: it takes the parent's place
        gp = parent[gone]
        parent[into] = gp
        if gp is not None:
            children[gp] = [into if c == gone else c for c in children[gp]]
    else:
        children[into] = [c for c in children[into] if c != gone]
    for c in children[gone]:
        if c != into:
            parent[c] = into
            children[into].append(c)
    parent[gone] = None
    children[gone] = []


def plan_tree(sizes: Sequence[int], scopes: Sequence[Sequence[int]],
              evidence: Sequence[int] = ()) -> TreePlan:
    return junction_tree(sizes, scopes, None, evidence)
