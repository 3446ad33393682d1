"""CUDA kernels on the device: load a module per pattern, launch a schedule's steps in order.

The launches of a schedule are worked out once (`launches`: each step's configured entry,
blocks and parameter offset) and replayed by `run_launches`, which allocates nothing but
the launches themselves; `run_schedule` does both. Steps run in order because every launch
goes to the default stream. Numba must see NUMBA_ENABLE_CUDASIM before it is first
imported for the kernels to run under the simulator (see codegen/cuda.py).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

from .. import abi
from ..plan.schedule import Schedule
from ..plan.steps import KernelPattern
from . import cuda

# Blocks per launch at most: the grid-stride loop covers the rest (on a GPU, a few waves of
# the multiprocessors are enough to keep them busy).
MAX_BLOCKS = 1024
MAX_THREADS_PER_BLOCK = 1024  # every CUDA GPU's limit


@dataclass(frozen=True)
class LaunchOptions:
    """How a launch is cut: any choice gives the same results (grid-stride kernels)."""

    threads_per_block: int = cuda.THREADS_PER_BLOCK
    max_blocks: int = MAX_BLOCKS

    def __post_init__(self):
        for name, most in (("threads_per_block", MAX_THREADS_PER_BLOCK), ("max_blocks", None)):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 1
                or (most is not None and value > most)
            ):
                limit = f"1..{most}" if most else "at least 1"
                raise ValueError(f"LaunchOptions: {name} must be an integer {limit}, got {value!r}")

    def blocks(self, threads: int) -> int:
        return max(1, min(-(-threads // self.threads_per_block), self.max_blocks))


def load_module(pattern: KernelPattern, directory: str | os.PathLike) -> ModuleType:
    """The kernel module of `pattern`, its source written to `directory` and imported
    from there (a file, so tracebacks and the simulator show the kernel's lines)."""
    source = cuda.kernel_source(pattern)
    path = os.path.join(os.fspath(directory), f"catbp_cuda_{pattern.name}.py")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(source)
    os.replace(tmp, path)  # a reader never sees half a module
    spec = importlib.util.spec_from_file_location(f"catbp_cuda_{pattern.name}", path)
    assert spec is not None and spec.loader is not None  # (a .py path always has a loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_modules(schedule: Schedule, directory: str | os.PathLike) -> list[ModuleType]:
    """One module per kernel id of the schedule."""
    return [load_module(pattern, directory) for pattern in schedule.patterns]


Launch = tuple[Any, int]  # (configured entry, parameter offset)


def step_launches(
    entries: Sequence[tuple[Any, Any]], schedule: Schedule, options: LaunchOptions = LaunchOptions()
) -> tuple[tuple[Launch, ...], ...]:
    """Per step, its launches in order: the kernel's `kernel`, then its `normalize` if it
    normalizes. entries: (kernel, normalize or None) per kernel id."""
    out = []
    for i, step in enumerate(schedule.steps):
        kernel, normalize = entries[schedule.kernel_id(i)]
        p = schedule.param_offset(i)
        threads, groups = cuda.launch_shape(cast(abi.StepParams, step.params))  # (no GEMM on a GPU)
        mine = [(kernel[options.blocks(threads), options.threads_per_block], p)]
        if step.pattern.normalize:
            mine.append((normalize[options.blocks(groups), options.threads_per_block], p))
        out.append(tuple(mine))
    return tuple(out)


def launches(
    modules: Sequence[ModuleType], schedule: Schedule, options: LaunchOptions = LaunchOptions()
) -> tuple[Launch, ...]:
    """Every launch of the schedule in order, from one loaded module per kernel id."""
    entries = [(getattr(m, cuda.ENTRY), getattr(m, cuda.NORMALIZE_ENTRY, None)) for m in modules]
    return tuple(launch for step in step_launches(entries, schedule, options) for launch in step)


def run_launches(planned: Sequence[tuple[Any, int]], d_mem: Any, d_P: Any) -> None:
    """Launch them in order on the device arena and table (device arrays)."""
    for entry, p in planned:
        entry(d_mem, d_P, p)


def run_schedule(
    modules: Sequence[ModuleType],
    schedule: Schedule,
    d_mem: Any,
    d_P: Any,
    options: LaunchOptions = LaunchOptions(),
) -> None:
    """Every step of `schedule`, in order, on the device arena d_mem and table d_P."""
    run_launches(launches(modules, schedule, options), d_mem, d_P)
