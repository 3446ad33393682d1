"""PROB without overflow: scaled tables and scaled messages, and Z from their scales.

A product of potentials overflows float64 once log Z passes ~709 and underflows below
~-745: a Markov grid with log Z in the thousands gives inf or 0 when multiplied out. So in
PROB the front end keeps every value near 1 and carries the scales beside it, exactly:
- each table is divided by the power of two at or above its largest entry (`pow2_scaled`:
  exact, a change of exponent only), so every entry is at most 1;
- the programs normalize every message as it is computed and store each upward
  message's total in a ("scale", u, v) slot (emit.py, scaled=True);
- Z = (the root belief's total) x (every upward scale) x 2^(the tables' exponents), a
  product kept as a mantissa and a binary exponent (`ScaledNumber`), so log Z is right
  far beyond float64's range and Z itself is a float where one can hold it.
This is what scaled forward-backward does for HMMs (Rabiner 1989), applied per message.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..errors import CatbpError

# below this a float64 has lost bits (subnormal): a scale there means precision is gone
TINY = float(np.finfo(np.float64).tiny)


def pow2_scaled(values: np.ndarray) -> tuple[np.ndarray, int]:
    """values / 2**k, k the binary exponent of the largest entry (so it lies in [0.5, 1));
    an all-zero table is kept as it is (k = 0). Exact: only exponents change, except for
    entries that become subnormal, which are below 2**-1022 of the largest anyway."""
    values = np.asarray(values, dtype=np.float64)
    top = float(values.max()) if values.size else 0.0
    if top == 0.0:
        return values, 0
    k = math.frexp(top)[1]
    return np.ldexp(values, -k), k


@dataclass(frozen=True)
class ScaledNumber:
    """mantissa * 2**exponent, mantissa in [0.5, 1) (or 0): a non-negative number of any size."""

    mantissa: float
    exponent: int

    @staticmethod
    def product(factors: Iterable[float], exponent: int = 0) -> ScaledNumber:
        """The product of non-negative floats times 2**exponent, one rounding per factor."""
        mant, exp = 1.0, exponent
        for x in factors:
            m, e = math.frexp(x)
            mant, e2 = math.frexp(mant * m)
            exp += e + e2
            if mant == 0.0:
                return ScaledNumber(0.0, 0)
        return ScaledNumber(mant, exp)

    @staticmethod
    def product_of(factors: np.ndarray, exponent: int = 0) -> ScaledNumber:
        """product() of an array, vectorized, with the same bits: frexp is exact, and the
        running product of mantissas (each in [0.5, 1)) rounds as product()'s does while it
        stays a normal float, which renormalizing every _RUN factors guarantees. Zeros,
        inf and NaN go through product() itself."""
        x = np.asarray(factors, dtype=np.float64).ravel()
        mants, exps = np.frexp(x)
        if not (np.isfinite(mants).all() and mants.all()):
            return ScaledNumber.product(x.tolist(), exponent)
        mant, exp = 1.0, exponent + int(exps.sum())
        for lo in range(0, x.size, _RUN):
            run = np.multiply.accumulate(np.concatenate(([mant], mants[lo : lo + _RUN])))
            mant, e = math.frexp(float(run[-1]))
            exp += e
        return ScaledNumber(mant, exp)

    @property
    def log(self) -> float:
        if self.mantissa == 0.0:
            return -math.inf
        return math.log(self.mantissa) + self.exponent * math.log(2.0)

    def value(self) -> float | decimal.Decimal:
        """A float when float64 holds it without losing bits (normal range), else a
        decimal.Decimal with 17 significant digits (never inf, never a false 0)."""
        if self.mantissa == 0.0:
            return 0.0
        if -1021 <= self.exponent <= 1024:
            return math.ldexp(self.mantissa, self.exponent)
        return _DECIMAL.multiply(
            decimal.Decimal(self.mantissa), _DECIMAL.power(decimal.Decimal(2), self.exponent)
        )


_RUN = 1000  # mantissas in [0.5, 1): a product of 1001 of them is at least 2**-1001, normal
_DECIMAL = decimal.Context(prec=17, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN)
# exp(x) is a normal float64 for x in this range
_FLOAT_LOG_RANGE = (math.log(TINY), math.log(np.finfo(np.float64).max))


def exp_of_log(log_value: float) -> float | decimal.Decimal:
    """exp(log_value) as a float where float64 holds it as a normal number, else a
    decimal.Decimal (17 digits): what LOGPROB's Z is when log Z is in the thousands."""
    lo, hi = _FLOAT_LOG_RANGE
    if log_value == -math.inf or lo <= log_value <= hi:
        return math.exp(log_value)
    return _DECIMAL.exp(decimal.Decimal(log_value))


class NumericalError(CatbpError, ArithmeticError):
    """PROB lost the answer to underflow; LOGPROB computes it (the message says so)."""
