"""Numba source for the one kernel template, `contract_reduce`, on the CPU.

A kernel computes one segment (see plan/fusion.py):

    out[o] = ⊕_r  leaf_0[o, r] ⊗ leaf_1[o, r] ⊗ ... ⊗ leaf_{k-1}[o, r]

It is specialized on its pattern only (semiring, dtype, number of leaves k, reduce or not,
normalize, parallel). Ranks, sizes, strides and offsets are runtime data read from the
int64 table P (layout in plan/schedule.py), so one kernel serves every segment of its
pattern. The loops over the *hot* axes (the reduced axes if the kernel reduces, else the
output axes) run in three layers:
  - the innermost axis, a tight strided loop `j`;
  - up to 256 elements of the axes just outside it, through per-leaf offset tables `t`
    precomputed at plan time (no index arithmetic per element);
  - every remaining axis, an odometer whose counters live in P's scratch area.
A reduction vectorized across outputs walks the innermost output axes as the vector and
every reduced axis by the odometer; across both (plan/loops.py), the vector holds J
positions of the innermost reduced axes times S output lanes, and the odometer walks the
outer reduced axes.

A module has one entry, `kernel(mem_address, mem_length, P_address, P_length, p, chunk,
chunks)`, that the dispatcher calls at its C address in both dispatch modes, so a kernel
compiles once whatever the mode, and a cache entry filled by one mode serves the other.
It runs one chunk of a step (abi.py); the dispatcher shares a step's chunks among threads
(codegen/dispatch.py), so a kernel has no parallel loop of its own.

Every output element is computed by the same sequential code whatever the chunking or the
thread count, so results are bit-identical across runs and NUMBA_NUM_THREADS. float32
sums accumulate in float64. LOGPROB reduces with a max-shifted logsumexp in two passes
(-inf for an all -inf sum; NaN propagates), MAXLOG with a max in the dtype (exact, so the
reference's bits; -inf for an empty max; NaN propagates, as numpy's), SAT stops at the
first true term, COUNT wraps around like numpy's int64.
"""

from __future__ import annotations

import numpy as np

from .. import abi
from ..plan.loops import ACROSS_BOTH, ACROSS_OUTPUTS, ACROSS_REDUCED
from ..plan.steps import KernelPattern
from ..semiring import SEMIRINGS, Semiring
from .intrinsics import LINE_BYTES
from .reduction import reduced_value, subtract_largest
from .totals import LANES, LANES_ADDED, parts_total_source

ENTRY = "kernel"

# A leaf's row in P: its offset, then its D strides (abi.leaf); `base[l]` and `cur[l]`
# are the current offsets of leaf l (a row's start, and the reduced sweep's position).
LEAF = "L + l * LS"


def _advance(ind: str, first: str, last: str, leaves: str, out: bool) -> list[str]:
    """Odometer step over axes last..first (last fastest) of o_off (out) and every leaf's
    offset in `leaves`; leaves `d < first` after a wrap."""
    pad = ind + "    "
    lines = [f"{ind}d = {last}", f"{ind}while d >= {first}:", f"{pad}P[u(idx + d)] += 1"]
    lines += [f"{pad}o_off += P[u(SO + d)]"] if out else []
    lines += [
        f"{pad}for l in range(K):",
        f"{pad}    {leaves}[l] += P[u({LEAF} + 1 + d)]",
        f"{pad}if P[u(idx + d)] < P[u(N + d)]:",
        f"{pad}    break",
    ]
    lines += [f"{pad}o_off -= P[u(SO + d)] * P[u(N + d)]"] if out else []
    lines += [
        f"{pad}for l in range(K):",
        f"{pad}    {leaves}[l] -= P[u({LEAF} + 1 + d)] * P[u(N + d)]",
        f"{pad}P[u(idx + d)] = 0",
        f"{pad}d -= 1",
    ]
    return lines


def _place(ind: str, last: str, start: str) -> list[str]:
    """Set the odometer over axes 0..last of o_off and base[] on flat position `start`
    (C order)."""
    return [
        f"{ind}rem = {start}",
        f"{ind}for d in range({last}, -1, -1):",
        f"{ind}    i = rem % P[u(N + d)]",
        f"{ind}    rem //= P[u(N + d)]",
        f"{ind}    P[u(idx + d)] = i",
        f"{ind}    o_off += i * P[u(SO + d)]",
        f"{ind}    for l in range(K):",
        f"{ind}        base[l] += i * P[u({LEAF} + 1 + d)]",
    ]


def _product(
    ind: str, leaves: str, buf: str = "buf", count: str = "K", pair_first: bool = False
) -> list[str]:
    """The ⊗-product of the first `count` leaves along the current vector piece (v0, n)
    into buf[0:n], one leaf after another, left to right; two CONTIGUOUS leaves in a row
    in one pass (the same operations in the same order, one load and store of buf fewer),
    with `pair_first` the first two too (one loop more to compile: where it pays)."""
    if pair_first:
        first = [
            f"{ind}if {count} > 1 and P[A] == CONTIGUOUS and P[A + ACCESS_FIELDS] == CONTIGUOUS:",
            f"{ind}    first_two({buf}, mem, {leaves}[0] + v0, {leaves}[1] + v0, n)",
            f"{ind}    l = np.int64(2)",
            f"{ind}else:",
            f"{ind}    first_leaf({buf}, mem, P, A, {leaves}[0], v0, n)",
            f"{ind}    l = np.int64(1)",
        ]
    else:
        first = [f"{ind}first_leaf({buf}, mem, P, A, {leaves}[0], v0, n)", f"{ind}l = np.int64(1)"]
    return first + [
        f"{ind}while l < {count}:",
        f"{ind}    a = A + l * ACCESS_FIELDS",
        f"{ind}    if l + 1 < {count} and P[a] == CONTIGUOUS and P[a + ACCESS_FIELDS] == CONTIGUOUS:",
        f"{ind}        times_two({buf}, mem, {leaves}[l] + v0, {leaves}[l + 1] + v0, n)",
        f"{ind}        l += 2",
        f"{ind}    else:",
        f"{ind}        times_leaf({buf}, mem, P, a, {leaves}[l], v0, n)",
        f"{ind}        l += 1",
    ]


def _vector(ind: str, leaves: str) -> list[str]:
    """The product along the whole vector, piece by piece (then the caller's lines run on
    buf[0:n], inside the piece loop)."""
    return [f"{ind}for v0 in range(0, V, BUFFER):", f"{ind}    n = min(BUFFER, V - v0)"] + _product(
        ind + "    ", leaves
    )


def _sweep(ind: str, k: int, body: list[str], stop: bool) -> list[str]:
    """One pass over the reduced axes of the current output element, `body` on each term
    buf[v]: the odometer axes R..top-1 outside, the vector inside, in the order of
    plan/schedule.py (C order over the reduced axes), the order of every target. (k: the
    CUDA template's; a CPU kernel reads K.)"""
    pad = ind + "    "
    lines = [
        f"{ind}for d in range(R, top):",
        f"{ind}    P[idx + d] = nought",
        f"{ind}for l in range(K):",
        f"{ind}    cur[l] = opaque(base[l])",
        f"{ind}while True:",
    ]
    lines += _vector(pad, "cur")
    lines += [f"{pad}    for v in range(n):"]
    lines += [f"{pad}        {b}" for b in body]
    if stop:  # SAT: leave every loop once a term is true
        lines += [f"{pad}    if acc:", f"{pad}        break", f"{pad}if acc:", f"{pad}    break"]
    lines += _advance(pad, "R", "top - 1", "cur", out=False)
    lines += [f"{pad}if d < R:", f"{pad}    break"]
    return lines


def _reduced_value(sr: Semiring, dtype: str) -> list[str]:
    """Lines leaving ⊕ over the reduced axes of the current output element in `v`."""
    return reduced_value(0, sr, ["buf[v]"], _sweep, sr.accumulator(dtype), "buf[v]", math="libm")


def _lanes_reduction(ind: str, in_lanes: bool = False) -> list[str]:
    """⊕ across reduced axes for output elements lo..hi-1, LANES of them side by side: the
    lanes' leaf offsets are taken from the output odometer one element after another,
    then one sweep of the reduced axes computes each lane's products into its piece of
    buf and adds them into its own sum, s0..s(LANES-1). Each output still adds its terms
    in the order _sweep would (the same bits); the LANES chains of additions overlap
    instead of waiting for each other (grid6_d2: 8 outputs of 16,384 terms each)."""
    pad = ind + "    "
    sums = [f"s{g}" for g in range(abi.LANES)]
    lined = [f"a{g}" for g in range(abi.LANES)]
    lines = [
        f"{ind}o = lo",
        f"{ind}while o < hi:",
        f"{pad}m = min(group - o % group, hi - o)  # lanes in this group",
        f"{pad}for g in range(m):",
        f"{pad}    outs[g] = o_off",
        f"{pad}    for l in range(K):",
        f"{pad}        lane_base[g * MAX_LEAVES + l] = opaque(base[l])",
    ]
    lines += _advance(pad + "    ", "0", "R - 1", "base", out=True)
    if in_lanes:  # each output's terms in the W lanes of a line (codegen/totals.py)
        lines += [f"{pad}{a} = line_zero(buf)" for a in lined]
    else:
        lines += [f"{pad}{s} = 0.0" for s in sums]
    lines += [
        f"{pad}if whole:  # each lane's terms in a row in memory: added where they lie",
        f"{pad}    for g in range(m, LANES):",
        f"{pad}        lane_base[g * MAX_LEAVES] = lane_base[0]  # (not stored)",
    ]
    lines += [f"{pad}    b{g} = lane_base[{f'{g} * MAX_LEAVES' if g else 0}]" for g in range(abi.LANES)]
    if in_lanes:
        lines += _lines_added(pad + "    ", "mem", [f"b{g} + " for g in range(abi.LANES)], "V", lined)
    else:
        lines += [f"{pad}    for v in range(V):"]
        lines += [f"{pad}        {s} += mem[u(b{g} + v)]" for g, s in enumerate(sums)]
    lines += [f"{pad}else:"]
    sweep = [
        f"{pad}for g in range(m, LANES):  # lanes without an output add zeros",
        f"{pad}    for v in range(min(V, PIECE)):",
        f"{pad}        buf[g * PIECE + v] = 0.0",
        f"{pad}for d in range(R, top):",
        f"{pad}    P[idx + d] = nought",
        f"{pad}for l in range(K):",
        f"{pad}    red[l] = nought  # the sweep's offset from each lane's start",
        f"{pad}while True:",
        f"{pad}    for v0 in range(0, V, PIECE):",
        f"{pad}        n = min(PIECE, V - v0)",
        f"{pad}        for g in range(m):",
        f"{pad}            for l in range(K):",
        f"{pad}                cur[l] = lane_base[g * MAX_LEAVES + l] + red[l]",
        f"{pad}            lane = buf[g * PIECE : (g + 1) * PIECE]",
    ]
    sweep += _product(pad + "            ", "cur", "lane")
    piece = ["v"] + [f"{g} * PIECE + v" if g > 1 else "PIECE + v" for g in range(1, abi.LANES)]
    if in_lanes:
        starts = [""] + [f"{g} * PIECE + " if g > 1 else "PIECE + " for g in range(1, abi.LANES)]
        sweep += _lines_added(pad + "        ", "buf", starts, "n", lined)
    else:
        sweep += [f"{pad}        for v in range(n):"]
        sweep += [f"{pad}            {s} += buf[{at}]" for s, at in zip(sums, piece)]
    sweep += _advance(pad + "    ", "R", "top - 1", "red", out=False)
    sweep += [f"{pad}    if d < R:", f"{pad}        break"]
    lines += ["    " + line for line in sweep]
    if in_lanes:
        lines += [f"{pad}{s} = lanes_added({a})" for s, a in zip(sums, lined)]
    lines += [f"{pad}mem[outs[0]] = s0"]
    for g, s in enumerate(sums[1:], 1):
        lines += [f"{pad}if m > {g}:", f"{pad}    mem[outs[{g}]] = {s}"]
    return lines + [f"{pad}o += m"]


# a reassociating sum's lanes (KernelPattern.terms_in_lanes): each output's terms summed
# in the LANES lanes of a line (float64: W == LANES), added pairwise at the end
LANES_ADDED_SOURCE = """

from catbp_jit.codegen.lines import line_lane, line_load, line_load_part, line_zero

W = {lanes}  # elements to a line of float64 (codegen/lines.py): a sum's lanes (codegen/totals.py)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def lanes_added(x):
    \"\"\"The lanes of line x added pairwise, as codegen/totals.py adds a total's lanes.\"\"\"
{extract}
    return {added}
""".format(
    lanes=LANES,
    extract="\n".join(f"    s{k} = line_lane(x, {k})" for k in range(LANES)),
    added=LANES_ADDED,
)
assert LINE_BYTES // 8 == LANES  # (a line of float64 holds a sum's lanes)


def _lines_added(ind: str, array: str, starts: list[str], count: str, lined: list[str]) -> list[str]:
    """Each output's terms array[start + v], v < count, added to its line of sums `lined`
    a line at a time: term v into lane v % W, the last count % W terms a part line (0.0 in
    its other lanes, which leaves a sum that started at 0.0 as it was)."""
    pad = ind + "    "
    return [
        f"{ind}v = ZERO",
        f"{ind}while v + W <= {count}:",
        *[f"{pad}{a} = {a} + line_load({array}, {at}v)" for a, at in zip(lined, starts)],
        f"{pad}v += W",
        f"{ind}if v < {count}:",
        *[
            f"{pad}{a} = {a} + line_load_part({array}, {at}v, ZERO, {count} - v)"
            for a, at in zip(lined, starts)
        ],
    ]


def _across_sweep(ind: str, body: list[str], end: str = "D", fused: bool = False) -> list[str]:
    """Every position of the reduced odometer axes R..end-1 (all of them, or with
    ACROSS_BOTH those outside the vector), in the order of plan/schedule.py (C order),
    with the vector's products in buf[0:n] and `body` run on them. fused (sums across
    outputs): where the kernel's `fused` says the last leaf is CONTIGUOUS, its ⊗ and the
    sums' ⊕ are one pass (add_times), else `body`."""
    pad = ind + "    "
    lines = [
        f"{ind}for d in range(R, {end}):",
        f"{ind}    P[idx + d] = nought",
        f"{ind}for l in range(K):",
        f"{ind}    cur[l] = opaque(base[l])",
        f"{ind}while True:",
    ]
    if fused:
        lines += _product(pad, "cur", count="first")
        lines += [f"{pad}if fused:", f"{pad}    add_times(sums, buf, mem, cur[K - 1] + v0, n)", f"{pad}else:"]
        lines += [f"{pad}    {b}" for b in body]
    else:
        lines += _product(pad, "cur")
        lines += [f"{pad}{b}" for b in body]
    lines += _advance(pad, "R", f"{end} - 1", "cur", out=False)
    lines += [f"{pad}if d < R:", f"{pad}    break"]
    return lines


def _across_outputs(sr: Semiring, dtype: str) -> list[str]:
    """⊕ for the n output elements of the vector piece at v0 at once, each adding its terms
    in the order _sweep would (the same rounding), into `sums` (then stored)."""
    return _lane_sums(
        sr, dtype, "v", "n", ["for v in range(n):"], "buf[v]", "D", "v0, n", "            ", fuse_last=True
    )


def _across_both(sr: Semiring, dtype: str) -> list[str]:
    """⊕ for the S output elements of the current row at once: the vector's element
    j * S + s is output s's term at the j-th position of the inner reduced axes, so each
    output adds its terms in the order _sweep would (the same rounding), into `sums`."""
    each = ["for j in range(J):", "    for s in range(S):"]
    return _lane_sums(sr, dtype, "s", "S", each, "buf[j * S + s]", "rtop", "ZERO, S", "        ")


def _lane_sums(
    sr: Semiring,
    dtype: str,
    x: str,
    n: str,
    each: list[str],
    term: str,
    end: str,
    stored: str,
    i: str,
    fuse_last: bool = False,
) -> list[str]:
    """Lines summing lanes x < n side by side (sums[x]), `each` visiting every lane's term
    at the current position of the reduced odometer axes R..end-1, then storing the n
    sums at `stored`. fuse_last: a sum's last ⊗ and its ⊕ may be one pass (_across_sweep)."""
    t = "    " * len(each)  # the body of `each`
    lanes = f"for {x} in range({n}):"
    if sr.reduction == "logsumexp":  # as reduction.py's, one element per lane
        lines = [f"{i}{lanes}", f"{i}    tops[{x}] = -np.inf  # pass 1: the largest term (a NaN sticks)"]
        top = [f"{t}x = {term}", f"{t}if x > tops[{x}] or x != x:", f"{t}    tops[{x}] = x"]
        lines += _across_sweep(i, each + top, end)
        lines += [f"{i}{lanes}", f"{i}    sums[{x}] = 0.0  # pass 2: the sum of exp(x - top)"]
        exps = [f"{t}x = {term}", f"{t}if x != -np.inf and tops[{x}] != -np.inf:"]
        exps += [f"{t}    sums[{x}] += libm.exp(x - tops[{x}])"]  # (a -inf term adds nothing)
        lines += _across_sweep(i, each + exps, end)
        return lines + [
            f"{i}{lanes}",
            f"{i}    if tops[{x}] != -np.inf:",
            f"{i}        tops[{x}] = tops[{x}] + libm.log(sums[{x}])",
            f"{i}store(tops, mem, P, AO, o_off, {stored})",
        ]
    lines = [f"{i}{lanes}", f"{i}    sums[{x}] = {sr.accumulator(dtype)}"]
    if sr.reduction == "any":  # no early stop: the other lanes go on
        lines += _across_sweep(i, each + [f"{t}sums[{x}] = sums[{x}] or {term}"], end)
    elif sr.is_max:  # as reduction.py's: a NaN sticks
        top = [f"{t}x = {term}", f"{t}if x > sums[{x}] or x != x:", f"{t}    sums[{x}] = x"]
        lines += _across_sweep(i, each + top, end)
    else:
        lines += _across_sweep(i, each + [f"{t}sums[{x}] += {term}"], end, fused=fuse_last)
    return lines + [f"{i}store(sums, mem, P, AO, o_off, {stored})"]


def _accumulator_type(sr: Semiring, dtype: str) -> str:
    """The dtype of the across-outputs sums: what the scalar `acc` would be."""
    if sr.reduction == "any":
        return "bool"
    if sr.is_max:  # exact in the dtype
        return dtype
    return "int64" if sr.accumulator(dtype) == "0" else "float64"


# Inlined where they are called (Numba's IR inlining): a call costs more than a short
# vector's loop (measured: 3.6x slower on vectors of 27 elements)
INLINED = '@njit(cache=True, nogil=True, error_model="numpy", inline="always")'
# ... but the part a kernel runs once a chunk (a chunk's output elements or rows), which
# holds the inlined walkers, is written in the kernel itself: Numba's IR inliner copies a
# callee's whole scope once for each of its blocks, and inlining that part cost up to half
# of the kernel's compile (an AMD EPYC, a PROB reduction: 5.9-6.7 s inlined, 3.2-3.7 s
# written in place), while a call that is not inlined cost ~60 ns a step (chain200_d2:
# 200 -> 310 us a run).


def _walkers(sr: Semiring, dtype: str) -> str:
    """The two functions that walk one leaf along the vector, one loop per access kind."""
    at = {
        "CONSTANT": "base",
        "CONTIGUOUS": "c + v",
        "STRIDED": "c + v * step",
        "GATHERED": "base + P[u(c + v)]",
    }
    start = {
        "CONSTANT": "",
        "CONTIGUOUS": "c = base + v0",
        "STRIDED": "c = base + v0 * step",
        "GATHERED": "c = table + v0",
    }
    parts = []
    for name, doc, element in (
        ("first_leaf", "buf[v] = the leaf's element v0 + v, for v < n", lambda x: x),
        (
            "times_leaf",
            "buf[v] = buf[v] ⊗ the leaf's element v0 + v, for v < n",
            lambda x: sr.product(["buf[v]", x]),
        ),
    ):
        lines = [
            INLINED,
            f"def {name}(buf, mem, P, a, base, v0, n):",
            f'    """{doc}; a: the leaf\'s access (abi.py) in P."""',
            "    kind, step, table = P[a], P[a + 1], P[a + 2]",
        ]
        for i, kind in enumerate(("CONSTANT", "CONTIGUOUS", "STRIDED", "GATHERED")):
            head = "if" if i == 0 else "elif" if i < 3 else "else"
            lines += [f"    {head} kind == {kind}:" if head != "else" else "    else:  # GATHERED"]
            if kind == "CONSTANT":
                lines += [
                    "        x = mem[u(base)]",
                    "        for v in range(n):",
                    f"            buf[v] = {element('x')}",
                ]
            else:
                lines += [
                    f"        {start[kind]}",
                    "        for v in range(n):",
                    f"            buf[v] = {element(f'mem[u({at[kind]})]')}",
                ]
        parts.append("\n".join(lines))
    parts.append(
        "\n".join(
            [
                INLINED,
                "def first_two(buf, mem, c, d, n):",
                '    """buf[v] = mem[c + v] ⊗ mem[d + v], for v < n: the first two leaves, CONTIGUOUS."""',
                "    for v in range(n):",
                f"        buf[v] = {sr.product(['mem[u(c + v)]', 'mem[u(d + v)]'])}",
            ]
        )
    )
    parts.append(
        "\n".join(
            [
                INLINED,
                "def times_store(buf, mem, o, c, n):",
                '    """mem[o + v] = buf[v] ⊗ mem[c + v], for v < n: last leaf and output CONTIGUOUS."""',
                "    for v in range(n):",
                f"        mem[u(o + v)] = {sr.product(['buf[v]', 'mem[u(c + v)]'])}",
            ]
        )
    )
    parts.append(
        "\n".join(
            [
                INLINED,
                "def add_times(sums, buf, mem, c, n):",
                '    """sums[v] = sums[v] ⊕ (buf[v] ⊗ mem[c + v]), for v < n: the last leaf, CONTIGUOUS."""',
                "    for v in range(n):",
                f"        sums[v] += {sr.product(['buf[v]', 'mem[u(c + v)]'])}",
            ]
        )
    )
    parts.append(
        "\n".join(
            [
                INLINED,
                "def times_two(buf, mem, c, d, n):",
                '    """buf[v] = buf[v] ⊗ mem[c + v] ⊗ mem[d + v], for v < n: two CONTIGUOUS leaves."""',
                "    for v in range(n):",
                f"        buf[v] = {sr.product(['buf[v]', 'mem[u(c + v)]', 'mem[u(d + v)]'])}",
            ]
        )
    )
    line = LINE_BYTES // np.dtype(dtype).itemsize
    store = [
        INLINED,
        "def store(buf, mem, P, a, base, v0, n):",
        '    """The output\'s elements v0 + v = buf[v], for v < n; a: its access in P."""',
        "    kind, step, table = P[a], P[a + 1], P[a + 2]",
        "    if kind == CONTIGUOUS:",
        "        c = base + v0",
        "        for v in range(n):",
        "            mem[u(c + v)] = buf[v]",
        "    elif kind == STRIDED:",
        "        c = base + v0 * step",
        "        for v in range(n):",
        "            mem[u(c + v * step)] = buf[v]",
        "    elif kind == GATHERED:  # (an output is never CONSTANT: its elements differ)",
        "        c = table + v0",
        "        for v in range(n):",
        "            mem[u(base + P[u(c + v)])] = buf[v]",
        "    else:  # STREAMED: CONTIGUOUS, its whole lines written without reading them first",
        "        c = base + v0",
        "        head = min(n, line_rest(mem, c))",
        "        store_part(mem, c, buf, ZERO, head)  # up to the first line's start",
        f"        v = head  # then a line ({line} elements) at a time, then the rest",
        f"        while v + {line} <= n:",
        "            store_line(mem, c + v, buf, v)",
        f"            v += {line}",
        "        store_part(mem, c + v, buf, v, n - v)",
    ]
    parts.append("\n".join(store))
    return "\n\n\n".join(parts)


def _each_element(ind: str, body: str, parallel: bool) -> list[str]:
    """`body` on every element o of the current part. A parallel GEMM kernel shares the
    elements of a lone part (each is computed alone: the same bits); many parts (the rows
    of a batch) are small, and a parallel loop each would cost more than it saves."""
    serial = [f"{ind}for o in range(size):", f"{ind}    {body}"]
    if not parallel:
        return serial
    shared = body.replace("[u(base + o * es)]", "[u(base + e * es)]")
    return [
        f"{ind}if groups == 1:",
        f"{ind}    for e in prange(size):",
        f"{ind}        {shared}",
        f"{ind}else:",
    ] + ["    " + line for line in serial]


def _normalize(sr: Semiring, dtype: str, parallel: bool = False, lanes: bool = False) -> list[str]:
    """NORMALIZE the output in `groups` parts (the batch rows) of `size` elements each,
    part g at out + g * gs, its elements es apart (plan/schedule.py: normalize_groups).
    Its sums run in the elements' order, but with `lanes` a total is the module's
    parts_total (reassociating mode: codegen/totals.py); with `parallel` the last
    pass (the division or the subtraction) is shared among the threads."""
    i = "        "
    x = "mem[u(base + o * es)]"  # (u: unsigned, so that LLVM vectorizes the passes)
    head = [
        "    G = p + SIZES + D + R + P[p + LEAVES] * (1 + D)  # after the last leaf's strides",
        "    groups, gs, es, totals = P[G], P[G + 1], P[G + 2], P[G + 3]",
        "    size = n_out // groups",
        "    for g in range(groups):",
        "        base = out + g * gs",
    ]
    if sr.normalization == "divide_by_total":
        return (
            head
            + (
                [f"{i}total = parts_total(mem, base, es, size)"]
                if lanes
                else [f"{i}total = 0.0", f"{i}for o in range(size):", f"{i}    total += {x}"]
            )
            + [
                f"{i}if totals >= 0:  # the total kept as a value of its own (plan/totals.py)",
                f"{i}    mem[totals + g] = total",
                f"{i}if total != 0.0:",
            ]
            + _each_element(i + "    ", f"{x} = {x} / total", parallel)
        )
    if sr.normalization == "subtract_logsumexp":
        return (
            head
            + [
                f"{i}top_x = -np.inf",
                f"{i}for o in range(size):",
                f"{i}    if {x} > top_x or {x} != {x}:",
                f"{i}        top_x = {x}",
                f"{i}z = top_x",
                f"{i}if top_x != -np.inf:",
                f"{i}    acc = 0.0",
                f"{i}    for o in range(size):",
                f"{i}        if {x} != -np.inf:  # (exp(-inf) adds nothing)",
                f"{i}            acc += libm.exp({x} - top_x)",
                f"{i}    z = top_x + libm.log(acc)",
                f"{i}if totals >= 0:  # the total kept as a value of its own (plan/totals.py)",
                f"{i}    mem[totals + g] = z",
            ]
            + _each_element(i, f"{x} = {x} - z", parallel)
        )
    if sr.normalization == "subtract_max":
        return head + subtract_largest(i, sr, dtype, x, _each_element(i, f"{x} = {x} - top_x", parallel))
    return []  # SAT and COUNT do not normalize


# the end of a chunk's rows: streamed stores are weakly ordered (codegen/intrinsics.py)
FENCE = [
    "    if P[AO] == STREAMED:  # before another thread reads what this one wrote",
    "        fence_stores()",
]


HEADER = '''"""catbp_jit kernel {name}

out[o] = {formula}   ({semiring}, {dtype}{then})

P[p:] holds this step's parameters (catbp_jit/abi.py): out offset, R output axes, Q
reduced axes, scratch offset, chunks, nb vector axes, V vector elements, K leaves, sizes
n[0..D-1], output strides so[0..R-1], per leaf its offset and strides on all D = R + Q
axes (in elements of `mem`), the NORMALIZE groups, then each operand's access along the
vector. One kernel serves any number of leaves K. The last nb axes ({hot}) are
the vector: each leaf is walked along it in a loop of its own, into `buf` (on the stack),
in pieces of BUFFER (CONTIGUOUS operands two at a time, and a CONTIGUOUS last leaf
straight into a CONTIGUOUS output or the sums); the hot axes before them by an odometer
with counters at P[idx:].
"""
import math

import numpy as np
from numba import carray, njit

from catbp_jit.codegen.intrinsics import BUFFER, MAX_LEAVES, opaque, {pointers}{libm}

{abi}
# Arguments are typed int64, never as literals: Numba compiles a callee once per argument
# type it sees while typing its caller, and a literal 0 or 1 would cost a second compile.
ZERO = np.int64(0)
# Indices into mem and P go through u(): Numba adds a negative-index wraparound to every
# signed index, which stops LLVM from seeing that a loop reads consecutive elements.
u = np.uint64


{walkers}
{finish}

@njit(cache=True, nogil=True, error_model="numpy")
def {entry}(mem_address, mem_length, P_address, P_length, p, chunk, chunks):
    """Chunk `chunk` of `chunks` of segment p of the table; with chunk == chunks, what
    follows them all (NORMALIZE: the dispatcher calls it once every chunk is done; a
    step of one chunk does it at once). Called with addresses, not arrays: no MemInfo
    is made per call, and the dispatcher calls the compiled code at its C address."""
    mem = carray(pointer_{dtype}(mem_address), mem_length)
    P = carray(pointer_int64(P_address), P_length)
{work}
{after}
    # {part_doc}
    # (written here, not in a function Numba inlines: see codegen/cpu.py's INLINED)
    idx = P[p + SCRATCH] + chunk * D  # this chunk's odometer counters
{fields}
    buf = carray(stack_buffer_{dtype}(), BUFFER)
    base = carray(stack_leaves_int64(), MAX_LEAVES)  # base[l]: leaf l's offset at the row's start
'''


# A loop step's parameters as a kernel reads them from P (abi.py), by name (every CPU
# loop template's: contract_reduce's here, contract_lines's in cpu_lines.py)
STEP_FIELDS = f"""    out = P[p + OUT]
    R = P[p + OUT_RANK]
    D = R + P[p + RED_RANK]
    K = P[p + LEAVES]
    nb = P[p + BLOCK_AXES]
    V = P[p + BLOCK_SIZE]
    N = p + SIZES  # P[N + d]: size of axis d
    SO = p + {abi.OUT_STRIDES_SOURCE}  # P[SO + d]: output stride of axis d < R
    LS = 1 + D  # a leaf's row: its offset, then its D strides
    L = SO + R  # leaf l's row at P[L + l * LS]
    A = L + K * LS + GROUP_FIELDS  # leaf l's access at A + l * ACCESS_FIELDS
    AO = A + K * ACCESS_FIELDS  # the output's access
    nought = opaque(ZERO)  # 0, but not to LLVM: loops storing it stay stores (intrinsics.opaque)"""


# the C library's exp and log by their default symbols (codegen/libm.py), for LOGPROB
LIBM_IMPORT = "\nfrom catbp_jit.codegen import libm"


def uses_libm(sr: Semiring, pattern: KernelPattern) -> bool:
    """Whether the kernel of `pattern` calls exp or log: a logsumexp, as a reduction or
    as a NORMALIZE's total."""
    return (pattern.reduce and sr.reduction == "logsumexp") or (
        pattern.normalize and sr.normalization == "subtract_logsumexp"
    )


def _chunk_range(chunk_of: str, reduce: bool) -> list[str]:
    """The kernel's first lines: the outputs (n_out), and this chunk's range lo..hi-1 of
    output elements (chunk_of "elements") or rows (chunk_of "rows")."""
    lines = [
        "    R = P[p + OUT_RANK]",
        "    D = R + P[p + RED_RANK]",
        "    n_out = np.int64(1)  # not the literal 1: see ZERO",
        "    for d in range(R):",
        "        n_out *= P[p + SIZES + d]",
    ]
    if chunk_of == "elements":
        lines += ["    n_work = n_out  # a chunk is a range of output elements"]
    else:
        end = "R" if reduce else "D"  # the vector's last axis + 1
        lines += [
            "    n_work = np.int64(1)  # a chunk is a range of rows",
            f"    for d in range({end} - P[p + BLOCK_AXES]):",
            "        n_work *= P[p + SIZES + d]",
        ]
    return lines + [
        "    lo, hi = ZERO, n_work  # fixed chunks: the results do not depend on who runs them",
        "    if chunks > 1:",
        "        lo, hi = n_work * chunk // chunks, n_work * (chunk + 1) // chunks",
    ]


def splits_finish(sr: Semiring, pattern: KernelPattern) -> bool:
    """Whether the kernel may do its NORMALIZE in parts (abi.SPLIT_FINISH): a division by
    the total (PROB), whose total's parts (in lanes) and division pass the threads share."""
    return pattern.normalize and sr.normalization == "divide_by_total"


def after_chunks(sr: Semiring, pattern: KernelPattern) -> list[str]:
    """The kernel's lines for chunk >= chunks (mem, P, n_out known): what follows every
    chunk, at once (chunk == chunks) or, where it splits, the part the chunk names."""
    if not pattern.normalize:
        return ["    if chunk >= chunks:", "        return"]
    lines = ["    if chunk >= chunks:"]
    if splits_finish(sr, pattern):
        lines += [
            "        if chunk > chunks:  # a part of it (abi.SPLIT_FINISH); F: P's slots as float64",
            "            F = carray(pointer_float64(P_address), P_length)",
            "            finish_part(mem, P, F, p, n_out, chunk - chunks - 1, chunks)",
            "            return",
        ]
    return lines + ["        finish(mem, P, p, n_out)", "        return"]


def _finish_part(sr: Semiring, lanes: bool) -> str:
    """`finish_part`: `finish` in two passes of `chunks` parts each (abi.SPLIT_FINISH), for
    an output of one group. Part c of the first sums ranges of the output into the step's
    float64 slots (in lanes: parts_total's ranges, TOTAL_PARTS of them; else the whole
    total in the output's order, part 0 alone); part c of the second adds those up as
    `finish` does (the same bits), and divides range c of the elements by it."""
    total_parts = (
        [
            "        for k in range(TOTAL_PARTS * part // chunks, TOTAL_PARTS * (part + 1) // chunks):",
            "            lo, hi = size * k // TOTAL_PARTS, size * (k + 1) // TOTAL_PARTS",
            "            F[slots + k] = lane_total(mem, out + lo * es, es, hi - lo)",
        ]
        if lanes
        else [
            "        if part == 0:",
            "            total = 0.0",
            "            for o in range(size):",
            "                total += mem[u(out + o * es)]",
            "            F[slots] = total",
        ]
    )
    added = (
        ["    total = 0.0", "    for k in range(TOTAL_PARTS):", "        total += F[slots + k]"]
        if lanes
        else ["    total = F[slots]"]
    )
    lines = [
        "",
        # (called, not inlined: Numba's inliner would copy it into the kernel's every
        # block, and its passes are long)
        '@njit(cache=True, nogil=True, error_model="numpy")',
        "def finish_part(mem, P, F, p, n_out, part, chunks):",
        '    """Part `part` of the NORMALIZE\'s two passes (part < chunks: the first)."""',
        "    R = P[p + OUT_RANK]",
        "    D = R + P[p + RED_RANK]",
        "    out = P[p + OUT]",
        "    G = p + SIZES + D + R + P[p + LEAVES] * (1 + D)  # after the last leaf's strides",
        "    es, totals = P[G + 2], P[G + 3]  # (one group: plan/schedule.py splits no other)",
        "    size = n_out",
        "    slots = P[p + SCRATCH] + chunks * max(D, 1)  # after the chunks' loop counters",
        "    if part < chunks:",
        *total_parts,
        "        return",
        "    part -= chunks",
        *added,
        "    if part == 0 and totals >= 0:  # the total kept as a value of its own (plan/totals.py)",
        "        mem[totals] = total",
        "    if total != 0.0:",
        "        for o in range(size * part // chunks, size * (part + 1) // chunks):",
        "            mem[u(out + o * es)] = mem[u(out + o * es)] / total",
    ]
    return "\n".join(lines) + "\n"


def _finishes(sr: Semiring, pattern: KernelPattern) -> str:
    """The NORMALIZE's functions of a kernel: `finish`, and `finish_part` where it splits."""
    if not pattern.normalize:
        return ""
    split = _finish_part(sr, pattern.total_in_lanes) if splits_finish(sr, pattern) else ""
    return _finish(sr, pattern.dtype, pattern.total_in_lanes) + split


def _finish(sr: Semiring, dtype: str, lanes: bool = False) -> str:
    """The function for what follows every chunk: the NORMALIZE of the output. Inlined:
    it is small, and a step of one chunk calls it at once. lanes: its total by
    parts_total (KernelPattern.total_in_lanes: codegen/totals.py)."""
    lines = ["", parts_total_source(False)] if lanes else []
    lines += [
        "",
        INLINED,
        "def finish(mem, P, p, n_out):",
        '    """NORMALIZE the output, once every chunk is done."""',
        "    R = P[p + OUT_RANK]",
        "    D = R + P[p + RED_RANK]",
        "    out = P[p + OUT]",
    ]
    return "\n".join(lines + _normalize(sr, dtype, lanes=lanes)) + "\n"


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the kernel for `pattern`: readable and deterministic."""
    sr = SEMIRINGS[pattern.semiring]
    at = "[o, r]" if pattern.reduce else "[o]"
    terms = f"leaf_0{at} ⊗ leaf_1{at} ⊗ ... ⊗ leaf_(K-1){at}"
    # a chunk is a range of output elements (a reduction with a vector of reduced axes) or of rows
    chunk_of = "elements" if pattern.reduce and pattern.vector == ACROSS_REDUCED else "rows"
    lanes = pattern.sums_in_lanes
    sums = {"LANES", "stack_lanes_int64"} if lanes else set()
    if pattern.reduce and pattern.vector in (ACROSS_OUTPUTS, ACROSS_BOTH):
        sums = {"stack_buffer_" + _accumulator_type(sr, pattern.dtype)}
        if sr.reduction == "logsumexp":
            sums.add("stack_buffer_float64")
    lines = (
        HEADER.format(
            name=pattern.name,
            formula=("⊕_r " if pattern.reduce else "") + terms,
            semiring=sr.name,
            abi=abi.source_constants(),
            fields=STEP_FIELDS,
            dtype=pattern.dtype,
            then=", then NORMALIZE" if pattern.normalize else "",
            hot=(
                "innermost reduced axes"
                if chunk_of == "elements"
                else "innermost reduced and output axes"
                if pattern.reduce and pattern.vector == ACROSS_BOTH
                else "innermost output axes"
            ),
            walkers=_walkers(sr, pattern.dtype) + (LANES_ADDED_SOURCE if pattern.terms_in_lanes else ""),
            pointers=", ".join(
                sorted(
                    {
                        "pointer_int64",
                        "pointer_" + pattern.dtype,
                        "stack_leaves_int64",
                        "stack_buffer_" + pattern.dtype,
                    }
                    | {"fence_stores", "line_rest", "store_line", "store_part"}
                    | set(sums)
                    | ({"stack_buffer_float64"} if pattern.total_in_lanes else set())
                    | ({"pointer_float64"} if splits_finish(sr, pattern) else set())
                )
            ),
            libm=LIBM_IMPORT if uses_libm(sr, pattern) else "",
            entry=ENTRY,
            work="\n".join(_chunk_range(chunk_of, pattern.reduce)),
            after="\n".join(after_chunks(sr, pattern)),
            finish=_finishes(sr, pattern),
            part_doc=(
                "rows lo..hi-1: a row is one position of the odometer axes outside the vector"
                if chunk_of == "rows"
                else "output elements lo..hi-1 (flat, C order)"
            ),
        )
        .rstrip("\n")
        .split("\n")
    )
    across_outputs = pattern.reduce and pattern.vector == ACROSS_OUTPUTS
    across_both = pattern.reduce and pattern.vector == ACROSS_BOTH
    if pattern.reduce:  # cur[l]: leaf l's offset where the reduced sweep is
        lines += [
            "    cur = carray(stack_leaves_int64(), MAX_LEAVES)  # cur[l]: leaf l's offset in the sweep"
        ]
    if lanes:
        lines += [
            "    red = carray(stack_leaves_int64(), MAX_LEAVES)",
            "    outs = carray(stack_leaves_int64(), MAX_LEAVES)  # outs[g]: lane g's output offset",
            "    lane_base = carray(stack_lanes_int64(), LANES * MAX_LEAVES)  # [g * MAX_LEAVES + l]",
            "    PIECE = BUFFER // LANES  # a lane's piece of buf",
            "    # groups of whole innermost output axes where LANES allows: lanes that share a",
            "    # leaf's cache lines (an output axis of stride 3 inside them) sweep them together;",
            "    # but not groups of half the lanes or fewer, whose sums would wait on each other",
            "    group, d = np.int64(1), R - 1",
            "    while d >= 0 and group * P[N + d] <= LANES:",
            "        group *= P[N + d]",
            "        d -= 1",
            "    if 2 * group <= LANES:",
            "        group = np.int64(LANES)",
            "    # one CONTIGUOUS leaf and a vector of every reduced axis: no buf, no sweep",
            "    whole = K == 1 and P[p + BLOCK_AXES] == D - R and P[A] == CONTIGUOUS",
        ]
    if across_outputs or across_both:
        acc = _accumulator_type(sr, pattern.dtype)
        lines += [
            "    top = R - nb  # output odometer axes 0..top-1; vector top..R-1; reduced R..D-1",
            f"    sums = carray(stack_buffer_{acc}(), BUFFER)",
        ]
        if across_outputs and sr.reduction == "sum":
            lines += [
                "    # a CONTIGUOUS last leaf: its ⊗ and the sums' ⊕ in one pass (the same operations)",
                "    fused = K > 1 and P[A + (K - 1) * ACCESS_FIELDS] == CONTIGUOUS",
                "    first = K - 1 if fused else K  # the leaves multiplied into buf",
            ]
        if sr.reduction == "logsumexp":
            lines += ["    tops = carray(stack_buffer_float64(), BUFFER)"]
    else:
        lines += ["    top = D - nb  # odometer axes end here; vector axes top..D-1"]
    if across_both:
        lines += [
            "    # the vector: J positions of the innermost reduced axes rtop..D-1, each with S",
            "    # output elements (axes top..R-1), element j * S + s; the odometer walks R..rtop-1",
            "    S = np.int64(1)",
            "    for d in range(top, R):",
            "        S *= P[N + d]",
            "    J = V // S",
            "    rtop, n_j = D, np.int64(1)",
            "    while n_j < J:",
            "        rtop -= 1",
            "        n_j *= P[N + rtop]",
            "    v0, n = ZERO, V",
        ]
    lines += ["    o_off = out", "    for l in range(K):", f"        base[l] = P[{LEAF}]"]
    if across_both:
        lines += _place("    ", "top - 1", "lo")
        lines += ["    for row in range(lo, hi):"]
        lines += _across_both(sr, pattern.dtype)
        lines += _advance("        ", "0", "top - 1", "base", out=True)
        lines += FENCE
    elif across_outputs:
        lines += _place("    ", "top - 1", "lo")
        lines += [
            "    for row in range(lo, hi):",
            "        for v0 in range(0, V, BUFFER):",
            "            n = min(BUFFER, V - v0)",
        ]
        lines += _across_outputs(sr, pattern.dtype)
        lines += _advance("        ", "0", "top - 1", "base", out=True)
        lines += FENCE
    elif lanes:
        lines += _place("    ", "R - 1", "lo")
        lines += _lanes_reduction("    ", pattern.terms_in_lanes)
    elif pattern.reduce:
        lines += _place("    ", "R - 1", "lo")
        lines += ["    for o in range(lo, hi):"]
        lines += _reduced_value(sr, pattern.dtype)
        lines += ["        mem[o_off] = v"]
        lines += _advance("        ", "0", "R - 1", "base", out=True)
    else:
        lines += _place("    ", "top - 1", "lo")
        lines += [
            "    # a CONTIGUOUS last leaf and output: the last ⊗ writes the output (one pass",
            "    # over buf fewer, the same operations)",
            "    fused = K > 1 and P[AO] == CONTIGUOUS and P[A + (K - 1) * ACCESS_FIELDS] == CONTIGUOUS",
            "    first = K - 1 if fused else K  # the leaves multiplied into buf",
            "    for row in range(lo, hi):",
            "        for v0 in range(0, V, BUFFER):",
            "            n = min(BUFFER, V - v0)",
        ]
        lines += _product("            ", "base", count="first", pair_first=True)
        lines += [
            "            if fused:",
            "                times_store(buf, mem, o_off + v0, base[K - 1] + v0, n)",
            "            else:",
            "                store(buf, mem, P, AO, o_off, v0, n)",
        ]
        lines += _advance("        ", "0", "top - 1", "base", out=True)
        lines += FENCE

    if pattern.normalize:  # a step of one chunk: what follows it, at once
        lines += ["    if chunks == 1:", "        finish(mem, P, p, n_out)"]
    lines += [""]
    return "\n".join(lines)
