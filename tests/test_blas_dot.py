"""intrinsics.blas_dot, the GEMM kernels' one BLAS call, gives the bits of Numba's np.dot
(the four calls, one per pair of layouts, that it replaces) for every layout and every
shape class: empty products, vectors on either side or both, matrices."""

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from catbp_jit.codegen.intrinsics import blas_dot


@njit(cache=False)
def by_blas_dot(mem, ao, a_t, bo, b_t, oo, M, N, K, alpha=1.0):
    blas_dot(mem, ao, a_t, bo, b_t, oo, M, N, K, alpha)


@njit(cache=False)
def by_np_dot(mem, ao, a_t, bo, b_t, oo, M, N, K):
    out = mem[oo : oo + M * N].reshape((M, N))
    if a_t == 0 and b_t == 0:
        np.dot(mem[ao : ao + M * K].reshape((M, K)), mem[bo : bo + K * N].reshape((K, N)), out)
    elif a_t == 0:
        np.dot(mem[ao : ao + M * K].reshape((M, K)), mem[bo : bo + K * N].reshape((N, K)).T, out)
    elif b_t == 0:
        np.dot(mem[ao : ao + M * K].reshape((K, M)).T, mem[bo : bo + K * N].reshape((K, N)), out)
    else:
        np.dot(mem[ao : ao + M * K].reshape((K, M)).T, mem[bo : bo + K * N].reshape((N, K)).T, out)


SIZES = [0, 1, 2, 7, 33]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_bits_of_np_dot_for_every_layout_and_shape(dtype):
    rng = np.random.default_rng(7)
    for M, N, K, a_t, b_t in itertools.product(SIZES, SIZES, SIZES, (0, 1), (0, 1)):
        # a, b and the output at odd offsets in one arena, guards between them
        ao, bo = 3, 3 + M * K + 5
        oo = bo + K * N + 5
        mem = rng.standard_normal(oo + M * N + 5).astype(dtype)
        want, got = mem.copy(), mem.copy()
        by_np_dot(want, ao, a_t, bo, b_t, oo, M, N, K)
        by_blas_dot(got, ao, a_t, bo, b_t, oo, M, N, K)
        case = f"M={M} N={N} K={K} a_t={a_t} b_t={b_t}"
        assert got.tobytes() == want.tobytes(), case
        assert (got[:oo] == mem[:oo]).all() and (got[oo + M * N :] == mem[oo + M * N :]).all(), case


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_alpha_scales_every_product_by_blas_itself(dtype):
    """alpha (a PROB GEMM step's reciprocal total) scales each element of the product in
    the BLAS call, for every layout and shape class: within an ulp or two of np.dot's
    product times alpha, and nothing written outside the product."""
    rng = np.random.default_rng(5)
    alpha = 0.37
    for M, N, K, a_t, b_t in itertools.product((1, 2, 33), (1, 7), (1, 33), (0, 1), (0, 1)):
        ao, bo = 3, 3 + M * K + 5
        oo = bo + K * N + 5
        mem = rng.random(oo + M * N + 5).astype(dtype)  # (positive: no cancellation)
        want, got = mem.copy(), mem.copy()
        by_np_dot(want, ao, a_t, bo, b_t, oo, M, N, K)
        by_blas_dot(got, ao, a_t, bo, b_t, oo, M, N, K, alpha)
        case = f"M={M} N={N} K={K} a_t={a_t} b_t={b_t}"
        scaled = want[oo : oo + M * N] * np.asarray(alpha, dtype)
        np.testing.assert_allclose(got[oo : oo + M * N], scaled, rtol=4 * np.finfo(dtype).eps, err_msg=case)
        assert (got[:oo] == mem[:oo]).all() and (got[oo + M * N :] == mem[oo + M * N :]).all(), case


def test_a_leaf_that_is_no_float_array_is_a_typing_error():
    from numba.core.errors import TypingError

    with pytest.raises(TypingError):
        by_blas_dot(np.zeros(4, dtype=np.int64), 0, 0, 0, 0, 0, 1, 1, 1)


SPIN_CHILD = """
import resource, time
import catbp_jit  # noqa: F401  (sets OpenBLAS's spin before SciPy's BLAS loads)
import numpy as np
from scipy.linalg import blas
from threadpoolctl import threadpool_info

libs = [i for i in threadpool_info() if i["user_api"] == "blas" and "scipy.libs" in i["filepath"]]
if not libs or libs[0]["internal_api"] != "openblas" or libs[0]["num_threads"] < 2:
    print("skip")
    raise SystemExit
a = np.asfortranarray(np.random.default_rng(0).random((600, 600)))
blas.dgemm(1.0, a, a)  # (on BLAS's threads: its workers now wait for the next call)


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


t0 = cpu()
time.sleep(0.3)
print(cpu() - t0)
"""


def test_openblas_threads_do_not_spin_between_calls():
    """After a BLAS call, OpenBLAS's threads (SciPy's, the library Numba calls) stop
    spinning at once: with OpenBLAS's default they kept a core busy for ~110 ms after
    every call, taken from the loop kernels that follow (catbp_jit/__init__.py).
    Measured as the process's CPU time while its main thread sleeps, in a fresh
    interpreter without OPENBLAS_THREAD_TIMEOUT set."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    child = [sys.executable, "-c", SPIN_CHILD]
    done = subprocess.run(child, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    if done.stdout.strip() == "skip":
        pytest.skip("SciPy's BLAS is not a multithreaded OpenBLAS here")
    spent = float(done.stdout)
    assert spent < 0.05, f"BLAS threads spent {spent:.3f} s of CPU during a 0.3 s sleep"
