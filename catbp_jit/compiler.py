"""compile() and load(): programs (or a saved file) -> an Executable, or with batched
inputs a BatchedExecutable (batched.py). They live apart from executable.py because
batched.py builds on it: executable.py imports nothing of batched.py, so neither imports
the other back.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from .batched import BatchedExecutable, build_batched, compile_batched, plan_batched
from .cache import KernelCache
from .codegen.loader import identity_digest
from .errors import ProgramKeyError, ProgramValueError
from .executable import (
    MODES,
    TARGETS,
    Executable,
    adapt_inputs,
    build,
    get_target,
    plan_options,
    static_inputs,
)
from .ir.batch import BatchedCompileError
from .ir.validate import DEFAULT_MAX_BYTES
from .plan.options import PlanOptions
from .plan.pipeline import plan as plan_adapted
from .saved import SavedExecutableError, check_saved_kernels, read_saved


def load(
    path: str | os.PathLike, *, cache: KernelCache | None = None, tier: str | None = None
) -> Executable | BatchedExecutable:
    """The Executable (or BatchedExecutable) saved at `path` by its save(), planned again
    and checked against the kernels it was saved with (saved.py). A file that is not one
    raises SavedExecutableError naming the file and the field; a missing file
    FileNotFoundError."""
    saved = read_saved(path, TARGETS, MODES)
    target, mode, where = saved.target, saved.mode, saved.where
    options = plan_options(target, None, exact=saved.exact).with_(  # as saved, whatever the defaults
        split_reductions=saved.split_reductions,
        split_min_terms=saved.split_min_terms,
        split_outputs_below=saved.split_outputs_below,
        lane_sums=saved.lane_sums,
    )
    try:  # programs that do not check (a register read before it is written...): edited
        adapted = adapt_inputs(
            saved.programs, saved.sr, saved.factor_specs, saved.selector_specs, saved.slot_specs, target, mode
        )
        if saved.batched:
            bplan = plan_batched(*adapted, options=options, **saved.batched)
            plans = list(bplan.plans.values())
        else:
            plans = [plan_adapted(*adapted, options, static=saved.static)]
    except (ProgramValueError, ProgramKeyError, BatchedCompileError) as e:
        raise SavedExecutableError(f"{where}: {e}") from None
    if saved.kernel_identities is not None:  # (files saved before identities: unchecked)
        unit = get_target(target).kernel_unit
        planned = {identity_digest(unit(p).identity) for pl in plans for p in pl.schedule.patterns}
        check_saved_kernels(where, saved.kernel_identities, planned)
    if saved.batched:
        return build_batched(bplan, target=target, mode=mode, cache=cache, tier=tier)
    return build(plans[0], target=target, mode=mode, cache=cache, tier=tier)


def compile(
    programs: Any,
    sr: Any,
    *,
    factor_specs: Mapping[int, Any],
    selector_specs: Mapping[int, Any] | None = None,
    slot_specs: Mapping[Any, Any] | None = None,
    target: str = "cpu",
    mode: str = "compiled",
    cache: KernelCache | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_total_bytes: int | None = None,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    batched_factors: Any | None = None,
    batched_selectors: Any | None = None,
    buckets: Any | None = None,
    options: PlanOptions | None = None,
    static_factors: Any | None = None,
    static_selectors: Any | None = None,
    exact: bool | None = None,
    tier: str | None = None,
) -> Executable | BatchedExecutable:
    """Plan, lower and compile linked programs for inputs of the given specs.

    programs: one program or a list run in order with slots carried over (upward,
    downward, finalize), as our IR or any CatBP-like objects. slot_specs: slots that
    exist before the first program (handed to Session.run(slots=...)). max_bytes: the
    limit for one tensor; max_total_bytes: for all arenas together (default
    catbp_jit.memory.memory_limit(): CATBP_JIT_MAX_BYTES, else the available memory); a
    plan over it raises PlanTooLargeError before any kernel is compiled. progress: called
    with a line of text at each planning stage (and now and then in long ones), before
    each kernel is loaded (a cold one takes seconds to compile) and as each is compiled in
    a worker (catbp_jit.progress.DelayedLines shows them only when compiling is slow).
    workers: processes that compile cold kernels side by side (default:
    $CATBP_JIT_COMPILE_WORKERS, else the number of CPUs; 0 or 1: in this process).

    batched_factors / batched_selectors: ids of inputs that get a leading batch axis;
    then the result is a BatchedExecutable with one plan per batch size in `buckets`
    (default (1, 8, 64, 512)), see batched.py.

    options: the planner's knobs (plan/options.py; default the target's, catbp_jit/target/);
    max_bytes, max_total_bytes and exact, when given, override its fields of those names.

    exact: True (the default) evaluates every product and sum in the order the programs
    wrote (the same bits in every mode and thread count); False lets the planner regroup
    them as the semiring laws allow (contraction paths, BLAS GEMM on the CPU): float
    results then agree with the reference within the tolerances of docs/ir.md, not bit for bit.

    static_factors / static_selectors: ids of inputs whose values stay fixed until a run
    gives them again; the segments computed from them alone run only then (partial
    evaluation, plan/static.py and Session.run). Not with batched inputs.

    tier: "auto" (the default, or $CATBP_JIT_TIER) returns at once when kernels are cold
    and numpy can stand in for them: the first runs compute the same bits in numpy while
    worker processes compile the kernels, and later runs use them (tiers.py; `exe.tier`,
    `exe.wait()`). "compiled" waits for every kernel here.
    """
    options = plan_options(target, options, max_bytes, max_total_bytes, exact)
    static = static_inputs(static_factors, static_selectors)
    if batched_factors or batched_selectors or buckets is not None:
        if static:
            raise BatchedCompileError(
                "static_factors / static_selectors are not supported with batched inputs "
                "(a batched executable already computes its unbatched inputs' segments once "
                "per run, for every row); compile without batching to declare static inputs"
            )
        return compile_batched(
            programs,
            sr,
            factor_specs=factor_specs,
            selector_specs=selector_specs,
            slot_specs=slot_specs,
            target=target,
            mode=mode,
            cache=cache,
            max_bytes=max_bytes,
            max_total_bytes=max_total_bytes,
            progress=progress,
            workers=workers,
            batched_factors=batched_factors or (),
            batched_selectors=batched_selectors or (),
            buckets=buckets,
            options=options,
            tier=tier,
        )
    the_plan = plan_adapted(
        *adapt_inputs(programs, sr, factor_specs, selector_specs, slot_specs, target, mode),
        options,
        static=static,
        progress=progress,
    )
    return build(
        the_plan, target=target, mode=mode, cache=cache, progress=progress, workers=workers, tier=tier
    )
