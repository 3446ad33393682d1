"""compile(): programs -> Executable, the planned, lowered and compiled form you can print,
inspect, save and bind. The pipeline, one plain function per stage:

    adapt + validate -> build_graph -> optimize -> fuse -> plan_memory -> build_schedule
    -> load kernels (disk cache or codegen) -> Executable
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import numpy as np

from .cache import KernelCache, default_cache
from .codegen.loader import Kernel, dispatcher_unit, kernel_unit, load_dispatcher, load_kernel
from .codegen.workers import WorkerOptions, compile_in_workers
from .errors import CatbpError
from .ir.adapt import adapt_programs, adapt_slot_key, adapt_spec
from .ir.ops import Program
from .ir.schema import TensorSpec, format_spec
from .ir.validate import DEFAULT_MAX_BYTES, validate_programs
from .memory import PlanTooLargeError, format_bytes, memory_limit
from .plan.arena import MemoryPlan, plan_memory
from .plan.fusion import Fused, fuse
from .plan.graph import Graph, build_graph
from .plan.layout import choose_layouts
from .plan.passes import optimize
from .plan.schedule import Schedule, build_schedule
from .semiring import VMSemiringRuntime, adapt_semiring

MODES = ("compiled", "loop")
TARGETS = ("cpu",)
SAVE_FORMAT = "catbp-jit-executable"


@dataclass
class Executable:
    programs: List[Program]
    semiring: VMSemiringRuntime
    factor_specs: Dict[int, TensorSpec]
    selector_specs: Dict[int, TensorSpec]
    slot_specs: Dict[tuple, TensorSpec]
    mode: str
    target: str
    graph: Graph
    fused: Fused
    memory: MemoryPlan
    schedule: Schedule
    kernels: List[Kernel]
    dispatcher: Any = None
    dispatcher_source: str = ""
    cache_stats: Dict[str, int] = field(default_factory=dict)
    # C entry point of each kernel's compiled code, by kernel id (the dispatcher's calls)
    kernel_addresses: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    @property
    def dtype(self) -> np.dtype:
        return self.semiring.dtype

    def bind(self, **hooks):
        """A Session: the arenas and the schedule table, allocated here, once."""
        from .session import Session

        return Session(self, **hooks)

    # -- inspecting ----------------------------------------------------------------------

    def stats(self) -> Dict[str, Any]:
        n_ins = sum(len(p) for p in self.programs)
        return {
            "programs": len(self.programs),
            "instructions": n_ins,
            "graph_nodes": len(self.graph.nodes),
            "segments": len(self.schedule.steps),
            "kernels": len(self.kernels),
            "cache": dict(self.cache_stats),
            "arena_bytes": self.memory.class_bytes(),
            "total_bytes": self.memory.total_bytes,
            "mode": self.mode,
            "target": self.target,
        }

    def kernel_source(self, k: Union[int, str] = 0) -> str:
        """Generated source of kernel k (its index, pattern name or key), or 'dispatcher'."""
        if k == "dispatcher":
            return self.dispatcher_source
        for i, kern in enumerate(self.kernels):
            if k in (i, kern.pattern.name, kern.key):
                return kern.source
        raise KeyError(f"no kernel {k!r}; kernels: {[kern.pattern.name for kern in self.kernels]}")

    def as_text(self) -> str:
        """The schedule: arenas, kernels, and each step with its operands and offsets."""
        m = self.memory
        # where a value lives: its arena and byte offset in it
        region = lambda v: f"{m.regions[v].cls}+{(m.regions[v].offset - m.class_base[m.regions[v].cls]) * m.itemsize}"
        progs = ", ".join(f"{p.name} {len(p)}" for p in self.programs)
        lines = [f"executable: {self.semiring.name} {self.dtype.name}, mode {self.mode}, "
                 f"target {self.target}; programs {progs}",
                 "arenas (bytes): " + ", ".join(f"{c} {b}" for c, b in m.class_bytes().items())
                 + f"; total {m.total_bytes}",
                 f"kernels ({len(self.kernels)}):"]
        lines += [f"  K{i} {k.pattern.name}  key {k.key[:16]}" for i, k in enumerate(self.kernels)]
        lines.append(f"schedule ({len(self.schedule.steps)} steps):")
        for i, st in enumerate(self.schedule.steps):
            seg = st.segment
            leaves = ", ".join(f"v{l}@{region(l)}" for l in seg.leaves)
            red = f" reduce {format_spec(TensorSpec(seg.red_axes))}" if seg.red_axes else ""
            norm = " normalize" if seg.normalize else ""
            origin = sorted({f"{prog}[{idx}]" for n in seg.nodes if n in self.graph.nodes
                             for prog, idx in self.graph.nodes[n].origin})
            lines.append(f"  [{i}] K{self.schedule.kernel_id(i)} v{seg.out}@{region(seg.out)} "
                         f"{format_spec(seg.out_spec)} = {leaves}{red}{norm}"
                         + (f"   # {' '.join(origin[:4])}{' ...' if len(origin) > 4 else ''}" if origin else ""))
        lines.append("slots:")
        for key, v in self.fused.outputs.items():
            spec = self.fused.output_specs.get(key, self.fused.specs[v])
            lines.append(f"  {key!r} = v{v}@{region(v)} {format_spec(spec)}")
        return "\n".join(lines)

    # -- saving ----------------------------------------------------------------------------

    def save(self, path: Union[str, os.PathLike]) -> None:
        """The programs, specs and options as JSON; `load` re-plans (cheap) and takes the
        kernels from the disk cache, so a saved executable runs under CATBP_JIT_CACHE=strict."""
        write_saved(path, saved_document(self.programs, self.semiring, self.mode, self.target,
                                         self.factor_specs, self.selector_specs,
                                         self.slot_specs, self.kernels))


def saved_document(programs: List[Program], sr: VMSemiringRuntime, mode: str, target: str,
                   fspecs: Dict[int, TensorSpec], sspecs: Dict[int, TensorSpec],
                   lspecs: Dict[tuple, TensorSpec], kernels: List[Kernel]) -> dict:
    """What `save` writes (a batched executable adds its batched ids and buckets)."""
    from .bundle import program_to_json, slot_key_to_json, spec_to_json

    return {
        "format": SAVE_FORMAT, "version": 1,
        "semiring": sr.name, "dtype": sr.dtype.name, "mode": mode, "target": target,
        "factor_specs": {str(k): spec_to_json(v) for k, v in fspecs.items()},
        "selector_specs": {str(k): spec_to_json(v) for k, v in sspecs.items()},
        "slot_specs": [[slot_key_to_json(k), spec_to_json(v)] for k, v in lspecs.items()],
        "programs": [program_to_json(p) for p in programs],
        "kernels": [k.key for k in kernels],
    }


def write_saved(path: Union[str, os.PathLike], doc: dict) -> None:
    tmp = f"{os.fspath(path)}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


class SavedExecutableError(CatbpError, ValueError):
    """A file that `load` cannot read as a saved executable."""


def load(path: Union[str, os.PathLike], *,
         cache: Optional[KernelCache] = None) -> Union[Executable, "BatchedExecutable"]:
    """The Executable (or BatchedExecutable) saved at `path` by its save(). A file that is
    not one (binary, truncated, another JSON document, a field of the wrong kind) raises
    SavedExecutableError naming the file and the field; a missing file FileNotFoundError."""
    from .bundle import program_from_json
    from .semiring import make_semiring

    where = repr(os.fspath(path))
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SavedExecutableError(f"{where} is not a saved catbp_jit executable (not JSON: "
                                   f"{e})") from None
    if not isinstance(doc, dict) or doc.get("format") != SAVE_FORMAT or doc.get("version") != 1:
        raise SavedExecutableError(f"{where} is not a saved catbp_jit executable (version 1)")

    def field(key: str, read: Callable[[Any], Any]) -> Any:
        if key not in doc:
            raise SavedExecutableError(f"{where}: no {key!r}")
        try:
            return read(doc[key])
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
            raise SavedExecutableError(f"{where}: {key!r}: {e}") from None

    def one_of(choices):
        def read(x):
            if x not in choices:
                raise ValueError(f"{x!r} is not one of {', '.join(choices)}")
            return x
        return read

    def specs(x):
        return {int(k): adapt_spec(v) for k, v in _items(x).items()}

    def numeric_dtype(x):
        dtype = np.dtype(_items(x, str))
        if dtype.kind not in "biuf":
            raise ValueError(f"{x!r} is not a numeric dtype")
        return dtype

    def ids(x):
        return [_as_int(i) for i in _items(x, list)]

    batched = {}
    if "buckets" in doc:  # a batched executable
        batched = dict(batched_factors=field("batched_factors", ids),
                       batched_selectors=field("batched_selectors", ids),
                       buckets=field("buckets", ids))
    dtype = field("dtype", numeric_dtype)
    return compile(
        field("programs", lambda x: [program_from_json(p) for p in _items(x, list)]),
        field("semiring", lambda x: make_semiring(x, dtype)),
        factor_specs=field("factor_specs", specs),
        selector_specs=field("selector_specs", specs),
        slot_specs=field("slot_specs", lambda x: {adapt_slot_key(k): adapt_spec(v)
                                                  for k, v in _items(x, list)}),
        target=field("target", one_of(TARGETS)), mode=field("mode", one_of(MODES)),
        cache=cache, **batched)


def _as_int(x: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"expected an integer, got {type(x).__name__}")
    return x


def _items(x: Any, kind: type = dict) -> Any:
    if not isinstance(x, kind):
        names = {dict: "an object", list: "an array", str: "a string"}
        raise TypeError(f"expected {names[kind]}, got {type(x).__name__}")
    return x


def compile(programs: Any, sr: Any, *, factor_specs: Mapping[int, Any],
            selector_specs: Optional[Mapping[int, Any]] = None,
            slot_specs: Optional[Mapping[Any, Any]] = None, target: str = "cpu",
            mode: str = "compiled", cache: Optional[KernelCache] = None,
            max_bytes: int = DEFAULT_MAX_BYTES, max_total_bytes: Optional[int] = None,
            progress: Optional[Callable[[str], None]] = None,
            workers: Optional[int] = None, batched_factors: Optional[Any] = None,
            batched_selectors: Optional[Any] = None,
            buckets: Optional[Any] = None) -> Union[Executable, "BatchedExecutable"]:
    """Plan, lower and compile linked programs for inputs of the given specs.

    programs: one program or a list run in order with slots carried over (upward,
    downward, finalize), as our IR or any CatBP-like objects. slot_specs: slots that
    exist before the first program (handed to Session.run(slots=...)). max_bytes: the
    limit for one tensor; max_total_bytes: for all arenas together (default
    catbp_jit.memory.memory_limit(): CATBP_JIT_MAX_BYTES, else the available memory); a
    plan over it raises PlanTooLargeError before any kernel is compiled. progress: called
    with a line of text before each kernel is loaded (a cold one takes seconds to compile)
    and as each is compiled in a worker. workers: processes that compile cold kernels side
    by side (default: $CATBP_JIT_COMPILE_WORKERS, else the number of CPUs; 0 or 1: in this
    process).

    batched_factors / batched_selectors: ids of inputs that get a leading batch axis;
    then the result is a BatchedExecutable with one plan per batch size in `buckets`
    (default (1, 8, 64, 512)), see batched.py.
    """
    if batched_factors or batched_selectors or buckets is not None:
        from .batched import compile_batched

        return compile_batched(programs, sr, factor_specs=factor_specs,
                               selector_specs=selector_specs, slot_specs=slot_specs,
                               target=target, mode=mode, cache=cache, max_bytes=max_bytes,
                               max_total_bytes=max_total_bytes, progress=progress,
                               workers=workers, batched_factors=batched_factors or (),
                               batched_selectors=batched_selectors or (), buckets=buckets)
    return plan_and_load(*adapt_inputs(programs, sr, factor_specs, selector_specs, slot_specs,
                                       target, mode),
                         target=target, mode=mode, cache=cache, max_bytes=max_bytes,
                         max_total_bytes=max_total_bytes, progress=progress, workers=workers)


def adapt_inputs(programs: Any, sr: Any, factor_specs: Mapping[int, Any],
                 selector_specs: Optional[Mapping[int, Any]],
                 slot_specs: Optional[Mapping[Any, Any]], target: str, mode: str):
    """(programs, semiring, factor specs, selector specs, slot specs) in our own types."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if target not in TARGETS:
        raise ValueError(f"target {target!r} is not available (available: {', '.join(TARGETS)})")
    sr = adapt_semiring(sr)
    progs = adapt_programs(programs)
    fspecs = {int(k): adapt_spec(v) for k, v in (factor_specs or {}).items()}
    sspecs = {int(k): adapt_spec(v) for k, v in (selector_specs or {}).items()}
    lspecs = {adapt_slot_key(k): adapt_spec(v) for k, v in (slot_specs or {}).items()}
    return progs, sr, fspecs, sspecs, lspecs


def plan_programs(progs: List[Program], sr: VMSemiringRuntime, fspecs: Dict[int, TensorSpec],
                  sspecs: Dict[int, TensorSpec], lspecs: Dict[tuple, TensorSpec], *,
                  max_bytes: int = DEFAULT_MAX_BYTES, max_total_bytes: Optional[int] = None,
                  batch_key: Optional[tuple] = None):
    """Everything before kernels are loaded: (graph, fused, memory, schedule). The
    schedule's patterns are the kernels a run needs (what `catbp-jit aot` compiles)."""
    checked = validate_programs(progs, factor_specs=fspecs, selector_specs=sspecs,
                                slot_specs=lspecs, itemsize=sr.dtype.itemsize, max_bytes=max_bytes)
    graph = optimize(build_graph(checked, sr.name, lspecs))
    fused = fuse(graph)
    memory = plan_memory(fused, sr.dtype.itemsize)
    check_plan_fits(progs, memory, max_total_bytes)
    schedule = build_schedule(fused, memory, sr.dtype.name, choose_layouts(fused, batch_key),
                              batch_key)
    return graph, fused, memory, schedule


def plan_and_load(progs: List[Program], sr: VMSemiringRuntime, fspecs: Dict[int, TensorSpec],
                  sspecs: Dict[int, TensorSpec], lspecs: Dict[tuple, TensorSpec], *,
                  target: str, mode: str, cache: Optional[KernelCache], max_bytes: int,
                  max_total_bytes: Optional[int], progress: Optional[Callable[[str], None]],
                  workers: Optional[int], batch_key: Optional[tuple] = None) -> Executable:
    """The pipeline on adapted inputs. batch_key: the batch axis of programs rewritten
    by ir/batch.py (their NORMALIZEs work per row), else None."""
    graph, fused, memory, schedule = plan_programs(progs, sr, fspecs, sspecs, lspecs,
                                                   max_bytes=max_bytes,
                                                   max_total_bytes=max_total_bytes,
                                                   batch_key=batch_key)
    cache = cache or default_cache()
    before = dict(cache.stats)
    say = progress or (lambda line: None)
    in_workers = _compile_cold_in_workers(schedule.patterns, cache,
                                      WorkerOptions.resolve(workers), say)
    kernels = []
    for i, pattern in enumerate(schedule.patterns):
        say(f"kernel {i + 1}/{len(schedule.patterns)}: {pattern.name}")
        kernels.append(load_kernel(pattern, cache))
    # Loop mode does not call the dispatcher, but loads it too (a moment when it is cached,
    # once per cache directory when not), so a cache filled in either mode serves both,
    # also under the strict policy.
    say("dispatcher")
    dispatcher, dsource = load_dispatcher(cache)
    used = {k: cache.stats.get(k, 0) - before.get(k, 0) for k in cache.stats}
    if in_workers:  # what workers compiled was a miss, though this process found it on disk
        used.update(hits=used["hits"] - in_workers, misses=used["misses"] + in_workers,
                    compiled_in_workers=in_workers)
    addresses = np.array([k.address for k in kernels], dtype=np.int64)
    return Executable(progs, sr, fspecs, sspecs, lspecs, mode, target, graph, fused, memory,
                      schedule, kernels, dispatcher, dsource, used, addresses)


def check_plan_fits(programs: List[Program], memory: MemoryPlan,
                    max_total_bytes: Optional[int] = None) -> None:
    """Refuse a plan whose arenas cannot all be allocated, before seconds of compiling
    end in numpy's "Unable to allocate" at bind()."""
    limit = memory_limit(max_total_bytes)
    if memory.total_bytes <= limit:
        return
    names = ", ".join(p.name or f"p{i}" for i, p in enumerate(programs))
    arenas = ", ".join(f"{c} {format_bytes(b)}" for c, b in memory.class_bytes().items())
    raise PlanTooLargeError(
        f"programs [{names}]: the memory plan needs {format_bytes(memory.total_bytes)} "
        f"({memory.total_bytes} bytes; arenas: {arenas}), over the limit of "
        f"{format_bytes(limit)} ({limit} bytes); nothing was compiled or allocated "
        f"(compile(max_total_bytes=...) or CATBP_JIT_MAX_BYTES sets the limit)")


def _compile_cold_in_workers(patterns, cache: KernelCache, options: WorkerOptions,
                             say: Callable[[str], None]) -> int:
    """Compile the cold kernels (and dispatcher) of a schedule side by side, in this
    process and worker processes, into the disk cache, when two or more are cold and two
    or more CPUs are there to run them; the caller then loads everything from disk (or
    memory). The number the workers compiled."""
    if cache.policy != "fallback":  # strict compiles nothing; off has no disk to share
        return 0
    units = [kernel_unit(p) for p in patterns] + [dispatcher_unit()]
    cold = [u for u in units if cache.check(u.identity, u.source)[0] != "ok"]
    n_workers = options.pool_size(len(cold))
    if not n_workers:
        return 0
    say(f"compiling {len(cold)} cold kernels in {n_workers} processes")
    return compile_in_workers(cold, cache, n_workers, lambda unit, seconds, in_worker: say(
        f"compiled {unit.name} in {seconds:.1f} s{' in a worker' if in_worker else ''}"))
