"""Fusion (plan/fusion.py): what becomes one segment, and that it changes no bits."""

from __future__ import annotations

import numpy as np
import pytest

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
from catbp_jit.ir.schema import element_count
from catbp_jit.ir.validate import check_programs
from catbp_jit.plan.fusion import fuse
from catbp_jit.plan.graph import build_graph
from catbp_jit.plan.passes import optimize

G = AxisType.GEOMETRIC
X, Y = Axis(0, G, 5), Axis(1, G, 7)
SPECS = {0: TensorSpec((X, Y)), 1: TensorSpec((Y,)), 2: TensorSpec((X, Y))}


def program(store_product: bool) -> Program:
    """R[x] = ⊕_y a[x, y] ⊗ (b[y] ⊗ c[x, y]): the product b ⊗ c is the second input of
    its one reader (unless it is also stored in a slot)."""
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in SPECS]
    ins += [
        Instruction(OpCode.CONTRACT, 3, {"inputs": (1, 2), "out_spec": TensorSpec((X, Y))}),
        Instruction(OpCode.CONTRACT, 4, {"inputs": (0, 3), "out_spec": TensorSpec((X, Y))}),
        Instruction(OpCode.ELIMINATE, 5, {"src": 4, "keep_keys": (X.key,)}),
        Instruction(OpCode.STORE_SLOT, None, {"slot": ("r",), "src": 5}),
    ]
    if store_product:
        ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("p",), "src": 3}))
    return Program(tuple(ins), "upward")


@pytest.mark.parametrize("semiring", ["PROB", pytest.param("LOGPROB", marks=pytest.mark.slow)])
def test_a_product_read_second_by_its_one_reader_is_computed_first_inside_it(semiring):
    sr = catbp_jit.make_semiring(semiring)
    exe = catbp_jit.compile(program(False), sr, factor_specs=SPECS, mode="loop")
    (seg,) = exe.plan.fused.segments
    assert seg.leaves == (1, 2, 0)  # ((b ⊗ c) ⊗ a): a ⊗ (b ⊗ c) by ⊗'s commutativity
    stored = catbp_jit.compile(program(True), sr, factor_specs=SPECS, mode="loop")
    assert len(stored.plan.fused.segments) == 2  # a slot's value is written: not inlined
    rng = np.random.default_rng(5)
    values = {f: sr.kind.potentials(rng.uniform(0.1, 3.0, s.shape), sr.dtype) for f, s in SPECS.items()}
    got = exe.bind().run(factors=values)[("r",)][0]
    want = stored.bind().run(factors=values)[("r",)][0]
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


def test_without_second_inputs_the_product_is_a_segment_of_its_own():
    checked = check_programs([program(False)], factor_specs=SPECS, selector_specs={}, slot_specs={})
    graph = optimize(build_graph(checked, "PROB", {}))
    assert [s.leaves for s in fuse(graph, second_inputs=False).segments] == [(1, 2), (0, 3)]


def test_the_reassociating_mode_fuses_second_inputs_too():
    """Its paths start from exact mode's segments (plan/pipeline.py): here the one segment,
    which no path makes cheaper, so it stays whole."""
    sr = catbp_jit.make_semiring("PROB")
    exe = catbp_jit.compile(program(False), sr, factor_specs=SPECS, mode="loop", exact=False)
    assert [s.leaves for s in exe.plan.fused.segments] == [(1, 2, 0)]


def readers_of_a_product(x: int, y: int) -> tuple[Program, dict[int, TensorSpec]]:
    """p = a ⊗ b ⊗ c ⊗ d over (x, y), read by two reductions: r[x] = ⊕_y p, s[y] = ⊕_x p."""
    X, Y = Axis(0, G, x), Axis(1, G, y)
    specs = {0: TensorSpec((X, Y)), 1: TensorSpec((Y,)), 2: TensorSpec((X,)), 3: TensorSpec((X, Y))}
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins += [
        Instruction(OpCode.CONTRACT, 4, {"inputs": (0, 1, 2, 3), "out_spec": TensorSpec((X, Y))}),
        Instruction(OpCode.ELIMINATE, 5, {"src": 4, "keep_keys": (X.key,)}),
        Instruction(OpCode.ELIMINATE, 6, {"src": 4, "keep_keys": (Y.key,)}),
        Instruction(OpCode.STORE_SLOT, None, {"slot": ("r",), "src": 5}),
        Instruction(OpCode.STORE_SLOT, None, {"slot": ("s",), "src": 6}),
    ]
    return Program(tuple(ins), "upward"), specs


def test_a_small_product_of_four_leaves_is_recomputed_by_its_readers_a_big_one_written():
    def segments(x, y):
        prog, specs = readers_of_a_product(x, y)
        checked = check_programs([prog], factor_specs=specs, selector_specs={}, slot_specs={})
        return fuse(optimize(build_graph(checked, "PROB", {}))).segments

    # 6 x 5: each reduction multiplies the four leaves itself; 512 x 1024 (over 2 MiB of
    # float64): the product is written once and read by both
    assert [len(s.leaves) for s in segments(6, 5)] == [4, 4]
    assert [len(s.leaves) for s in segments(512, 1024)] == [4, 1, 1]
    # recomputed, each sum keeps the reference's order: its bits (5 terms a run, under
    # numpy's pairwise blocks of 8)
    prog, specs = readers_of_a_product(6, 5)
    sr = catbp_jit.make_semiring("PROB")
    rng = np.random.default_rng(11)
    values = {f: rng.uniform(0.1, 3.0, s.shape) for f, s in specs.items()}
    want = catbp_jit.reference.run_program(prog, sr, lambda f: (values[f], specs[f]), {}.get)
    got = catbp_jit.compile([prog], sr, factor_specs=specs).bind().run(factors=values)
    for slot in (("r",), ("s",)):
        assert np.array_equal(got[slot][0].view(np.uint8), want[slot][0].view(np.uint8)), slot


def broadcast_readers(store_product: bool) -> tuple[Program, dict[int, TensorSpec]]:
    """p = a[x] ⊗ b[y] broadcast over (x, y, z, w) (over 2^18 elements, 8 times its
    inputs' at least), read first by four reductions, each multiplying a leaf of its own:
    r_i = ⊕ p ⊗ c_i. Stored in a slot, p is written (a slot's value always is)."""
    X, Y, Z, W = Axis(0, G, 9), Axis(1, G, 9), Axis(2, G, 81), Axis(3, G, 81)
    big = TensorSpec((X, Y, Z, W))
    specs = {0: TensorSpec((X,)), 1: TensorSpec((Y,))}
    specs.update({2 + i: TensorSpec(axes) for i, axes in enumerate(((Z,), (W,), (Z, W), (X, W)))})
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins.append(Instruction(OpCode.CONTRACT, 6, {"inputs": (0, 1), "out_spec": big}))
    for i, keep in enumerate(((X,), (Y,), (Z,), (W,))):
        ins += [
            Instruction(OpCode.CONTRACT, 7 + 2 * i, {"inputs": (6, 2 + i), "out_spec": big}),
            Instruction(
                OpCode.ELIMINATE, 8 + 2 * i, {"src": 7 + 2 * i, "keep_keys": tuple(a.key for a in keep)}
            ),
            Instruction(OpCode.STORE_SLOT, None, {"slot": (f"r{i}",), "src": 8 + 2 * i}),
        ]
    if store_product:
        ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("p",), "src": 6}))
    return Program(tuple(ins), "upward"), specs


def test_a_big_broadcast_of_small_inputs_is_recomputed_by_all_its_readers():
    sr = catbp_jit.make_semiring("PROB")
    prog, specs = broadcast_readers(False)
    exe = catbp_jit.compile([prog], sr, factor_specs=specs)
    stored_prog, _ = broadcast_readers(True)
    stored = catbp_jit.compile([stored_prog], sr, factor_specs=specs)

    def written(e) -> list:  # the sizes of the values segments write
        return sorted(element_count(s.out_spec) for s in e.plan.fused.segments)

    assert max(written(exe)) < 9 * 9 * 81 * 81 == max(written(stored))  # (a ⊗ b hoisted: 81)
    rng = np.random.default_rng(2)
    values = {f: rng.uniform(0.1, 3.0, s.shape) for f, s in specs.items()}
    got, want = exe.bind().run(factors=values), stored.bind().run(factors=values)
    for i in range(4):  # the same products, the same sums: the same bits
        slot = (f"r{i}",)
        assert np.array_equal(got[slot][0].view(np.uint8), want[slot][0].view(np.uint8)), slot
