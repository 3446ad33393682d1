"""Numba source for the one kernel template, `contract_reduce`, on the CPU.

A kernel computes one segment (see plan/fusion.py):

    out[o] = ⊕_r  leaf_0[o, r] ⊗ leaf_1[o, r] ⊗ ... ⊗ leaf_{k-1}[o, r]

It is specialized on its pattern only (semiring, dtype, number of leaves k, reduce or not,
normalize, parallel). Ranks, sizes, strides and offsets are runtime data read from the
int64 table P (layout in plan/schedule.py), so one kernel serves every segment of its
pattern. The loops over the *hot* axes (the reduced axes if the kernel reduces, else the
output axes) run in three layers:
  - the innermost axis, a tight strided loop `j`;
  - up to 256 elements of the axes just outside it, through per-leaf offset tables `t`
    precomputed at plan time (no index arithmetic per element);
  - every remaining axis, an odometer whose counters live in P's scratch area.

A module has one entry, `kernel(mem_address, mem_length, P_address, P_length, p)`, that
both dispatch modes call (loop mode from Python, the compiled-mode dispatcher at its C
address), so a kernel compiles once whatever the mode, and a cache entry filled by one
mode serves the other.

Every output element is computed by the same sequential code whatever the chunking or the
thread count, so results are bit-identical across runs and NUMBA_NUM_THREADS. float32
sums accumulate in float64. LOGPROB reduces with a max-shifted logsumexp in two passes
(-inf for an all -inf sum; NaN propagates), SAT stops at the first true term, COUNT wraps
around like numpy's int64.
"""

from __future__ import annotations

from typing import List

from .. import abi
from ..plan.schedule import KernelPattern
from ..semiring import SEMIRINGS, Semiring
from .reduction import reduced_value

ENTRY = "kernel"


def _product(k: int, sr: Semiring, offsets: List[str]) -> str:
    """The ⊗-product of the k leaves at the given offsets, left to right as written."""
    return sr.product([f"mem[{off}]" for off in offsets[:k]])


def _advance(ind: str, first: str, last: str, names: List[str], strides: List[str]) -> List[str]:
    """Odometer step over axes last..first (last fastest); leaves `d < first` after a wrap."""
    pad = ind + "    "
    lines = [f"{ind}d = {last}", f"{ind}while d >= {first}:", f"{pad}P[idx + d] += 1"]
    lines += [f"{pad}{n} += P[{s} + d]" for n, s in zip(names, strides)]
    lines += [f"{pad}if P[idx + d] < P[N + d]:", f"{pad}    break"]
    lines += [f"{pad}{n} -= P[{s} + d] * P[N + d]" for n, s in zip(names, strides)]
    lines += [f"{pad}P[idx + d] = 0", f"{pad}d -= 1"]
    return lines


def _place(ind: str, first: str, last: str, start: str, names: List[str], strides: List[str]) -> List[str]:
    """Set the odometer over axes first..last on flat position `start` (C order)."""
    stop = "-1" if first == "0" else f"{first} - 1"
    lines = [f"{ind}rem = {start}", f"{ind}for d in range({last}, {stop}, -1):",
             f"{ind}    i = rem % P[N + d]", f"{ind}    rem //= P[N + d]", f"{ind}    P[idx + d] = i"]
    lines += [f"{ind}    {n} += i * P[{s} + d]" for n, s in zip(names, strides)]
    return lines


def _sweep(ind: str, k: int, body: List[str], stop: bool) -> List[str]:
    """One pass over the reduced axes of the current output element, calling `body` on x."""
    pad, r = ind + "    ", [f"r{l}" for l in range(k)]
    lines = [f"{ind}for d in range(R, top):", f"{ind}    P[idx + d] = 0"]
    lines += [f"{ind}r{l} = b{l}" for l in range(k)]
    lines += [f"{ind}while True:", f"{pad}for t in range(blk):"]
    lines += [f"{pad}    c{l} = r{l} + P[T{l} + t]" for l in range(k)]
    lines += [f"{pad}    for j in range(m):"]
    lines += [f"{pad}        {b}" for b in body]
    if stop:  # SAT: leave every loop once a term is true
        lines += [f"{pad}    if acc:", f"{pad}        break", f"{pad}if acc:", f"{pad}    break"]
    lines += _advance(pad, "R", "top - 1", r, [f"L{l} + 1" for l in range(k)])
    lines += [f"{pad}if d < R:", f"{pad}    break"]
    return lines


def _reduced_value(k: int, sr: Semiring, dtype: str) -> List[str]:
    """Lines leaving ⊕ over the reduced axes of the current output element in `v`."""
    terms = [f"mem[c{l} + j * s{l}]" for l in range(k)]
    return reduced_value(k, sr, terms, _sweep, sr.accumulator(dtype), sr.product(terms))


def _normalize(sr: Semiring, k: int) -> List[str]:
    """NORMALIZE the output in `groups` parts (the batch rows) of `size` elements each,
    part g at out + g * gs, its elements es apart (plan/schedule.py: normalize_groups)."""
    i = "        "
    x = "mem[base + o * es]"
    head = [f"    G = p + {abi.groups_source(k)}  # after the last leaf's strides",
            "    groups, gs, es = P[G], P[G + 1], P[G + 2]",
            "    size = n_out // groups",
            "    for g in range(groups):",
            "        base = out + g * gs"]
    if sr.normalization == "divide_by_total":
        return head + [f"{i}total = 0.0",
                       f"{i}for o in range(size):", f"{i}    total += {x}",
                       f"{i}if total != 0.0:",
                       f"{i}    for o in range(size):",
                       f"{i}        {x} = {x} / total"]
    if sr.normalization == "subtract_logsumexp":
        return head + [f"{i}top_x = -np.inf",
                       f"{i}for o in range(size):",
                       f"{i}    if {x} > top_x or {x} != {x}:",
                       f"{i}        top_x = {x}",
                       f"{i}z = top_x",
                       f"{i}if top_x != -np.inf:",
                       f"{i}    acc = 0.0",
                       f"{i}    for o in range(size):",
                       f"{i}        acc += math.exp({x} - top_x)",
                       f"{i}    z = top_x + math.log(acc)",
                       f"{i}for o in range(size):", f"{i}    {x} = {x} - z"]
    return []  # SAT and COUNT do not normalize


HEADER = '''"""catbp_jit kernel {name}

out[o] = {formula}   ({semiring}, {dtype}{then})

P[p:] holds this step's parameters (catbp_jit/abi.py): out offset, R output axes, Q
reduced axes, scratch offset, chunks, nb block axes, blk block elements, table offset,
sizes n[0..D-1], output strides so[0..R-1], and per leaf its offset and strides on all
D = R + Q axes (in elements of `mem`). Axis D-1 is the tight loop; the nb axes before it
are walked through offset tables of blk entries ({tables}); the other hot axes by an
odometer with counters at P[idx:].
"""
import math

import numpy as np
from numba import carray, njit, prange

from catbp_jit.codegen.intrinsics import {pointers}

{abi}
# Arguments are typed int64, never as literals: Numba compiles a callee once per argument
# type it sees while typing its caller, and a literal 0 or 1 would cost a second compile.
ZERO = np.int64(0)


@njit(cache=True, nogil=True, error_model="numpy"{inline})
def {part}(mem, P, p, lo, hi, idx):
    """{part_doc}"""
    out = P[p + OUT]
    R = P[p + OUT_RANK]
    D = R + P[p + RED_RANK]
    nb = P[p + BLOCK_AXES]
    blk = P[p + BLOCK_SIZE]
    N = p + SIZES  # P[N + d]: size of axis d
    SO = p + {out_strides}  # P[SO + d]: output stride of axis d < R
'''


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the kernel for `pattern`: readable and deterministic."""
    k, sr = pattern.leaves, SEMIRINGS[pattern.semiring]
    terms = " ⊗ ".join(f"leaf{l}[o{', r' if pattern.reduce else ''}]" for l in range(k))
    lines = HEADER.format(
        name=pattern.name, formula=("⊕_r " if pattern.reduce else "") + terms, semiring=sr.name,
        abi=abi.source_constants(), out_strides=abi.OUT_STRIDES_SOURCE,
        dtype=pattern.dtype, then=", then NORMALIZE" if pattern.normalize else "",
        tables="one per leaf" if pattern.reduce else "one for the output, then one per leaf",
        pointers=", ".join(sorted({"pointer_int64", "pointer_" + pattern.dtype})),
        part="run_chunk" if pattern.reduce else "run_rows",
        # called once, by a serial kernel: inlined, one function less to compile (~15%)
        inline="" if pattern.parallel else ', inline="always"',
        part_doc=("Output elements lo..hi-1 (flat, C order)." if pattern.reduce else
                  "Rows lo..hi-1: a row is one position of the odometer axes."),
    ).rstrip("\n").split("\n")
    lines += [f"    L{l} = p + {abi.leaf_source(l)}  # leaf {l}: offset, then strides"
              for l in range(k)]
    lines += ["    top = D - 1 - nb  # odometer axes end here; block axes top..D-2; tight axis D-1",
              "    m = P[N + D - 1]"]
    lines += [f"    s{l} = P[L{l} + D]" for l in range(k)]
    b = [f"b{l}" for l in range(k)]
    leaf_strides = [f"L{l} + 1" for l in range(k)]
    if pattern.reduce:
        lines += [f"    T{l} = P[p + TABLES]{f' + {l} * blk' if l else ''}  # leaf {l}'s offset table" for l in range(k)]
        lines += ["    o_off = out"] + [f"    b{l} = P[L{l}]" for l in range(k)]
        lines += _place("    ", "0", "R - 1", "lo", ["o_off"] + b, ["SO"] + leaf_strides)
        lines += ["    for o in range(lo, hi):"]
        lines += _reduced_value(k, sr, pattern.dtype)
        lines += ["        mem[o_off] = v"]
        lines += _advance("        ", "0", "R - 1", ["o_off"] + b, ["SO"] + leaf_strides)
    else:
        lines += ["    so = P[SO + D - 1]", "    TO = P[p + TABLES]  # output offsets, then each leaf's"]
        lines += [f"    T{l} = TO + {f'{l + 1} * ' if l else ''}blk  # leaf {l}'s offset table" for l in range(k)]
        lines += ["    o_off = out"] + [f"    b{l} = P[L{l}]" for l in range(k)]
        lines += _place("    ", "0", "top - 1", "lo", ["o_off"] + b, ["SO"] + leaf_strides)
        lines += ["    for row in range(lo, hi):",
                  "        for t in range(blk):",
                  "            oo = o_off + P[TO + t]"]
        lines += [f"            c{l} = b{l} + P[T{l} + t]" for l in range(k)]
        lines += ["            for j in range(m):",
                  f"                mem[oo + j * so] = {_product(k, sr, [f'c{l} + j * s{l}' for l in range(k)])}"]
        lines += _advance("        ", "0", "top - 1", ["o_off"] + b, ["SO"] + leaf_strides)

    part = "run_chunk" if pattern.reduce else "run_rows"
    lines += ["", "",
              f"@njit(cache=True, nogil=True, error_model=\"numpy\"{', parallel=True' if pattern.parallel else ''})",
              f"def {ENTRY}(mem_address, mem_length, P_address, P_length, p):",
              '    """Segment p of the table. Called with addresses, not arrays: from Python (loop',
              "    mode) no MemInfo is made per call, and the compiled-mode dispatcher calls the",
              '    compiled code at its C address."""',
              f"    mem = carray(pointer_{pattern.dtype}(mem_address), mem_length)",
              "    P = carray(pointer_int64(P_address), P_length)",
              "    R = P[p + OUT_RANK]",
              "    D = R + P[p + RED_RANK]",
              "    n_out = np.int64(1)  # not the literal 1: see ZERO",
              "    for d in range(R):",
              "        n_out *= P[p + SIZES + d]"]
    if pattern.reduce:
        lines += ["    n_work = n_out  # a chunk is a range of output elements"]
    else:
        lines += ["    n_work = np.int64(1)  # a chunk is a range of rows",
                  "    for d in range(D - 1 - P[p + BLOCK_AXES]):",
                  "        n_work *= P[p + SIZES + d]"]
    lines += ["    scratch = P[p + SCRATCH]", "    chunks = P[p + CHUNKS]"]
    if pattern.parallel:
        lines += ["    for c in prange(chunks):  # fixed chunks: results do not depend on threads",
                  f"        {part}(mem, P, p, n_work * c // chunks, n_work * (c + 1) // chunks, scratch + c * D)"]
    else:
        lines += [f"    {part}(mem, P, p, ZERO, n_work, scratch)"]
    if pattern.normalize:
        lines += ["    out = P[p + OUT]"] + _normalize(sr, k)
    lines += [""]
    return "\n".join(lines)
