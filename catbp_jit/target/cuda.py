"""The CUDA target: @cuda.jit kernels (codegen/cuda_build.py) run by a CudaSession
(cuda_session.py): in mode "compiled" one launch of the schedule kernel walks every step
on the device; in mode "loop" each step is launched from Python. Its modules are imported in the methods
only: this one imports without numba-cuda."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .base import Built, Target

if TYPE_CHECKING:
    from ..cache import KernelCache
    from ..codegen.loader import CompileUnit
    from ..executable import Executable
    from ..plan.pipeline import Plan
    from ..plan.steps import KernelPattern
    from ..session import Session


@dataclass(frozen=True)
class CudaTarget(Target):
    def kernel_unit(self, pattern: KernelPattern) -> CompileUnit:
        from ..codegen.loader import cuda_kernel_unit

        return cuda_kernel_unit(pattern)

    def walk_units(self, plan: Plan, mode: str) -> list[CompileUnit]:
        from ..codegen.cuda_schedule import schedule_shapes
        from ..codegen.loader import cuda_gather_unit, cuda_schedule_unit

        patterns = plan.schedule.patterns
        compiled = mode == "compiled" and patterns
        walk = [cuda_schedule_unit(patterns, schedule_shapes(plan.schedule))] if compiled else []
        return walk + [cuda_gather_unit(plan.semiring.dtype.name)]

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
        """Every kernel compiled (or loaded) now, one after another: compiling for a GPU
        needs the GPU, so there are no workers and no numpy tier. Mode "compiled" adds the
        schedule kernel (one launch runs every step: the dispatcher's part on this target);
        mode "loop" launches each step's kernels from Python."""
        from ..codegen.cuda_build import build_cuda

        kernels, walk, walk_source, gather, stats = build_cuda(
            plan, mode=mode, cache=cache, progress=progress
        )
        return Built(kernels, walk, walk_source, stats, np.zeros(0, np.int64), gather=gather)

    def bind(self, exe: Executable, **hooks: Any) -> Session:
        from ..cuda_session import CudaSession

        return CudaSession(exe, **hooks)

    def bind_buckets(
        self, profiles: Mapping[int, Executable], total: int, dtype: np.dtype, **hooks: Any
    ) -> tuple[np.ndarray, dict[int, Session]]:
        from ..cuda_session import CudaSession, host_and_device_arenas

        arenas = host_and_device_arenas(total, dtype)  # shared by every bucket
        return arenas[0], {b: CudaSession(p, arenas=arenas, **hooks) for b, p in profiles.items()}


# A GPU thread sums one output element: the CPU's vector across outputs buys it nothing,
# and one vector for every reduction keeps its kernels half as many. 256-byte regions:
# what a GPU's loads coalesce best on. Reassociating, a sum of few outputs is split into
# partials (plan/split.py) so that it has threads to run on; the CPU splits alike, and
# gives the same bits, under the same options.
CUDA = CudaTarget(
    "cuda",
    plan_defaults={
        "align_bytes": 256,
        "gemm": False,
        "across": "reduced",
        "repack": False,
        "streaming_store_bytes": None,
    },
    reassociating_defaults={"split_reductions": True},
    device_results=True,
)
