"""⊕ over a segment's reduced axes, as kernel source: one template for both targets.

The targets differ only in how they walk the terms (`sweep`: the CPU's odometer with
counters in P, a GPU thread's div/mod), in how a float literal is typed (CUDA types them:
under its simulator a Python 0.0 plus a float32 would stay float32) and in how a product
that feeds a sum is written (CUDA rounds it alone, see codegen/cuda.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..semiring import Semiring
from .totals import LANES, LANES_ADDED

Sweep = Callable[[str, int, list[str], bool], list[str]]


@dataclass(frozen=True)
class Lanes:
    """A float sum in LANES lanes (KernelPattern.terms_in_lanes): term v of each vector
    into lane v % LANES of `array`, the lanes added pairwise at the end. lane: the current
    term's lane as the sweep knows it; start, step: lines before the sweep and after each
    term that keep what `lane` reads."""

    array: str
    lane: str
    start: tuple[str, ...] = ()
    step: tuple[str, ...] = ()


def reduced_value(
    k: int,
    sr: Semiring,
    terms: list[str],
    sweep: Sweep,
    acc: str,
    summed: str,
    literal: Callable[[str], str] = lambda x: x,
    math: str = "math",
    lanes: Lanes | None = None,
) -> list[str]:
    """Lines leaving ⊕ over the reduced axes of the current output element in `v`.
    terms: the k leaves' current elements; acc: ⊕'s starting value; summed: the product
    of the terms as a term of a sum; math: the module whose exp and log the kernel calls
    (the CPU's: codegen/libm.py); lanes: a sum in lanes (KernelPattern.terms_in_lanes)."""
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
        # (a -inf term, a selector's zero, would add exp(-inf) = +0.0 to a sum of
        # non-negative terms: nothing, so it is not taken)
        term = ([f"x = {x}"] if x != "x" else []) + ["if x != -np.inf:", f"    acc += {math}.exp(x - top_x)"]
        lines += sweep(i + "    ", k, term, False)
        return lines + [f"{i}    v = top_x + {math}.log(acc)"]
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
    if lanes is not None:  # the lanes added pairwise at the end (codegen/totals.py)
        lines = [f"{i}for w in range({LANES}):", f"{i}    {lanes.array}[w] = {acc}"]
        lines += [i + line for line in lanes.start]
        lines += sweep(i, k, [f"{lanes.array}[{lanes.lane}] += {summed}", *lanes.step], False)
        added = LANES_ADDED
        for w in range(LANES):
            added = added.replace(f"s{w}", f"{lanes.array}[{w}]")
        return lines + [f"{i}v = {added}"]
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
