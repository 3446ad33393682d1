"""Barriers: which steps of a schedule must wait until every earlier step has finished,
when one launch runs them all (the CUDA target's schedule kernel, codegen/cuda_schedule.py).

Threads of one launch run a step's share each and go straight on to the next step; a grid
barrier before step i makes them wait for each other. Step i needs one when it reads what
a step since the last barrier writes (its inputs would not be there yet), or writes what
such a step reads or writes (it would overwrite an input still being read: the memory
planner reuses regions). Otherwise the steps touch disjoint memory and may overlap.

A step's memory is read from its parameters (abi.StepParams): the output's span from its
offset and strides, each leaf's likewise. A span covers every element the step may touch
(a GATHERED access's offsets come from the same strides), so the test is conservative: a
barrier too many costs a wait, one too few a wrong answer.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import abi
from .steps import Step

Span = tuple[int, int]  # [first, last] elements of the arena, inclusive

# Past this many spans since the last barrier, place one anyway: the test is quadratic in
# them, and steps that long independent are rare (a barrier is always allowed).
MAX_OPEN_SPANS = 64


def _span(offset: int, sizes: Sequence[int], strides: Sequence[int]) -> Span:
    return offset, offset + sum((n - 1) * s for n, s in zip(sizes, strides))


def step_spans(step: Step) -> tuple[list[Span], list[Span]] | None:
    """(the spans it writes: its output's, and its totals' if it keeps them; the leaves'
    spans) of a step, or None when its parameters are not a contraction's (then it gets
    barriers on both sides)."""
    params = step.params
    if not isinstance(params, abi.StepParams):
        return None
    out = [_span(params.out, params.sizes[: params.out_rank], params.out_strides)]
    groups, *_, totals = params.groups
    if totals >= 0:
        out.append((totals, totals + groups - 1))
    return out, [_span(offset, params.sizes, strides) for offset, strides in params.leaves]


def _meets(span: Span, spans: list[Span]) -> bool:
    return any(span[0] <= last and first <= span[1] for first, last in spans)


def barriers(steps: Sequence[Step]) -> np.ndarray:
    """int64, one per step: 1 where the step must wait for every earlier one (see the module
    docstring). Step 0 never waits (nothing runs before it), nor does the first step a
    launch runs, whatever it says here: a launch starts after everything before it."""
    wait = np.zeros(len(steps), dtype=np.int64)
    written: list[Span] = []
    read: list[Span] = []
    for i, step in enumerate(steps):
        spans = step_spans(step)
        if spans is None:
            wait[i] = i > 0
            written, read = [(0, np.iinfo(np.int64).max)], []  # and the next step waits too
            continue
        out, leaves = spans
        if (
            any(_meets(leaf, written) for leaf in leaves)
            or any(_meets(span, written + read) for span in out)
            or len(written) + len(read) + len(leaves) + len(out) > MAX_OPEN_SPANS
        ):
            wait[i] = i > 0
            written, read = [], []
        # (a normalizing step also waits inside itself, between its contraction and its
        # NORMALIZE; that wait is not counted here, so a phase's steps may run in any order)
        written += out
        read += leaves
    return wait
