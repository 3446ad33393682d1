"""Numba source for the `contract_lines` kernel template on the CPU: a product computed a
cache line at a time in registers.

    out[o] = leaf_0[o] ⊗ leaf_1[o] ⊗ ... ⊗ leaf_(K-1)[o]

Its steps are contract_reduce's products with the same parameters (abi.StepParams):
plan/schedule.py (in_lines) gives them this template. It walks them the same way, rows of
the odometer axes outside the vector (the innermost output axes), but where contract_reduce
multiplies the leaves into a buffer and stores the buffer, this kernel computes each whole
line of the output in registers (codegen/lines.py), leaf after leaf, and writes it with
one store (a streaming one where the output is STREAMED); the parts of lines at a row's
two ends with one masked store each (where a streamed output's rows follow each other,
the line where two rows meet is asked for a few rows ahead: AHEAD). An output that is not
contiguous along the vector (STRIDED or GATHERED: its layout is not the loop's order;
rare) gets its lines from the row's start, stored a lane at a time (scatter). Stores to a
buffer, even one in L1, wait behind streaming stores in the core's store queue: grid5_d3's
largest product (115 MB, streamed) took 9.0 ms through the buffer, 3.6 ms in registers.
The same ⊗ in the same order, so the same bits. A NORMALIZE follows as in contract_reduce's
kernel, by the same `finish` once every chunk is done (_normalized).

It also computes reductions across outputs (a pattern that reduces: KernelPattern.
sums_in_lines, schedule.in_lines), contract_reduce's with the same parameters:

    out[o] = ⊕_r leaf_0[o, r] ⊗ ... ⊗ leaf_(K-1)[o, r]

A row's sums are lines of a buffer, one for each line of the output the row touches; at
each position of the reduced axes (the odometer over them, C order: the order of every
target) each line's product is computed in registers as above and added to its sums; then
the row is stored as a product's row is. Lane by lane 0 ⊕ t0 ⊕ t1 ..., the scalar code's
operations: the same bits. contract_reduce's kernel passes each leaf through its buffer
at each position: grid4x8_d2's exact reductions of 64 outputs and 128 terms took 4.0-4.3
us, 3.1 us here.
"""

from __future__ import annotations

import numpy as np

from .. import abi
from ..plan.steps import KernelPattern
from ..semiring import SEMIRINGS, Semiring
from .cpu import (
    INLINED,
    LEAF,
    LIBM_IMPORT,
    STEP_FIELDS,
    _advance,
    _finishes,
    _place,
    after_chunks,
    splits_finish,
)
from .intrinsics import LINE_BYTES

ENTRY = "kernel"

# Lines a row computes side by side: each leaf's access kind is read once for all of them
# (grid5_d3's 115 MB product: 4.3 ms a step one line at a time, 3.6 ms four)
GROUP = 4

# How many rows ahead a row asks for the output's line where two rows meet (_ask_ahead).
# A row's two ends are parts of lines, stored masked (plain: streaming stores write whole
# lines), and an output being written for the first time is not in the caches: each such
# store waited for its line from memory. grid5_d3's reassociating products of 14.3 M
# elements in rows of 243 (an AMD EPYC, Zen 3): 29-31 -> 15-21 ms on one thread, 13-15 ->
# 9.5-12 ms on two (alternating processes); the same bits (a prefetch moves no value).
AHEAD = 4

SOURCE = '''"""catbp_jit kernel {name}

out[o] = leaf_0[o] ⊗ leaf_1[o] ⊗ ... ⊗ leaf_(K-1)[o]   ({semiring}, {dtype})

P[p:] holds this step's parameters (catbp_jit/abi.py), as a contract_reduce product's. A
row (one position of the odometer axes outside the vector, the innermost output axes) is
written a cache line of W elements at a time: each line computed in registers, leaf after
leaf ({group} lines side by side), and stored with one store (a streaming one where the
output is STREAMED); the parts of lines at the row's two ends with one masked store each.
{reduces}{normalizes}"""
import numpy as np
from numba import carray, njit

from catbp_jit.codegen.intrinsics import (
    BUFFER,
    MAX_LEAVES,
    fence_stores,
    line_rest,
    opaque,
    pointer_int64,
    pointer_{dtype},
    prefetch_for_write,
    stack_buffer_{dtype},{float64_buffer}
    stack_leaves_int64,
){libm}
from catbp_jit.codegen.lines import (
    line_gather,
    line_gather_part,
    line_load,
    line_lane,
    line_load_part,
    line_splat,
    line_splat_part,
    line_strided,
    line_strided_part,
    line_zero,
    put_line,
    store_line_part,
    stream_line,
)

{abi}
ZERO, ONE = np.int64(0), np.int64(1)  # (int64s, never literals: see codegen/cpu.py's ZERO)
u = np.uint64  # (indices unsigned: see codegen/cpu.py's u)
W = {width}  # elements to a cache line: a line's (codegen/lines.py)
AHEAD = {ahead}  # rows: how far on a row asks for the output's line (prefetch_for_write)


{walkers}


{finish}@njit(cache=True, nogil=True, error_model="numpy")
def {entry}(mem_address, mem_length, P_address, P_length, p, chunk, chunks):
    """Chunk `chunk` of `chunks` of step p: a range of its rows (chunk == chunks: what
    follows them all{then}). Called with addresses, as every CPU kernel."""
{early}    R = P[p + OUT_RANK]
    n_work = np.int64(1)  # a chunk is a range of rows (not the literal 1: see ZERO)
    for d in range(R - P[p + BLOCK_AXES]):
        n_work *= P[p + SIZES + d]
    lo, hi = ZERO, n_work  # fixed chunks: the results do not depend on who runs them
    if chunks > 1:
        lo, hi = n_work * chunk // chunks, n_work * (chunk + 1) // chunks
    # rows lo..hi-1: a row is one position of the odometer axes outside the vector
    # (written here, not in a function Numba inlines: see codegen/cpu.py's INLINED)
    idx = P[p + SCRATCH] + chunk * (R + P[p + RED_RANK])  # this chunk's odometer counters
{fields}
    base = carray(stack_leaves_int64(), MAX_LEAVES)  # base[l]: leaf l's offset at the row's start
{sweep_offsets}    top = R - nb  # row odometer axes end here; vector axes top..R-1 (reduced: R..D-1)
    streamed = P[AO] == STREAMED
    in_lines = streamed or P[AO] == CONTIGUOUS  # the output's lines, else its elements scattered
    # a streamed output (beyond the caches) whose rows follow each other: a row's last line
    # is the next one's first, two masked stores that would each wait for it from memory,
    # so a row asks for the line AHEAD rows on
    ask_ahead = streamed and top > 0 and P[SO + top - 1] == V
    o_off = out
    for l in range(K):
        base[l] = P[{leaf}]
{rows}
    if streamed:
        fence_stores()  # before another thread reads what this one streamed
{last}'''


def _walkers(sr: Semiring) -> str:
    """The line functions: the product of the K leaves' parts of a line, and of GROUP whole
    lines side by side. Each leaf's lines are loaded by its access kind, then multiplied
    in: one ⊗ in the source per line (each call of an inlined function is typed and
    inlined again: the kernel compiles in 1.4 s, not 2.3 s)."""
    return "\n\n\n".join([_part_product(sr), _group_product(sr), _scatter()])


def _scatter() -> str:
    """scatter: lanes of a line to an output that is not contiguous along the vector."""
    return "\n".join(
        [
            INLINED,
            "def scatter(mem, P, a, base, v, x, lo, hi):",
            '    """The output\'s elements v+lo..v+hi-1 = lanes lo..hi-1 of x, one at a time: a',
            '    STRIDED or GATHERED output (a: its access in P), whose elements are not one line."""',
            "    kind, step, table = P[a], P[a + 1], P[a + 2]",
            "    for w in range(lo, hi):",
            "        at = base + (v + w) * step if kind == STRIDED else base + P[u(table + v + w)]",
            "        mem[u(at)] = line_lane(x, w)",
        ]
    )


def _part_product(sr: Semiring) -> str:
    """part_product: the product of the K leaves' lanes lo..hi-1 of the line at v."""
    loads = {
        "CONSTANT": "line_splat_part(mem, b, lo, hi)",
        "CONTIGUOUS": "line_load_part(mem, b + v, lo, hi)",
        "GATHERED": "line_gather_part(mem, b, P, table + v, step, lo, hi)",
        "STRIDED": "line_strided_part(mem, b + v * step, step, lo, hi)",
    }
    lines = [
        INLINED,
        "def part_product(mem, P, A, base, v, K, lo, hi):",
        '    """The ⊗-product of the K leaves\' elements v+lo..v+hi-1, left to right, as lanes',
        '    lo..hi-1 of a line (0 in the others)."""',
        "    x = line_splat_part(mem, base[0], lo, hi)  # (typed here; leaf 0 sets it)",
        "    for l in range(K):",
        "        a = A + l * ACCESS_FIELDS",
        "        kind, step, table, b = P[u(a)], P[u(a + 1)], P[u(a + 2)], base[l]",
    ]
    for i, (kind, load) in enumerate(loads.items()):
        test = "else:  # STRIDED" if i == 3 else f"{'elif' if i else 'if'} kind == {kind}:"
        lines += [f"        {test}", f"            y = {load}"]
    lines += [f"        x = y if l == 0 else {sr.line_product(['x', 'y'])}"]
    return "\n".join(lines + ["    return x"])


def _group_at() -> list[str]:
    """The starts of a group's lines, from v."""
    return ["v"] + [f"v + {g} * W" if g > 1 else "v + W" for g in range(1, GROUP)]


def _group_product(sr: Semiring) -> str:
    """leaf_lines: a leaf's GROUP whole lines, its access kind read once for them all;
    lines_product: the products of the K leaves' lines side by side. Leaf 0 is loaded
    before the loop over the others (LLVM peeled it itself while the loop was small: with
    a test of l == 0 in it, the lines' registers were copied at every leaf and grid4x8_d2's
    products of three contiguous leaves ran 25% slower)."""
    xs, ys, at = [f"x{g}" for g in range(GROUP)], [f"y{g}" for g in range(GROUP)], _group_at()
    loads = {
        "CONTIGUOUS": lambda v: f"line_load(mem, b + {v})",
        "GATHERED": lambda v: f"line_gather(mem, b, P, table + {v}, step)",
        "STRIDED": lambda v: f"line_strided(mem, b + {v if v == 'v' else f'({v})'} * step, step)",
    }
    lines = [
        INLINED,
        "def leaf_lines(mem, P, A, base, v, l):",
        f'    """Leaf l\'s elements of the {GROUP} lines from v."""',
        "    a = A + l * ACCESS_FIELDS",
        "    kind, step, table, b = P[u(a)], P[u(a + 1)], P[u(a + 2)], base[l]",
        "    if kind == CONSTANT:",
        f"        {ys[0]} = line_splat(mem, b)",
    ]
    lines += [f"        {y} = {ys[0]}" for y in ys[1:]]
    for i, (kind, load) in enumerate(loads.items()):
        lines += [f"    elif kind == {kind}:" if i < 2 else "    else:  # STRIDED"]
        lines += [f"        {y} = {load(v)}" for y, v in zip(ys, at)]
    lines += [f"    return {', '.join(ys)}", "", "", INLINED]
    lines += [
        "def lines_product(mem, P, A, base, v, K):",
        f'    """The ⊗-products of the K leaves\' elements of the {GROUP} lines from v, left to',
        '    right, side by side."""',
        f"    {', '.join(xs)} = leaf_lines(mem, P, A, base, v, ZERO)",
        "    for l in range(ONE, K):",
        f"        {', '.join(ys)} = leaf_lines(mem, P, A, base, v, l)",
    ]
    lines += [f"        {x} = {sr.line_product([x, y])}" for x, y in zip(xs, ys)]
    return "\n".join(lines + [f"    return {', '.join(xs)}"])


def _ask_ahead(ind: str) -> list[str]:
    """Where a streamed output's rows follow each other, the line that starts the row AHEAD
    rows on, asked for now: it holds the end of one row and the start of the next, two
    masked stores (a part of a line cannot be streamed) that would otherwise each wait for
    the line to come from memory. (An output the caches hold has its lines near: there the
    prefetch was no gain.)"""
    return [f"{ind}if ask_ahead:", f"{ind}    prefetch_for_write(mem, o_off + AHEAD * V)"]


def _rows() -> list[str]:
    """The loop over rows: each row's whole lines GROUP at a time, then a line at a time
    its other whole lines and the parts of lines at its two ends; then the odometer's step
    to the next row."""
    xs = ", ".join(f"x{g}" for g in range(GROUP))
    lines = [
        "    for row in range(lo, hi):",
        "        # the row starts at lane W - rest of a line (a scattered output: at lane 0)",
        "        rest = line_rest(mem, o_off) if in_lines else ZERO",
        "        head = min(V, rest)  # elements before its first whole line",
        "        body = head + (V - head) // W * W  # where its last whole line ends",
        "        v = head",
        *_ask_ahead("        "),
        f"        while in_lines and v + {GROUP} * W <= body:",
        f"            {xs} = lines_product(mem, P, A, base, v, K)",
    ]
    lines += ["            if streamed:"]
    lines += [f"                stream_line(mem, o_off + {v}, x{g})" for g, v in enumerate(_group_at())]
    lines += ["            else:"]
    lines += [f"                put_line(mem, o_off + {v}, x{g})" for g, v in enumerate(_group_at())]
    lines += [
        f"            v += {GROUP} * W",
        "        # the rest a line at a time, in one loop (part_product inlined once): the whole",
        "        # lines left, then the part of a line at the row's end, then at its start",
        "        pieces = (body - v) // W + 2",
        "        for piece in range(pieces):",
        "            if piece < pieces - 2:",
        "                at, first, last = v + piece * W, ZERO, W  # (from o_off; lanes first..last-1)",
        "            elif piece == pieces - 2:",
        "                at, first, last = body, ZERO, V - body",
        "            else:",
        "                at, first, last = rest - W, W - rest, W - rest + head",
        "            if last > first:",
        "                x = part_product(mem, P, A, base, at, K, first, last)",
    ]
    return lines + _stored("                ") + _advance("        ", "0", "top - 1", "base", out=True)


def _sum_rows() -> list[str]:
    """The loop over rows of a reduction: a row's sums in the buffer `sums`, a line of it
    for each line of the output that the row touches (the first and last may be parts),
    zero first; at each position of the reduced axes (C order, the order of every
    target), each line's products added to its sums (each leaf's access read once for
    GROUP whole lines, the others a line at a time); then the row stored, each line as a
    product's is. Sums in registers instead, GROUP or 8 lines of them walking the reduced
    axes once each, ran grid6_d2 exact 10% slower (a long row walks them many times)."""
    xs = [f"x{g}" for g in range(GROUP)]
    lines = [
        "    for row in range(lo, hi):",
        "        # the row starts at lane `skew` of the buffer's first line, as in the output",
        "        # (a scattered output: at lane 0)",
        "        skew = (W - line_rest(mem, o_off)) % W if in_lines else ZERO",
        *_ask_ahead("        "),
        "        n_lines = (skew + V + W - 1) // W",
        "        whole = ONE if skew else ZERO  # the first whole line; its whole lines end at `end`",
        "        end = (skew + V) // W",
        "        for j in range(n_lines):",
        "            store_line_part(sums, j * W, line_zero(sums), ZERO, W)",
        "        for d in range(R, D):",
        "            P[idx + d] = nought",
        "        for l in range(K):",
        "            cur[l] = opaque(base[l])",
        "        while True:",
        "            j = whole",
        f"            while j + {GROUP} <= end:",
        f"                {', '.join(xs)} = lines_product(mem, P, A, cur, j * W - skew, K)",
    ]
    for g, x in enumerate(xs):
        at = f"(j + {g}) * W" if g else "j * W"
        lines += [f"                store_line_part(sums, {at}, line_load(sums, {at}) + {x}, ZERO, W)"]
    lines += [
        f"                j += {GROUP}",
        "            # the rest a line at a time (part_product inlined once): the whole lines",
        "            # left, then the last line if a part, then the first",
        "            pieces = end - j + 2",
        "            for piece in range(pieces):",
        "                if piece < pieces - 2:",
        "                    at = j + piece",
        "                elif piece == pieces - 2:",
        "                    at = end if end < n_lines and end >= whole else -ONE",
        "                else:",
        "                    at = ZERO if whole else -ONE",
        "                if at >= 0:",
        "                    first, last = max(skew - at * W, ZERO), min(W, skew + V - at * W)",
        "                    x = part_product(mem, P, A, cur, at * W - skew, K, first, last)",
        "                    store_line_part(sums, at * W, line_load(sums, at * W) + x, ZERO, W)",
    ]
    lines += _advance("            ", "R", "D - 1", "cur", out=False)
    lines += [
        "            if d < R:",
        "                break",
        "        for j in range(n_lines):  # the row's sums to the output",
        "            x = line_load(sums, j * W)",
        "            at, first, last = j * W - skew, max(skew - j * W, ZERO), min(W, skew + V - j * W)",
    ]
    return lines + _stored("            ") + _advance("        ", "0", "top - 1", "base", out=True)


def _stored(ind: str) -> list[str]:
    """Lanes first..last-1 of the line x to the output's elements at..., from o_off: one
    store (streaming where the output is STREAMED), a masked one for a part of a line, a
    lane at a time where the output is scattered."""
    return [
        f"{ind}if not in_lines:",
        f"{ind}    scatter(mem, P, AO, o_off, at, x, first, last)",
        f"{ind}elif last - first == W:",
        f"{ind}    if streamed:",
        f"{ind}        stream_line(mem, o_off + at, x)",
        f"{ind}    else:",
        f"{ind}        put_line(mem, o_off + at, x)",
        f"{ind}else:",
        f"{ind}    store_line_part(mem, o_off + at, x, first, last)",
    ]


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the contract_lines kernel for `pattern`."""
    sr = SEMIRINGS[pattern.semiring]
    return SOURCE.format(
        name=pattern.name,
        semiring=sr.name,
        dtype=pattern.dtype,
        group=GROUP,
        abi=abi.source_constants(),
        width=LINE_BYTES // np.dtype(pattern.dtype).itemsize,
        walkers=_walkers(sr),
        fields=STEP_FIELDS,
        leaf=LEAF,
        rows="\n".join(_place("    ", "top - 1", "lo") + (_sum_rows() if pattern.reduce else _rows())),
        sweep_offsets=(
            "    cur = carray(stack_leaves_int64(), MAX_LEAVES)  # cur[l]: leaf l's offset in a sum\n"
            f"    sums = carray(stack_buffer_{pattern.dtype}(), BUFFER)  # a row's sums, line by line\n"
            if pattern.reduce
            else ""
        ),
        entry=ENTRY,
        ahead=AHEAD,
        reduces=(
            "It reduces: out[o] = ⊕_r over the reduced axes of those products, a row's sums in\n"
            "the buffer `sums` (added to at each position of the reduced axes), then stored.\n"
            if pattern.reduce
            else ""
        ),
        **_normalized(sr, pattern),
        **_imports(sr, pattern),
    )


def _imports(sr: Semiring, pattern: KernelPattern) -> dict[str, str]:
    """What a NORMALIZE's `finish` imports beyond the products: a float64 buffer for a
    total in lanes (parts_total), and exp and log for LOGPROB's."""
    lanes_total = pattern.total_in_lanes and pattern.dtype != "float64"
    split = splits_finish(sr, pattern) and pattern.dtype != "float64"
    return dict(
        float64_buffer=("\n    stack_buffer_float64," if lanes_total else "")
        + ("\n    pointer_float64," if split else ""),
        libm=LIBM_IMPORT if pattern.normalize and sr.normalization == "subtract_logsumexp" else "",
    )


def _normalized(sr: Semiring, pattern: KernelPattern) -> dict[str, str]:
    """The parts of the source that a NORMALIZE adds: contract_reduce's `finish` (the same
    function: the same bits), called when every chunk is done (chunk == chunks), or at once
    after a step of one chunk. Its sums read the output back: a streamed one too, after this
    thread's fence (the dispatcher calls it once every chunk's thread has fenced its own)."""
    arrays = [
        f"    mem = carray(pointer_{pattern.dtype}(mem_address), mem_length)",
        "    P = carray(pointer_int64(P_address), P_length)",
    ]
    if not pattern.normalize:
        early = ["    if chunk >= chunks:", "        return", *arrays]
        return dict(finish="", then=", which is nothing", early=_joined(early), last="", normalizes="")
    early = [
        *arrays,
        "    n_out = np.int64(1)",
        "    for d in range(P[p + OUT_RANK]):",
        "        n_out *= P[p + SIZES + d]",
        *after_chunks(sr, pattern),
    ]
    last = [
        "    if chunks == 1:  # a step of one chunk: its NORMALIZE at once",
        "        finish(mem, P, p, n_out)",
    ]
    return dict(
        finish=_finishes(sr, pattern).lstrip("\n") + "\n\n",
        then=": the NORMALIZE",
        early=_joined(early),
        last=_joined(last),
        normalizes="Then the output is NORMALIZEd (`finish`, contract_reduce's), once every chunk is done.\n",
    )


def _joined(source: list[str]) -> str:
    """Lines of source as text, each ending in a newline."""
    return "".join(line + "\n" for line in source)
