"""codegen/libm.py: the CPU kernels' exp and log, the C library's by their default symbols,
give the bits of Numba's math.exp and math.log (and of Python's, which the numpy tier
calls), and every CPU kernel that takes a logsumexp calls them."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from numba import _helperlib, njit

from catbp_jit.codegen import cpu, cpu_gemm, libm
from catbp_jit.plan.steps import KernelPattern
from catbp_jit.semiring import semiring


# The kernels take logs of sums of exponentials, never of a negative number (where the
# compatibility wrapper's NaN has the other sign): log's arguments are those of x >= 0 or NaN
@njit(error_model="numpy")
def ours(x, exp_out, log_out):
    for i in range(x.size):
        exp_out[i] = libm.exp(x[i])
        log_out[i] = libm.log(x[i]) if not x[i] < 0.0 else 0.0


@njit(error_model="numpy")
def numbas(x, exp_out, log_out):
    for i in range(x.size):
        exp_out[i] = math.exp(x[i])
        log_out[i] = math.log(x[i]) if not x[i] < 0.0 else 0.0


def arguments(dtype) -> np.ndarray:
    rng = np.random.default_rng(0)
    big, tiny = (750.0, 5e-324) if dtype == np.float64 else (110.0, 1e-45)
    special = [-np.inf, np.inf, np.nan, 0.0, -0.0, 1.0, -1.0, tiny, 1e-38, -1e-30]
    if dtype == np.float64:
        special += [709.782712893384, 709.7827128933841, -745.1332191019411, -745.1332191019412, 1e-310]
    return np.concatenate(
        [
            rng.uniform(-big, big, 200_000),
            rng.uniform(-40.0, 1.0, 200_000),
            np.exp(rng.uniform(-big + 50, big - 50, 200_000)),  # log's arguments, positive
            special,
        ]
    ).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_same_bits_as_numbas_math(dtype):
    x = arguments(dtype)
    got = np.empty_like(x), np.empty_like(x)
    want = np.empty_like(x), np.empty_like(x)
    with np.errstate(all="ignore"):
        ours(x, *got)
        numbas(x, *want)
    for g, w in zip(got, want):
        assert g.dtype == dtype
        assert g.tobytes() == w.tobytes()


def test_the_same_bits_as_pythons_math():
    """The numpy tier (numpy_steps.py) takes exp and log from Python's math module."""
    x = arguments(np.float64)[::37]
    got_exp, got_log = np.empty_like(x), np.empty_like(x)
    ours(x, got_exp, got_log)

    def py(f, v):
        try:
            return f(v)
        except OverflowError:
            return math.inf
        except ValueError:  # log of a negative number or zero
            return -math.inf if v == 0 else math.nan

    want_exp = np.array([py(math.exp, v) for v in x])
    want_log = np.array([py(math.log, v) if not v < 0.0 else 0.0 for v in x])
    assert np.array_equal(got_exp, want_exp, equal_nan=True)
    assert np.array_equal(got_log, want_log, equal_nan=True)


def test_without_a_c_library_by_name_numbas_functions_stand_in():
    found = libm.addresses(None)
    assert found == {name: _helperlib.c_helpers[c] for name, c in libm.FUNCTIONS.items()}


def test_every_logsumexp_kernel_calls_libm():
    """A CPU kernel imports libm where it takes an exp or log, and calls no other."""
    calls = 0
    for name, dtype, reduce, normalize, vector in itertools.product(
        ("PROB", "LOGPROB", "MAXLOG", "SAT", "COUNT"),
        ("float64", "float32", "int64", "bool"),
        (False, True),
        (False, True),
        ("outputs", "reduced", "both"),
    ):
        pattern = KernelPattern(name, dtype, reduce, normalize, False, vector if reduce else "outputs")
        source = cpu.kernel_source(pattern)
        body = source.split(cpu.LIBM_IMPORT)[-1]
        assert "math.exp" not in source and "math.log" not in source, pattern
        assert (cpu.LIBM_IMPORT in source) == ("libm." in body) == cpu.uses_libm(semiring(name), pattern)
        calls += "libm.exp" in body
    assert calls  # LOGPROB's reductions
    for parallel in (False, True):
        gemm = KernelPattern("LOGPROB", "float64", True, False, parallel, template="gemm")
        source = cpu_gemm.kernel_source(gemm)
        assert "libm.exp" in source and "math.exp" not in source
