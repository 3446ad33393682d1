"""Compile a factor graph once, then answer any evidence on the chosen variables.

`compile_model` plans a junction tree, emits the three programs and compiles them (the
JIT on the CPU, or the reference interpreter). `CompiledModel.solve(evidence)` binds the
evidence as factor values and runs: no recompilation. Evidence enters either as indicator
factors (the default: any subset of the evidence variables may be observed in a call) or,
with absorb_evidence=True, as the factors cut at the observed states (absorb.py: smaller
cliques, and every call observes all of them). `solve` does both steps, absorbing.
The factors that do not carry evidence are static inputs of the executable (partial
evaluation, plan/static.py): the messages computed from them alone run in the first solve
only; each later solve runs just the evidence-dependent part.
PROB runs scaled (scaling.py): tables and messages are kept near 1 and Z is rebuilt from
their scales, so log Z in the thousands neither overflows nor underflows. An answer that
is not exact is never returned: a Z of 0 in PROB is checked with SAT, and lost precision
raises NumericalError.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import clip, name_list, shown
from ..ir import Program
from ..memory import PlanTooLargeError, format_bytes, memory_limit
from ..plan.gc_paused import gc_paused
from ..plan.pipeline import RESULT
from ..semiring import check_compiled_dtype, make_semiring
from .absorb import absorb, cut_values
from .answer import Marginals, answer_layout, finish
from .emit import emit_programs, factor_specs, scale_slots
from .graph import Factor, FactorGraph, FactorGraphError, factor_graph
from .plan import PlanLimitError, PlanLimits, TreePlan, format_count, junction_tree
from .plan_cache import PlanKey
from .contraction import contraction_tree, tree_from_path
from .emit_tree import contraction_scale_slots, emit_contraction_programs
from .search import PlanSearch, choose_order, plan_cost, tree_cost
from .scaling import TINY, NumericalError, ScaledNumber, pow2_scaled

SEMIRINGS = ("PROB", "LOGPROB", "SAT", "COUNT")
PLAN_KINDS = ("auto", "junction", "contraction")
TARGETS = ("cpu", "cuda", "reference")  # the JIT on the CPU or a GPU; the reference VM
MAX_CLIQUE_BYTES = 2 << 30  # 2 GiB: a belief larger than this is refused, not attempted
# the beliefs of one batched run at most (solve_batch): the knee measured on water and
# pathfinder, beyond which rows per second fall as a run streams through memory
BATCH_BYTES = 512 << 20

Progress = Callable[[str], None]


class ModelTooLargeError(FactorGraphError, PlanTooLargeError):
    """A model whose junction tree exceeds a memory limit: refused while planning, before
    anything is emitted or allocated. Both a FactorGraphError and a PlanTooLargeError."""


@dataclass
class Solution:
    """What one run answers. `marginals` are normalized (SAT: which values are possible);
    `marginals` and `raw_marginals` map each variable to a view of one flat array that
    the solve made (answer.Marginals: a later solve does not change them)."""
    semiring: str
    # PROB, LOGPROB: exp(log_Z), a float, or a decimal.Decimal where a float would be inf or
    # lose bits (|log Z| beyond ~708); COUNT: int; SAT: bool
    Z: Any
    log_Z: float
    marginals: Mapping[str, np.ndarray]  # NaN only where Z = 0 (then they are undefined)
    # in the semiring, unnormalized, times exp(-raw_log_scale): PROB's raw_log_scale is
    # log Z when Z is not a float (the raw marginals then sum to 1), else 0
    raw_marginals: Mapping[str, np.ndarray]
    evidence: Dict[str, int]
    model: "CompiledModel" = field(repr=False)
    raw_log_scale: float = 0.0

    @property
    def programs(self) -> Tuple[Program, ...]:
        return self.model.programs

    @property
    def plan(self) -> TreePlan:
        return self.model.plan


def _semiring_name(semiring: str) -> str:
    name = str(getattr(semiring, "name", semiring)).upper()
    if name not in SEMIRINGS:
        raise ValueError(f"semiring must be one of {', '.join(s.lower() for s in SEMIRINGS)}, "
                         f"got {semiring!r}")
    return name


class CompiledModel:
    def __init__(self, graph: FactorGraph, semiring: str = "prob", *,
                 evidence_vars: Sequence[str] = (), absorb_evidence: bool = False,
                 target: str = "cpu", dtype: Any = None,
                 max_clique_bytes: int = MAX_CLIQUE_BYTES, max_total_bytes: Optional[int] = None,
                 buckets: Optional[Sequence[int]] = None, progress: Optional[Progress] = None,
                 partial_evaluation: bool = True, plan_time: Optional[float] = None,
                 plan_search: Optional[PlanSearch] = None, plan_kind: str = "auto",
                 exact: bool = True):
        """partial_evaluation: the factors that carry no evidence are static inputs, so
        each solve runs only the segments that depend on the evidence (False: every
        segment in every solve; the answers are the same bits). plan_kind: the programs
        emitted from the chosen elimination order, "junction" (a junction tree),
        "contraction" (a contraction tree and its adjoint) or "auto" (the cheaper by
        estimated cost). exact: False compiles in the reassociating mode (compile(...,
        exact=False)): faster on large cliques, answers within rounding of exact mode's."""
        say = progress or (lambda msg: None)
        # plan_time: the search budget in seconds (0: greedy only); plan_search: every option
        if plan_search is None:
            plan_search = PlanSearch() if plan_time is None else PlanSearch(time_s=plan_time)
        elif plan_time is not None:
            plan_search = replace(plan_search, time_s=plan_time)
        self.plan_search = plan_search
        if plan_kind not in PLAN_KINDS:
            raise ValueError(f"plan_kind must be one of {', '.join(PLAN_KINDS)}, got {plan_kind!r}")
        self.graph = graph
        self.semiring = _semiring_name(semiring)
        if target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
        self.target = target
        self.exact = bool(exact)
        self.sr = make_semiring(self.semiring, dtype)
        if target != "reference":
            check_compiled_dtype(self.sr)  # before the plan search, not after
        index = graph.index()
        unknown = [v for v in evidence_vars if v not in index]
        if unknown:
            raise FactorGraphError(f"{graph.name}: evidence on unknown variable(s) "
                                   f"{name_list(unknown, repr)}")
        self.evidence_vars = tuple(sorted(set(evidence_vars), key=index.__getitem__))
        # the columns of solve_batch's evidence tables: the variables in the order given
        self.evidence_columns = tuple(dict.fromkeys(evidence_vars))
        # the graph the plan is over: without the observed variables when they are absorbed
        self.absorbed = absorb(graph, self.evidence_vars) if absorb_evidence else None
        self.planned = self.absorbed.graph if self.absorbed else graph
        ev_idx = [] if self.absorbed else [index[v] for v in self.evidence_vars]
        self._planned_index = self.planned.index()  # variable -> its ("marg", i) slot
        sizes = tuple(self.planned.variables.values())
        scopes = [tuple(self._planned_index[v] for v in f.scope) for f in self.planned.factors]

        # (the collector paused: see plan/gc_paused.py)
        with gc_paused():
            t0 = time.perf_counter()
            say(f"planning {graph.name}: {len(sizes)} variables, {len(scopes)} factors")
            # every belief is kept in a slot: the cliques' states together must fit in memory
            total_given = max_total_bytes
            max_total_bytes = memory_limit(max_total_bytes)
            item = self.sr.dtype.itemsize
            limits = PlanLimits(max_clique_states=max_clique_bytes // item,
                                max_total_states=max_total_bytes // item)
            # filed under the limits asked for, not the memory free at the moment (a cached plan
            # is checked against the current limits before use)
            kinds = ("junction", "contraction") if plan_kind == "auto" else (plan_kind,)
            key = PlanKey(sizes, tuple(map(tuple, scopes)), tuple(ev_idx),
                          self.evidence_vars if self.absorbed else (),
                          replace(limits, max_total_states=None) if total_given is None else limits,
                          kinds)
            try:
                self.plan_choice = choose_order(
                    sizes, scopes, limits=limits, search=plan_search, key=key,
                    progress=lambda msg: say(f"planning {graph.name}: {msg}"),
                    kinds=kinds)
            except PlanLimitError as e:
                run = e.run
                limit = max_clique_bytes if run.stopped == "clique" else max_total_bytes
                raise self._too_large(run.largest_variables, run.largest_states, run.tree_states,
                                      run.stopped, limit, stopped=True) from None
            # both plans of the order, with the evidence indicators the search left out
            self.plan = junction_tree(sizes, scopes, self.plan_choice.order, ev_idx)
            self.stats = self.plan.stats()
            path = self.plan_choice.path  # a searched tree, else the order's
            tree = (tree_from_path(sizes, scopes, path, ev_idx) if path is not None
                    else contraction_tree(sizes, scopes, self.plan_choice.order, ev_idx))
            costs = {"junction": plan_cost(self.plan), "contraction": tree_cost(tree)}
            if plan_kind == "auto":
                plan_kind = min(costs, key=lambda k: (costs[k].flops, k != "junction"))
            self.plan_kind = plan_kind
            # the contraction tree when its programs run (the junction tree is kept either way)
            self.contraction = tree if plan_kind == "contraction" else None
            cost = costs[plan_kind]
            self.stats.update(programs=f"{plan_kind} tree", estimated_flops=cost.flops,
                              peak_bytes=cost.peak_bytes(item),
                              junction_flops=costs["junction"].flops,
                              contraction_flops=costs["contraction"].flops)
            if self.contraction is not None:
                self.stats.update(self.contraction.stats())
            self._check_size(max_clique_bytes, max_total_bytes)
            self.scaled = self.semiring == "PROB"  # see scaling.py
            if self.contraction is not None:
                self.programs = emit_contraction_programs(tree, len(scopes), ev_idx,
                                                          scaled=self.scaled)
                self._scale_slots = contraction_scale_slots(tree) if self.scaled else ()
            else:
                self.programs = emit_programs(self.plan, len(scopes), ev_idx, scaled=self.scaled)
                self._scale_slots = scale_slots(self.plan) if self.scaled else ()
            self.factor_specs = factor_specs(self.plan, scopes, ev_idx)
            self._answer = answer_layout(graph.names, graph.variables, self._planned_index,
                                         self._scale_slots)
            self.times = {"plan_s": time.perf_counter() - t0}

        t0 = time.perf_counter()
        shape = (f"{self.stats['contractions']} contractions, largest loop "
                 f"{self.stats['max_loop_states']} states" if self.contraction is not None else
                 f"{self.stats['cliques']} cliques, largest {self.stats['max_clique_states']} states")
        say(f"compiling {sum(len(p) for p in self.programs)} instructions ({shape}) for {target}")
        # cut factors are bound anew per solve, with their own scales
        rebound = set(self.absorbed.cut) if self.absorbed else set()
        self._values, self._exponent = self._semiring_values(
            {f: fac.values for f, fac in enumerate(self.planned.factors) if f not in rebound})
        self._values.update(self._semiring_values(
            {f: self.planned.factors[f].values for f in rebound})[0])  # placeholders
        # models that certify an answer, built on first need (see _companion)
        self._companions: Dict[str, CompiledModel] = {}
        # COUNT computes modulo 2^64 (int64 wraps); exact whenever the true count < 2^63,
        # which is certain when there are fewer assignments than that
        self._count_may_wrap = self.semiring == "COUNT" and math.prod(sizes) >= 2**63
        if target != "reference":
            from ..executable import compile as jit_compile
            # every factor but the cut factors or indicators keeps its value for good
            static = {f for f in range(len(self.planned.factors))
                      if f not in rebound and f in self.factor_specs} if partial_evaluation else ()
            self.executable = jit_compile(list(self.programs), self.sr, factor_specs=self.factor_specs,
                                          target=target, progress=progress, static_factors=static,
                                          exact=self.exact)
            self._session = self.executable.bind()
            self._bound = False
            results = {b.ident: b for b in self.executable.plan.bound(RESULT)}
            self._gather = self._answer.gather_index(
                {k: b.offset for k, b in results.items()}, {k: b.size for k, b in results.items()})
        self._progress = progress
        self.buckets = tuple(buckets) if buckets is not None else None
        self.batch_executable = None  # compiled here when buckets are given, else on first need
        self._batch_session = None
        if self.buckets is not None and target != "reference" and self._batched_factor_ids():
            self._compile_batched()
        self.times["compile_s"] = time.perf_counter() - t0
        say("compiled")

    def _batched_factor_ids(self) -> Tuple[int, ...]:
        """The factors whose values carry the evidence: indicators, or the cut factors."""
        if self.absorbed is not None:
            return tuple(self.absorbed.cut)
        n = len(self.graph.factors)
        return tuple(range(n, n + len(self.evidence_vars)))

    def batch_buckets(self) -> Tuple[int, ...]:
        """The buckets solve_batch plans: those asked for (default batched.DEFAULT_BUCKETS)
        whose beliefs fit in BATCH_BYTES, at least the smallest. A larger batch runs in
        chunks of the largest: past that size rows stream through memory and get slower
        (water, 3 observed: 166 rows/s at 16 rows a run, 109 at 256, 44 at 1024)."""
        from ..batched import DEFAULT_BUCKETS
        asked = tuple(sorted(self.buckets or DEFAULT_BUCKETS))
        kept = "stored_states" if self.contraction is not None else "total_states"
        row_bytes = max(1, self.stats[kept] * self.sr.dtype.itemsize)
        return tuple(b for b in asked if b * row_bytes <= BATCH_BYTES) or asked[:1]

    def _compile_batched(self) -> None:
        from ..executable import compile as jit_compile
        self.batch_executable = jit_compile(
            list(self.programs), self.sr, factor_specs=self.factor_specs,
            batched_factors=set(self._batched_factor_ids()),
            buckets=self.batch_buckets(), target=self.target, progress=self._progress,
            exact=self.exact)
        self._batch_session = self.batch_executable.bind()
        self._batch_bound = False

    def _check_size(self, max_clique_bytes: int, max_total_bytes: int) -> None:
        """The finished plan against the limits (the greedy runs stop at them already)."""
        if self.contraction is not None:
            return self._check_tree_size(max_clique_bytes, max_total_bytes)
        plan, item = self.plan, self.sr.dtype.itemsize
        largest = max(plan.cliques, key=lambda c: plan.states(c.id))
        states, total = plan.states(largest.id), self.stats["total_states"]
        if states * item > max_clique_bytes:
            raise self._too_large(len(largest.variables), states, total, "clique", max_clique_bytes)
        if total * item > max_total_bytes:
            raise self._too_large(len(largest.variables), states, total, "total", max_total_bytes)

    def _check_tree_size(self, max_clique_bytes: int, max_total_bytes: int) -> None:
        """A contraction tree keeps its internal tensors. (Its joint spaces lie within the
        order's cliques, which planning held to the same limits: the reference VM stores
        them, the JIT fuses them away.)"""
        st, item = self.stats, self.sr.dtype.itemsize
        largest = st["max_stored_states"]
        if largest * item > max_clique_bytes:
            raise ModelTooLargeError(
                f"{self.graph.name}: the contraction tree's largest tensor has "
                f"{format_count(largest)} states ({format_bytes(largest * item)}); the limit is "
                f"{format_bytes(max_clique_bytes)} per tensor (max_clique_bytes)")
        if st["stored_states"] * item > max_total_bytes:
            raise ModelTooLargeError(
                f"{self.graph.name}: the contraction tree keeps {format_count(st['stored_states'])} "
                f"states ({format_bytes(st['stored_states'] * item)}); the limit is "
                f"{format_bytes(max_total_bytes)} in all (max_total_bytes)")

    def _too_large(self, variables: int, states: int, total: int, over: str,
                   limit_bytes: int, stopped: bool = False) -> ModelTooLargeError:
        """The refusal of a plan over a limit: its largest clique, its total and the limit."""
        item, dtype = self.sr.dtype.itemsize, self.sr.dtype.name
        more = " or more (each elimination order tried stopped at the limit)" if stopped else ""
        if over == "clique":
            what = (f"the junction tree's largest clique has {variables} variables and "
                    f"{format_count(states)} states ({format_bytes(states * item)} as {dtype}){more}")
            limit = f"{format_bytes(limit_bytes)} per clique (max_clique_bytes)"
        else:
            what = (f"the junction tree's cliques hold {format_count(total)} states "
                    f"({format_bytes(total * item)} as {dtype}){more}, the largest {variables} "
                    f"variables and {format_count(states)} states")
            limit = (f"{format_bytes(limit_bytes)} for all cliques together "
                     "(max_total_bytes; default: the available memory)")
        return ModelTooLargeError(f"{self.graph.name}: {what}; the limit is {limit}")

    def _semiring_values(self, tables: Mapping[int, np.ndarray]) -> Tuple[Dict[int, np.ndarray], int]:
        """Tables as the programs load them, and (PROB) the power of two they were scaled by."""
        if not self.scaled:
            return {f: self.sr.kind.potentials(a, self.sr.dtype) for f, a in tables.items()}, 0
        out, exponent = {}, 0
        for f, a in tables.items():
            out[f], k = pow2_scaled(a)
            exponent += k
        return {f: self.sr.kind.potentials(a, self.sr.dtype) for f, a in out.items()}, exponent

    # -- evidence ----------------------------------------------------------------------------

    def _evidence_values(self, evidence: Mapping[str, Any]) -> Tuple[Dict[int, np.ndarray], int]:
        """The factor values that carry the evidence: cut factors, or indicators."""
        extra = [v for v in evidence if v not in self.evidence_vars]
        if extra:
            raise FactorGraphError(
                f"{self.graph.name}: evidence on {name_list(extra, repr)}, but this model "
                f"was compiled for evidence on {name_list(self.evidence_vars, repr) or 'no variables'}; "
                "compile with those variables in evidence_vars")
        if self.absorbed:
            missing = [v for v in self.evidence_vars if v not in evidence]
            if missing:
                raise FactorGraphError(
                    f"{self.graph.name}: this model absorbs evidence on "
                    f"{name_list(self.evidence_vars, repr)} and needs a state for each; "
                    f"missing: {name_list(missing, repr)} "
                    "(compile without absorb_evidence to leave some unobserved)")
            states = {v: self._state_index(v, evidence[v]) for v in self.evidence_vars}
            return self._semiring_values(cut_values(self.graph, self.absorbed, states))
        return self._indicators(evidence), 0

    def _indicators(self, evidence: Mapping[str, Any]) -> Dict[int, np.ndarray]:
        """Evidence values as indicator factors (ids after the graph's factors)."""
        out = {}
        n = len(self.graph.factors)
        for k, v in enumerate(self.evidence_vars):
            d = self.graph.variables[v]
            ind = np.ones(d, dtype=np.float64)  # an unobserved evidence variable: all ones
            if v in evidence:
                ind[:] = 0.0
                ind[self._state_index(v, evidence[v])] = 1.0
            out[n + k] = self.sr.kind.potentials(ind, self.sr.dtype)
        return out

    def _state_index(self, v: str, value: Any) -> int:
        d = self.graph.variables[v]
        names = self.graph.states.get(v)
        if isinstance(value, str) and names and value in names:
            return names.index(value)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and 0 <= value < d:
            return int(value)
        allowed = f"0..{d - 1}" + (f" or one of {name_list(names, repr)}" if names else "")
        raise FactorGraphError(f"{self.graph.name}: evidence {clip(v)}={shown(value)} is not a state of "
                               f"{clip(v)} ({allowed})")

    # -- running -----------------------------------------------------------------------------

    def run_slots(self, evidence: Optional[Mapping[str, Any]] = None) -> Dict[tuple, np.ndarray]:
        """Z, the marginals and (PROB) the scales, as the programs computed them; ("exponent",)
        is the power of two the tables were scaled by."""
        if self.target != "reference":
            exponent = self._run(evidence or {})
            slots = self._session.slots
            # (by key first: a CUDA session copies back only the slots read)
            out = {k: np.array(slots[k][0]) for k in slots if k[0] in ("Z", "marg", "scale")}
            out[("exponent",)] = exponent
            return out
        from ..reference import run_programs
        changing, exponent = self._evidence_values(evidence or {})  # all that differs between calls
        exponent += self._exponent
        values = {**self._values, **changing}
        specs = self.factor_specs
        slots = run_programs(list(self.programs), self.sr, lambda f: (values[f], specs[f]),
                             lambda s: (_ for _ in ()).throw(KeyError(s)))
        out = {k: np.asarray(a) for k, (a, _) in slots.items()}
        out[("exponent",)] = exponent
        return out

    def _run(self, evidence: Mapping[str, Any]) -> int:
        """Bind the evidence and run the session (whose results then hold the answer); the
        power of two the tables were scaled by."""
        changing, exponent = self._evidence_values(evidence)  # all that differs between calls
        given = changing if self._bound else {**self._values, **changing}
        self._session.run(factors=given)
        self._bound = True
        return exponent + self._exponent

    def _results(self, evidence: Mapping[str, Any]) -> Tuple[np.ndarray, int]:
        """Z, the scales and the planned marginals, flat in the answer layout's order (one
        index into the session's buffer), and the tables' power of two."""
        if self.target == "reference":
            slots = self.run_slots(evidence)
            values = [np.ravel(slots[k]) for k in self._answer.keys]
            return np.concatenate(values), slots[("exponent",)]
        exponent = self._run(evidence)
        if self.target == "cuda":  # copy back these slots only (not the beliefs and messages)
            for k in self._answer.keys:
                self._session.slots[k]
        return self._session.mem[self._gather], exponent

    def solve(self, evidence: Optional[Mapping[str, Any]] = None) -> Solution:
        evidence = dict(evidence or {})
        values, exponent = self._results(evidence)
        z = values[0]
        states = ([self._state_index(v, evidence[v]) for v in self.evidence_vars]
                  if self.absorbed else ())
        raw = self._answer.raw(values, states, self.sr.kind.zero, self.sr.dtype)
        if self.scaled:
            return self._scaled_solution(evidence, values, exponent, raw)
        if self._count_may_wrap:
            self._check_count_fits(evidence)
        return Solution(self.semiring, *finish(self.semiring, z, raw, self._answer),
                        Marginals(raw, self._answer.at), evidence, self)

    def _scaled_solution(self, evidence: Dict[str, Any], values: np.ndarray, exponent: int,
                         raw: np.ndarray) -> Solution:
        """PROB: Z from the root's total and the scales; raw marginals rescaled to Z."""
        parts = values[:1 + self._answer.n_scales].astype(np.float64)
        z = ScaledNumber.product_of(parts, exponent)
        if z.mantissa == 0.0:
            self._check_infeasible(evidence)
        elif parts.min() < TINY:
            raise NumericalError(
                f"{self.graph.name}: PROB underflowed (a message's total fell below "
                f"{TINY:.3g}, so its bits are lost); solve with semiring='logprob'")
        value = z.value()
        marginals = finish("PROB", 1.0, raw, self._answer)[2]  # each normalized on its own
        at = self._answer.at
        if isinstance(value, float):
            scaled_raw = Marginals(marginals.flat * value if value else raw, at)
            return Solution("PROB", value, z.log, marginals, scaled_raw, evidence, self)
        return Solution("PROB", value, z.log, marginals, marginals, evidence, self,
                        raw_log_scale=z.log)

    def _companion(self, semiring: str) -> "CompiledModel":
        """The same graph, evidence and target in another semiring, built on first need.
        Its PROB tables are the 0/1 support of ours, so its Z counts the models."""
        if semiring not in self._companions:
            graph = self.graph
            if semiring == "PROB":
                graph = replace(graph, factors=tuple(
                    Factor(f.scope, (f.values != 0).astype(np.float64)) for f in graph.factors))
            self._companions[semiring] = CompiledModel(
                graph, semiring, evidence_vars=self.evidence_vars,
                absorb_evidence=self.absorbed is not None, target=self.target,
                plan_search=self.plan_search, plan_kind=self.plan_kind, exact=self.exact)
        return self._companions[semiring]

    def _check_infeasible(self, evidence: Mapping[str, Any]) -> None:
        """PROB says Z = 0: true only if no assignment is allowed, which SAT decides exactly
        (a product can underflow to 0 where the model is merely very unlikely)."""
        if self._companion("SAT").solve(evidence).Z:
            raise NumericalError(
                f"{self.graph.name}: PROB underflowed to Z = 0, but the model has assignments "
                "of non-zero weight; solve with semiring='logprob'")

    def _check_count_fits(self, evidence: Mapping[str, Any]) -> None:
        """COUNT's sums and products wrap modulo 2^64, which keeps them exact modulo 2^64:
        the answer is the count whenever the count is below 2^63. Scaled PROB on the 0/1
        tables measures the count (as log) to decide."""
        log_count = self._companion("PROB").solve(evidence).log_Z
        if log_count >= _LOG_INT64_LIMIT:
            raise NumericalError(
                f"{self.graph.name}: about 10^{log_count / math.log(10):.2f} models, more than "
                "int64 holds (COUNT would wrap); semiring='logprob' on 0/1 tables gives the "
                "log of the count")

    def solve_batch(self, rows: Any) -> "BatchSolution":
        """Answers for many evidence rows in one run (batch.py): rows is a sequence of
        {variable: state} or a 2-D integer array (rows x evidence_columns, -1 unobserved
        where the model keeps indicators). log_Z has shape (n,), marginals[v] (n, k)."""
        from .batch import (batch_solution, concatenate, evidence_factors, evidence_table,
                            stack_solutions)
        table = evidence_table(self, rows)
        if self.target == "reference" or not self._batched_factor_ids():
            # the oracle, row by row; or no evidence variables: every row is the same model
            evidence = [{v: int(s) for v, s in zip(self.evidence_columns, row) if s >= 0}
                        for row in table]
            return stack_solutions(self, [self.solve(e) for e in evidence], table)
        if self._batch_session is None:
            self._compile_batched()
        # runs of at most the largest bucket, each answered from its views of Z, the scales
        # and the marginals: the session's own chunking would copy every belief out too
        largest = self.batch_executable.buckets[-1]
        wanted = [("Z",)] + [("marg", i) for i in self._planned_index.values()]
        wanted += list(self._scale_slots)
        answers = []
        for lo in range(0, max(len(table), 1), largest):
            chunk = table[lo:lo + largest]
            factors, exponent = evidence_factors(self, chunk)
            if not self._batch_bound:
                static = set(self._batched_factor_ids())
                factors.update({f: a for f, a in self._values.items() if f not in static})
            slots = self._batch_session.run(factors=factors)
            self._batch_bound = True
            answers.append(batch_solution(self, {k: slots[k][0] for k in wanted}, chunk, exponent))
        return answers[0] if len(answers) == 1 else concatenate(answers)


_LOG_INT64_LIMIT = 63 * math.log(2.0) - 1e-9  # a count at or above 2^63 (or just below)


def compile_model(graph: FactorGraph, semiring: str = "prob", **options) -> CompiledModel:
    return CompiledModel(graph, semiring, **options)


def solve(var_domains: Any, factors: Any = None, *, semiring: str = "prob",
          evidence: Optional[Mapping[str, Any]] = None, target: str = "cpu",
          **options) -> Solution:
    """Exact Z and marginals of a discrete factor graph.

    var_domains: {name: domain size} with `factors` as (scope, array) pairs, or a
    FactorGraph (then `factors` is omitted). evidence: {name: state index or name}.
    """
    graph = var_domains if isinstance(var_domains, FactorGraph) else factor_graph(var_domains, factors or ())
    options.setdefault("absorb_evidence", True)  # every evidence variable is observed
    model = CompiledModel(graph, semiring, evidence_vars=tuple(evidence or ()), target=target, **options)
    return model.solve(evidence)
