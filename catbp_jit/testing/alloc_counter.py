"""Exact allocation counters, used to prove that ``Session.run()`` allocates nothing.

Two independent counters:

``NumpyAllocCounter``
    Counts every numpy *data buffer* allocation (the memory behind
    ``ndarray.data``; not the small ``PyArrayObject`` header, which comes from the
    Python object allocator).  It installs a custom NEP 49 memory handler
    (``PyDataMem_SetHandler``) whose malloc/calloc/realloc/free forward to libc
    and bump counters.  Because every data allocation goes through the handler,
    transient buffers that are freed again before the block ends are counted
    too -- unlike tracemalloc snapshots, which only see what is still alive.

``NrtAllocCounter``
    Counts Numba NRT allocations (``NRT_Allocate`` and ``MemInfo`` creation)
    from numba's own runtime statistics, as deltas of
    ``rtsys.get_allocation_stats()``.

Mechanism chosen for numpy: **ctypes, no compiler.**  The numpy C-API is a
table of pointers exported in the ``_ARRAY_API`` capsule of
``numpy._core._multiarray_umath`` (capsule name NULL); ``PyDataMem_SetHandler``
and ``PyDataMem_GetHandler`` are entries 304 and 305 (see
``numpy/__multiarray_api.h``; the table is ABI-stable since numpy 1.22).  The
allocator functions are ``ctypes.CFUNCTYPE`` callbacks.  We chose ctypes because
it needs no C toolchain at test time, and every piece is checked at first use
(capsule names, handler round trip) so a layout mismatch fails loudly instead
of corrupting memory.

Properties worth knowing
------------------------
* **Per-context.**  numpy keeps the current handler in a ``contextvars``
  variable, so the handler (and therefore counting) applies only to code
  running in the *same thread and context* as the ``with`` block.  New threads
  start with a fresh context in CPython <= 3.13 and keep using numpy's default
  allocator; their allocations are NOT counted.  The list of active counters is
  kept in a ContextVar as well, so two threads counting at once do not see each
  other's allocations.
* **Frees and reallocs follow the array.**  numpy frees (and resizes) a buffer
  through the handler stored on the array that owns it, i.e. the one current
  when the array was created: growing an array created before the block is
  not seen, free of an array created before the block is not seen either.  An
  array allocated inside the block and freed after it still calls our free
  callback (it then counts nothing), which is why the handler struct and
  callbacks are created once per process and kept alive forever (they are
  deliberately leaked).
* **GIL.**  ctypes callbacks wrap the call in ``PyGILState_Ensure`` /
  ``PyGILState_Release``, so they are safe even when numpy allocates or frees
  with the GIL released: the callback simply acquires it.  The counters are
  plain Python ints updated under the GIL.
* **Overhead.**  Each data allocation costs one Python call while counting is
  installed; fine for tests, not for benchmarks.
"""

from __future__ import annotations

import contextvars
import ctypes
import ctypes.util
import threading
from typing import Any, Protocol, cast

__all__ = [
    "NumpyAllocCounter",
    "NrtAllocCounter",
    "enable_nrt_stats",
    "nrt_stats_enabled",
    "nrt_allocation_stats",
    "numpy_handler_name",
]

# ---------------------------------------------------------------------------
# numpy: NEP 49 memory handler built from ctypes
# ---------------------------------------------------------------------------

# Indices into the numpy C-API table (numpy/__multiarray_api.h):
#   #define PyDataMem_SetHandler (*(PyObject * (*)(PyObject *)) PyArray_API[304])
#   #define PyDataMem_GetHandler (*(PyObject * (*)(void))       PyArray_API[305])
_API_SET_HANDLER = 304
_API_GET_HANDLER = 305

# numpy only accepts handler capsules with this name (MEM_HANDLER_CAPSULE_NAME).
_CAPSULE_NAME = b"mem_handler"
_HANDLER_NAME = b"catbp_alloc_counter"

# Signatures from numpy/ndarraytypes.h, struct PyDataMemAllocator:
#   void* (*malloc)  (void *ctx, size_t size);
#   void* (*calloc)  (void *ctx, size_t nelem, size_t elsize);
#   void* (*realloc) (void *ctx, void *ptr, size_t new_size);
#   void  (*free)    (void *ctx, void *ptr, size_t size);
_MallocFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CallocFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_ReallocFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_FreeFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _PyDataMemAllocator(ctypes.Structure):
    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("malloc", _MallocFn),
        ("calloc", _CallocFn),
        ("realloc", _ReallocFn),
        ("free", _FreeFn),
    ]


class _PyDataMemHandler(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char * 127),  # "multiple of 64 to keep the struct aligned"
        ("version", ctypes.c_uint8),  # currently 1
        ("allocator", _PyDataMemAllocator),
    ]


# Counters active in the current context.  A ContextVar (not a global list)
# because numpy's handler is itself per-context: an allocation is attributed
# only to the counters of the context that made it.
_ACTIVE: contextvars.ContextVar[tuple] = contextvars.ContextVar("catbp_alloc_counter_active", default=())

_install_lock = threading.Lock()
_machinery = None  # built once by _get_machinery(), then kept forever


class _Machinery:
    """Everything that must outlive any array allocated through our handler."""

    def __init__(self) -> None:
        import numpy as np

        if tuple(int(x) for x in np.__version__.split(".")[:2]) < (1, 22):
            raise RuntimeError("NumpyAllocCounter needs numpy >= 1.22 (NEP 49)")
        try:
            # (the ignore: numpy's stubs leave out this private C extension)
            from numpy._core import _multiarray_umath as mu  # type: ignore[attr-defined]  # numpy >= 2
        except ImportError:  # pragma: no cover - numpy 1.x
            from numpy.core import _multiarray_umath as mu

        # A private PyDLL view of the interpreter, so setting argtypes/restype
        # here does not change ctypes.pythonapi for anyone else in the process.
        api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
        api.PyCapsule_GetPointer.restype = ctypes.c_void_p
        api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        api.PyCapsule_GetName.restype = ctypes.c_char_p
        api.PyCapsule_GetName.argtypes = [ctypes.py_object]
        api.PyCapsule_New.restype = ctypes.py_object
        api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        api.Py_IncRef.restype = None
        api.Py_IncRef.argtypes = [ctypes.py_object]

        # --- numpy C-API table -------------------------------------------------
        table_ptr = api.PyCapsule_GetPointer(mu._ARRAY_API, None)  # name is NULL
        if not table_ptr:
            raise RuntimeError("numpy _ARRAY_API capsule holds a NULL pointer")
        table = ctypes.cast(table_ptr, ctypes.POINTER(ctypes.c_void_p))
        # PYFUNCTYPE: called with the GIL held, Python errors are propagated.
        # A py_object restype tells ctypes the result is a *new* reference, which
        # is what both functions return.
        self.set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(table[_API_SET_HANDLER])
        self.get_handler = ctypes.PYFUNCTYPE(ctypes.py_object)(table[_API_GET_HANDLER])

        # Sanity check the table index before trusting it with SetHandler: the
        # current handler must be a "mem_handler" capsule whose struct name is
        # what numpy itself reports.
        current = self.get_handler()
        if api.PyCapsule_GetName(current) != _CAPSULE_NAME:
            raise RuntimeError("numpy C-API layout mismatch: GetHandler is not entry 305")
        cur_struct = ctypes.cast(
            api.PyCapsule_GetPointer(current, _CAPSULE_NAME), ctypes.POINTER(_PyDataMemHandler)
        ).contents
        if cur_struct.name.decode() != self.handler_name_now():
            raise RuntimeError("numpy PyDataMem_Handler layout mismatch")

        # --- libc ----------------------------------------------------------------
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        c_malloc, c_calloc, c_realloc, c_free = libc.malloc, libc.calloc, libc.realloc, libc.free
        c_malloc.restype = ctypes.c_void_p
        c_malloc.argtypes = [ctypes.c_size_t]
        c_calloc.restype = ctypes.c_void_p
        c_calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
        c_realloc.restype = ctypes.c_void_p
        c_realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        c_free.restype = None
        c_free.argtypes = [ctypes.c_void_p]

        # --- callbacks -----------------------------------------------------------
        # They only touch closed-over locals (no module globals), so they keep
        # working during interpreter shutdown when arrays allocated through this
        # handler are finally freed and module globals may already be cleared.
        active = _ACTIVE

        def _malloc(ctx, size):
            ptr = c_malloc(size)
            for c in active.get():
                c.allocations += 1
                c.bytes += size
            return ptr

        def _calloc(ctx, nelem, elsize):
            ptr = c_calloc(nelem, elsize)
            for c in active.get():
                c.allocations += 1
                c.bytes += nelem * elsize
            return ptr

        def _realloc(ctx, ptr, new_size):
            new = c_realloc(ptr, new_size)
            for c in active.get():
                if ptr is None:  # realloc(NULL, n) is a fresh allocation
                    c.allocations += 1
                else:
                    c.reallocs += 1
                c.bytes += new_size
            return new

        def _free(ctx, ptr, size):
            c_free(ptr)
            for c in active.get():
                c.frees += 1

        self.callbacks = (_MallocFn(_malloc), _CallocFn(_calloc), _ReallocFn(_realloc), _FreeFn(_free))

        handler = _PyDataMemHandler()
        handler.name = _HANDLER_NAME
        handler.version = 1
        handler.allocator = _PyDataMemAllocator(None, *self.callbacks)
        self.handler = handler
        # The capsule stores the name pointer, so the name buffer must live as
        # long as the capsule: a ctypes buffer we keep (and leak) for that.
        self.capsule_name = ctypes.create_string_buffer(_CAPSULE_NAME)
        self.capsule = api.PyCapsule_New(ctypes.addressof(handler), ctypes.addressof(self.capsule_name), None)

        # Arrays keep a reference to the capsule and free through the callbacks,
        # possibly after this module is torn down at exit.  Leak one reference
        # to each object so the C memory they own is never released.
        for obj in (self, handler, self.capsule_name, self.capsule, *self.callbacks):
            api.Py_IncRef(obj)

    @staticmethod
    def handler_name_now() -> str:
        import numpy as np

        # (None only for an array that does not own its data; no array: the current handler)
        try:
            return cast(str, np._core.multiarray.get_handler_name())
        except AttributeError:  # pragma: no cover - numpy 1.x
            # (the ignore: numpy 2's stubs have no numpy.core.multiarray)
            return np.core.multiarray.get_handler_name()  # type: ignore[attr-defined]


def _get_machinery() -> _Machinery:
    global _machinery
    with _install_lock:
        if _machinery is None:
            _machinery = _Machinery()
        return _machinery


def numpy_handler_name() -> str:
    """Name of the numpy data allocator active in the current context."""
    return _Machinery.handler_name_now()


class NumpyAllocCounter:
    """Count numpy data-buffer allocations made in the current thread/context.

    ``allocations``: malloc + calloc calls, plus realloc of a NULL pointer.
    ``reallocs``: realloc of an existing buffer (not counted as allocations).
    ``frees``: buffers released while active (whenever they were allocated).
    ``bytes``: total bytes requested by malloc/calloc/realloc.

    Re-entrant and nestable: an allocation is counted by every counter active
    in the context.  On exit (also on exceptions) the handler that was current
    on entry is restored.

    Things that look allocation-free but are not (numpy 2.4): a scalar operand
    of a ufunc (``a += 1``, ``a *= np.float64(2)``, ``np.add(a, 1.0, out=a)``,
    ``a[:] = 0``, ``a.sum()``) allocates transient 0-d buffers of one item
    each (``a += 1`` on float64 even two: int64 then the cast).  Array-array
    in-place ufuncs with ``out=``, ``np.copyto``, ``a.fill(x)``, ``a[i] = x``
    and views allocate nothing.  Arrays created by Numba's runtime (NRT) are not
    numpy allocations; count those with :class:`NrtAllocCounter`.
    """

    def __init__(self) -> None:
        self.reset()
        # stack of (previous handler, ContextVar token)
        self._saved: list[tuple[Any, contextvars.Token[tuple] | None]] | None = None

    def reset(self) -> None:
        self.allocations = 0
        self.reallocs = 0
        self.frees = 0
        self.bytes = 0

    def __enter__(self) -> NumpyAllocCounter:
        m = _get_machinery()
        active = _ACTIVE.get()
        # Re-entering the same counter must not count allocations twice.
        token = None if self in active else _ACTIVE.set(active + (self,))
        try:
            previous = m.set_handler(m.capsule)  # returns the old handler (new ref)
        except BaseException:
            if token is not None:
                _ACTIVE.reset(token)
            raise
        if self._saved is None:
            self._saved = []
        self._saved.append((previous, token))
        return self

    def __exit__(self, *exc) -> None:
        m = _get_machinery()
        assert self._saved is not None  # (__enter__ made it)
        previous, token = self._saved.pop()
        m.set_handler(previous)
        if token is None:
            return
        try:
            _ACTIVE.reset(token)
        except ValueError:  # exited in another context than entered
            _ACTIVE.set(tuple(c for c in _ACTIVE.get() if c is not self))

    def __repr__(self) -> str:
        return (
            f"NumpyAllocCounter(allocations={self.allocations}, reallocs={self.reallocs}, "
            f"frees={self.frees}, bytes={self.bytes})"
        )


# ---------------------------------------------------------------------------
# Numba NRT statistics
# ---------------------------------------------------------------------------
#
# numba's runtime keeps four atomic counters (nrt.cpp, TheMSys.stats):
#   alloc    - NRT_Allocate* calls (raw data blocks, e.g. np.empty in njit code)
#   free     - NRT_Free calls
#   mi_alloc - MemInfo objects initialised (NRT_MemInfo_init)
#   mi_free  - MemInfo objects destroyed
# They only count while stats are enabled; disabled, every getter returns the
# marker 0x41414141.  NUMBA_NRT_STATS=1 makes rtsys.initialize() enable them,
# but the switch is a plain runtime flag, so enable_nrt_stats() can flip it at
# any time (counts start from that moment; we only ever use deltas).
#
# Observed on numba 0.68.1 (tests/test_alloc_counter.py pins these), in units
# of NrtAllocCounter.allocations = delta(alloc + mi_alloc):
#   * @njit(int) -> int: 0 per call.
#   * each numpy array argument: 2 per call, i.e. exactly ONE MemInfo.  Unboxing
#     calls NRT_meminfo_new_from_pyobject -> NRT_MemInfo_new, which
#     NRT_Allocate()s the MemInfo struct (alloc += 1) and initialises it
#     (mi_alloc += 1); it borrows the ndarray's buffer (no data copy) and is
#     destroyed when the call returns (free += 1, mi_free += 1).  Same cost for
#     1-d/2-d, contiguous or strided, read-only, unused arguments, arrays inside
#     a tuple, and when the argument is returned unchanged (boxing hands back the
#     original ndarray).  Calls between njit functions add nothing.
#   * np.empty(n) inside njit: MemInfo and data in one block
#     (alloc += 1, mi_alloc += 1): 2 per call; numpy's handler never sees it,
#     even when the array is returned to Python.
# So "one MemInfo" shows up as 2 here; raw_allocs / meminfo_allocs split it.
# The counters are process-wide atomics: allocations from other threads count.

_DISABLED_STATS_VALUE = 0x41414141


class NrtStats(Protocol):
    """numba's nrt_mstats namedtuple (rtsys.get_allocation_stats())."""

    alloc: int
    free: int
    mi_alloc: int
    mi_free: int


def _nrt() -> tuple[Any, Any]:
    # Importing numba.core.runtime.nrt runs memsys_use_cpython_allocator(),
    # which must happen before stats are read; rtsys is the public handle.
    # (the ignore: a C extension of numba's, which has no stub)
    from numba.core.runtime import _nrt_python  # type: ignore[attr-defined]
    from numba.core.runtime.nrt import rtsys

    return _nrt_python, rtsys


def nrt_stats_enabled() -> bool:
    """True when numba's NRT allocation statistics are being collected."""
    _nrt_python, _ = _nrt()
    return bool(_nrt_python.memsys_stats_enabled())


def enable_nrt_stats() -> None:
    """Switch NRT statistics on at runtime (same effect as NUMBA_NRT_STATS=1).

    Cheap (a few atomic increments per allocation) and process-wide.
    """
    _nrt_python, _ = _nrt()
    _nrt_python.memsys_enable_stats()


def nrt_allocation_stats() -> NrtStats:
    """``rtsys.get_allocation_stats()``: namedtuple (alloc, free, mi_alloc, mi_free)."""
    if not nrt_stats_enabled():
        raise RuntimeError(
            "Numba NRT allocation statistics are disabled. Set NUMBA_NRT_STATS=1 in the "
            "environment before numba is imported, or call "
            "catbp_jit.testing.alloc_counter.enable_nrt_stats() first."
        )
    _, rtsys = _nrt()
    return rtsys.get_allocation_stats()


class NrtAllocCounter:
    """Count Numba NRT allocations while active (process-wide, all threads).

    ``allocations`` = delta(alloc + mi_alloc), ``frees`` = delta(free + mi_free),
    updated on exit (and readable live through ``current()``).
    Pass ``enable=True`` to switch statistics on instead of raising when they
    are off.
    """

    def __init__(self, enable: bool = False) -> None:
        self._enable = enable
        self._start: NrtStats | None = None  # while active
        self.reset()

    def reset(self) -> None:
        self.allocations = 0
        self.frees = 0
        self.raw_allocs = 0  # alloc delta (data blocks)
        self.meminfo_allocs = 0  # mi_alloc delta (MemInfo objects)
        if self._start is not None:
            self._start = nrt_allocation_stats()

    def _delta(self) -> tuple[int, int, int, int]:
        now = nrt_allocation_stats()
        s = self._start
        assert s is not None  # (inside the with block)
        return (now.alloc - s.alloc, now.free - s.free, now.mi_alloc - s.mi_alloc, now.mi_free - s.mi_free)

    def current(self) -> int:
        """Allocations so far (while inside the ``with`` block)."""
        alloc, _, mi_alloc, _ = self._delta()
        return alloc + mi_alloc

    def __enter__(self) -> NrtAllocCounter:
        if self._enable and not nrt_stats_enabled():
            enable_nrt_stats()
        self._start = nrt_allocation_stats()  # raises if disabled
        return self

    def __exit__(self, *exc) -> None:
        alloc, free, mi_alloc, mi_free = self._delta()
        self._start = None
        self.raw_allocs += alloc
        self.meminfo_allocs += mi_alloc
        self.allocations += alloc + mi_alloc
        self.frees += free + mi_free

    def __repr__(self) -> str:
        return (
            f"NrtAllocCounter(allocations={self.allocations}, frees={self.frees}, "
            f"raw_allocs={self.raw_allocs}, meminfo_allocs={self.meminfo_allocs})"
        )
