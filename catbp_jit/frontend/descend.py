"""Choose every variable's state by a pass down the junction tree, root first.

After the upward and downward passes, clique a's belief is, for each assignment of its
variables, the best (MAXLOG) or the total (LOGPROB) weight of the whole model with those
variables fixed. So the root's variables are chosen from the root's belief, and each
later clique's remaining variables from its belief restricted to what its parent chose:
the variables it shares with the tree above it are exactly its separator (the running
intersection property), and the parent's message is constant once they are fixed.
Choosing the best entry each time gives a most probable assignment (MPE); drawing an
entry in proportion to its weight gives an exact sample of the posterior.

Everything is vectorized over rows: evidence rows (MPE in a batch) or samples. A belief
holds one row per evidence row, or a single row shared by all (one evidence set, many
samples). `choose(values)` takes (rows, entries) log weights and returns each row's entry.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from numba import njit

from .plan import TreePlan

Choose = Callable[[np.ndarray], np.ndarray]

# the largest (rows x entries) block of restricted beliefs one step gathers at once
BLOCK_ELEMENTS = 1 << 22


def descend(plan: TreePlan, beliefs: Mapping[int, np.ndarray], n: int, choose: Choose) -> np.ndarray:
    """States (n, variables) chosen clique by clique in preorder. beliefs[a]: clique a's log
    belief, shape (n or 1, *its variables' sizes), axes in clique.variables order."""
    states = np.zeros((n, len(plan.sizes)), dtype=np.int64)
    chosen = np.zeros(len(plan.sizes), dtype=bool)
    for a in plan.preorder:
        variables = plan.cliques[a].variables
        fixed = [i for i, v in enumerate(variables) if chosen[v]]
        free = [i for i, v in enumerate(variables) if not chosen[v]]
        if not free:
            continue
        shape = [plan.sizes[v] for v in variables]
        belief = beliefs[a].reshape(-1, *shape)
        # fixed axes first: row s of the (S, R) matrix is one separator assignment
        moved = np.transpose(belief, [0] + [1 + i for i in fixed] + [1 + i for i in free])
        entries = math.prod(shape[i] for i in free)
        matrix = moved.reshape(len(belief), -1, entries)
        if fixed:
            given = tuple(states[:, variables[i]] for i in fixed)
            row = np.ravel_multi_index(given, tuple(shape[i] for i in fixed))
        else:
            row = np.zeros(n, dtype=np.int64)
        which = np.arange(n) if len(belief) == n else np.zeros(n, dtype=np.int64)
        picked = np.empty(n, dtype=np.int64)
        block = max(1, BLOCK_ELEMENTS // entries)
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            picked[lo:hi] = choose(matrix[which[lo:hi], row[lo:hi]])
        for i, states_i in zip(free, np.unravel_index(picked, tuple(shape[i] for i in free))):
            states[:, variables[i]] = states_i
        chosen[[variables[i] for i in free]] = True
    return states


def argmax(values: np.ndarray) -> np.ndarray:
    """The best entry of each row; of equals, the first (the lowest states, read in the
    clique's variable order)."""
    return np.argmax(values, axis=1)


def sampler(rng: np.random.Generator) -> Choose:
    """Draws each row's entry with probability proportional to exp(value): inverse CDF on
    the row's weights, shifted by its largest value so that none overflows. An entry of
    weight 0 is never drawn."""

    def draw(values: np.ndarray) -> np.ndarray:
        top = values.max(axis=1, keepdims=True)
        with np.errstate(invalid="ignore"):
            weights = np.exp(values - np.where(np.isfinite(top), top, 0.0))
        cumulative = np.cumsum(weights, axis=1)
        total = cumulative[:, -1:]
        target = rng.random((len(values), 1)) * total
        # the first entry whose cumulative weight passes the target has weight > 0
        picked = (cumulative <= target).sum(axis=1)
        # target can round up to the total: then the last entry of weight > 0
        last = weights.shape[1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
        return np.where(picked < weights.shape[1], picked, last)

    return draw


@dataclass(frozen=True)
class Walk:
    """The pass down the tree for one row, as flat arrays that a compiled loop walks over
    the beliefs where a run left them (a session's buffer): no Python per clique, which on
    a model of hundreds of small cliques would cost more than the run itself."""

    offsets: np.ndarray  # per clique, in preorder: where its belief starts in the buffer
    starts: np.ndarray  # clique k's variables are entries starts[k]:starts[k+1] below
    variables: np.ndarray  # in the clique's axis order
    strides: np.ndarray  # each variable's stride in the belief (elements)
    free: np.ndarray  # 1 where the clique chooses the variable (no earlier clique did)
    sizes: np.ndarray  # per variable: its domain size

    def best(self, buffer: np.ndarray) -> tuple[np.ndarray, float]:
        """Every variable's state, each clique's best entry given what is chosen (ties: the
        first, as argmax), and the root's best value (-inf: nothing is possible)."""
        states = np.zeros(len(self.sizes), dtype=np.int64)
        top = _best_states(
            buffer, self.offsets, self.starts, self.variables, self.strides, self.free, self.sizes, states
        )
        return states, float(top)


def walk(plan: TreePlan, offsets: Mapping[int, int], layouts: Mapping[int, tuple[int, ...]]) -> Walk:
    """The Walk of a plan whose clique a's belief starts at offsets[a], in C order over the
    variables layouts[a]. Entries are visited in the order of clique.variables (so ties go
    as in descend), whatever the layout."""
    starts: list[int] = [0]
    variables: list[int] = []
    strides: list[int] = []
    free: list[int] = []
    chosen = np.zeros(len(plan.sizes), dtype=bool)
    for a in plan.preorder:
        vs = plan.cliques[a].variables
        layout = layouts[a]
        if sorted(layout) != sorted(vs):
            raise ValueError(f"clique {a}: a belief over {layout}, the clique holds {vs}")
        shape = [plan.sizes[v] for v in layout]
        stride = {v: math.prod(shape[i + 1 :]) for i, v in enumerate(layout)}
        strides += [stride[v] for v in vs]
        variables += vs
        free += [0 if chosen[v] else 1 for v in vs]
        chosen[list(vs)] = True
        starts.append(len(variables))
    return Walk(
        np.array([offsets[a] for a in plan.preorder], dtype=np.int64),
        np.array(starts, dtype=np.int64),
        np.array(variables, dtype=np.int64),
        np.array(strides, dtype=np.int64),
        np.array(free, dtype=np.int64),
        np.array(plan.sizes, dtype=np.int64),
    )


@njit(cache=True, nogil=True)
def _best_states(buffer, offsets, starts, variables, strides, free, sizes, states):  # pragma: no cover
    counter = np.zeros(len(variables), dtype=np.int64)
    best_counter = np.zeros(len(variables), dtype=np.int64)
    top = -np.inf
    for k in range(len(offsets)):
        lo, hi = starts[k], starts[k + 1]
        at = offsets[k]
        n = 1
        for j in range(lo, hi):
            if free[j]:
                n *= sizes[variables[j]]
                counter[j] = 0
            else:
                at += states[variables[j]] * strides[j]
        best = -np.inf
        for t in range(n):
            value = buffer[at]
            if t == 0 or value > best:
                best = value
                for j in range(lo, hi):
                    best_counter[j] = counter[j]
            # the next entry: the odometer over the free variables, the last fastest
            j = hi - 1
            while j >= lo:
                if free[j]:
                    counter[j] += 1
                    at += strides[j]
                    if counter[j] < sizes[variables[j]]:
                        break
                    at -= strides[j] * counter[j]
                    counter[j] = 0
                j -= 1
        for j in range(lo, hi):
            if free[j]:
                states[variables[j]] = best_counter[j]
        if k == 0:
            top = best
    return top
