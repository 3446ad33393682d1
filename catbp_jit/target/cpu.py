"""The CPU target: @njit kernels, loaded from the disk cache or compiled in worker
processes (codegen/cpu_build.py), called through a compiled dispatcher; the numpy tier
stands in while cold ones compile (tiers.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..plan.options import ALIGN_BYTES
from .base import Built, Target

if TYPE_CHECKING:
    from ..cache import KernelCache
    from ..codegen.loader import CompileUnit
    from ..executable import Executable
    from ..plan.pipeline import Plan
    from ..plan.steps import KernelPattern
    from ..session import Session
    from ..tiers import KernelBuild


@dataclass(frozen=True)
class CpuTarget(Target):
    def kernel_unit(self, pattern: KernelPattern) -> CompileUnit:
        from ..codegen.loader import kernel_unit

        return kernel_unit(pattern)

    def walk_units(self, plan: Plan, mode: str) -> list[CompileUnit]:
        from ..codegen.loader import dispatcher_unit

        return [dispatcher_unit()]  # (one for every plan; built in both modes)

    def background(
        self,
        plans: list[Plan],
        cache: KernelCache,
        workers: int | None,
        tier: str | None,
        say: Callable[[str], None],
    ) -> tuple[KernelBuild, dict[str, int]] | None:
        from ..codegen.cpu_build import background_build

        return background_build(plans, cache, workers, tier, say)

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
        from ..cache import default_cache
        from ..codegen.cpu_build import load_cpu_kernels

        cache = cache or default_cache()
        say = progress or (lambda line: None)
        background = self.background([plan], cache, workers, tier, say)
        if background is not None:
            build_, stats = background
            return Built([], cache_stats=dict(stats), tier="numpy", kernel_build=build_)
        built = load_cpu_kernels(plan, cache, say, workers)
        return Built(
            built.kernels, built.dispatcher, built.dispatcher_source, built.cache_stats, built.addresses
        )

    def bind(self, exe: Executable, **hooks: Any) -> Session:
        from ..session import Session

        return Session(exe, **hooks)

    def bind_buckets(
        self, profiles: Mapping[int, Executable], total: int, dtype: np.dtype, **hooks: Any
    ) -> tuple[np.ndarray, dict[int, Session]]:
        from ..session import Session, aligned_empty

        mem = aligned_empty(total, dtype)  # shared by every bucket
        return mem, {b: Session(p, mem=mem, **hooks) for b, p in profiles.items()}


CPU = CpuTarget(
    "cpu",
    plan_defaults={"align_bytes": ALIGN_BYTES, "gemm": True},
    reassociating_defaults={"split_reductions": True, "split_outputs_below": 8, "split_min_terms": 1 << 20},
    gemm=True,
    repack=True,
    streaming_stores=True,
    line_products=True,
    window_words=True,
    lane_totals=True,
    lane_sums=True,
    model_exact=False,
    # a model's reassociating answers stay within 1e-12 of exact mode's (docs/frontend.md),
    # which a split sum can exceed (Grids_11's 2^24-term total: log Z 4.1e-12 away)
    model_splits=False,
    # ... as a sum in lanes can (Grids_11's 2^24-term total: log Z 3.4e-12 away)
    model_lane_sums=False,
    dispatcher=True,
    tracks=True,
    assembly=True,
    tiers=True,
    compiles_in_workers=True,
    scales_out=True,
)
