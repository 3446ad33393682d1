"""codegen/lines.py: a cache line of elements as one value. Every loader gives the
elements of its access kind, whole or in part (the other lanes 0, and nothing outside the
part read); stores write exactly their lanes; the ⊗ operators are the scalar ones, lane by
lane, to the bit."""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from numba import njit

from catbp_jit import abi
from catbp_jit.codegen.intrinsics import HARDWARE_GATHERS, LINE_BYTES
from catbp_jit.codegen.lines import (
    line_gather,
    line_gather_part,
    line_load,
    line_load_part,
    line_splat,
    line_splat_part,
    line_strided,
    line_strided_part,
    store_line_part,
    stream_line,
)

DTYPES = [np.float64, np.float32, np.int64, np.bool_]


def width(dtype) -> int:
    return LINE_BYTES // np.dtype(dtype).itemsize


@njit(cache=False)
def loads(out, arr, i, step, table, t):
    """The four loaders' whole lines, one after another in out (4 lines)."""
    w = out.size // 4
    store_line_part(out, 0, line_splat(arr, i), 0, w)
    store_line_part(out, w, line_load(arr, i), 0, w)
    store_line_part(out, 2 * w, line_strided(arr, i, step), 0, w)
    store_line_part(out, 3 * w, line_gather(arr, i, table, t, 0), 0, w)


@njit(cache=False)
def part_loads(out, arr, i, step, table, t, lo, hi):
    """The four loaders' lanes lo..hi-1 (the others 0), whole lines in out (4 lines)."""
    w = out.size // 4
    store_line_part(out, 0, line_splat_part(arr, i, lo, hi), 0, w)
    store_line_part(out, w, line_load_part(arr, i, lo, hi), 0, w)
    store_line_part(out, 2 * w, line_strided_part(arr, i, step, lo, hi), 0, w)
    store_line_part(out, 3 * w, line_gather_part(arr, i, table, t, 0, lo, hi), 0, w)


def values(dtype, n: int, rng) -> np.ndarray:
    if dtype is np.bool_:
        return rng.random(n) < 0.5
    return (rng.uniform(1, 9, n) * 1000).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_each_loader_gives_its_access_kinds_elements(dtype):
    rng = np.random.default_rng(1)
    w = width(dtype)
    arr = values(dtype, 40 * w, rng)
    table = rng.integers(0, 20 * w, 3 * w)
    for i, step, t in ((0, 1, 0), (5, 3, 2), (w + 1, 2, w)):
        out = np.zeros(4 * w, dtype)
        loads(out, arr, i, step, table, t)
        want = np.concatenate(
            [np.full(w, arr[i]), arr[i : i + w], arr[i + step * np.arange(w)], arr[i + table[t : t + w]]]
        )
        assert np.array_equal(out, want), (i, step, t)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_part_of_a_line_reads_its_lanes_only(dtype):
    """Lanes outside lo..hi are 0, and a gather never reads them: their table entries
    point far outside memory (a read would fault)."""
    rng = np.random.default_rng(2)
    w = width(dtype)
    arr = values(dtype, 8 * w, rng)
    far = 1 << 40
    for lo in range(w):
        for hi in range(lo, w + 1):
            inside = np.arange(w)[lo:hi]
            table = np.full(2 * w, far, np.int64)
            table[w + inside] = rng.integers(0, 2 * w, inside.size)
            out = np.ones(4 * w, dtype)
            i = 2 * w
            part_loads(out, arr, i - lo, 1, table, w, lo, hi)
            want = np.zeros(4 * w, dtype)
            want[inside] = arr[i - lo]
            want[w + inside] = arr[i - lo + inside]
            want[2 * w + inside] = arr[i - lo + inside]
            want[3 * w + inside] = arr[i - lo + table[w + inside]]
            assert np.array_equal(out, want), (lo, hi)


@njit(cache=False)
def stream(out, at, arr, i):
    stream_line(out, at, line_load(arr, i))


@njit(cache=False)
def store_part(out, at, arr, i, lo, hi):
    store_line_part(out, at, line_load(arr, i), lo, hi)


def aligned_zeros(n: int, dtype) -> np.ndarray:
    """n zeros starting a cache line."""
    space = np.zeros(n + width(dtype), dtype)
    return space[(-space.ctypes.data % LINE_BYTES) // space.itemsize :][:n]


@pytest.mark.parametrize("dtype", DTYPES)
def test_stores_write_exactly_their_lanes(dtype):
    rng = np.random.default_rng(3)
    w = width(dtype)
    arr = values(dtype, 4 * w, rng)
    for at in (0, w, 2 * w):
        dst = aligned_zeros(4 * w, dtype)  # (a streaming store's line must be aligned)
        stream(dst, at, arr, 3)
        want = np.zeros_like(dst)
        want[at : at + w] = arr[3 : 3 + w]
        assert np.array_equal(dst, want), at
    for lo in range(w):
        for hi in range(lo, w + 1):
            dst = aligned_zeros(4 * w, dtype)
            store_part(dst, w, arr, 1, lo, hi)
            want = np.zeros_like(dst)
            want[w + lo : w + hi] = arr[1 + lo : 1 + hi]
            assert np.array_equal(dst, want), (lo, hi)


@njit(cache=False)
def combine(out, a, b):
    w = out.size // 3
    store_line_part(out, 0, line_load(a, 0) * line_load(b, 0), 0, w)
    store_line_part(out, w, line_load(a, 0) + line_load(b, 0), 0, w)
    store_line_part(out, 2 * w, line_load(a, 0) & line_load(b, 0), 0, w)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_operators_are_the_scalar_ones_lane_by_lane(dtype):
    """`*` and `+` round as numpy's (IEEE, the same bits), int64 wraps around; `&` on
    bools is `and`."""
    rng = np.random.default_rng(4)
    w = width(dtype)
    if dtype is np.int64:
        a, b = rng.integers(-(2**62), 2**62, w), rng.integers(-(2**62), 2**62, w)
    else:
        a, b = (rng.standard_normal(w) * 1e3).astype(dtype), (rng.standard_normal(w) * 1e-3).astype(dtype)
        a[:3] = [np.inf, -np.inf, 0.0]
    out = np.zeros(3 * w, dtype)
    if dtype is np.int64:
        combine(out, a, b)
        with np.errstate(over="ignore"):
            assert np.array_equal(out[:w], a * b) and np.array_equal(out[w : 2 * w], a + b)
        assert np.array_equal(out[2 * w :], a & b)
        return
    combine_floats(out[: 2 * w], a, b)
    with np.errstate(invalid="ignore"):
        want = np.concatenate([a * b, a + b])
    assert np.array_equal(out[: 2 * w].view(f"u{out.itemsize}"), want.view(f"u{out.itemsize}"))


@njit(cache=False)
def combine_floats(out, a, b):
    w = out.size // 2
    store_line_part(out, 0, line_load(a, 0) * line_load(b, 0), 0, w)
    store_line_part(out, w, line_load(a, 0) + line_load(b, 0), 0, w)


@njit(cache=False)
def both(out, a, b):
    store_line_part(out, 0, line_load(a, 0) & line_load(b, 0), 0, out.size)


def test_and_of_bool_lines_is_and():
    rng = np.random.default_rng(5)
    w = width(np.bool_)
    a, b = rng.random(w) < 0.5, rng.random(w) < 0.5
    out = np.zeros(w, np.bool_)
    both(out, a, b)
    assert np.array_equal(out, a & b)


def before_a_guard_page(arr: np.ndarray) -> np.ndarray:
    """A copy of arr ending where a page no process may read begins: a read past its end
    faults. (The mapping is kept alive by the array.)"""
    page = mmap.PAGESIZE
    space = mmap.mmap(-1, 2 * page)
    at = ctypes.addressof(ctypes.c_char.from_buffer(space))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(at + page, page, 0) == 0, os.strerror(ctypes.get_errno())  # (PROT_NONE)
    guarded = np.frombuffer(space, arr.dtype, count=arr.size, offset=page - arr.nbytes)
    guarded[...] = arr
    return guarded


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_gathered_line_within_a_window_reads_the_same_elements(dtype):
    """A GATHERED line whose entries all lie within W elements from its lane 0's is one
    load and a permute where the machine has AVX-512; every other line (lane 0's entry
    not the least, entries W or more apart, a window past the array's end) is gathered.
    Either way the line holds arr[i + table[t + w]], and nothing past the array is read:
    the array ends where a window from the last lanes' entries would read past it."""
    rng = np.random.default_rng(3)
    w = width(dtype)
    arr = before_a_guard_page(values(dtype, 6 * w, rng))
    window = rng.integers(0, w, w)
    window[0] = 0
    lines = {
        "window": 2 * w + window,
        "lane 0 not the least": 2 * w + np.concatenate([[1, 0], window[2:]]),
        "too wide": 2 * w + window * 2,
        "broadcast": np.full(w, 3 * w),
        "at the end": arr.size - w + window,
        "past the end": np.concatenate([[arr.size - w + 1], np.full(w - 1, arr.size - 1)]),
    }
    for name, line in lines.items():
        table = np.concatenate([rng.integers(0, w, w), line]).astype(np.int64)
        out = np.zeros(4 * w, dtype)
        loads(out, arr, 0, 1, table, w)
        assert np.array_equal(out[3 * w :], arr[line]), name
        out = np.zeros(4 * w, dtype)
        loads(out, arr[w:], -w, 1, table, w)  # (the same elements from another base)
        assert np.array_equal(out[3 * w :], arr[line]), name


@njit(cache=False)
def windowed_loads(out, arr, i, table, lo, hi):
    """A WINDOWED table's lines through line_gather, whole, then lanes lo..hi-1 of each."""
    w = 8
    n = table.size // w
    for k in range(n):
        store_line_part(out, k * w, line_gather(arr, i, table, k * w, abi.WINDOWED), 0, w)
        x = line_gather_part(arr, i, table, k * w, abi.WINDOWED, lo, hi)
        store_line_part(out, (n + k) * w, x, 0, w)


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_a_windowed_tables_lines_are_its_offsets_elements(dtype):
    """A GATHERED table of step WINDOWED (abi.windowed_table: a window word at each line's
    start) gives the lines its offsets name, whole and in part (the other lanes 0), with a
    load of each window and a permute (a scalar load a lane without AVX-512). A window
    ends where the array does: nothing past it is read (the plan keeps every window in the
    buffer)."""
    rng = np.random.default_rng(6)
    w = 8
    arr = before_a_guard_page(values(dtype, 20 * w, rng))
    lines = [
        rng.permutation(w),  # a permute
        np.zeros(w, np.int64) + 5,  # one element: a broadcast
        np.repeat(np.arange(4), 2),  # each element twice
        np.tile(np.arange(4), 2),  # a half line twice
        np.array([7, 0, 7, 0, 3, 3, 1, 6]),  # lane 0 not the least
    ]
    offsets = np.concatenate([3 * w * k + line for k, line in enumerate(lines)])
    # a window that ends the array: the plan's highest element of a windowed leaf
    offsets = np.concatenate([offsets, np.full(w, arr.size - w)])
    words = abi.window_words([int(x) for x in offsets])
    assert words is not None and len(words) == offsets.size // w
    table = np.array(abi.windowed_table([int(x) for x in offsets], words), np.int64)
    assert abi.table_offsets([int(x) for x in table], abi.WINDOWED) == tuple(int(x) for x in offsets)
    for lo, hi in ((0, w), (0, 3), (2, 7), (5, 5)):
        out = np.full(2 * offsets.size, 7, dtype)
        windowed_loads(out, arr, 0, table, lo, hi)
        part = np.zeros((offsets.size // w, w), dtype)
        part[:, lo:hi] = arr[offsets].reshape(-1, w)[:, lo:hi]
        assert np.array_equal(out, np.concatenate([arr[offsets], part.ravel()])), (lo, hi)


def test_window_words_only_where_every_line_lies_in_a_window():
    """abi.window_words: a line's lowest offset and each lane's place from it (3 bits), a
    word a line of 8 (the last one may be a part); None where a line spans 8 elements or
    more, or holds a negative offset."""
    w = abi.W_WINDOW
    words = abi.window_words([3, 4, 3, 4, 10, 9, 8, 8, 40, 41])
    assert words is not None
    lanes = [0, 1, 0, 1, 7, 6, 5, 5]
    first = (3 << abi.WINDOW_SHIFT) | sum(x << (3 * k) for k, x in enumerate(lanes))
    assert words == (first, (40 << abi.WINDOW_SHIFT) | (1 << 3))
    offsets = (3, 4, 3, 4, 10, 9, 8, 8, 40, 41)
    assert abi.table_offsets(abi.windowed_table(offsets, words), abi.WINDOWED) == offsets
    assert abi.window_words([0] * (w - 1) + [w]) is None  # (9 elements apart: no window)
    assert abi.window_words([1, -1] + [0] * (w - 2)) is None


def test_a_window_is_a_permute_where_the_machine_has_gathers():
    """HARDWARE_GATHERS (AVX-512): a float64 GATHERED line is a vpermpd (or vpermq) of a
    whole line (zmm registers), beside the gather it falls back to; elsewhere no such
    permute (LLVM may permute narrower vectors for other reasons)."""
    w = width(np.float64)
    loads(np.zeros(4 * w), np.ones(4 * w), 0, 1, np.zeros(w, np.int64), 0)
    code = "\n".join(loads.inspect_asm().values())
    assert bool(re.search(r"^\s+vperm(pd|q)\s[^\n]*zmm", code, re.M)) == HARDWARE_GATHERS


def test_gathers_are_one_instruction_only_where_the_machine_has_them():
    """HARDWARE_GATHERS: a STRIDED or GATHERED line is one gather instruction, else a
    scalar load a lane (no gather instruction at all in the code)."""
    w = width(np.float64)
    loads(np.zeros(4 * w), np.ones(4 * w), 0, 1, np.zeros(w, np.int64), 0)  # (compiled for float64)
    code = "\n".join(loads.inspect_asm().values())
    assert bool(re.search(r"^\s+v\w*gather", code, re.M)) == HARDWARE_GATHERS  # vgatherqpd, ...


@pytest.mark.slow  # (~6 s: this file's kernels compiled again for another core)
@pytest.mark.skipif(not HARDWARE_GATHERS, reason="this machine's own run above loads lane by lane")
def test_loaders_lane_by_lane_on_a_machine_without_gathers():
    """This file's tests again, compiled for an AVX2 core (Haswell): the loads a lane at a
    time that machines without gather instructions run."""
    env = {**os.environ, "NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""}
    check = "from catbp_jit.codegen.intrinsics import HARDWARE_GATHERS as H; assert not H"
    tests = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", __file__]
    for args in (["-c", check], [*tests, "-k", "not machine_without_gathers"]):
        done = subprocess.run(
            [sys.executable, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=Path(__file__).parent.parent,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
