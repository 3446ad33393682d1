"""The CPU target's thread pool: threads that take chunks of a run's parallel steps, and
walk the tracks of a schedule that has them (plan/tracks.py).

A step the plan cuts into several chunks (its row's chunks, abi.py) is posted by the
compiled dispatcher in the pool's control block; the pool's threads, running the same
compiled dispatcher (codegen/dispatch.py: serve), take chunks of it. They are Python
threads that spend their time in compiled code without the GIL:

  - while a run holds the pool, a thread spins a little for the next job (a step a few
    microseconds after the last), then naps (usleep) between looks, so a serial stretch
    of the schedule costs the machine little;
  - when no run holds it, it returns to Python and waits on its Event, which a run that
    has parallel steps or tracks sets if the thread waits there (Session.run). A run
    finds the thread still in compiled code unless the last ended a while ago, and then
    sets nothing: setting an Event, and numba.get_num_threads() (two locks, one of them a
    multiprocessing lock), took 5-6 us of each of grid4x8_d2's 80 us runs.

The dispatcher never waits for a thread to arrive, only for chunks a thread took to be
done: on a busy machine, where a thread may wait milliseconds for a time slice, the run
goes on alone. (OpenMP's parallel regions, which Numba's prange uses, wait at each
region's end for every thread; with passive waiting each region also costs tens of
microseconds to wake them.)

How many threads help a run: numba.get_num_threads() - 1 in the thread that runs it
(numba.set_num_threads(1) runs everything on the caller's thread), at most
NUMBA_NUM_THREADS - 1, the threads the pool starts, once, at its first use.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import threading
from collections.abc import Callable
from typing import Any

import numba
import numba.np.ufunc.parallel
import numpy as np

from . import abi

# A pool thread spins this many pauses for the next job before it naps (a pause costs
# 40-140 cycles on x86-64, ~13 ns on the 2-core machine of the notes: 0.25 ms there). A
# run that binds its inputs first finds the thread still spinning: with 4000 pauses it had
# returned to Python during grid4x8_d2's 57 us of binding, and waking it again cost the
# run ~45 us (336 -> 298 us a run with inputs) ...
SPIN_PAUSES = 20000
# ... then naps this long between looks while a run holds the pool
NAP_MICROSECONDS = 50


def _usleep_address() -> int:
    """The address of libc's usleep, or 0 where there is none (pool threads then return to
    Python instead of napping)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        return ctypes.cast(libc.usleep, ctypes.c_void_p).value or 0
    except (OSError, AttributeError):
        return 0


class Pool:
    """The process's pool: its control block and threads (started at the first use)."""

    def __init__(self) -> None:
        # (a line of its own for every hot field: allocated aligned to 64 bytes)
        raw = np.zeros(abi.POOL_SIZE + 8, dtype=np.int64)
        start = (-raw.ctypes.data % 64) // 8
        self.control = raw[start : start + abi.POOL_SIZE]
        self.control[abi.POOL_SLEEP] = _usleep_address()
        self.control[abi.POOL_SPIN] = SPIN_PAUSES
        self.control[abi.POOL_NAP] = NAP_MICROSECONDS
        self.address = self.control.ctypes.data
        self._threads: list[threading.Thread] = []
        self._wake: list[threading.Event] = []
        # thread i waits on its Event in Python (not spinning or napping in compiled code)
        self._waiting: list[bool] = []
        # the calling thread's Numba thread count (_thread_counter, once the threads start)
        self._count_threads: Callable[[], int] = numba.get_num_threads
        self._lock = threading.Lock()

    def start(self, dispatcher: Callable[..., Any]) -> None:
        """Start the threads (NUMBA_NUM_THREADS - 1 of them) if they are not running:
        each loops on `dispatcher` (the compiled dispatcher, in its serving role)."""
        if self._threads:
            return
        with self._lock:
            if self._threads:
                return
            for i in range(max(0, numba.config.NUMBA_NUM_THREADS - 1)):  # type: ignore[attr-defined]
                wake = threading.Event()
                thread = threading.Thread(
                    target=self._serve, args=(dispatcher, i, wake), name=f"catbp_jit-pool-{i}", daemon=True
                )
                self._wake.append(wake)
                self._waiting.append(True)
                self._threads.append(thread)
                thread.start()
            self._count_threads = _thread_counter()

    def _serve(self, dispatcher: Callable[..., Any], i: int, wake: threading.Event) -> None:
        control = self.control
        while True:
            # (a run that looks while this thread returns from serving sets nothing, and
            # runs without it: the next run wakes it)
            self._waiting[i] = True
            wake.wait()
            self._waiting[i] = False
            wake.clear()  # (before serving: a wake that comes while it serves is kept)
            if control[abi.POOL_STOP]:
                return
            dispatcher(0, 0, 0, 0, 0, 0, 0, 0, self.address, 0, i, -1)

    def helpers(self) -> int:
        """Pool threads that may help a run started now in this thread, woken where they
        wait in Python."""
        n = min(self._count_threads() - 1, len(self._threads))
        for i in range(n):
            if self._waiting[i]:
                self._wake[i].set()
        return max(0, n)

    def stop(self) -> None:
        """Let the threads return (at exit: none is left spinning in compiled code)."""
        self.control[abi.POOL_STOP] = 1
        for wake in self._wake:
            wake.set()
        for thread in self._threads:
            thread.join(timeout=1.0)


def _thread_counter() -> Callable[[], int]:
    """numba.get_num_threads, or where it can be the threading layer's own count, which it
    returns once it has launched the layer: the public call takes two locks each time
    (one a multiprocessing lock), ~3 us."""
    count = numba.get_num_threads()  # (launches the threading layer)
    layer = getattr(numba.np.ufunc.parallel, "_get_num_threads", None)
    if callable(layer) and layer() == count:
        return layer
    return numba.get_num_threads


_pool: Pool | None = None


def the_pool() -> Pool:
    """The process's pool (made at the first call)."""
    global _pool
    if _pool is None:
        _pool = Pool()
    return _pool


def _forget_in_child() -> None:
    # A forked child has none of the parent's threads, and its copy of the control block
    # may show a run of the parent's holding the pool: the child makes a new pool.
    global _pool
    _pool = None


def _stop_at_exit() -> None:
    if _pool is not None:
        _pool.stop()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_stop_at_exit)
