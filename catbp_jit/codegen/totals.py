"""Numba source for a PROB NORMALIZE's total in the reassociating mode: `parts_total`.

This mode may regroup sums (docs/architecture.md §12), so a total runs in LANES
interleaved running sums that do not wait on each other (a sum in the elements' order is
one chain of dependent additions: ~1.5 ms for a 1.77 M-element output on an AMD EPYC,
~0.3 ms in lanes), added in a fixed order after, over TOTAL_PARTS ranges of the elements
whose sums are then added in order. The bits depend on the sizes alone, never on the
threads: a parallel GEMM kernel's threads share the ranges (codegen/cpu_gemm.py), a loop
kernel's `finish` walks them on one thread (codegen/cpu.py), and the numpy tier adds the
same numbers in the same order (numpy_steps.lane_totals).
"""

from __future__ import annotations

from .. import abi

LANES = abi.SUM_LANES
# how the lanes' sums s0..s7 are added (a fixed order: the bits depend on the sizes alone);
# the CUDA normalize writes the same expression (codegen/cuda.py)
LANES_ADDED = "((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))"
TOTAL_PARTS = 16
assert TOTAL_PARTS <= abi.BUFFER  # (the ranges' sums sit in a stack buffer)
# (and, for a NORMALIZE cut in chunks, in the step's float64 slots: abi.SPLIT_FINISH)
assert TOTAL_PARTS <= abi.SPLIT_TOTALS

LANE_TOTAL = """

@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def lane_total(mem, base, es, size):
    \"\"\"Σ of mem[base + o * es] for o < size: element o added to lane o % {lanes}, each
    lane in order, then the lanes pairwise and the last size % {lanes} elements.\"\"\"
{zero}
    o = np.int64(0)
    while o + {lanes} <= size:
        at = base + o * es
{adds}
        o += {lanes}
    rest = 0.0
    while o < size:
        rest += mem[u(base + o * es)]
        o += 1
    return {combined} + rest
""".format(
    lanes=LANES,
    zero="    " + " = ".join(f"s{i}" for i in range(LANES)) + " = 0.0",
    adds="\n".join(f"        s{i} += mem[u(at{f' + {i} * es' if i else ''})]" for i in range(LANES)),
    combined=LANES_ADDED,
)
assert LANES == 8  # (the pairwise sum above is written for 8)

PARTS_TOTAL = """

@njit(cache=True, nogil=True, error_model="numpy"{parallel})
def parts_total(mem, base, es, size):
    \"\"\"Σ of mem[base + o * es] for o < size: TOTAL_PARTS ranges of o, each by lane_total
    (in the stack's `sums`), their sums added in order.\"\"\"
    sums = carray(stack_buffer_float64(), BUFFER)
    for c in {parts}(TOTAL_PARTS):
        lo, hi = size * c // TOTAL_PARTS, size * (c + 1) // TOTAL_PARTS
        sums[c] = lane_total(mem, base + lo * es, es, hi - lo)
    total = 0.0
    for c in range(TOTAL_PARTS):
        total += sums[c]
    return total
"""


def parts_total_source(parallel: bool) -> str:
    """`lane_total` and `parts_total` (the module needs u, np, carray, njit, BUFFER and
    stack_buffer_float64; prange where parallel)."""
    head = f"TOTAL_PARTS = {TOTAL_PARTS}  # a NORMALIZE total's ranges, summed apart\n"
    flag, loop = (", parallel=True", "prange") if parallel else ("", "range")
    return head + LANE_TOTAL + PARTS_TOTAL.format(parallel=flag, parts=loop)
