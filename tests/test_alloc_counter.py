"""Tests for catbp_jit.testing.alloc_counter: exact numpy and Numba NRT allocation counts."""

import gc
import threading

import numpy as np
import pytest
from numba import njit

from catbp_jit.testing.alloc_counter import (
    NrtAllocCounter,
    NumpyAllocCounter,
    enable_nrt_stats,
    nrt_allocation_stats,
    nrt_stats_enabled,
    numpy_handler_name,
)


def handler_name() -> str:
    # Ask numpy directly, not through the module under test.
    return np._core.multiarray.get_handler_name()


ORIGINAL_HANDLER = handler_name()


def count_numpy(fn) -> NumpyAllocCounter:
    fn()  # warm up: first calls may create caches, interned objects, ...
    with NumpyAllocCounter() as c:
        fn()
    return c


# ---------------------------------------------------------------------------
# numpy data buffers
# ---------------------------------------------------------------------------


def test_handler_installed_only_inside():
    assert handler_name() == ORIGINAL_HANDLER
    with NumpyAllocCounter():
        assert handler_name() == "catbp_alloc_counter"
        assert numpy_handler_name() == "catbp_alloc_counter"
    assert handler_name() == ORIGINAL_HANDLER


def test_empty_counts():
    with NumpyAllocCounter() as c:
        a = np.empty(1000)
    assert c.allocations >= 1
    assert c.bytes >= 8000
    assert c.frees == 0  # a still alive
    del a


def test_zeros_uses_calloc_and_counts():
    with NumpyAllocCounter() as c:
        z = np.zeros(500)
    assert c.allocations == 1
    assert c.bytes == 4000
    assert not z.any()  # calloc forwarded correctly: memory is zeroed


def test_transient_allocations_counted():
    # A buffer allocated and freed inside the block: tracemalloc snapshots
    # would miss it, the handler does not.
    def f():
        np.empty(1000)

    c = count_numpy(f)
    assert c.allocations == 1
    assert c.frees == 1


@pytest.mark.parametrize(
    "label, op",
    [
        ("slice view", lambda a, b: a[::2]),
        ("reshape view", lambda a, b: a.reshape(10, 100)),
        ("copyto same dtype", lambda a, b: np.copyto(a, b)),
        ("in-place array += array", lambda a, b: a.__iadd__(b)),
        ("ufunc out=", lambda a, b: np.multiply(a, b, out=a)),
        ("fill", lambda a, b: a.fill(0.5)),
        ("item assignment", lambda a, b: a.__setitem__(3, 1.0)),
    ],
)
def test_no_allocation_ops(label, op):
    a = np.ones(1000)
    b = np.ones(1000)
    c = count_numpy(lambda: op(a, b))
    assert c.allocations == 0, label
    assert c.bytes == 0, label


def test_inplace_with_python_scalar_allocates_0d_buffers():
    # The brief expected `a += 1` to be free; it is not on numpy 2.4: the
    # Python scalar becomes a 0-d array (one item-sized buffer) and, for an int
    # onto float64, a second one for the cast.  Worth knowing for "allocates
    # nothing" code: use arrays (or fill / a[i] = x) instead of scalar operands.
    a = np.ones(1000)
    c = count_numpy(lambda: a.__iadd__(1))
    assert c.allocations >= 1
    assert c.bytes == 8 * c.allocations  # only one-item (0-d) buffers
    assert c.frees == c.allocations  # all transient


def test_binary_op_allocates():
    a = np.ones(1000)
    c = count_numpy(lambda: a + 1)
    assert c.allocations >= 1
    assert c.bytes >= 8000


def test_not_counted_after_exit():
    with NumpyAllocCounter() as c:
        np.empty(10)
    n = c.allocations
    x = np.empty(1000)  # outside: not counted
    assert c.allocations == n
    assert handler_name() == ORIGINAL_HANDLER
    del x


def test_array_allocated_inside_freed_outside():
    # The array keeps our handler and frees through it after the block: must
    # not crash and must not count.
    with NumpyAllocCounter() as c:
        a = np.arange(100.0)
    frees = c.frees
    del a
    gc.collect()
    assert c.frees == frees
    b = np.arange(100.0)  # default allocator works as usual afterwards
    assert b.sum() == 4950.0


def test_realloc_path():
    # ndarray.resize grows the buffer through the realloc of the handler the
    # array was *created* with (numpy stores it on the array).
    with NumpyAllocCounter() as c:
        a = np.zeros(10)
        a.resize(100_000, refcheck=False)
    assert c.allocations == 1
    assert c.reallocs == 1
    assert c.bytes == 80 + 800_000
    assert a[:10].sum() == 0.0

    # Consequence: growing an array made before the block goes through numpy's
    # default handler and is NOT seen.  Create the arrays you resize inside.
    b = np.zeros(10)
    with NumpyAllocCounter() as c2:
        b.resize(100_000, refcheck=False)
    assert (c2.allocations, c2.reallocs) == (0, 0)


def test_exception_restores_handler():
    with pytest.raises(ZeroDivisionError):
        with NumpyAllocCounter():
            np.empty(10)
            raise ZeroDivisionError("raised inside the block")
    assert handler_name() == ORIGINAL_HANDLER
    with NumpyAllocCounter() as c:
        pass
    assert c.allocations == 0


def test_nested_counters():
    with NumpyAllocCounter() as outer:
        np.empty(10)
        with NumpyAllocCounter() as inner:
            np.empty(20)
            assert handler_name() == "catbp_alloc_counter"
        assert handler_name() == "catbp_alloc_counter"  # outer still installed
        np.empty(30)
    assert handler_name() == ORIGINAL_HANDLER
    assert inner.allocations == 1 and inner.bytes == 160
    assert outer.allocations == 3 and outer.bytes == 80 + 160 + 240


def test_reentering_same_counter_does_not_double_count():
    c = NumpyAllocCounter()
    with c:
        with c:
            np.empty(10)
        assert handler_name() == "catbp_alloc_counter"
    assert handler_name() == ORIGINAL_HANDLER
    assert c.allocations == 1


def test_repeated_use_accumulates_and_reset():
    c = NumpyAllocCounter()
    for _ in range(3):
        with c:
            np.empty(10)
    assert c.allocations == 3
    c.reset()
    assert (c.allocations, c.frees, c.bytes, c.reallocs) == (0, 0, 0, 0)
    with c:
        np.empty(10)
    assert c.allocations == 1


def test_other_threads_not_counted():
    # numpy's handler lives in a contextvar: a new thread has its own context
    # and keeps the default allocator.
    seen = {}

    def worker():
        seen["handler"] = handler_name()
        np.empty(1000)

    with NumpyAllocCounter() as c:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen["handler"] == ORIGINAL_HANDLER
    assert c.allocations == 0


def test_counter_in_thread_counts_only_that_thread():
    results = {}

    def worker():
        with NumpyAllocCounter() as c:
            np.empty(10)
            np.empty(10)
        results["c"] = c.allocations

    with NumpyAllocCounter() as main:
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert results["c"] == 2
    assert main.allocations == 0


# ---------------------------------------------------------------------------
# Numba NRT
# ---------------------------------------------------------------------------


@njit
def _int_fn(x):
    return x * 2 + 1


@njit
def _alloc_fn(n):
    a = np.empty(n)
    a[0] = 1.0
    return a[0]


@njit
def _array_fn(a):
    return a[0]


@njit
def _two_array_fn(a, b):
    return a[0] + b[0]


@pytest.fixture
def nrt_stats():
    enable_nrt_stats()
    assert nrt_stats_enabled()


def count_nrt(fn, calls=1) -> NrtAllocCounter:
    fn()  # compile outside the block
    with NrtAllocCounter() as c:
        for _ in range(calls):
            fn()
    return c


def test_nrt_raises_when_disabled():
    from numba.core.runtime import _nrt_python

    was = nrt_stats_enabled()
    _nrt_python.memsys_disable_stats()
    try:
        with pytest.raises(RuntimeError, match="NUMBA_NRT_STATS=1"):
            with NrtAllocCounter():
                pass
        with NrtAllocCounter(enable=True):  # opt-in switches them on instead
            pass
        assert nrt_stats_enabled()
    finally:
        if was:
            enable_nrt_stats()


def test_nrt_stats_shape(nrt_stats):
    s = nrt_allocation_stats()
    assert s._fields == ("alloc", "free", "mi_alloc", "mi_free")


def test_nrt_empty_inside_njit(nrt_stats):
    c = count_nrt(lambda: _alloc_fn(10), calls=5)
    # np.empty: one NRT block holding MemInfo + data -> alloc 1, mi_alloc 1.
    assert c.allocations >= 5
    assert c.raw_allocs == 5 and c.meminfo_allocs == 5
    assert c.frees == c.allocations  # all released again


def test_nrt_int_function_costs_nothing(nrt_stats):
    c = count_nrt(lambda: _int_fn(3), calls=10)
    assert c.allocations == 0
    assert c.frees == 0


def test_nrt_array_argument_costs_one_meminfo(nrt_stats):
    a = np.ones(10)
    c = count_nrt(lambda: _array_fn(a))
    # Unboxing an ndarray argument wraps its buffer in a fresh NRT MemInfo
    # (NRT_meminfo_new_from_pyobject -> NRT_MemInfo_new): NRT_Allocate of the
    # MemInfo struct (alloc +1) plus its initialisation (mi_alloc +1).  So one
    # MemInfo per array argument per call = 2 in allocations; released when the
    # call returns.  No numpy buffer is allocated.
    assert (c.raw_allocs, c.meminfo_allocs, c.allocations, c.frees) == (1, 1, 2, 2)

    c10 = count_nrt(lambda: _array_fn(a), calls=10)
    assert c10.allocations == 20  # constant per call

    strided = count_nrt(lambda: _array_fn(a[::2]))
    assert strided.allocations == 2

    two = count_nrt(lambda: _two_array_fn(a, a))
    assert two.meminfo_allocs == 2 and two.allocations == 4  # one MemInfo each

    with NumpyAllocCounter() as npc:
        _array_fn(a)
    assert npc.allocations == 0


def test_nrt_counter_reset_and_current(nrt_stats):
    _alloc_fn(4)
    with NrtAllocCounter() as c:
        _alloc_fn(4)
        assert c.current() == 2
        c.reset()
        assert c.current() == 0
        _alloc_fn(4)
    assert c.allocations == 2
