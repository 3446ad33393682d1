"""Numba CUDA source for the one kernel template, `contract_reduce`, on the GPU.

A kernel computes one segment (see plan/fusion.py), as codegen/cpu.py's does:

    out[o] = ⊕_r  leaf_0[o, r] ⊗ leaf_1[o, r] ⊗ ... ⊗ leaf_{k-1}[o, r]

It reads the same int64 table P (catbp_jit/abi.py) with the same pattern (semiring,
dtype, leaves, reduce, normalize; `parallel` is a CPU notion and ignored), so a schedule
planned once runs on either target. A module has two entries:

  - `kernel(mem, P, p)`: one thread per output element (flat C order over the R output
    axes, which are all D axes when the kernel does not reduce), in a grid-stride loop, so
    any launch shape gives the same result. A thread finds its offsets from its flat index
    by div/mod over the sizes, then ⊕s the Q reduced axes alone and in the CPU kernel's
    order (odometer axes outermost, then the block axes through the offset tables at
    P[p + TABLES], then the tight axis): a sum adds its terms in the order the CPU's does,
    so PROB, SAT and COUNT results are bit-identical to the CPU target's. P's scratch area
    (the CPU's loop counters) is never touched: threads would race on it.
  - `normalize(mem, P, p)` (patterns that normalize): launched after `kernel`, one thread
    per NORMALIZE group (plan/schedule.normalize_groups), each group in the CPU's order.

Float products that feed a sum are rounded before they are added (libdevice dmul_rn /
fmul_rn): NVVM would otherwise contract `acc += a * b` into one fma, rounding once where
the CPU rounds twice. The simulator (NUMBA_ENABLE_CUDASIM=1) runs kernels as Python and
has no libdevice; there `*` rounds each product already, so the module picks it then.

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
from .reduction import reduced_value

ENTRY = "kernel"
NORMALIZE_ENTRY = "normalize"
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
    through `mul`, rounded on its own (see the module docstring)."""

    def at(j):
        return element(j, f"{offsets}[{j}]")

    times = (
        f"x = mul(x, {at('l')})"
        if summed and _rounds_products(sr, dtype)
        else f"x = {sr.product(['x', at('l')])}"
    )
    return [f"{ind}x = {at('0')}", f"{ind}for l in range(1, K):", f"{ind}    {times}"]


def _accumulator(sr: Semiring, dtype: str) -> str:
    """⊕'s starting value typed as the accumulator: float sums in float64, integer ones in
    int64. Typed explicitly, because under the simulator a Python 0.0 plus a float32 is a
    float32 (numpy's promotion), where compiled code, on either target, adds in float64."""
    acc = sr.accumulator(dtype)
    kind = np.dtype(dtype).kind
    if sr.reduction == "any":
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


def _reduced_value(sr: Semiring, dtype: str) -> list[str]:
    """Lines leaving ⊕ over the reduced axes of the current output element in `v`."""

    def sweep(ind, k, body, stop):
        return _sweep(ind, k, body, stop, sr, dtype, summed=True)

    return reduced_value(0, sr, ["x"], sweep, _accumulator(sr, dtype), "x", lambda x: f"np.float64({x})")


def _normalize_group(sr: Semiring) -> list[str]:
    """NORMALIZE group g: `size` elements at base + o * es, summed in the CPU's order."""
    i = "        "
    x = "mem[base + o * es]"
    if sr.normalization == "divide_by_total":
        return [
            f"{i}total = np.float64(0.0)",
            f"{i}for o in range(size):",
            f"{i}    total += {x}",
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
import math

import numpy as np
from numba import config, cuda

{abi}MAX_LEAVES = {max_leaves}  # a step's leaves at most (abi.MAX_LEAVES)

'''

MUL = """

if config.ENABLE_CUDASIM:
    # the simulator runs kernels as Python, without libdevice: * rounds each product
    def mul(a, b):
        return a * b
else:
    # a product rounded alone: NVVM would fuse `acc += a * b` into an fma (one rounding)
    # and the sums would differ from the CPU target's in the last bits
    from numba.cuda.libdevice import {rounded} as mul
"""


def _n_out() -> list[str]:
    return ["    n_out = 1", "    for d in range(R):", "        n_out *= P[p + SIZES + d]"]


def _entry(name: str, doc: list[str]) -> list[str]:
    """A kernel's head: segment p's output offset (out), output rank (R) and rank (D)."""
    return [
        "",
        "",
        "@cuda.jit(cache=True)",
        f"def {name}(mem, P, p):",
        *doc,
        "    out = P[p + OUT]",
        "    R = P[p + OUT_RANK]",
        "    D = R + P[p + RED_RANK]",
    ]


def _kernel(pattern: KernelPattern, sr: Semiring) -> list[str]:
    lines = _entry(ENTRY, ['    """Segment p of the table: one output element per thread, grid-stride."""'])
    lines += [
        "    K = P[p + LEAVES]",
        "    N = p + SIZES  # P[N + d]: size of axis d",
        f"    SO = p + {abi.OUT_STRIDES_SOURCE}  # P[SO + d]: output stride of axis d < R",
        "    LS = 1 + D  # a leaf's row: its offset, then its D strides",
        "    L = SO + R  # leaf l's row at P[L + l * LS]",
        "    A = L + K * LS + GROUP_FIELDS  # leaf l's access at A + l * ACCESS_FIELDS",
        "    b = cuda.local.array(MAX_LEAVES, np.int64)  # b[l]: leaf l's offset at the output",
    ]
    lines += _n_out()
    if pattern.reduce:
        lines += [
            "    r = cuda.local.array(MAX_LEAVES, np.int64)  # r[l]: leaf l's offset in the sweep",
            "    e = cuda.local.array(MAX_LEAVES, np.int64)  # e[l]: ... at a vector element",
        ]
    if pattern.reduce and pattern.vector == ACROSS_REDUCED:
        lines += [
            "    top = D - P[p + BLOCK_AXES]  # odometer axes R..top-1; the vector top..D-1",
            "    V = P[p + BLOCK_SIZE]",
        ]
    elif pattern.reduce:  # the CPU's vector runs across outputs: a thread walks all Q axes
        lines += ["    top = D", "    V = 1"]
    if pattern.reduce:
        lines += ["    n_odo = 1", "    for d in range(R, top):", "        n_odo *= P[N + d]"]
    lines += [
        "    o = cuda.grid(1)",
        "    while o < n_out:",
        "        o_off = out",
        "        for l in range(K):",
        "            b[l] = P[L + l * LS]",
    ]
    lines += _offsets("        ", "0", "R - 1", "o", True, "b")
    if pattern.reduce:
        lines += _reduced_value(sr, pattern.dtype)
        lines += ["        mem[o_off] = v"]
    else:
        lines += _product_lines("        ", sr, pattern.dtype, "b", False, lambda _leaf, at: f"mem[{at}]")
        lines += ["        mem[o_off] = x"]
    lines += ["        o += cuda.gridsize(1)"]
    return lines


def _normalize(pattern: KernelPattern, sr: Semiring) -> list[str]:
    lines = _entry(
        NORMALIZE_ENTRY,
        [
            '    """NORMALIZE the output of segment p (after `kernel`): one group per thread, its',
            "    groups, gs, es: part g at out + g * gs, its elements es apart",
            '    (plan/schedule.py: normalize_groups)."""',
        ],
    )
    lines += _n_out()
    lines += [
        "    G = p + SIZES + D + R + P[p + LEAVES] * (1 + D)  # after the last leaf's strides",
        "    groups, gs, es = P[G], P[G + 1], P[G + 2]",
        "    size = n_out // groups",
        "    g = cuda.grid(1)",
        "    while g < groups:",
        "        base = out + g * gs",
    ]
    lines += _normalize_group(sr)
    return lines + ["        g += cuda.gridsize(1)"]


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the CUDA kernel for `pattern`: readable, deterministic,
    one source for a GPU and for the simulator."""
    sr = SEMIRINGS[pattern.semiring]
    at = "[o, r]" if pattern.reduce else "[o]"
    lines = (
        HEADER.format(
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
            abi=abi.source_constants(),
            max_leaves=abi.MAX_LEAVES,
        )
        .rstrip("\n")
        .split("\n")
    )
    if pattern.dtype not in DTYPES:
        raise ValueError(
            f"kernel {pattern.name}: no CUDA kernel for dtype {pattern.dtype} "
            f"(CUDA kernels take {', '.join(DTYPES)})"
        )
    if pattern.reduce and _rounds_products(sr, pattern.dtype):
        lines += MUL.format(rounded=ROUNDED_MUL[pattern.dtype]).rstrip("\n").split("\n")
    lines += _kernel(pattern, sr)
    if pattern.normalize:
        lines += _normalize(pattern, sr)
    return "\n".join(lines) + "\n"
