"""Numba source for the `repack` kernel template on the CPU: the copies of a loop step's
small gathered leaves into its vector's order (plan/repack.py), run as a step of their own
just before it.

A copy walks the positions of its axes (C order) with an odometer whose counters live in
P's scratch area, and at each position gathers V elements through the leaf's offset table
into V consecutive elements of the workspace. A step with much to copy is cut into chunks
like a loop step (codegen/dispatch.py), each a range of the positions of all its copies
taken in order, with loop counters of its own. It only moves values: its source depends
on the dtype alone (its pattern still names the plan's semiring, so each semiring has a
kernel of its own), and the step after it computes the bits it would have computed from
the leaves themselves.
"""

from __future__ import annotations

import numpy as np

from .. import abi
from ..plan.steps import KernelPattern
from .intrinsics import LINE_BYTES

ENTRY = "kernel"

SOURCE = '''"""catbp_jit kernel {name}

For each copy (catbp_jit/abi.py, a repack step's parameters at P[p:]), at every index i
over its m axes (C order) and v < V:
    mem[dst + Σ i_d dst_d + v] = mem[src + Σ i_d src_d + P[table + v]]
"""
import numpy as np
from numba import carray, njit

from catbp_jit.codegen.intrinsics import pointer_int64, pointer_{dtype}
{line_imports}
{abi}
# (indices unsigned: see codegen/cpu.py; int64 constants, never literals: see its ZERO)
u = np.uint64
ZERO, ONE = np.int64(0), np.int64(1)
{width}

@njit(cache=True, nogil=True, error_model="numpy")
def {entry}(mem_address, mem_length, P_address, P_length, p, chunk, chunks):
    """Chunk `chunk` of `chunks` of repack step p: a range of its copies' positions, taken
    in order (chunk == chunks: what follows them all, which is nothing)."""
    if chunk >= chunks:
        return
    mem = carray(pointer_{dtype}(mem_address), mem_length)
    P = carray(pointer_int64(P_address), P_length)
    V = P[p + REPACK_V]
    # the positions of all copies, and the longest copy's axes (a chunk's counters)
    rows, most, r = ZERO, ONE, p + REPACK_HEADER
    for _ in range(P[p + REPACK_COUNT]):
        m = P[r + COPY_RANK]
        axes = r + GATHERED_COPY_HEADER  # per axis: size, source stride, destination stride
        n = ONE
        for k in range(m):
            n *= P[axes + COPY_AXIS_FIELDS * k]
        rows += n
        most = max(most, m)
        r = axes + COPY_AXIS_FIELDS * m
    # fixed chunks: the same copies whoever runs them
    lo, hi = rows * chunk // chunks, rows * (chunk + 1) // chunks
    idx = P[p + REPACK_SCRATCH] + chunk * most
    first, r = ZERO, p + REPACK_HEADER  # first: the current copy's first position
    for _ in range(P[p + REPACK_COUNT]):
        m, table, step = P[r + COPY_RANK], P[r + COPY_TABLE], P[r + COPY_STEP]
        axes = r + GATHERED_COPY_HEADER
        n = ONE
        for k in range(m):
            n *= P[axes + COPY_AXIS_FIELDS * k]
        start, stop = max(lo - first, ZERO), min(hi - first, n)
        if start < stop:
            src, dst = P[r + COPY_SRC], P[r + COPY_DST]
            rem = start  # the odometer placed at position `start`
            for k in range(m - 1, -1, -1):
                a = axes + COPY_AXIS_FIELDS * k
                i = rem % P[a]
                rem //= P[a]
                P[idx + k] = i
                src += i * P[a + 1]
                dst += i * P[a + 2]
            for _ in range(start, stop):
{copy}                k = m - 1
                while k >= 0:  # the odometer, the last axis fastest
                    a = axes + COPY_AXIS_FIELDS * k
                    P[idx + k] += 1
                    src += P[a + 1]
                    dst += P[a + 2]
                    if P[idx + k] < P[a]:
                        break
                    src -= P[a + 1] * P[a]
                    dst -= P[a + 2] * P[a]
                    P[idx + k] = 0
                    k -= 1
        first += n
        r = axes + COPY_AXIS_FIELDS * m
'''


# A position's V elements a cache line at a time: a gather instruction and a store per
# line (grid4x8_d2's 256-element copies: ~0.8 cycles an element one at a time). Not for
# bools: no machine gathers bytes, and a line of them is 64 elements, more than most V.
IN_LINES = ("float64", "float32", "int64")

COPY_IN_LINES = """\
                v = ZERO
                while v + W <= V:  # whole lines (a line's store need not start one)
                    store_line_part(mem, dst + v, line_gather(mem, src, P, table + v, step), ZERO, W)
                    v += W
                if v < V:  # the part of a line left
                    x = line_gather_part(mem, src, P, table + v, step, ZERO, V - v)
                    store_line_part(mem, dst + v, x, ZERO, V - v)
"""

COPY_ONE_AT_A_TIME = """\
                for v in range(V):
                    mem[u(dst + v)] = mem[u(src + P[u(table + v)])]
"""


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the repack kernel of `pattern` (its dtype alone counts)."""
    lines = pattern.dtype in IN_LINES
    width = LINE_BYTES // np.dtype(pattern.dtype).itemsize
    return SOURCE.format(
        name=pattern.name,
        dtype=pattern.dtype,
        abi=abi.repack_source_constants(),
        entry=ENTRY,
        line_imports=(
            "from catbp_jit.codegen.lines import line_gather, line_gather_part, store_line_part\n"
            if lines
            else ""
        ),
        width=f"W = {width}  # elements to a cache line (codegen/lines.py)\n" if lines else "",
        copy=COPY_IN_LINES if lines else COPY_ONE_AT_A_TIME,
    )
