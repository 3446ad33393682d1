"""The schedule kernel: every step of a schedule in one CUDA launch.

One module per kernel set (a schedule's distinct patterns, by kernel id): each pattern's
device functions from codegen/cuda.py under its kernel id's name (`contract_3`,
`normalize_groups_3`), and one kernel, `run_steps(mem, P, B, first, last)`, that walks
rows first..last-1 of the table P on the device. Every thread of the grid reads a step's
row, does its share of the step (the same items, in the same order, as a per-step launch
of that grid's shape would give it: so the bits are the per-step path's), and goes on to
the next step. Where step i reads or overwrites what an earlier step since the last
barrier writes, B[i] is 1 and the whole grid waits for itself first (plan/barriers.py);
a step that normalizes waits between its contraction and its NORMALIZE.

A grid-wide wait needs every block of the grid resident at once: the launch is cooperative
(numba-cuda makes it so for a kernel that syncs its grid) and no larger than the driver's
`max_cooperative_grid_blocks` (cuda_session.py; the simulator allows one block).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from .. import abi
from ..plan.schedule import Schedule
from ..plan.steps import KernelPattern
from . import cuda

ENTRY = "run_steps"

HEADER = '''"""catbp_jit CUDA schedule kernel: {n} kernel{s}, every step in one launch

run_steps(mem, P, B, first, last) runs rows first..last-1 of the table P (catbp_jit/abi.py:
step row i is P[3 * i], P[3 * i + 1] = kernel id, parameter offset), each step by every
thread of the grid at once, each thread its share (grid-stride), with a grid-wide wait
before step i where B[i] is 1 (plan/barriers.py) and inside a step that normalizes.

Kernel ids:
{ids}
"""
'''


def function_names(kernel_id: int) -> tuple[str, str]:
    """The device functions of kernel id k in the schedule module: (contract, normalize)."""
    return f"{cuda.CONTRACT_FN}_{kernel_id}", f"{cuda.NORMALIZE_FN}_{kernel_id}"


def shape_function_name(kernel_id: int, shape: cuda.Shape) -> str:
    """The device function of kernel id k specialized on one step shape."""
    return f"{cuda.CONTRACT_FN}_{kernel_id}_k{shape[0]}_r{shape[1]}_q{shape[2]}"


def schedule_shapes(schedule: Schedule) -> tuple[tuple[cuda.Shape, ...], ...]:
    """Per kernel id, the shapes (leaves, output axes, reduced axes) of its steps, sorted."""
    shapes: list[set] = [set() for _ in schedule.patterns]
    for i, step in enumerate(schedule.steps):
        shapes[schedule.kernel_id(i)].add(cuda.step_shape(cast(abi.StepParams, step.params)))
    return tuple(tuple(sorted(s)) for s in shapes)


def _walk(patterns: Sequence[KernelPattern], shapes: Sequence[Sequence[cuda.Shape]]) -> list[str]:
    lines = [
        "",
        "",
        "@cuda.jit(cache=True)",
        "def run_steps(mem, P, B, first, last):",
        '    """Steps first..last-1 of the table, in order: every thread does its share of each."""',
        "    grid = cuda.cg.this_grid()",
        "    t = cuda.grid(1)",
        "    n = cuda.gridsize(1)",
    ]
    lines += [
        "    for i in range(first, last):",
        "        k = P[i * STEP_ROW + STEP_KERNEL]",
        "        p = P[i * STEP_ROW + STEP_PARAMS]",
        "        if i > first and B[i]:  # step i reads or overwrites what an earlier one writes",
        "            grid.sync()",
    ]
    lines += ["        K, R, Q = P[p + LEAVES], P[p + OUT_RANK], P[p + RED_RANK]  # the step's shape"]
    for k, pattern in enumerate(patterns):
        contract, normalize = function_names(k)
        lines += [f"        {'if' if k == 0 else 'elif'} k == {k}:"]
        for j, shape in enumerate(shapes[k]):
            test = f"K == {shape[0]} and R == {shape[1]} and Q == {shape[2]}"
            lines += [
                f"            {'if' if j == 0 else 'elif'} {test}:",
                f"                {shape_function_name(k, shape)}(mem, P, p, t, n)",
            ]
        if pattern.normalize:
            lines += [
                "            grid.sync()  # NORMALIZE reads the whole output",
                f"            {normalize}(mem, P, p, t, n)",
            ]
    return lines


def schedule_source(patterns: Sequence[KernelPattern], shapes: Sequence[Sequence[cuda.Shape]]) -> str:
    """The schedule kernel's module for a kernel set (patterns by kernel id) and the shapes
    of each kernel id's steps (schedule_shapes): a device function per pair (codegen/cuda.py:
    shaped_contract_fn, the per-step kernels' bits). Readable, deterministic, one source for
    a GPU and for the simulator."""
    if not patterns:
        raise ValueError("a schedule kernel needs at least one pattern")
    if len(shapes) != len(patterns):
        raise ValueError(f"schedule kernel: {len(shapes)} shape lists for {len(patterns)} patterns")
    for pattern in patterns:
        cuda.check_dtype(pattern)
    ids = "\n".join(f"  {k}: {p.name}" for k, p in enumerate(patterns))
    lines = HEADER.format(n=len(patterns), s="" if len(patterns) == 1 else "s", ids=ids).split("\n")
    lines += cuda.prelude() + cuda.rounded_mul_lines(patterns)
    for k, pattern in enumerate(patterns):
        contract, normalize = function_names(k)
        lines += ["", "", f"# kernel {k}: {pattern.name}"]
        for shape in shapes[k]:
            lines += cuda.shaped_contract_fn(shape_function_name(k, shape), pattern, shape)
        if pattern.normalize:
            lines += cuda.normalize_fn(normalize, pattern)
    lines += _walk(patterns, shapes)
    return "\n".join(lines) + "\n"
