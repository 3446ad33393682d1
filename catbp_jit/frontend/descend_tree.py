"""Choose every variable's state down a contraction tree: MPE from the upward pass alone.

A contraction tree's upward program (emit_tree.py) computes, at each internal node n,
t_n = max over e(n) of (a ⊗ b), a and b its children's tensors and e(n) the variables it
eliminates (its children's variables that it does not keep). In MAXLOG ⊗ is +, so once
the variables n keeps are chosen (by the nodes above it; the root keeps none), the best
e(n) is the one where a + b reaches t_n: computed again here from the same two operands
in the same order, so the same bits, and the first such entry taken (ties: the lowest
states of e(n), in ascending variable order). Then every variable of a and b is chosen,
and each child that is itself a contraction does the same. Every variable is eliminated
at exactly one node, so each is chosen once.

The operands are read where they are: an internal node's tensor in the session's buffer
(the ("t", n) slot the upward program stores, in its own layout), a leaf (a factor, an
evidence indicator, a variable's unit) in a buffer of the tables as the program loads
them, refreshed with the evidence of each call. One compiled loop walks every node.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numba import njit

from .contraction import ContractionTree

IN_RUN, IN_LEAVES = 0, 1  # where an operand lies: the run's buffer, or the leaves' buffer


@dataclass(frozen=True)
class TreeWalk:
    starts: np.ndarray  # node k (root first) loops over entries starts[k]:starts[k+1] below
    variables: np.ndarray  # its loop variables, ascending
    free: np.ndarray  # 1 where node k chooses the variable (it eliminates it)
    strides: np.ndarray  # (entries, 2): the variable's stride in each operand (0: absent)
    sources: np.ndarray  # (nodes, 2): IN_RUN or IN_LEAVES, per operand
    offsets: np.ndarray  # (nodes, 2): where each operand starts in its buffer
    sizes: np.ndarray  # per variable: its domain size
    leaves: np.ndarray  # the leaves' tables, one after another (element 0: a spare zero)
    leaf_at: dict[int, tuple[int, int]]  # factor id (as the programs load it) -> its range in leaves

    def refresh(self, values: Mapping[int, np.ndarray]) -> None:
        """The tables of this call (evidence indicators, cut factors) into the leaves."""
        for f, a in values.items():
            if f in self.leaf_at:
                lo, hi = self.leaf_at[f]
                self.leaves[lo:hi] = np.ravel(a)

    def best(self, buffer: np.ndarray) -> tuple[np.ndarray, float]:
        """Every variable's state and the root's best value (-inf: nothing is possible)."""
        states = np.zeros(len(self.sizes), dtype=np.int64)
        top = _walk(
            buffer,
            self.leaves,
            self.starts,
            self.variables,
            self.free,
            self.strides,
            self.sources,
            self.offsets,
            self.sizes,
            states,
        )
        return states, float(top)


def tree_walk(
    tree: ContractionTree,
    offsets: Mapping[int, int],
    layouts: Mapping[int, tuple[int, ...]],
    leaf_ids: Mapping[int, int],
    leaf_layouts: Mapping[int, tuple[int, ...]],
    values: Mapping[int, np.ndarray],
    dtype: np.dtype,
) -> TreeWalk:
    """The walk of a tree whose internal node n's tensor starts at offsets[n] in the run's
    buffer, C order over layouts[n]; leaf node n loads factor leaf_ids[n] (absent: a unit),
    whose table values[f] is C order over leaf_layouts[n] (values absent: refreshed per
    call)."""
    parts: list[np.ndarray] = [np.zeros(1, dtype=dtype)]  # (the spare zero)
    at = 1
    place: dict[int, tuple[int, int, tuple[int, ...]]] = {}  # leaf node -> (source, offset, layout)
    leaf_at: dict[int, tuple[int, int]] = {}
    for node in tree.nodes:
        if node.children:
            continue
        f = leaf_ids.get(node.id)
        # a unit's log is 0; so is an indicator's until a call's evidence is refreshed in
        table = np.zeros(tree.states(node.id), dtype=dtype)
        if f is not None and f in values:
            table = np.ravel(values[f]).astype(dtype)
        parts.append(table)
        if f is not None:
            leaf_at[f] = (at, at + table.size)
        # (a leaf node lists its variables sorted; its table keeps the factor's own order)
        place[node.id] = (IN_LEAVES, at, leaf_layouts.get(node.id, node.variables))
        at += table.size
    for n, layout in layouts.items():
        place[n] = (IN_RUN, offsets[n], layout)

    def strides(n: int) -> dict[int, int]:
        layout = place[n][2]
        shape = [tree.sizes[v] for v in layout]
        return {v: math.prod(shape[i + 1 :]) for i, v in enumerate(layout)}

    starts: list[int] = [0]
    variables: list[int] = []
    free: list[int] = []
    stride_rows: list[tuple[int, int]] = []
    sources: list[tuple[int, int]] = []
    starts_at: list[tuple[int, int]] = []
    chosen = np.zeros(len(tree.sizes), dtype=bool)
    internal = [n for n in reversed(tree.internal)]  # root first: parents before children
    # per node: its loop variables and its two operands (a single tensor: the root is a
    # leaf, its own only operand, the other the spare zero)
    internal_ops: list[tuple[tuple[int, ...], tuple[int, int | None]]]
    if not internal:
        internal_ops = [(tree.nodes[tree.root].variables, (tree.root, None))]
    else:
        internal_ops = [(tree.loop_variables(n.id), (n.children[0], n.children[1])) for n in internal]
    for loop, operands in internal_ops:
        a, b = operands
        sa = strides(a)
        sb: dict[int, int] = strides(b) if b is not None else {}
        for v in loop:
            variables.append(v)
            free.append(0 if chosen[v] else 1)
            stride_rows.append((sa.get(v, 0), sb.get(v, 0)))
        chosen[list(loop)] = True
        starts.append(len(variables))
        sources.append((place[a][0], place[b][0] if b is not None else IN_LEAVES))
        starts_at.append((place[a][1], place[b][1] if b is not None else 0))
    as_int = lambda x, shape=None: np.array(x, dtype=np.int64).reshape(shape or -1)  # noqa: E731
    return TreeWalk(
        as_int(starts),
        as_int(variables),
        as_int(free),
        as_int(stride_rows, (-1, 2)),
        as_int(sources, (-1, 2)),
        as_int(starts_at, (-1, 2)),
        as_int(tree.sizes),
        np.concatenate(parts),
        leaf_at,
    )


@njit(cache=True, nogil=True)
def _walk(run, leaves, starts, variables, free, strides, sources, offsets, sizes, states):  # pragma: no cover
    counter = np.zeros(len(variables), dtype=np.int64)
    best_counter = np.zeros(len(variables), dtype=np.int64)
    top = -np.inf
    for k in range(len(starts) - 1):
        lo, hi = starts[k], starts[k + 1]
        at_a, at_b = offsets[k, 0], offsets[k, 1]
        n = 1
        for j in range(lo, hi):
            if free[j]:
                n *= sizes[variables[j]]
                counter[j] = 0
            else:
                at_a += states[variables[j]] * strides[j, 0]
                at_b += states[variables[j]] * strides[j, 1]
        best = -np.inf
        for t in range(n):
            a = run[at_a] if sources[k, 0] == 0 else leaves[at_a]
            b = run[at_b] if sources[k, 1] == 0 else leaves[at_b]
            value = a + b
            if t == 0 or value > best:
                best = value
                for j in range(lo, hi):
                    best_counter[j] = counter[j]
            j = hi - 1  # the next entry: an odometer over the free variables, the last fastest
            while j >= lo:
                if free[j]:
                    counter[j] += 1
                    at_a += strides[j, 0]
                    at_b += strides[j, 1]
                    if counter[j] < sizes[variables[j]]:
                        break
                    at_a -= strides[j, 0] * counter[j]
                    at_b -= strides[j, 1] * counter[j]
                    counter[j] = 0
                j -= 1
        for j in range(lo, hi):
            if free[j]:
                states[variables[j]] = best_counter[j]
        if k == 0:
            top = best
    return top
