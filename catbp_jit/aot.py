"""Ahead of time: plan every bucket, compile every kernel into the disk cache, save the profile.

`catbp-jit aot INPUT [--buckets 1,8,64,512] [--batched-factors ...] -o PROFILE` (cli.py)
runs `compile_ahead`: the plans of every bucket are made first (`kernel_units`, no
compiling), so the number of cold kernels is known and a progress bar can count them
down with an ETA while they compile side by side in worker processes (codegen/workers.py);
then the executable is compiled from the now warm cache and saved. Later, in any process,
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
from .codegen.loader import CompileUnit, dispatcher_unit, load_unit
from .codegen.workers import WorkerOptions, compile_in_workers
from .compiler import compile
from .executable import Executable, adapt_inputs
from .ir.ops import Program
from .ir.schema import TensorSpec
from .plan.pipeline import plan
from .target import get as get_target

if TYPE_CHECKING:
    from .batched import BatchedExecutable


@dataclass(frozen=True)
class AheadReport:
    kernels: int  # distinct kernels (and the dispatcher) the profile needs
    compiled: int  # of those, compiled now (the rest were in the cache already)
    seconds: float
    cache_dir: str
    buckets: tuple[int, ...] | None


def kernel_units(
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
) -> list[CompileUnit]:
    """Every compile unit a profile needs, planned for every bucket, none compiled."""
    progs, sr, fspecs, sspecs, lspecs = adapt_inputs(
        programs, sr, factor_specs, selector_specs, slot_specs, target, "compiled"
    )
    # (programs, factor specs, selector specs, batch key) per plan: unbatched too (a
    # model's solve() runs it)
    plans: list[tuple[list[Program], dict[int, TensorSpec], dict[int, TensorSpec], tuple | None]] = [
        (progs, fspecs, sspecs, None)
    ]
    if batched_factors or batched_selectors or buckets is not None:
        from .batched import DEFAULT_BUCKETS, _buckets, _ids, batch_axis_id, bucket_inputs

        bf, bs = _ids(batched_factors, fspecs, "factor"), _ids(batched_selectors, sspecs, "selector")
        aid = batch_axis_id(progs, list(fspecs.values()) + list(sspecs.values()) + list(lspecs.values()))
        sizes = _buckets(DEFAULT_BUCKETS if buckets is None else buckets)
        plans += [
            (p, f, s, key)
            for _, p, f, s, key in bucket_inputs(progs, fspecs, sspecs, lspecs, bf, bs, aid, sizes)
        ]
    the_target = get_target(target)
    units: dict[str, CompileUnit] = {}
    for bprogs, bfspecs, bsspecs, key in plans:
        schedule = plan(
            bprogs,
            sr,
            bfspecs,
            bsspecs,
            lspecs,
            the_target.plan_options(max_total_bytes=max_total_bytes),
            key,
        ).schedule
        for pattern in schedule.patterns:
            unit = the_target.kernel_unit(pattern)
            units.setdefault(unit.name + unit.identity["source_sha256"], unit)
    if the_target.dispatcher:  # (a GPU has no compiled dispatcher)
        unit = dispatcher_unit()
        units.setdefault(unit.name, unit)
    return list(units.values())


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
) -> tuple[Executable | BatchedExecutable, AheadReport]:
    """Compile every kernel of every bucket into the cache, then the executable (all hits).

    bar(total) -> an object with update(n) and set_postfix_str(text) (a tqdm bar), made
    once the number of cold kernels is known; None shows nothing.
    """
    cache = cache or default_cache()
    t0 = time.perf_counter()
    units = kernel_units(
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
    )
    batched = (
        {"batched_factors": batched_factors, "batched_selectors": batched_selectors, "buckets": buckets}
        if batched_factors or batched_selectors or buckets
        else {}
    )
    if not get_target(target).compiles_in_workers:  # (CUDA: compiling needs the GPU)
        return _compile_ahead_cuda(
            programs,
            sr,
            units,
            factor_specs,
            selector_specs,
            slot_specs,
            batched,
            mode,
            cache,
            max_total_bytes,
            bar,
            t0,
        )
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
    exe = compile(
        programs,
        sr,
        factor_specs=factor_specs,
        selector_specs=selector_specs,
        slot_specs=slot_specs,
        mode=mode,
        cache=cache,
        workers=0,
        max_total_bytes=max_total_bytes,
        **batched,
    )
    report = AheadReport(
        len(units),
        len(cold),
        time.perf_counter() - t0,
        cache.directory,
        tuple(exe.buckets) if hasattr(exe, "buckets") else None,
    )
    return exe, report


def _compile_ahead_cuda(
    programs,
    sr,
    units,
    factor_specs,
    selector_specs,
    slot_specs,
    batched,
    mode,
    cache,
    max_total_bytes,
    bar,
    t0,
):
    """On a GPU, loading a kernel compiles it into the cache (for the device at hand, which
    is part of its key): compile() does it all, one kernel after another (compiling for a
    GPU needs the GPU; no worker processes)."""
    progress = bar(len(units)) if bar is not None else None
    seen = set()

    def said(line: str) -> None:
        if progress is not None and line.startswith("kernel ") and line not in seen:
            seen.add(line)  # (every bucket names its kernels again: count each once)
            progress.set_postfix_str(line.split(": ", 1)[-1], refresh=False)
            progress.update(1)

    exe = compile(
        programs,
        sr,
        factor_specs=factor_specs,
        selector_specs=selector_specs,
        slot_specs=slot_specs,
        mode=mode,
        cache=cache,
        target="cuda",
        max_total_bytes=max_total_bytes,
        progress=said,
        **batched,
    )
    if progress is not None:
        progress.close()
    profiles = exe.profiles.values() if hasattr(exe, "profiles") else [exe]
    compiled = sum(int(p.cache_stats.get("misses", 0)) for p in profiles)  # (a count: an int)
    report = AheadReport(
        len(units),
        min(compiled, len(units)),
        time.perf_counter() - t0,
        cache.directory,
        tuple(exe.buckets) if hasattr(exe, "buckets") else None,
    )
    return exe, report
