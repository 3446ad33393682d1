"""intrinsics.blas_dot, the GEMM kernels' one BLAS call, gives the bits of Numba's np.dot
(the four calls, one per pair of layouts, that it replaces) for every layout and every
shape class: empty products, vectors on either side or both, matrices."""

import itertools

import numpy as np
import pytest
from numba import njit

from catbp_jit.codegen.intrinsics import blas_dot


@njit(cache=False)
def by_blas_dot(mem, ao, a_t, bo, b_t, oo, M, N, K):
    blas_dot(mem, ao, a_t, bo, b_t, oo, M, N, K)


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


def test_a_leaf_that_is_no_float_array_is_a_typing_error():
    from numba.core.errors import TypingError

    with pytest.raises(TypingError):
        by_blas_dot(np.zeros(4, dtype=np.int64), 0, 0, 0, 0, 0, 1, 1, 1)
