"""GEMM steps (reassociating mode, CPU): a pairwise contraction as a BLAS matrix product.

A segment of two leaves that sums over axes both leaves have is, per position of the
axes all three operands share (batch), a matrix product

    out[i][j] = ⊕_k a[i][k] ⊗ b[k][j]

with, per batch position, each operand a 2-d matrix np.dot accepts: the output C-order
over ([i axes], [j axes]), each leaf C- or F-order over its ([i], [k]) or ([k], [j])
axes, the axes of each group in one order in every operand. BLAS then writes the output
as Numba's np.dot(a, b, out) would (codegen/intrinsics.blas_dot; SciPy's BLAS). An operand
that does not lie in memory so is copied into the step's workspace first (a leaf) or
after (the output), permuted into that form: transpose, GEMM, transpose, as einsum
libraries do. The group orders are chosen to copy the fewest elements (none where the
operands already fit), and the copies cost far less than the product they enable: a
GEMM step reuses each element at least MIN_REUSE times.

PROB is a plain product. LOGPROB goes through exponentials shifted by the row maxima of a
and the column maxima of b: out = log(exp(a - ma) · exp(b - mb)) + ma + mb. An element
whose shifted sum is not a safe normal number (underflow: its largest term is far below
ma + mb; 0 for an all -inf sum; inf or NaN) is recomputed directly with the two-pass
logsumexp, so every result is within rounding of the reference (codegen/cpu_gemm.py).
SAT and COUNT have no BLAS: their segments keep the loop kernels. GEMM sums in the dtype
(float32 included, where the loop kernels sum in float64): float32 GEMMs are bounded to
short sums for the tolerance's sake.

MAXLOG has no BLAS either, but its ⊕ is a max, exact in any order: its GEMM steps are
max-plus products out[i][j] = max_k a[i][k] + b[k][j] in a kernel of our own
(codegen/cpu_gemm.py: tiles of outputs kept in registers, the terms of each in the order
of k), every element the loop kernels' bits (each term is the same one addition of the
two leaves). Its b is read along rows (b[k][j..j+COLS], one vector per k), so a b that
is stored [N][K] is copied into a C-order matrix first; and the threads share the rows
of every product, large ones included (no BLAS to run them on threads of its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from math import prod

from .. import abi
from ..ir.schema import TensorSpec
from ..semiring import semiring
from .arena import MemoryPlan
from .copies import copy_params, walked
from .fusion import Fused, Segment
from .options import PlanOptions
from .steps import KernelPattern, Step, c_strides, normalize_groups, total_offset

GEMM_DTYPES = ("float64", "float32")
# float32 sums round to ~K x 6e-8; docs/ir.md's float32 tolerance is rtol 1e-5
FLOAT32_MAX_K = 64
MIN_WORK = 4096  # below this, a BLAS call costs more than the loop kernel
# MAXLOG's max-plus products: the tile of outputs its kernel keeps in registers
# (codegen/cpu_gemm.py), ROWS rows of COLS columns
MAX_PLUS_ROWS = 4
MAX_PLUS_COLS = {"float64": 16, "float32": 32}
# A max-plus step replaces the loop kernel where it costs less, in ns on one core
# (measured on x86-64 with AVX-512, float64): a term of the loop kernel (1-6 ns on the
# UAI models' products, their leaves gathered along the vector across outputs), a term
# in a full tile (~0.08 ns), in a narrower one (fewer columns than COLS, or rows left
# over: ~0.5 ns), a product's own cost (b and a checked for +inf and NaN, the parts),
# and a copy's: each element (one at a time) and, per row of its two innermost axes,
# each other axis (placed by div/mod: the cost of copies of many short axes)
LOOP_TERM_NS = 2.0
TILE_TERM_NS = 0.1
NARROW_TERM_NS = 0.5
PRODUCT_NS = 100.0
COPY_ELEMENT_NS = 4.0
COPY_AXIS_NS = 10.0
# ... and below this many products per element of a, b and out: BLAS gains from reusing
# each element of a and b across a row or column; a skinny product (a batch of dot
# products) has nothing to reuse, and LOGPROB's exponentials of a and b would cost as much
# as the sum itself. It also bounds the copies: each copied element enables at least
# MIN_REUSE products, which BLAS runs far faster than the loop kernel would
MIN_REUSE = 4
# BLAS takes a matrix's sides (and leading dimensions) as 32-bit ints (SciPy's BLAS, through
# Numba's wrappers: codegen/intrinsics.blas_dot): a longer side stays with the loop kernels
BLAS_MAX_SIDE = 2**31 - 1
# a step of at least this many batch positions, each a product of at most this many
# multiply-adds (161^3), runs on all threads, and BLAS then on one (blas_threads.py):
# ObjectDetection_11's solve went from 105 to 91 ms when its steps of 11 products of
# 1.8 M multiply-adds joined those of 1,331 small ones (2 cores). Larger products go to
# BLAS's own threads, which share the packing of each: 3 products of 729 x 243 x 81
# (14.3 M) took 0.93-0.98 ms so against 1.24-1.26 ms shared by batch position (the third
# product on one thread alone), 11 of 160^3 (4.1 M) 1.33-1.48 against 1.03-1.07 (2 cores,
# Numba's np.dot in a loop, medians). (2^24 before: the 12 x 12 3-state grid's steps of
# 3 products of 14.3 M shared their batch positions, 1.8-2.0 ms each with the NORMALIZE)
PARALLEL_BATCH = 2
SMALL_PRODUCT = 1 << 22
# A parallel LOGPROB step cuts its batch positions into this many parts, each with a
# workspace of exponentials of its own (a constant, not the thread count: the plan and so
# the bits never depend on the machine), where the parts' workspaces stay under 32 MiB
# (2^20 elements left ObjectDetection_11's steps of 11 products of 14641 x 11 x 11 on one
# thread: its LOGPROB solve 325-334 ms, 301-327 ms with them parallel)
LOG_PARTS = 16
LOG_PARTS_MAX_ELEMENTS = 1 << 22


@dataclass(frozen=True)
class Copy:
    """A strided copy between an operand's region and its matrix in the step's workspace
    (C order over `sizes`): a leaf is copied in before the products, the output out after.
    Axes in the matrix's order; axes contiguous in both are merged."""

    sizes: tuple[int, ...]
    strides: tuple[int, ...]  # the operand's region strides, per axis
    at: int  # the matrix's offset from the start of the step's workspace

    @property
    def elements(self) -> int:
        return prod(self.sizes)


@dataclass(frozen=True)
class GemmShape:
    a: int  # leaf values, in product order (a ⊗ b; the output is [i][j])
    b: int
    a_t: bool  # a stored [K][M] (else [M][K])
    b_t: bool  # b stored [N][K] (else [K][N])
    m: int
    n: int
    k: int
    # (size, out, a, b strides) per batch axis, in the matrices the GEMM reads and writes
    # (a copied operand's strides are its workspace matrix's)
    batch: tuple[tuple[int, int, int, int], ...]
    copy_a: Copy | None = None  # leaf a copied into the workspace first
    copy_b: Copy | None = None
    copy_out: Copy | None = None  # the products written to the workspace, copied out after
    copies_end: int = 0  # workspace the copies take (each matrix starts a cache line)

    @property
    def batch_size(self) -> int:
        return prod(size for size, *_ in self.batch)

    @property
    def terms(self) -> int:
        return self.batch_size * self.m * self.n * self.k

    @property
    def copied_elements(self) -> int:
        return sum(c.elements for c in (self.copy_a, self.copy_b, self.copy_out) if c is not None)

    @property
    def log_work(self) -> int:
        """Where LOGPROB's workspace starts, after the copies."""
        return self.copies_end

    @property
    def log_elements(self) -> int:
        """LOGPROB's workspace: exp(a - ma), exp(b - mb), ma, mb (reused per batch position),
        one per part of a parallel step (LOG_PARTS)."""
        return self.m * self.k + self.k * self.n + self.m + self.n

    def work_elements(self, log: bool, parallel: bool) -> int:
        return self.log_work + self.log_elements * (LOG_PARTS if parallel else 1) if log else self.copies_end


def runs_parallel(shape: GemmShape, sr_name: str, options: PlanOptions) -> bool:
    """Whether a GEMM step of this shape runs on all threads. Several small products: the
    threads share the batch positions and the copies (LOGPROB's in LOG_PARTS parts, where
    their workspaces stay small). Not large ones, which BLAS runs on its own threads.
    MAXLOG's threads share the rows of every product (its kernel is ours: no BLAS threads)."""
    if 2 * shape.terms < options.gemm_parallel_min_work:
        return False
    sr = semiring(sr_name)
    if sr.is_max:
        return True
    small = shape.batch_size >= PARALLEL_BATCH and shape.m * shape.n * shape.k <= SMALL_PRODUCT
    return small and (not sr.is_log or shape.log_elements * LOG_PARTS <= LOG_PARTS_MAX_ELEMENTS)


def _aligned(n: int) -> int:
    return -(-n // 8) * 8  # (64 bytes of float64: each copy's matrix starts a cache line)


def _sizes(spec: TensorSpec) -> dict:
    return {ax.key: ax.size for ax in spec.axes if ax.size > 1}


def _pairwise(
    seg: Segment, fused: Fused, specs: dict[int, TensorSpec], dtype: str, options: PlanOptions
) -> tuple[list, list, list, set, dict] | None:
    """The groups of a pairwise contraction `seg` would be as a matrix product, over the
    axes of size > 1 (shared, only in leaf 0, only in leaf 1, summed; and their sizes), or
    None when it cannot be one. Only the sets of axes decide, not their order: the layout
    pass asks this before layouts exist (may_run_as_gemm)."""
    if (
        options.exact
        or not options.gemm
        or not (semiring(fused.semiring).sums_reals or semiring(fused.semiring).is_max)
        or dtype not in GEMM_DTYPES
        or len(seg.leaves) != 2
    ):
        return None
    out, a, b = (_sizes(specs[v]) for v in (seg.out,) + seg.leaves)
    red = {ax.key for ax in seg.red_axes if ax.size > 1}
    if not red or any(
        ax.size != a.get(ax.key, ax.size) or ax.size != b.get(ax.key, ax.size) for ax in seg.red_axes
    ):
        return None
    if not red <= set(a) or not red <= set(b) or set(a) - set(out) - red or set(b) - set(out) - red:
        return None  # an axis summed by one leaf alone (the reassociation pass splits those)
    if any(key not in a and key not in b for key in out):
        return None  # an output axis neither leaf has (a broadcast)
    size = {**out, **a, **b}
    shared = [x for x in out if x in a and x in b]
    only0 = [x for x in out if x in a and x not in b]
    only1 = [x for x in out if x in b and x not in a]
    m, n, k = (prod(size[x] for x in g) for g in (only0, only1, red))
    max_plus = semiring(fused.semiring).is_max  # (a max is exact: float32's sums need no bound)
    if dtype == "float32" and k > FLOAT32_MAX_K and not max_plus or m * n * k < MIN_WORK:
        return None
    if m * n * k < MIN_REUSE * (m * k + k * n + m * n):
        return None
    if max(m, n, k) > BLAS_MAX_SIDE:
        return None
    return shared, only0, only1, red, size


def program_takes_gemm(fused: Fused, dtype: str, options: PlanOptions) -> bool:
    """Whether some segment of the program may be a GEMM step of at least
    options.gemm_program_min_terms terms: otherwise none is, and the program does not
    compile the GEMM kernel for steps that gain nothing by it."""
    for seg in fused.segments:
        groups = _pairwise(seg, fused, fused.specs, dtype, options)
        if groups is not None and prod(groups[4].values()) >= options.gemm_program_min_terms:
            return True
    return False


@dataclass(frozen=True)
class GemmGroups:
    """The axes (keys, of size > 1) of a pairwise contraction that may be a GEMM step, by
    role: any layout of them may be, the layout pass (plan/layout.py) picks one per value."""

    shared: tuple  # in the output and both leaves: the batch
    only0: tuple  # in the output and leaf 0: a's rows (or b's columns, transposed)
    only1: tuple  # in the output and leaf 1
    red: frozenset  # summed, in both leaves


def gemm_groups(seg: Segment, fused: Fused, dtype: str, options: PlanOptions) -> GemmGroups | None:
    """`seg`'s groups when it may become a GEMM step whatever the layouts, else None.
    (MAXLOG's steps also weigh their copies against the loop kernel, which depends on the
    layouts: they count as may.)"""
    groups = _pairwise(seg, fused, fused.specs, dtype, options)
    if groups is None:
        return None
    shared, only0, only1, red, _ = groups
    return GemmGroups(tuple(shared), tuple(only0), tuple(only1), frozenset(red))


def may_run_as_gemm(seg: Segment, fused: Fused, dtype: str, options: PlanOptions) -> bool:
    return gemm_groups(seg, fused, dtype, options) is not None


def gemm_shape(
    seg: Segment, fused: Fused, layouts: dict[int, TensorSpec], dtype: str, options: PlanOptions
) -> GemmShape | None:
    """The matrix product that computes `seg` copying the fewest elements, or None when
    it is not one (or when options.gemm_copies is off and it needs copies)."""
    groups = _pairwise(seg, fused, layouts, dtype, options)
    if groups is None:
        return None
    shared, only0, only1, red, size = groups
    out_l, l0, l1 = (layouts[v] for v in (seg.out,) + seg.leaves)
    out, a, b = _sizes(out_l), _sizes(l0), _sizes(l1)  # (in memory order)
    max_plus = semiring(fused.semiring).is_max
    so, s0, s1 = (c_strides(spec) for spec in (out_l, l0, l1))
    best: GemmShape | None = None
    # both orientations (out = a b, or out^T = b^T a^T), each group's axes in the order of
    # one operand that has them: the candidate that copies least (MAXLOG: that costs
    # least), the first on a tie
    cost = partial(max_plus_ns, dtype=dtype) if max_plus else (lambda shape: shape.copied_elements)
    for (va, sa, ka), (vb, sb, kb) in (((0, s0, a), (1, s1, b)), ((1, s1, b), (0, s0, a))):
        rows = only0 if va == 0 else only1
        cols = only1 if va == 0 else only0
        for sh in _orders(shared, out, ka, kb):
            for ro in _orders(rows, out, ka):
                for co in _orders(cols, out, kb):
                    for ko in _orders(list(red), ka, kb):
                        shape = _shape(
                            seg.leaves[va], seg.leaves[vb], sh, ro, co, ko, so, sa, sb, size, max_plus
                        )
                        if shape.copied_elements and not options.gemm_copies:
                            continue  # (no workspace for copies: plan/pipeline.py)
                        if best is None or cost(shape) < cost(best):
                            best = shape
    if max_plus and best is not None and cost(best) >= best.terms * LOOP_TERM_NS:
        return None  # the loop kernel is cheaper
    return best


def max_plus_ns(shape: GemmShape, dtype: str) -> float:
    """What a max-plus step of this shape costs (ns on one core, the model above)."""
    m, n, k = shape.m, shape.n, shape.k
    full = m - m % MAX_PLUS_ROWS if n >= MAX_PLUS_COLS[dtype] else 0  # rows in full tiles
    per_product = (full * TILE_TERM_NS + (m - full) * NARROW_TERM_NS) * n * k + PRODUCT_NS
    ns = shape.batch_size * per_product
    for c, leaf in ((shape.copy_a, True), (shape.copy_b, True), (shape.copy_out, False)):
        if c is not None:
            packed = _c_order(c.sizes)
            tiled = walked(0, 0, c.sizes, *((c.strides, packed) if leaf else (packed, c.strides)))
            rows = prod(tiled.sizes[:-2])
            ns += c.elements * COPY_ELEMENT_NS + rows * max(0, len(c.sizes) - 2) * COPY_AXIS_NS
    return ns


def _orders(group: list, *operands: dict) -> list[tuple]:
    """The distinct orders of `group`'s axes in the operands' memory orders."""
    return list(dict.fromkeys(tuple(x for x in op if x in group) for op in operands))


def _shape(a: int, b: int, shared, rows, cols, ks, so, sa, sb, size, b_rows: bool = False) -> GemmShape:
    """b_rows: b must be a C-order [K][N] matrix (MAXLOG's kernel reads its rows), else
    it is copied into one."""
    m, n, k = (prod(size[x] for x in g) for g in (rows, cols, ks))
    at = 0  # workspace used so far

    def copy(keys, strides) -> Copy:
        nonlocal at
        c = _copy(keys, strides, size, at)
        at = _aligned(at + c.elements)
        return c

    def packed(keys) -> dict:  # C strides of a copy's matrix
        return dict(zip(keys, _c_order([size[x] for x in keys])))

    a_t, b_t = _matrix(rows, ks, sa, size, m, k), _matrix(ks, cols, sb, size, k, n)
    copy_a = copy_b = copy_out = None
    if a_t is None:
        copy_a, a_t, sa = copy(shared + rows + ks, sa), False, packed(shared + rows + ks)
    if b_t is None or b_t and b_rows:
        copy_b, b_t, sb = copy(shared + ks + cols, sb), False, packed(shared + ks + cols)
    if _group(cols, so, size) not in (1, None) or _group(rows, so, size) not in (n, None):
        copy_out, so = copy(shared + rows + cols, so), packed(shared + rows + cols)
    batch = tuple((size[x], so[x], sa[x], sb[x]) for x in shared)
    return GemmShape(a, b, a_t, b_t, m, n, k, batch, copy_a, copy_b, copy_out, at)


def _copy(keys, strides: dict, size: dict, at: int) -> Copy:
    """The copy of the operand whose region has `strides` to a C-order matrix over `keys`,
    neighbouring axes contiguous in both merged (fewer, longer inner loops)."""
    sizes, steps = [size[keys[0]]], [strides[keys[0]]]
    for x in keys[1:]:
        if steps[-1] == strides[x] * size[x]:
            sizes[-1] *= size[x]
            steps[-1] = strides[x]
        else:
            sizes.append(size[x])
            steps.append(strides[x])
    return Copy(tuple(sizes), tuple(steps), at)


def _matrix(first, second, strides, size, n_first: int, n_second: int) -> bool | None:
    """False if the operand is a C-order [first][second] matrix, True if F-order (stored
    [second][first]), None if neither."""
    f, s = _group(first, strides, size), _group(second, strides, size)
    if s in (1, None) and f in (n_second, None):
        return False
    if f in (1, None) and s in (n_first, None):
        return True
    return None


def _group(keys: Sequence[tuple], strides: dict[tuple, int], size: dict[tuple, int]):
    """The stride of a group of axes walked as one (the last fastest) when its elements
    are evenly spaced; None for an empty group (any stride fits); -1 when uneven."""
    if not keys:
        return None
    step = strides[keys[-1]]
    for x, nxt in zip(reversed(keys[:-1]), reversed(keys[1:])):
        if strides[x] != strides[nxt] * size[nxt]:
            return -1
    return step


def gemm_workspace(
    fused: Fused, layouts: dict[int, TensorSpec], dtype: str, options: PlanOptions
) -> dict[int, int]:
    """Segment index -> elements of workspace its GEMM needs while it runs: the copied
    operands' matrices, then LOGPROB's exponentials."""
    log = semiring(fused.semiring).is_log
    need = {}
    for i, seg in enumerate(fused.segments):
        shape = gemm_shape(seg, fused, layouts, dtype, options)
        if shape is not None:
            elements = shape.work_elements(log, runs_parallel(shape, fused.semiring, options))
            if elements:
                need[i] = elements
    return need


def gemm_step(
    index: int,
    seg: Segment,
    fused: Fused,
    memory: MemoryPlan,
    dtype: str,
    layouts: dict[int, TensorSpec],
    batch_key: tuple | None,
    options: PlanOptions,
):
    """The GEMM Step of segment `index`, or None (then it is lowered to a loop kernel)."""

    shape = gemm_shape(seg, fused, layouts, dtype, options)
    if shape is None:
        return None
    region = memory.regions
    work = memory.scratch[index].offset if index in memory.scratch else -1

    def into(c: Copy | None, offset: int) -> tuple[int, Copies]:
        """(a's or b's matrix offset, its copy): the leaf's region, or the workspace."""
        if c is None:
            return offset, ()
        return work + c.at, (copy_params(offset, work + c.at, c.sizes, c.strides, _c_order(c.sizes)),)

    a, copy_a = into(shape.copy_a, region[shape.a].offset)
    b, copy_b = into(shape.copy_b, region[shape.b].offset)
    out = region[seg.out].offset
    out_elements = shape.batch_size * shape.m * shape.n
    c = out
    copy_out: Copies = ()
    if shape.copy_out is not None:
        co = shape.copy_out
        c = work + co.at
        copy_out = (copy_params(c, out, co.sizes, _c_order(co.sizes), co.strides),)
    log = semiring(fused.semiring).is_log
    params = abi.GemmParams(
        out=out,
        a=a,
        a_t=shape.a_t,
        b=b,
        b_t=shape.b_t,
        m=shape.m,
        n=shape.n,
        k=shape.k,
        batch=shape.batch,
        groups=normalize_groups(seg, layouts[seg.out], batch_key, total_offset(seg, region)),
        work=work + shape.log_work if log else -1,
        c=c,
        before=copy_a + copy_b,
        after=copy_out,
        parallel_batch=runs_parallel(shape, fused.semiring, options),
    )
    parallel = params.parallel_batch or (
        # (large products: the copies and NORMALIZE passes alone, PlanOptions says why)
        not semiring(fused.semiring).is_max
        and shape.copied_elements + out_elements >= options.gemm_threads_min_elements
    )
    pattern = KernelPattern(fused.semiring, dtype, True, seg.normalize, parallel, template="gemm")
    return Step(seg, pattern, params, 2 * shape.terms)


Copies = tuple[abi.GemmCopy, ...]


def _c_order(sizes: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(sizes):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))
