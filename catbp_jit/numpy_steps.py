"""The schedule's steps computed by numpy: what each kernel computes, in the kernel's
order, so the results are the same bits, with nothing to compile.

This is the tier a session runs in while its kernels compile (executable.py, "tiers"):
the same buffer, the same table, the same step rows (abi.py), read here by numpy instead
of by a compiled kernel. Every operation is the kernel's (codegen/cpu.py):

- ⊗ of the leaves left to right, in the dtype (a float32 product rounds in float32);
- a sum adds its terms one after another, in C order over the step's reduced axes
  (the order every kernel uses), starting from 0, in float64 for floats (numpy's own sum
  is pairwise: other bits), so it is `np.add.accumulate`, never `np.sum`;
- PROB's NORMALIZE total in the reassociating mode is summed in the kernels' ranges of
  lanes (`lane_totals`, codegen/totals.py), each lane, range and the ranges' sums in order;
  and a float64 PROB sum across reduced axes in that mode adds each output's terms in the
  kernels' lanes (`lane_sums`, KernelPattern.terms_in_lanes), each lane in order;
- LOGPROB's logsumexp is the kernels' two passes, the largest term then the sum of
  exp(x - top), in float64 with the C library's exp and log (what a compiled kernel
  calls; numpy's own take other code paths on some CPUs), so the same bits there too;
- MAXLOG's ⊕ is numpy's max in the dtype (a NaN term gives NaN, as a kernel's), and its
  NORMALIZE subtracts the largest entry in the dtype: a max is exact in any order;
- SAT's ⊕ is an or and COUNT's an int64 sum, both independent of the order.

A step allocates its temporaries (the whole loop space of its product, like the reference
interpreter's CONTRACT): this tier is for the first runs, not for speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import abi
from .codegen.totals import LANES, TOTAL_PARTS
from .plan.pipeline import Plan
from .semiring import SEMIRINGS

# the C library's exp and log, element by element (math's functions are its own)
_exp = np.frompyfunc(math.exp, 1, 1)
_log = np.frompyfunc(math.log, 1, 1)
SUM_BLOCK = 1 << 12  # terms added per accumulate call: bounds the float64 copy


def libm_exp(x: np.ndarray) -> np.ndarray:
    return np.asarray(_exp(np.asarray(x, np.float64))).astype(np.float64)  # (0-d: a float)


def libm_log(x: np.ndarray) -> np.ndarray:
    # the argument is a sum that includes exp(0) = 1 (or is NaN): never 0, never negative
    return np.asarray(_log(np.asarray(x, np.float64))).astype(np.float64)  # (0-d: a float)


def in_order_sum(terms: np.ndarray) -> np.ndarray:
    """Row sums of a 2-D array, each adding its terms one after another from 0.0 in
    float64: ((0 + t0) + t1) + ... (accumulate is sequential by definition)."""
    rows, n = terms.shape
    acc = np.zeros((rows, 1), np.float64)
    for lo in range(0, n, SUM_BLOCK):
        block = np.concatenate([acc, terms[:, lo : lo + SUM_BLOCK]], axis=1, dtype=np.float64)
        acc = np.add.accumulate(block, axis=1)[:, -1:]
    return acc[:, 0]


def logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """The kernels' two-pass logsumexp of each row of x, as float64: -inf for a row of
    -inf, NaN where a NaN is (or +inf meets +inf)."""
    top = np.max(x, axis=1).astype(np.float64)  # a NaN anywhere gives NaN, as a kernel's
    out = top.copy()
    live = top != -np.inf
    if live.any():
        with np.errstate(invalid="ignore"):
            shifted = x[live].astype(np.float64) - top[live, None]
        out[live] = top[live] + libm_log(in_order_sum(libm_exp(shifted)))
    return out


def interpretable(plan: Plan) -> bool:
    """Whether every step of the plan is one this module computes (not the GEMM steps of
    the reassociating mode, whose sums are BLAS's)."""
    return all(
        st.pattern.template in ("contract_reduce", "contract_lines", "repack") for st in plan.schedule.steps
    )


def lane_totals(terms: np.ndarray) -> np.ndarray:
    """Row sums of a 2-D array as a reassociating kernel's parts_total adds them
    (codegen/totals.py): in TOTAL_PARTS ranges, each in LANES interleaved running sums
    (element o into lane o % LANES) added pairwise, plus its last elements in order; then
    the ranges' sums in order. The same float64 additions in the same order: its bits."""
    rows, n = terms.shape
    total = np.zeros(rows, np.float64)
    for c in range(TOTAL_PARTS):
        lo, hi = n * c // TOTAL_PARTS, n * (c + 1) // TOTAL_PARTS
        full = lo + (hi - lo) // LANES * LANES
        total += _in_lanes(terms[:, lo:full]) + in_order_sum(terms[:, full:hi])
    return total


def lane_sums(terms: np.ndarray, V: int) -> np.ndarray:
    """Row sums of a 2-D array as a reassociating kernel adds each output's terms in lanes
    (KernelPattern.terms_in_lanes): the terms in runs of V (the kernel's vector), term v
    of each run into lane v % LANES, each lane in order from 0.0, then the lanes added
    pairwise (codegen/totals.py). A run's last V % LANES terms fill a part of a line whose
    other lanes add 0.0, which leaves a sum that started at 0.0 as it was: zeros here."""
    rows, n = terms.shape
    width = -(-V // LANES) * LANES
    runs = np.zeros((rows, n // V, width), np.float64)
    runs[:, :, :V] = terms.reshape(rows, n // V, V)
    return _in_lanes(runs.reshape(rows, -1))


def _in_lanes(terms: np.ndarray) -> np.ndarray:
    """Row sums of a 2-D array of whole lines: element o into lane o % LANES, each lane in
    order from 0.0, the lanes added pairwise as codegen/totals.py's LANES_ADDED."""
    rows = terms.shape[0]
    s = in_order_sum(terms.reshape(rows, -1, LANES).transpose(0, 2, 1).reshape(rows * LANES, -1))
    s = s.reshape(rows, LANES)
    return ((s[:, 0] + s[:, 1]) + (s[:, 2] + s[:, 3])) + ((s[:, 4] + s[:, 5]) + (s[:, 6] + s[:, 7]))


def numpy_steps(plan: Plan, mem: np.ndarray, table: np.ndarray) -> list[Callable[[], None]]:
    """One function per step of the plan's schedule, computing it over `mem` as laid
    out by `table` (a session's buffer and its copy of the schedule table)."""
    steps = []
    for i, st in enumerate(plan.schedule.steps):
        p = int(table[abi.STEP_ROW * i + abi.STEP_PARAMS])
        if st.pattern.template == "repack":
            steps.append(_repack_step(abi.unpack_repack(table, p), mem))
        else:
            steps.append(_step(st.pattern, abi.unpack(table, p), mem))
    return steps


def _repack_step(params: abi.RepackParams, mem: np.ndarray) -> Callable[[], None]:
    """The copies of a repack step (abi.py), as element indices worked out once."""
    copies = []
    for copy in params.copies:
        c = copy.positions
        src, dst = np.array([c.src]), np.array([c.dst])
        for n, src_stride, dst_stride in zip(c.sizes, c.src_strides, c.dst_strides):  # C order
            src = (src[:, None] + np.arange(n) * src_stride).ravel()
            dst = (dst[:, None] + np.arange(n) * dst_stride).ravel()
        vector = np.arange(params.block_size)
        copies.append(((dst[:, None] + vector).ravel(), (src[:, None] + np.array(copy.offsets)).ravel()))

    def run() -> None:
        for dst, src in copies:
            mem[dst] = mem[src]

    return run


def _step(pattern, params: abi.StepParams, mem: np.ndarray) -> Callable[[], None]:
    sr = SEMIRINGS[pattern.semiring]
    itemsize = mem.itemsize

    def view(offset: int, shape, strides) -> np.ndarray:
        return as_strided(mem[offset:], shape=tuple(shape), strides=tuple(s * itemsize for s in strides))

    sizes, R = params.sizes, params.out_rank
    leaves = [view(off, sizes, strides) for off, strides in params.leaves]
    out = view(params.out, sizes[:R], params.out_strides)
    n_out = int(np.prod(sizes[:R], dtype=np.int64))
    n_red = int(np.prod(sizes[R:], dtype=np.int64))
    groups, group_stride, element_stride, totals = params.groups
    parts = view(params.out, (groups, n_out // groups), (group_stride, element_stride))
    times = {" * ": np.multiply, " + ": np.add, " and ": np.logical_and}[sr.product_op]
    dtype = mem.dtype

    def product() -> np.ndarray:
        x = leaves[0]
        if len(leaves) > 1:
            x = times(x, leaves[1])
            for leaf in leaves[2:]:
                times(x, leaf, out=x)
        return x

    def reduced(x: np.ndarray) -> np.ndarray:
        terms = x.reshape(n_out, n_red)  # C order: the kernels' order of terms
        if sr.reduction == "any":
            return np.logical_or.reduce(terms, axis=1)
        if sr.reduction == "logsumexp":
            return logsumexp_rows(terms)
        if sr.is_max:  # (a reduction has a term at least: sizes are positive)
            return np.max(terms, axis=1)
        if dtype.kind in "iu":
            return np.add.reduce(terms, axis=1, dtype=dtype)  # wraps, in any order
        if pattern.terms_in_lanes:
            return lane_sums(terms, params.block_size)
        return in_order_sum(terms)

    def normalize() -> None:
        if sr.normalization == "divide_by_total":
            total = lane_totals(parts) if pattern.total_in_lanes else in_order_sum(parts)
            if totals >= 0:  # the totals kept as a value of their own (plan/totals.py)
                mem[totals : totals + groups] = total
            rows = total != 0.0
            parts[rows] = parts[rows].astype(np.float64) / total[rows, None]
        elif sr.normalization == "subtract_logsumexp":
            z = logsumexp_rows(parts)
            if totals >= 0:
                mem[totals : totals + groups] = z
            with np.errstate(invalid="ignore"):  # -inf - -inf = NaN, as CatBP's
                parts[...] = parts.astype(np.float64) - z[:, None]
        elif sr.normalization == "subtract_max":
            top = np.max(parts, axis=1)
            if totals >= 0:
                mem[totals : totals + groups] = top
            with np.errstate(invalid="ignore"):  # an all -inf part: -inf - -inf = NaN
                parts[...] = parts - top[:, None]

    def run() -> None:
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            x = product()
            if pattern.reduce:
                out[...] = reduced(x).reshape(out.shape)  # float64 sums round to the dtype here
            else:
                out[...] = x
        if pattern.normalize:
            normalize()

    return run
