"""compile(): programs -> Executable, the planned, lowered and compiled form you can print,
inspect, save and bind. Two stages:

    plan(...)   adapt + validate -> build_graph -> optimize -> fuse -> plan_memory
                -> build_schedule -> binding table          (plan/pipeline.py, no Numba)
    build(plan, target)   kernels rendered for the target, loaded from the disk cache or
                compiled -> Executable

compile(...) is build(plan(...)); it and load() live in compiler.py, which chooses
between an Executable and a BatchedExecutable (batched.py builds on this module).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from . import abi
from .cache import KernelCache, default_cache  # noqa: F401 (default_cache: importable from here too)
from .codegen.loader import (
    Kernel,
    dispatcher_unit,
    kernel_unit,
)
from .errors import SpecError
from .ir.adapt import adapt_programs, adapt_slot_key, adapt_spec
from .ir.ops import Program
from .ir.schema import TensorSpec, format_spec
from .ir.validate import DEFAULT_MAX_BYTES
from .plan.gc_paused import gc_paused
from .plan.options import PlanOptions
from .plan.pipeline import RESULT, Plan
from .plan.pipeline import plan as plan_adapted
from .plan.static import StaticInputs
from .plan.tracks import read_tracks
from .saved import (  # noqa: F401 (SAVE_FORMAT, saved_document: importable from here too)
    SAVE_FORMAT,
    SavedExecutableError,
    check_saved_kernels,
    read_saved,
    saved_document,
    strict_int,
    write_saved,
)
from .semiring import VMSemiringRuntime, adapt_semiring, check_compiled_dtype
from .target import NAMES, Target
from .target import get as get_target
from .tiers import KernelBuild, report_failure
from .tiers import log as tier_log

if TYPE_CHECKING:
    from .plan.arena import MemoryPlan
    from .plan.fusion import Fused
    from .plan.graph import Graph
    from .plan.schedule import Schedule
    from .session import Session

MODES = ("compiled", "loop")
TARGETS = NAMES  # ("cpu", "cuda"): catbp_jit/target/


@dataclass
class Executable:
    plan: Plan
    mode: str
    target: str
    kernels: list[Kernel]
    dispatcher: Any = None
    dispatcher_source: str = ""
    cache_stats: dict[str, float] = field(default_factory=dict)  # counts, and compiled_tier_after_s
    # C entry point of each kernel's compiled code, by kernel id (the dispatcher's calls)
    kernel_addresses: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # "numpy" while the kernels compile in the background (tiers.py), then "compiled"
    tier: str = "compiled"
    kernel_build: KernelBuild | None = None
    gather: Any = None  # a GPU's gather kernel (CudaSession.gatherer), else None
    _failure_said: bool = False

    # what the plan holds, by the names users and tools have read it by
    @property
    def programs(self) -> list[Program]:
        return self.plan.programs

    @property
    def semiring(self) -> VMSemiringRuntime:
        return self.plan.semiring

    @property
    def factor_specs(self) -> dict[int, TensorSpec]:
        return self.plan.factor_specs

    @property
    def selector_specs(self) -> dict[int, TensorSpec]:
        return self.plan.selector_specs

    @property
    def slot_specs(self) -> dict[tuple, TensorSpec]:
        return self.plan.slot_specs

    @property
    def graph(self) -> Graph:
        return self.plan.graph

    @property
    def fused(self) -> Fused:
        return self.plan.fused

    @property
    def memory(self) -> MemoryPlan:
        return self.plan.memory

    @property
    def schedule(self) -> Schedule:
        return self.plan.schedule

    @property
    def dtype(self) -> np.dtype:
        return self.semiring.dtype

    @property
    def target_object(self) -> Target:
        """The Target the kernels were built for (catbp_jit/target/): `target` stays its
        name, the string users pass and saved files record."""
        return get_target(self.target)

    # -- tiers (tiers.py) --------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether the kernels are in place (the compiled tier). In the numpy tier this takes
        the background build's kernels once they have come; sessions ask at every run."""
        if self.tier == "compiled":
            return True
        build = self.kernel_build
        if build is None or not build.done.is_set():
            return False
        if build.error is not None:
            if not self._failure_said:
                self._failure_said = True
                report_failure(build, f"executable of {self._program_names()}")
            return False
        result, seconds = build.result, build.seconds
        assert result is not None and seconds is not None  # (done, and without an error)
        kernels, (dispatcher, dsource) = result
        self.kernels = [kernels[p] for p in self.schedule.patterns]
        self.kernel_addresses = np.array([k.address for k in self.kernels], dtype=np.int64)
        self.dispatcher, self.dispatcher_source = dispatcher, dsource
        self.tier = "compiled"
        self.cache_stats["compiled_tier_after_s"] = round(seconds, 3)
        tier_log.info(
            "compiled tier for %s after %.2f s",
            self._program_names(),
            seconds,
            extra={
                "catbp_jit": {
                    "event": "tier",
                    "tier": "compiled",
                    "seconds": seconds,
                    "kernels": len(self.kernels),
                }
            },
        )
        return True

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the kernels are in place (at most `timeout` seconds): True once they
        are, False on a timeout. Raises the background build's error if it failed."""
        if self.tier == "compiled":
            return True
        build = self.kernel_build
        assert build is not None  # (the numpy tier's kernels are being built)
        if not build.wait(timeout):
            return False
        if build.error is not None:
            raise build.error
        return self.ready()

    def _program_names(self) -> str:
        # (adapt_programs named every program: the p{i} is program_names' fallback, unused)
        return ", ".join(p.name or f"p{i}" for i, p in enumerate(self.programs)) or "programs"

    def bind(self, **hooks: Any) -> Session:
        """A Session: the arenas and the schedule table, allocated here, once (on the
        device too, for target "cuda"). hooks: before= / after= (called around each step),
        numpy_only=True (CPU: a session that computes in the numpy tier for good)."""
        return self.target_object.bind(self, **hooks)

    # -- inspecting ----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        n_ins = sum(len(p) for p in self.programs)
        return {
            "programs": len(self.programs),
            "instructions": n_ins,
            "graph_nodes": len(self.graph.nodes),
            "segments": len(self.fused.segments),
            "steps": len(self.schedule.steps),  # (a repack step before some: plan/repack.py)
            "static_segments": self.plan.n_static,
            "kernels": len(self.schedule.patterns),
            "cache": dict(self.cache_stats),
            "arena_bytes": self.memory.class_bytes(),
            "total_bytes": self.memory.total_bytes,
            "mode": self.mode,
            "target": self.target,
            "tier": self.tier,
        }

    def kernel_source(self, k: int | str = 0) -> str:
        """Generated source of kernel k (its index, pattern name or key), or 'dispatcher'
        (what walks the schedule in mode "compiled": the CPU's dispatcher, the GPU's
        schedule kernel)."""
        if k == "dispatcher":
            if self.target_object.dispatcher and not self.dispatcher_source:  # still compiling
                return dispatcher_unit().source
            if not self.dispatcher_source:  # mode "loop" on a GPU: steps launched from Python
                raise KeyError(f"target {self.target!r} in mode {self.mode!r} has no compiled dispatcher")
            return self.dispatcher_source
        for i, kern in enumerate(self.kernels):
            if k in (i, kern.pattern.name, kern.key):
                return kern.source
        if self.tier == "numpy":  # the kernels are compiling: their sources are known
            for i, pattern in enumerate(self.schedule.patterns):
                if k in (i, pattern.name):
                    return kernel_unit(pattern).source
        names = [p.name for p in self.schedule.patterns]
        raise KeyError(f"no kernel {k!r}; kernels: {names}")

    def kernel_asm(self, k: int | str = 0) -> str:
        """The machine code of CPU kernel k (index, pattern name or key) as assembly text,
        to see what LLVM made of its loops (vector instructions: mulpd/vmulpd, vgather...).
        Cached kernels are stored as object code without their assembly, so the kernel's
        source is compiled again here, uncached, in a scratch module (a second or so)."""
        if not self.target_object.assembly:
            raise KeyError(f"target {self.target!r}: kernel_asm shows CPU kernels only")
        from .codegen.loader import scratch_compile

        source = self.kernel_source(k)
        return scratch_compile(source)

    def as_text(self) -> str:
        """The schedule: arenas, kernels, and each step with its operands and offsets."""
        m = self.memory

        # where a value lives: its arena and byte offset in it
        def region(v):
            return f"{m.regions[v].cls}+{(m.regions[v].offset - m.class_base[m.regions[v].cls]) * m.itemsize}"

        progs = ", ".join(f"{p.name} {len(p)}" for p in self.programs)
        lines = [
            f"executable: {self.semiring.name} {self.dtype.name}, mode {self.mode}, "
            f"target {self.target}; programs {progs}",
            "arenas (bytes): "
            + ", ".join(f"{c} {b}" for c, b in m.class_bytes().items())
            + f"; total {m.total_bytes}",
            f"kernels ({len(self.kernels)}):",
        ]
        if self.tier == "numpy":
            lines[-1] = f"kernels ({len(self.schedule.patterns)}, compiling; steps run in numpy):"
            lines += [f"  K{i} {p.name}" for i, p in enumerate(self.schedule.patterns)]
        lines += [f"  K{i} {k.pattern.name}  key {k.key[:16]}" for i, k in enumerate(self.kernels)]
        static = f", the first {self.plan.n_static_steps} static" if self.plan.n_static_steps else ""
        track_of: dict[int, str] = {}  # step -> " t<its track>" (plan/tracks.py)
        if self.schedule.tracks >= 0:
            walked = read_tracks(self.schedule.table, self.schedule.tracks)
            sizes = " and ".join(str(len(t)) for t in walked)
            static += f"; the dynamic ones in {len(walked)} tracks side by side, of {sizes} segments"
            track_of = {
                s: f" t{k}" for k, t in enumerate(walked) for first, last, _ in t for s in range(first, last)
            }
        lines.append(f"schedule ({len(self.schedule.steps)} steps{static}):")
        for i, st in enumerate(self.schedule.steps):
            seg = st.segment
            if isinstance(st.params, abi.RepackParams):  # (plan/repack.py)
                copied = ", ".join(f"v{seg.leaves[c.leaf]}" for c in st.params.copies)
                kernel = f"K{self.schedule.kernel_id(i)}"
                lines.append(f"  [{i}] {kernel}{track_of.get(i, '')} repack {copied} for [{i + 1}]")
                continue
            leaves = ", ".join(f"v{j}@{region(j)}" for j in seg.leaves)
            red = f" reduce {format_spec(TensorSpec(seg.red_axes))}" if seg.red_axes else ""
            norm = " normalize" if seg.normalize else ""
            norm += f" (total v{seg.total}@{region(seg.total)})" if seg.total is not None else ""
            origin = sorted(
                {
                    f"{prog}[{idx}]"
                    for n in seg.nodes
                    if n in self.graph.nodes
                    for prog, idx in self.graph.nodes[n].origin
                }
            )
            lines.append(
                f"  [{i}] K{self.schedule.kernel_id(i)}{track_of.get(i, '')} v{seg.out}@{region(seg.out)} "
                f"{format_spec(seg.out_spec)} = {leaves}{red}{norm}"
                + (f"   # {' '.join(origin[:4])}{' ...' if len(origin) > 4 else ''}" if origin else "")
            )
        lines.append("slots:")
        stored = {b.ident: b.layout for b in self.plan.bound(RESULT)}
        for key, v in self.fused.outputs.items():
            spec = self.fused.output_specs.get(key, self.fused.specs[v])
            layout = stored.get(key)  # (plan/layout.py: as a GEMM step takes it)
            as_stored = f" stored as {format_spec(layout)}" if layout is not None else ""
            lines.append(f"  {key!r} = v{v}@{region(v)} {format_spec(spec)}{as_stored}")
        return "\n".join(lines)

    # -- saving ----------------------------------------------------------------------------

    def save(self, path: str | os.PathLike) -> None:
        """The programs, specs and options as JSON; `load` re-plans (cheap) and takes the
        kernels from the disk cache, so a saved executable runs under CATBP_JIT_CACHE=strict.
        In the numpy tier it waits for the kernels first (they are what it records)."""
        self.wait()
        doc = saved_document(
            self.programs,
            self.semiring,
            self.mode,
            self.target,
            self.factor_specs,
            self.selector_specs,
            self.slot_specs,
            self.kernels,
            self.plan.options,
        )
        if self.plan.static:
            doc.update(
                static_factors=sorted(self.plan.static.factors),
                static_selectors=sorted(self.plan.static.selectors),
            )
        write_saved(path, doc)


def static_inputs(factors: Any | None, selectors: Any | None) -> StaticInputs:
    """The static ids as given to compile() or plan(), checked to be integers."""

    def ids(given, kind):
        try:
            return frozenset(strict_int(int(i) if isinstance(i, np.integer) else i) for i in (given or ()))
        except TypeError:
            raise TypeError(f"static_{kind}s must be a collection of {kind} ids, got {given!r}") from None

    return StaticInputs(ids(factors, "factor"), ids(selectors, "selector"))


def model_options(target: str, exact: bool | None) -> PlanOptions:
    """The plan options of the front end's models (frontend/build.py, `catbp-jit aot
    MODEL`): compile()'s for the target and mode, without split reductions or sums in
    lanes where the target's models take none (Target.model_splits, model_lane_sums: the
    CPU's, whose reassociating answers stay within 1e-12 of exact mode's; such sums are
    more accurate, so further from exact mode's order)."""
    options = plan_options(target, None, exact=exact)
    if not get_target(target).model_splits and options.split_reductions:
        options = options.with_(split_reductions=False)
    if not get_target(target).model_lane_sums and options.lane_sums:
        options = options.with_(lane_sums=False)
    return options


def plan_options(
    target: str,
    options: PlanOptions | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_total_bytes: int | None = None,
    exact: bool | None = None,
) -> PlanOptions:
    """`options` (else the target's defaults, and in the reassociating mode its defaults
    for that mode) with the byte limits and mode given as arguments. GEMM kernels, kernels
    that repack leaves, streaming stores, line products, window words, lane totals and
    tracks exist on the CPU only."""
    the_target = get_target(target)
    defaults = options is None
    options = options or the_target.plan_options()
    if exact is not None:
        options = options.with_(exact=bool(exact))
    if defaults and not options.exact:
        options = options.with_(**the_target.reassociating_defaults)
    if not the_target.gemm and options.gemm:
        options = options.with_(gemm=False)
    if not the_target.repack and options.repack:
        options = options.with_(repack=False)
    if not the_target.streaming_stores and options.streaming_store_bytes is not None:
        options = options.with_(streaming_store_bytes=None)
    if not the_target.line_products and options.line_products:
        options = options.with_(line_products=False)
    if not the_target.window_words and options.window_words:
        options = options.with_(window_words=False)
    if not the_target.lane_totals and options.lane_totals:
        options = options.with_(lane_totals=False)
    if not the_target.lane_sums and options.lane_sums:
        options = options.with_(lane_sums=False)
    if options.tracks > 1 and not the_target.tracks:
        options = options.with_(tracks=1)
    if max_bytes != DEFAULT_MAX_BYTES:
        options = options.with_(max_bytes=max_bytes)
    if max_total_bytes is not None:
        options = options.with_(max_total_bytes=max_total_bytes)
    return options


def plan(
    programs: Any,
    sr: Any,
    *,
    factor_specs: Mapping[int, Any],
    selector_specs: Mapping[int, Any] | None = None,
    slot_specs: Mapping[Any, Any] | None = None,
    target: str = "cpu",
    options: PlanOptions | None = None,
    static_factors: Any | None = None,
    static_selectors: Any | None = None,
    exact: bool | None = None,
) -> Plan:
    """Only the planning half of compile(): no kernel is rendered or compiled. options:
    the planner's knobs (default the target's, catbp_jit/target/); static_*, exact: as
    compile's."""
    return plan_adapted(
        *adapt_inputs(programs, sr, factor_specs, selector_specs, slot_specs, target, "compiled"),
        plan_options(target, options, exact=exact),
        static=static_inputs(static_factors, static_selectors),
    )


@gc_paused()
def adapt_inputs(
    programs: Any,
    sr: Any,
    factor_specs: Mapping[int, Any],
    selector_specs: Mapping[int, Any] | None,
    slot_specs: Mapping[Any, Any] | None,
    target: str,
    mode: str,
) -> tuple[
    list[Program], VMSemiringRuntime, dict[int, TensorSpec], dict[int, TensorSpec], dict[tuple, TensorSpec]
]:
    """(programs, semiring, factor specs, selector specs, slot specs) in our own types."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    get_target(target)  # (a ValueError naming the available ones)
    sr = adapt_semiring(sr)
    check_compiled_dtype(sr)  # before any planning
    progs = adapt_programs(programs)
    fspecs = {int(k): _known_spec(v, "factor", k) for k, v in (factor_specs or {}).items()}
    sspecs = {int(k): _known_spec(v, "selector", k) for k, v in (selector_specs or {}).items()}
    lspecs = {adapt_slot_key(k): _known_spec(v, "slot", k) for k, v in (slot_specs or {}).items()}
    return progs, sr, fspecs, sspecs, lspecs


def _known_spec(x: Any, kind: str, ident: Any) -> TensorSpec:
    """adapt_spec of an input's declared spec, which planning needs: a None is refused here
    (it failed with an AttributeError deep in planning)."""
    spec = adapt_spec(x)
    if spec is None:
        raise SpecError(
            f"{kind} {ident!r} has no spec (None); compiling needs the spec of every input",
            operand=f"{kind} {ident!r}",
        )
    return spec


def build(
    plan: Plan,
    *,
    target: str = "cpu",
    mode: str = "compiled",
    cache: KernelCache | None = None,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    tier: str | None = None,
) -> Executable:
    """The kernels of a plan's schedule for a target, from the disk cache or compiled.
    tier: "auto" (default: $CATBP_JIT_TIER, else auto) returns at once when kernels are
    cold and the numpy tier can stand in for them (tiers.py); "compiled" waits for them."""
    the_target = get_target(target)
    built = the_target.build(plan, mode=mode, cache=cache, progress=progress, workers=workers, tier=tier)
    return Executable(
        plan,
        mode,
        the_target.name,
        built.kernels,
        built.dispatcher,
        built.dispatcher_source,
        built.cache_stats,
        built.kernel_addresses,
        built.tier,
        built.kernel_build,
        built.gather,
    )
