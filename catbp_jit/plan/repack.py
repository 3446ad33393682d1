"""Repacking: a small gathered leaf copied once per step into the vector's order.

Along a kernel's vector (plan/loops.py) a leaf whose strides there are not one affine run
is GATHERED: every element costs a load from its offset table and a scalar load from the
leaf, about 0.3 ns, against under 0.1 for a CONTIGUOUS one (measured on one x86-64 core,
the product of four leaves along a 256-element vector: 1.40 ns an element gathered, 0.58
with the three small leaves read from copies in the vector's order). On the grids most
products and sums gather several small leaves this way, and the same few hundred
elements of such a leaf are gathered again for every position of the axes outside the
vector that the leaf does not have.

So a step may repack a leaf: a repack step (codegen/cpu_repack.py) run just before it
copies the leaf into the step's workspace (sized before memory planning, plan/pipeline.py),
one vector of V elements for each position of the axes outside the vector along which
the leaf moves, and the step's loops read the copy CONTIGUOUS. The copy holds the same
values, so the results are the same bits. A leaf is repacked when its copy is small and
each copied element is read again several times, in a step big enough to pay for the repack step's call
(PlanOptions.repack_max_elements, repack_min_reuse, repack_min_terms): the copy costs
about what one gathered read of its elements does.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from .. import abi
from .loops import LoopNest

# copies start on a 64-byte boundary of float64, so their vector loads are aligned
ALIGN_ELEMENTS = 8


@dataclass(frozen=True)
class RepackChoice:
    """Leaf j is copied, one vector per position of `axes` (the loop axes outside the
    vector along which it moves, outermost first), `at` elements into the step's
    workspace."""

    j: int
    axes: tuple[int, ...]
    elements: int
    at: int


def choose_repacks(
    nest: LoopNest, accesses: tuple[abi.Access, ...], max_elements: int, min_reuse: int, min_terms: int
) -> tuple[RepackChoice, ...]:
    """The leaves of a step worth repacking (accesses: the leaves', then the output's): in
    a step of min_terms terms at least, its GATHERED leaves whose copies have at most
    max_elements and whose copied vectors the step reads min_reuse times each at least."""
    vector = set(nest.vector_positions())
    outside = [d for d in range(len(nest.sizes)) if d not in vector]
    vectors = prod(nest.sizes[d] for d in outside)  # the vectors the step computes
    V = prod(nest.vector_sizes())
    if vectors * V < min_terms:
        return ()
    chosen, at = [], 0
    for j, acc in enumerate(accesses[:-1]):
        if acc.kind != abi.GATHERED:
            continue
        axes = tuple(d for d in outside if nest.operands[1 + j][d] != 0)
        copies = prod(nest.sizes[d] for d in axes)
        if copies * V <= max_elements and vectors >= min_reuse * copies:
            chosen.append(RepackChoice(j, axes, copies * V, at))
            at += -(-copies * V // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
    return tuple(chosen)


def workspace_elements(choices: tuple[RepackChoice, ...]) -> int:
    """Elements of workspace the copies need."""
    if not choices:
        return 0
    last = choices[-1]
    return last.at + last.elements


def copy_strides(nest: LoopNest, choice: RepackChoice) -> tuple[int, ...]:
    """The copy's strides on every loop axis: C order over the choice's axes, each position
    a vector of V elements in the vector's own (C) order; 0 on every other axis."""
    strides = [0] * len(nest.sizes)
    step = 1
    for d in reversed(nest.vector_positions()):
        strides[d] = step
        step *= nest.sizes[d]
    for d in reversed(choice.axes):
        strides[d] = step
        step *= nest.sizes[d]
    return tuple(strides)


def repacked(
    nest: LoopNest,
    choices: tuple[RepackChoice, ...],
    leaves: tuple[tuple[int, tuple[int, ...]], ...],
    accesses: tuple[abi.Access, ...],
    work: int,
) -> tuple[tuple, tuple, abi.RepackParams | None]:
    """(leaf rows, accesses, the repack step's parameters or None) of a step whose chosen
    leaves are copied to work + choice.at: their rows and accesses name the copies, and
    the repack step, run just before the step, makes them from the leaves in the arena."""
    rows, acc, copies = list(leaves), list(accesses), []
    for c in choices:
        offset, strides = leaves[c.j]
        copy = copy_strides(nest, c)
        rows[c.j] = (work + c.at, copy)
        acc[c.j] = abi.Access(abi.CONTIGUOUS, 1)
        positions = abi.StridedCopy(
            offset,
            work + c.at,
            tuple(nest.sizes[d] for d in c.axes),
            tuple(strides[d] for d in c.axes),
            tuple(copy[d] for d in c.axes),
        )
        copies.append(abi.GatheredCopy(positions, accesses[c.j].offsets, c.j))
    if not copies:
        return tuple(rows), tuple(acc), None
    return tuple(rows), tuple(acc), abi.RepackParams(prod(nest.vector_sizes()), tuple(copies))
