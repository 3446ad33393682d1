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
from typing import List, Tuple

import numpy as np

from .. import abi
from ..plan.loops import ACROSS_REDUCED
from ..plan.schedule import KernelPattern
from ..semiring import SEMIRINGS, Semiring
from .reduction import reduced_value

ENTRY = "kernel"
NORMALIZE_ENTRY = "normalize"
THREADS_PER_BLOCK = 128


def launch_shape(params: abi.StepParams) -> Tuple[int, int]:
    """(kernel work items, normalize work items) of a step: its output elements, and its
    NORMALIZE groups (launched only for patterns that normalize)."""
    return math.prod(params.sizes[:params.out_rank]), params.groups[0]


# the libdevice product rounded on its own, by float dtype
ROUNDED_MUL = {"float64": "dmul_rn", "float32": "fmul_rn"}


def _rounds_products(sr: Semiring, dtype: str) -> bool:
    """Whether ⊗ is a float multiply, which a compiler could fuse into the sum's add."""
    return sr.product_op.strip() == "*" and np.dtype(dtype).kind == "f"


def _summed_product(sr: Semiring, dtype: str, terms: List[str]) -> str:
    """The ⊗-product of terms, left to right, as source for a term of a sum: float
    products through `mul`, rounded on their own (see the module docstring)."""
    if not _rounds_products(sr, dtype):
        return sr.product(terms)
    x = terms[0]
    for t in terms[1:]:
        x = f"mul({x}, {t})"
    return x


def _accumulator(sr: Semiring, dtype: str) -> str:
    """⊕'s starting value typed as the accumulator: float sums in float64, integer ones in
    int64. Typed explicitly, because under the simulator a Python 0.0 plus a float32 is a
    float32 (numpy's promotion), where compiled code, on either target, adds in float64."""
    acc = sr.accumulator(dtype)
    kind = np.dtype(dtype).kind
    if sr.reduction == "any":
        return acc
    return f"np.float64({acc})" if kind == "f" else f"np.int64({acc})"


def _offsets(ind: str, first: str, last: str, start: str, names: List[str],
             strides: List[str]) -> List[str]:
    """Add flat position `start` (C order over axes first..last) to the offsets `names`."""
    stop = "-1" if first == "0" else f"{first} - 1"
    lines = [f"{ind}rem = {start}", f"{ind}for d in range({last}, {stop}, -1):",
             f"{ind}    i = rem % P[N + d]", f"{ind}    rem //= P[N + d]"]
    return lines + [f"{ind}    {n} += i * P[{s} + d]" for n, s in zip(names, strides)]


def _sweep(ind: str, k: int, body: List[str], stop: bool) -> List[str]:
    """One pass over the reduced axes of the current output element, in flat C order (the
    CPU's: odometer axes R..top-1, then the V elements of the vector, each leaf moving
    along it by its access, abi.py), `body` on each term."""
    pad = ind + "    "
    lines = [f"{ind}for q in range(n_odo):"]
    lines += [f"{pad}r{l} = b{l}" for l in range(k)]
    lines += _offsets(pad, "R", "top - 1", "q", [f"r{l}" for l in range(k)],
                      [f"L{l} + 1" for l in range(k)])
    lines += [f"{pad}for v in range(V):"]
    lines += [f"{pad}    c{l} = r{l} + (P[T{l} + v] if K{l} == GATHERED else v * S{l})"
              for l in range(k)]
    lines += [f"{pad}    {b}" for b in body]
    if stop:  # SAT: leave every loop once a term is true
        lines += [f"{pad}    if acc:", f"{pad}        break", f"{pad}if acc:", f"{pad}    break"]
    return lines


def _reduced_value(k: int, sr: Semiring, dtype: str) -> List[str]:
    """Lines leaving ⊕ over the reduced axes of the current output element in `v`."""
    terms = [f"mem[c{l}]" for l in range(k)]
    return reduced_value(k, sr, terms, _sweep, _accumulator(sr, dtype),
                         _summed_product(sr, dtype, terms), lambda x: f"np.float64({x})")


def _normalize_group(sr: Semiring) -> List[str]:
    """NORMALIZE group g: `size` elements at base + o * es, summed in the CPU's order."""
    i = "        "
    x = "mem[base + o * es]"
    if sr.normalization == "divide_by_total":
        return [f"{i}total = np.float64(0.0)",
                f"{i}for o in range(size):", f"{i}    total += {x}",
                f"{i}if total != 0.0:",
                f"{i}    for o in range(size):",
                f"{i}        {x} = {x} / total"]
    if sr.normalization == "subtract_logsumexp":
        return [f"{i}top_x = np.float64(-np.inf)",
                f"{i}for o in range(size):",
                f"{i}    if {x} > top_x or {x} != {x}:",
                f"{i}        top_x = np.float64({x})",
                f"{i}z = top_x",
                f"{i}if top_x != -np.inf:",
                f"{i}    acc = np.float64(0.0)",
                f"{i}    for o in range(size):",
                f"{i}        acc += math.exp({x} - top_x)",
                f"{i}    z = top_x + math.log(acc)",
                f"{i}for o in range(size):", f"{i}    {x} = {x} - z"]
    raise AssertionError(f"{sr.name} does not normalize")


HEADER = '''"""catbp_jit CUDA kernel {name}

out[o] = {formula}   ({semiring}, {dtype}{then})

P[p:] holds this step's parameters (catbp_jit/abi.py): out offset, R output axes, Q
reduced axes, nb vector axes, V vector elements, sizes n[0..D-1], output strides
so[0..R-1], per leaf its offset and strides on all D = R + Q axes (in elements of `mem`),
and each operand's access along the vector. One thread per output element, grid-stride;
{walk}
"""
import math

import numpy as np
from numba import config, cuda

{abi}'''

MUL = '''

if config.ENABLE_CUDASIM:
    # the simulator runs kernels as Python, without libdevice: * rounds each product
    def mul(a, b):
        return a * b
else:
    # a product rounded alone: NVVM would fuse `acc += a * b` into an fma (one rounding)
    # and the sums would differ from the CPU target's in the last bits
    from numba.cuda.libdevice import {rounded} as mul
'''


def _n_out() -> List[str]:
    return ["    n_out = 1",
            "    for d in range(R):",
            "        n_out *= P[p + SIZES + d]"]


def _kernel(pattern: KernelPattern, sr: Semiring) -> List[str]:
    k = pattern.leaves
    b = [f"b{l}" for l in range(k)]
    lines = ["", "", "@cuda.jit(cache=True)",
             f"def {ENTRY}(mem, P, p):",
             '    """Segment p of the table: one output element per thread, grid-stride."""',
             "    out = P[p + OUT]",
             "    R = P[p + OUT_RANK]",
             "    D = R + P[p + RED_RANK]",
             "    N = p + SIZES  # P[N + d]: size of axis d",
             f"    SO = p + {abi.OUT_STRIDES_SOURCE}  # P[SO + d]: output stride of axis d < R"]
    lines += [f"    L{l} = p + {abi.leaf_source(l)}  # leaf {l}: offset, then strides"
              for l in range(k)]
    lines += _n_out()
    if pattern.reduce and pattern.vector == ACROSS_REDUCED:
        lines += ["    top = D - P[p + BLOCK_AXES]  # odometer axes R..top-1; the vector top..D-1",
                  "    V = P[p + BLOCK_SIZE]"]
        for l in range(k):
            lines += [f"    A = p + {abi.access_source(k, l)}  # leaf {l}'s access along the vector",
                      f"    K{l}, S{l}, T{l} = P[A], P[A + 1], P[A + 2]"]
    elif pattern.reduce:  # the CPU's vector runs across outputs: a thread walks all Q axes
        lines += ["    top = D", "    V = 1"]
        lines += [f"    K{l}, S{l}, T{l} = CONSTANT, 0, 0" for l in range(k)]
    if pattern.reduce:
        lines += ["    n_odo = 1",
                  "    for d in range(R, top):",
                  "        n_odo *= P[N + d]"]
    lines += ["    o = cuda.grid(1)",
              "    while o < n_out:",
              "        o_off = out"]
    lines += [f"        b{l} = P[L{l}]" for l in range(k)]
    lines += _offsets("        ", "0", "R - 1", "o", ["o_off"] + b,
                      ["SO"] + [f"L{l} + 1" for l in range(k)])
    if pattern.reduce:
        lines += _reduced_value(k, sr, pattern.dtype)
        lines += ["        mem[o_off] = v"]
    else:
        lines += [f"        mem[o_off] = {sr.product([f'mem[{x}]' for x in b])}"]
    lines += ["        o += cuda.gridsize(1)"]
    return lines


def _normalize(pattern: KernelPattern, sr: Semiring) -> List[str]:
    lines = ["", "", "@cuda.jit(cache=True)",
             f"def {NORMALIZE_ENTRY}(mem, P, p):",
             '    """NORMALIZE the output of segment p (after `kernel`): one group per thread, its',
             "    groups, gs, es: part g at out + g * gs, its elements es apart",
             '    (plan/schedule.py: normalize_groups)."""',
             "    out = P[p + OUT]",
             "    R = P[p + OUT_RANK]",
             "    D = R + P[p + RED_RANK]"]
    lines += _n_out()
    lines += [f"    G = p + {abi.groups_source(pattern.leaves)}  # after the last leaf's strides",
              "    groups, gs, es = P[G], P[G + 1], P[G + 2]",
              "    size = n_out // groups",
              "    g = cuda.grid(1)",
              "    while g < groups:",
              "        base = out + g * gs"]
    lines += _normalize_group(sr)
    return lines + ["        g += cuda.gridsize(1)"]


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the CUDA kernel for `pattern`: readable, deterministic,
    one source for a GPU and for the simulator."""
    k, sr = pattern.leaves, SEMIRINGS[pattern.semiring]
    terms = " ⊗ ".join(f"leaf{l}[o{', r' if pattern.reduce else ''}]" for l in range(k))
    lines = HEADER.format(
        name=replace(pattern, parallel=False).name,  # one module whatever `parallel`
        formula=("⊕_r " if pattern.reduce else "") + terms, semiring=sr.name,
        dtype=pattern.dtype, then=", then NORMALIZE" if pattern.normalize else "",
        walk=("its offsets by div/mod over\nthe R output axes, then ⊕ over the reduced axes "
              "in the CPU's order: axes R..top-1 by\ndiv/mod, then (if the CPU's vector runs "
              "along reduced axes) its V elements, each\nleaf by its access."
              if pattern.reduce else "its offsets by div/mod over\nall D axes."),
        abi=abi.source_constants()).rstrip("\n").split("\n")
    if pattern.reduce and k > 1 and _rounds_products(sr, pattern.dtype):
        if pattern.dtype not in ROUNDED_MUL:
            raise ValueError(f"kernel {pattern.name}: no CUDA product for dtype {pattern.dtype} "
                             f"(CUDA kernels take {', '.join(ROUNDED_MUL)})")
        lines += MUL.format(rounded=ROUNDED_MUL[pattern.dtype]).rstrip("\n").split("\n")
    lines += _kernel(pattern, sr)
    if pattern.normalize:
        lines += _normalize(pattern, sr)
    return "\n".join(lines) + "\n"
