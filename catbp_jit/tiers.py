"""Tiers: answers from the first run while the kernels compile in the background.

A CPU executable computes its steps in one of two tiers, over the same buffer and table:

- `numpy` (numpy_steps.py): nothing to compile, the kernels' very bits, slower;
- `compiled`: the Numba kernels (codegen/cpu.py), from the disk cache or compiled.

`compile(..., tier="auto")`, the default, returns at once when some kernel is cold: its
sessions run in the numpy tier while a thread of this process has the cold kernels
compiled by worker processes into the disk cache (codegen/workers.compile_detached) and
then loads them; a session takes them at the start of its next run. `tier="compiled"`
(or CATBP_JIT_TIER=compiled) waits for the kernels inside compile(), as a benchmark wants.

The numpy tier is used only where it is a sure gain: the CPU target, the `fallback`
cache policy (`strict` compiles nothing and `off` has no disk for workers to share),
exact plans (the reassociating mode's GEMM steps sum in BLAS's order) and programs small
and short enough for numpy (NUMPY_TIER_MAX_WORK, NUMPY_TIER_MAX_STEPS). Otherwise
compile() waits, as before.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from . import environment
from .environment import TIERS
from .numpy_steps import interpretable
from .plan.pipeline import Plan
from .semiring import semiring

# About a second of numpy per run (products and in-order sums run at some 10^7 terms a
# second here; LOGPROB's C-library exp at some 10^6): a bigger program waits for kernels.
NUMPY_TIER_MAX_WORK = 1 << 24
LOGPROB_MAX_WORK = 1 << 20
# A step costs numpy ~0.2 ms to set up and ~20 us a run whatever its size: a chain of
# 10^4 variables (5 * 10^4 steps) took 12 s to its first answer, more than its kernels
# take to compile. Longer programs wait for their kernels.
NUMPY_TIER_MAX_STEPS = 1 << 14

log = logging.getLogger("catbp_jit.tiers")


class TierError(ValueError):
    """A tier that is not one of TIERS."""


def resolve_tier(tier: str | None = None) -> str:
    """`tier` if given, else $CATBP_JIT_TIER, else "auto"."""
    if tier is None:
        return environment.tier() or "auto"
    if tier not in TIERS:
        raise TierError(f"tier must be one of {', '.join(TIERS)}, not {tier!r}")
    return tier


def numpy_tier_fits(plan: Plan) -> bool:
    """Whether numpy can run the plan's steps, and in about a second."""
    if not interpretable(plan):
        return False
    if len(plan.schedule.steps) > NUMPY_TIER_MAX_STEPS:
        return False
    work = sum(st.work for st in plan.schedule.steps)
    limit = LOGPROB_MAX_WORK if semiring(plan.semiring.name).is_log else NUMPY_TIER_MAX_WORK
    return work <= limit


class KernelBuild:
    """The kernels of some patterns, compiled and loaded on a thread of this process:
    `result` holds them (pattern -> Kernel, and the dispatcher) once `done` is set, or
    `error` says why not. One build serves every executable it was started for (a
    batched executable's buckets share their kernels)."""

    def __init__(self, compile_cold: Callable[[], None], load: Callable[[], tuple]):
        self.done = threading.Event()
        self.result: tuple | None = None
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.seconds: float | None = None

        def work() -> None:
            try:
                compile_cold()
                self.result = load()
            except BaseException as e:  # kept for the sessions, which stay in the numpy tier
                self.error = e
            self.seconds = time.perf_counter() - self.started
            self.done.set()

        self._thread = threading.Thread(target=work, name="catbp_jit kernels", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        return self.done.wait(timeout)


def start_build(
    rendered: Mapping, dispatcher: Any, cold: list, cache, n_workers: int, say: Callable[[str], None]
) -> KernelBuild:
    """A KernelBuild of the `rendered` kernels ({pattern: its unit}) and the dispatcher's
    unit, whose `cold` units compile in n_workers worker processes first."""
    from .codegen.loader import load_dispatcher, load_kernel
    from .codegen.workers import compile_detached

    def compile_cold() -> None:
        say(f"compiling {len(cold)} kernels in {n_workers} background processes")
        compile_detached(
            cold,
            cache,
            n_workers,
            lambda unit, seconds: say(f"compiled {unit.name} in {seconds:.1f} s in a worker"),
        )

    def load() -> tuple:
        kernels: dict = {p: load_kernel(p, cache, unit) for p, unit in rendered.items()}
        return kernels, load_dispatcher(cache, dispatcher)

    return KernelBuild(compile_cold, load)


def report_failure(build: KernelBuild, what: str) -> None:
    """Say once, as a warning, that the kernels of `what` will not come: its sessions go
    on in the numpy tier (the same answers, more slowly)."""
    warnings.warn(
        f"{what}: its kernels failed to compile in the background, so it keeps "
        f"running in the numpy tier (the same results, slower): {build.error}",
        RuntimeWarning,
        stacklevel=3,
    )
    log.warning("kernels failed for %s: %s", what, build.error)
