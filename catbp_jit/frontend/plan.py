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
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Clique:
    id: int
    variables: tuple[int, ...]  # variable indices, ascending: the belief's axis order
    parent: int | None
    children: tuple[int, ...]
    factors: tuple[int, ...]  # indices into the graph's factors, in graph order
    evidence: tuple[int, ...]  # variables whose evidence indicator this clique loads


@dataclass(frozen=True)
class TreePlan:
    sizes: tuple[int, ...]  # domain size per variable index
    order: tuple[int, ...]  # the elimination order
    cliques: tuple[Clique, ...]
    root: int
    postorder: tuple[int, ...]  # children before parents
    home: tuple[int, ...]  # per variable: the clique its marginal is read from
    up_separator: tuple[tuple[int, ...], ...]  # per clique: what it shares with its parent

    @property
    def preorder(self) -> tuple[int, ...]:
        return tuple(reversed(self.postorder))

    def separator(self, a: int, b: int) -> tuple[int, ...]:
        """The variables two adjacent cliques share, in ascending order."""
        if self.cliques[a].parent == b:
            return self.up_separator[a]
        if self.cliques[b].parent == a:
            return self.up_separator[b]
        raise ValueError(f"cliques {a} and {b} are not adjacent")

    def states(self, c: int) -> int:
        return math.prod(self.sizes[v] for v in self.cliques[c].variables)

    def stats(self) -> dict[str, int]:
        states = [self.states(c.id) for c in self.cliques]
        return {
            "variables": len(self.sizes),
            "cliques": len(self.cliques),
            "max_clique_variables": max(len(c.variables) for c in self.cliques),
            "max_clique_states": max(states),
            "total_states": sum(states),
            "separator_states": sum(
                math.prod(self.sizes[v] for v in self.up_separator[c.id])
                for c in self.cliques
                if c.parent is not None
            ),
        }


def interaction_graph(n: int, scopes: Sequence[Sequence[int]]) -> list[set[int]]:
    adj: list[set[int]] = [set() for _ in range(n)]
    for scope in scopes:
        for u in scope:
            adj[u].update(w for w in scope if w != u)
    return adj


@dataclass(frozen=True)
class Heuristic:
    """How a greedy run scores a variable: by its fill, the fill edges its elimination adds
    (each counted as size(a)·size(b) states when `weighted`, else as one edge), and by the
    log of the states of the clique it forms; fill first unless `weight_first`."""

    weighted: bool
    weight_first: bool = False


HEURISTICS = {
    "weighted-min-fill": Heuristic(weighted=True),
    "min-fill": Heuristic(weighted=False),
    "min-weight": Heuristic(weighted=True, weight_first=True),
}

Progress = Callable[[str], None]
PROGRESS_EVERY_S = 1.0  # how often a long greedy run reports how far it got


@dataclass(frozen=True)
class PlanLimits:
    """Caps, in states, on the junction tree's cliques: each one, and all together; None:
    no cap. A greedy run that passes one stops there instead of finishing a plan that
    would be refused."""

    max_clique_states: int | None = None
    max_total_states: int | None = None


@dataclass(frozen=True)
class GreedyRun:
    """One heuristic's greedy elimination, finished or stopped early."""

    heuristic: str
    order: tuple[int, ...]  # every variable when finished, the eliminated prefix when stopped
    total_states: int  # of the cliques formed so far: what the heuristics are compared by
    tree_states: int  # of those the junction tree keeps (not inside another): its beliefs
    largest_variables: int  # the largest clique formed so far
    largest_states: int
    stopped: str | None = None  # None, "clique" or "total" (a limit), "worse" (than the best)


class PlanLimitError(ValueError):
    """Every heuristic's order passed a limit; `run` is the one with the smallest clique."""

    def __init__(self, run: GreedyRun, limits: PlanLimits):
        self.run, self.limits = run, limits
        super().__init__(
            f"{run.heuristic} needs a clique of {run.largest_variables} variables "
            f"and {format_count(run.largest_states)} states "
            f"(over the {run.stopped} limit)"
        )


def format_count(n: int) -> str:
    """A state count for people: 7,257,600, or 3.62e75 past 10^15 (exact counts can have
    hundreds of digits)."""
    if n < 10**15:
        return f"{n:,}"
    e = int(math.log10(n))
    e += (n >= 10 ** (e + 1)) - (n < 10**e)  # log10's rounding near a power of ten
    m = n / 10**e
    if m >= 9.995:  # would print as 10.00
        m, e = m / 10, e + 1
    return f"{m:.2f}e{e}"


def elimination_order(
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    heuristic: str = "best",
    *,
    limits: PlanLimits = PlanLimits(),
    progress: Progress | None = None,
) -> tuple[int, ...]:
    """A greedy elimination order; "best" runs every heuristic and keeps the order whose
    cliques hold the fewest states in all (no single heuristic wins on every network:
    weighted min-fill on munin1 and barley, min-fill on mildew, min-weight on munin2).

    A run stops as soon as its states reach the best finished run's (it can no longer win)
    or pass `limits`; when no run finishes within the limits, PlanLimitError.
    """
    say = progress or (lambda msg: None)
    best: GreedyRun | None = None
    over: list[GreedyRun] = []
    for name in HEURISTICS if heuristic == "best" else [heuristic]:
        t0 = time.perf_counter()
        run = greedy_order(
            sizes,
            scopes,
            name,
            limits=limits,
            best_total=best.total_states if best else None,
            progress=progress,
        )
        if run.stopped is None:
            best = run
        elif run.stopped != "worse":
            over.append(run)
        say(f"{name}: {_describe(run, len(sizes))}, {time.perf_counter() - t0:.1f} s")
    if best is None:
        raise PlanLimitError(min(over, key=lambda r: (r.largest_states, r.tree_states)), limits)
    return best.order


def _describe(run: GreedyRun, n: int) -> str:
    largest = f"largest clique {run.largest_variables} variables, {format_count(run.largest_states)} states"
    if run.stopped is None:
        return f"{format_count(run.tree_states)} states in all, {largest}"
    why = {
        "worse": "no better than the best so far",
        "clique": "over the clique limit",
        "total": "over the total limit",
    }[run.stopped]
    return f"stopped after {len(run.order)}/{n} variables, {why} ({largest})"


def greedy_order(
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    heuristic: str,
    *,
    limits: PlanLimits = PlanLimits(),
    best_total: int | None = None,
    progress: Progress | None = None,
) -> GreedyRun:
    """Eliminate the lowest-scoring variable until none is left (ties: lowest index).

    Stops early when the states reach `best_total` or pass `limits`; `progress` hears how
    far it got every PROGRESS_EVERY_S seconds.
    """
    g = _Greedy(sizes, scopes, HEURISTICS[heuristic])
    n = len(sizes)
    kept = _KeptCliques(n)
    order: list[int] = []
    total = tree_total = 0
    largest = (0, 0)  # (states, variables)
    stopped: str | None = None
    t0 = last = time.perf_counter()
    for x in iter(g.pop, None):
        order.append(x)
        states = g.weight[x]
        total += states
        if kept.kept(x, g.adj[x]):
            tree_total += states
        largest = max(largest, (states, len(g.adj[x]) + 1))
        if limits.max_clique_states is not None and states > limits.max_clique_states:
            stopped = "clique"
        elif limits.max_total_states is not None and tree_total > limits.max_total_states:
            stopped = "total"
        elif best_total is not None and total >= best_total:
            stopped = "worse"  # more cliques only add states: it cannot win (ties keep the first)
        if stopped:
            break
        g.eliminate(x)
        if progress is not None:
            now = time.perf_counter()
            if now - last >= PROGRESS_EVERY_S:
                last = now
                progress(f"{heuristic} {len(order)}/{n} variables eliminated, {now - t0:.1f} s")
    return GreedyRun(heuristic, tuple(order), total, tree_total, largest[1], largest[0], stopped)


class _KeptCliques:
    """Which elimination cliques the junction tree keeps, decided as each one forms.

    C_v ({v} and its neighbours when v is eliminated) lies inside an earlier clique iff
    some u eliminated before, whose first-eliminated neighbour is v, had one more variable
    (then C_u = C_v ∪ {u}); junction_tree merges exactly those away.
    """

    def __init__(self, n: int):
        # per v: the eliminated u with v among their neighbours
        self.waiting: list[list[int]] = [[] for _ in range(n)]
        self.claimed = [False] * n  # u's first-eliminated neighbour has come
        self.length = [0] * n

    def kept(self, v: int, neighbours: set[int]) -> bool:
        k = len(neighbours) + 1
        inside = False
        for u in self.waiting[v]:
            if not self.claimed[u]:
                self.claimed[u] = True
                inside = inside or self.length[u] == k + 1
        self.waiting[v] = []
        self.length[v] = k
        for w in neighbours:
            self.waiting[w].append(v)
        return not inside


class _Greedy:
    """The interaction graph under elimination, with every variable's score kept current.

    Scores change by deltas: eliminating x changes only x's neighbours (they lose x and
    gain the fill edges among them) and the common neighbours of each fill edge's ends (a
    missing pair in their neighbourhood became an edge). A hub with thousands of neighbours
    then costs O(1) per eliminated leaf, where rescoring it would cost O(degree²).

    The log weight is summed over the neighbour set in its iteration order, as the planner
    always has: ties between equal weights then fall the same way, so plans do not change.
    The sets are updated in the same order for that reason. The sum is taken lazily, when
    the variable reaches the top of the heap: until then its key holds a lower bound from
    the exact weight, so a hub is summed once, not after every leaf.
    """

    def __init__(self, sizes: Sequence[int], scopes: Sequence[Sequence[int]], heuristic: Heuristic):
        self.weight_first = heuristic.weight_first
        n = len(sizes)
        self.size = size = list(sizes)
        # a fill edge (a, b) counts unit[a]·unit[b]
        self.unit = list(sizes) if heuristic.weighted else [1] * n
        self.same_unit = self.unit[0] if len(set(self.unit)) == 1 else None
        self.log_size = [math.log(s) for s in size]
        self.adj = adj = interaction_graph(n, scopes)
        self.usum = [self._unit_sum(nb) for nb in adj]  # Σ unit over the neighbours
        self.weight = [s * math.prod(map(size.__getitem__, nb)) for s, nb in zip(size, adj)]
        self.log_weight: list[float | None] = [None] * n  # None: not summed yet
        self.fill = [self._fill_of(nb) for nb in adj]
        # the same key objects: a heap entry is current while it `is` current[v]
        self.heap: list[tuple] = [self._key(v) for v in range(n)]
        self.current: list[tuple | None] = list(self.heap)
        heapq.heapify(self.heap)

    def _unit_sum(self, vs: set[int]) -> int:
        if self.same_unit is not None:  # every variable alike (min-fill; binary models)
            return len(vs) * self.same_unit
        return sum(map(self.unit.__getitem__, vs))

    def _fill_of(self, nb: set[int]) -> int:
        """A neighbourhood's fill: all its pairs less its edges, O(degree) set intersections."""
        unit, adj = self.unit, self.adj
        edges = 0  # each edge among the neighbours is seen from both ends
        for a in nb:
            common = nb & adj[a]
            if common:
                edges += unit[a] * self._unit_sum(common)
        total = self._unit_sum(nb)
        pairs = (total * total - sum(unit[a] * unit[a] for a in nb)) // 2
        return pairs - edges // 2

    def _key(self, v: int) -> tuple:
        log_w = self.log_weight[v]
        if log_w is None:  # below the sum's float value, whatever its rounding
            log_w = math.log(self.weight[v]) * (1 - 1e-9) - 1e-9
        return (log_w, self.fill[v], v) if self.weight_first else (self.fill[v], log_w, v)

    def pop(self) -> int | None:
        """The variable with the lowest score, or None when all are eliminated."""
        heap, current = self.heap, self.current
        while heap:
            entry = heapq.heappop(heap)
            v = entry[-1]
            if entry is not current[v]:
                continue  # stale, or v is eliminated
            if self.log_weight[v] is None:  # a lower bound: sum it, then compare again
                log_size = self.log_size
                self.log_weight[v] = log_size[v] + sum(map(log_size.__getitem__, self.adj[v]))
                current[v] = self._key(v)
                heapq.heappush(heap, current[v])
                continue
            current[v] = None
            return v
        return None

    def eliminate(self, x: int) -> None:
        unit, adj, usum, fill, weight = self.unit, self.adj, self.usum, self.fill, self.weight
        nb = adj[x]
        ux, sx = unit[x], self.size[x]
        for a in nb:  # a loses x: pairs (x, b) for b outside x's neighbourhood were missing
            na = adj[a]
            na.discard(x)
            usum[a] -= ux
            fill[a] -= ux * (usum[a] - self._unit_sum(na & nb))
            weight[a] //= sx
        # x's neighbours become a clique, each set gaining them in nb's order; the pair
        # (a, b) in a common neighbour's neighbourhood stops being missing: counted by
        # a fill edge's units, then subtracted once per common neighbour
        closed: dict[int, Counter] = {}
        for a in nb:
            na = adj[a]
            new = nb - na
            new.discard(a)
            if not new:
                continue
            for b in nb:
                if b not in new:
                    continue
                nbb = adj[b]
                common = na & nbb
                common_units = self._unit_sum(common)
                fill[a] += unit[b] * (usum[a] - common_units)
                fill[b] += unit[a] * (usum[b] - common_units)
                if common:
                    pair = unit[a] * unit[b]
                    counts = closed.get(pair)
                    if counts is None:
                        counts = closed[pair] = Counter()
                    counts.update(common)  # counted in C, not a Python loop per neighbour
                na.add(b)
                nbb.add(a)
                usum[a] += unit[b]
                usum[b] += unit[a]
                weight[a] *= self.size[b]
                weight[b] *= self.size[a]
        adj[x] = set()
        changed = set(nb)
        for pair, counts in closed.items():
            for c, k in counts.items():
                fill[c] -= pair * k
            changed.update(counts)
        for a in nb:
            self.log_weight[a] = None  # its set changed, and with it the sum
        for a in changed:
            key = self._key(a)
            if key != self.current[a]:
                self.current[a] = key
                heapq.heappush(self.heap, key)


def elimination_cliques(
    n: int, scopes: Sequence[Sequence[int]], order: Sequence[int]
) -> tuple[list[set[int]], list[int | None]]:
    """The clique each elimination forms and its parent (by position in `order`)."""
    adj = interaction_graph(n, scopes)
    pos = {v: i for i, v in enumerate(order)}
    cliques: list[set[int]] = []
    for v in order:
        nb = adj[v]
        cliques.append({v} | nb)
        for a in nb:
            adj[a].discard(v)
            adj[a].update(w for w in nb if w != a)
        adj[v] = set()
    parents: list[int | None] = []
    for i, v in enumerate(order):
        rest = [pos[w] for w in cliques[i] if w != v]
        parents.append(min(rest) if rest else None)
    return cliques, parents


def junction_tree(
    sizes: Sequence[int],
    scopes: Sequence[Sequence[int]],
    order: Sequence[int] | None = None,
    evidence: Sequence[int] = (),
) -> TreePlan:
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
    children: list[set[int]] = [set() for _ in range(m)]  # sets: a hub has thousands
    for i, p in enumerate(parent):
        if p is not None:
            children[p].add(i)
    for i in range(m):  # ascending position: each child is visited before its parent
        while alive[i]:
            p = parent[i]
            if p is None:
                break
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
    par: list[int | None] = [None if (q := parent[i]) is None else renum[q] for i in ids]
    for r in roots:
        if r != root:
            par[r] = root
    kids: list[list[int]] = [[] for _ in ids]
    for c, p in enumerate(par):
        if p is not None:
            kids[p].append(c)
    variables = [tuple(sorted(sets[i])) for i in ids]
    states = [math.prod(sizes[v] for v in vs) for vs in variables]

    holding: dict[int, list[int]] = {}
    for c, vs in enumerate(variables):
        for v in vs:
            holding.setdefault(v, []).append(c)
    home = tuple(min(holding[v], key=lambda c: (states[c], c)) for v in range(n))

    assigned: list[list[int]] = [[] for _ in ids]
    members = [set(vs) for vs in variables]
    for f, scope in enumerate(scopes):
        if scope:
            # the cliques holding the scope, from its rarest variable's (a hub is in thousands)
            rarest = min(scope, key=lambda v: len(holding[v]))
            cands = [c for c in holding[rarest] if members[c].issuperset(scope)]
            c = min(cands, key=lambda c: (states[c], c))
        else:
            c = root  # a constant factor scales Z; any clique will do
        assigned[c].append(f)
    ev: list[list[int]] = [[] for _ in ids]
    for v in sorted(set(evidence)):
        ev[home[v]].append(v)

    postorder: list[int] = []
    stack = [(root, False)]
    while stack:
        c, expanded = stack.pop()
        if expanded:
            postorder.append(c)
        else:
            stack.append((c, True))
            stack.extend((k, False) for k in reversed(kids[c]))
    cliques = tuple(
        Clique(c, variables[c], par[c], tuple(kids[c]), tuple(assigned[c]), tuple(ev[c]))
        for c in range(len(ids))
    )
    separators = tuple(() if p is None else _shared(variables[c], variables[p]) for c, p in enumerate(par))
    return TreePlan(tuple(sizes), order, cliques, root, tuple(postorder), home, separators)


def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    vb = set(b)
    return tuple(v for v in a if v in vb)


def _merge(
    gone: int, *, into: int, parent: list[int | None], children: list[set[int]], alive: list[bool]
) -> None:
    """Contract the tree edge gone–into; `into` takes gone's other neighbours."""
    alive[gone] = False
    if parent[into] == gone:  # a child absorbs its parent: it takes the parent's place
        gp = parent[gone]
        parent[into] = gp
        if gp is not None:
            children[gp].discard(gone)
            children[gp].add(into)
    else:
        children[into].discard(gone)
    for c in children[gone]:
        if c != into:
            parent[c] = into
            children[into].add(c)
    parent[gone] = None
    children[gone] = set()


def plan_tree(
    sizes: Sequence[int], scopes: Sequence[Sequence[int]], evidence: Sequence[int] = ()
) -> TreePlan:
    return junction_tree(sizes, scopes, None, evidence)
