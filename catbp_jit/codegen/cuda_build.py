"""build(plan, target="cuda"): a plan's kernels rendered by codegen/cuda.py, and in mode
"compiled" its schedule kernel (codegen/cuda_schedule.py: every step in one launch),
loaded through the kernel cache.

A CUDA kernel's cache identity is its pattern, its source's digest and the device it is
compiled for (compute capability, or "simulator"), so a cache shared by machines with
different GPUs never hands one the other's code. Under the strict policy a kernel not in
the cache is refused, as on the CPU.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..cache import CacheMissError, KernelCache, default_cache
from ..errors import CudaScheduleWarning, CudaUnavailableError
from ..plan.pipeline import Plan
from ..plan.steps import KernelPattern
from .cuda_schedule import schedule_shapes
from .loader import Kernel, cuda_gather_unit, cuda_kernel_unit, cuda_schedule_unit

INSTALL_HINT = "pip install -e '.[cuda]' (or pip install numba-cuda)"


def cuda_module():
    """numba.cuda, once we know it can run kernels here; else CudaUnavailableError naming
    what is missing."""
    try:
        import numba_cuda  # noqa: F401  (the maintained CUDA target; numba's own is gone)
        from numba import cuda
    except ImportError as e:
        raise CudaUnavailableError(
            f"target 'cuda' needs the numba-cuda package, which is not installed ({e}); {INSTALL_HINT}"
        ) from None
    if cuda.is_available():  # (always true under the simulator, NUMBA_ENABLE_CUDASIM=1)
        _check_lowering()
        return cuda
    try:
        cuda.detect()  # says why on stdout; its reason is what we want in the error
    except Exception as e:  # the driver raises when it is missing or broken
        why = f"{type(e).__name__}: {' '.join(str(e).split())}"  # one line
    else:
        why = "numba.cuda.is_available() is False"
    raise CudaUnavailableError(
        f"target 'cuda' needs an NVIDIA GPU with a working driver, and none can be used "
        f"here ({why}); NUMBA_ENABLE_CUDASIM=1 runs the CUDA kernels in Numba's simulator "
        f"(slow: for tests), or use target 'cpu'"
    )


def _check_lowering() -> None:
    """Import the CUDA target's lowering now, which numba-cuda imports only when it compiles
    the first kernel: a numba-cuda that does not support the installed numpy fails there
    (numba-cuda 0.30.4 with numpy 2.5: `np.row_stack` is gone), and that is better said
    here, by name, than as an AttributeError from deep inside a kernel's compilation."""
    from numba import config

    # (the ignore: numba.core.config makes its settings at import time, from the environment)
    if config.ENABLE_CUDASIM:  # type: ignore[attr-defined]  # the simulator: no lowering
        return
    try:
        import numba.cuda.cudaimpl  # noqa: F401
    except ModuleNotFoundError:  # another layout of numba-cuda: its first compile will tell
        return
    except Exception as e:
        import numba_cuda

        version = getattr(numba_cuda, "__version__", "?")
        raise CudaUnavailableError(
            f"target 'cuda': numba-cuda {version} cannot compile kernels with numpy "
            f"{np.__version__} ({type(e).__name__}: {' '.join(str(e).split())}); install a "
            f"numba-cuda release that supports this numpy, or a numpy it supports"
        ) from None


def device_name(cuda) -> str:
    """What compiled CUDA code depends on besides its source: the simulator, or the
    device's compute capability."""
    from numba import config

    if config.ENABLE_CUDASIM:  # type: ignore[attr-defined]  # (as in _check_lowering)
        return "simulator"
    major, minor = cuda.get_current_device().compute_capability
    return f"sm_{major}{minor}"


@dataclass
class CudaKernel(Kernel):
    normalize: Any = None  # the NORMALIZE entry (patterns that normalize), else None


def signature(dtype: str) -> str:
    """The one signature of every step's entry: (arena, table, parameter offset)."""
    return f"(Array({dtype}, 1, 'C'), Array(int64, 1, 'C'), int64)"


def schedule_signature(dtype: str) -> str:
    """The schedule kernel's: (arena, table, barriers, first row, last row)."""
    return f"(Array({dtype}, 1, 'C'), Array(int64, 1, 'C'), Array(int64, 1, 'C'), int64, int64)"


def _refuse_compiled(name: str, key: str, cache: KernelCache, *fns: Any) -> None:
    """numba-cuda loads its compiled code itself (our load hooks pin CPU dispatchers
    only): a signature it had to compile is a miss the strict policy forbids."""
    if cache.policy != "strict":
        return
    if sum(sum(getattr(fn, "_cache_misses", {}).values()) for fn in fns if fn is not None):
        raise CacheMissError(
            f"CUDA kernel {name} (key {key}): compiled, not found in {cache.directory!r}; "
            f"policy 'strict' forbids compiling"
        )


def load_cuda_kernel(pattern: KernelPattern, cache: KernelCache, device: str, simulated: bool) -> CudaKernel:
    from . import cuda as render

    unit = cuda_kernel_unit(pattern)
    identity = dict(unit.identity, device=device)
    # the simulator compiles nothing (it runs the Python); on a GPU, compile now, under the
    # kernel's lock, so the cache records the compiled files with the source
    sigs = None if simulated else [signature(pattern.dtype)]
    entry = cache.get(identity, unit.source, render.ENTRY, signatures=sigs, target="cuda")
    normalize = None
    if pattern.normalize:
        normalize = cache.get(identity, unit.source, render.NORMALIZE_ENTRY, signatures=sigs, target="cuda")
    key = cache.key_for(identity, "cuda")
    _refuse_compiled(pattern.name, key, cache, entry, normalize)
    return CudaKernel(pattern, key, unit.source, entry, 0, unit.identity, normalize)


def load_schedule_kernel(
    patterns: list[KernelPattern], shapes, cache: KernelCache, device: str, simulated: bool
) -> tuple[Any, str]:
    """The schedule kernel of a kernel set (patterns by kernel id), its device functions
    specialized on each kernel id's step shapes (cuda_schedule.schedule_shapes), and its
    source."""
    unit = cuda_schedule_unit(patterns, shapes)
    identity = dict(unit.identity, device=device)
    sigs = None if simulated else [schedule_signature(patterns[0].dtype)]
    entry = cache.get(identity, unit.source, unit.entry, signatures=sigs, target="cuda")
    _refuse_compiled("schedule", cache.key_for(identity, "cuda"), cache, entry)
    return entry, unit.source


def load_gather_kernel(dtype: str, cache: KernelCache, device: str, simulated: bool) -> Any:
    """The gather kernel for an arena of `dtype` (codegen/cuda_gather.py)."""
    from .cuda_gather import gather_signature

    unit = cuda_gather_unit(dtype)
    identity = dict(unit.identity, device=device)
    sigs = None if simulated else [gather_signature(dtype)]
    entry = cache.get(identity, unit.source, unit.entry, signatures=sigs, target="cuda")
    _refuse_compiled("gather", cache.key_for(identity, "cuda"), cache, entry)
    return entry


def build_cuda(
    plan: Plan,
    *,
    mode: str = "compiled",
    cache: KernelCache | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[Kernel], Any, str, Any, dict[str, float]]:
    """The kernels of a plan on the GPU (CudaKernels), its schedule kernel and that one's
    source (mode "compiled"; mode "loop" launches each step from Python: None, ""), the
    gather kernel of its dtype, and the cache's stats of loading them. target/cuda.py
    makes the Executable's parts."""
    from numba import config

    cuda = cuda_module()
    device = device_name(cuda)
    cache = cache or default_cache()
    before = dict(cache.stats)
    say = progress or (lambda line: None)
    kernels: list[Kernel] = []  # (CudaKernels)
    # (the ignore: as in _check_lowering, a setting numba.core.config makes at import time)
    simulated = bool(config.ENABLE_CUDASIM)  # type: ignore[attr-defined]
    for i, pattern in enumerate(plan.schedule.patterns):
        say(f"kernel {i + 1}/{len(plan.schedule.patterns)}: {pattern.name} ({device})")
        kernels.append(load_cuda_kernel(replace(pattern, parallel=False), cache, device, simulated))
    walk, walk_source = None, ""
    if mode == "compiled" and plan.schedule.patterns:
        say(f"schedule kernel: {len(plan.schedule.patterns)} kernels ({device})")
        try:
            shapes = schedule_shapes(plan.schedule)
            walk, walk_source = load_schedule_kernel(plan.schedule.patterns, shapes, cache, device, simulated)
        except CacheMissError:
            raise
        except Exception as e:  # (a toolkit without cudadevrt cannot link a grid-wide wait)
            # the same bits, a launch per step: slower, not wrong
            warnings.warn(
                f"target 'cuda': the schedule kernel did not compile ({type(e).__name__}: "
                f"{' '.join(str(e).split())[:300]}); each step is launched from Python instead",
                CudaScheduleWarning,
                stacklevel=2,
            )
    gather = load_gather_kernel(plan.semiring.dtype.name, cache, device, simulated)
    used: dict[str, float] = {k: cache.stats.get(k, 0) - before.get(k, 0) for k in cache.stats}
    return kernels, walk, walk_source, gather, used
