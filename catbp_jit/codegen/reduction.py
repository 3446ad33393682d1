"""⊕ over a segment's reduced axes, as kernel source: one template for both targets.

The targets differ only in how they walk the terms (`sweep`: the CPU's odometer with
counters in P, a GPU thread's div/mod), in how a float literal is typed (CUDA types them:
under its simulator a Python 0.0 plus a float32 would stay float32) and in how a product
that feeds a sum is written (CUDA rounds it alone, see codegen/cuda.py).
"""

from __future__ import annotations

from collections.abc import Callable

from ..semiring import Semiring

Sweep = Callable[[str, int, list[str], bool], list[str]]


def reduced_value(
    k: int,
    sr: Semiring,
    terms: list[str],
    sweep: Sweep,
    acc: str,
    summed: str,
    literal: Callable[[str], str] = lambda x: x,
) -> list[str]:
    """Lines leaving ⊕ over the reduced axes of the current output element in `v`.
    terms: the k leaves' current elements; acc: ⊕'s starting value; summed: the product
    of the terms as a term of a sum."""
    i = "        "
    if sr.reduction == "logsumexp":  # max-shifted, two passes; -inf for an all -inf sum
        x = sr.product(terms)
        lines = [f"{i}top_x = {literal('-np.inf')}  # pass 1: the largest term (a NaN sticks)"]
        lines += sweep(
            i,
            k,
            ([f"x = {x}"] if x != "x" else []) + ["if x > top_x or x != x:", f"    top_x = {literal('x')}"],
            False,
        )
        lines += [
            f"{i}if top_x == -np.inf:",
            f"{i}    v = top_x",
            f"{i}else:",
            f"{i}    acc = {literal('0.0')}  # pass 2: the sum of exp(x - top_x)",
        ]
        lines += sweep(i + "    ", k, [f"acc += math.exp({x} - top_x)"], False)
        return lines + [f"{i}    v = top_x + math.log(acc)"]
    if sr.is_max:  # in the dtype, from -inf (an empty max); a NaN term sticks, as numpy's
        x = sr.product(terms)
        lines = [f"{i}acc = {acc}"]
        lines += sweep(
            i, k, ([f"x = {x}"] if x != "x" else []) + ["if x > acc or x != x:", "    acc = x"], False
        )
        return lines + [f"{i}v = acc"]
    if sr.reduction == "any":  # stops at the first true term
        lines = [f"{i}acc = {acc}"]
        lines += sweep(i, k, [f"if {sr.product(terms)}:", "    acc = True", "    break"], True)
        return lines + [f"{i}v = acc"]
    lines = [f"{i}acc = {acc}"]  # float32 sums in float64
    lines += sweep(i, k, [f"acc += {summed}"], False)
    return lines + [f"{i}v = acc"]


def subtract_largest(i: str, sr: Semiring, dtype: str, element: str, subtract: list[str]) -> list[str]:
    """MAXLOG's NORMALIZE of a group, `size` elements (`element` the o-th) as both targets
    write it: the largest in the dtype (a NaN sticks), kept as the group's total when the
    plan asks (plan/totals.py), then the lines `subtract` (element - top_x each)."""
    return [
        f"{i}top_x = {sr.accumulator(dtype)}",
        f"{i}for o in range(size):",
        f"{i}    x = {element}",
        f"{i}    if x > top_x or x != x:",
        f"{i}        top_x = x",
        f"{i}if totals >= 0:  # the largest kept as a value of its own (plan/totals.py)",
        f"{i}    mem[totals + g] = top_x",
    ] + subtract


# numpy sums a contiguous run pairwise (its pairwise_sum): runs under PAIRWISE_SMALL in
# order, runs up to PAIRWISE_BLOCK in 8 interleaved sums, longer ones as two halves cut
# at a multiple of 8; and np.sum(x) of a whole array is 0.0 plus that sum of x in memory
# order. The reference divides a PROB NORMALIZE by np.sum(x).
PAIRWISE_SMALL, PAIRWISE_BLOCK = 8, 128


def pairwise_total(i: str, element: str, stacks: tuple[str, ...], one: str = "np.float64") -> list[str]:
    """Lines leaving numpy's np.sum of a group's `size` elements in `total`, in float64:
    its pairwise tree walked with explicit stacks (no recursion, which the GPU lacks).
    element: the k-th element, with "{k}" where k goes; stacks: an int64 array for the
    pending runs' starts, one for their lengths, one for how far each has got (0: no half
    summed yet, 1: the first pushed, 2: both), and a float64 array for the sums of
    finished runs; 64 entries each hold any tree (each level halves the run)."""
    lo, n, state, sums = stacks
    x = element.format
    r = [f"r{j}" for j in range(8)]
    lines = [
        f"{i}{lo}[0], {n}[0], {state}[0] = 0, size, 0",
        f"{i}top, done = 1, 0  # pending runs on the stack; finished sums",
        f"{i}while top > 0:",
        f"{i}    a, m = {lo}[top - 1], {n}[top - 1]",
        f"{i}    if m <= {PAIRWISE_BLOCK}:",
        f"{i}        top -= 1",
        f"{i}        if m < {PAIRWISE_SMALL}:",
        f"{i}            res = {one}(-0.0)  # (as numpy: a sum of -0.0 stays -0.0)",
        f"{i}            for k in range(m):",
        f"{i}                res += {x(k='(a + k)')}",
        f"{i}        else:",
    ]
    lines += [f"{i}            {rj} = {one}({x(k=f'(a + {j})')})" for j, rj in enumerate(r)]
    lines += [f"{i}            k = 8", f"{i}            while k < m - m % 8:"]
    lines += [f"{i}                {rj} += {x(k=f'(a + k + {j})')}" for j, rj in enumerate(r)]
    lines += [
        f"{i}                k += 8",
        f"{i}            res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))",
        f"{i}            while k < m:",
        f"{i}                res += {x(k='(a + k)')}",
        f"{i}                k += 1",
        f"{i}        {sums}[done] = res",
        f"{i}        done += 1",
        f"{i}    elif {state}[top - 1] < 2:  # push its next half",
        f"{i}        half = m // 2 - (m // 2) % 8",
        f"{i}        first = {state}[top - 1] == 0",
        f"{i}        {state}[top - 1] += 1",
        f"{i}        {lo}[top] = a if first else a + half",
        f"{i}        {n}[top] = half if first else m - half",
        f"{i}        {state}[top] = 0",
        f"{i}        top += 1",
        f"{i}    else:  # both halves summed: their sum replaces them",
        f"{i}        top -= 1",
        f"{i}        {sums}[done - 2] = {sums}[done - 2] + {sums}[done - 1]",
        f"{i}        done -= 1",
        f"{i}total = {one}(0.0) + {sums}[0]  # (np.sum starts its output at 0.0)",
    ]
    return lines
