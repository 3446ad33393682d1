"""Numba source for the `gemm` kernel template on the CPU (reassociating mode only).

One step computes, per position of its batch axes, out[i][j] = ⊕_k a[i][k] ⊗ b[k][j]
with Numba's np.dot(a, b, out) into the preallocated output (BLAS through SciPy; plan/
gemm.py says which segments qualify and abi.py where the parameters sit). Each leaf is a
C-order matrix or the transpose of one; the four combinations are four np.dot calls, so
that each is typed with its operands' layouts (no copy is made).

LOGPROB: exp(a - ma) · exp(b - mb) into the output, ma the row maxima of a and mb the
column maxima of b (0 where a maximum is not finite), then out = log(out) + ma + mb. An
element whose product sum is not a safe normal number (below SAFE: the sum underflowed or
is empty, or inf/NaN) is computed again directly with the loop kernels' two-pass
logsumexp: so an all -inf sum gives -inf, NaN and +inf come out as the loop kernels give
them, and a finite result is within rounding of the reference whatever the spread of the
terms. The shifted exponentials live in the step's workspace (GEMM_WORK).
"""

from __future__ import annotations

from .. import abi
from ..plan.steps import KernelPattern
from ..semiring import SEMIRINGS
from .cpu import _normalize

ENTRY = "kernel"
TILE = 16

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

from catbp_jit.codegen.intrinsics import {pointers}

{abi}
'''

DOT = '''

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def dot(mem, ao, a_t, bo, b_t, oo, M, N, K):
    """out = a · b at these offsets, each leaf C-order or transposed."""
    O = mem[oo:oo + M * N].reshape((M, N))
    if a_t == 0 and b_t == 0:
        np.dot(mem[ao:ao + M * K].reshape((M, K)), mem[bo:bo + K * N].reshape((K, N)), O)
    elif a_t == 0:
        np.dot(mem[ao:ao + M * K].reshape((M, K)), mem[bo:bo + K * N].reshape((N, K)).T, O)
    elif b_t == 0:
        np.dot(mem[ao:ao + M * K].reshape((K, M)).T, mem[bo:bo + K * N].reshape((K, N)), O)
    else:
        np.dot(mem[ao:ao + M * K].reshape((K, M)).T, mem[bo:bo + K * N].reshape((N, K)).T, O)
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
            mem[ea + at] = math.exp(mem[ao + at] - mem[ma + i])
    for j in range(N):
        for k in range(K):
            at = k * bk + j * bj
            mem[eb + at] = math.exp(mem[bo + at] - mem[mb + j])
    dot(mem, ea, a_t, eb, b_t, oo, M, N, K)
    for i in range(M):
        for j in range(N):
            s = mem[oo + i * N + j]
            if s >= SAFE and s < np.inf:
                mem[oo + i * N + j] = math.log(s) + mem[ma + i] + mem[mb + j]
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
                acc += math.exp(mem[ao + i * ai + k * ak] + mem[bo + k * bk + j * bj] - top_x)
            mem[oo + i * N + j] = top_x + math.log(acc)
'''

# A parallel step (many small products: plan/gemm.py) shares its copies' rows and its
# batch positions among the threads; every element is computed alone, as in the serial
# kernel, so the bits do not depend on the thread count.
COPY = '''

@njit(cache=True, nogil=True, error_model="numpy"{parallel})
def strided_copy(mem, P, q):
    """The copy at P[q:] (abi.py: StridedCopy); returns where the next copy starts. The
    last two axes are walked in TILE x TILE tiles (the planner puts the destination's
    densest axis last and the source's before it: a transpose then reads and writes whole
    cache lines); each position of the axes before them (a row) placed by div/mod."""
    src, dst, rank = P[q + COPY_SRC], P[q + COPY_DST], P[q + COPY_RANK]
    ax = q + COPY_HEADER
    last = ax + COPY_AXIS_FIELDS * (rank - 1)
    n, ss, ds = P[last], P[last + 1], P[last + 2]
    if rank == 1:
        for t in range(n):
            mem[dst + t * ds] = mem[src + t * ss]
        return last + COPY_AXIS_FIELDS
    m, ms, md = P[last - COPY_AXIS_FIELDS], P[last - COPY_AXIS_FIELDS + 1], P[last - COPY_AXIS_FIELDS + 2]
    rows = np.int64(1)
    for d in range(rank - 2):
        rows *= P[ax + COPY_AXIS_FIELDS * d]
    for r in {rows}(rows):
        copy_row(mem, P, ax, rank, src, dst, r, m, ms, md, n, ss, ds)
    return last + COPY_AXIS_FIELDS


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def copy_row(mem, P, ax, rank, src, dst, r, m, ms, md, n, ss, ds):
    """Row r of the copy: its m x n elements of the last two axes, in tiles."""
    rem = r * 1  # a new value: a parallel loop's index must not change
    for d in range(rank - 3, -1, -1):
        f = ax + COPY_AXIS_FIELDS * d
        i = rem % P[f]
        rem //= P[f]
        src += i * P[f + 1]
        dst += i * P[f + 2]
    for u0 in range(0, m, TILE):
        for t0 in range(0, n, TILE):
            for u in range(u0, min(u0 + TILE, m)):
                for t in range(t0, min(t0 + TILE, n)):
                    mem[dst + u * md + t * ds] = mem[src + u * ms + t * ss]
'''

ENTRY_SOURCE = '''

@njit(cache=True, nogil=True, error_model="numpy"{parallel})
def kernel(mem_address, mem_length, P_address, P_length, p):
    """Segment p of the table (called with addresses, as every kernel: see codegen/cpu.py)."""
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
    for t in {batches}(n_batch):
        oo, ao, bo = P[p + GEMM_C], P[p + GEMM_A], P[p + GEMM_B]
        rem = t * 1  # a new value: a parallel loop's index must not change
        for d in range(nb - 1, -1, -1):
            f = p + GEMM_HEADER + GEMM_BATCH_FIELDS * d
            i = rem % P[f]
            rem //= P[f]
            oo += i * P[f + 1]
            ao += i * P[f + 2]
            bo += i * P[f + 3]
        {call}
    for _ in range(n_after):  # the products into the output
        q = strided_copy(mem, P, q)
'''


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the GEMM kernel for `pattern`."""
    sr = SEMIRINGS[pattern.semiring]
    # BLAS sums products: plan/gemm.py makes GEMM steps only where ⊕ adds reals
    assert sr.sums_reals, f"no GEMM kernel for {sr.name}"
    log = sr.reduction == "logsumexp"
    lines = HEADER.format(
        name=pattern.name,
        formula="⊕_k a[i][k] ⊗ b[k][j]",
        semiring=sr.name,
        dtype=pattern.dtype,
        then=", then NORMALIZE" if pattern.normalize else "",
        pointers=", ".join(sorted({"pointer_int64", "pointer_" + pattern.dtype})),
        prange=", prange" if pattern.parallel else "",
        abi=abi.gemm_source_constants(),
    )
    lines += f"SAFE = {SAFE[pattern.dtype]}\n" if log else ""
    lines += f"TILE = {TILE}  # a copy's tile edge (elements): 16 float64 are two cache lines\n"
    parallel = ", parallel=True" if pattern.parallel else ""
    lines += DOT + (LOG_DOT if log else "")
    lines += COPY.format(parallel=parallel, rows="prange" if pattern.parallel else "range")
    call = (
        "log_dot(mem, ao, P[p + GEMM_A_T], bo, P[p + GEMM_B_T], oo, M, N, K, P[p + GEMM_WORK])"
        if log
        else "dot(mem, ao, P[p + GEMM_A_T], bo, P[p + GEMM_B_T], oo, M, N, K)"
    )
    lines += ENTRY_SOURCE.format(
        dtype=pattern.dtype,
        call=call,
        parallel=parallel,
        batches="prange" if pattern.parallel else "range",
    )
    if pattern.normalize:
        body = _normalize(sr, pattern.dtype, pattern.parallel)
        body[0] = "    G = p + GEMM_HEADER + GEMM_BATCH_FIELDS * nb  # the NORMALIZE groups"
        lines += "\n".join(["    out = P[p + OUT]", "    n_out = M * N * n_batch"] + body) + "\n"
    return lines
