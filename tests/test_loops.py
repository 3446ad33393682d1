"""The loop-order cost model (plan/loops.py) and the vector kernels it feeds.

What must hold whatever the cost model chooses: every output element gets the same terms,
each with the same leaf elements, and a reducing segment adds its terms in the same order
(so the same rounding). The first tests check the loop nests themselves against a plain
enumeration; the last ones run kernels with each choice forced and want the same bits.
"""

from __future__ import annotations

import itertools
import platform

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec, abi
from catbp_jit.plan.fusion import Fused, Segment
from catbp_jit.plan.layout import choose_layouts
from catbp_jit.plan.loops import (
    ACCESS_COST,
    ACROSS_BOTH,
    ACROSS_OUTPUTS,
    ACROSS_REDUCED,
    MANY_SMALL_REDUCTIONS,
    WINDOW_COST,
    access_cost,
    access_kind,
    access_of,
    canonical_loops,
    lines_per_term,
    loop_nest,
    output_orders,
    set_conflicts,
    whole_lanes,
)
from catbp_jit.plan.options import PlanOptions
from jit_helpers import catbp_jit_inputs, random_factors, session_results
from random_programs import cases

# ------------------------------------------------------------------------ access kinds


@pytest.mark.parametrize(
    "sizes, strides, kind, step",
    [
        ([2, 3], [0, 0], abi.CONSTANT, 0),
        ([2, 3], [3, 1], abi.CONTIGUOUS, 1),
        ([2, 3], [6, 2], abi.STRIDED, 2),
        ([5], [7], abi.STRIDED, 7),
        ([2, 3], [1, 2], abi.GATHERED, 0),
        ([2, 3], [0, 1], abi.GATHERED, 0),  # broadcast along one vector axis: a table
        ([1], [0], abi.CONTIGUOUS, 1),  # one element: any kind reads it; this one stores it
    ],
)
def test_access_kind(sizes, strides, kind, step):
    assert access_kind(sizes, strides) == (kind, step)


def test_a_gathered_access_carries_its_offsets_in_c_order():
    acc = access_of([2, 3], [1, 2])
    assert acc.kind == abi.GATHERED and acc.offsets == (0, 2, 4, 1, 3, 5)
    assert access_of([2, 3], [3, 1]).offsets == ()  # others need no table


def test_a_big_leaf_lacking_an_axis_keeps_a_vector_it_fills():
    """The 12 x 12 3-state grid's sum of 531441 outputs (3 terms each) in lanes, main the
    leaf of 1.6 M elements that lacks output axis 4 (size 3, the output's outermost): the
    orders with axis 4 just outside the innermost axis (rows of 81) and, the leaf beyond
    the caches, just outside the innermost axes a vector holds (axes 2 and 3: rows of 243,
    the small leaf windowed along them); the latter is the cheaper. A leaf that fits in
    the caches gets the first only."""
    sizes = [243, 3, 3, 81, 3]
    operands = [[729, 243, 81, 1, 177147], [0, 27, 1, 0, 9], [729, 243, 81, 1, 0]]
    filled = output_orders(sizes, operands, 256, main=2, fill=True)
    assert [0, 1, 2, 4, 3] in filled and [0, 1, 4, 2, 3] in filled
    assert [0, 1, 4, 2, 3] not in output_orders(sizes, operands, 256, main=2, fill=False)
    reduced = [op + [st] for op, st in zip(operands, (0, 3, 177147))]
    nest = loop_nest(sizes + [3], [0] * 5 + [1], reduced, True, 2, 256, True, None, lanes=True)
    assert nest.across == ACROSS_OUTPUTS and nest.vector_sizes() == [3, 81]


@pytest.mark.parametrize(
    "sizes, strides, cost",
    [
        ((4, 8), (1, 0), WINDOW_COST),  # each line one element, broadcast: a window of 1
        ((8, 2, 4), (2, 0, 1), WINDOW_COST),  # lines of (0 1 2 3 0 1 2 3): within 8
        ((2, 4, 2), (8, 0, 1), WINDOW_COST),  # (0 1 0 1 0 1 0 1), then (8 9 8 9 ...)
        ((4, 2, 4), (1, 8, 2), ACCESS_COST[abi.GATHERED]),  # a line reaches 14 elements on
        ((2, 3), (1, 2), WINDOW_COST),  # (0 2 4 1 3 5): in any order, within 8
        ((4, 3), (1, 2), ACCESS_COST[abi.GATHERED]),  # a line (6 3 5 7): 3 before its first
        ((2, 3), (3, 1), ACCESS_COST[abi.CONTIGUOUS]),  # not gathered: its kind's cost
        ((5,), (7,), ACCESS_COST[abi.STRIDED]),
    ],
)
def test_a_gather_within_windows_costs_less(sizes, strides, cost):
    """A gathered line whose elements lie within 8 of its first is a load and a permute
    (codegen/lines.py): WINDOW_COST; any other gathered one ACCESS_COST's."""
    assert access_kind(sizes, strides)[0] == abi.GATHERED or cost != WINDOW_COST
    assert access_cost(sizes, strides) == cost


# --------------------------------------------------------------------- loop nests


def terms_by_output(sizes, groups, operands):
    """{output offset: [leaf offsets of each term, in the order they are visited]} for a
    loop space walked in C order, output axes outermost (what a kernel's odometer and
    vector amount to, whichever axes the vector takes: it is C order within the nest)."""
    out_axes = [d for d, g in enumerate(groups) if g == 0]
    red_axes = [d for d, g in enumerate(groups) if g == 1]
    terms = {}
    for o in itertools.product(*(range(sizes[d]) for d in out_axes)):
        at = dict(zip(out_axes, o))
        key = sum(i * operands[0][d] for d, i in at.items())
        seq = terms.setdefault(key, [])
        for r in itertools.product(*(range(sizes[d]) for d in red_axes)):
            at.update(zip(red_axes, r))
            seq.append(tuple(sum(i * op[d] for d, i in at.items()) for op in operands[1:]))
    return terms


def c_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.insert(0, step)
        step *= n
    return strides


@st.composite
def segments(draw):
    """A segment's loop space: output and reduced axes, the output and 1-3 leaves each
    holding some of the axes in an order of its own (its layout)."""
    n_out = draw(st.integers(0, 3))
    n_red = draw(st.integers(0, 3))
    sizes = draw(
        st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=n_out + n_red, max_size=n_out + n_red)
    )
    groups = [0] * n_out + [1] * n_red
    rank = n_out + n_red

    def layout(axes):
        axes = draw(st.permutations(axes))
        strides = dict(zip(axes, c_strides([sizes[d] for d in axes])))
        return [strides.get(d, 0) for d in range(rank)]

    operands = [layout(list(range(n_out)))]
    for _ in range(draw(st.integers(1, 3))):
        held = [d for d in range(rank) if draw(st.booleans())]
        operands.append(layout(held))
    return sizes, groups, operands, draw(st.sampled_from([4, 16, 256]))


def reference_order(sizes, groups, operands):
    """The order the nest must keep: canonical form, the reduced axes in the order given
    (the reference interpreter's, as plan/schedule.py passes them), whatever the leaves'
    layouts; and the biggest leaf (the cost model's main)."""
    order = sorted(range(len(sizes)), key=lambda d: (groups[d], -operands[0][d]))
    sizes, groups, operands = canonical_loops(
        [sizes[d] for d in order], [groups[d] for d in order], [[op[d] for d in order] for op in operands]
    )
    main = 1 + max(range(len(operands) - 1), key=lambda j: (np.count_nonzero(operands[j + 1]), -j))
    return sizes, groups, operands, main


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segments(),
    st.sampled_from([None, ACROSS_REDUCED, ACROSS_OUTPUTS, ACROSS_BOTH]),
    st.booleans(),
    st.booleans(),
)
def test_a_nest_keeps_every_term_and_the_order_of_each_sum(segment, across, parallel, lanes):
    sizes, groups, operands, limit = segment
    sizes, groups, operands, main = reference_order(sizes, groups, operands)
    reduce = 1 in groups
    want = terms_by_output(sizes, groups, operands)
    copies = [list(op) for op in operands]
    nest = loop_nest(list(sizes), list(groups), copies, reduce, main, limit, parallel, across, lanes=lanes)
    assert terms_by_output(nest.sizes, nest.groups, nest.operands) == want
    assert 1 <= nest.nb <= nest.end and nest.end <= len(nest.sizes)
    V = int(np.prod(nest.vector_sizes()))
    for i in range(len(nest.operands)):
        acc = nest.access(i)
        if acc.kind == abi.GATHERED:
            assert len(acc.offsets) == V <= limit  # tables stay within the limit
    if not reduce:
        assert nest.across == ACROSS_OUTPUTS


def test_a_long_reduced_axis_is_split_so_the_vector_fills_up():
    # Z[a] = sum_b,c f[a, b, c] g[c, b], (b, c) = (2048, 3): c alone is a vector of 3; b
    # does not fit whole, so 64 of it join c (f contiguous along them, g gathered)
    sizes, groups = [4, 2048, 3], [0, 1, 1]
    operands = [[1, 0, 0], [6144, 3, 1], [0, 1, 2048]]
    nest = loop_nest(sizes, groups, operands, True, 1, 256, False, ACROSS_REDUCED)
    assert nest.sizes == [4, 32, 64, 3] and nest.nb == 2
    assert nest.access(1).kind == abi.CONTIGUOUS and nest.access(2).kind == abi.GATHERED


@pytest.mark.parametrize("reduce", [False, True])
def test_an_output_axis_too_long_for_the_vector_is_split_not_scattered_around(reduce):
    # grid6_d2's Z[a, b, c, d] = f[a, b, d] g[b, c] (sizes 2, 2, 512, 4; Z's c has stride
    # 4): the contiguous 4 of d, then c too long to join whole. Filled with a and b, the
    # vector scattered Z over 16 x 2 x 2 x 4 elements; c split, 64 of it join d and Z is
    # written contiguous. With a reduced axis beside them, so for the sums across outputs.
    sizes, groups = [2, 2, 512, 4], [0, 0, 0, 0]
    operands = [[4096, 2048, 4, 1], [4, 8, 0, 1], [0, 512, 1, 0]]
    if reduce:
        sizes, groups = sizes + [2], groups + [1]
        operands = [operands[0] + [0], operands[1] + [8192], operands[2] + [1024]]
    nest = loop_nest(sizes, groups, operands, reduce, 1, 256, False, ACROSS_OUTPUTS if reduce else None)
    assert nest.vector_sizes() == [64, 4] and nest.access(0).kind == abi.CONTIGUOUS
    assert nest.sizes[: nest.out_rank] == [2, 2, 8, 64, 4]


# ------------------------------------------------------------------- kernels, bit for bit


def assert_same_bits(a, b, what):
    assert set(a) == set(b), what
    for k in a:
        x, y = a[k][0], b[k][0]
        assert x.dtype == y.dtype and x.shape == y.shape, (what, k)

        def bits(a):
            return np.ascontiguousarray(a).reshape(-1).view(np.uint8)

        assert np.array_equal(bits(x), bits(y)), (what, k, x, y)


@settings(
    max_examples=30,  # (five compiles each: ~10 s at 60)
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(cases())
def test_every_vector_choice_gives_the_same_bits(case):
    """Forcing the vector of every reducing segment across its reduced axes or across its
    outputs, or shrinking vectors to single axes (block=1): the same bits as the cost
    model's choice, in every semiring (random programs, loop mode)."""
    results = []
    forced = ("reduced", "outputs", "both")
    for options in (None, *(PlanOptions(across=a) for a in forced), PlanOptions(block=1)):
        exe = catbp_jit.compile(
            case.programs,
            case.sr(),
            factor_specs=case.factor_specs,
            selector_specs=case.selector_specs,
            slot_specs=case.slot_specs or None,
            mode="loop",
            options=options,
        )
        results.append(session_results(exe.bind(), case.inputs[0]))
    for other, name in zip(results[1:], (*(f"across {a}" for a in forced), "block=1")):
        assert_same_bits(results[0], other, name)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86-64 assembly")
def test_a_prob_kernel_multiplies_in_simd_registers(tmp_path):
    """The leaf loops are vectorized: packed double multiplies (mulpd on any x86-64 since
    SSE2; vmulpd with AVX) in the kernel's assembly."""
    from catbp_jit.ir.schema import Axis, AxisType

    G = AxisType.GEOMETRIC
    a, b = Axis(0, G, 64), Axis(1, G, 64)
    program = catbp_jit.Program(
        (
            catbp_jit.Instruction(catbp_jit.OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
            catbp_jit.Instruction(catbp_jit.OpCode.LOAD_FACTOR, 1, {"factor_id": 1}),
            catbp_jit.Instruction(
                catbp_jit.OpCode.CONTRACT, 2, {"inputs": (0, 1), "out_spec": catbp_jit.TensorSpec((a, b))}
            ),
            catbp_jit.Instruction(catbp_jit.OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 2}),
        ),
        "upward",
    )
    exe = catbp_jit.compile(
        program,
        catbp_jit.make_semiring("PROB"),
        mode="loop",
        factor_specs={0: catbp_jit.TensorSpec((a, b)), 1: catbp_jit.TensorSpec((b,))},
    )
    asm = exe.kernel_asm(0)
    assert "mulpd" in asm, "no packed multiply in the kernel"


@pytest.mark.parametrize("semiring", ["PROB", "LOGPROB", "SAT", "COUNT", "MAXLOG"])
@pytest.mark.parametrize("reduce", [False, True])
def test_hoisted_prefixes_give_the_same_bits(semiring, reduce):
    """out[a..f] (⊕ over e, f when reducing) = f0[a] ⊗ f1[a, b] ⊗ f2[b] ⊗ f3[a..f] ⊗ f4[c, f]:
    the first three leaves hold 2 of the 6 axes, so plan/hoist.py multiplies them apart;
    the results must be those of the plan that does not."""
    from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec

    G = AxisType.GEOMETRIC
    ax = [Axis(i, G, 4) for i in range(6)]
    specs = {
        0: TensorSpec((ax[0],)),
        1: TensorSpec((ax[0], ax[1])),
        2: TensorSpec((ax[1],)),
        3: TensorSpec(tuple(ax)),
        4: TensorSpec((ax[2], ax[5])),
    }
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins.append(
        Instruction(OpCode.CONTRACT, 5, {"inputs": (0, 1, 2, 3, 4), "out_spec": TensorSpec(tuple(ax))})
    )
    out = 5
    if reduce:
        ins.append(Instruction(OpCode.ELIMINATE, 6, {"src": 5, "keep_keys": tuple(a.key for a in ax[:4])}))
        out = 6
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": out}))
    program = Program(tuple(ins), "upward")
    sr = catbp_jit.make_semiring(semiring)
    values = random_factors(specs, sr, seed=7, zeros=0.2)
    results = []
    for hoist in (True, False):
        exe = catbp_jit.compile(
            program, sr, factor_specs=specs, mode="loop", options=PlanOptions(hoist=hoist)
        )
        leaves = [seg.leaves for seg in exe.fused.segments]
        assert (len(leaves) == 2) == hoist, leaves  # the prefix is a segment of its own
        results.append(session_results(exe.bind(), catbp_jit_inputs(values)))
    assert_same_bits(results[0], results[1], "hoisted vs not")


def test_a_big_leaf_with_an_output_axis_inside_its_lines_is_read_whole_across_both():
    # out[a, c] = sum_b f[a, b, c] with f's c innermost: summing across reduced axes
    # takes one element in four of each line of f (16 MB) per output, and comes back for
    # the rest three times; across both (when asked), the vector holds whole lines of f,
    # each output adding its terms in the same order
    sizes, groups = [4, 4, 1 << 17], [0, 0, 1]
    operands = [[4, 1, 0], [4 << 17, 1, 4]]

    def nest(across):
        copies = [list(op) for op in operands]
        return loop_nest(list(sizes), list(groups), copies, True, 1, 256, False, across)

    both, reduced = nest(ACROSS_BOTH), nest(ACROSS_REDUCED)
    assert both.across == ACROSS_BOTH and nest(None).across != ACROSS_BOTH  # (only when asked)
    V = int(np.prod(both.vector_sizes()))
    S = int(np.prod(both.sizes[both.end - both.nb : both.end]))
    assert S == 16 and V == 256 and both.access(1).kind == abi.GATHERED
    assert lines_per_term(both, 1) == 1 / 8 and lines_per_term(reduced, 1) >= 4 / 8
    # a smaller one, forced: every output still gets its terms in the order of b
    small = [[4, 1, 0], [256, 1, 4]]
    nest = loop_nest([4, 4, 64], list(groups), [list(op) for op in small], True, 1, 256, False, ACROSS_BOTH)
    assert nest.across == ACROSS_BOTH
    want = terms_by_output([4, 4, 64], groups, small)
    assert terms_by_output(nest.sizes, nest.groups, nest.operands) == want


def test_outputs_whose_lines_share_an_l1_set_are_summed_across_reduced_axes():
    # out[a] = sum_b f[a, b] g[b] with f's b innermost and 512 long: across outputs, a
    # vector of 256 outputs reads 256 lines 4 KiB apart, all in one L1 set (grid6_d2's
    # slowest reductions: 3.9 ns a term, against 1.75 across reduced axes); with b 520
    # long the lines spread over the sets, and the cost model's choice stays across outputs
    def nest(n, across=None):
        ops = [[1, 0], [n, 1], [0, 1]]
        return loop_nest([256, n], [0, 1], ops, True, 1, 256, False, across)

    outputs = nest(512, ACROSS_OUTPUTS)
    assert outputs.vector_sizes() == [256] and set_conflicts(outputs, 1) == 1.0
    assert set_conflicts(nest(512, ACROSS_REDUCED), 1) == 0.0
    assert nest(512).across == ACROSS_REDUCED
    assert set_conflicts(nest(520, ACROSS_OUTPUTS), 1) == 0.0
    assert nest(520).across == ACROSS_OUTPUTS


@pytest.mark.parametrize("mode", ["compiled", "loop"])
def test_a_sum_adds_its_terms_in_the_reference_order_whatever_the_leaf_layout(mode):
    # out[a] = sum_{c, b} f[b, c, a]: the reference interpreter lays the CONTRACT's product
    # out as its spec says, (c, b, a), and sums each output's 35 terms c-major; f itself
    # is b-major in memory. The kernels follow the spec's order, not f's (in f's order,
    # 18 of these 24 outputs came out in the last bits otherwise)
    G = AxisType.GEOMETRIC
    a, b, c = Axis(0, G, 24), Axis(1, G, 5), Axis(2, G, 7)
    ins = (
        Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0}),
        Instruction(OpCode.CONTRACT, 1, {"inputs": (0,), "out_spec": TensorSpec((c, b, a))}),
        Instruction(OpCode.ELIMINATE, 2, {"src": 1, "keep_keys": (a.key,)}),
        Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 2}),
    )
    program, specs = Program(ins, "upward"), {0: TensorSpec((b, c, a))}
    sr = catbp_jit.make_semiring("prob", "float64")
    factors = {0: np.random.default_rng(5).uniform(0.0, 1.0, (5, 7, 24))}
    want = catbp_jit.reference.run_program(program, sr, lambda f: (factors[f], specs[f]), {}.get)
    for across in (None, ACROSS_REDUCED, ACROSS_OUTPUTS):
        exe = catbp_jit.compile(
            [program], sr, factor_specs=specs, mode=mode, options=PlanOptions(across=across)
        )
        got = exe.bind().run(factors=factors)
        assert_same_bits({"x": want[("x",)][0]}, {"x": got[("x",)][0]}, f"across {across}")


def test_a_value_a_reduction_reads_is_laid_out_in_the_order_of_its_sums():
    # v = f ⊗ g over (a, b, c), read by out[a] = sum_{c, b} v: v is stored kept axes
    # first, then the reduced ones as the sum takes them (c, b), so the sum reads it in
    # memory order
    G = AxisType.GEOMETRIC
    a, b, c = Axis(0, G, 2), Axis(1, G, 3), Axis(2, G, 4)
    v = TensorSpec((a, b, c))
    fused = Fused(
        segments=[
            Segment(10, v, (), (0, 1), False, False, ()),
            Segment(11, TensorSpec((a,)), (c, b), (10,), True, False, ()),
        ],
        specs={0: v, 1: v, 10: v, 11: TensorSpec((a,))},
        kinds={0: "factor", 1: "factor", 10: "computed", 11: "computed"},
        attrs={},
        outputs={("x",): 11},
        semiring="PROB",
    )
    assert choose_layouts(fused)[10].keys == (a.key, c.key, b.key)


def test_a_small_reduction_is_decided_by_the_cost_only_where_it_costs_no_kernel():
    # out[a] = sum_b f[b, a], 128 outputs of 8 terms: across outputs, f is read contiguous
    # 128 at a time; across reduced axes, 8-element vectors, one per output. Below
    # SMALL_REDUCTION terms the nest stays across reduced axes unless asked to decide
    def nest(small_by_cost):
        ops = [[1, 0], [1, 128]]
        return loop_nest([128, 8], [0, 1], ops, True, 1, 256, False, None, small_by_cost)

    assert nest(False).across == ACROSS_REDUCED
    assert nest(True).across == ACROSS_OUTPUTS

    def program(big: bool) -> Program:
        # the same small reduction, beside a big one across outputs (or not)
        ins = [Instruction(OpCode.LOAD_FACTOR, 0, {"factor_id": 0})]
        ins.append(Instruction(OpCode.CONTRACT, 1, {"inputs": (0,), "out_spec": SMALL}))
        ins.append(Instruction(OpCode.ELIMINATE, 2, {"src": 1, "keep_keys": (SMALL.axes[1].key,)}))
        ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("small",), "src": 2}))
        if big:
            ins.append(Instruction(OpCode.LOAD_FACTOR, 3, {"factor_id": 1}))
            ins.append(Instruction(OpCode.CONTRACT, 4, {"inputs": (3,), "out_spec": BIG}))
            ins.append(Instruction(OpCode.ELIMINATE, 5, {"src": 4, "keep_keys": (BIG.axes[1].key,)}))
            ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("big",), "src": 5}))
        return Program(tuple(ins), "upward")

    G = AxisType.GEOMETRIC
    SMALL = TensorSpec((Axis(0, G, 8), Axis(1, G, 128)))
    BIG = TensorSpec((Axis(2, G, 64), Axis(3, G, 256)))
    specs = {0: SMALL, 1: BIG}
    rng = np.random.default_rng(3)
    factors = {f: rng.uniform(0.1, 1.0, spec.shape) for f, spec in specs.items()}
    sr = catbp_jit.make_semiring("prob", "float64")

    def small_vector(big: bool, across=None):
        exe = catbp_jit.compile([program(big)], sr, factor_specs=specs, options=PlanOptions(across=across))
        steps = [st for st in exe.schedule.steps if st.segment.out_spec.shape == (128,)]
        out = exe.bind().run(factors=factors)
        return steps[0].pattern.vector, {k: np.array(v, copy=True) for k, (v, _) in out.items()}

    alone, alone_results = small_vector(False)
    beside, beside_results = small_vector(True)
    assert alone == ACROSS_REDUCED and beside == ACROSS_OUTPUTS
    forced, forced_results = small_vector(True, ACROSS_REDUCED)
    assert forced == ACROSS_REDUCED
    assert_same_bits(beside_results, forced_results, "by cost against across reduced axes")
    small = ("small",)
    assert_same_bits({small: alone_results[small]}, {small: beside_results[small]}, "alone, beside")


@pytest.mark.parametrize(
    "semiring, dtype",
    [
        ("PROB", "float64"),
        # a kernel compile each (~5 s; the random programs above force "both" in these too)
        pytest.param("LOGPROB", "float64", marks=pytest.mark.slow),
        pytest.param("PROB", "float32", marks=pytest.mark.slow),
        pytest.param("LOGPROB", "float32", marks=pytest.mark.slow),
        pytest.param("SAT", None, marks=pytest.mark.slow),
        pytest.param("COUNT", None, marks=pytest.mark.slow),
        ("MAXLOG", "float64"),  # the reference's bits too
        pytest.param("MAXLOG", "float32", marks=pytest.mark.slow),
    ],
)
def test_a_vector_across_both_gives_the_bits_of_the_others(semiring, dtype):
    """out[a, c] = ⊕_{b, d} f[a, b, c, d] ⊗ g[b, d] ⊗ h[c], the vector forced across
    reduced axes, across outputs, across both (lanes c and a, a reduced axis split to fill
    it): the same bits, and the reference interpreter's values."""
    from catbp_jit import Axis, AxisType, Instruction, OpCode, Program, TensorSpec
    from catbp_jit.reference import run_program

    G = AxisType.GEOMETRIC
    a, b, c, d = Axis(0, G, 4), Axis(1, G, 6), Axis(2, G, 3), Axis(3, G, 5)
    specs = {0: TensorSpec((a, b, c, d)), 1: TensorSpec((b, d)), 2: TensorSpec((c,))}
    ins = [Instruction(OpCode.LOAD_FACTOR, f, {"factor_id": f}) for f in specs]
    ins.append(Instruction(OpCode.CONTRACT, 3, {"inputs": (0, 1, 2), "out_spec": TensorSpec((a, b, c, d))}))
    ins.append(Instruction(OpCode.ELIMINATE, 4, {"src": 3, "keep_keys": (a.key, c.key)}))
    ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": ("x",), "src": 4}))
    program = Program(tuple(ins), "upward")
    sr = catbp_jit.make_semiring(semiring, dtype)
    values = random_factors(specs, sr, seed=11, zeros=0.3)
    results = {}
    for across in ("reduced", "outputs", "both"):
        exe = catbp_jit.compile(
            program, sr, factor_specs=specs, mode="loop", options=PlanOptions(across=across)
        )
        (step,) = [st for st in exe.schedule.steps if st.pattern.reduce]
        assert step.pattern.vector == across
        results[across] = session_results(exe.bind(), catbp_jit_inputs(values))
    assert_same_bits(results["reduced"], results["both"], "across both vs reduced")
    assert_same_bits(results["outputs"], results["both"], "across both vs outputs")
    with np.errstate(over="ignore"):
        ref = run_program(program, sr, lambda f: (values[f], specs[f]), lambda s: None)
    want, got = np.asarray(ref[("x",)][0]), results["both"][("x",)][0]
    if sr.kind.is_max:  # a max is exact in any order
        assert_same_bits(ref, results["both"], "across both vs the reference")
    elif want.dtype.kind == "f":  # numpy sums pairwise: the reference's last bits differ
        assert np.allclose(got, want, rtol=1e-12 if want.dtype == np.float64 else 1e-5, atol=0), (got, want)
    else:
        assert np.array_equal(got, want)


def test_a_kernel_in_lanes_sums_one_big_leaf_where_it_lies():
    """Σ_r x[o, r], 27 terms in a row per output: beyond the caches, a kernel that sums in
    lanes reads them in place (whole_lanes) rather than across outputs with a stride of 27;
    in the caches, and without lanes, it stays across outputs."""
    for outputs, lanes, whole in ((65536, True, True), (65536, False, False), (4096, True, False)):
        nest = loop_nest([outputs, 27], [0, 1], [[1, 0], [27, 1]], True, 1, 256, True, None, False, lanes)
        assert whole_lanes(nest) == whole and (nest.across == "reduced") == whole, (outputs, lanes)


def test_sums_of_a_leaf_beyond_the_caches_in_lanes_are_taken_across_reduced_axes():
    """A split's partial sums of a 1 GB leaf, 19683 outputs of 6561 terms in a row each:
    across outputs its vector reads the leaf with a stride of 6561, across reduced axes each
    output's terms where they lie, 8 outputs' chains of additions side by side (lanes),
    2.4x faster measured. Without lanes (one chain) the cost keeps the vector across
    outputs, and a leaf the caches hold keeps it so too (grid4x8_d2's sums ran faster so)."""

    def nest(sizes, lanes):
        return loop_nest(list(sizes), [0, 1], [[1, 0], [sizes[1], 1]], True, 1, 256, True, None, lanes=lanes)

    assert nest((19683, 6561), lanes=True).across == ACROSS_REDUCED
    assert nest((19683, 6561), lanes=False).across == ACROSS_OUTPUTS
    assert nest((64, 81), lanes=True).across == ACROSS_OUTPUTS


def test_many_small_reductions_take_the_kernel_across_outputs_of_their_own():
    """The small reduction of the test above, MANY_SMALL_REDUCTIONS times (one per factor):
    together they decide by the cost and take the kernel across outputs; one fewer keep
    their vector across reduced axes (grid4x8_d2: 171 such reductions, a run 2x faster)."""
    G = AxisType.GEOMETRIC
    small = TensorSpec((Axis(0, G, 8), Axis(1, G, 128)))

    def vectors(copies: int) -> set:
        ins = []
        for n in range(copies):
            ins.append(Instruction(OpCode.LOAD_FACTOR, 3 * n, {"factor_id": n}))
            ins.append(Instruction(OpCode.CONTRACT, 3 * n + 1, {"inputs": (3 * n,), "out_spec": small}))
            keep = {"src": 3 * n + 1, "keep_keys": (small.axes[1].key,)}
            ins.append(Instruction(OpCode.ELIMINATE, 3 * n + 2, keep))
            ins.append(Instruction(OpCode.STORE_SLOT, None, {"slot": (f"s{n}",), "src": 3 * n + 2}))
        sr = catbp_jit.make_semiring("prob", "float64")
        specs = {n: small for n in range(copies)}
        plan = catbp_jit.executable.plan([Program(tuple(ins), "upward")], sr, factor_specs=specs)
        return {st.pattern.vector for st in plan.schedule.steps}

    assert vectors(MANY_SMALL_REDUCTIONS) == {ACROSS_OUTPUTS}
    assert vectors(MANY_SMALL_REDUCTIONS - 1) == {ACROSS_REDUCED}


def test_a_big_leaf_is_read_once_where_it_lacks_an_output_axis():
    """out[a, r, m, c] = Σ_b x[b, r, m, c] w[a, m, b], x beyond the caches (531441 float64)
    and without a, the output's outermost axis: in the output's order the kernel reads all
    of x once per position of a, from memory. With a moved in, just outside the vector (c),
    each of x's lines serves every a from L1 (lines_per_term counts them so), and float sums
    take that order (the 12 x 12 3-state grid's such sum of 531441 outputs: 1.1-1.2 ms ->
    0.97-1.03). LOGPROB's (no lanes) keep the output's."""
    sizes, groups = [3, 729, 3, 81, 3], [0, 0, 0, 0, 1]
    operands = [[177147, 243, 81, 1, 0], [0, 243, 81, 1, 177147], [9, 0, 3, 0, 1]]

    def nest(lanes):
        copies = [list(op) for op in operands]
        return loop_nest(list(sizes), list(groups), copies, True, 1, 256, True, None, False, lanes)

    def a_axis(n):
        (d,) = [d for d in range(len(n.sizes)) if n.operands[1][d] == 0 and n.groups[d] == 0]
        return d

    lanes, logs = nest(True), nest(False)
    assert lanes.across == logs.across == ACROSS_OUTPUTS
    assert a_axis(lanes) == lanes.vector_positions()[0] - 1 and a_axis(logs) == 0
    assert lines_per_term(lanes, 1) < lines_per_term(logs, 1) / 2
    # the same loop space, reordered (test_a_nest_keeps_every_term... checks the terms)
    assert sorted(zip(lanes.sizes, lanes.groups)) == sorted(zip(logs.sizes, logs.groups))
