"""Profiles: one executable for many input rows at once, planned per batch size (bucket).

`compile(..., batched_factors={fid, ...}, batched_selectors={sid, ...}, buckets=(1, 8, 64,
512))` rewrites the programs once per bucket B (ir/batch.py: the named inputs get a leading
batch axis of size B, everything computed from them too, the rest is left alone and so
computed once per run) and plans and compiles each; the buckets share their kernels, since
sizes are runtime data. `bind()` allocates one buffer, the largest bucket's, which every
bucket's schedule addresses from its start, and one private table per bucket.

`run(factors={fid: array (n, *spec.shape)}, ...)` runs the smallest bucket of at least n
rows: batched inputs are copied into its first n rows and the other rows are filled with
the semiring's one (products and sums of ones are finite: no NaN, no warning), and slots
computed from batched inputs come back as views of their first n rows. Every run gives
every batched input (the rows are the run's); unbatched inputs keep their last values, as
in a plain session. A run of n rows up to the largest bucket allocates nothing: switching
buckets refills the bucket's constants and unbatched inputs from copies kept at bind. More
rows than the largest bucket run in chunks of it, into result arrays made for that run.
`save` and `load` work as for an unbatched executable (the ids and buckets are saved too).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from .cache import KernelCache, default_cache
from .errors import InputMismatchError, UnknownInputError, name_list
from .executable import (
    DEFAULT_MAX_BYTES,
    Executable,
    adapt_inputs,
    build,
    plan_options,
)
from .ir.adapt import adapt_slot_key
from .ir.batch import (
    BatchedCompileError,
    batch_axis,
    batch_axis_id,
    batch_input_specs,
    batch_programs,
    is_batched,
    unbatched_spec,
)
from .ir.ops import Program
from .ir.schema import Axis, TensorSpec
from .plan.options import PlanOptions
from .plan.pipeline import Plan, plan
from .saved import saved_document, write_saved
from .semiring import VMSemiringRuntime
from .session import Session
from .target import get as get_target

DEFAULT_BUCKETS = (1, 8, 64, 512)


@dataclass
class BatchedExecutable:
    profiles: dict[int, Executable]  # bucket (batch size) -> the executable planned for it
    buckets: tuple[int, ...]  # ascending
    batched_factors: frozenset
    batched_selectors: frozenset
    batch_axis_id: int  # a GEOMETRIC axis id the programs do not use
    programs: list[Program]  # as given (adapted), before the batch rewrite

    @property
    def largest(self) -> Executable:
        return self.profiles[self.buckets[-1]]

    @property
    def semiring(self) -> VMSemiringRuntime:
        return self.largest.semiring

    @property
    def dtype(self) -> np.dtype:
        return self.largest.dtype

    @property
    def mode(self) -> str:
        return self.largest.mode

    @property
    def tier(self) -> str:
        """ "numpy" until every bucket has its kernels (they share one build), then "compiled"."""
        return "compiled" if all(p.tier == "compiled" for p in self.profiles.values()) else "numpy"

    def ready(self) -> bool:
        return all([p.ready() for p in self.profiles.values()])

    def wait(self, timeout: float | None = None) -> bool:
        """As Executable.wait, for every bucket."""
        return all([p.wait(timeout) for p in self.profiles.values()])

    @property
    def factor_specs(self) -> dict[int, TensorSpec]:
        """One row's specs, as the user declared them."""
        return self._user_specs(self.largest.factor_specs)

    @property
    def selector_specs(self) -> dict[int, TensorSpec]:
        return self._user_specs(self.largest.selector_specs)

    def _user_specs(self, specs: Mapping[int, TensorSpec]) -> dict[int, TensorSpec]:
        ax = self.axis(self.buckets[-1])
        return {k: unbatched_spec(v, ax) for k, v in specs.items()}

    def axis(self, bucket: int) -> Axis:
        return batch_axis(self.batch_axis_id, bucket)

    def bind(self, **hooks: Any) -> BatchedSession:
        return BatchedSession(self, **hooks)

    def stats(self) -> dict[str, Any]:
        kernels = {k for exe in self.profiles.values() for k in exe.schedule.patterns}
        return {
            "buckets": self.buckets,
            "kernels": len(kernels),
            "tier": self.tier,
            "total_bytes": max(exe.memory.total_bytes for exe in self.profiles.values()),
            "profiles": {b: exe.stats() for b, exe in self.profiles.items()},
        }

    def kernel_source(self, k: int | str = 0) -> str:
        return self.largest.kernel_source(k)

    def as_text(self) -> str:
        return "\n\n".join(f"bucket {b}:\n{exe.as_text()}" for b, exe in self.profiles.items())

    def save(self, path: str | os.PathLike) -> None:
        """As Executable.save, with the batched ids and the buckets: `load` plans every
        bucket again and takes the kernels from the disk cache (waiting for them first in
        the numpy tier)."""
        self.wait()
        big = self.largest
        kernels = {k.key: k for exe in self.profiles.values() for k in exe.kernels}
        doc = saved_document(
            self.programs,
            self.semiring,
            self.mode,
            big.target,
            self.factor_specs,
            self.selector_specs,
            big.slot_specs,
            list(kernels.values()),
            big.plan.options,
        )
        doc.update(
            batched_factors=sorted(self.batched_factors),
            batched_selectors=sorted(self.batched_selectors),
            buckets=list(self.buckets),
        )
        write_saved(path, doc)


def _ids(ids: Any, specs: Mapping[int, TensorSpec], kind: str) -> frozenset:
    try:
        out = frozenset(int(i) for i in ids)
    except (TypeError, ValueError):
        raise BatchedCompileError(
            f"batched_{kind}s must be a collection of {kind} ids, got {ids!r}"
        ) from None
    unknown = sorted(out - set(specs))
    if unknown:
        raise BatchedCompileError(
            f"batched_{kind}s: no {kind} spec for id(s) {unknown} (declared: {sorted(specs)[:10]})"
        )
    return out


def _buckets(buckets: Any) -> tuple[int, ...]:
    try:
        out = tuple(sorted({int(b) for b in buckets}))
        ok = bool(out) and all(float(b) == int(b) for b in buckets)
    except (TypeError, ValueError):
        ok = False
    if not ok or out[0] < 1:
        raise BatchedCompileError(f"buckets must be positive integers (batch sizes), got {buckets!r}")
    return out


@dataclass
class BatchedPlan:
    """One plan per bucket (plan/pipeline.py), nothing compiled."""

    plans: dict[int, Plan]  # bucket -> its plan
    buckets: tuple[int, ...]
    batched_factors: frozenset
    batched_selectors: frozenset
    batch_axis_id: int
    programs: list[Program]  # as given (adapted), before the batch rewrite


def plan_batched(
    progs: list[Program],
    sr: VMSemiringRuntime,
    fspecs: dict[int, TensorSpec],
    sspecs: dict[int, TensorSpec],
    lspecs: dict[tuple, TensorSpec],
    *,
    batched_factors: Any,
    batched_selectors: Any,
    buckets: Any,
    options: PlanOptions,
) -> BatchedPlan:
    """Every bucket's plan, from adapted inputs."""
    bf = _ids(batched_factors, fspecs, "factor")
    bs = _ids(batched_selectors, sspecs, "selector")
    if not bf and not bs:
        raise BatchedCompileError(
            "buckets given but no batched_factors or batched_selectors: "
            "name the inputs that have a batch axis"
        )
    sizes = _buckets(DEFAULT_BUCKETS if buckets is None else buckets)
    aid = batch_axis_id(progs, list(fspecs.values()) + list(sspecs.values()) + list(lspecs.values()))
    plans = {
        b: plan(bprogs, sr, bfspecs, bsspecs, lspecs, options, key)
        for b, bprogs, bfspecs, bsspecs, key in bucket_inputs(
            progs, fspecs, sspecs, lspecs, bf, bs, aid, sizes
        )
    }
    return BatchedPlan(plans, sizes, bf, bs, aid, progs)


def build_batched(
    bplan: BatchedPlan,
    *,
    target: str,
    mode: str,
    cache: KernelCache | None,
    progress: Callable[[str], None] | None = None,
    workers: int | None = None,
    tier: str | None = None,
) -> BatchedExecutable:
    say = progress or (lambda line: None)
    profiles = {}
    background = None
    the_target = get_target(target)
    if the_target.tiers:  # the buckets share their kernels: one build in the background
        cache = cache or default_cache()
        background = the_target.background(list(bplan.plans.values()), cache, workers, tier, say)
    for b, p in bplan.plans.items():
        if background is not None:
            profiles[b] = Executable(
                p, mode, target, [], cache_stats=dict(background[1]), tier="numpy", kernel_build=background[0]
            )
            continue
        say(f"bucket {b}")
        profiles[b] = build(
            p, target=target, mode=mode, cache=cache, progress=progress, workers=workers, tier="compiled"
        )
    return BatchedExecutable(
        profiles,
        bplan.buckets,
        bplan.batched_factors,
        bplan.batched_selectors,
        bplan.batch_axis_id,
        bplan.programs,
    )


def compile_batched(
    programs: Any,
    sr: Any,
    *,
    factor_specs: Mapping[int, Any],
    selector_specs: Mapping[int, Any] | None,
    slot_specs: Mapping[Any, Any] | None,
    target: str,
    mode: str,
    cache: KernelCache | None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_total_bytes: int | None,
    progress: Callable[[str], None] | None,
    workers: int | None,
    batched_factors: Any,
    batched_selectors: Any,
    buckets: Any,
    options: PlanOptions | None = None,
    tier: str | None = None,
) -> BatchedExecutable:
    progs, sr, fspecs, sspecs, lspecs = adapt_inputs(
        programs, sr, factor_specs, selector_specs, slot_specs, target, mode
    )
    bplan = plan_batched(
        progs,
        sr,
        fspecs,
        sspecs,
        lspecs,
        batched_factors=batched_factors,
        batched_selectors=batched_selectors,
        buckets=buckets,
        options=plan_options(target, options, max_bytes, max_total_bytes),
    )
    return build_batched(
        bplan, target=target, mode=mode, cache=cache, progress=progress, workers=workers, tier=tier
    )


def bucket_inputs(
    progs: list[Program],
    fspecs: dict[int, TensorSpec],
    sspecs: dict[int, TensorSpec],
    lspecs: dict[tuple, TensorSpec],
    bf: frozenset,
    bs: frozenset,
    aid: int,
    sizes: Iterable[int],
) -> Iterator[tuple[int, list[Program], dict[int, TensorSpec], dict[int, TensorSpec], tuple]]:
    """Per bucket: (size, its rewritten programs, factor specs, selector specs, batch axis key)."""
    for b in sizes:
        ax = batch_axis(aid, b)
        bprogs, _ = batch_programs(progs, ax, bf, bs, lspecs)
        yield (b, bprogs, batch_input_specs(fspecs, bf, ax), batch_input_specs(sspecs, bs, ax), ax.key)


@dataclass(frozen=True)
class _Input:
    """A declared input, as a batched session copies it in."""

    shape: tuple[int, ...]  # one row's
    batched: bool
    views: dict[int, np.ndarray]  # bucket -> its region (rows first); none if never read
    kept: np.ndarray | None  # an unbatched input's last value (None: batched or unread)


class BatchedSession:
    def __init__(self, exe: BatchedExecutable, **hooks: Any) -> None:
        self.exe = exe
        total = max(p.memory.total for p in exe.profiles.values())
        # one arena shared by every bucket (on a GPU: pinned, with its device twin)
        self.mem, self.sessions = exe.largest.target_object.bind_buckets(
            exe.profiles, total, exe.dtype, **hooks
        )
        for s in self.sessions.values():
            s._unset.clear()  # inputs are tracked here, across buckets
        self.one = np.array(exe.semiring.kind.one, dtype=exe.dtype)

        # the batch axis is innermost inside (ir/batch.py); users see it first: these
        # strided views of each bucket's regions put it first
        def rows(view: np.ndarray) -> np.ndarray:
            return np.moveaxis(view, -1, 0)

        self._by: dict[tuple[str, Any], _Input] = {}
        for kind, specs, batched, regions in (
            ("factor", exe.factor_specs, exe.batched_factors, lambda s: s._factors),
            ("selector", exe.selector_specs, exe.batched_selectors, lambda s: s._selectors),
            ("slot", exe.largest.slot_specs, frozenset(), lambda s: s._slots_in),
        ):
            for ident, spec in specs.items():
                views = {b: regions(s)[ident] for b, s in self.sessions.items() if ident in regions(s)}
                if ident in batched:
                    self._by[kind, ident] = _Input(
                        spec.shape, True, {b: rows(v) for b, v in views.items()}, None
                    )
                else:  # kept here: another bucket's run writes over its regions
                    kept = np.empty(spec.shape, exe.dtype) if views else None
                    self._by[kind, ident] = _Input(spec.shape, False, views, kept)
        self._kept = [(key, i) for key, i in self._by.items() if i.kept is not None]
        self._unset = {key for key, _ in self._kept}
        self._current: int | None = None

        ax = exe.axis(exe.buckets[-1])
        big = self.sessions[exe.buckets[-1]]
        self.batched_slots: set[tuple] = {k for k, (_, spec) in big.slots.items() if is_batched(spec, ax)}
        self.slot_specs = {k: unbatched_spec(spec, ax) for k, (_, spec) in big.slots.items()}
        self._rows_out = {
            b: {k: rows(s.slots[k][0]) for k in self.batched_slots} for b, s in self.sessions.items()
        }
        self._whole_out = {
            b: {k: (v, self.slot_specs[k]) for k, (v, _) in s.slots.items() if k not in self.batched_slots}
            for b, s in self.sessions.items()
        }
        self.slots: dict[tuple, tuple[np.ndarray, TensorSpec]] = {}
        self._readers: dict[tuple[int, frozenset], Callable[[], None]] = {}

    def _set_slots(self, whole: dict[tuple, tuple[np.ndarray, TensorSpec]], keys: frozenset | None) -> None:
        """self.slots (the same dict every run): the unbatched slots read, batched ones next."""
        if keys is None:
            self.slots.update(whole)
            return
        self.slots.clear()
        self.slots.update((k, v) for k, v in whole.items() if k in keys)

    def _read(self, bucket: int, sess: Session, keys: frozenset | None) -> None:
        """Make the slots `keys` (None: all) of a bucket's run readable on the host."""
        if keys is None:
            sess.fetch()
            return
        reader = self._readers.get((bucket, keys))
        if reader is None:  # made once per bucket and set of slots
            reader = self._readers[bucket, keys] = sess.reader(keys)
        reader()

    # -- inputs ----------------------------------------------------------------------------

    def _inputs(
        self,
        factors: Mapping[int, np.ndarray] | None,
        selectors: Mapping[int, np.ndarray] | None,
        slots: Mapping[Any, Any] | None,
    ) -> tuple[list[tuple[_Input, np.ndarray]], int]:
        """(input, array) for every input given, all checked; and the number of rows."""
        given: list[tuple[_Input, np.ndarray]] = []
        seen = set()
        rows = None
        for kind, table in (("factor", factors), ("selector", selectors), ("slot", slots)):
            for ident, arr in (table or {}).items():
                if kind == "slot":
                    ident = adapt_slot_key(ident)
                    arr = arr[0] if isinstance(arr, tuple) else arr
                inp = self._by.get((kind, ident))
                if inp is None:
                    raise UnknownInputError(f"this executable has no {kind} {ident!r}")
                if not isinstance(arr, np.ndarray):
                    raise InputMismatchError(
                        f"{kind} {ident!r}: expected a numpy array, got {type(arr).__name__}"
                    )
                want = ((arr.shape[0] if arr.ndim else -1,) if inp.batched else ()) + inp.shape
                if arr.dtype != self.mem.dtype or arr.shape != want:
                    form = f"(n, *{list(inp.shape)})" if inp.batched else f"{list(inp.shape)}"
                    raise InputMismatchError(
                        f"{kind} {ident!r}: got {arr.dtype}{list(arr.shape)}, compiled for "
                        f"{self.mem.dtype} {form}{' (a batched input)' if inp.batched else ''}"
                    )
                if inp.batched:
                    if rows is not None and arr.shape[0] != rows:
                        raise InputMismatchError(
                            f"{kind} {ident!r}: {arr.shape[0]} rows, but another batched "
                            f"input has {rows}; every batched input of a run has the same rows"
                        )
                    rows = arr.shape[0]
                given.append((inp, arr))
                seen.add((kind, ident))
        missing = [
            f"{kind} {ident!r}"
            for (kind, ident), inp in self._by.items()
            if inp.batched and (kind, ident) not in seen
        ]
        if missing:
            raise UnknownInputError(
                f"every run gives every batched input (its rows); missing {name_list(sorted(missing))}"
            )
        unset = self._unset - seen
        if unset:
            names = sorted(f"{k} {i!r}" for k, i in unset)
            raise UnknownInputError(f"no value given yet for {name_list(names)}")
        self._unset.clear()  # (all checked: from here on, nothing can fail)
        assert rows is not None  # (every batched input was given, and there is one at least)
        return given, rows

    def _choose(self, bucket: int) -> Session:
        sess = self.sessions[bucket]
        if self._current != bucket:  # another bucket wrote over this one's regions
            sess.fill_constants()
            for _, inp in self._kept:
                np.copyto(inp.views[bucket], cast(np.ndarray, inp.kept))  # (_kept: the kept ones)
            self._current = bucket
        return sess

    def _copy_in(self, bucket: int, given: list[tuple[_Input, np.ndarray]], lo: int, n: int) -> None:
        for inp, arr in given:
            view = inp.views.get(bucket)
            if view is None:
                continue  # declared, but read by no schedule
            if inp.batched:
                np.copyto(view[:n], arr[lo : lo + n])
                view[n:].fill(self.one)  # padding rows: the semiring's one
            else:
                np.copyto(cast(np.ndarray, inp.kept), arr)  # (read, so kept)
                np.copyto(view, arr)

    # -- running ---------------------------------------------------------------------------

    def run(
        self,
        factors: Mapping[int, np.ndarray] | None = None,
        selectors: Mapping[int, np.ndarray] | None = None,
        slots: Mapping[Any, Any] | None = None,
        *,
        read: Collection[tuple] | None = None,
    ) -> dict[tuple, tuple[np.ndarray, TensorSpec]]:
        """Run the rows given (see the module docstring). Returns `self.slots`: slot key ->
        (array, spec of one row); a batched slot's array has the rows first. Views valid
        until the next run (arrays of their own when the run was split into chunks).
        read: the slots to return (default all); on a GPU only these come back, gathered
        on the device into one copy."""
        keys = None if read is None else frozenset(read)
        if keys is not None and not keys <= self.slot_specs.keys():  # (before anything changes)
            unknown = sorted(map(repr, keys - self.slot_specs.keys()))
            raise UnknownInputError(f"read: this executable has no slot {name_list(unknown)}")
        given, n = self._inputs(factors, selectors, slots)
        buckets = self.exe.buckets
        if n <= buckets[-1]:
            bucket = next(b for b in buckets if b >= n)
            sess = self._choose(bucket)
            self._copy_in(bucket, given, 0, n)
            sess.run()
            self._read(bucket, sess, keys)
            self._set_slots(self._whole_out[bucket], keys)
            for key, rows in self._rows_out[bucket].items():
                if keys is None or key in keys:
                    self.slots[key] = (rows[:n], self.slot_specs[key])
            return self.slots
        return self._run_chunks(given, n, keys)

    def _run_chunks(
        self, given: list[tuple[_Input, np.ndarray]], n: int, keys: frozenset | None
    ) -> dict[tuple, tuple[np.ndarray, TensorSpec]]:
        big = self.exe.buckets[-1]
        sess = self._choose(big)
        batched = [k for k in self.batched_slots if keys is None or k in keys]
        results = {key: np.empty((n,) + self.slot_specs[key].shape, self.mem.dtype) for key in batched}
        for lo in range(0, n, big):
            m = min(big, n - lo)
            self._copy_in(big, given, lo, m)
            sess.run()
            self._read(big, sess, keys)
            for key in batched:
                results[key][lo : lo + m] = self._rows_out[big][key][:m]
        self._set_slots(self._whole_out[big], keys)
        for key, rows in results.items():
            self.slots[key] = (rows, self.slot_specs[key])
        return self.slots
