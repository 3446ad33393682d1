"""Building a model: plan a tree, emit its programs, compile them; nothing is answered here.

`build_model(graph, semiring, **options)` checks the options, plans a junction tree (and a
contraction tree) for the graph, refuses a plan over the memory limits, emits the programs
(scaled in PROB: scaling.py) and compiles them (the JIT on the CPU or a GPU; the reference
target compiles nothing). It returns a `BuiltModel`: a frozen record of everything that
answering reads (model.py's CompiledModel answers from it), with the few functions of it
that the answering modules share (state_index, evidence_values, batched_factor_ids, ...).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import clip, name_list, shown
from ..ir import Program, TensorSpec
from ..memory import PlanTooLargeError, format_bytes, memory_limit
from ..plan.gc_paused import gc_paused
from ..plan.pipeline import RESULT
from ..semiring import SEMIRING_NAMES, Semiring, VMSemiringRuntime, check_compiled_dtype, make_semiring
from ..semiring import semiring as semiring_kind
from ..target import MODEL_NAMES, Target, get_for_model
from .absorb import Absorbed, absorb, cut_values
from .answer import AnswerLayout, answer_layout
from .contraction import ContractionTree, contraction_tree, tree_from_path
from .emit import emit_programs, emit_upward_programs, factor_specs, scale_slots
from .emit_tree import contraction_scale_slots, emit_contraction_programs, emit_contraction_upward
from .graph import FactorGraph, FactorGraphError
from .plan import PlanLimitError, PlanLimits, TreePlan, format_count, junction_tree
from .plan_cache import PlanKey
from .scaling import pow2_scaled
from .search import PlanChoice, PlanSearch, choose_order, plan_cost, tree_cost

if TYPE_CHECKING:  # (numba loads with them: imported where compiling happens)
    from ..batched import BatchedExecutable
    from ..executable import Executable

PLAN_KINDS = ("auto", "junction", "contraction")
PASSES = ("both", "upward")
TARGETS = MODEL_NAMES  # the JIT on the CPU or a GPU; the reference VM (catbp_jit/target/)
MAX_CLIQUE_BYTES = 2 << 30  # 2 GiB: a belief larger than this is refused, not attempted
# the beliefs of one batched run at most (solve_batch): the knee measured on water and
# pathfinder, beyond which rows per second fall as a run streams through memory
BATCH_BYTES = 512 << 20

Progress = Callable[[str], None]


class ModelTooLargeError(FactorGraphError, PlanTooLargeError):
    """A model whose junction tree exceeds a memory limit: refused while planning, before
    anything is emitted or allocated. Both a FactorGraphError and a PlanTooLargeError."""


def semiring_name(semiring: Any) -> str:
    """The semiring's name, upper case, from a name or anything with a .name."""
    name = str(getattr(semiring, "name", semiring)).upper()
    if name not in SEMIRING_NAMES:
        raise ValueError(
            f"semiring must be one of {', '.join(s.lower() for s in SEMIRING_NAMES)}, got {semiring!r}"
        )
    return name


@dataclass(frozen=True, eq=False)
class BuiltModel:
    """A compiled model, as answering reads it: the graph, the plan, the programs, the
    executable, and the tables as the programs load them. Built once by build_model."""

    graph: FactorGraph
    semiring: str  # the name, upper case
    sr: VMSemiringRuntime
    target: str  # the name (target_object: the Target)
    exact: bool
    plan_search: PlanSearch
    evidence_vars: tuple[str, ...]  # in the graph's variable order
    evidence_columns: tuple[str, ...]  # solve_batch's evidence columns: the order given
    absorbed: Absorbed | None  # the observed variables cut out (absorb_evidence=True)
    planned: FactorGraph  # the graph the plan is over: without absorbed variables
    planned_index: Mapping[str, int]  # a planned variable -> its ("marg", i) slot
    plan_choice: PlanChoice
    plan: TreePlan  # the junction tree of the chosen order (kept either way)
    stats: dict[str, Any]
    plan_kind: str  # "junction" or "contraction": whose programs run
    passes: str  # "both" (Z and the marginals) or "upward" (beliefs for MPE, sampling)
    contraction: ContractionTree | None  # the contraction tree when its programs run
    programs: tuple[Program, ...]
    scale_slots: tuple[tuple, ...]  # PROB: the scales Z is rebuilt from; else ()
    factor_specs: Mapping[int, TensorSpec]
    answer: AnswerLayout  # where Z, the scales and the marginals are read from
    values: Mapping[int, np.ndarray]  # every factor's values as loaded (cut ones: placeholders)
    exponent: int  # PROB: the power of two the uncut tables were scaled by
    count_may_wrap: bool  # COUNT: the model has 2^63 assignments or more (see check_count_fits)
    executable: Executable | None = None  # the compiled programs (None on the reference target)
    gather: np.ndarray | None = None  # the buffer positions of answer.keys' values
    buckets: tuple[int, ...] | None = None  # asked for; see batch_buckets
    batch_executable: BatchedExecutable | None = None  # compiled by build_model when buckets are given
    progress: Progress | None = None
    times: dict[str, float] = field(default_factory=dict)  # plan_s, compile_s

    @property
    def target_object(self) -> Target:
        return get_for_model(self.target)

    @property
    def kind(self) -> Semiring:
        """The semiring's description (what its results mean)."""
        return self.sr.kind

    @property
    def scaled(self) -> bool:
        """PROB runs scaled: see scaling.py."""
        return self.kind.is_scaled

    def state_index(self, v: str, value: Any) -> int:
        """Variable v's state `value` (an index or a state name) as an index; a
        FactorGraphError names the states v has."""
        return state_index(self.graph, v, value)

    def semiring_values(self, tables: Mapping[int, np.ndarray]) -> tuple[dict[int, np.ndarray], int]:
        """Tables as the programs load them, and (PROB) the power of two they were scaled by."""
        return semiring_values(self.sr, tables)

    def evidence_values(self, evidence: Mapping[str, Any]) -> tuple[dict[int, np.ndarray], int]:
        """The factor values that carry the evidence: cut factors, or indicators; and (PROB)
        the power of two the cut tables were scaled by."""
        extra = [v for v in evidence if v not in self.evidence_vars]
        if extra:
            raise FactorGraphError(
                f"{self.graph.name}: evidence on {name_list(extra, repr)}, but this model "
                f"was compiled for evidence on {name_list(self.evidence_vars, repr) or 'no variables'}; "
                "compile with those variables in evidence_vars"
            )
        if self.absorbed:
            missing = [v for v in self.evidence_vars if v not in evidence]
            if missing:
                raise FactorGraphError(
                    f"{self.graph.name}: this model absorbs evidence on "
                    f"{name_list(self.evidence_vars, repr)} and needs a state for each; "
                    f"missing: {name_list(missing, repr)} "
                    "(compile without absorb_evidence to leave some unobserved)"
                )
            states = {v: self.state_index(v, evidence[v]) for v in self.evidence_vars}
            return self.semiring_values(cut_values(self.graph, self.absorbed, states))
        return self.indicators(evidence), 0

    def indicators(self, evidence: Mapping[str, Any]) -> dict[int, np.ndarray]:
        """Evidence values as indicator factors (ids after the graph's factors)."""
        out = {}
        n = len(self.graph.factors)
        for k, v in enumerate(self.evidence_vars):
            d = self.graph.variables[v]
            ind = np.ones(d, dtype=np.float64)  # an unobserved evidence variable: all ones
            if v in evidence:
                ind[:] = 0.0
                ind[self.state_index(v, evidence[v])] = 1.0
            out[n + k] = self.kind.potentials(ind, self.sr.dtype)
        return out

    def batched_factor_ids(self) -> tuple[int, ...]:
        """The factors whose values carry the evidence: indicators, or the cut factors."""
        if self.absorbed is not None:
            return tuple(self.absorbed.cut)
        n = len(self.graph.factors)
        return tuple(range(n, n + len(self.evidence_vars)))

    def batch_buckets(self) -> tuple[int, ...]:
        """The buckets solve_batch plans: those asked for (default batched.DEFAULT_BUCKETS)
        whose beliefs fit in BATCH_BYTES, at least the smallest. A larger batch runs in
        chunks of the largest: past that size rows stream through memory and get slower
        (water, 3 observed: 166 rows/s at 16 rows a run, 109 at 256, 44 at 1024)."""
        from ..batched import DEFAULT_BUCKETS

        asked = tuple(sorted(self.buckets or DEFAULT_BUCKETS))
        kept = "stored_states" if self.contraction is not None else "total_states"
        row_bytes = max(1, self.stats[kept] * self.sr.dtype.itemsize)
        return tuple(b for b in asked if b * row_bytes <= BATCH_BYTES) or asked[:1]

    def compile_batched(self) -> BatchedExecutable:
        """The programs compiled with the evidence factors batched (batch_buckets' buckets):
        what solve_batch runs. Compiled anew on each call."""
        from ..batched import BatchedExecutable
        from ..compiler import compile as jit_compile
        from ..executable import model_options

        executable = jit_compile(
            list(self.programs),
            self.sr,
            factor_specs=self.factor_specs,
            batched_factors=set(self.batched_factor_ids()),
            buckets=self.batch_buckets(),
            target=self.target,
            progress=self.progress,
            options=model_options(self.target, self.exact),
            exact=self.exact,
        )
        assert isinstance(executable, BatchedExecutable)  # buckets given: batched
        return executable


def state_index(graph: FactorGraph, v: str, value: Any) -> int:
    """Variable v's state `value` (an index or a state name) as an index; a
    FactorGraphError names v's states (v must be one of the graph's variables)."""
    if v not in graph.variables:
        raise FactorGraphError(f"{graph.name}: evidence on unknown variable {clip(v)}")
    d = graph.variables[v]
    names = graph.states.get(v)
    if isinstance(value, str) and names and value in names:
        return names.index(value)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < d:
        return int(value)
    allowed = f"0..{d - 1}" + (f" or one of {name_list(names, repr)}" if names else "")
    raise FactorGraphError(
        f"{graph.name}: evidence {clip(v)}={shown(value)} is not a state of {clip(v)} ({allowed})"
    )


def semiring_values(
    sr: VMSemiringRuntime, tables: Mapping[int, np.ndarray]
) -> tuple[dict[int, np.ndarray], int]:
    """Tables as sr's programs load them, and (PROB) the power of two they were scaled by."""
    kind = sr.kind
    if not kind.is_scaled:
        return {f: kind.potentials(a, sr.dtype) for f, a in tables.items()}, 0
    out, exponent = {}, 0
    for f, a in tables.items():
        out[f], k = pow2_scaled(a)
        exponent += k
    return {f: kind.potentials(a, sr.dtype) for f, a in out.items()}, exponent


def build_model(
    graph: FactorGraph,
    semiring: str = "prob",
    *,
    evidence_vars: Sequence[str] = (),
    absorb_evidence: bool = False,
    target: str = "cpu",
    dtype: Any = None,
    max_clique_bytes: int = MAX_CLIQUE_BYTES,
    max_total_bytes: int | None = None,
    buckets: Sequence[int] | None = None,
    progress: Progress | None = None,
    partial_evaluation: bool = True,
    plan_time: float | None = None,
    plan_search: PlanSearch | None = None,
    plan_kind: str = "auto",
    exact: bool | None = None,
    passes: str = "both",
) -> BuiltModel:
    """Plan, emit and compile a model (the options are compile_model's). partial_evaluation:
    the factors that carry no evidence are static inputs, so each solve runs only the
    segments that depend on the evidence (False: every segment in every solve; the answers
    are the same bits). plan_kind: the programs emitted from the chosen elimination order,
    "junction" (a junction tree), "contraction" (a contraction tree and its adjoint) or
    "auto" (the cheaper by estimated cost). exact: False compiles in the reassociating mode
    (compile(..., exact=False)): faster on large contractions (BLAS GEMM), answers within
    rounding of exact mode's; True keeps exact mode's order of sums (the same bits on every
    run, thread count and batch); None (the default): the target's choice, reassociating on
    the CPU (docs/frontend.md says why), exact elsewhere. plan_time: the search budget in
    seconds (0: greedy only); plan_search: every search option. passes: "both" (up and
    down: Z and every marginal) or "upward" (the upward pass alone, for MPE and sampling,
    tasks.py: a junction tree keeps every clique's belief, a contraction tree every
    tensor; such a model does not solve)."""
    say = progress or (lambda msg: None)
    if plan_search is None:
        plan_search = PlanSearch() if plan_time is None else PlanSearch(time_s=plan_time)
    elif plan_time is not None:
        plan_search = replace(plan_search, time_s=plan_time)
    if plan_kind not in PLAN_KINDS:
        raise ValueError(f"plan_kind must be one of {', '.join(PLAN_KINDS)}, got {plan_kind!r}")
    if passes not in PASSES:
        raise ValueError(f"passes must be one of {', '.join(PASSES)}, got {passes!r}")
    name = semiring_name(semiring)
    if passes == "upward" and semiring_kind(name).is_scaled:
        raise ValueError("passes='upward' keeps unscaled beliefs: not in PROB (use LOGPROB or MAXLOG)")
    the_target = get_for_model(target)  # (a ValueError naming the targets)
    sr = make_semiring(name, dtype)
    if the_target.compiled:
        check_compiled_dtype(sr)  # before the plan search, not after
    index = graph.index()
    unknown = [v for v in evidence_vars if v not in index]
    if unknown:
        raise FactorGraphError(f"{graph.name}: evidence on unknown variable(s) {name_list(unknown, repr)}")
    observed = tuple(sorted(set(evidence_vars), key=index.__getitem__))
    # the graph the plan is over: without the observed variables when they are absorbed
    absorbed = absorb(graph, observed) if absorb_evidence else None
    planned = absorbed.graph if absorbed else graph
    ev_idx = [] if absorbed else [index[v] for v in observed]
    planned_index = planned.index()  # variable -> its ("marg", i) slot
    sizes = tuple(planned.variables.values())
    scopes = [tuple(planned_index[v] for v in f.scope) for f in planned.factors]

    # (the collector paused: see plan/gc_paused.py)
    with gc_paused():
        t0 = time.perf_counter()
        say(f"planning {graph.name}: {len(sizes)} variables, {len(scopes)} factors")
        limits = _Limits(graph.name, sr.dtype, max_clique_bytes, max_total_bytes)
        choice, plan, tree, stats, plan_kind = _plan(
            graph.name,
            sizes,
            scopes,
            ev_idx,
            observed if absorbed else (),
            limits,
            plan_search,
            plan_kind,
            say,
        )
        contraction = tree if plan_kind == "contraction" else None
        if contraction is not None:
            limits.check_tree(stats)
        else:
            limits.check_junction_tree(plan, stats)
        scaled = sr.kind.is_scaled  # see scaling.py
        programs: tuple[Program, ...]
        scales: tuple[tuple, ...]
        if passes == "upward" and contraction is not None:  # (not scaled: checked above)
            programs = (emit_contraction_upward(tree, len(scopes), ev_idx),)
            scales = ()
        elif passes == "upward":
            programs = emit_upward_programs(plan, len(scopes), ev_idx)
            scales = ()
        elif contraction is not None:
            programs = emit_contraction_programs(tree, len(scopes), ev_idx, scaled=scaled)
            scales = contraction_scale_slots(tree) if scaled else ()
        else:
            programs = emit_programs(plan, len(scopes), ev_idx, scaled=scaled)
            scales = scale_slots(plan) if scaled else ()
        specs = factor_specs(plan, scopes, ev_idx)
        # (upward only: no marginal is stored, Z alone is read)
        answer = answer_layout(
            graph.names, graph.variables, planned_index if passes == "both" else {}, scales
        )
        times = {"plan_s": time.perf_counter() - t0}

    t0 = time.perf_counter()
    shape = (
        f"{stats['contractions']} contractions, largest loop {stats['max_loop_states']} states"
        if contraction is not None
        else f"{stats['cliques']} cliques, largest {stats['max_clique_states']} states"
    )
    say(f"compiling {sum(len(p) for p in programs)} instructions ({shape}) for {target}")
    # cut factors are bound anew per solve, with their own scales
    rebound = set(absorbed.cut) if absorbed else set()
    values, exponent = semiring_values(
        sr, {f: fac.values for f, fac in enumerate(planned.factors) if f not in rebound}
    )
    values.update(semiring_values(sr, {f: planned.factors[f].values for f in rebound})[0])  # placeholders
    built = BuiltModel(
        graph=graph,
        semiring=name,
        sr=sr,
        target=target,
        exact=the_target.model_exact if exact is None else bool(exact),
        plan_search=plan_search,
        evidence_vars=observed,
        evidence_columns=tuple(dict.fromkeys(evidence_vars)),
        absorbed=absorbed,
        planned=planned,
        planned_index=planned_index,
        plan_choice=choice,
        plan=plan,
        stats=stats,
        plan_kind=plan_kind,
        passes=passes,
        contraction=contraction,
        programs=programs,
        scale_slots=scales,
        factor_specs=specs,
        answer=answer,
        values=values,
        exponent=exponent,
        # COUNT computes modulo 2^64 (int64 wraps); exact whenever the true count < 2^63,
        # which is certain when there are fewer assignments than that
        count_may_wrap=sr.kind.is_count and math.prod(sizes) >= 2**63,
        buckets=tuple(buckets) if buckets is not None else None,
        progress=progress,
        times=times,
    )
    if the_target.compiled:
        built = _compiled(built, rebound, partial_evaluation)
    if built.buckets is not None and the_target.compiled and built.batched_factor_ids():
        built = replace(built, batch_executable=built.compile_batched())
    times["compile_s"] = time.perf_counter() - t0
    say("compiled")
    return built


def _compiled(built: BuiltModel, rebound: set[int], partial_evaluation: bool) -> BuiltModel:
    """built with its executable, and where the answer's values lie in its buffer."""
    from ..compiler import compile as jit_compile
    from ..executable import Executable, model_options

    # every factor but the cut factors or indicators keeps its value for good
    static = (
        {f for f in range(len(built.planned.factors)) if f not in rebound and f in built.factor_specs}
        if partial_evaluation
        else ()
    )
    executable = jit_compile(
        list(built.programs),
        built.sr,
        factor_specs=built.factor_specs,
        target=built.target,
        progress=built.progress,
        static_factors=static,
        options=model_options(built.target, built.exact),
        exact=built.exact,
    )
    assert isinstance(executable, Executable)  # nothing batched: one executable
    results = {b.ident: b for b in executable.plan.bound(RESULT)}
    gather = built.answer.gather_index({k: results[k].positions() for k in built.answer.keys})
    return replace(built, executable=executable, gather=gather)


def _plan(
    name: str,
    sizes: tuple[int, ...],
    scopes: list[tuple[int, ...]],
    ev_idx: list[int],
    absorbed_vars: tuple[str, ...],
    limits: _Limits,
    search: PlanSearch,
    plan_kind: str,
    say: Progress,
) -> tuple[PlanChoice, TreePlan, ContractionTree, dict[str, Any], str]:
    """The chosen order, its junction tree and contraction tree, their statistics and
    the kind of programs to emit (the cheaper by estimate under "auto")."""
    # filed under the limits asked for, not the memory free at the moment (a cached plan
    # is checked against the current limits before use)
    kinds = ("junction", "contraction") if plan_kind == "auto" else (plan_kind,)
    key = PlanKey(sizes, tuple(map(tuple, scopes)), tuple(ev_idx), absorbed_vars, limits.filed, kinds)
    try:
        choice = choose_order(
            sizes,
            scopes,
            limits=limits.states,
            search=search,
            key=key,
            progress=lambda msg: say(f"planning {name}: {msg}"),
            kinds=kinds,
        )
    except PlanLimitError as e:
        run = e.run
        assert run.stopped is not None  # "clique" or "total": the limit it passed
        raise limits.too_large(
            run.largest_variables, run.largest_states, run.tree_states, run.stopped, stopped=True
        ) from None
    # both plans of the order, with the evidence indicators the search left out
    plan = junction_tree(sizes, scopes, choice.order, ev_idx)
    stats: dict[str, Any] = plan.stats()
    path = choice.path  # a searched tree, else the order's
    tree = (
        tree_from_path(sizes, scopes, path, ev_idx)
        if path is not None
        else contraction_tree(sizes, scopes, choice.order, ev_idx)
    )
    costs = {"junction": plan_cost(plan), "contraction": tree_cost(tree)}
    if plan_kind == "auto":
        plan_kind = min(costs, key=lambda k: (costs[k].flops, k != "junction"))
    cost = costs[plan_kind]
    stats.update(
        programs=f"{plan_kind} tree",
        estimated_flops=cost.flops,
        peak_bytes=cost.peak_bytes(limits.item),
        junction_flops=costs["junction"].flops,
        contraction_flops=costs["contraction"].flops,
    )
    if plan_kind == "contraction":
        stats.update(tree.stats())
    return choice, plan, tree, stats, plan_kind


class _Limits:
    """The memory limits a plan is held to, and the refusals of a plan over them."""

    def __init__(self, name: str, dtype: np.dtype, max_clique_bytes: int, max_total_bytes: int | None):
        # every belief is kept in a slot: the cliques' states together must fit in memory
        self.name, self.item, self.dtype = name, dtype.itemsize, dtype.name
        self.clique_bytes, self.total_bytes = max_clique_bytes, memory_limit(max_total_bytes)
        self.states = PlanLimits(
            max_clique_states=max_clique_bytes // self.item, max_total_states=self.total_bytes // self.item
        )
        # what a searched plan is filed under: the limits given, not the memory free now
        self.filed = replace(self.states, max_total_states=None) if max_total_bytes is None else self.states

    def check_junction_tree(self, plan: TreePlan, stats: Mapping[str, Any]) -> None:
        """The finished plan against the limits (the greedy runs stop at them already)."""
        largest = max(plan.cliques, key=lambda c: plan.states(c.id))
        states, total = plan.states(largest.id), stats["total_states"]
        if states * self.item > self.clique_bytes:
            raise self.too_large(len(largest.variables), states, total, "clique")
        if total * self.item > self.total_bytes:
            raise self.too_large(len(largest.variables), states, total, "total")

    def check_tree(self, st: Mapping[str, Any]) -> None:
        """A contraction tree keeps its internal tensors. (Its joint spaces lie within the
        order's cliques, which planning held to the same limits: the reference VM stores
        them, the JIT fuses them away.)"""
        largest, item = st["max_stored_states"], self.item
        if largest * item > self.clique_bytes:
            raise ModelTooLargeError(
                f"{self.name}: the contraction tree's largest tensor has "
                f"{format_count(largest)} states ({format_bytes(largest * item)}); the limit is "
                f"{format_bytes(self.clique_bytes)} per tensor (max_clique_bytes)"
            )
        if st["stored_states"] * item > self.total_bytes:
            raise ModelTooLargeError(
                f"{self.name}: the contraction tree keeps {format_count(st['stored_states'])} "
                f"states ({format_bytes(st['stored_states'] * item)}); the limit is "
                f"{format_bytes(self.total_bytes)} in all (max_total_bytes)"
            )

    def too_large(
        self, variables: int, states: int, total: int, over: str, stopped: bool = False
    ) -> ModelTooLargeError:
        """The refusal of a plan over a limit: its largest clique, its total and the limit."""
        item, dtype = self.item, self.dtype
        more = " or more (each elimination order tried stopped at the limit)" if stopped else ""
        if over == "clique":
            what = (
                f"the junction tree's largest clique has {variables} variables and "
                f"{format_count(states)} states ({format_bytes(states * item)} as {dtype}){more}"
            )
            limit = f"{format_bytes(self.clique_bytes)} per clique (max_clique_bytes)"
        else:
            what = (
                f"the junction tree's cliques hold {format_count(total)} states "
                f"({format_bytes(total * item)} as {dtype}){more}, the largest {variables} "
                f"variables and {format_count(states)} states"
            )
            limit = (
                f"{format_bytes(self.total_bytes)} for all cliques together "
                "(max_total_bytes; default: the available memory)"
            )
        return ModelTooLargeError(f"{self.name}: {what}; the limit is {limit}")


def tree_leaves(built: BuiltModel) -> tuple[dict[int, int], dict[int, tuple[int, ...]]]:
    """Per leaf of the contraction tree that loads a factor: the factor id the programs
    load (a graph factor, or the indicator after them) and its table's axes (the scope's
    order; the leaf lists them sorted)."""
    tree = built.contraction
    assert tree is not None
    n_factors = len(built.planned.factors)
    observed = sorted(built.planned_index[v] for v in built.evidence_vars if v in built.planned_index)
    indicator = {v: n_factors + k for k, v in enumerate(observed)}
    ids = {
        node.id: node.leaf.ident if node.leaf.kind == "factor" else indicator[node.leaf.ident]
        for node in tree.nodes
        if node.leaf is not None and node.leaf.kind != "unit"
    }
    return ids, {n: tuple(axis.id for axis in built.factor_specs[f].axes) for n, f in ids.items()}
