"""Reassociation (opt-in, PlanOptions.exact=False): a segment becomes a contraction path.

A fused segment computes ⊕_r leaf_0 ⊗ ... ⊗ leaf_k over its whole loop space, every
leaf at every point. When some reduced axis is used by few leaves, that is far more work
than needed: the semiring laws (⊗ associative and commutative, ⊗ distributing over ⊕)
allow summing an axis out as soon as no remaining operand nor the output needs it. This
pass turns such a segment into a sequence of pairwise segments (1 or 2 leaves each) in
the order a path optimizer (opt_einsum) finds; the intermediates are new "computed"
values, so the memory planner puts them in workspace arenas and frees them after use.

What it changes: the order of ⊗ and ⊕. For PROB and LOGPROB that changes rounding only
(results differ from exact mode within the tolerances of docs/ir.md, never bit-identical);
SAT (booleans) and COUNT (int64, a ring modulo 2^64 even when it wraps) are exact. What
it keeps: each segment's output, spec and value id, slot results, NORMALIZE (on the final
segment), and a batch axis (ir/batch.py) innermost in every intermediate. Paths are
chosen with a batch axis counted as size 1, so every bucket of a batched executable, and
the unbatched program, regroup alike.

A segment is left alone when its path would cost as much as the fused loop or more (work
counted as loop-space elements x leaves, as plan/schedule.py does, plus the elements each
step writes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

import opt_einsum

from ..ir.schema import TensorSpec
from ..semiring import semiring
from .fusion import Fused, Segment

OPTIMAL_MAX_LEAVES = 4  # opt_einsum's exhaustive search is cheap up to here; dp beyond
# ... unless an axis is shared by more operands than this: dp's subsets of operands joined
# by one axis all connect, 3-5x its time per operand more (operands sharing a summed axis:
# 0.6 s for 11, 9 minutes for 16, a compile stalled); opt_einsum's greedy then
DP_MAX_SHARING = 10
# LOGPROB's ⊕ takes an exp per term (the loop kernels' logsumexp): about as much time as
# this many leaf reads and ⊗s, so splitting must save exps too, not only products
EXP_COST = 8


@dataclass(frozen=True)
class Operand:
    value: int
    keys: frozenset[tuple]  # its axes of size > 1 in the segment's loop space


def reassociate(fused: Fused, batch_key: tuple | None = None) -> Fused:
    """`fused` with every segment that pays split into pairwise segments (pure: the
    argument is not modified)."""
    next_id = max(list(fused.specs) + [s.out for s in fused.segments], default=-1) + 1
    segments: list[Segment] = []
    specs, kinds = dict(fused.specs), dict(fused.kinds)
    # an intermediate computed again by a later segment (two messages summing the same
    # belief's private axes out) is computed once: (leaves, spec, reduced axes) -> value
    made: dict[tuple, int] = {}
    # A workspace value is laid out later (plan/layout.py) with its reducing reader's kept
    # axes outermost: its private axes come innermost when it has one reader. Inputs,
    # constants and slot results are stored in their spec's order; a workspace value
    # with several readers suits one of them only (both are then left in the product).
    outputs = set(fused.outputs.values())
    readers = Counter(leaf for seg in fused.segments for leaf in set(seg.leaves))
    workspace = {v for v, kind in fused.kinds.items() if kind == "computed" and v not in outputs}
    free = {v for v in workspace if readers[v] == 1} | _summed_alike(fused, workspace)
    for seg in fused.segments:
        steps = contraction_steps(
            seg,
            fused.specs,
            batch_key,
            next_id,
            EXP_COST if semiring(fused.semiring).is_log else 0,
            free,
            workspace - free,
        )
        if steps is None:
            segments.append(seg)
            continue
        next_id += len(steps) - 1
        same: dict[int, int] = {}
        for step in steps:
            step = replace(step, leaves=tuple(same.get(v, v) for v in step.leaves))
            key = (step.leaves, step.out_spec, frozenset(ax.key for ax in step.red_axes))
            if step.out != seg.out and key in made:
                same[step.out] = made[key]
                continue
            if step.out != seg.out:
                made[key] = step.out
                specs[step.out], kinds[step.out] = step.out_spec, "computed"
            segments.append(step)
    return replace(fused, segments=segments, specs=specs, kinds=kinds)


def _summed_alike(fused: Fused, workspace: AbstractSet[int]) -> set[int]:
    """Workspace values whose readers all sum out the same axes that only the value has
    (grid5_d3: a clique's 115 MB belief, read by three messages that each drop its three
    private axes). Those sums are the same segment in every reader's path (`made` above)
    and so its one reader, which plan/layout.py lays the value out for: they may run
    alone like a value with one reader's (3 sums of 14.3 M terms become one)."""
    own: dict[int, set[frozenset]] = {}
    for seg in fused.segments:
        space = {ax.key for ax in tuple(seg.out_spec.axes) + tuple(seg.red_axes) if ax.size > 1}
        out = {ax.key for ax in seg.out_spec.axes if ax.size > 1}
        keys = [frozenset(ax.key for ax in fused.specs[leaf].axes if ax.key in space) for leaf in seg.leaves]
        for i, leaf in enumerate(seg.leaves):
            if leaf in workspace:
                others = out.union(*(k for j, k in enumerate(keys) if j != i))
                alone = keys[i] - others if seg.leaves.count(leaf) == 1 else frozenset()
                own.setdefault(leaf, set()).add(alone)
    return {v for v, sets in own.items() if len(sets) == 1 and next(iter(sets))}


def contraction_steps(
    seg: Segment,
    specs: dict[int, TensorSpec],
    batch_key: tuple | None,
    first_id: int,
    exp_cost: int = 0,
    free: AbstractSet[int] = frozenset(),
    unknown: AbstractSet[int] = frozenset(),
) -> list[Segment] | None:
    """The pairwise segments computing `seg` (intermediates numbered from first_id), or
    None when the fused segment is as cheap."""
    space = [ax for ax in tuple(seg.out_spec.axes) + tuple(seg.red_axes) if ax.size > 1]
    axis = {ax.key: ax for ax in space}
    operands = [
        Operand(leaf, frozenset(ax.key for ax in specs[leaf].axes if ax.size > 1 and ax.key in axis))
        for leaf in seg.leaves
    ]
    if len(operands) < 2:
        return None
    # axes no leaf has (the product is broadcast over them: an output axis, or a reduced
    # one, whose sum counts each term once per position) are the last step's
    broadcast = frozenset(axis) - frozenset().union(*(op.keys for op in operands))
    out_axes = frozenset(ax.key for ax in seg.out_spec.axes if ax.size > 1)
    out_keys = out_axes - broadcast
    # the batch axis is in every batched value and never reduced: size 1 for choosing
    size = {k: (1 if k == batch_key else ax.size) for k, ax in axis.items()}
    order = [ax.key for ax in space]  # intermediates list their axes in this order
    # A leaf's own axes are summed out alone only when they are stored innermost (else
    # each sum gathers its terms from far apart, twice for LOGPROB: seen 3-4x slower than
    # carrying them into the first product); `free` values get such a layout, the
    # layout of `unknown` ones is not known yet.
    inner = [
        op.value in free
        or (op.value not in unknown and _innermost(specs[op.value], i, out_keys, operands, batch_key))
        for i, op in enumerate(operands)
    ]
    plan = pairwise_plan([op.keys for op in operands], out_keys, size, inner)
    last = replace(plan[-1], used=plan[-1].used | broadcast, kept=out_axes)
    fused_work = loop_work(order, out_axes, len(operands), size, exp_cost)
    if plan_work(plan[:-1] + [last], size, exp_cost) >= fused_work:
        return None

    steps: list[Segment] = []
    pending = list(operands)
    for n, st in enumerate(plan):
        ins = [pending[i] for i in st.picked]
        pending = [op for i, op in enumerate(pending) if i not in st.picked]
        kept = st.kept
        used = st.used | broadcast if n == len(plan) - 1 else st.used
        red = tuple(axis[k] for k in order if k in used and k not in kept and k not in out_axes)
        leaves = tuple(op.value for op in ins)
        if n == len(plan) - 1:  # the segment's own output, spec and NORMALIZE
            size1 = tuple(ax for ax in seg.red_axes if ax.size == 1)
            steps.append(
                Segment(
                    seg.out,
                    seg.out_spec,
                    red + size1,
                    leaves,
                    seg.reduce or bool(red),
                    seg.normalize,
                    seg.nodes,
                )
            )
            continue
        keys = [k for k in order if k in kept and k != batch_key]
        keys += [batch_key] if batch_key in kept else []  # innermost, as ir/batch.py has it
        spec = TensorSpec(tuple(axis[k] for k in keys))
        value = first_id + n
        steps.append(Segment(value, spec, red, leaves, bool(red), False, seg.nodes))
        pending.append(Operand(value, kept))
    return steps


@dataclass(frozen=True)
class PairStep:
    picked: tuple[int, ...]  # positions in the pending list; the result goes to its end
    used: frozenset[tuple]  # the step's loop space
    kept: frozenset[tuple]  # its output: the axes a later operand or the output needs


def _innermost(
    spec: TensorSpec,
    i: int,
    out_keys: frozenset[tuple],
    operands: Sequence[Operand],
    batch_key: tuple | None = None,
) -> bool:
    """Whether the axes only operand i has are its last stored axes, the batch axis aside:
    it is stored last in every batched value (ir/batch.py), and counting it would make a
    batched bucket regroup otherwise than the unbatched program (other rounding)."""
    keys = operands[i].keys
    own = keys - out_keys.union(*(op.keys for j, op in enumerate(operands) if j != i))
    stored = [ax.key for ax in spec.axes if ax.key in keys and ax.key != batch_key]
    return set(stored[len(stored) - len(own) :]) == own


def pairwise_plan(
    operands: Sequence[frozenset[tuple]],
    out_keys: frozenset[tuple],
    size: dict[tuple, int],
    alone: Sequence[bool] | None = None,
) -> list[PairStep]:
    """The steps combining operands (their keys) into the output, as opt_einsum's paths
    read: each step removes the operands it picks and appends its result. First, each
    operand's axes nobody else uses are summed out on their own (cheaper than carrying
    them into a product), for the operands `alone` allows (default: all)."""
    steps: list[PairStep] = []
    pending = list(operands)
    for i, keys in enumerate(operands):
        others = out_keys.union(*(k for j, k in enumerate(operands) if j != i))
        if keys - others and (alone is None or alone[i]):
            at = pending.index(keys)
            steps.append(PairStep((at,), keys, keys & others))
            pending = pending[:at] + pending[at + 1 :] + [keys & others]
    symbol = {k: opt_einsum.get_symbol(i) for i, k in enumerate(size)}
    inputs = [frozenset(symbol[k] for k in keys) for keys in pending]
    output = frozenset(symbol[k] for k in out_keys)
    sizes = {symbol[k]: n for k, n in size.items()}
    for picked in path_finder(inputs)(inputs, output, sizes):
        picked = tuple(sorted(picked))
        rest = [keys for i, keys in enumerate(pending) if i not in picked]
        used = frozenset().union(*(pending[i] for i in picked))
        steps.append(PairStep(picked, used, used & out_keys.union(*rest)))
        pending = rest + [steps[-1].kept]
    return steps


def path_finder(inputs: Sequence[frozenset]) -> Callable:
    """The opt_einsum path function for these operands (their axes): the exhaustive search
    for a few, dynamic programming for more, greedy where one axis joins too many."""
    if len(inputs) <= OPTIMAL_MAX_LEAVES:
        return opt_einsum.paths.optimal
    sharing = max(Counter(k for keys in inputs for k in keys).values(), default=0)
    return opt_einsum.paths.dynamic_programming if sharing <= DP_MAX_SHARING else opt_einsum.paths.greedy


def plan_work(steps: Sequence[PairStep], size: dict[tuple, int], exp_cost: int = 0) -> int:
    """Loop-space elements x leaves, plus the elements written, plus exp_cost per term
    of a sum, summed over the steps (an intermediate as large as the output costs its
    write and its read again: a product without sums rarely pays to split)."""
    return sum(loop_work(st.used, st.kept, len(st.picked), size, exp_cost) for st in steps)


def loop_work(keys, out_keys, leaves: int, size: dict[tuple, int], exp_cost: int = 0) -> int:
    """The same count for one loop over `keys` writing `out_keys`."""
    sums = exp_cost if set(keys) - set(out_keys) else 0
    return _space(keys, size) * (leaves + sums) + _space(out_keys, size)


def _space(keys, size: dict[tuple, int]) -> int:
    n = 1
    for k in keys:
        n *= size[k]
    return n
