"""Partial evaluation: inputs declared static (compile(static_factors=...,
static_selectors=...)) make the segments computed from them alone run only in the first
run and in runs that give a static input (plan/static.py, session.py).

Every check compares against the same programs compiled without static inputs, bit for
bit, over several runs of one session in which the dynamic inputs change every run and the
static ones now and then; and counts the steps each run launches (loop mode's `before`
hook; compiled mode: static results poisoned between runs stay poisoned).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

import catbp_jit
from catbp_jit import Program
from catbp_jit.errors import UnknownInputError
from catbp_jit.ir.batch import BatchedCompileError
from catbp_jit.plan.static import StaticInputs, static_values
from catbp_jit.semiring import make_semiring
from frontend_helpers import graphs
from jit_helpers import check_memory_plan, compile_case, count_allocations, settings
from random_programs import Case, G, cases, contract, elim, load, sp, store, unit

# ------------------------------------------------------------------------------ helpers


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


class Counter:
    """The schedule indexes a loop-mode session ran, per run (the `before` hook)."""

    def __init__(self):
        self.runs: list[list[int]] = []

    def before(self, i, step):
        self.runs[-1].append(i)


def run_sequence(case: Case, static: StaticInputs, mode: str, changes: list[int | None]):
    """Run a static-input session and a plain one side by side. changes[r]: the value set
    the static inputs take in run r (None: not given, they keep theirs); the dynamic
    inputs take value set r % n every run. Asserts equal bits; returns the executable and
    the step indexes each run ran (loop mode)."""
    exe = compile_case(case, mode, static_factors=static.factors, static_selectors=static.selectors)
    plain = compile_case(case, mode).bind()
    counter = Counter()
    sess = exe.bind(before=counter.before) if mode == "loop" else exe.bind()
    current = changes[0]
    for r, change in enumerate(changes):
        counter.runs.append([])
        dyn = case.inputs[r % len(case.inputs)]
        if change is not None:
            current = change
        fixed = case.inputs[current]
        given = dict(
            factors={f: a for f, a in dyn.factors.items() if f not in static.factors},
            selectors={s: a for s, a in dyn.selectors.items() if s not in static.selectors},
            slots=dyn.slots,
        )
        if change is not None:
            given["factors"].update({f: fixed.factors[f] for f in static.factors})
            given["selectors"].update({s: fixed.selectors[s] for s in static.selectors})
        every = dict(
            factors={**dyn.factors, **{f: fixed.factors[f] for f in static.factors}},
            selectors={**dyn.selectors, **{s: fixed.selectors[s] for s in static.selectors}},
            slots=dyn.slots,
        )
        got = {k: np.array(v) for k, (v, _) in sess.run(**given).items()}
        want = plain.run(**every)
        assert set(got) == set(want)
        for key in want:
            assert same_bits(got[key], want[key][0]), (
                f"run {r}: slot {key!r} differs from the plain executable"
            )
    return exe, counter.runs


@st.composite
def static_cases(draw):
    case = draw(cases())
    factors = draw(st.sets(st.sampled_from(sorted(case.factor_specs)))) if case.factor_specs else set()
    selectors = draw(st.sets(st.sampled_from(sorted(case.selector_specs)))) if case.selector_specs else set()
    n = len(case.inputs)
    # the first run gives everything; later ones change the static inputs now and then
    changes = [0] + draw(st.lists(st.sampled_from([None, None, 0, n - 1]), min_size=3, max_size=5))
    return case, StaticInputs(frozenset(factors), frozenset(selectors)), changes


def check_steps(exe, runs: list[list[int]], changes: list[int | None], static: StaticInputs):
    n, n_static = len(exe.schedule.steps), exe.plan.n_static_steps
    # a static input the optimized schedule does not read changes nothing when given
    read = any(static.holds(b.kind, b.ident) for b in exe.plan.bindings)
    for r, (ran, change) in enumerate(zip(runs, changes)):
        gives_static = change is not None and read
        first = 0 if (r == 0 or gives_static) else n_static
        assert ran == list(range(first, n)), (r, change, n_static, ran)


def check_static_steps_are_static(exe, static: StaticInputs):
    """The first n_static steps read static values only; no dynamic step could be static.
    (Without static inputs nothing is reordered, constants-only segments included.)"""
    if not static:
        assert exe.plan.n_static == 0
        return
    known = static_values(exe.fused, static)
    for i, st_ in enumerate(exe.schedule.steps):
        static_leaves = all(leaf in known for leaf in st_.segment.leaves)
        assert static_leaves == (i < exe.plan.n_static_steps), (i, st_.segment)


# ------------------------------------------------------------------- random programs


@settings(150)
@given(static_cases())
def test_random_programs_static_inputs_loop_mode(drawn):
    """Equal bits to the plain executable; each run launches exactly the dynamic steps,
    plus the static ones in the first run and in runs that give a static input."""
    case, static, changes = drawn
    note(case.listing())
    note(f"static {static}, changes {changes}")
    exe, runs = run_sequence(case, static, "loop", changes)
    event("some static steps" if exe.plan.n_static else "no static step")
    check_steps(exe, runs, changes, static)
    check_static_steps_are_static(exe, static)
    check_memory_plan(exe, 0)


@settings(30)
@given(static_cases())
def test_random_programs_static_inputs_compiled_mode(drawn):
    case, static, changes = drawn
    note(case.listing())
    run_sequence(case, static, "compiled", changes)


# ------------------------------------------------------------------- hand-made programs

A = sp((G, 0, 4), (G, 1, 4))


def overwrite_program() -> Program:
    """S = Σ_G1 f0 (static) is read by a dynamic step; a later dynamic value of S's size,
    computed after S's last reader, would take S's region under liveness alone, so the
    next run (which skips S) would read it instead of S."""
    return Program(
        (
            load(0, 0),
            elim(1, 0, [(G, 0)]),  # S, static
            load(2, 1),
            contract(3, (2, 1), A),
            elim(4, 3, [(G, 1)]),  # reads S
            elim(5, 2, [(G, 0)]),  # as large as S, made after S's last read
            contract(6, (5, 4), A),
            store(("out",), 6),
        ),
        "overwrite",
    )


@pytest.mark.parametrize("mode", ["loop", "compiled"])
def test_static_value_read_by_a_dynamic_step_is_never_overwritten(mode):
    sr = make_semiring("PROB", np.float64)
    exe = catbp_jit.compile(
        [overwrite_program()], sr, factor_specs={0: A, 1: A}, static_factors={0}, mode=mode
    )
    plain = catbp_jit.compile([overwrite_program()], sr, factor_specs={0: A, 1: A}, mode=mode).bind()
    assert exe.plan.n_static == 1
    s_value = exe.schedule.steps[0].segment.out
    region = exe.memory.regions[s_value]
    assert region.cls == "static"
    for v, r in exe.memory.regions.items():  # nothing shares S's memory
        assert (
            v == s_value or r.offset + r.size <= region.offset or region.offset + region.size <= r.offset
        ), (v, r, region)
    sess = exe.bind()
    rng = np.random.default_rng(12)
    f0 = rng.random((4, 4))
    for r in range(4):
        f1 = rng.random((4, 4))
        got = sess.run(factors={0: f0, 1: f1} if r == 0 else {1: f1})[("out",)][0]
        want = plain.run(factors={0: f0, 1: f1})[("out",)][0]
        assert same_bits(got, want), r


def test_compiled_mode_does_not_rerun_static_steps():
    """Compiled mode walks the schedule inside Numba, so no hook sees its steps: poison
    the static value between runs; a run that gives no static input leaves it poisoned
    (its step did not run), one that gives one writes it again."""
    sr = make_semiring("PROB", np.float64)
    exe = catbp_jit.compile(
        [overwrite_program()], sr, factor_specs={0: A, 1: A}, static_factors={0}, mode="compiled"
    )
    region = exe.memory.regions[exe.schedule.steps[0].segment.out]
    sess = exe.bind()
    f0, f1 = np.full((4, 4), 0.5), np.full((4, 4), 0.25)
    sess.run(factors={0: f0, 1: f1})
    static_part = sess.mem[region.offset : region.offset + 4]
    assert np.array_equal(static_part, np.full(4, 2.0))
    static_part[:] = 7.0
    sess.run(factors={1: f1})
    assert np.array_equal(static_part, np.full(4, 7.0))
    sess.run(factors={0: f0})
    assert np.array_equal(static_part, np.full(4, 2.0))


def test_static_results_are_results_and_constants_are_static():
    """A slot written by a static step is returned in every run; a UNIT-only segment is
    static too."""
    sr = make_semiring("PROB", np.float64)
    prog = Program(
        (
            load(0, 0),
            elim(1, 0, [(G, 0)]),
            store(("s",), 1),
            unit(2, A),
            load(3, 1),
            contract(4, (3, 2), A),
            store(("d",), 4),
        ),
        "mixed",
    )
    counter = Counter()
    exe = catbp_jit.compile([prog], sr, factor_specs={0: A, 1: A}, static_factors={0}, mode="loop")
    sess = exe.bind(before=counter.before)
    f0 = np.arange(16.0).reshape(4, 4)
    for r in range(3):
        counter.runs.append([])
        out = sess.run(factors={0: f0, 1: f0 + r} if r == 0 else {1: f0 + r})
        assert np.array_equal(out[("s",)][0], f0.sum(axis=1))
        assert np.array_equal(out[("d",)][0], f0 + r)
    n = len(exe.schedule.steps)
    assert exe.plan.n_static >= 1
    assert counter.runs == [list(range(n))] + [list(range(exe.plan.n_static, n))] * 2


def test_a_run_allocates_nothing_with_static_inputs():
    sr = make_semiring("PROB", np.float64)
    for mode in ("loop", "compiled"):
        exe = catbp_jit.compile(
            [overwrite_program()], sr, factor_specs={0: A, 1: A}, static_factors={0}, mode=mode
        )
        sess = exe.bind()
        sess.run(factors={0: np.ones((4, 4)), 1: np.ones((4, 4))})
        np_count, per_run = count_allocations(sess, {1: np.ones((4, 4))}, {}, 5)
        assert np_count.allocations == 0, np_count
        assert len(set(per_run)) == 1 and per_run[0] <= (0 if mode == "loop" else 8), per_run


def test_unknown_static_id_is_refused():
    sr = make_semiring("PROB", np.float64)
    with pytest.raises(UnknownInputError, match=r"overwrite.*static_factors.*\[7\]"):
        catbp_jit.compile([overwrite_program()], sr, factor_specs={0: A, 1: A}, static_factors={7})


def test_static_inputs_with_batched_inputs_are_refused():
    sr = make_semiring("PROB", np.float64)
    with pytest.raises(BatchedCompileError, match="static_factors"):
        catbp_jit.compile(
            [overwrite_program()], sr, factor_specs={0: A, 1: A}, static_factors={0}, batched_factors={1}
        )


def test_save_and_load_keep_static_inputs(tmp_path):
    sr = make_semiring("PROB", np.float64)
    exe = catbp_jit.compile([overwrite_program()], sr, factor_specs={0: A, 1: A}, static_factors={0})
    exe.save(tmp_path / "exe.json")
    again = catbp_jit.load(tmp_path / "exe.json")
    assert again.plan.static == StaticInputs(frozenset({0}))
    assert again.plan.n_static == exe.plan.n_static == 1


def test_cuda_session_skips_static_steps_under_the_simulator():
    sr = make_semiring("PROB", np.float64)
    try:
        exe = catbp_jit.compile(
            [overwrite_program()], sr, factor_specs={0: A, 1: A}, static_factors={0}, target="cuda"
        )
        plain = catbp_jit.compile([overwrite_program()], sr, factor_specs={0: A, 1: A}, target="cuda").bind()
    except catbp_jit.errors.CudaUnavailableError as e:  # pragma: no cover
        pytest.skip(str(e))
    counter = Counter()
    sess = exe.bind(before=counter.before)
    rng = np.random.default_rng(3)
    f0 = rng.random((4, 4))
    for r in range(3):
        counter.runs.append([])
        f1 = rng.random((4, 4))
        got = np.array(sess.run(factors={0: f0, 1: f1} if r == 0 else {1: f1})[("out",)][0])
        want = np.array(plain.run(factors={0: f0, 1: f1})[("out",)][0])
        assert same_bits(got, want), r
    n = len(exe.schedule.steps)
    assert counter.runs == [list(range(n))] + [list(range(1, n))] * 2


# ------------------------------------------------------------------------ the front end


def chain_graph(n: int = 8, k: int = 3, seed: int = 5):
    """x0 - x1 - ... - x{n-1}, random positive pairwise tables."""
    from catbp_jit.frontend import factor_graph

    rng = np.random.default_rng(seed)
    sizes = {f"x{i}": k for i in range(n)}
    factors = [((f"x{i}",), rng.random(k) + 0.1) for i in range(n)]
    factors += [((f"x{i}", f"x{i + 1}"), rng.random((k, k)) + 0.1) for i in range(n - 1)]
    return factor_graph(sizes, factors)


def record_first_steps(model) -> list[int]:
    """The first step each later solve runs (0: all; n_static: the dynamic ones)."""
    firsts: list[int] = []
    sess = model._session
    run = sess._execute
    sess._execute = lambda first: (firsts.append(first), run(first))[1]
    return firsts


def assert_same_solution(a, b):
    assert a.log_Z == b.log_Z or (np.isnan(a.log_Z) and np.isnan(b.log_Z))
    assert set(a.marginals) == set(b.marginals)
    for v in a.marginals:
        assert same_bits(a.marginals[v], b.marginals[v]), v


@pytest.mark.parametrize("semiring", ["prob", "logprob"])
@pytest.mark.parametrize("absorb", [True, False])
@pytest.mark.parametrize("plan_kind", ["junction", "contraction"])
def test_front_end_solves_run_only_evidence_dependent_steps(semiring, absorb, plan_kind):
    """Evidence on the chain's last variables: the messages from x0 onwards up to the
    evidence depend on no evidence, so later solves skip them; the answers are the bits of
    the model compiled without partial evaluation (PROB: its scale slots too)."""
    from catbp_jit.frontend import compile_model

    graph = chain_graph()
    ev_vars = ["x6", "x7"]
    model = compile_model(graph, semiring, evidence_vars=ev_vars, absorb_evidence=absorb, plan_kind=plan_kind)
    plain = compile_model(
        graph,
        semiring,
        evidence_vars=ev_vars,
        absorb_evidence=absorb,
        partial_evaluation=False,
        plan_kind=plan_kind,
    )
    assert model.plan_kind == plan_kind
    n_static = model.executable.plan.n_static
    assert n_static > 0 and plain.executable.plan.n_static == 0
    firsts = record_first_steps(model)
    for ev in [{"x6": 0, "x7": 1}, {"x6": 2, "x7": 2}, {"x6": 1, "x7": 0}, {"x6": 0, "x7": 1}]:
        assert_same_solution(model.solve(ev), plain.solve(ev))
    assert firsts == [0] + [n_static] * 3


@settings(25)
@given(st.data())
def test_front_end_random_graphs_equal_the_plain_model(data):
    from catbp_jit.frontend import compile_model

    graph, evidence = data.draw(graphs())
    ev_vars = sorted(evidence)
    semiring = data.draw(st.sampled_from(["prob", "logprob"]))
    model = compile_model(graph, semiring, evidence_vars=ev_vars)
    plain = compile_model(graph, semiring, evidence_vars=ev_vars, partial_evaluation=False)
    for _ in range(3):
        ev = {
            v: data.draw(st.integers(0, graph.variables[v] - 1)) for v in ev_vars if data.draw(st.booleans())
        }
        assert_same_solution(model.solve(ev), plain.solve(ev))
