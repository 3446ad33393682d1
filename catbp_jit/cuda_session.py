"""CudaSession: an executable bound to GPU memory.

At bind: one device arena (the plan's regions are 256-byte aligned on target "cuda"), the
schedule table and its barriers (plan/barriers.py) on the device, and a pinned host
staging arena of the same layout, whose views the inputs are copied into (the checks are
Session's). A run makes one host -> device transfer of the inputs and constants (they
lead the arena, plan/arena.py), one per slot handed in, then runs the steps (the static
ones only when Session.run says so: see session.py) on the default stream: in mode
"compiled" one launch of the schedule kernel walks them all on the device; in mode "loop",
or when before/after hooks are given (they need a step's end), each step's kernels are
launched from Python in schedule order. Results stay on the device until read:
`sess.slots[key]` copies that slot into its pinned view on first access after a run;
`sess.device_slots[key]` is the device array itself (`__cuda_array_interface__`: CuPy,
PyTorch and others read it without a copy); `sess.gatherer(index)` and
`sess.reader(keys)` gather many slots' elements on the device (the executable's gather
kernel, codegen/cuda_gather.py) and bring them back in one copy: what the front end's
answers and a batched run's `read=` use. Nothing is allocated per run, on the host or
the device, besides the launches.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .codegen.cuda_build import CudaKernel, cuda_module
from .codegen.cuda_run import LaunchOptions, launch_count, step_launches, walk_launch
from .ir.schema import TensorSpec
from .plan.barriers import barriers
from .plan.pipeline import RESULT, SLOT_INPUT
from .session import Hook, Session, checked_index

if TYPE_CHECKING:
    from .executable import Executable


def host_and_device_arenas(n: int, dtype: np.dtype) -> tuple[Any, Any]:
    """A pinned host staging arena and a device arena of n elements each."""
    cuda = cuda_module()
    return cuda.pinned_array(n, dtype=dtype), cuda.device_array(n, dtype=dtype)


class _HostSlots(Mapping[tuple, tuple[np.ndarray, TensorSpec]]):
    """slot key -> (host view, spec), each copied back from the device on first access
    after a run."""

    def __init__(self, session: CudaSession) -> None:
        self._s = session

    def __getitem__(self, key: tuple) -> tuple[np.ndarray, TensorSpec]:
        s = self._s
        if key not in s._fresh:
            host, device, spec = s._results[key]  # KeyError for an unknown slot
            device.copy_to_host(host)
            s._fresh.add(key)
        host, _, spec = s._results[key]
        return host, spec

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._s._results)

    def __len__(self) -> int:
        return len(self._s._results)


class CudaSession(Session):
    cpu_kernels = False  # (its host buffer stages values; the kernels run on the device's)

    def __init__(
        self,
        exe: Executable,
        *,
        before: Hook | None = None,
        after: Hook | None = None,
        arenas: tuple[Any, Any] | None = None,
        launch: LaunchOptions = LaunchOptions(),
    ) -> None:
        """arenas: (pinned host, device) arenas of at least exe.memory.total elements to
        work in (the bucket sessions of a batched executable share one pair). launch: how
        launches are cut (any choice gives the same bits)."""
        self.cuda = cuda_module()
        self.launch = launch
        host, device = arenas or host_and_device_arenas(exe.memory.total, exe.dtype)
        self.device_mem = device
        super().__init__(exe, before=before, after=after, mem=host)

    def _prepare(self) -> None:
        cuda, plan = self.cuda, self.exe.plan
        self.device_table = cuda.to_device(self.table)
        dev = self.device_mem
        # inputs and constants lead the buffer: one transfer moves both
        mem = plan.memory
        end = mem.class_base["constants"] + mem.class_size["constants"]
        self._uploads = [(self.mem[:end], dev[:end])] if end else []
        self._uploads += [
            (self.mem[b.offset : b.offset + b.size], dev[b.offset : b.offset + b.size])
            for b in plan.bound(SLOT_INPUT)
        ]
        self._results: dict[tuple, tuple[np.ndarray, Any, TensorSpec]] = {}
        for b in plan.bound(RESULT):
            # (results lie in their spec's order here: only GEMM readers, CPU only, ask
            # for another, plan/layout.py)
            assert b.layout is None, f"result {b.ident!r} stored as {b.layout}, not as its spec"
            host = self.mem[b.offset : b.offset + b.size]
            self._results[b.ident] = (
                host.reshape(b.shape),
                dev[b.offset : b.offset + b.size].reshape(b.shape),
                b.spec,
            )
        self.device_slots: dict[tuple, tuple[Any, TensorSpec]] = {
            key: (d, spec) for key, (_, d, spec) in self._results.items()
        }
        self._fresh: set = set()
        self.slots = _HostSlots(self)
        kernels = cast("list[CudaKernel]", self.exe.kernels)  # (target "cuda": build_cuda's)
        self._launches = step_launches(
            [(k.entry, k.normalize) for k in kernels], self.exe.schedule, self.launch
        )
        # mode "compiled": the schedule kernel, launched once per run
        self._walk = None
        if self.exe.dispatcher is not None and self.before is None and self.after is None:
            self._walk = walk_launch(self.exe.dispatcher, self.launch)
            self.device_barriers = cuda.to_device(barriers(self.exe.schedule.steps))

    @property
    def launches_per_run(self) -> int:
        """Kernel launches a run of every step makes (1 with the schedule kernel)."""
        return launch_count(self.exe.schedule, self._walk is not None)

    def fill_constants(self) -> None:
        super().fill_constants()  # on the host; the next run's upload takes them across

    def gatherer(self, index: np.ndarray) -> Callable[[], np.ndarray]:
        """mem[index] after the last run, gathered on the device by the executable's gather
        kernel and copied back in one transfer into a pinned buffer (Session.gatherer);
        without a gather kernel, every result slot copied back and gathered here (index
        must then point into result slots)."""
        gather_kernel = self.exe.gather
        if gather_kernel is None:  # every result copied back, then gathered on the host
            on_host = super().gatherer(index)

            def fetch_and_gather() -> np.ndarray:
                self.fetch()
                return on_host()

            return fetch_and_gather
        index = checked_index(index, self.device_mem.size)
        cuda, n = self.cuda, index.size
        # at least one element each: a driver may refuse a 0-byte allocation
        d_index = cuda.to_device(index if n else np.zeros(1, index.dtype))
        d_out = cuda.device_array(max(n, 1), self.mem.dtype)
        host = cuda.pinned_array(max(n, 1), self.mem.dtype)[:n]
        launch = gather_kernel[self.launch.blocks(n), self.launch.threads_per_block]

        def gather() -> np.ndarray:
            if n:
                launch(self.device_mem, d_index, d_out)
                d_out.copy_to_host(host)
            return host

        return gather

    def reader(self, keys: Collection[tuple]) -> Callable[[], None]:
        """Result slots `keys` gathered on the device and copied back in one transfer, then
        put in their host views (Session.reader)."""
        regions = [(b.offset, b.size) for b in self.exe.plan.bound(RESULT) if b.ident in set(keys)]
        if not regions:
            return lambda: None
        gather = self.gatherer(np.concatenate([np.arange(o, o + n) for o, n in regions]))
        mem = self.mem

        def read() -> None:
            flat, at = gather(), 0
            for offset, size in regions:
                mem[offset : offset + size] = flat[at : at + size]
                at += size
            self._fresh.update(keys)

        return read

    def fetch(self) -> None:
        """Copy every result back now (a batched session reads them through its own views)."""
        for key in self._results:
            self.slots[key]

    def run_call(self) -> Callable[[], None]:
        """A call that runs the whole schedule on the device as run() does, without binding
        inputs (results stay on the device until read)."""
        return lambda: self._execute(0)

    def _execute(self, first: int) -> None:
        for host, device in self._uploads:
            device.copy_to_device(host)
        mem, table = self.device_mem, self.device_table
        steps = self.exe.schedule.steps
        if self._walk is not None:
            self._walk(mem, table, self.device_barriers, first, len(steps))
            self._fresh.clear()
            return
        for i in range(first, len(self._launches)):  # first: 0, or the first dynamic step
            launches = self._launches[i]
            if self.before is not None:
                self.before(i, steps[i])
            for launch, p in launches:
                launch(mem, table, p)
            if self.after is not None:
                self.cuda.synchronize()  # so a timing hook times this step
                self.after(i, steps[i])
        self._fresh.clear()
