"""The loop kernel's fused passes (codegen/cpu.py): a product's last ⊗ written straight
into a CONTIGUOUS output (times_store), a sum across outputs adding its last ⊗ in the same
pass (add_times), the first two CONTIGUOUS leaves of a product in one pass (first_two).
Each is taken only where its operands are CONTIGUOUS along the vector: one hand-made step
per access kind of the output and of the last leaf, run by the compiled kernel, against
numpy; a fused pass that ignored the kind would write or read the wrong elements."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from catbp_jit import abi
from catbp_jit.cache.kernel_cache import default_cache
from catbp_jit.codegen.loader import load_kernel
from catbp_jit.plan.loops import ACROSS_OUTPUTS
from catbp_jit.plan.steps import KernelPattern

ROWS, V = 3, 8  # sizes of the step's two output axes; the inner one is the vector
BASE = 1000  # where the output starts in mem (the leaves lie below)


def run_step(pattern: KernelPattern, params: abi.StepParams, mem: np.ndarray) -> None:
    """The step alone: its row, its gather tables and loop counters in a table of its own."""
    at = params.size()  # the gather tables follow the row, then the loop counters
    accesses = []
    for a in params.accesses:
        accesses.append(replace(a, table=at) if a.kind == abi.GATHERED else a)
        at += len(a.offsets) if a.kind == abi.GATHERED else 0
    params = replace(params, accesses=tuple(accesses), scratch=at)
    tables = [x for a in accesses if a.kind == abi.GATHERED for x in a.offsets]
    P = np.array(params.pack() + tables + [0] * params.scratch_size(), dtype=np.int64)
    kernel = load_kernel(pattern, default_cache())
    kernel.entry(mem.ctypes.data, mem.size, P.ctypes.data, P.size, 0, 0, 1)


def access(kind: str, step: int) -> abi.Access:
    """The access along the vector of an operand whose stride there is `step`."""
    if kind == "contiguous":
        assert step == 1
        return abi.Access(abi.CONTIGUOUS, 1)
    if kind == "strided":
        return abi.Access(abi.STRIDED, step)
    return abi.Access(abi.GATHERED, 0, tuple(v * step for v in range(V)))


def layout(kind: str, offset: int) -> tuple[int, tuple[int, int]]:
    """(offset, strides) of a ROWS x V operand: row-major, or transposed (STRIDED along
    the vector), or gathered (its vector's offsets listed, the same transposed elements)."""
    return (offset, (V, 1)) if kind == "contiguous" else (offset, (1, ROWS))


def placed_leaves(seed: int, mem: np.ndarray, kinds: list[str]) -> tuple[list, list]:
    """Random ROWS x V leaves laid out by kind in mem: their (offset, strides), their values."""
    rng = np.random.default_rng(seed)
    leaves, values = [], []
    for i, kind in enumerate(kinds):
        offset, strides = layout(kind, 100 * (i + 1))
        x = rng.uniform(0.5, 2.0, (ROWS, V))
        for r in range(ROWS):
            for c in range(V):
                mem[offset + r * strides[0] + c * strides[1]] = x[r, c]
        leaves.append((offset, strides))
        values.append(x)
    return leaves, values


def make_step(leaves, kinds, out, out_rank, sizes, out_strides, out_access, vector=-1) -> abi.StepParams:
    """A step of one chunk whose vector is its axis `vector` (V elements)."""
    return abi.StepParams(
        out=out,
        out_rank=out_rank,
        red_rank=len(sizes) - out_rank,
        chunks=1,
        block_axes=1,
        block_size=V,
        sizes=sizes,
        out_strides=out_strides,
        leaves=tuple(leaves),
        groups=(1, 0, 1, -1),
        accesses=tuple(access(kind, strides[vector]) for kind, (_, strides) in zip(kinds, leaves))
        + (out_access,),
    )


@pytest.mark.parametrize("out_kind", ["contiguous", "strided", "gathered"])
@pytest.mark.parametrize("last_kind", ["contiguous", "strided", "gathered"])
@pytest.mark.parametrize("k", [2, 3])
def test_a_product_writes_its_output_whatever_the_kinds(out_kind, last_kind, k):
    mem = np.full(2 * BASE, np.nan)
    kinds = ["contiguous"] * (k - 1) + [last_kind]
    leaves, values = placed_leaves(k, mem, kinds)
    out_offset, out_strides = layout(out_kind, BASE)
    params = make_step(
        leaves, kinds, out_offset, 2, (ROWS, V), out_strides, access(out_kind, out_strides[-1])
    )
    run_step(KernelPattern("PROB", "float64", False, False, False), params, mem)
    want = values[0]
    for x in values[1:]:
        want = want * x  # left to right, as the kernel
    got = np.array(
        [[mem[out_offset + r * out_strides[0] + c * out_strides[1]] for c in range(V)] for r in range(ROWS)]
    )
    assert got.tobytes() == want.tobytes()
    written = {out_offset + r * out_strides[0] + c * out_strides[1] for r in range(ROWS) for c in range(V)}
    others = [i for i in range(BASE, 2 * BASE) if i not in written]
    assert np.isnan(mem[others]).all()  # nothing else in the output's neighbourhood


@pytest.mark.parametrize("last_kind", ["contiguous", "strided", "gathered"])
@pytest.mark.parametrize("k", [2, 3])
def test_a_sum_across_outputs_adds_its_last_leaf_whatever_its_kind(last_kind, k):
    """out[c] = Σ_r Π_l leaf_l[r, c]: the vector is the output axis c, the odometer walks r."""
    mem = np.full(2 * BASE, np.nan)
    kinds = ["contiguous"] * (k - 1) + [last_kind]
    leaves, values = placed_leaves(10 + k, mem, kinds)
    # loop order (c, r): output axis c first, reduced axis r second
    swapped = [(offset, (strides[1], strides[0])) for offset, strides in leaves]
    params = make_step(swapped, kinds, BASE, 1, (V, ROWS), (1,), abi.Access(abi.CONTIGUOUS, 1), vector=0)
    run_step(KernelPattern("PROB", "float64", True, False, False, ACROSS_OUTPUTS), params, mem)
    want = np.zeros(V)
    for r in range(ROWS):  # each output's terms in order, from 0
        term = values[0][r]
        for x in values[1:]:
            term = term * x[r]
        want = want + term
    assert mem[BASE : BASE + V].tobytes() == want.tobytes()
    assert np.isnan(mem[BASE + V : 2 * BASE]).all()
