"""Numba source for the `gemm` kernel template on the CPU (reassociating mode only).

One step computes, per position of its batch axes, out[i][j] = ⊕_k a[i][k] ⊗ b[k][j]
with one BLAS call into the preallocated output, the one Numba's np.dot(a, b, out) would
make (intrinsics.blas_dot; BLAS through SciPy; plan/gemm.py says which segments qualify
and abi.py where the parameters sit). Each leaf is a C-order matrix or the transpose of
one, which the call's transposition flags say when it runs (no copy is made).

LOGPROB: exp(a - ma) · exp(b - mb) into the output, ma the row maxima of a and mb the
column maxima of b (0 where a maximum is not finite), then out = log(out) + ma + mb. An
element whose product sum is not a safe normal number (below SAFE: the sum underflowed or
is empty, or inf/NaN) is computed again directly with the loop kernels' two-pass
logsumexp: so an all -inf sum gives -inf, NaN and +inf come out as the loop kernels give
them, and a finite result is within rounding of the reference whatever the spread of the
terms. The shifted exponentials live in the step's workspace (GEMM_WORK).

MAXLOG: no BLAS, a max-plus product of our own, out[i][j] = max_k a[i][k] + b[k][j],
b a C-order [K][N] matrix (plan/gemm.py copies one that is not). ROWS x COLS outputs at
a time are kept in registers while k runs: per k, ROWS elements of a and one vector of
b's row k, an addition and a max per output (`x if x > s else s`: a select, which LLVM
makes a packed max). Each output takes its terms in the order of k and keeps the first
of equal ones, as the loop kernels' `if x > acc or x != x` does, so the bits are theirs.
That select drops a NaN term, which the loop kernels keep: a term is NaN only where an
operand is NaN or +inf meets -inf, so tiles run only where b and the tile's rows of a
are all below +inf (a cheap scan); other rows are computed one at a time with the loop
kernels' sticky max. The threads share the rows of each product, in parts of whole tiles
(each element computed alone: the bits do not depend on the parts).
"""

from __future__ import annotations

import textwrap

from .. import abi
from ..plan.gemm import LOG_PARTS, MAX_PLUS_COLS, MAX_PLUS_ROWS
from ..plan.steps import KernelPattern
from ..semiring import SEMIRINGS
from .cpu import LIBM_IMPORT, _normalize, uses_libm
from .totals import parts_total_source

ENTRY = "kernel"
TILE = 16
# a copy's blocks are cut into this many parts, each walked by an odometer (a constant, not
# the thread count, as PARTS below)
COPY_PARTS = 64

# MAXLOG's tile of outputs kept in registers: ROWS rows of COLS (128 bytes a row in
# float64). Measured on a 441^3 product, one core: 4 x 16 and 8 x 8 tiles ~12 terms a ns,
# compiled for AVX-512 as for AVX2; smaller ones (4 x 8, 3 x 16), which LLVM left scalar,
# 4x slower
ROWS, COLS = MAX_PLUS_ROWS, MAX_PLUS_COLS  # (plan/gemm.py's cost model reads them too)
# a parallel step's products are cut into this many parts at least (whole tiles of rows),
# which the threads share: each part reads all of b (and checks it for +inf and NaN), so
# not many more. (A constant, not the thread count: get_num_threads would keep Numba from
# caching the kernel.)
PARTS = 16

# a shifted product sum at least this large carries full relative precision: every term is
# <= 1 and those that underflowed are below the dtype's smallest normal, far under it
SAFE = {"float64": "1e-250", "float32": "1e-25"}

HEADER = '''"""catbp_jit kernel {name}

out[i][j] = {formula}   ({semiring}, {dtype}{then}), one BLAS GEMM per batch position

P[p:] holds this step's parameters (catbp_jit/abi.py, the GEMM section).
"""
import math

import numpy as np
from numba import carray, njit{prange}

from catbp_jit.codegen.intrinsics import {pointers}{libm}

{abi}
'''

DOT = '''

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def dot(mem, ao, a_t, bo, b_t, oo, M, N, K, scale):
    """out = scale · (a · b) at these offsets, each leaf C-order or transposed (np.dot's
    BLAS calls where scale is 1)."""
    blas_dot(mem, ao, a_t, bo, b_t, oo, M, N, K, scale)
'''

# a's element (i, k) sits at ao + i * ai + k * ak; b's (k, j) at bo + k * bk + j * bj
LOG_DOT = '''

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def log_dot(mem, ao, a_t, bo, b_t, oo, M, N, K, w):
    """out = log(exp(a) · exp(b)), shifted; unsafe elements summed directly."""
    ai, ak = (1, M) if a_t else (K, 1)
    bk, bj = (1, K) if b_t else (N, 1)
    ea, eb, ma, mb = w, w + M * K, w + M * K + K * N, w + M * K + K * N + M
    for i in range(M):
        top = -np.inf
        for k in range(K):
            top = max(top, mem[ao + i * ai + k * ak])
        mem[ma + i] = top if math.isfinite(top) else 0.0
    for j in range(N):
        top = -np.inf
        for k in range(K):
            top = max(top, mem[bo + k * bk + j * bj])
        mem[mb + j] = top if math.isfinite(top) else 0.0
    for i in range(M):  # exp(a - ma) and exp(b - mb), stored as a and b are
        for k in range(K):
            at = i * ai + k * ak
            mem[ea + at] = libm.exp(mem[ao + at] - mem[ma + i])
    for j in range(N):
        for k in range(K):
            at = k * bk + j * bj
            mem[eb + at] = libm.exp(mem[bo + at] - mem[mb + j])
    dot(mem, ea, a_t, eb, b_t, oo, M, N, K, 1.0)
    for i in range(M):
        for j in range(N):
            s = mem[oo + i * N + j]
            if s >= SAFE and s < np.inf:
                mem[oo + i * N + j] = libm.log(s) + mem[ma + i] + mem[mb + j]
                continue
            top_x = -np.inf  # pass 1: the largest term (a NaN sticks)
            for k in range(K):
                x = mem[ao + i * ai + k * ak] + mem[bo + k * bk + j * bj]
                if x > top_x or x != x:
                    top_x = x
            if top_x == -np.inf:
                mem[oo + i * N + j] = top_x
                continue
            acc = 0.0  # pass 2: the sum of exp(x - top_x)
            for k in range(K):
                x = mem[ao + i * ai + k * ak] + mem[bo + k * bk + j * bj]
                if x != -np.inf:  # (exp(-inf) adds nothing)
                    acc += libm.exp(x - top_x)
            mem[oo + i * N + j] = top_x + libm.log(acc)
'''

# A parallel step (many small products: plan/gemm.py) shares its copies' blocks and its
# batch positions among the threads; every element is computed alone, as in the serial
# kernel, so the bits do not depend on the thread count.
COPY = '''

@njit(cache=True, nogil=True, error_model="numpy"{parallel})
def strided_copy{suffix}(mem, P, q{total}):
    """The copy at P[q:] (abi.py: StridedCopy, or GroupedCopy){what}; returns where the
    next copy starts. A StridedCopy's last two axes are walked in blocks of TILE positions
    of the one before last (plan/copies.py puts the destination's densest axis last and the
    source's before it: a transpose then reads and writes whole cache lines), the rows
    (positions of the axes before them) by an odometer; a GroupedCopy's blocks are its
    tables' rows x columns, one at each position of its outer axes, walked by the same
    odometer. The threads share COPY_PARTS parts of the blocks, each part placed by div/mod
    once (once a block cost 14 ns an element on a grid's copies of many binary axes)."""
    src, dst, rank = P[q + COPY_SRC], P[q + COPY_DST], P[q + COPY_RANK]
    if rank == COPY_GROUPED:
        ax = q + GROUPED_HEADER
        rank = P[q + GROUPED_RANK] + 2  # (the odometer walks the axes before the last two)
        tables = ax + COPY_AXIS_FIELDS * P[q + GROUPED_RANK]
        m, n = P[q + GROUPED_ROWS], P[q + GROUPED_COLS]
        ms, md, ss, ds = np.int64(0), np.int64(0), np.int64(0), np.int64(0)
        dense = P[q + GROUPED_DENSE]
        blocks = np.int64(1)
        end = tables + 2 * (m + n)
    else:
        ax = q + COPY_HEADER
        last = ax + COPY_AXIS_FIELDS * (rank - 1)
        n, ss, ds = P[last], P[last + 1], P[last + 2]
        m, ms, md = np.int64(1), np.int64(0), np.int64(0)  # one row of n, if rank is 1
        if rank > 1:
            tile = last - COPY_AXIS_FIELDS
            m, ms, md = P[tile], P[tile + 1], P[tile + 2]
        tables, dense = np.int64(-1), np.int64(0)
        blocks = (m + TILE - 1) // TILE
        end = last + COPY_AXIS_FIELDS
    rows = np.int64(1)
    for d in range(rank - 2):
        rows *= P[ax + COPY_AXIS_FIELDS * d]
    tasks = rows * blocks
    parts = min(tasks, COPY_PARTS)
    for c in {rows}(parts):
        lo, hi = tasks * c // parts, tasks * (c + 1) // parts
        copy_part{suffix}(
            mem, P, ax, rank, src, dst, lo, hi, blocks, m, ms, md, n, ss, ds, tables, dense{total}
        )
    return end


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def copy_part{suffix}(mem, P, ax, rank, src, dst, lo, hi, blocks, m, ms, md, n, ss, ds, tables, dense{total}):
    """Blocks lo..hi-1: block t is positions TILE * (t % blocks).. of the axis before
    last, in row t // blocks (a GroupedCopy's: its block at outer position t); the rows'
    odometer counters in `at`."""
    at = carray(stack_leaves_int64(), MAX_LEAVES)
    rem = lo // blocks
    for d in range(rank - 3, -1, -1):
        f = ax + COPY_AXIS_FIELDS * d
        i = rem % P[f]
        rem //= P[f]
        at[d] = i
        src += i * P[f + 1]
        dst += i * P[f + 2]
    b = lo % blocks
    for _ in range(lo, hi):
        if tables >= 0:
            grouped_block{suffix}(mem, P, src, dst, tables, m, n, dense{total})
        else:
            copy_block{suffix}(mem, src, dst, TILE * b, m, ms, md, n, ss, ds{total})
        b += 1
        if b == blocks:  # the next row
            b = 0
            d = rank - 3
            while d >= 0:
                f = ax + COPY_AXIS_FIELDS * d
                at[d] += 1
                src += P[f + 1]
                dst += P[f + 2]
                if at[d] < P[f]:
                    break
                src -= P[f + 1] * P[f]
                dst -= P[f + 2] * P[f]
                at[d] = 0
                d -= 1


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def copy_block{suffix}(mem, src, dst, i0, m, ms, md, n, ss, ds{total}):
    """Positions i0..i0+TILE-1 of the axis before last in the row at src, dst: where
    both last axes are dense, each position's n elements as one run (a loop LLVM
    vectorizes); else in TILE x TILE tiles.{block_what}"""
    i1 = min(i0 + TILE, m)
    if ss == 1 and ds == 1:
        for i in range(i0, i1):
            s, d = src + i * ms, dst + i * md
{dense_run}
    else:
        for t0 in range(0, n, TILE):
            t1 = min(t0 + TILE, n)
            for i in range(i0, i1):
                s, d = src + i * ms, dst + i * md
{tiled_run}


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def grouped_block{suffix}(mem, P, src, dst, tables, m, n, dense{total}):
    """A GroupedCopy's block at src, dst: m rows of n columns, their offsets in the
    tables at P[tables:] (rows' source, rows' destination, columns' source, columns'
    destination); `dense`: the columns are written one after another.{block_what}"""
    rs, rd, cs, cd = tables, tables + m, tables + 2 * m, tables + 2 * m + n
    for r in range(m):
        s, d = src + P[rs + r], dst + P[rd + r]
        if dense:
{dense_columns}
        else:
{scattered_columns}
'''


def _run(indent: str, loop: str, dst: str, src: str, divided: bool) -> str:
    """A copy's innermost loop; divided: by total, unless total is 0 (then a plain copy)."""
    plain = f"{indent}{loop}\n{indent}    mem[u({dst})] = mem[u({src})]"
    if not divided:
        return plain
    divide = f"{indent}    {loop}\n{indent}        mem[u({dst})] = mem[u({src})] / total"
    return f"{indent}if total != 0.0:\n{divide}\n{indent}else:\n" + textwrap.indent(plain, "    ")


# A kernel with a dividing copy has no plain one besides: a plain copy is the dividing one
# with a total of 0, which divides nothing (as a NORMALIZE leaves an all-zero output).
# (Numba compiles each parallel loop as a function of its own: a second copy, and its
# parallel loop, was 3-4 s more of a 17 s compile on an AMD EPYC.)
PLAIN_COPY = """

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def strided_copy(mem, P, q):
    \"\"\"A plain copy: strided_copy_divided by a total of 0.\"\"\"
    return strided_copy_divided(mem, P, q, 0.0)
"""


def copy_source(parallel: str, rows: str, divided: bool = False) -> str:
    """strided_copy and its helpers; divided: strided_copy_divided, which divides each
    element by `total` as it copies it where total is not 0 (a PROB NORMALIZE fused into
    the copy out), and strided_copy, the same with a total of 0."""
    if divided:
        names = dict(
            suffix="_divided",
            total=", total",
            what=", each element / total (0: none)",
            block_what="\n    Each element is divided by total as it moves, unless total is 0.",
        )
    else:
        names = dict(suffix="", total="", what="", block_what="")
    runs = dict(
        dense_run=_run(" " * 12, "for t in range(n):", "d + t", "s + t", divided),
        tiled_run=_run(" " * 16, "for t in range(t0, t1):", "d + t * ds", "s + t * ss", divided),
        dense_columns=_run(" " * 12, "for t in range(n):", "d + t", "s + P[cs + t]", divided),
        scattered_columns=_run(" " * 12, "for t in range(n):", "d + P[cd + t]", "s + P[cs + t]", divided),
    )
    return COPY.format(parallel=parallel, rows=rows, **names, **runs) + (PLAIN_COPY if divided else "")


MAX_DOT = '''

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def below_inf(mem, start, rows, rs, cols, cs):
    """Whether every element start + r * rs + c * cs (r < rows, c < cols) is below +inf
    (not +inf, not NaN)."""
    ok = True
    for r in range(rows):
        for c in range(cols):
            ok &= mem[u(start + r * rs + c * cs)] < np.inf
    return ok


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def tile(mem, s, ao, ai, ak, bo, oo, N, K, i, j0, n):
    """Outputs (i + r, j0 + j) for r < ROWS, j < n (n <= COLS): each the largest of its
    terms, in the order of k, the first of equal ones, in s[r * COLS + j] while k runs (n
    is COLS but in the last columns: the loops then have a constant length, and LLVM
    keeps s in registers). No term is NaN here."""
    for t in range(ROWS * COLS):
        s[t] = -np.inf
    for k in range(K):
{rows_of_a}
        b = bo + k * N + j0
        for j in range(n):
            y = mem[u(b + j)]
{max_terms}
    for r in range(ROWS):
        for j in range(n):
            mem[u(oo + (i + r) * N + j0 + j)] = s[r * COLS + j]


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def row(mem, s, ao, ai, ak, bo, oo, N, K, i):
    """Output row i, BUFFER columns at a time: each element the largest of its terms in
    the order of k, a NaN term sticking (the loop kernels' max)."""
    for j0 in range(0, N, BUFFER):
        n = min(BUFFER, N - j0)
        for j in range(n):
            s[j] = -np.inf
        for k in range(K):
            a = mem[u(ao + i * ai + k * ak)]
            b = bo + k * N + j0
            for j in range(n):
                x = a + mem[u(b + j)]
                s[j] = x if (x > s[j]) | (x != x) else s[j]
        for j in range(n):
            mem[u(oo + i * N + j0 + j)] = s[j]


@njit(cache=True, nogil=True, error_model="numpy")
def max_dot(mem, ao, a_t, bo, oo, M, N, K, lo, hi):
    """Rows lo..hi-1 of out = max_k a[i][k] + b[k][j], a C-order or transposed, b C-order:
    in tiles of ROWS rows where no term can be NaN, else row by row. (A function of its
    own, not inlined: inlined into the serial kernel, its tiles were left scalar, 2.5x
    slower.)"""
    ai, ak = (np.int64(1), M) if a_t else (K, np.int64(1))
    s = carray(stack_buffer_{dtype}(), BUFFER)
    clean = below_inf(mem, bo, K, N, N, np.int64(1))
    i = lo
    while i < hi:
        if i + ROWS <= hi and clean and below_inf(mem, ao + i * ai, ROWS, ai, K, ak):
            for j0 in range(0, N - COLS + 1, COLS):
                tile(mem, s, ao, ai, ak, bo, oo, N, K, i, j0, COLS)
            if N % COLS:
                tile(mem, s, ao, ai, ak, bo, oo, N, K, i, N - N % COLS, N % COLS)
            i += ROWS
        else:
            row(mem, s, ao, ai, ak, bo, oo, N, K, i)
            i += 1
'''

UNSIGNED = (
    "# Indices into mem go through u(): Numba adds a negative-index wraparound to every\n"
    "# signed index, which stops LLVM from seeing that a loop reads consecutive elements.\n"
    "u = np.uint64\n"
)

# The entry of a GEMM step, in pieces that the kinds share (a sum of products, LOGPROB's
# in parts with a workspace each, and a max-plus product)
_ENTRY_HEAD = '''

@njit(cache=True, nogil=True, error_model="numpy"{parallel})
def kernel(mem_address, mem_length, P_address, P_length, p, chunk, chunks):
    """Segment p of the table (called with addresses, as every kernel: see codegen/cpu.py).
    A GEMM step is one chunk (chunk 0 of 1): a parallel one shares its work out itself."""
    mem = carray(pointer_{dtype}(mem_address), mem_length)
    P = carray(pointer_int64(P_address), P_length)
    M, N, K = P[p + GEMM_M], P[p + GEMM_N], P[p + GEMM_K]
    nb = P[p + GEMM_BATCH_RANK]
    n_batch = np.int64(1)
    for d in range(nb):
        n_batch *= P[p + GEMM_HEADER + GEMM_BATCH_FIELDS * d]
    q = p + GEMM_HEADER + GEMM_BATCH_FIELDS * nb + GROUP_FIELDS  # the copies
    n_before, n_after = P[q], P[q + 1]
    q += 2
    for _ in range(n_before):  # leaves into their matrices
        q = strided_copy(mem, P, q)
'''
_BATCH_OFFSETS = """        oo, ao, bo = P[p + GEMM_C], P[p + GEMM_A], P[p + GEMM_B]
        {rem}
        for d in range(nb - 1, -1, -1):
            f = p + GEMM_HEADER + GEMM_BATCH_FIELDS * d
            i = rem % P[f]
            rem //= P[f]
            oo += i * P[f + 1]
            ao += i * P[f + 2]
            bo += i * P[f + 3]
"""
# PROB's NORMALIZE of a whole output (one group) whose products outnumber their operands'
# elements: its total from the operands (Σ_k of a's column sums times b's row sums, each
# operand read once), then each product scaled by its reciprocal in the BLAS call itself
# (alpha): no pass over the products for the total, none for the division. The 12 x 12
# 3-state grid's step of 3 products of 729 x 243 (k = 81) 1.72-1.84 -> 1.17-1.31 ms (where
# the operands outnumber the products, as in its steps of 243 x 81 products with k = 729,
# the passes over the products read less; such a step measured within noise either way). A
# total that is not a safe normal number (0, inf, NaN, or so large or small that its
# reciprocal is not) leaves the products unscaled, and the passes below take the total
# from the products as before
_FOLDED_HEAD = """    G = p + GEMM_HEADER + GEMM_BATCH_FIELDS * nb  # the NORMALIZE groups
    folded, scale, total = False, 1.0, 0.0
    if P[G] == 1 and P[G + 2] == 1 and M * K + K * N < M * N:
        total = operands_total(mem, P, p, nb, n_batch, M, N, K)
        folded = FOLD_MIN < total < FOLD_MAX
        scale = 1.0 / total if folded else 1.0
"""
_FOLDED_TAIL = """    if folded:
        if P[G + 3] >= 0:  # the total kept as a value of its own (plan/totals.py)
            mem[P[G + 3]] = total
        for _ in range(n_after):  # the scaled products into the output
            q = strided_copy(mem, P, q)
        return
"""
OPERANDS_TOTAL = (
    '''

@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def operands_total(mem, P, p, nb, n_batch, M, N, K):
    """Σ of the elements of every product a · b of the step: per batch position, Σ_k of
    (Σ_i a[i][k]) (Σ_j b[k][j]), k in blocks of HALF, a's and b's sums in the two halves of
    the stack's buffer. Sums of reals in any order (fastmath reassoc: vectorized), as this
    mode's totals are (docs/architecture.md §12)."""
    sums = carray(stack_buffer_float64(), BUFFER)  # (float32 operands summed in float64)
    a_t, b_t = P[p + GEMM_A_T], P[p + GEMM_B_T]
    total = 0.0
    for t in range(n_batch):
'''
    + _BATCH_OFFSETS.format(rem="rem = t * 1")
    + """        for k0 in range(0, K, HALF):
            n = min(HALF, K - k0)
            for k in range(n):
                sums[k] = 0.0
                sums[HALF + k] = 0.0
            if a_t:  # a stored [K][M]: a's column k is a row there
                for k in range(n):
                    s = 0.0
                    for i in range(M):
                        s += mem[u(ao + (k0 + k) * M + i)]
                    sums[k] = s
            else:
                for i in range(M):
                    for k in range(n):
                        sums[k] += mem[u(ao + i * K + k0 + k)]
            if b_t:  # b stored [N][K]
                for j in range(N):
                    for k in range(n):
                        sums[HALF + k] += mem[u(bo + j * K + k0 + k)]
            else:
                for k in range(n):
                    s = 0.0
                    for j in range(N):
                        s += mem[u(bo + (k0 + k) * N + j)]
                    sums[HALF + k] = s
            for k in range(n):
                total += sums[k] * sums[HALF + k]
    return total
"""
)
# the totals whose reciprocal scales the products (a safe normal number, and its reciprocal)
FOLD_RANGE = {"float64": ("1e-300", "1e300"), "float32": ("1e-30", "1e30")}

_ENTRY_TAIL = """    for _ in range(n_after):  # the products into the output
        q = strided_copy(mem, P, q)
"""
# PROB's NORMALIZE of a whole output whose products are copied out of the workspace: the
# total from the products there (dense, C order), then each element divided by it as the
# copy writes it, instead of a pass for the total and a pass for the division over the
# output after the copy (ObjectDetection_11's steps of 1.77 M elements: ~1.2 ms of 3.5)
_DIVIDED_TAIL = """    groups, es, totals = P[G], P[G + 2], P[G + 3]
    if n_after == 1 and groups == 1 and es == 1:
        total = parts_total(mem, P[p + GEMM_C], np.int64(1), M * N * n_batch)
        if totals >= 0:  # the total kept as a value of its own (plan/totals.py)
            mem[totals] = total
        strided_copy_divided(mem, P, q, total)  # (a total of 0 divides nothing)
        return
"""
# MAXLOG: each product's rows in `parts` parts of whole tiles, one task each
MAX_ENTRY_SOURCE = (
    _ENTRY_HEAD
    + """    # each product's rows in `parts` parts of whole tiles: {parts}
    blocks = (M + ROWS - 1) // ROWS
    parts = {n_parts}
    for t in {tasks}(n_batch * parts):
"""
    + _BATCH_OFFSETS.format(rem="rem = t // parts")
    + """        c = t % parts
        lo, hi = ROWS * (blocks * c // parts), min(M, ROWS * (blocks * (c + 1) // parts))
        max_dot(mem, ao, P[p + GEMM_A_T], bo, oo, M, N, K, lo, hi)
"""
    + _ENTRY_TAIL
)
# the batch positions one at a time (each product on BLAS's own threads), or shared among
# the threads
BATCHES = (
    """    for t in {loop}(n_batch):
"""
    + _BATCH_OFFSETS.format(rem="rem = t * 1  # a new value: a parallel loop's index must not change")
    + """        {call}
"""
)
# parallel LOGPROB: the batch positions in LOG_PARTS parts, each part's exponentials in a
# workspace of its own (plan/gemm.py sized the step's workspace for them)
LOG_PARALLEL_BATCHES = (
    """    W = M * K + K * N + M + N  # one part's workspace
    for c in prange(LOG_PARTS):
        for t in range(n_batch * c // LOG_PARTS, n_batch * (c + 1) // LOG_PARTS):
"""
    + textwrap.indent(_BATCH_OFFSETS.format(rem="rem = t * 1"), "    ")
    + """            work = P[p + GEMM_WORK] + c * W
            log_dot(mem, ao, P[p + GEMM_A_T], bo, P[p + GEMM_B_T], oo, M, N, K, work)
"""
)
# a parallel kernel's choice (the step's row: plan/gemm.py)
CHOSEN_BATCHES = """    if P[p + GEMM_PARALLEL_BATCH]:  # small products: the threads share them
{shared}    else:  # each product on BLAS's own threads
{serial}"""


def _batches(parallel: bool, log: bool, call: str) -> str:
    """The kernel's loop over the batch positions."""
    serial = BATCHES.format(loop="range", call=call)
    if not parallel:
        return serial
    shared = LOG_PARALLEL_BATCHES if log else BATCHES.format(loop="prange", call=call)
    return CHOSEN_BATCHES.format(
        shared=textwrap.indent(shared, "    "), serial=textwrap.indent(serial, "    ")
    )


def _header(pattern: KernelPattern, formula: str, pointers: set[str]) -> str:
    return HEADER.format(
        name=pattern.name,
        formula=formula,
        semiring=pattern.semiring,
        dtype=pattern.dtype,
        then=", then NORMALIZE" if pattern.normalize else "",
        pointers=", ".join(sorted(pointers)),
        libm=LIBM_IMPORT if uses_libm(SEMIRINGS[pattern.semiring], pattern) else "",
        prange=", prange" if pattern.parallel else "",
        abi=abi.gemm_source_constants(),
    )


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the GEMM kernel for `pattern`."""
    sr = SEMIRINGS[pattern.semiring]
    if sr.is_max:
        return max_plus_source(pattern)
    # BLAS sums products: plan/gemm.py makes GEMM steps only where ⊕ adds reals
    assert sr.sums_reals, f"no GEMM kernel for {sr.name}"
    log = sr.reduction == "logsumexp"
    lanes = pattern.normalize and sr.normalization == "divide_by_total"  # PROB's total (totals.py)
    pointers = {"pointer_int64", "pointer_" + pattern.dtype, "stack_leaves_int64", "MAX_LEAVES", "blas_dot"}
    pointers |= {"stack_buffer_float64", "BUFFER"} if lanes else set()  # (parts_total's sums)
    lines = _header(pattern, "⊕_k a[i][k] ⊗ b[k][j]", pointers)
    lines += f"SAFE = {SAFE[pattern.dtype]}\n" if log else ""
    lines += f"TILE = {TILE}  # a copy's tile edge (elements): 16 float64 are two cache lines\n"
    lines += f"COPY_PARTS = {COPY_PARTS}  # a copy's blocks in this many parts (the threads share them)\n"
    lines += UNSIGNED
    # A parallel kernel shares its copies and NORMALIZE passes among the threads (each
    # element computed alone, the total's ranges fixed: the same bits on any thread count),
    # and its batch positions where the step's row says so (GEMM_PARALLEL_BATCH: small
    # products), else each product goes to BLAS's own threads (plan/gemm.py)
    parallel = ", parallel=True" if pattern.parallel else ""
    lines += DOT + (LOG_DOT if log else "")
    rows = "prange" if pattern.parallel else "range"
    if lanes:
        lines += parts_total_source(pattern.parallel)
    lines += copy_source(parallel, rows, divided=lanes)
    call = (
        "log_dot(mem, ao, P[p + GEMM_A_T], bo, P[p + GEMM_B_T], oo, M, N, K, P[p + GEMM_WORK])"
        if log
        else f"dot(mem, ao, P[p + GEMM_A_T], bo, P[p + GEMM_B_T], oo, M, N, K, {'scale' if lanes else '1.0'})"
    )
    if log and pattern.parallel:
        lines += f"LOG_PARTS = {LOG_PARTS}  # parts of the batch, a workspace each\n"
    if lanes:
        low, high = FOLD_RANGE[pattern.dtype]
        lines += f"FOLD_MIN, FOLD_MAX = {low}, {high}  # totals that scale the products\n"
        lines += "HALF = BUFFER // 2  # a block of k's sums of a, and of b\n"
        lines += OPERANDS_TOTAL
    lines += _ENTRY_HEAD.format(dtype=pattern.dtype, parallel=parallel)
    lines += _FOLDED_HEAD if lanes else ""
    lines += _batches(pattern.parallel, log, call)
    lines += (_FOLDED_TAIL + _DIVIDED_TAIL if lanes else "") + _ENTRY_TAIL
    if pattern.normalize:
        body = _normalize(sr, pattern.dtype, pattern.parallel, lanes=lanes)
        body[0] = "    G = p + GEMM_HEADER + GEMM_BATCH_FIELDS * nb  # the NORMALIZE groups"
        body = body[1:] if lanes else body  # (_FOLDED_HEAD has placed G)
        lines += "\n".join(["    out = P[p + OUT]", "    n_out = M * N * n_batch"] + body) + "\n"
    return lines


def max_plus_source(pattern: KernelPattern) -> str:
    """The whole module source of MAXLOG's GEMM kernel (max-plus) for `pattern`."""
    sr = SEMIRINGS[pattern.semiring]
    parallel = ", parallel=True" if pattern.parallel else ""
    pointers = {"pointer_int64", "pointer_" + pattern.dtype, "stack_buffer_" + pattern.dtype, "BUFFER"}
    pointers |= {"stack_leaves_int64", "MAX_LEAVES"}
    lines = _header(pattern, "max_k a[i][k] + b[k][j]", pointers).replace(
        " one BLAS GEMM per batch position", " a max-plus product per batch position"
    )
    lines += f"TILE = {TILE}  # a copy's tile edge (elements): 16 float64 are two cache lines\n"
    lines += f"COPY_PARTS = {COPY_PARTS}  # a copy's blocks in this many parts (the threads share them)\n"
    lines += f"ROWS, COLS = {ROWS}, {COLS[pattern.dtype]}  # a tile of outputs (registers)\n"
    lines += UNSIGNED
    rows_of_a = "\n".join(
        f"        a{r} = mem[u(ao + {f'(i + {r})' if r else 'i'} * ai + k * ak)]" for r in range(ROWS)
    )
    max_terms = "\n".join(
        f"            x = a{r} + y\n            s[{at}] = x if x > s[{at}] else s[{at}]"
        for r, at in ((r, f"{r} * COLS + j" if r else "j") for r in range(ROWS))
    )
    lines += MAX_DOT.format(dtype=pattern.dtype, rows_of_a=rows_of_a, max_terms=max_terms)
    lines += copy_source(parallel, "prange" if pattern.parallel else "range")
    if pattern.parallel:
        n_parts = f"min(blocks, max(np.int64(1), -(-{PARTS} // n_batch)))"
        why = f"{PARTS} parts in all at least, for the threads"
    else:
        n_parts, why = "np.int64(1)", "one, serial"
    lines += MAX_ENTRY_SOURCE.format(
        dtype=pattern.dtype,
        parallel=parallel,
        tasks="prange" if pattern.parallel else "range",
        n_parts=n_parts,
        parts=why,
    )
    if pattern.normalize:
        body = _normalize(sr, pattern.dtype, pattern.parallel)
        body[0] = "    G = p + GEMM_HEADER + GEMM_BATCH_FIELDS * nb  # the NORMALIZE groups"
        lines += "\n".join(["    out = P[p + OUT]", "    n_out = M * N * n_batch"] + body) + "\n"
    return lines
