"""Ahead of time: plan every bucket, compile every kernel into the disk cache, save the profile.

`catbp-jit aot INPUT [--buckets 1,8,64,512] [--batched-factors ...] -o PROFILE` (cli.py)
runs `compile_ahead`: the plans of every bucket are made first, once (`ahead_plans`), and
their compile units listed (`units_of`, no compiling), so the number of cold kernels is
known and a progress bar can count them down with an ETA while they compile side by side
in worker processes (codegen/workers.py); then the executable is built from the same
plans and the now warm cache, and saved. Later, in any process,
`catbp_jit.load(PROFILE)` plans again and takes every kernel from the cache: under
`CATBP_JIT_CACHE=strict` a kernel that was not compiled ahead is an error, so a run that
succeeds there proves the profile covered it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .cache import KernelCache, default_cache
from .codegen.loader import CompileUnit, load_unit
from .codegen.workers import WorkerOptions, compile_in_workers
from .executable import Executable, adapt_inputs, build, plan_options
from .plan.options import PlanOptions
from .plan.pipeline import Plan, plan
from .target import get as get_target

if TYPE_CHECKING:
    from .batched import BatchedExecutable, BatchedPlan


@dataclass(frozen=True)
class AheadReport:
    kernels: int  # distinct kernels (and the dispatcher) the profile needs
    compiled: int  # of those, compiled now (the rest were in the cache already)
    seconds: float
    cache_dir: str
    buckets: tuple[int, ...] | None


@dataclass(frozen=True)
class AheadPlans:
    """What compile_ahead plans, once: the executable's plan (or its buckets' plans), and
    every plan whose kernels the profile needs (the unbatched one too: a model's solve()
    runs it)."""

    single: Plan | None
    batched: BatchedPlan | None
    needed: list[Plan]


def ahead_plans(
    programs: Any,
    sr: Any,
    *,
    factor_specs: Mapping[int, Any],
    selector_specs: Mapping[int, Any] | None = None,
    slot_specs: Mapping[Any, Any] | None = None,
    batched_factors: Any = (),
    batched_selectors: Any = (),
    buckets: Any | None = None,
    max_total_bytes: int | None = None,
    target: str = "cpu",
    mode: str = "compiled",
    exact: bool | None = None,
    options: PlanOptions | None = None,
) -> AheadPlans:
    """Every plan of a profile, as compile() would make them (exact: its mode; None, the
    target's default; options: compile()'s, a model's those of executable.model_options),
    none compiled."""
    from .batched import plan_batched

    adapted = adapt_inputs(programs, sr, factor_specs, selector_specs, slot_specs, target, mode)
    options = plan_options(target, options, max_total_bytes=max_total_bytes, exact=exact)
    unbatched = plan(*adapted, options)
    if not (batched_factors or batched_selectors or buckets is not None):
        return AheadPlans(unbatched, None, [unbatched])
    bplan = plan_batched(
        *adapted,
        batched_factors=batched_factors or (),
        batched_selectors=batched_selectors or (),
        buckets=buckets,
        options=options,
    )
    return AheadPlans(None, bplan, [unbatched, *bplan.plans.values()])


def units_of(plans: list[Plan], target: str = "cpu", mode: str = "compiled") -> list[CompileUnit]:
    """The distinct compile units of the plans: every kernel, and what walks each schedule
    (the CPU's dispatcher, the GPU's schedule kernel)."""
    the_target = get_target(target)
    units: dict[str, CompileUnit] = {}
    for the_plan in plans:
        for pattern in the_plan.schedule.patterns:
            unit = the_target.kernel_unit(pattern)
            units.setdefault(unit.name + unit.identity["source_sha256"], unit)
        for unit in the_target.walk_units(the_plan, mode):
            units.setdefault(unit.name + unit.identity["source_sha256"], unit)
    return list(units.values())


def kernel_units(programs: Any, sr: Any, *, target: str = "cpu", **inputs: Any) -> list[CompileUnit]:
    """Every compile unit a profile needs, planned for every bucket, none compiled (the
    arguments are ahead_plans')."""
    return units_of(ahead_plans(programs, sr, target=target, **inputs).needed, target)


def compile_ahead(
    programs: Any,
    sr: Any,
    *,
    factor_specs: Mapping[int, Any],
    selector_specs: Mapping[int, Any] | None = None,
    slot_specs: Mapping[Any, Any] | None = None,
    batched_factors: Any = (),
    batched_selectors: Any = (),
    buckets: Any | None = None,
    mode: str = "compiled",
    cache: KernelCache | None = None,
    workers: int | None = None,
    max_total_bytes: int | None = None,
    target: str = "cpu",
    bar: Callable[[int], Any] | None = None,
    exact: bool | None = None,
    options: PlanOptions | None = None,
) -> tuple[Executable | BatchedExecutable, AheadReport]:
    """Compile every kernel of every bucket into the cache, then the executable (all hits).
    exact: the mode (None: compile()'s default; a model's profile passes the mode
    compile_model runs it in on its target, and its options).

    bar(total) -> an object with update(n) and set_postfix_str(text) (a tqdm bar), made
    once the number of cold kernels is known; None shows nothing.
    """
    cache = cache or default_cache()
    t0 = time.perf_counter()
    plans = ahead_plans(
        programs,
        sr,
        factor_specs=factor_specs,
        selector_specs=selector_specs,
        slot_specs=slot_specs,
        batched_factors=batched_factors,
        batched_selectors=batched_selectors,
        buckets=buckets,
        max_total_bytes=max_total_bytes,
        target=target,
        mode=mode,
        exact=exact,
        options=options,
    )
    units = units_of(plans.needed, target, mode)
    if not get_target(target).compiles_in_workers:  # (CUDA: compiling needs the GPU)
        return _compile_ahead_cuda(plans, units, mode, cache, bar, t0)
    cold = [u for u in units if cache.check(u.identity, u.source)[0] != "ok"]
    progress = bar(len(cold)) if bar is not None else None

    def done(unit: CompileUnit, seconds: float = 0.0, in_worker: bool = False) -> None:
        if progress is not None:
            progress.set_postfix_str(f"{unit.name} {seconds:.1f} s", refresh=False)
            progress.update(1)

    n_workers = WorkerOptions.resolve(workers).pool_size(len(cold))
    if cold and n_workers and cache.policy == "fallback" and not cache.bypassed:
        compile_in_workers(cold, cache, n_workers, done)
    else:
        for unit in cold:
            started = time.perf_counter()
            load_unit(unit, cache)
            done(unit, time.perf_counter() - started)
    if progress is not None:
        progress.close()
    exe = build_planned(plans, target, mode, cache)
    report = AheadReport(
        len(units),
        len(cold),
        time.perf_counter() - t0,
        cache.directory,
        tuple(exe.buckets) if hasattr(exe, "buckets") else None,
    )
    return exe, report


def build_planned(
    plans: AheadPlans,
    target: str,
    mode: str,
    cache: KernelCache,
    progress: Callable[[str], None] | None = None,
) -> Executable | BatchedExecutable:
    """The executable of plans already made, its kernels from the cache (or compiled)."""
    from .batched import build_batched

    if plans.batched is not None:
        return build_batched(
            plans.batched,
            target=target,
            mode=mode,
            cache=cache,
            progress=progress,
            workers=0,
            tier="compiled",
        )
    assert plans.single is not None  # (ahead_plans makes one or the other)
    return build(
        plans.single, target=target, mode=mode, cache=cache, progress=progress, workers=0, tier="compiled"
    )


def _compile_ahead_cuda(
    plans: AheadPlans,
    units: list[CompileUnit],
    mode: str,
    cache: KernelCache,
    bar: Callable[[int], Any] | None,
    t0: float,
) -> tuple[Executable | BatchedExecutable, AheadReport]:
    """On a GPU, loading a kernel compiles it into the cache (for the device at hand, which
    is part of its key): building does it all, one kernel after another (compiling for a
    GPU needs the GPU; no worker processes)."""
    progress = bar(len(units)) if bar is not None else None
    seen = set()

    def said(line: str) -> None:
        counted = line.startswith(("kernel ", "schedule kernel"))
        if progress is not None and counted and line not in seen:
            seen.add(line)  # (every bucket names its kernels again: count each once)
            progress.set_postfix_str(line.split(": ", 1)[-1], refresh=False)
            progress.update(1)

    built = []
    if plans.batched is not None:  # the unbatched plan's kernels too (a model's solve())
        built.append(build(plans.needed[0], target="cuda", mode=mode, cache=cache, progress=said))
    exe = build_planned(plans, "cuda", mode, cache, said)
    if progress is not None:
        progress.close()
    profiles = built + list(exe.profiles.values() if hasattr(exe, "profiles") else [exe])
    compiled = sum(int(p.cache_stats.get("misses", 0)) for p in profiles)  # (a count: an int)
    report = AheadReport(
        len(units),
        min(compiled, len(units)),
        time.perf_counter() - t0,
        cache.directory,
        tuple(exe.buckets) if hasattr(exe, "buckets") else None,
    )
    return exe, report
