"""Semiring runtimes: the numpy operations the reference VM applies, one per semiring.

The factory names and behaviour are CatBP's (CatBP's VM specification; docs/ir.md,
Semirings): PROB normalizes by dividing by the total unless it is 0, LOGPROB subtracts the
logsumexp, SAT and COUNT do not normalize. MAXLOG is ours (max-product over logs: ⊗ = +,
⊕ = max), for the most probable assignment and max-marginals; it normalizes by
subtracting the largest entry, so that the best is 0 (as LOGPROB's, an all -inf tensor
becomes NaN). `add_reduce(x, axis)` reduces over a non-empty
tuple of axes; any falsy `axis` (an empty tuple, but also 0 or None) returns x unreduced.
That is CatBP's own behaviour (`... if axis else x`), kept so that code written against
CatBP's runtimes gets the same answers; the VM only ever passes non-empty tuples. Every
float reduction here uses numpy's own summation so that the reference reproduces CatBP's
results bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import DTypeLike

from .errors import CatbpError


@dataclass(frozen=True)
class Semiring:
    """What the planner and every code generator know of a semiring: one description,
    read by every stage, so that a target renders the same plan (no name switches)."""

    name: str
    default_dtype: str
    one: Any  # ⊗'s identity: what UNIT loads
    zero: Any  # ⊕'s identity: an empty sum, an impossible state
    product_op: str  # ⊗ between terms in kernel source
    # ⊕: "sum", "any" (stops at the first true term), "logsumexp" (two passes), "max"
    # (a NaN term makes the result NaN, as numpy's max)
    reduction: str
    normalization: str | None  # NORMALIZE: "divide_by_total", "subtract_logsumexp", "subtract_max", or none
    # ⊕ over a single term gives the term back (logsumexp of +inf gives NaN: it does not)
    single_term_reduction_is_identity: bool = True
    # the dtypes compiled kernels exist for (every target); the reference takes any
    dtypes: tuple[str, ...] = ()
    # what a result (Z, a marginal's entry) means, so that the front end reads it without
    # asking which semiring it is: "bool" (SAT: possible or not), "count" (COUNT: a number
    # of models, int64 arithmetic that wraps modulo 2^64), "scaled" (PROB: a float, which
    # the front end runs scaled: frontend/scaling.py), "log" (LOGPROB: the natural log),
    # "maxlog" (MAXLOG: the log of the largest product, not of a sum)
    result_kind: str = "scaled"

    @property
    def normalizes(self) -> bool:
        return self.normalization is not None

    @property
    def is_log(self) -> bool:
        """Results are logs of sums (LOGPROB): potentials load as log, Z as log Z, and ⊕
        takes an exponential per term."""
        return self.result_kind == "log"

    @property
    def loads_logs(self) -> bool:
        """Potentials load as their natural logs (LOGPROB, MAXLOG)."""
        return self.result_kind in ("log", "maxlog")

    @property
    def is_max(self) -> bool:
        """⊕ is max (MAXLOG): exact in any order, so every target agrees bit for bit."""
        return self.reduction == "max"

    @property
    def sums_reals(self) -> bool:
        """⊕ adds real numbers (PROB; LOGPROB, through exp): a contraction can run as a
        matrix product (plan/gemm.py). SAT's any and COUNT's wrapping ints cannot."""
        return self.result_kind in ("scaled", "log")

    @property
    def regroups_products(self) -> bool:
        """The reassociating mode (PlanOptions.exact=False) may regroup ⊗ into contraction
        paths (plan/reassociate.py): PROB and LOGPROB are promised within rounding of the
        reference there, SAT and COUNT are exact in any order. Not MAXLOG: its ⊕ is exact,
        so it gives the reference's bits in both modes, which a regrouped float + would
        not (on the UAI 2014 models that ship, regrouping gained it 0.8-1.3x)."""
        return not self.is_max

    @property
    def is_scaled(self) -> bool:
        """The front end keeps tables and messages near 1 and Z as their scales (PROB)."""
        return self.result_kind == "scaled"

    @property
    def is_count(self) -> bool:
        """Z counts models in wrapping int64 arithmetic: exact below 2^63 (COUNT)."""
        return self.result_kind == "count"

    @property
    def result_dtype(self) -> str | None:
        """The dtype Z is exact in, a bool (SAT) or an int64 count (COUNT); None when Z
        is a float (PROB, LOGPROB: log Z carries it)."""
        return {"bool": "bool", "count": "int64"}.get(self.result_kind)

    @property
    def marginal_dtype(self) -> str:
        """A normalized marginal's dtype: which values are possible (SAT), else float64."""
        return "bool" if self.result_kind == "bool" else "float64"

    def to_log_z(self, z: Any) -> float:
        """log Z from one Z as the programs compute it: a truth (0 or -inf), a count, a
        float (PROB's Z, already rebuilt from its scales) or a log (LOGPROB, MAXLOG)."""
        if self.result_kind == "bool":
            return 0.0 if bool(z) else -math.inf
        if self.result_kind == "count":
            count = int(z)
            return math.log(count) if count > 0 else -math.inf
        if self.result_kind in ("log", "maxlog"):
            return float(z)
        with np.errstate(divide="ignore"):
            return float(np.log(float(z)))

    def log_z_rows(self, z: np.ndarray) -> np.ndarray:
        """log Z of each row of a batch (float64), from the rows' Z as computed."""
        if self.result_kind == "bool":
            return np.where(np.asarray(z, dtype=bool), 0.0, -math.inf)
        if self.result_kind in ("log", "maxlog"):
            return np.array(z, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(np.asarray(z).astype(np.float64))

    def product(self, terms: Iterable[str]) -> str:
        """⊗ of the terms, left to right as written, as source."""
        return self.product_op.join(terms)

    def line_product(self, terms: Iterable[str]) -> str:
        """⊗ of lines of terms (codegen/lines.py), element by element, left to right, as
        source: SAT's `and` is Python's operator on truths, on lines it is `&`."""
        return (" & " if self.product_op == " and " else self.product_op).join(terms)

    def accumulator(self, dtype: str) -> str:
        """The source of ⊕'s starting value; float sums accumulate in float64, a max in
        the dtype (it is exact: a float32 max is the largest float32, as numpy's)."""
        if self.reduction == "any":
            return "False"
        if self.is_max:  # an empty max: the semiring's zero
            return f"np.{np.dtype(dtype).name}(-np.inf)"
        return "0" if np.dtype(dtype).kind in "iu" else "0.0"

    def potentials(self, values: np.ndarray, dtype: Any) -> np.ndarray:
        """Non-negative potentials as this semiring's programs load them. PROB: as given.
        LOGPROB, MAXLOG: natural log (0 -> -inf). SAT: non-zero. COUNT: 1 where non-zero,
        so Z counts the assignments every factor allows."""
        values = np.asarray(values)
        if self.loads_logs:
            with np.errstate(divide="ignore"):
                values = np.log(values)
        elif self.result_dtype is not None:  # an exact answer counts the allowed assignments
            values = values != 0
        # np.asarray: numpy turns 0-d results into scalars, the executor wants arrays
        return np.asarray(values, dtype=dtype)


# every semiring, the front end's default first: the one list of their names
SEMIRINGS = {
    "PROB": Semiring(
        "PROB",
        "float64",
        1.0,
        0.0,
        " * ",
        "sum",
        "divide_by_total",
        dtypes=("float64", "float32"),
        result_kind="scaled",
    ),
    "LOGPROB": Semiring(
        "LOGPROB",
        "float64",
        0.0,
        -np.inf,
        " + ",
        "logsumexp",
        "subtract_logsumexp",
        single_term_reduction_is_identity=False,
        dtypes=("float64", "float32"),
        result_kind="log",
    ),
    "SAT": Semiring("SAT", "bool", True, False, " and ", "any", None, dtypes=("bool",), result_kind="bool"),
    "COUNT": Semiring("COUNT", "int64", 1, 0, " * ", "sum", None, dtypes=("int64",), result_kind="count"),
    "MAXLOG": Semiring(
        "MAXLOG",
        "float64",
        0.0,
        -np.inf,
        " + ",
        "max",
        "subtract_max",
        dtypes=("float64", "float32"),
        result_kind="maxlog",
    ),
}
SEMIRING_NAMES = tuple(SEMIRINGS)  # ("PROB", "LOGPROB", "SAT", "COUNT", "MAXLOG")


class SemiringDtypeError(CatbpError, ValueError):
    """A semiring runtime in a dtype no compiled kernel exists for."""


def check_compiled_dtype(sr: VMSemiringRuntime) -> None:
    """Refuse, before anything is planned, a dtype the kernels are not generated for
    (they read memory through a typed pointer per dtype: float16 has none)."""
    supported = sr.kind.dtypes
    if sr.dtype.name not in supported:
        raise SemiringDtypeError(
            f"semiring {sr.name} in {sr.dtype.name}: compiled kernels "
            f"exist for {', '.join(supported)} only (the reference "
            f"interpreter takes any numpy dtype)"
        )


def semiring(name: str) -> Semiring:
    """The description of a semiring by name."""
    try:
        return SEMIRINGS[str(name).upper()]
    except KeyError:
        raise ValueError(f"unknown semiring {name!r} (known: {', '.join(SEMIRING_NAMES)})") from None


def logsumexp(x: np.ndarray, axis: tuple[int, ...] | None = None) -> np.ndarray:
    """Max-shifted logsumexp; an all -inf (or empty) reduction gives -inf, never NaN."""
    x = np.asarray(x)
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) = -inf is intended
        return _logsumexp(x, axis)


def _logsumexp(x: np.ndarray, axis: tuple[int, ...] | None) -> np.ndarray:
    if x.size == 0:
        return np.array(-np.inf)
    if axis is None:
        m = np.max(x)
        if np.isneginf(m):
            return np.array(-np.inf)
        return m + np.log(np.sum(np.exp(x - m)))
    m = np.max(x, axis=axis, keepdims=True)
    shift = np.where(np.isneginf(m), 0.0, m)  # exp(-inf - 0) = 0 keeps empty sums at 0
    y = np.log(np.sum(np.exp(x - shift), axis=axis, keepdims=True)) + shift
    y = np.where(np.isneginf(m), -np.inf, y)
    return np.squeeze(y, axis=axis)


class AddReduce(Protocol):
    """⊕ over `axis` (a tuple of axes; falsy: x unreduced), called as CatBP calls it:
    positionally or with the keyword; over every axis numpy may give a scalar."""

    def __call__(self, x: np.ndarray, axis: Any) -> np.ndarray | np.generic: ...


@dataclass(frozen=True)
class VMSemiringRuntime:
    name: str
    dtype: np.dtype
    mul: Callable[[np.ndarray, np.ndarray], np.ndarray]
    add_reduce: AddReduce
    one: Callable[[tuple[int, ...]], np.ndarray]
    zero: Callable[[tuple[int, ...]], np.ndarray]
    normalize: Callable[..., np.ndarray] | None = None

    def supports_normalize(self) -> bool:
        return self.normalize is not None

    @property
    def kind(self) -> Semiring:
        """The description every compile stage reads."""
        return SEMIRINGS[self.name]


def vm_sat_semiring() -> VMSemiringRuntime:
    return VMSemiringRuntime(
        name="SAT",
        dtype=np.dtype(np.bool_),
        mul=np.logical_and,
        add_reduce=lambda x, axis: np.any(x, axis=axis) if axis else x,
        one=lambda shape: np.ones(shape, dtype=np.bool_),
        zero=lambda shape: np.zeros(shape, dtype=np.bool_),
        normalize=None,
    )


def vm_prob_semiring(dtype: DTypeLike = np.float64) -> VMSemiringRuntime:
    dt: np.dtype = np.dtype(dtype)

    def normalize(x: np.ndarray, axis=None) -> np.ndarray:
        if axis is None:
            total = np.sum(x)
            return x if total == 0 else x / total
        total = np.sum(x, axis=axis, keepdims=True)
        return x / np.where(total == 0, 1.0, total)

    return VMSemiringRuntime(
        name="PROB",
        dtype=dt,
        mul=np.multiply,
        add_reduce=lambda x, axis: np.sum(x, axis=axis, dtype=dt) if axis else x,
        one=lambda shape: np.ones(shape, dtype=dt),
        zero=lambda shape: np.zeros(shape, dtype=dt),
        normalize=normalize,
    )


def vm_logprob_semiring(dtype: DTypeLike = np.float64) -> VMSemiringRuntime:
    dt: np.dtype = np.dtype(dtype)

    def add_reduce(x: np.ndarray, axis) -> np.ndarray:
        return logsumexp(x, axis=axis) if axis else x

    def normalize(x: np.ndarray, axis=None) -> np.ndarray:
        if axis is None:
            z = logsumexp(x, axis=tuple(range(x.ndim)) if x.ndim else None)
        else:
            axes = (axis,) if isinstance(axis, int) else tuple(axis)
            z = logsumexp(x, axis=axes)
            for a in sorted(axes):
                z = np.expand_dims(z, axis=a)
        with np.errstate(invalid="ignore"):  # -inf - -inf = NaN, as in CatBP
            return x - z

    return VMSemiringRuntime(
        name="LOGPROB",
        dtype=dt,
        mul=np.add,  # log(a*b) = log a + log b
        add_reduce=add_reduce,
        one=lambda shape: np.zeros(shape, dtype=dt),
        zero=lambda shape: np.full(shape, -np.inf, dtype=dt),
        normalize=normalize,
    )


def vm_counting_semiring(dtype: DTypeLike = np.int64) -> VMSemiringRuntime:
    dt: np.dtype = np.dtype(dtype)
    return VMSemiringRuntime(
        name="COUNT",
        dtype=dt,
        mul=np.multiply,  # int64 wraps around, as numpy's does
        add_reduce=lambda x, axis: np.sum(x, axis=axis, dtype=dt) if axis else x,
        one=lambda shape: np.ones(shape, dtype=dt),
        zero=lambda shape: np.zeros(shape, dtype=dt),
        normalize=None,
    )


def vm_maxlog_semiring(dtype: DTypeLike = np.float64) -> VMSemiringRuntime:
    """Max-product over logs: ⊗ = +, ⊕ = max (numpy's: a NaN term gives NaN)."""
    dt: np.dtype = np.dtype(dtype)

    def normalize(x: np.ndarray, axis=None) -> np.ndarray:
        if axis is None:
            m = np.max(x) if x.size else dt.type(-np.inf)
        else:
            m = np.max(x, axis=axis, keepdims=True)
        with np.errstate(invalid="ignore"):  # -inf - -inf = NaN, as LOGPROB's
            return np.asarray(x - m, dtype=dt)

    return VMSemiringRuntime(
        name="MAXLOG",
        dtype=dt,
        mul=np.add,
        add_reduce=lambda x, axis: np.max(x, axis=axis) if axis else x,
        one=lambda shape: np.zeros(shape, dtype=dt),
        zero=lambda shape: np.full(shape, -np.inf, dtype=dt),
        normalize=normalize,
    )


# each name's runtime factory ("COUNTING": CatBP's other name for COUNT); SAT is bool only
_RUNTIMES: dict[str, Callable[..., VMSemiringRuntime]] = {
    "PROB": vm_prob_semiring,
    "LOGPROB": vm_logprob_semiring,
    "SAT": lambda *dtype: vm_sat_semiring(),
    "COUNT": vm_counting_semiring,
    "COUNTING": vm_counting_semiring,
    "MAXLOG": vm_maxlog_semiring,
}


def make_semiring(name: str, dtype: Any = None) -> VMSemiringRuntime:
    """The runtime for a semiring name ("SAT", "PROB", "LOGPROB", "COUNT", "MAXLOG") and dtype
    (None: the semiring's default)."""
    factory = _RUNTIMES.get(str(name).upper())
    if factory is None:
        raise ValueError(f"unknown semiring {name!r} (known: {', '.join(SEMIRING_NAMES)})")
    return factory() if dtype is None else factory(dtype)


def adapt_semiring(sr: Any) -> VMSemiringRuntime:
    """Our runtime for any semiring runtime object, matched by `.name` and `.dtype`."""
    if isinstance(sr, VMSemiringRuntime):
        return sr
    if isinstance(sr, str):
        return make_semiring(sr)
    name = getattr(sr, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"cannot read a semiring from {sr!r}: it has no .name")
    return make_semiring(name, getattr(sr, "dtype", None))
