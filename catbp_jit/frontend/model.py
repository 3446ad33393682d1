"""Compile a factor graph once, then answer any evidence on the chosen variables.

`compile_model` plans a junction tree, emits the three programs and compiles them (the
JIT on the CPU, or the reference interpreter): build.py builds, and `CompiledModel` holds
what it built and answers. `CompiledModel.solve(evidence)` binds the evidence as factor
values and runs: no recompilation. Evidence enters either as indicator
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..ir import Program
from ..semiring import SEMIRING_NAMES
from .answer import Marginals, finish
from .build import (  # noqa: F401
    BATCH_BYTES,
    MAX_CLIQUE_BYTES,
    PLAN_KINDS,
    TARGETS,
    BuiltModel,
    ModelTooLargeError,
    Progress,
    build_model,
)
from .graph import Factor, FactorGraph, factor_graph
from .plan import TreePlan
from .scaling import TINY, NumericalError, ScaledNumber

if TYPE_CHECKING:  # for the checker (batch.py is imported where solve_batch runs: most models never batch)
    from ..batched import BatchedExecutable, BatchedSession
    from ..executable import Executable
    from ..ir import TensorSpec
    from ..semiring import VMSemiringRuntime
    from .absorb import Absorbed
    from .batch import BatchSolution
    from .contraction import ContractionTree
    from .descend import Walk
    from .descend_tree import TreeWalk
    from .map_query import MAP
    from .search import PlanChoice, PlanSearch
    from .tasks import MPE, LogTables, MPEBatch

SEMIRINGS = SEMIRING_NAMES  # the semiring names (semiring.py keeps the list)


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
    evidence: dict[str, int]
    model: CompiledModel = field(repr=False)
    raw_log_scale: float = 0.0

    @property
    def programs(self) -> tuple[Program, ...]:
        return self.model.programs

    @property
    def plan(self) -> TreePlan:
        return self.model.plan


def _built(name: str) -> property:
    return property(lambda self: getattr(self.built, name), doc=f"What build_model built: BuiltModel.{name}.")


class CompiledModel:
    """A model built once (build.py: the plan, the programs, the executable) that answers
    evidence on its evidence variables, one set (solve) or many rows (solve_batch), without
    recompiling. `built` is what build_model built; the model's attributes read it."""

    if TYPE_CHECKING:  # for the checker: the types of the read-only properties below
        graph: FactorGraph
        semiring: str
        sr: VMSemiringRuntime
        target: str
        exact: bool
        plan_search: PlanSearch
        plan_choice: PlanChoice
        plan: TreePlan
        plan_kind: str
        contraction: ContractionTree | None
        stats: dict[str, Any]
        evidence_vars: tuple[str, ...]
        evidence_columns: tuple[str, ...]
        absorbed: Absorbed | None
        planned: FactorGraph
        programs: tuple[Program, ...]
        factor_specs: Mapping[int, TensorSpec]
        scaled: bool
        executable: Executable | None
        buckets: tuple[int, ...] | None
    else:
        graph, semiring, sr, target, exact = map(_built, ("graph", "semiring", "sr", "target", "exact"))
        plan_search, plan_choice, plan, plan_kind, contraction, stats = map(
            _built, ("plan_search", "plan_choice", "plan", "plan_kind", "contraction", "stats")
        )
        evidence_vars, evidence_columns, absorbed, planned = map(
            _built, ("evidence_vars", "evidence_columns", "absorbed", "planned")
        )
        programs, factor_specs, scaled, executable, buckets = map(
            _built, ("programs", "factor_specs", "scaled", "executable", "buckets")
        )

    def __init__(self, graph: FactorGraph, semiring: str = "prob", **options: Any):
        """options: build.build_model's (evidence_vars, absorb_evidence, target, dtype,
        max_clique_bytes, max_total_bytes, buckets, progress, partial_evaluation,
        plan_time, plan_search, plan_kind, exact)."""
        built = build_model(graph, semiring, **options)
        self.built: BuiltModel = built
        t0 = time.perf_counter()
        if built.executable is not None:
            self._session = built.executable.bind()
            self._bound = False
        self._gather: Callable[[], np.ndarray] | None = None  # the answers' elements, read at once
        # compiled by build_model when buckets are given, else on first need
        self.batch_executable: BatchedExecutable | None = None
        self._batch_session: BatchedSession | None = None
        if built.batch_executable is not None:
            self._bind_batched(built.batch_executable)
        # the sessions' buffers are part of compiling, as they always were
        self.times = {**built.times, "compile_s": built.times["compile_s"] + time.perf_counter() - t0}
        self._tables: LogTables | None = None  # (tasks.py, on first need)
        self._columns: tuple[np.ndarray, ...] | None = None  # (tasks.full_states)
        self._walk: Walk | TreeWalk | None = None
        self._read_beliefs: Callable[[], None] = lambda: None
        # models that certify an answer, built on first need (see _companion)
        self._companions: dict[tuple, CompiledModel] = {}

    def batch_buckets(self) -> tuple[int, ...]:
        """The buckets solve_batch plans (BuiltModel.batch_buckets: those asked for whose
        beliefs fit in BATCH_BYTES, at least the smallest)."""
        return self.built.batch_buckets()

    def _bind_batched(self, executable: BatchedExecutable) -> None:
        self.batch_executable = executable
        self._batch_session = executable.bind()
        self._batch_bound = False

    # -- running -----------------------------------------------------------------------------

    def run_slots(self, evidence: Mapping[str, Any] | None = None) -> dict[tuple, np.ndarray | int]:
        """Z, the marginals and (PROB) the scales, as the programs computed them; ("exponent",)
        is the power of two the tables were scaled by (an int)."""
        built = self.built
        out: dict[tuple, np.ndarray | int]
        if built.target_object.compiled:
            exponent = self._run(evidence or {})
            slots = self._session.slots
            # (by key first: a CUDA session copies back only the slots read)
            out = {k: np.array(slots[k][0]) for k in slots if k[0] in ("Z", "marg", "scale")}
            out[("exponent",)] = exponent
            return out
        out = dict(self._reference_slots(evidence or {}))
        out[("exponent",)] = built.evidence_values(evidence or {})[1] + built.exponent
        return out

    def _run(self, evidence: Mapping[str, Any]) -> int:
        """Bind the evidence and run the session (whose results then hold the answer); the
        power of two the tables were scaled by."""
        changing, exponent = self.built.evidence_values(evidence)  # all that differs between calls
        given = changing if self._bound else {**self.built.values, **changing}
        self._session.run(factors=given)
        self._bound = True
        return exponent + self.built.exponent

    def _results(self, evidence: Mapping[str, Any]) -> tuple[np.ndarray, int]:
        """Z, the scales and the planned marginals, flat in the answer layout's order (one
        index into the session's buffer), and the tables' power of two."""
        built = self.built
        if not built.target_object.compiled:  # the reference VM
            slots = self.run_slots(evidence)
            values = [np.ravel(slots[k]) for k in built.answer.keys]
            exponent = slots[("exponent",)]
            assert isinstance(exponent, int)  # the one entry that is no array
            return np.concatenate(values), exponent
        exponent = self._run(evidence)
        if self._gather is None:  # (made once: on a GPU, gathered there, one copy back)
            assert built.gather is not None  # (set by build_model for a compiled target)
            self._gather = self._session.gatherer(built.gather)
        return self._gather().copy(), exponent

    def solve(self, evidence: Mapping[str, Any] | None = None) -> Solution:
        built = self.built
        if built.passes != "both":
            raise ValueError(
                f"{built.graph.name}: this model was built with passes={built.passes!r} (for MPE and "
                "sampling): it has no marginals to solve for"
            )
        evidence = dict(evidence or {})
        values, exponent = self._results(evidence)
        z = values[0]
        states = [built.state_index(v, evidence[v]) for v in built.evidence_vars] if built.absorbed else ()
        raw = built.answer.raw(values, states, built.sr.kind.zero, built.sr.dtype)
        if built.scaled:
            return self._scaled_solution(evidence, values, exponent, raw)
        if built.count_may_wrap:
            self._check_count_fits(evidence)
        return Solution(
            built.semiring,
            *finish(built.kind, z, raw, built.answer),
            Marginals(raw, built.answer.at),
            evidence,
            self,
        )

    def _scaled_solution(
        self, evidence: dict[str, Any], values: np.ndarray, exponent: int, raw: np.ndarray
    ) -> Solution:
        """PROB: Z from the root's total and the scales; raw marginals rescaled to Z."""
        built = self.built
        parts = values[: 1 + built.answer.n_scales].astype(np.float64)
        z = ScaledNumber.product_of(parts, exponent)
        if z.mantissa == 0.0:
            self._check_infeasible(evidence)
        elif parts.min() < TINY:
            raise NumericalError(
                f"{built.graph.name}: PROB underflowed (a message's total fell below "
                f"{TINY:.3g}, so its bits are lost); solve with semiring='logprob'"
            )
        value = z.value()
        marginals = finish(built.kind, 1.0, raw, built.answer)[2]  # each normalized on its own
        at = built.answer.at
        if isinstance(value, float):
            scaled_raw = Marginals(marginals.flat * value if value else raw, at)
            return Solution(built.semiring, value, z.log, marginals, scaled_raw, evidence, self)
        return Solution(
            built.semiring, value, z.log, marginals, marginals, evidence, self, raw_log_scale=z.log
        )

    # -- the other tasks (tasks.py) ------------------------------------------------------------

    def mpe(self, evidence: Mapping[str, Any] | None = None) -> MPE:
        """The most probable assignment of every variable given the evidence (tasks.MPE:
        `.assignment`, `.log_value`), from a MAXLOG junction tree built on first use."""
        from .tasks import mpe

        return mpe(self, evidence or {})

    def mpe_batch(self, rows: Any) -> MPEBatch:
        """MPE for many evidence rows at once (rows as solve_batch takes them)."""
        from .frames import row_index
        from .tasks import mpe_rows

        best = mpe_rows(self, self._evidence_table(rows))
        return replace(best, graph=self.graph, index=row_index(rows))

    def predict(self, frame: Any, names: bool = True) -> Any:
        """pgmpy's `predict`, batched: for each row of `frame` (a pandas DataFrame whose
        columns are evidence variables of this model), the most probable joint state of
        every variable the frame lacks (the MPE given the row), as a DataFrame with the
        frame's index and a column per such variable (state names where the model has
        them; names=False: indices). Rows that repeat are solved once."""
        from .frames import predict

        return predict(self, frame, names)

    def predict_proba(self, frame: Any) -> Any:
        """For each row of `frame` (as predict takes it), the posterior of each variable the
        frame lacks: a DataFrame with the frame's index and a `var=state` column per state."""
        from .frames import predict_proba

        return predict_proba(self, frame)

    def max_marginals(self, evidence: Mapping[str, Any] | None = None) -> Solution:
        """The MAXLOG answer: log_Z is the MPE's log value, raw_marginals[v][s] the log of
        the best product with v = s, marginals[v] those as exp(m - max m) (best: 1)."""
        return self._task_model("MAXLOG").solve(evidence)

    def sample(self, n: int, evidence: Mapping[str, Any] | None = None, seed: Any = None) -> np.ndarray:
        """n exact samples of the posterior given the evidence: an (n, variables) array of
        state indices, columns in the graph's variable order, the same for the same seed
        (numpy.random.default_rng's). Drawn down a LOGPROB junction tree, vectorized."""
        from .tasks import sample

        return sample(self, n, evidence or {}, seed)

    def map(self, query: Any, evidence: Mapping[str, Any] | None = None) -> MAP:
        """Marginal MAP (map_query.py): the most probable joint state of the query
        variables given the evidence (any variables of the graph), every other variable
        summed out. Builds two models per call (a LOGPROB sum, a MAXLOG max)."""
        return map_query(self.graph, query, evidence, target=self.built.target, exact=self.built.exact)

    def _log_tables(self) -> LogTables:
        """The graph's tables as logs, flat, for the log value of assignments (tasks.py)."""
        if self._tables is None:
            from .tasks import log_tables

            self._tables = log_tables(self.built.graph)
        return self._tables

    def _best_row(self, evidence: Mapping[str, Any]) -> tuple[np.ndarray, float]:
        """Run, then walk down the tree over the session's buffer (descend.Walk, or
        descend_tree.TreeWalk): every planned variable's state and the root's best value."""
        from .descend_tree import TreeWalk

        if self._walk is None:
            self._walk = self._make_walk()
        if isinstance(self._walk, TreeWalk):
            self._walk.refresh(self.built.evidence_values(evidence)[0])
        self._run(evidence)
        self._read_beliefs()
        return self._walk.best(self._session.mem)

    def _make_walk(self) -> Walk | TreeWalk:
        from ..plan.pipeline import RESULT
        from .build import tree_leaves
        from .descend import walk
        from .descend_tree import tree_walk

        built = self.built
        assert built.executable is not None  # (compiled targets only)
        kind = "t" if built.contraction is not None else "bel"
        bound = {b.ident[1]: b for b in built.executable.plan.bound(RESULT) if b.ident[0] == kind}
        # (each slot as it lies in memory: plan/pipeline.Binding.layout)
        stored = {n: b.spec if b.layout is None else b.layout for n, b in bound.items()}
        layouts = {n: tuple(axis.id for axis in spec.axes) for n, spec in stored.items()}
        offsets = {n: b.offset for n, b in bound.items()}
        self._read_beliefs = self._session.reader([(kind, n) for n in bound])
        tree = built.contraction
        if tree is None:
            return walk(built.plan, offsets, layouts)
        leaf_ids, leaf_layouts = tree_leaves(built)
        return tree_walk(tree, offsets, layouts, leaf_ids, leaf_layouts, built.values, built.sr.dtype)

    def _evidence_table(self, rows: Any) -> np.ndarray:
        from .batch import evidence_table

        return evidence_table(self.built, rows)

    def _task_model(self, semiring: str, passes: str = "both", junction: bool = True) -> CompiledModel:
        """This model if it runs the passes asked for in `semiring`, else its companion that
        does. junction: a junction tree (what descend.py reads: every clique's belief);
        else this model's kind of tree (one MPE walks down either). MPE and sampling run the
        upward pass alone: a third of the work of all three."""
        built = self.built
        kind = "junction" if junction else built.plan_kind
        if built.semiring == semiring and built.plan_kind == kind and passes == built.passes:
            return self
        return self._companion(semiring, plan_kind=kind, passes=passes)

    def _clique_beliefs(self, table: np.ndarray) -> dict[int, np.ndarray]:
        """Every clique's belief for each evidence row: (rows or 1, *clique shape), copies;
        1 row where the belief does not depend on the evidence."""
        built = self.built
        plan = built.plan
        keys = [("bel", c.id) for c in plan.cliques]
        shape = {c.id: tuple(plan.sizes[v] for v in c.variables) for c in plan.cliques}

        def evidence(row: np.ndarray) -> dict[str, int]:
            return {v: int(s) for v, s in zip(built.evidence_columns, row) if s >= 0}

        if not built.target_object.compiled:  # the oracle, row by row
            each = [self._reference_slots(evidence(row)) for row in table]
            return {
                c: np.stack([np.asarray(s[k]) for s in each]).reshape(-1, *shape[c])
                for c, k in zip(shape, keys)
            }
        if len(table) <= 1 or not built.batched_factor_ids():
            self._run(evidence(table[0]) if len(table) else {})
            return {c: np.array(self._session.slots[k][0]).reshape(1, *shape[c]) for c, k in zip(shape, keys)}
        if self._batch_session is None:
            self._bind_batched(built.compile_batched())
        executable, session = self.batch_executable, self._batch_session
        assert executable is not None and session is not None  # bound now if not before
        from .batch import evidence_factors

        parts: dict[int, list[np.ndarray]] = {c: [] for c in shape}
        largest = executable.buckets[-1]
        for lo in range(0, len(table), largest):
            chunk = table[lo : lo + largest]
            factors, _ = evidence_factors(built, chunk)
            if not self._batch_bound:
                static = set(built.batched_factor_ids())
                factors.update({f: a for f, a in built.values.items() if f not in static})
            slots = session.run(factors=factors, read=keys)
            self._batch_bound = True
            for c, k in zip(shape, keys):
                a = np.asarray(slots[k][0])
                rowed = a.shape != shape[c]  # (a belief that no evidence reaches has no row axis)
                parts[c].append(np.array(a if rowed else np.broadcast_to(a, (len(chunk), *shape[c]))))
        return {c: np.concatenate(p).reshape(-1, *shape[c]) for c, p in parts.items()}

    def _reference_slots(self, evidence: Mapping[str, Any]) -> dict[tuple, np.ndarray]:
        """Every slot the reference interpreter leaves, for one evidence set."""
        from ..reference import run_programs

        built = self.built
        changing, _ = built.evidence_values(evidence)
        values = {**built.values, **changing}
        specs = built.factor_specs
        slots = run_programs(
            list(built.programs),
            built.sr,
            lambda f: (values[f], specs[f]),
            lambda s: (_ for _ in ()).throw(KeyError(s)),
        )
        return {k: np.asarray(a) for k, (a, _) in slots.items()}

    def _companion(
        self,
        semiring: str,
        on_support: bool = False,
        plan_kind: str | None = None,
        passes: str = "both",
        absorbing: tuple[str, ...] | None = None,
    ) -> CompiledModel:
        """The same graph, evidence and target in another semiring, built on first need;
        on_support: with the 0/1 support of our tables (PROB's Z then counts the models);
        plan_kind: the programs to emit (default: this model's); passes: build_model's;
        absorbing: these evidence variables instead, absorbed (frames.py: rows that observe
        all of them run on the smaller cliques this leaves)."""
        key = (semiring, on_support, plan_kind, passes, absorbing)
        if key not in self._companions:
            built = self.built
            graph = built.graph
            if on_support:
                graph = replace(
                    graph,
                    factors=tuple(Factor(f.scope, (f.values != 0).astype(np.float64)) for f in graph.factors),
                )
            self._companions[key] = CompiledModel(
                graph,
                semiring,
                evidence_vars=built.evidence_columns if absorbing is None else absorbing,
                absorb_evidence=built.absorbed is not None or absorbing is not None,
                target=built.target,
                plan_search=built.plan_search,
                plan_kind=plan_kind or built.plan_kind,
                exact=built.exact,
                passes=passes,
            )
        return self._companions[key]

    def _check_infeasible(self, evidence: Mapping[str, Any]) -> None:
        """PROB says Z = 0: true only if no assignment is allowed, which SAT decides exactly
        (a product can underflow to 0 where the model is merely very unlikely)."""
        if self._companion("SAT").solve(evidence).Z:
            raise NumericalError(
                f"{self.built.graph.name}: PROB underflowed to Z = 0, but the model has assignments "
                "of non-zero weight; solve with semiring='logprob'"
            )

    def _check_count_fits(self, evidence: Mapping[str, Any]) -> None:
        """COUNT's sums and products wrap modulo 2^64, which keeps them exact modulo 2^64:
        the answer is the count whenever the count is below 2^63. Scaled PROB on the 0/1
        tables measures the count (as log) to decide."""
        log_count = self._companion("PROB", on_support=True).solve(evidence).log_Z
        if log_count >= _LOG_INT64_LIMIT:
            raise NumericalError(
                f"{self.built.graph.name}: about 10^{log_count / math.log(10):.2f} models, more than "
                "int64 holds (COUNT would wrap); semiring='logprob' on 0/1 tables gives the "
                "log of the count"
            )

    def solve_batch(self, rows: Any) -> BatchSolution:
        """Answers for many evidence rows in one run (batch.py): rows is a sequence of
        {variable: state}, a 2-D integer array (rows x evidence_columns, -1 unobserved
        where the model keeps indicators) or a pandas DataFrame (frames.py). log_Z has
        shape (n,), marginals[v] (n, k); `.to_pandas()` gives them as a DataFrame."""
        from .batch import evidence_table
        from .frames import row_index

        res = self._solve_table(evidence_table(self.built, rows))
        return replace(res, graph=self.graph, index=row_index(rows))

    def _solve_table(self, table: np.ndarray) -> BatchSolution:
        from .batch import Certificates, batch_solution, concatenate, evidence_factors, stack_solutions

        built = self.built
        if not built.target_object.compiled or not built.batched_factor_ids():
            # the oracle, row by row; or no evidence variables: every row is the same model
            evidence = [{v: int(s) for v, s in zip(built.evidence_columns, row) if s >= 0} for row in table]
            return stack_solutions(built, [self.solve(e) for e in evidence], table)
        if self._batch_session is None:
            self._bind_batched(built.compile_batched())
        executable, session = self.batch_executable, self._batch_session
        assert executable is not None and session is not None  # bound now if not before
        # runs of at most the largest bucket, each answered from its views of Z, the scales
        # and the marginals: the session's own chunking would copy every belief out too
        largest = executable.buckets[-1]
        wanted = [("Z",)] + [("marg", i) for i in built.planned_index.values()]
        wanted += list(built.scale_slots)
        certify = Certificates(self._check_infeasible, self._check_count_fits)
        answers = []
        for lo in range(0, max(len(table), 1), largest):
            chunk = table[lo : lo + largest]
            factors, exponent = evidence_factors(built, chunk)
            if not self._batch_bound:
                static = set(built.batched_factor_ids())
                factors.update({f: a for f, a in built.values.items() if f not in static})
            slots = session.run(factors=factors, read=wanted)  # (a GPU: these alone, one copy)
            self._batch_bound = True
            answers.append(batch_solution(built, {k: slots[k][0] for k in wanted}, chunk, exponent, certify))
        return answers[0] if len(answers) == 1 else concatenate(answers)


_LOG_INT64_LIMIT = 63 * math.log(2.0) - 1e-9  # a count at or above 2^63 (or just below)


def map_query(
    graph: FactorGraph,
    query: Any,
    evidence: Mapping[str, Any] | None = None,
    *,
    target: str = "cpu",
    exact: bool | None = None,
) -> MAP:
    """Marginal MAP of a graph (map_query.py): the most probable joint state of the query
    variables given the evidence, every other variable summed out; its two stages are
    junction-tree models on `target`."""
    from .map_query import marginal_map

    def build(stage: FactorGraph, semiring: str) -> CompiledModel:
        return CompiledModel(stage, semiring, target=target, plan_kind="junction", exact=exact)

    return marginal_map(graph, query, evidence or {}, build)


def compile_model(graph: FactorGraph, semiring: str = "prob", **options: Any) -> CompiledModel:
    return CompiledModel(graph, semiring, **options)


def solve(
    var_domains: Any,
    factors: Any = None,
    *,
    semiring: str = "prob",
    evidence: Mapping[str, Any] | None = None,
    target: str = "cpu",
    **options: Any,
) -> Solution:
    """Exact Z and marginals of a discrete factor graph.

    var_domains: {name: domain size} with `factors` as (scope, array) pairs, or a
    FactorGraph (then `factors` is omitted). evidence: {name: state index or name}.
    """
    graph = var_domains if isinstance(var_domains, FactorGraph) else factor_graph(var_domains, factors or ())
    options.setdefault("absorb_evidence", True)  # every evidence variable is observed
    model = CompiledModel(graph, semiring, evidence_vars=tuple(evidence or ()), target=target, **options)
    return model.solve(evidence)
