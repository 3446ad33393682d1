"""Target: what differs between the machines an executable's kernels run on, asked of one
object (cpu.py, cuda.py; the front end's reference.py) instead of comparing a target's
name wherever it matters.

A target says its planner defaults, renders its kernel units, builds a plan's kernels and
binds a session. It builds no Executable itself: executable.py wraps what `build` returns
(this package imports no executable, batched or session module at import time, so none
of them imports back into a circle through it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan.options import PlanOptions

if TYPE_CHECKING:
    from ..cache import KernelCache
    from ..codegen.loader import CompileUnit, Kernel
    from ..executable import Executable
    from ..plan.pipeline import Plan
    from ..plan.steps import KernelPattern
    from ..session import Session
    from ..tiers import KernelBuild


@dataclass(frozen=True)
class Built:
    """A plan's kernels as a target built them: the fields of an Executable besides its
    plan, mode and target."""

    kernels: list[Kernel]
    dispatcher: Any = None
    dispatcher_source: str = ""
    cache_stats: dict[str, float] = field(default_factory=dict)
    kernel_addresses: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    tier: str = "compiled"
    kernel_build: KernelBuild | None = None
    gather: Any = None  # a GPU's gather kernel (answers copied back in one transfer)


@dataclass(frozen=True)
class Target:
    # the name users pass (compile(..., target="cuda")) and saved files record
    name: str
    # the planner's defaults on this target (PlanOptions' fields), and those it adds in the
    # reassociating mode (exact=False) when no options are given
    plan_defaults: Mapping[str, Any] = field(default_factory=dict)
    reassociating_defaults: Mapping[str, Any] = field(default_factory=dict)
    # GEMM kernels (plan/gemm.py) exist here: a reassociating plan may use them
    gemm: bool = False
    # its kernels copy the leaves a step repacks before reading them (plan/repack.py)
    repack: bool = False
    # its kernels write large outputs with non-temporal stores (abi.STREAMED)
    streaming_stores: bool = False
    # it has the contract_lines kernels: products (and sums across outputs) a cache line
    # at a time in registers
    line_products: bool = False
    # its line kernels and repack steps read a gathered line from its window word
    # (abi.window_words; other kernels would read the word as an offset)
    window_words: bool = False
    # its loop kernels sum a reassociating NORMALIZE's total in lanes (PlanOptions.lane_totals)
    lane_totals: bool = False
    # ... and each output's terms of a reassociating float64 PROB sum (PlanOptions.lane_sums)
    lane_sums: bool = False
    # the front end's mode here when a model does not say (compile_model(exact=None))
    model_exact: bool = True
    # a model's plan (frontend/build.py) takes reassociating_defaults' split_reductions
    # (executable.model_options)
    model_splits: bool = True
    # ... and sums in lanes (PlanOptions.lane_sums; executable.model_options)
    model_lane_sums: bool = True
    # a compiled dispatcher calls the kernels (else they are launched from Python)
    dispatcher: bool = False
    # ... and walks a schedule's tracks side by side (plan/tracks.py)
    tracks: bool = False
    # kernels are machine code of this CPU, whose assembly kernel_asm shows
    assembly: bool = False
    # the numpy tier stands in while kernels compile (tiers.py)
    tiers: bool = False
    # cold kernels compile in worker processes (a GPU's compile in this process)
    compiles_in_workers: bool = False
    # programs compile to kernels (the front end's reference target interprets them)
    compiled: bool = True
    # results stay in device memory until a slot is read (a GPU's session copies back)
    device_results: bool = False
    # Dask workers can run its kernels (catbp_jit.dask: each worker compiles CPU kernels)
    scales_out: bool = False

    def plan_options(self, **fields: Any) -> PlanOptions:
        """The planner's options on this target: its defaults, then `fields`."""
        return PlanOptions(**dict(self.plan_defaults, **fields))

    def kernel_unit(self, pattern: KernelPattern) -> CompileUnit:
        """The kernel of a pattern as rendered for this target (source and identity)."""
        raise NotImplementedError(f"target {self.name!r} renders no kernels")

    def walk_units(self, plan: Plan, mode: str) -> list[CompileUnit]:
        """What a plan's executable compiles in `mode` besides its kernels: what walks the
        schedule when that is compiled code of its own (the CPU's dispatcher, the GPU's
        schedule kernel), and a GPU's gather kernel."""
        return []

    def background(
        self,
        plans: list[Plan],
        cache: KernelCache,
        workers: int | None,
        tier: str | None,
        say: Callable[[str], None],
    ) -> tuple[KernelBuild, dict[str, int]] | None:
        """The kernels of `plans` compiling in the background while the numpy tier stands
        in (and the cache's stats), or None: the caller builds them now."""
        return None

    def build(
        self,
        plan: Plan,
        *,
        mode: str = "compiled",
        cache: KernelCache | None = None,
        progress: Callable[[str], None] | None = None,
        workers: int | None = None,
        tier: str | None = None,
    ) -> Built:
        """The kernels of a plan's schedule, from the disk cache or compiled, and what walks
        the schedule in mode "compiled" (executable.MODES)."""
        raise NotImplementedError(f"target {self.name!r} builds no kernels")

    def bind(self, exe: Executable, **hooks: Any) -> Session:
        """A session of `exe`: its arenas and schedule table, allocated once."""
        raise NotImplementedError(f"target {self.name!r} binds no sessions")

    def bind_buckets(
        self, profiles: Mapping[int, Executable], total: int, dtype: np.dtype, **hooks: Any
    ) -> tuple[np.ndarray, dict[int, Session]]:
        """A session per bucket of a batched executable, all on one (host) arena of `total`
        elements, which is returned with them."""
        raise NotImplementedError(f"target {self.name!r} binds no sessions")
