"""BLAS on one thread while a run's GEMM steps are small products, some run in parallel.

A GEMM step (plan/gemm.py, reassociating mode) calls BLAS through Numba's wrappers, and
OpenBLAS splits even a small product among threads of its own. Between the parallel
kernels' OpenMP regions those threads find the cores busy or their wake-ups slow: an
ObjectDetection_11 step of one 121 x 121 x 121 product took 0.75 ms against 0.17 ms on one
thread alone, and 14 ms within a solve on a busy machine; the whole solve went from
139-141 ms to 103-118 ms with OPENBLAS_NUM_THREADS=1 (2 cores, alternating processes).
Large products gain from BLAS's threads (ObjectDetection_15's 441^3 ones: its solve
went from 51 to 60 ms on one thread), so a run keeps them when any product is large, and
when no GEMM step is parallel (BLAS's threads then have the cores to themselves).

threadpoolctl (the library scikit-learn and joblib use for this) finds the BLAS
libraries loaded in the process and sets their thread counts; each run sets one and
puts the counts back after, about 2 us per library.
"""

from __future__ import annotations

import threading

from . import abi
from .plan.gemm import SMALL_PRODUCT  # (a product BLAS may run on one thread)
from .plan.schedule import Schedule
from .semiring import SEMIRINGS


def wants_one_thread(schedule: Schedule) -> bool:
    """Whether a schedule's GEMM steps are all small products and some of them parallel
    (their products called from the kernels' own threads: BLAS's threads on top would
    oversubscribe the cores). Without parallel steps BLAS's threads gained a little (the
    Segmentation_13 and Promedus_14 solves were 4-8% slower on one)."""
    gemms = [
        (st.pattern, st.params)
        for st in schedule.steps
        # (MAXLOG's max-plus products are loops of our own: no BLAS call to keep on one thread)
        if isinstance(st.params, abi.GemmParams) and SEMIRINGS[st.pattern.semiring].sums_reals
    ]
    return any(p.parallel_batch for _, p in gemms) and all(p.m * p.n * p.k <= SMALL_PRODUCT for _, p in gemms)


# BLAS's thread counts are process-wide: sessions running at once in several threads (a
# Dask worker's, say) share one count of runs inside, and the first in saves the counts
# that the last out puts back
_lock = threading.Lock()
_inside = 0
_saved: list = []  # (library, its thread count) as the first run in found them


class OneBlasThread:
    """Sets every loaded BLAS library to one thread (`enter`) and back (`exit`)."""

    def __init__(self) -> None:
        import scipy.linalg.cython_blas  # noqa: F401  (Numba's BLAS wrappers call it: loaded first)
        from threadpoolctl import ThreadpoolController

        self._libraries = ThreadpoolController().select(user_api="blas").lib_controllers

    def enter(self) -> None:
        global _inside, _saved
        with _lock:
            if _inside == 0:
                _saved = [(lib, lib.num_threads) for lib in self._libraries]
                for lib in self._libraries:
                    lib.set_num_threads(1)
            _inside += 1

    def exit(self) -> None:
        global _inside
        with _lock:
            _inside -= 1
            if _inside == 0:
                for lib, n in _saved:
                    lib.set_num_threads(n)
