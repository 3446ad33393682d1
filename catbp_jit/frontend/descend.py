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

import numpy as np

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
