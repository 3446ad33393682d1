"""Numba CUDA source for the one kernel template, `contract_reduce`, on the GPU.

A kernel computes one segment (see plan/fusion.py), as codegen/cpu.py's does:

    out[o] = ⊕_r  leaf_0[o, r] ⊗ leaf_1[o, r] ⊗ ... ⊗ leaf_{k-1}[o, r]

It reads the same int64 table P (catbp_jit/abi.py) with the same pattern (semiring,
dtype, leaves, reduce, normalize; `parallel` is a CPU notion and ignored), so a schedule
planned once runs on either target. A module's work is in device functions; its two
entries launch them for one step (the per-step path). The schedule kernel
(codegen/cuda_schedule.py: every step in one launch) calls `shaped_contract_fn`'s
functions instead, specialized on a step's shape too, with the same bits:

  - `kernel(mem, P, p)` (device function `contract`): one thread per output element (flat
    C order over the R output axes, which are all D axes when the kernel does not reduce),
    in a grid-stride loop, so
    any launch shape gives the same result. A thread finds its offsets from its flat index
    by div/mod over the sizes, then ⊕s the Q reduced axes alone and in the CPU kernel's
    order (odometer axes outermost, then the block axes through the offset tables at
    P[p + TABLES], then the tight axis): a sum adds its terms in the order the CPU's does,
    so PROB, SAT, COUNT and MAXLOG (a max is exact in any order) results are
    bit-identical to the CPU target's, NaN payloads aside (a GPU's default NaN is not an
    x86 CPU's). P's scratch area (the CPU's loop counters) is never touched: threads
    would race on it.
  - `normalize(mem, P, p)` (`normalize_groups`; patterns that normalize): launched after
    `kernel`, one thread per NORMALIZE group (plan/schedule.normalize_groups), each group
    in the CPU's order.

Float products that feed a sum are rounded before they are added (libdevice dmul_rn /
fmul_rn): NVVM would otherwise contract `acc += a * b` into one fma, rounding once where
the CPU rounds twice. The simulator (NUMBA_ENABLE_CUDASIM=1) runs kernels as Python and
has no libdevice; there `*` rounds each product already, so the module defines the
libdevice name as a plain product then.

The host launches `launch_shape(params)` work items per entry, THREADS_PER_BLOCK to a
block (codegen/cuda_run.py). docs/architecture.md, section 11, shows one segment on both targets.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .. import abi
from ..plan.loops import ACROSS_REDUCED
from ..plan.steps import KernelPattern
from ..semiring import SEMIRINGS, Semiring
from .reduction import Lanes, reduced_value, subtract_largest
from .totals import LANES, LANES_ADDED, TOTAL_PARTS

ENTRY = "kernel"
NORMALIZE_ENTRY = "normalize"
CONTRACT_FN = "contract"  # the device functions behind them
NORMALIZE_FN = "normalize_groups"
THREADS_PER_BLOCK = 128


def launch_shape(params: abi.StepParams) -> tuple[int, int]:
    """(kernel work items, normalize work items) of a step: its output elements, and its
    NORMALIZE groups (launched only for patterns that normalize)."""
    return math.prod(params.sizes[: params.out_rank]), params.groups[0]


# the libdevice product rounded on its own, by float dtype
ROUNDED_MUL = {"float64": "dmul_rn", "float32": "fmul_rn"}
DTYPES = ("float64", "float32", "bool", "int64")


def _rounds_products(sr: Semiring, dtype: str) -> bool:
    """Whether ⊗ is a float multiply, which a compiler could fuse into the sum's add."""
    return sr.product_op.strip() == "*" and np.dtype(dtype).kind == "f"


def _product_lines(ind: str, sr: Semiring, dtype: str, offsets: str, summed: bool, element) -> list[str]:
    """`x` = the ⊗-product of the K leaves, left to right, each leaf's element as
    `element`(l, its offset in `offsets`) gives it; a float product that feeds a sum
    through libdevice's rounded multiply (see the module docstring)."""

    def at(j):
        return element(j, f"{offsets}[{j}]")

    return [
        f"{ind}x = {at('0')}",
        f"{ind}for l in range(1, K):",
        f"{ind}    {_times(sr, dtype, summed, at('l'))}",
    ]


def _times(sr: Semiring, dtype: str, summed: bool, operand: str) -> str:
    """`x` ⊗= operand: a float product that feeds a sum through libdevice's rounded
    multiply (see the module docstring)."""
    if summed and _rounds_products(sr, dtype):
        return f"x = {ROUNDED_MUL[dtype]}(x, {operand})"
    return f"x = {sr.product(['x', operand])}"


def _accumulator(sr: Semiring, dtype: str) -> str:
    """⊕'s starting value typed as the accumulator: float sums in float64, integer ones in
    int64. Typed explicitly, because under the simulator a Python 0.0 plus a float32 is a
    float32 (numpy's promotion), where compiled code, on either target, adds in float64."""
    acc = sr.accumulator(dtype)
    kind = np.dtype(dtype).kind
    if sr.reduction == "any" or sr.is_max:  # (a max's is typed already: in the dtype)
        return acc
    return f"np.float64({acc})" if kind == "f" else f"np.int64({acc})"


def _offsets(ind: str, first: str, last: str, start: str, out: bool, leaves: str) -> list[str]:
    """Add flat position `start` (C order over axes first..last) to o_off (out) and every
    leaf's offset in `leaves`."""
    stop = "-1" if first == "0" else f"{first} - 1"
    lines = [
        f"{ind}rem = {start}",
        f"{ind}for d in range({last}, {stop}, -1):",
        f"{ind}    i = rem % P[N + d]",
        f"{ind}    rem //= P[N + d]",
    ]
    lines += [f"{ind}    o_off += i * P[SO + d]"] if out else []
    return lines + [f"{ind}    for l in range(K):", f"{ind}        {leaves}[l] += i * P[L + l * LS + 1 + d]"]


def _sweep(
    ind: str, k: int, body: list[str], stop: bool, sr: Semiring, dtype: str = "", summed: bool = False
) -> list[str]:
    """One pass over the reduced axes of the current output element, in flat C order (the
    CPU's: odometer axes R..top-1, then the V elements of the vector, each leaf moving
    along it by its access, abi.py), `body` on each term `x`."""
    pad = ind + "    "
    lines = [f"{ind}for q in range(n_odo):", f"{pad}for l in range(K):", f"{pad}    r[l] = b[l]"]
    lines += _offsets(pad, "R", "top - 1", "q", False, "r")
    lines += [
        f"{pad}for v in range(V):",
        f"{pad}    for l in range(K):  # e[l]: leaf l at element v of the vector, by its access",
        f"{pad}        a = A + l * ACCESS_FIELDS",
        f"{pad}        if P[a] == GATHERED:",
        f"{pad}            e[l] = r[l] + P[P[a + 2] + v]",
        f"{pad}        else:",
        f"{pad}            e[l] = r[l] + v * P[a + 1]",
    ]
    lines += _product_lines(pad + "    ", sr, dtype, "e", summed, lambda _leaf, at: f"mem[{at}]")
    lines += [f"{pad}    {b}" for b in body]
    if stop:  # SAT: leave every loop once a term is true
        lines += [f"{pad}    if acc:", f"{pad}        break", f"{pad}if acc:", f"{pad}    break"]
    return lines


def _reduced_value(sr: Semiring, dtype: str, lanes: bool = False) -> list[str]:
    """Lines leaving ⊕ over the reduced axes of the current output element in `v`; lanes:
    in the CPU's lanes (a plan made for its reassociating mode, KernelPattern.terms_in_lanes)."""

    def sweep(ind, k, body, stop):
        return _sweep(ind, k, body, stop, sr, dtype, summed=True)

    in_lanes = Lanes("lanes", f"v % {LANES}") if lanes else None  # (v: the sweep's place in its vector)
    return reduced_value(
        0, sr, ["x"], sweep, _accumulator(sr, dtype), "x", lambda x: f"np.float64({x})", lanes=in_lanes
    )


def _lane_total(i: str, x: str) -> list[str]:
    """The total in the CPU's parts_total order (codegen/totals.py: TOTAL_PARTS ranges, each
    in LANES lanes added pairwise plus its last elements, the ranges' sums in order): a
    plan made for the CPU's reassociating mode (KernelPattern.total_in_lanes)."""
    lanes = [f"s{k}" for k in range(LANES)]
    return [
        f"{i}total = np.float64(0.0)",
        f"{i}for c in range({TOTAL_PARTS}):",
        f"{i}    lo, hi = size * c // {TOTAL_PARTS}, size * (c + 1) // {TOTAL_PARTS}",
        f"{i}    {' = '.join(lanes)} = np.float64(0.0)",
        f"{i}    o = lo",
        f"{i}    while o + {LANES} <= hi:",
        *[f"{i}        s{k} += {x.replace('o * es', f'(o + {k}) * es') if k else x}" for k in range(LANES)],
        f"{i}        o += {LANES}",
        f"{i}    rest = np.float64(0.0)",
        f"{i}    while o < hi:",
        f"{i}        rest += {x}",
        f"{i}        o += 1",
        f"{i}    total += {LANES_ADDED} + rest",
    ]


def _normalize_group(sr: Semiring, dtype: str, lanes: bool = False) -> list[str]:
    """NORMALIZE group g: `size` elements at base + o * es, summed in the CPU's order
    (lanes: its reassociating mode's, _lane_total)."""
    i = "        "
    x = "mem[base + o * es]"
    if sr.normalization == "subtract_max":
        return subtract_largest(i, sr, dtype, x, [f"{i}for o in range(size):", f"{i}    {x} = {x} - top_x"])
    if sr.normalization == "divide_by_total":
        in_order = [f"{i}total = np.float64(0.0)", f"{i}for o in range(size):", f"{i}    total += {x}"]
        return (_lane_total(i, x) if lanes else in_order) + [
            f"{i}if totals >= 0:  # the total kept as a value of its own (plan/totals.py)",
            f"{i}    mem[totals + g] = total",
            f"{i}if total != 0.0:",
            f"{i}    for o in range(size):",
            f"{i}        {x} = {x} / total",
        ]
    if sr.normalization == "subtract_logsumexp":
        return [
            f"{i}top_x = np.float64(-np.inf)",
            f"{i}for o in range(size):",
            f"{i}    if {x} > top_x or {x} != {x}:",
            f"{i}        top_x = np.float64({x})",
            f"{i}z = top_x",
            f"{i}if top_x != -np.inf:",
            f"{i}    acc = np.float64(0.0)",
            f"{i}    for o in range(size):",
            f"{i}        acc += math.exp({x} - top_x)",
            f"{i}    z = top_x + math.log(acc)",
            f"{i}if totals >= 0:  # the total kept as a value of its own (plan/totals.py)",
            f"{i}    mem[totals + g] = z",
            f"{i}for o in range(size):",
            f"{i}    {x} = {x} - z",
        ]
    raise AssertionError(f"{sr.name} does not normalize")


HEADER = '''"""catbp_jit CUDA kernel {name}

out[o] = {formula}   ({semiring}, {dtype}{then})

P[p:] holds this step's parameters (catbp_jit/abi.py): out offset, R output axes, Q
reduced axes, nb vector axes, V vector elements, K leaves, sizes n[0..D-1], output strides
so[0..R-1], per leaf its offset and strides on all D = R + Q axes (in elements of `mem`),
and each operand's access along the vector. One thread per output element, grid-stride;
{walk}
"""
'''

PRELUDE = """import math

import numpy as np
from numba import config, cuda

{abi}MAX_LEAVES = {max_leaves}  # a step's leaves at most (abi.MAX_LEAVES)

"""


def check_dtype(pattern: KernelPattern) -> None:
    if pattern.dtype not in DTYPES:
        raise ValueError(
            f"kernel {pattern.name}: no CUDA kernel for dtype {pattern.dtype} "
            f"(CUDA kernels take {', '.join(DTYPES)})"
        )


def prelude() -> list[str]:
    """A module's imports and the ABI's constants (catbp_jit/abi.py)."""
    text = PRELUDE.format(abi=abi.source_constants(), max_leaves=abi.MAX_LEAVES)
    return text.rstrip("\n").split("\n")


MUL = """

if config.ENABLE_CUDASIM:
    # the simulator runs kernels as Python, without libdevice: * rounds each product
    def {rounded}(a, b):
        return a * b
else:
    # a product rounded alone: NVVM would fuse `acc += a * b` into an fma (one rounding)
    # and the sums would differ from the CPU target's in the last bits
    from numba.cuda.libdevice import {rounded}
"""


def rounded_mul_lines(patterns) -> list[str]:
    """The rounded multiplies the patterns' sums use (MUL), once per dtype."""
    lines: list[str] = []
    for dtype in sorted(
        {p.dtype for p in patterns if p.reduce and _rounds_products(SEMIRINGS[p.semiring], p.dtype)}
    ):
        lines += MUL.format(rounded=ROUNDED_MUL[dtype]).rstrip("\n").split("\n")
    return lines


def _n_out() -> list[str]:
    return ["    n_out = 1", "    for d in range(R):", "        n_out *= P[p + SIZES + d]"]


def _device_fn(name: str, doc: list[str], scratch: bool) -> list[str]:
    """A device function's head: it does items first, first + stride, ... of segment p
    (output offset out, output rank R, rank D); scratch: it takes the thread's offset
    arrays b, r, e (SCRATCH_ARRAYS)."""
    return [
        "",
        "",
        "@cuda.jit(device=True)",
        f"def {name}(mem, P, p, first, stride{', b, r, e' if scratch else ''}):",
        *doc,
        "    out = P[p + OUT]",
        "    R = P[p + OUT_RANK]",
        "    D = R + P[p + RED_RANK]",
    ]


# A thread's leaf offsets, MAX_LEAVES each: allocated once by the kernel that calls the
# contraction (a schedule kernel's threads keep one set for every pattern, so its local
# memory does not grow with the patterns)
SCRATCH_ARRAYS = [
    "    b = cuda.local.array(MAX_LEAVES, np.int64)  # b[l]: leaf l's offset at the output",
    "    r = cuda.local.array(MAX_LEAVES, np.int64)  # r[l]: leaf l's offset in a reduction's sweep",
    "    e = cuda.local.array(MAX_LEAVES, np.int64)  # e[l]: ... at a vector element",
]


def _launch_entry(name: str, fn: str, doc: str, scratch: bool) -> list[str]:
    """A kernel that runs device function `fn` on one step, a thread per item, grid-stride."""
    return [
        "",
        "",
        "@cuda.jit(cache=True)",
        f"def {name}(mem, P, p):",
        f'    """{doc}"""',
        *(SCRATCH_ARRAYS if scratch else []),
        f"    {fn}(mem, P, p, cuda.grid(1), cuda.gridsize(1){', b, r, e' if scratch else ''})",
    ]


def contract_fn(name: str, pattern: KernelPattern) -> list[str]:
    """Device function `name`: output elements first, first + stride, ... of segment p."""
    sr = SEMIRINGS[pattern.semiring]
    lines = _device_fn(
        name,
        ['    """Output elements first, first + stride, ... of segment p (one thread\'s share)."""'],
        scratch=True,
    )
    lines += [
        "    K = P[p + LEAVES]",
        "    N = p + SIZES  # P[N + d]: size of axis d",
        f"    SO = p + {abi.OUT_STRIDES_SOURCE}  # P[SO + d]: output stride of axis d < R",
        "    LS = 1 + D  # a leaf's row: its offset, then its D strides",
        "    L = SO + R  # leaf l's row at P[L + l * LS]",
        "    A = L + K * LS + GROUP_FIELDS  # leaf l's access at A + l * ACCESS_FIELDS",
    ]
    lines += _n_out()
    if pattern.terms_in_lanes:
        lines += [f"    lanes = cuda.local.array({LANES}, np.float64)  # a sum's lanes (codegen/totals.py)"]
    if pattern.reduce and pattern.vector == ACROSS_REDUCED:
        lines += [
            "    top = D - P[p + BLOCK_AXES]  # odometer axes R..top-1; the vector top..D-1",
            "    V = P[p + BLOCK_SIZE]",
        ]
    elif pattern.reduce:  # the CPU's vector runs across outputs (or both): a thread walks all Q axes
        lines += ["    top = D", "    V = 1"]
    if pattern.reduce:
        lines += ["    n_odo = 1", "    for d in range(R, top):", "        n_odo *= P[N + d]"]
    lines += [
        "    o = first",
        "    while o < n_out:",
        "        o_off = out",
        "        for l in range(K):",
        "            b[l] = P[L + l * LS]",
    ]
    lines += _offsets("        ", "0", "R - 1", "o", True, "b")
    if pattern.reduce:
        lines += _reduced_value(sr, pattern.dtype, pattern.terms_in_lanes)
        lines += ["        mem[o_off] = v"]
    else:
        lines += _product_lines("        ", sr, pattern.dtype, "b", False, lambda _leaf, at: f"mem[{at}]")
        lines += ["        mem[o_off] = x"]
    lines += ["        o += stride"]
    return lines


Shape = tuple[int, int, int]  # a step's (leaves K, output axes R, reduced axes Q)


def step_shape(params: abi.StepParams) -> Shape:
    """What a shaped device function is specialized on besides its pattern."""
    return len(params.leaves), params.out_rank, params.red_rank


def _shaped_sweep(ind: str, k: int, r: int, q: int, body: list[str], stop: bool, product: list[str]):
    """Loops over the Q reduced axes R..R+Q-1 in C order (the CPU's order of the terms:
    the odometer axes, then the vector's, each in C order), each leaf's offset carried
    in a register (c{leaf}_{d}: leaf l with axes R..d fixed), `product` and `body` on each
    term."""
    lines: list[str] = []
    pad = ind
    if not q:  # one term; a loop still, for SAT's break
        lines += [f"{pad}for j_once in range(1):"]
        pad += "    "
    for d in range(r, r + q):
        lines += [f"{pad}for j{d} in range(n{d}):"]
        pad += "    "
        outer = [f"b{leaf}" if d == r else f"c{leaf}_{d - 1}" for leaf in range(k)]
        lines += [f"{pad}c{leaf}_{d} = {outer[leaf]} + j{d} * s{leaf}_{d}" for leaf in range(k)]
    at = [f"c{leaf}_{r + q - 1}" if q else f"b{leaf}" for leaf in range(k)]
    lines += [f"{pad}{line.format(*at)}" for line in product]
    lines += [f"{pad}{b}" for b in body]
    if stop:  # SAT: leave every loop once a term is true
        for depth in range(q - 1, 0, -1):
            lines += [f"{ind}{'    ' * depth}if acc:", f"{ind}{'    ' * depth}    break"]
    return lines


def shaped_contract_fn(name: str, pattern: KernelPattern, shape: Shape) -> list[str]:
    """Device function `name`: contract's work for the steps of one shape (K leaves, R
    output axes, Q reduced axes), the same items in the same order with the same bits. The
    shape fixed, every size and stride is read from the step's row once, into a register,
    and the terms are walked by nested loops: no table reads, no per-leaf arrays and no
    div/mod inside the sum (what the generic function spends most of its time on)."""
    k, r, q = shape
    d_all = r + q
    sr = SEMIRINGS[pattern.semiring]
    so = abi.SIZES + d_all  # the output strides, then each leaf's row: offset, D strides
    row = [so + r + leaf * (1 + d_all) for leaf in range(k)]
    lines = [
        "",
        "",
        "@cuda.jit(device=True)",
        f"def {name}(mem, P, p, first, stride):",
        f'    """Output elements first, first + stride, ... of segment p, a step of {k} leaves,',
        f'    {r} output and {q} reduced axes (one thread\'s share)."""',
        "    out = P[p + OUT]",
    ]
    lines += [f"    n{d} = P[p + {abi.SIZES + d}]" for d in range(d_all)]
    lines += [f"    so{d} = P[p + {so + d}]" for d in range(r)]
    for leaf in range(k):
        lines += [f"    a{leaf} = P[p + {row[leaf]}]"]
        lines += [f"    s{leaf}_{d} = P[p + {row[leaf] + 1 + d}]" for d in range(d_all)]
    lines += ["    n_out = " + (" * ".join(f"n{d}" for d in range(r)) or "1")]
    if pattern.terms_in_lanes:
        lines += [
            "    V = P[p + BLOCK_SIZE]  # a vector's terms: its term v goes to lane v % LANES",
            f"    lanes = cuda.local.array({LANES}, np.float64)  # a sum's lanes (codegen/totals.py)",
        ]
    lines += ["    o = first", "    while o < n_out:", "        rem = o"]
    for d in range(r - 1, -1, -1):  # the output element's index on each axis, C order
        lines += [f"        i{d} = rem % n{d}", f"        rem //= n{d}"] if d else ["        i0 = rem"]
    idx = [f"i{d}" for d in range(r)]

    def offset(base: str, strides: list[str]) -> str:
        return " + ".join([base] + [f"{i} * {s}" for i, s in zip(idx, strides)])

    lines += [f"        o_off = {offset('out', [f'so{d}' for d in range(r)])}"]
    for leaf in range(k):
        lines += [f"        b{leaf} = {offset(f'a{leaf}', [f's{leaf}_{d}' for d in range(r)])}"]
    # leaf j's element as mem[{j}], filled in with its offset where the term is made
    product = ["x = mem[{0}]"] + [
        _times(sr, pattern.dtype, pattern.reduce, f"mem[{{{j}}}]") for j in range(1, k)
    ]
    if pattern.reduce:

        def sweep(ind, _k, body, stop):
            return _shaped_sweep(ind, k, r, q, body, stop, product)

        acc = _accumulator(sr, pattern.dtype)
        # in lanes: the term's place in its vector (the last BLOCK_SIZE terms' run) counted
        step = ("u += 1", "if u == V:", "    u = 0")
        lanes = Lanes("lanes", f"u % {LANES}", ("u = 0",), step) if pattern.terms_in_lanes else None
        lines += reduced_value(0, sr, ["x"], sweep, acc, "x", lambda x: f"np.float64({x})", lanes=lanes)
        lines += ["        mem[o_off] = v"]
    else:
        lines += [f"        {line.format(*[f'b{leaf}' for leaf in range(k)])}" for line in product]
        lines += ["        mem[o_off] = x"]
    return lines + ["        o += stride"]


def normalize_fn(name: str, pattern: KernelPattern) -> list[str]:
    """Device function `name`: NORMALIZE groups first, first + stride, ... of segment p."""
    sr = SEMIRINGS[pattern.semiring]
    lines = _device_fn(
        name,
        [
            '    """NORMALIZE groups first, first + stride, ... of segment p\'s output (after its',
            "    contraction): groups, gs, es: group g at out + g * gs, its elements es apart",
            '    (plan/schedule.py: normalize_groups)."""',
        ],
        scratch=False,
    )
    lines += _n_out()
    lines += [
        "    G = p + SIZES + D + R + P[p + LEAVES] * (1 + D)  # after the last leaf's strides",
        "    groups, gs, es, totals = P[G], P[G + 1], P[G + 2], P[G + 3]",
        "    size = n_out // groups",
        "    g = first",
        "    while g < groups:",
        "        base = out + g * gs",
    ]
    lines += _normalize_group(sr, pattern.dtype, pattern.total_in_lanes)
    return lines + ["        g += stride"]


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the CUDA kernel for `pattern`: readable, deterministic,
    one source for a GPU and for the simulator."""
    check_dtype(pattern)
    sr = SEMIRINGS[pattern.semiring]
    at = "[o, r]" if pattern.reduce else "[o]"
    lines = HEADER.format(
        name=replace(pattern, parallel=False).name,  # one module whatever `parallel`
        formula=("⊕_r " if pattern.reduce else "") + f"leaf_0{at} ⊗ ... ⊗ leaf_(K-1){at}",
        semiring=sr.name,
        dtype=pattern.dtype,
        then=", then NORMALIZE" if pattern.normalize else "",
        walk=(
            "its offsets by div/mod over\nthe R output axes, then ⊕ over the reduced axes "
            "in the CPU's order: axes R..top-1 by\ndiv/mod, then (if the CPU's vector runs "
            "along reduced axes) its V elements, each\nleaf by its access."
            if pattern.reduce
            else "its offsets by div/mod over\nall D axes."
        ),
    ).split("\n")
    lines += prelude() + rounded_mul_lines([pattern])
    lines += contract_fn(CONTRACT_FN, pattern)
    if pattern.normalize:
        lines += normalize_fn(NORMALIZE_FN, pattern)
    lines += _launch_entry(
        ENTRY, CONTRACT_FN, "Segment p of the table: one output element per thread, grid-stride.", True
    )
    if pattern.normalize:
        lines += _launch_entry(
            NORMALIZE_ENTRY,
            NORMALIZE_FN,
            "NORMALIZE segment p's output (after `kernel`): one group per thread.",
            False,
        )
    return "\n".join(lines) + "\n"
