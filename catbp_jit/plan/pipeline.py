"""plan(): adapted programs -> Plan, everything that does not need a compiler.

    validate -> build_graph -> optimize -> fuse -> hoist_prefixes (exact, and MAXLOG) or
    reassociate, then (not exact) normalize_totals and split_reductions, when asked ->
    share_permuted -> fold_products -> choose_layouts -> start_early (two tracks or more)
    -> static_first -> plan_memory
    (with the workspace of GEMM steps' copies and of repacked leaves, plan/repack.py)
    -> build_schedule (GEMM steps, plan/gemm.py, else loop kernels) -> with_tracks (where the
    segments run in tracks, plan/tracks.py, whose estimate plan_memory took), and the binding
    table

A Plan is plain data: a target renders its schedule's kernel patterns (codegen/cpu.py,
codegen/cuda.py) and a session binds its memory by reading `bindings` alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ..ir.ops import Program
from ..ir.schema import TensorSpec
from ..ir.validate import check_programs
from ..memory import PlanTooLargeError, format_bytes, memory_limit
from ..progress import Progress, silent
from ..semiring import VMSemiringRuntime, semiring
from .arena import MemoryPlan, plan_memory
from .early import start_early
from .folded import fold_products
from .fusion import Fused, fuse
from .gc_paused import gc_paused
from .gemm import GEMM_DTYPES, gemm_groups, gemm_workspace, program_takes_gemm
from .graph import FACTOR, SELECTOR, SLOT_IN, UNIT, Graph, build_graph
from .hoist import hoist_prefixes
from .layout import choose_layouts
from .narrowed import narrow_values
from .options import PlanOptions
from .passes import optimize
from .permuted import share_permuted
from .reassociate import reassociate
from .schedule import Schedule, SegmentLoops, build_schedule, loop_segments, read_cost, repack_workspace
from .split import split_reductions
from .static import StaticInputs, check_static_ids, persistent_values, static_first, static_values
from .totals import normalize_totals
from .tracks import TrackTimes, affordable, choose_tracks, memory_plans, with_tracks

# Binding kinds: what a session writes before a run, and what it reads after one.
FACTOR_INPUT, SELECTOR_INPUT, SLOT_INPUT = "factor", "selector", "slot"
CONSTANT, RESULT = "constant", "result"
INPUT_KINDS = {FACTOR: FACTOR_INPUT, SELECTOR: SELECTOR_INPUT, SLOT_IN: SLOT_INPUT, UNIT: CONSTANT}


@dataclass(frozen=True)
class Binding:
    """Where one input, constant or result lives in the session's buffer."""

    kind: str  # factor, selector, slot (handed in), constant, result
    ident: Any  # factor or selector id, slot key; None for a constant
    offset: int  # in elements from the start of the buffer
    size: int  # elements of its region
    spec: TensorSpec  # as stored (a result: as the program declared it)
    # a result the layout pass stored in another order (plan/layout.py): its axes in the
    # order they lie in memory (C order over them); None: as `spec`
    layout: TensorSpec | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    def view(self, mem: np.ndarray) -> np.ndarray:
        """Its elements in the buffer `mem`, indexed as `spec` (a view, never a copy)."""
        return self._arranged(mem[self.offset : self.offset + self.size])

    def positions(self) -> np.ndarray:
        """Where each of its elements lies in the buffer, in `spec`'s C order."""
        return self._arranged(np.arange(self.offset, self.offset + self.size, dtype=np.intp)).ravel()

    def _arranged(self, region: np.ndarray) -> np.ndarray:
        if self.layout is None:
            return region.reshape(self.shape)
        keys = self.layout.keys
        return region.reshape(self.layout.shape).transpose([keys.index(k) for k in self.spec.keys])


@dataclass
class Plan:
    programs: list[Program]
    semiring: VMSemiringRuntime
    factor_specs: dict[int, TensorSpec]
    selector_specs: dict[int, TensorSpec]
    slot_specs: dict[tuple, TensorSpec]
    options: PlanOptions
    batch_key: tuple | None
    graph: Graph
    fused: Fused
    memory: MemoryPlan
    schedule: Schedule
    bindings: list[Binding] = field(default_factory=list)
    static: StaticInputs = StaticInputs()  # inputs declared static (plan/static.py)
    n_static: int = 0  # fused.segments[:n_static] are the static segments
    n_static_steps: int = 0  # ... and schedule.steps[:n_static_steps] their steps

    def bound(self, kind: str) -> list[Binding]:
        return [b for b in self.bindings if b.kind == kind]


@gc_paused()
def plan(
    progs: list[Program],
    sr: VMSemiringRuntime,
    fspecs: dict[int, TensorSpec],
    sspecs: dict[int, TensorSpec],
    lspecs: dict[tuple, TensorSpec],
    options: PlanOptions = PlanOptions(),
    batch_key: tuple | None = None,
    static: StaticInputs = StaticInputs(),
    progress: Progress | None = None,
) -> Plan:
    """The plan of adapted programs. batch_key: the batch axis of programs rewritten by
    ir/batch.py (their NORMALIZEs work per row), else None. static: the inputs whose
    segments run only when they change (plan/static.py). A plan whose arenas exceed
    options.max_total_bytes raises PlanTooLargeError. progress: hears a line per stage
    (and counts, in long ones: progress.py)."""
    say = progress or silent
    check_static_ids(static, fspecs.keys(), sspecs.keys(), program_names(progs))
    say(f"planning: checking {sum(len(p) for p in progs):,} instructions")
    checked = check_programs(
        progs,
        factor_specs=fspecs,
        selector_specs=sspecs,
        slot_specs=lspecs,
        itemsize=sr.dtype.itemsize,
        max_bytes=options.max_bytes,
    )
    say("planning: the graph and its passes")
    graph = optimize(build_graph(checked, sr.name, lspecs))
    say(f"planning: fusing {len(graph.nodes):,} nodes")
    # opt-in: regroup products and sums (plan/reassociate.py), where the semiring allows it
    regroup = not options.exact and semiring(sr.name).regroups_products
    # (the reassociating mode fuses as exact mode does, second inputs included: its paths
    # then start from fewer, bigger segments. grid5_d3 reassociating 267-270 -> 240-243 ms,
    # its arena 638 -> 527 MB; UAI 2014 within noise)
    fused = fuse(graph, options.max_leaves)
    if options.narrow:  # a product over a clique's space of a few small leaves (plan/narrowed.py)
        fused = narrow_values(fused, batch_key)
    if regroup:
        fused = reassociate(fused, batch_key)
    elif options.hoist:  # (a path of pairwise products needs no hoisting)
        fused = hoist_prefixes(fused)
    if not options.exact:
        fused = normalize_totals(fused, batch_key)  # a NORMALIZE writes its total (plan/totals.py)
        # few outputs, many terms: partial sums (plan/split.py); after the totals, which a
        # split would keep apart (a tensor's scale is a sum to one output)
        if options.split_reductions:
            fused = split_reductions(fused, batch_key, options.split_min_terms, options.split_outputs_below)
    if options.twins:  # what an earlier segment computed, in another axis order (plan/permuted.py)
        fused = share_permuted(fused)
    # a product read by one reader, computed inside it (plan/folded.py)
    unchanging = static_values(fused, static) if static else set()
    fused = fold_products(fused, options.max_leaves, regroup, unchanging)
    # layouts first: they break ties by program order, and must not depend on `static`
    say(f"planning: memory and layouts of {len(fused.segments):,} segments")
    # (where two-leaf reductions may be GEMM steps, which copy operands into the order they
    # need, products are stored as they read their leaves instead: plan/layout.py)
    if options.gemm and not options.exact and not program_takes_gemm(fused, sr.dtype.name, options):
        options = options.with_(gemm=False)  # (small contractions only: not worth the kernel)
    gemm_readers = (
        not options.exact and options.gemm and sr.dtype.name in GEMM_DTYPES and semiring(sr.name).sums_reals
    )
    groups = partial(gemm_groups, fused=fused, dtype=sr.dtype.name, options=options)
    costs = partial(read_cost, fused=fused, dtype=sr.dtype.name, batch_key=batch_key, options=options)
    layouts = choose_layouts(
        fused, batch_key, groups if gemm_readers else None, options.gemm_result_layouts, costs
    )
    if options.tracks > 1:  # (a long sum beside the rest: after the layouts, which ties order)
        fused = start_early(fused, options.chain_min_terms)
    fused, n_static = static_first(fused, static)
    persistent = persistent_values(fused, n_static)

    def memory_with(options: PlanOptions) -> tuple[MemoryPlan, dict[tuple, SegmentLoops], TrackTimes | None]:
        """The memory plan, with each shape's loops as decided for it (schedule.py): a
        step's workspace holds its GEMM's copies, or the copies of the leaves it repacks;
        and the tracks' estimate if the segments run in tracks (plan/tracks.py), whose times
        then decide which values share memory."""
        known: dict[tuple, SegmentLoops] = {}
        work = gemm_workspace(fused, layouts, sr.dtype.name, options)
        loops = loop_segments(fused, sr.dtype.name, layouts, batch_key, options, known)
        work.update(repack_workspace(loops))
        memory = plan_memory(fused, sr.dtype.itemsize, options.align_bytes, persistent, work)
        times = choose_tracks(fused, loops, n_static, options, sr.dtype.itemsize)
        if times is None:
            return memory, known, None
        for pools, slack in memory_plans(options):
            side = times.side_by_side(n_static, slack, pools)
            tracked = plan_memory(fused, sr.dtype.itemsize, options.align_bytes, persistent, work, side)
            if affordable(tracked, memory) or options.tracks_always:
                return tracked, known, times
        return memory, known, None

    memory, known, times = memory_with(options)
    # Copies need workspace the values alone do not: without them, the plan may fit. The
    # repacked leaves' go first (they save the least), then GEMM's.
    for knob in ("repack", "gemm_copies"):
        if memory.scratch and getattr(options, knob) and not fits(memory, options.max_total_bytes):
            options = options.with_(**{knob: False})
            memory, known, times = memory_with(options)
    check_plan_fits(progs, memory, options.max_total_bytes)
    say(f"planning: lowering {len(fused.segments):,} segments")
    schedule = build_schedule(fused, memory, sr.dtype.name, layouts, batch_key, options, progress, known)
    if times is not None:
        schedule = with_tracks(schedule, fused, memory, times, n_static)
    return Plan(
        progs,
        sr,
        fspecs,
        sspecs,
        lspecs,
        options,
        batch_key,
        graph,
        fused,
        memory,
        schedule,
        binding_table(fused, memory, layouts),
        static,
        n_static,
        static_steps(schedule, fused, n_static),
    )


def static_steps(schedule: Schedule, fused: Fused, n_static: int) -> int:
    """The steps of the first n_static segments: each segment's own, after its repack step
    if it has one (plan/repack.py)."""
    static = {id(seg) for seg in fused.segments[:n_static]}
    return sum(1 for st in schedule.steps if id(st.segment) in static)


def program_names(programs: list[Program]) -> str:
    return ", ".join(p.name or f"p{i}" for i, p in enumerate(programs))


def binding_table(fused: Fused, memory: MemoryPlan, layouts: dict[int, TensorSpec]) -> list[Binding]:
    """Inputs and constants in value order, then results in slot order."""
    table = []
    for v, kind in sorted(fused.kinds.items()):
        if kind in INPUT_KINDS:
            r = memory.regions[v]
            ident = None if kind == UNIT else fused.attrs[v]
            table.append(Binding(INPUT_KINDS[kind], ident, r.offset, r.size, fused.specs[v]))
    for key, v in fused.outputs.items():
        r = memory.regions[v]
        spec = fused.output_specs.get(key, fused.specs[v])
        table.append(Binding(RESULT, key, r.offset, r.size, spec, stored_order(spec, layouts.get(v, spec))))
    return table


def stored_order(spec: TensorSpec, layout: TensorSpec) -> TensorSpec | None:
    """A result's axes (`spec`'s: a slot may name its axes of size 1 otherwise than the value
    it shows) in the order its value lies in memory (`layout`), or None when that is
    `spec`'s own order."""
    big = [k for k in layout.keys if layout.get_axis(k).size > 1]
    if big == [ax.key for ax in spec.axes if ax.size > 1]:
        return None
    ones = [ax for ax in spec.axes if ax.size == 1]
    return TensorSpec(tuple(ones) + tuple(spec.get_axis(k) for k in big))


def fits(memory: MemoryPlan, max_total_bytes: int | None = None) -> bool:
    return memory.total_bytes <= memory_limit(max_total_bytes)


def check_plan_fits(programs: list[Program], memory: MemoryPlan, max_total_bytes: int | None = None) -> None:
    """Refuse a plan whose arenas cannot all be allocated, before seconds of compiling
    end in numpy's "Unable to allocate" at bind()."""
    if fits(memory, max_total_bytes):
        return
    limit = memory_limit(max_total_bytes)
    names = program_names(programs)
    arenas = ", ".join(f"{c} {format_bytes(b)}" for c, b in memory.class_bytes().items())
    raise PlanTooLargeError(
        f"programs [{names}]: the memory plan needs {format_bytes(memory.total_bytes)} "
        f"({memory.total_bytes} bytes; arenas: {arenas}), over the limit of "
        f"{format_bytes(limit)} ({limit} bytes); nothing was compiled or allocated "
        f"(compile(max_total_bytes=...) or CATBP_JIT_MAX_BYTES sets the limit)"
    )
