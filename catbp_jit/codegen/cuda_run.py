"""CUDA kernels on the device: load a module per pattern, run a schedule's steps in order.

Two ways, with the same bits. Per step (mode "loop"): the launches of a schedule are
worked out once (`launches`: each step's configured entry, blocks and parameter offset)
and replayed by `run_launches`, which allocates nothing but the launches themselves;
`run_schedule` does both; steps run in order because every launch goes to the default
stream. In one launch (mode "compiled"): the schedule kernel (codegen/cuda_schedule.py)
walks the table on the device, `walk_launch` configures it and `run_walk` runs it. Numba
must see NUMBA_ENABLE_CUDASIM before it is first imported for the kernels to run under the
simulator (see codegen/cuda.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, cast

from .. import abi
from ..plan.barriers import barriers
from ..plan.schedule import Schedule
from ..plan.steps import KernelPattern
from . import cuda, cuda_schedule

# Blocks per launch at most: the grid-stride loop covers the rest (on a GPU, a few waves of
# the multiprocessors are enough to keep them busy).
MAX_BLOCKS = 1024
MAX_THREADS_PER_BLOCK = 1024  # every CUDA GPU's limit
# The simulator (NUMBA_ENABLE_CUDASIM=1) runs each thread of a block as a Python thread and
# polls them all until the block ends: its launches take blocks this small by default.
SIMULATOR_THREADS_PER_BLOCK = 8


def default_threads_per_block() -> int:
    from numba import config

    return SIMULATOR_THREADS_PER_BLOCK if config.ENABLE_CUDASIM else cuda.THREADS_PER_BLOCK  # type: ignore[attr-defined]


@dataclass(frozen=True)
class LaunchOptions:
    """How a launch is cut: any choice gives the same results (grid-stride kernels)."""

    threads_per_block: int = field(default_factory=default_threads_per_block)
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


def cooperative_blocks(kernel: Any, threads_per_block: int) -> int:
    """The most blocks of `threads_per_block` a grid of `kernel` may have when it waits for
    itself (all of them resident at once): the driver's answer for the compiled kernel (the
    simulator's is 1)."""
    overloads = kernel.overloads  # (the simulator keeps none and answers any key)
    compiled = overloads[next(iter(overloads))] if len(overloads) else overloads[()]
    return max(1, int(compiled.max_cooperative_grid_blocks(threads_per_block)))


def load_module(pattern: KernelPattern, directory: str | os.PathLike) -> ModuleType:
    """The kernel module of `pattern`, its source written to `directory` and imported
    from there (a file, so tracebacks and the simulator show the kernel's lines)."""
    return _import_source(cuda.kernel_source(pattern), f"catbp_cuda_{pattern.name}", directory)


def load_schedule_module(schedule: Schedule, directory: str | os.PathLike) -> ModuleType:
    """The schedule kernel's module of a schedule's kernel set and step shapes, likewise."""
    shapes = cuda_schedule.schedule_shapes(schedule)
    source = cuda_schedule.schedule_source(schedule.patterns, shapes)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]  # one file per kernel set
    return _import_source(source, f"catbp_cuda_schedule_{digest}", directory)


def _import_source(source: str, name: str, directory: str | os.PathLike) -> ModuleType:
    path = os.path.join(os.fspath(directory), f"{name}.py")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(source)
    os.replace(tmp, path)  # a reader never sees half a module
    spec = importlib.util.spec_from_file_location(name, path)
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


def launch_count(schedule: Schedule, one_launch: bool) -> int:
    """Kernel launches per run of every step: one for the schedule kernel, else one per
    step plus one per step that normalizes."""
    if one_launch:
        return 1 if schedule.steps else 0
    return len(schedule.steps) + sum(step.pattern.normalize for step in schedule.steps)


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


def walk_launch(kernel: Any, options: LaunchOptions = LaunchOptions()) -> Any:
    """The schedule kernel configured for one launch: as many blocks as may all be resident
    (a grid-wide wait needs them so), at most options.max_blocks."""
    threads = options.threads_per_block
    return kernel[min(options.max_blocks, cooperative_blocks(kernel, threads)), threads]


def run_walk(
    module: ModuleType,
    schedule: Schedule,
    d_mem: Any,
    d_P: Any,
    options: LaunchOptions = LaunchOptions(),
) -> None:
    """Every step of `schedule` in one launch of its schedule kernel (`module`:
    load_schedule_module's), on the device arena d_mem and table d_P."""
    from numba import config
    from numba import cuda as numba_cuda

    from .cuda_build import schedule_signature

    kernel = getattr(module, cuda_schedule.ENTRY)
    if not config.ENABLE_CUDASIM and not len(kernel.overloads):  # type: ignore[attr-defined]
        # a module imported here compiles at its first launch, and the walk's grid is sized
        # by the driver's answer for the compiled kernel (cooperative_blocks): compiled
        # first, for its one signature (a GPU said KeyError: () without this)
        kernel.compile(schedule_signature(schedule.patterns[0].dtype))
    d_B = numba_cuda.to_device(barriers(schedule.steps))
    walk_launch(kernel, options)(d_mem, d_P, d_B, 0, len(schedule.steps))
