"""Numba source for the one kernel template, `contract_reduce`, on the CPU.

A kernel computes one segment (see plan/fusion.py):

    out[o] = ⊕_r  leaf_0[o, r] ⊗ leaf_1[o, r] ⊗ ... ⊗ leaf_{k-1}[o, r]

It is specialized on its pattern only: semiring, dtype, number of leaves k, whether it
reduces, normalizes, runs in parallel. Ranks, sizes, strides and offsets are runtime data
read from the int64 table P (layout in plan/schedule.py), so one kernel serves every
segment of its pattern. Loops over any number of axes run as an odometer whose counters
live in the segment's scratch area of P; the innermost reduced axis is a tight loop.

Every output element is computed by the same sequential code whatever the chunking or the
thread count, so results are bit-identical across runs and NUMBA_NUM_THREADS. float32
sums accumulate in float64. LOGPROB reduces with a max-shifted logsumexp in two passes
(-inf for an all -inf sum; NaN propagates), SAT stops at the first true term, COUNT wraps
around like numpy's int64.
"""

from __future__ import annotations

from typing import List

from ..plan.schedule import KernelPattern

ENTRY = "kernel"


def _leaves(k: int) -> range:
    return range(k)


def _product(k: int, semiring: str, offsets: List[str]) -> str:
    """The ⊗-product of the k leaves at the given offsets, left to right as written."""
    terms = [f"mem[{off}]" for off in offsets[:k]]
    if semiring == "SAT":
        return " and ".join(terms)
    op = " + " if semiring == "LOGPROB" else " * "
    return op.join(terms)


def _advance(indent: str, first: str, last: str, names: List[str], strides: List[str],
             out_name: str = "", out_stride: str = "") -> List[str]:
    """Odometer step over axes last..first (last fastest); `d < first` after a full wrap."""
    pad = indent + "    "
    lines = [f"{indent}d = {last}", f"{indent}while d >= {first}:",
             f"{pad}P[idx + d] += 1"]
    moves = [f"{n} += P[{s} + d]" for n, s in zip(names, strides)]
    backs = [f"{n} -= P[{s} + d] * P[N + d]" for n, s in zip(names, strides)]
    if out_name:
        moves.insert(0, f"{out_name} += P[{out_stride} + d]")
        backs.insert(0, f"{out_name} -= P[{out_stride} + d] * P[N + d]")
    lines += [pad + m for m in moves]
    lines += [f"{pad}if P[idx + d] < P[N + d]:", f"{pad}    break"]
    lines += [pad + b for b in backs]
    lines += [f"{pad}P[idx + d] = 0", f"{pad}d -= 1"]
    return lines


def _reduce_pass(indent: str, k: int, body: List[str], stop_on_true: bool = False) -> List[str]:
    """One sweep over the reduced axes: innermost axis D-1 tight, the others an odometer."""
    pad = indent + "    "
    r = [f"r{l}" for l in _leaves(k)]
    lines = [f"{indent}for d in range(R, D - 1):", f"{indent}    P[idx + d] = 0"]
    lines += [f"{indent}r{l} = b{l}" for l in _leaves(k)]
    lines += [f"{indent}while True:", f"{pad}for j in range(m):"]
    lines += [pad + "    " + b for b in body]
    if stop_on_true:
        lines += [f"{pad}if acc:", f"{pad}    break"]
    lines += _advance(pad, "R", "D - 2", r, [f"L{l} + 1" for l in _leaves(k)])
    lines += [f"{pad}if d < R:", f"{pad}    break"]
    return lines


def _reduce_value(k: int, semiring: str, dtype: str) -> List[str]:
    """Lines that leave the reduced value of the current output element in `v`."""
    at = [f"r{l} + j * t{l}" for l in _leaves(k)]
    x = _product(k, semiring, at)
    i = "        "
    lines = [f"{i}m = P[N + D - 1]"] + [f"{i}t{l} = P[L{l} + D]" for l in _leaves(k)]
    if semiring == "LOGPROB":
        lines += [f"{i}top = -np.inf  # pass 1: the largest term (NaN sticks)"]
        lines += _reduce_pass(i, k, [f"x = {x}", "if x > top or x != x:", "    top = x"])
        lines += [f"{i}if top == -np.inf:", f"{i}    v = top",
                  f"{i}else:", f"{i}    acc = 0.0  # pass 2: sum of exp(x - top)"]
        lines += _reduce_pass(i + "    ", k, [f"x = {x}", "acc += math.exp(x - top)"])
        lines += [f"{i}    v = top + math.log(acc)"]
    elif semiring == "SAT":
        lines += [f"{i}acc = False"]
        lines += _reduce_pass(i, k, [f"if {x}:", "    acc = True", "    break"], stop_on_true=True)
        lines += [f"{i}v = acc"]
    else:  # PROB sums in float64 (float32 too); COUNT in int64, wrapping
        zero = "0" if semiring == "COUNT" else "0.0"
        lines += [f"{i}acc = {zero}"]
        lines += _reduce_pass(i, k, [f"acc += {x}"])
        lines += [f"{i}v = acc"]
    return lines


def _normalize(semiring: str) -> List[str]:
    i = "    "
    if semiring == "PROB":
        return [f"{i}total = 0.0",
                f"{i}for o in range(n_out):", f"{i}    total += mem[out + o]",
                f"{i}if total != 0.0:",
                f"{i}    for o in range(n_out):", f"{i}        mem[out + o] = mem[out + o] / total"]
    if semiring == "LOGPROB":
        return [f"{i}top = -np.inf",
                f"{i}for o in range(n_out):",
                f"{i}    if mem[out + o] > top or mem[out + o] != mem[out + o]:",
                f"{i}        top = mem[out + o]",
                f"{i}z = top",
                f"{i}if top != -np.inf:",
                f"{i}    acc = 0.0",
                f"{i}    for o in range(n_out):", f"{i}        acc += math.exp(mem[out + o] - top)",
                f"{i}    z = top + math.log(acc)",
                f"{i}for o in range(n_out):", f"{i}    mem[out + o] = mem[out + o] - z"]
    return []  # SAT and COUNT do not normalize


def kernel_source(pattern: KernelPattern) -> str:
    """The whole module source of the kernel for `pattern`: readable, deterministic."""
    k, sr = pattern.leaves, pattern.semiring
    b = [f"b{l}" for l in _leaves(k)]
    leaf_pos = [f"L{l} = {'SO + R' if l == 0 else f'L{l - 1} + 1 + D'}" for l in _leaves(k)]
    head = f'''"""catbp_jit kernel {pattern.name}

out[o] = {'⊕_r ' if pattern.reduce else ''}{' ⊗ '.join(f'leaf{l}[o{", r" if pattern.reduce else ""}]' for l in _leaves(k))}   ({sr}, {pattern.dtype}{', then NORMALIZE' if pattern.normalize else ''})

Parameters at P[p:]: out offset, R (output axes), Q (reduced axes), scratch offset,
chunks, then sizes n[0..D-1], output strides so[0..R-1], and per leaf its offset and
strides over all D = R + Q axes. Offsets and strides count elements of `mem`.
"""
import math

import numpy as np
from numba import carray, njit, prange

from catbp_jit.codegen.intrinsics import {", ".join(sorted({"pointer_int64", "pointer_" + pattern.dtype}))}


@njit(cache=True, nogil=True, error_model="numpy")
def run_chunk(mem, P, p, lo, hi, idx):
    """Output elements lo..hi-1 (flat, C order); P[idx:idx+D] holds the loop counters."""
    out = P[p]
    R = P[p + 1]
    Q = P[p + 2]
    D = R + Q
    N = p + 5  # P[N + d]: size of axis d
    SO = N + D  # P[SO + d]: output stride of axis d < R
'''
    lines = head.rstrip("\n").split("\n")
    lines += [f"    {s}  # P[L{l}]: leaf {l} offset; P[L{l} + 1 + d]: its stride on axis d"
              for l, s in enumerate(leaf_pos)]
    lines += ["    # place the output odometer on element lo",
              "    rem = lo",
              "    o_off = out"]
    lines += [f"    b{l} = P[L{l}]" for l in _leaves(k)]
    lines += ["    for d in range(R - 1, -1, -1):",
              "        i = rem % P[N + d]",
              "        rem //= P[N + d]",
              "        P[idx + d] = i",
              "        o_off += i * P[SO + d]"]
    lines += [f"        b{l} += i * P[L{l} + 1 + d]" for l in _leaves(k)]
    lines += ["    for o in range(lo, hi):"]
    if pattern.reduce:
        lines += _reduce_value(k, sr, pattern.dtype)
    else:
        lines += [f"        v = {_product(k, sr, b)}"]
    lines += ["        mem[o_off] = v",
              "        # next output element"]
    lines += _advance("        ", "0", "R - 1", b, [f"L{l} + 1" for l in _leaves(k)], "o_off", "SO")
    lines += ["", "",
              f"@njit(cache=True, nogil=True, error_model=\"numpy\"{', parallel=True' if pattern.parallel else ''})",
              "def kernel(mem, P, p):",
              "    R = P[p + 1]",
              "    D = R + P[p + 2]",
              "    n_out = 1",
              "    for d in range(R):",
              "        n_out *= P[p + 5 + d]",
              "    scratch = P[p + 3]",
              "    chunks = P[p + 4]"]
    if pattern.parallel:
        lines += ["    for c in prange(chunks):  # fixed chunks: the result does not depend on threads",
                  "        run_chunk(mem, P, p, n_out * c // chunks, n_out * (c + 1) // chunks, scratch + c * D)"]
    else:
        lines += ["    run_chunk(mem, P, p, 0, n_out, scratch)"]
    if pattern.normalize:
        lines += ["    out = P[p]"] + _normalize(sr)
    lines += ["", "",
              "@njit(cache=True, nogil=True)",
              "def kernel_at(mem_address, mem_length, P_address, P_length, p):",
              '    """The same kernel called with addresses: loop mode passes no arrays (no MemInfo)."""',
              f"    mem = carray(pointer_{pattern.dtype}(mem_address), mem_length)",
              "    P = carray(pointer_int64(P_address), P_length)",
              "    kernel(mem, P, p)",
              ""]
    return "\n".join(lines)


NUMBA_TYPES = {"float64": "float64", "float32": "float32", "bool": "boolean", "int64": "int64"}
