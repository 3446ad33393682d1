"""The CPU target's kernels for a plan (the CUDA target's: cuda_build.py): loaded from the
disk cache, the cold ones compiled first, side by side in worker processes where there are
CPUs for it; or, when the numpy tier can stand in (tiers.py), compiled in the background
while the executable starts without them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cache import KernelCache
from ..numpy_steps import interpretable
from ..plan.pipeline import Plan
from ..tiers import KernelBuild, numpy_tier_fits, resolve_tier, start_build
from .loader import CompileUnit, Kernel, dispatcher_unit, kernel_unit, load_dispatcher, load_kernel
from .workers import WorkerOptions, available_cpus, compile_in_workers


@dataclass(frozen=True)
class CpuKernels:
    """What an Executable of the compiled tier runs with."""

    kernels: list[Kernel]  # one per pattern of the schedule, in its order
    dispatcher: Any  # the compiled dispatcher (compiled mode calls it once a run, loop mode once a step)
    dispatcher_source: str
    cache_stats: dict[str, float]  # hits, misses, compiled... of this build
    addresses: np.ndarray  # the kernels' entry addresses, as the dispatcher takes them


def _status(cache: KernelCache, unit: CompileUnit) -> str:
    """The unit's cache status (KernelCache.check), "ok" without a look at the disk when
    this process has it loaded already."""
    return "ok" if cache.in_memory(unit.identity, unit.source) else cache.check(unit.identity, unit.source)[0]


def background_build(
    plans: list[Plan], cache: KernelCache, workers: int | None, tier: str | None, say: Callable[[str], None]
) -> tuple[KernelBuild, dict[str, int]] | None:
    """(a KernelBuild of the plans' cold kernels, cache stats) when their executables
    should start in the numpy tier (tiers.py), else None: compile() then waits. The first
    plan is the one whose size decides (a batched executable's smallest bucket: numpy's
    cost per row)."""
    if resolve_tier(tier) != "auto" or cache.policy != "fallback":
        return None
    if not all(interpretable(p) for p in plans) or not numpy_tier_fits(plans[0]):
        return None
    n_workers = min(WorkerOptions.resolve(workers).workers, available_cpus())
    if n_workers < 1:  # 0: no worker processes wanted; compile here, and wait
        return None
    patterns = sorted({p for plan in plans for p in plan.schedule.patterns}, key=lambda p: p.name)
    rendered = {p: kernel_unit(p) for p in patterns}  # (rendered once, loaded from these)
    units = [*rendered.values(), dispatcher_unit()]
    cold = [u for u in units if _status(cache, u) != "ok"]
    # the slow ones first, so that no worker is left with one at the end: a kernel's
    # compile time grows with its source (PROB: 7.8k characters 1.2 s, 12.2k 2.5 s), the
    # dispatcher's (15k, ~1.2 s) and the repack kernels' (3k, ~0.4 s) come last
    cold.sort(key=lambda u: (u.name.startswith("repack_"), u.name == "dispatcher", -len(u.source)))
    if not cold or cache.bypassed:  # (workers hand kernels over through the disk only)
        return None
    stats = {
        "hits": len(units) - len(cold),
        "misses": len(cold),
        "compiled": 0,
        "compiled_in_background": len(cold),
    }
    return start_build(rendered, units[-1], cold, cache, min(n_workers, len(cold)), say), stats


def load_cpu_kernels(
    plan: Plan, cache: KernelCache, say: Callable[[str], None], workers: int | None
) -> CpuKernels:
    """The compiled tier at once: every kernel loaded, compiled first where cold."""
    schedule = plan.schedule
    before = dict(cache.stats)
    rendered = {p: kernel_unit(p) for p in schedule.patterns}  # each unit rendered once
    dispatcher_u = dispatcher_unit()
    units = [*rendered.values(), dispatcher_u]
    in_workers = _compile_cold_in_workers(units, cache, WorkerOptions.resolve(workers), say)
    kernels = []
    for i, pattern in enumerate(schedule.patterns):
        say(f"kernel {i + 1}/{len(schedule.patterns)}: {pattern.name}")
        kernels.append(load_kernel(pattern, cache, rendered[pattern]))
    # (both modes call the dispatcher: loop mode once a step, from a Python loop)
    say("dispatcher")
    dispatcher, dsource = load_dispatcher(cache, dispatcher_u)
    used: dict[str, float] = {k: cache.stats.get(k, 0) - before.get(k, 0) for k in cache.stats}
    if in_workers:  # what workers compiled was a miss, though this process found it on disk
        used.update(
            hits=used["hits"] - in_workers, misses=used["misses"] + in_workers, compiled_in_workers=in_workers
        )
    addresses = np.array([k.address for k in kernels], dtype=np.int64)
    return CpuKernels(kernels, dispatcher, dsource, used, addresses)


def _compile_cold_in_workers(
    units: list[CompileUnit], cache: KernelCache, options: WorkerOptions, say: Callable[[str], None]
) -> int:
    """Compile the cold kernels (and dispatcher) of a schedule side by side, in this
    process and worker processes, into the disk cache, when two or more are cold and two
    or more CPUs are there to run them; the caller then loads everything from disk (or
    memory). The number the workers compiled."""
    if cache.policy != "fallback":  # strict compiles nothing; off has no disk to share
        return 0
    # (a "busy" kernel, its lock held by a stalled process, is compiled here in memory)
    cold = [u for u in units if _status(cache, u) not in ("ok", "busy")]
    n_workers = options.pool_size(len(cold))
    if not n_workers or cache.bypassed:  # workers share kernels through the disk only
        return 0
    say(f"compiling {len(cold)} cold kernels in {n_workers} processes")
    return compile_in_workers(
        cold,
        cache,
        n_workers,
        lambda unit, seconds, in_worker: say(
            f"compiled {unit.name} in {seconds:.1f} s{' in a worker' if in_worker else ''}"
        ),
    )
