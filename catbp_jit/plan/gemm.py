"""GEMM steps (reassociating mode, CPU): a pairwise contraction as a BLAS matrix product.

A segment of two leaves that sums over axes both leaves have is, per position of the
axes all three operands share (batch), a matrix product

    out[i][j] = ⊕_k a[i][k] ⊗ b[k][j]

when, in memory, each operand is a 2-d matrix np.dot accepts: the output C-order over
([i axes], [j axes]), each leaf C- or F-order over its ([i], [k]) or ([k], [j]) axes, the
axes of each group in one order in every operand. Numba's np.dot(a, b, out) then writes
the preallocated output through BLAS (Numba's linear algebra needs SciPy).

PROB is a plain product. LOGPROB goes through exponentials shifted by the row maxima of a
and the column maxima of b: out = log(exp(a - ma) · exp(b - mb)) + ma + mb. An element
whose shifted sum is not a safe normal number (underflow: its largest term is far below
ma + mb; 0 for an all -inf sum; inf or NaN) is recomputed directly with the two-pass
logsumexp, so every result is within rounding of the reference (codegen/cpu_gemm.py).
SAT and COUNT have no BLAS: their segments keep the loop kernels. GEMM sums in the dtype
(float32 included, where the loop kernels sum in float64): float32 GEMMs are bounded to
short sums for the tolerance's sake.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import abi
from ..ir.schema import TensorSpec
from ..semiring import semiring
from .arena import MemoryPlan
from .fusion import Fused, Segment
from .options import PlanOptions
from .steps import KernelPattern, Step, c_strides, normalize_groups

GEMM_DTYPES = ("float64", "float32")
# float32 sums round to ~K x 6e-8; docs/ir.md's float32 tolerance is rtol 1e-5
FLOAT32_MAX_K = 64
MIN_WORK = 4096  # below this, a BLAS call costs more than the loop kernel
# ... and below this many products per element of a, b and out: BLAS gains from reusing
# each element of a and b across a row or column; a skinny product (a batch of dot
# products) has nothing to reuse, and LOGPROB's exponentials of a and b would cost as much
# as the sum itself
MIN_REUSE = 4


@dataclass(frozen=True)
class GemmShape:
    a: int  # leaf values, in product order (a ⊗ b; the output is [i][j])
    b: int
    a_t: bool  # a stored [K][M] (else [M][K])
    b_t: bool  # b stored [N][K] (else [K][N])
    m: int
    n: int
    k: int
    batch: tuple[tuple[int, int, int, int], ...]  # (size, out, a, b strides) per batch axis

    @property
    def work_elements(self) -> int:
        """LOGPROB's workspace: exp(a - ma), exp(b - mb), ma, mb."""
        return self.m * self.k + self.k * self.n + self.m + self.n


def gemm_shape(
    seg: Segment, fused: Fused, layouts: dict[int, TensorSpec], dtype: str, options: PlanOptions
) -> GemmShape | None:
    """The matrix product that computes `seg`, or None when it is not one."""
    if (
        options.exact
        or not options.gemm
        or not semiring(fused.semiring).sums_reals
        or dtype not in GEMM_DTYPES
        or len(seg.leaves) != 2
    ):
        return None
    out_l, a_l, b_l = (layouts[v] for v in (seg.out,) + seg.leaves)

    def big(spec):
        return {ax.key: ax.size for ax in spec.axes if ax.size > 1}

    out, a, b = big(out_l), big(a_l), big(b_l)
    red = {ax.key for ax in seg.red_axes if ax.size > 1}
    if not red or any(
        ax.size != a.get(ax.key, ax.size) or ax.size != b.get(ax.key, ax.size) for ax in seg.red_axes
    ):
        return None
    ks = [x for x in a if x in red]  # in a's memory order
    if set(ks) != red or not red <= set(b) or set(a) - set(out) - red or set(b) - set(out) - red:
        return None  # an axis summed by one leaf alone (the reassociation pass splits those)
    if any(key not in a and key not in b for key in out):
        return None  # an output axis neither leaf has (a broadcast)
    order = [key for key in out]  # the output's memory order
    shared = [x for x in order if x in a and x in b]
    rows = [x for x in order if x in a and x not in b]
    cols = [x for x in order if x in b and x not in a]
    if order[len(shared) :] not in (rows + cols, cols + rows):
        return None
    if rows and cols and order[len(shared)] == cols[0]:  # out is [j][i]: out^T = b^T a^T
        return _shape(seg.leaves[1], seg.leaves[0], cols, rows, ks, shared, out_l, b_l, a_l, dtype)
    return _shape(seg.leaves[0], seg.leaves[1], rows, cols, ks, shared, out_l, a_l, b_l, dtype)


def _shape(
    a: int, b: int, rows, cols, ks, shared, out_l: TensorSpec, a_l: TensorSpec, b_l: TensorSpec, dtype: str
) -> GemmShape | None:
    so, sa, sb = (c_strides(spec) for spec in (out_l, a_l, b_l))
    size = {ax.key: ax.size for spec in (out_l, a_l, b_l) for ax in spec.axes}
    m, n, k = (_count(g, size) for g in (rows, cols, ks))
    if dtype == "float32" and k > FLOAT32_MAX_K or m * n * k < MIN_WORK:
        return None
    if m * n * k < MIN_REUSE * (m * k + k * n + m * n):
        return None
    if _group(cols, so, size) not in (1, None) or _group(rows, so, size) not in (n, None):
        return None
    a_t = _matrix(rows, ks, sa, size, m, k)
    b_t = _matrix(ks, cols, sb, size, k, n)
    if a_t is None or b_t is None:
        return None
    batch = tuple((size[x], so[x], sa[x], sb[x]) for x in shared)
    return GemmShape(a, b, a_t, b_t, m, n, k, batch)


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


def _count(keys, size) -> int:
    n = 1
    for x in keys:
        n *= size[x]
    return n


def gemm_workspace(
    fused: Fused, layouts: dict[int, TensorSpec], dtype: str, options: PlanOptions
) -> dict[int, int]:
    """Segment index -> elements of workspace its LOGPROB GEMM needs while it runs."""
    if not semiring(fused.semiring).is_log:
        return {}
    need = {}
    for i, seg in enumerate(fused.segments):
        shape = gemm_shape(seg, fused, layouts, dtype, options)
        if shape is not None:
            need[i] = shape.work_elements
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
    params = abi.GemmParams(
        out=region[seg.out].offset,
        a=region[shape.a].offset,
        a_t=shape.a_t,
        b=region[shape.b].offset,
        b_t=shape.b_t,
        m=shape.m,
        n=shape.n,
        k=shape.k,
        batch=shape.batch,
        groups=normalize_groups(seg, layouts[seg.out], batch_key),
        work=work,
    )
    n_batch = _count([size for size, *_ in shape.batch], {n: n for n, *_ in shape.batch})
    pattern = KernelPattern(fused.semiring, dtype, True, seg.normalize, False, template="gemm")
    return Step(seg, pattern, params, n_batch * shape.m * shape.n * shape.k * 2)
