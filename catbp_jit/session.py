"""Session: an executable bound to its memory. `run` copies inputs in and walks the
schedule; it allocates nothing (no numpy buffer, a constant number of Numba NRT records).

Tiers (tiers.py): while the executable's kernels compile in the background, `run`
computes the steps with numpy (numpy_steps.py: the same bits, with temporaries); the first
run after they have come switches to them, between runs, over the same buffer.

Static inputs (compile(static_factors=..., static_selectors=...), plan/static.py): the
schedule's first `plan.n_static_steps` steps read only static inputs, constants and each other.
They run in the first run after bind and in every run that is given a value for any
static input (whatever the value); every other run starts at the first dynamic step and
reads the static results the last such run left in memory. Results written by static
steps are results like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .blas_threads import OneBlasThread, wants_one_thread
from .errors import InputMismatchError, UnknownInputError, name_list
from .ir.adapt import adapt_slot_key
from .ir.schema import TensorSpec
from .numpy_steps import numpy_steps
from .plan.arena import ALIGN_BYTES
from .plan.pipeline import CONSTANT, FACTOR_INPUT, RESULT, SELECTOR_INPUT, SLOT_INPUT, Binding
from .pool import the_pool

if TYPE_CHECKING:
    from .executable import Executable

Hook = Callable[[int, Any], None]


def aligned_empty(n: int, dtype: np.dtype) -> np.ndarray:
    """n elements of dtype whose first byte sits on a 64-byte boundary."""
    dtype = np.dtype(dtype)
    raw = np.zeros(n * dtype.itemsize + ALIGN_BYTES, dtype=np.uint8)
    start = (-raw.ctypes.data) % ALIGN_BYTES
    return raw[start : start + n * dtype.itemsize].view(dtype)


class Session:
    # CPU kernels run on its buffer (a CUDA session's host buffer only stages values)
    cpu_kernels = True

    def __init__(
        self,
        exe: Executable,
        *,
        before: Hook | None = None,
        after: Hook | None = None,
        mem: np.ndarray | None = None,
        numpy_only: bool = False,
    ) -> None:
        """mem: a buffer of at least exe.memory.total elements to work in instead of a
        new one (the bucket sessions of a batched executable share one); its owner then
        calls fill_constants() whenever another session wrote over it. numpy_only: stay in
        the numpy tier for good (a check of the kernels against it, tiers.py)."""
        self.exe = exe
        if self.cpu_kernels and mem is not None and mem.ctypes.data % ALIGN_BYTES:
            # (the plan counts rows that start on a cache line: abi.WINDOWED tables)
            raise ValueError(f"a session's buffer must start on a {ALIGN_BYTES}-byte boundary")
        self.mem = aligned_empty(exe.memory.total, exe.dtype) if mem is None else mem
        # kernels keep loop counters in its tail, a line per step (tracks: steps run side
        # by side write their own lines); the tracks' state words a line each
        self.table = aligned_empty(exe.schedule.table.size, np.dtype(np.int64))
        self.table[:] = exe.schedule.table
        self.before, self.after = before, after
        plan = exe.plan

        def view(b: Binding) -> np.ndarray:
            return b.view(self.mem)

        self._factors = {b.ident: view(b) for b in plan.bound(FACTOR_INPUT)}
        self._selectors = {b.ident: view(b) for b in plan.bound(SELECTOR_INPUT)}
        self._slots_in = {b.ident: view(b) for b in plan.bound(SLOT_INPUT)}
        # (what _bind_read_inputs looks up, per kind: the views and their shapes)
        self._views = {"factor": self._factors, "selector": self._selectors}
        self._shapes = {kind: {i: v.shape for i, v in views.items()} for kind, views in self._views.items()}
        self._constants = [view(b) for b in plan.bound(CONSTANT)]
        self.fill_constants()
        self._unset = (
            {("factor", k) for k in self._factors}
            | {("selector", k) for k in self._selectors}
            | {("slot", k) for k in self._slots_in}
        )
        # results: views into the slot arena, valid until the next run
        # (a Mapping: a CudaSession's copies each slot back from the device when it is read)
        self.slots: Mapping[tuple, tuple[np.ndarray, TensorSpec]] = {
            b.ident: (view(b), b.spec) for b in plan.bound(RESULT)
        }

        self._n_steps = len(exe.schedule.steps)
        self._n_static = exe.plan.n_static_steps
        self._static = exe.plan.static
        self._numpy_steps: list[Callable[[], None]] | None = None  # the numpy tier's, made on first need
        self._numpy_only = numpy_only
        self.compiled = not numpy_only and exe.ready()  # False: in the numpy tier (tiers.py)
        if self.compiled:
            self._prepare()

    def _prepare(self) -> None:
        """What the compiled tier's run needs, worked out once."""
        exe = self.exe
        # small GEMM products, some run in parallel: BLAS on one thread during runs (blas_threads.py)
        self._one_blas_thread = OneBlasThread() if wants_one_thread(exe.schedule) else None
        # kernels get addresses, not arrays: no NRT record per call (the executable keeps
        # the kernel address array alive, this session its buffer and table)
        self._addresses = (
            self.mem.ctypes.data,
            self.mem.size,
            self.table.ctypes.data,
            self.table.size,
            exe.kernel_addresses.ctypes.data,
            exe.kernel_addresses.size,
        )
        # steps cut in chunks, and tracks (plan/tracks.py), are shared with the pool's
        # threads (pool.py); a schedule with neither never wakes them
        self._pool = the_pool()
        self._tracks = exe.schedule.tracks  # (plan/tracks.py; -1: none)
        self._chunked = any(exe.schedule.chunks(i) > 1 for i in range(self._n_steps))
        if self._chunked or self._tracks >= 0:
            self._pool.start(exe.dispatcher)

    def step_call(self, i: int) -> Callable[[], None]:
        """A call that runs step i alone, as a run does, for timing steps one by one: its
        kernel's entry, or for a step of several chunks the dispatcher (its chunks shared
        with the pool's threads, as many as help a run started now)."""
        schedule = self.exe.schedule
        if schedule.chunks(i) == 1:  # (a call of 7 arguments: ~150 ns less than 11)
            entry = self.exe.kernels[schedule.kernel_id(i)].entry
            return partial(entry, *self._addresses[:4], schedule.param_offset(i), 0, 1)
        pool, dispatcher, addresses = self._pool, self.exe.dispatcher, self._addresses

        def chunked() -> None:
            # the pool's threads sleep between runs: woken at every call, as a run wakes
            # them (woken once, repeated calls would run on this thread alone)
            dispatcher(*addresses, i, i + 1, pool.address, pool.helpers(), -1, -1)

        return chunked

    def steps_call(self, first: int, last: int) -> Callable[[], None]:
        """A call that runs steps first..last-1 as a compiled run walks them (one call of
        the dispatcher, chunked steps shared with the pool's threads, BLAS on one thread
        where a run puts it there), without binding inputs: for timing steps where a run
        spends their time, as the difference of two walks (first == last: the call alone)."""
        if not 0 <= first <= last <= self._n_steps:
            raise ValueError(f"steps {first}..{last - 1}: this schedule has {self._n_steps} steps")
        self._need_kernels()
        pool, dispatcher, addresses = self._pool, self.exe.dispatcher, self._addresses
        chunked, one = self._chunked, self._one_blas_thread

        def walk() -> None:
            # (woken at every call, as a run wakes them: see step_call)
            dispatcher(*addresses, first, last, pool.address, pool.helpers() if chunked else 0, -1, -1)

        if one is None:
            return walk

        def on_one_blas_thread() -> None:  # as _execute runs them
            one.enter()
            try:
                walk()
            finally:
                one.exit()

        return on_one_blas_thread

    def run_call(self) -> Callable[[], None]:
        """A call that runs the whole schedule as a compiled run does (its tracks side by
        side where it has them, plan/tracks.py), in either mode, without binding inputs:
        for timing whole runs."""
        self._need_kernels()
        return partial(self._on_one_blas_thread, self._walk_compiled, 0)

    def _switch_when_ready(self) -> None:
        """A session bound while its kernels compiled runs in numpy until they come."""
        if not self.compiled and not self._numpy_only and self.exe.ready():
            self._prepare()
            self.compiled = True

    def _need_kernels(self) -> None:
        """The kernels (switching to them if they came), or a clear refusal."""
        self._switch_when_ready()
        if not self.compiled:
            raise RuntimeError(
                "this session runs its steps in numpy (kernels still compiling, or bound with "
                "numpy_only=True): exe.wait() first to walk the compiled schedule"
            )

    def fill_constants(self) -> None:
        for c in self._constants:
            c.fill(self.exe.semiring.kind.one)
        self.stale = True  # static steps read constants (and another session wrote here)

    # -- inputs --------------------------------------------------------------------------

    def _check(self, kind: str, ident: Any, arr: Any, target: np.ndarray | None) -> None:
        if target is None:
            # an input declared at compile time but not read by the optimized schedule is
            # accepted (and ignored) when it matches its declared spec
            declared: dict[str, Mapping[Any, TensorSpec]] = {
                "factor": self.exe.factor_specs,
                "selector": self.exe.selector_specs,
                "slot": self.exe.slot_specs,
            }
            specs = declared[kind]
            if ident not in specs:
                known = {"factor": self._factors, "selector": self._selectors, "slot": self._slots_in}[kind]
                raise UnknownInputError(
                    f"this executable has no {kind} {ident!r} (it reads: {sorted(map(repr, known))[:10]})"
                )
            shape = specs[ident].shape
        else:
            shape = target.shape
        if not isinstance(arr, np.ndarray):
            raise InputMismatchError(f"{kind} {ident!r}: expected a numpy array, got {type(arr).__name__}")
        if arr.dtype != self.mem.dtype or arr.shape != shape:
            raise InputMismatchError(
                f"{kind} {ident!r}: got {arr.dtype}{list(arr.shape)}, compiled for "
                f"{self.mem.dtype}{list(shape)}; compile again for other specs or cast first"
            )

    def _given(
        self,
        factors: Mapping[int, Any] | None,
        selectors: Mapping[int, Any] | None,
        slots: Mapping[Any, Any] | None,
    ) -> list[tuple[str, Any, Any, np.ndarray | None]]:
        """(kind, id, array, target view or None) for every input handed to run()."""
        out: list[tuple[str, Any, Any, np.ndarray | None]] = [
            ("factor", i, a, self._factors.get(i)) for i, a in (factors or {}).items()
        ]
        out += [("selector", i, a, self._selectors.get(i)) for i, a in (selectors or {}).items()]
        for ident, arr in (slots or {}).items():
            ident = adapt_slot_key(ident)
            arr = arr[0] if isinstance(arr, tuple) else arr  # (array, spec) accepted
            out.append(("slot", ident, arr, self._slots_in.get(ident)))
        return out

    def _bind_inputs(
        self,
        factors: Mapping[int, Any] | None,
        selectors: Mapping[int, Any] | None,
        slots: Mapping[Any, Any] | None,
    ) -> None:
        # everything is checked before anything is copied: a refused run changes nothing.
        # A run of a big program binds hundreds of small inputs, so the common case (a
        # read input of the right dtype and shape) is tested inline and `target[...] = arr`
        # copies: 2.6x faster than np.copyto on small arrays (grid4x8_d2: 229 inputs).
        if not (slots or self._unset or self._static):
            return self._bind_read_inputs(factors, selectors)
        given = self._given(factors, selectors, slots)
        dtype = self.mem.dtype
        for kind, ident, arr, target in given:
            if (
                target is None
                or type(arr) is not np.ndarray
                or arr.dtype != dtype
                or arr.shape != target.shape
            ):
                self._check(kind, ident, arr, target)  # raises, or accepts an unread input
        for _, _, arr, target in given:
            if target is not None:
                target[...] = arr
        if self._unset:
            self._unset.difference_update((kind, ident) for kind, ident, _, t in given if t is not None)
        if self._static and not self.stale:
            self.stale = any(self._static.holds(kind, ident) for kind, ident, _, t in given if t is not None)
        if self._unset:
            missing = sorted(f"{k} {i!r}" for k, i in self._unset)
            raise UnknownInputError(f"no value given yet for {name_list(missing)}")

    def _bind_read_inputs(
        self, factors: Mapping[int, Any] | None, selectors: Mapping[int, Any] | None
    ) -> None:
        """_bind_inputs for the common case of a run after the first: factors and selectors
        only, no static steps. One pass checks and pairs each input with its view (no
        tuple per input, the views' shapes made once), then the copies: grid4x8_d2's 229
        inputs 68 -> 57 us a run."""
        dtype = self.mem.dtype
        pairs = []
        for kind, given in (("factor", factors), ("selector", selectors)):
            if not given:
                continue
            view_of, shape_of = self._views[kind].get, self._shapes[kind].get
            for ident, arr in given.items():
                target = view_of(ident)
                if (
                    target is None
                    or type(arr) is not np.ndarray
                    or (arr.dtype is not dtype and arr.dtype != dtype)
                    or arr.shape != shape_of(ident)
                ):
                    self._check(kind, ident, arr, target)  # raises, or accepts an unread input
                    if target is None:
                        continue
                pairs.append((target, arr))
        for target, arr in pairs:
            target[...] = arr

    # -- running ---------------------------------------------------------------------------

    def run(
        self,
        factors: Mapping[int, np.ndarray] | None = None,
        selectors: Mapping[int, np.ndarray] | None = None,
        slots: Mapping[Any, Any] | None = None,
    ) -> Mapping[tuple, tuple[np.ndarray, TensorSpec]]:
        """Copy the given inputs in (inputs not given keep their last values) and run: the
        static steps only in the first run and when a static input is given (see the
        module docstring), then the dynamic steps.

        Returns `self.slots`: slot key -> (view, spec), valid until the next run.
        """
        if factors or selectors or slots or self._unset:
            self._bind_inputs(factors, selectors, slots)
        self._switch_when_ready()
        self._execute(0 if self.stale else self._n_static)
        self.stale = False
        return self.slots

    def gatherer(self, index: np.ndarray) -> Callable[[], np.ndarray]:
        """A function returning mem[index] as the last run left it, in a buffer of its own
        allocated here, once (overwritten by the next call): many slots' elements read at
        once (a CUDA session gathers them on the device, and copies them back in one
        transfer). index: offsets into the arena, checked here."""
        index = checked_index(index, self.mem.size)
        out = np.empty(index.size, self.mem.dtype)

        def gather() -> np.ndarray:
            # (mode "clip": the offsets are checked; numpy's "raise" buffers `out` first)
            np.take(self.mem, index, out=out, mode="clip")
            return out

        return gather

    def reader(self, keys: Collection[tuple]) -> Callable[[], None]:
        """A function making the result slots `keys` readable on the host after a run
        (their views, `slots[key]`): here they already are (a CUDA session gathers them on
        the device and copies them back at once)."""
        return lambda: None

    def fetch(self) -> None:
        """Make every result readable on the host: here they already are (a CUDA session
        copies them back)."""

    def _execute(self, first: int) -> None:
        """Run steps first..n-1 (first: 0, or the first dynamic step)."""
        if not self.compiled:
            return self._execute_numpy(first)
        if self.exe.mode == "compiled":
            return self._on_one_blas_thread(self._walk_compiled, first)
        return self._on_one_blas_thread(self._execute_loop, first)

    def _on_one_blas_thread(self, walk: Callable[[int], None], first: int) -> None:
        one = self._one_blas_thread
        if one is None:
            return walk(first)
        one.enter()
        try:
            walk(first)
        finally:
            one.exit()

    def _walk_compiled(self, first: int) -> None:
        """A compiled run's walk of steps first..n-1: one call of the dispatcher (two, for
        static steps before a schedule's tracks)."""
        addresses, run, pool = self._addresses, self.exe.dispatcher, self._pool
        helpers = pool.helpers() if self._chunked or self._tracks >= 0 else 0
        tracks = self._tracks
        if tracks < 0:
            run(*addresses, first, self._n_steps, pool.address, helpers, -1, -1)
            return
        if first < self._n_static:  # the static steps, in turn, then the tracks
            run(*addresses, first, self._n_static, pool.address, helpers, -1, -1)
        run(*addresses, 0, 0, pool.address, helpers, -1, tracks)

    def _execute_loop(self, first: int) -> None:
        """Loop mode: a Python loop over the steps, the dispatcher running each alone."""
        addresses, run, pool = self._addresses, self.exe.dispatcher, self._pool
        helpers = pool.helpers() if self._chunked else 0
        steps = self.exe.schedule.steps
        for i in range(first, self._n_steps):
            if self.before is not None:
                self.before(i, steps[i])
            run(*addresses, i, i + 1, pool.address, helpers, -1, -1)
            if self.after is not None:
                self.after(i, steps[i])

    def _execute_numpy(self, first: int) -> None:
        run = self._numpy_steps
        if run is None:
            run = self._numpy_steps = numpy_steps(self.exe.plan, self.mem, self.table)
        steps = self.exe.schedule.steps
        for i in range(first, self._n_steps):
            if self.before is not None:
                self.before(i, steps[i])
            run[i]()
            if self.after is not None:
                self.after(i, steps[i])


def checked_index(index: np.ndarray, size: int) -> np.ndarray:
    """`index` as int64 offsets, each in 0..size-1 (a kernel that reads them checks no
    bounds), else ValueError."""
    index = np.ascontiguousarray(index, dtype=np.int64).ravel()
    if index.size and (index.min() < 0 or index.max() >= size):
        bad = index[(index < 0) | (index >= size)]
        raise ValueError(f"gather: offsets {bad[:3].tolist()} outside the arena of {size} elements")
    return index
