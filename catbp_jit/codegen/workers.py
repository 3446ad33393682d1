"""Compiling kernels side by side in worker processes, into the shared disk cache.

A cold kernel costs a second or more of Numba compile, almost all of it single-threaded
Python, so independent kernels compile in parallel processes. Each worker is a fresh
interpreter (`python -c ...workers.main() DIR`): Numba and fork do not mix, and
multiprocessing's spawn start method would re-run the caller's `__main__` module in every
worker (a script without an `if __name__ == "__main__"` guard would run again, compile
included). Workers write into the disk cache, which already lets processes compile side
by side (a lock per kernel, atomic writes, verified manifests); the caller then loads
every kernel from disk as a cache hit.

Protocol: the parent writes one JSON `CompileUnit` per line on a worker's stdin and reads
one JSON reply per line (`{"ok": true, "seconds": s}` or `{"ok": false, "error": ...}`)
on its stdout; closing stdin ends the worker. One parent thread per worker hands out units
from a shared queue, so a slow kernel does not hold up the others.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .. import environment
from .loader import CompileUnit

if TYPE_CHECKING:
    from ..cache import KernelCache

ENV = "CATBP_JIT_COMPILE_WORKERS"
_ERROR_CHARS = 2000  # of a worker's error or stderr quoted in the parent's error


class KernelCompileError(RuntimeError):
    """A kernel failed to compile in a worker process (or the worker died compiling it)."""


class WorkerOptionError(ValueError):
    """A worker count that is not a whole number of processes."""


@dataclass(frozen=True)
class WorkerOptions:
    """How many worker processes compile cold kernels. 0 or 1: compile in this process."""

    workers: int

    @classmethod
    def resolve(cls, workers: int | None = None) -> WorkerOptions:
        """`workers` if given, else $CATBP_JIT_COMPILE_WORKERS, else the number of CPUs this
        process may run on."""
        if workers is None:
            workers = environment.compile_workers()  # EnvironmentSettingError if not a count
            workers = available_cpus() if workers is None else workers
        if workers < 0:
            raise WorkerOptionError(f"compile workers must be 0 or more, not {workers}")
        return cls(workers)

    def pool_size(self, n_units: int) -> int:
        """Processes worth starting for n_units cold units: none unless two can run at once."""
        n = min(self.workers, n_units, available_cpus())
        return n if n > 1 else 0


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _quote(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _ERROR_CHARS else "..." + text[-_ERROR_CHARS:]


# The directory holding this catbp_jit package: the worker runs there, so `import
# catbp_jit` finds this very copy (a checkout, not another installed one).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_WORKER = "import sys; from catbp_jit.codegen.workers import main; sys.exit(main())"


class _Worker:
    def __init__(self, directory: str, units_file: str | None = None):
        """units_file: the worker's whole list (compile_detached), else units come on stdin."""
        self.stderr = tempfile.TemporaryFile()
        env = dict(os.environ, **{ENV: "0"})  # a worker never starts workers of its own
        args = [os.path.abspath(directory)] + ([units_file] if units_file else [])
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER] + args,
            cwd=_ROOT,
            stdin=subprocess.DEVNULL if units_file else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            text=True,
            encoding="utf-8",
        )

    def compile(self, unit: CompileUnit) -> dict:
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None  # (units come on stdin: both are pipes)
        try:
            stdin.write(json.dumps(asdict(unit)) + "\n")
            stdin.flush()
            line = stdout.readline()
        except (OSError, ValueError):  # a dead worker's pipe, or one closed on us
            line = ""
        if line:
            return json.loads(line)
        code = self.proc.wait()
        self.stderr.seek(0)
        err = self.stderr.read().decode("utf-8", "replace")
        return {
            "ok": False,
            "dead": True,
            "error": f"the worker process exited with status {code}"
            + (f"; its stderr ends: {_quote(err)}" if err.strip() else ""),
        }

    def close(self) -> None:
        """End the worker: with its stdin closed it exits once its current unit is done.
        It is reaped in the background: its interpreter takes a while to shut down, and
        the caller has nothing more to wait for."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        assert self.proc.stdout is not None  # (a pipe)
        self.proc.stdout.close()
        self.stderr.close()


def _serve(worker: _Worker, todo: queue.Queue, done: queue.Queue) -> None:
    """Hand units to one worker until none are left or the worker dies."""
    while True:
        try:
            i, unit = todo.get_nowait()
        except queue.Empty:
            return
        reply = worker.compile(unit)
        done.put((i, reply))
        if reply.get("dead"):
            return


def compile_in_workers(
    units: Sequence[CompileUnit],
    cache: KernelCache,
    n_workers: int,
    on_done: Callable[[CompileUnit, float, bool], None] | None = None,
) -> int:
    """Compile `units` into `cache` (on disk) with n_workers processes, this one included:
    n_workers - 1 workers are started, and this process compiles too, taking units from
    the same queue (it would only wait otherwise, and its kernels need no loading after).

    on_done(unit, seconds, in_worker) is called in this thread as each unit is compiled.
    Raises KernelCompileError naming every unit that failed, once all units are done.
    Returns how many units the workers compiled.
    """
    from .loader import load_unit

    todo: queue.Queue = queue.Queue()
    for i, unit in enumerate(units):
        todo.put((i, unit))
    done: queue.Queue = queue.Queue()
    workers: list[_Worker] = []
    errors: dict[int, str] = {}
    finished: dict[int, bool] = {}  # unit -> compiled (or failed) in a worker

    def record(i: int, reply: dict, in_worker: bool) -> None:
        finished[i] = in_worker
        if reply.get("ok"):
            if on_done is not None:
                on_done(units[i], reply.get("seconds", 0.0), in_worker)
        else:
            errors[i] = reply.get("error", "no reason given")

    def drain(timeout: float | None) -> bool:
        try:
            i, reply = done.get(timeout=timeout) if timeout else done.get_nowait()
        except queue.Empty:
            return False
        record(i, reply, True)
        return True

    try:
        for _ in range(min(n_workers - 1, len(units) - 1)):
            try:
                workers.append(_Worker(cache.directory))
            except OSError:  # no interpreter to start (embedded Python): this process does all
                break
        threads = [threading.Thread(target=_serve, args=(w, todo, done), daemon=True) for w in workers]
        for t in threads:
            t.start()
        while True:  # this process's share, reporting the workers' progress in between
            try:
                i, unit = todo.get_nowait()
            except queue.Empty:
                break
            started = time.perf_counter()
            try:
                load_unit(unit, cache)
                reply: dict[str, Any] = {"ok": True}
            except Exception as e:  # the same report as a worker's
                reply = {"ok": False, "error": _quote(f"{type(e).__name__}: {e}")}
            reply["seconds"] = time.perf_counter() - started
            record(i, reply, False)
            while drain(None):
                pass
        while len(finished) < len(units):
            if drain(0.2):
                continue
            if not any(t.is_alive() for t in threads) and done.empty():
                break  # every worker is gone: what is left was never compiled
        for i in range(len(units)):
            if i not in finished:
                errors[i] = "not compiled: every worker process had exited"
    finally:
        while not todo.empty():  # on an error here, hand the workers nothing more
            todo.get_nowait()
        for w in workers:
            w.close()
    if errors:
        first = min(errors)
        others = [units[i].name for i in sorted(errors) if i != first]
        raise KernelCompileError(
            f"kernel {units[first].name} (cache {cache.directory!r}) failed to compile"
            f"{' in a worker process' if finished.get(first, True) else ''}: {errors[first]}"
            + (f" (also failed: {', '.join(others)})" if others else "")
        )
    return sum(finished.values())


def compile_detached(
    units: Sequence[CompileUnit],
    cache: KernelCache,
    n_workers: int,
    on_done: Callable[[CompileUnit, float], None] | None = None,
) -> None:
    """Compile `units` into `cache` with n_workers processes while this process goes on
    with other work (the numpy tier, tiers.py), waiting only for their replies.

    Every worker is given every unit, in a file of its own that it reads and deletes as
    it starts: so the workers finish compiling the lot even when this process exits first
    (a script that ran once in the numpy tier leaves its next run a warm cache). Worker i
    starts with unit i, then takes the others in the list's order (put the slow ones
    first): it passes over a unit another one has finished (its cache entry checks out)
    and puts off one another is compiling (its lock is held) until its list is done, then
    waits for it, so each unit is compiled once and the workers share the list as one
    queue.

    Returns when every unit is compiled; raises KernelCompileError as compile_in_workers
    does (a unit every worker failed, or one no worker got to)."""
    n = len(units)
    if not n:
        return
    count = max(1, min(n_workers, n))
    done: queue.Queue = queue.Queue()
    workers: list[_Worker] = []
    for i in range(count):
        order = [i] + [j for j in range(n) if j != i]
        fd, path = tempfile.mkstemp(prefix="catbp_jit_units_", suffix=".jsonl")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(asdict(units[j])) + "\n" for j in order)
        try:
            worker = _Worker(cache.directory, path)
        except OSError:  # no interpreter to start: what is left compiles here, below
            os.unlink(path)
            break
        workers.append(worker)
        threading.Thread(target=_listen, args=(worker, order, done), daemon=True).start()
    if not workers:
        compile_in_workers(units, cache, 1, on_done and (lambda u, s, w: on_done(u, s)))
        return
    ok: dict[int, bool] = {}
    errors: dict[int, str] = {}
    running = len(workers)
    while len(ok) < n and running:
        j, reply = done.get()
        if j is None:  # a worker went through its list (or died)
            running -= 1
        elif reply.get("ok"):
            if j not in ok and on_done is not None:
                on_done(units[j], reply.get("seconds", 0.0))
            ok[j] = True
        else:
            errors.setdefault(j, reply.get("error", "no reason given"))
    for worker in workers:
        worker.close()
    failed = [j for j in range(n) if j not in ok]
    if failed:
        reason = errors.get(failed[0], "not compiled: every worker process had exited")
        others = [units[j].name for j in failed[1:]]
        raise KernelCompileError(
            f"kernel {units[failed[0]].name} (cache {cache.directory!r}) failed to compile in "
            f"a worker process: {reason}" + (f" (also failed: {', '.join(others)})" if others else "")
        )


def _listen(worker: _Worker, order: list[int], done: queue.Queue) -> None:
    """Pass a detached worker's replies on, as (unit index, reply), then (None, worker)."""
    stdout = worker.proc.stdout
    assert stdout is not None  # (a pipe)
    for _ in order:
        line = stdout.readline()
        if not line:
            break
        reply = json.loads(line)
        done.put((order[reply["at"]], reply))  # (a worker may put a unit off: main)
    done.put((None, worker))


def _read(lines) -> Iterator[CompileUnit]:
    """The units of JSON lines, as they come."""
    for line in lines:
        yield CompileUnit(**json.loads(line))


def _in_turn(units: list[CompileUnit], cache) -> Iterator[tuple[int, CompileUnit]]:
    """A detached worker's units with their places in its list: each in order, but one
    whose lock another worker holds (compiling it) put off until the others are done, so
    that a worker does not wait on another's unit while units remain."""
    later = []
    for at, unit in enumerate(units):
        if cache.busy(unit.identity, unit.source):
            later.append(at)
        else:
            yield at, unit
    for at in later:
        yield at, units[at]


def main(argv: Sequence[str] | None = None) -> int:
    """The worker: compile each unit read from stdin (or from the file argv[1], which it
    deletes) into the cache directory argv[0], replying on stdout after each."""
    from ..cache import KernelCache
    from .loader import load_unit

    argv = sys.argv[1:] if argv is None else list(argv)
    # Replies own the real stdout; anything else printed (by Numba, by C code) goes to
    # stderr, where it cannot break the protocol.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    cache = KernelCache(argv[0], policy="fallback")
    todo: Iterator[tuple[int, CompileUnit]] = enumerate(_read(sys.stdin))  # one at a time
    if len(argv) > 1:  # compile_detached: the whole list in a file, ours to delete
        with open(argv[1], encoding="utf-8") as f:
            todo = _in_turn(list(_read(f.readlines())), cache)
        os.unlink(argv[1])
    parent = True  # still reading the replies (a detached parent may have exited)
    for at, unit in todo:
        started = time.perf_counter()
        try:
            # another worker may have compiled it already (compile_detached): then there is
            # nothing to load here
            if cache.check(unit.identity, unit.source)[0] != "ok":
                load_unit(unit, cache)
            reply: dict[str, Any] = {"ok": True}
        except Exception as e:  # reported to the parent, which names the kernel
            reply = {"ok": False, "error": _quote(f"{type(e).__name__}: {e}")}
        reply["seconds"] = time.perf_counter() - started
        reply["unit"] = unit.name
        reply["at"] = at  # its place in the list (compile_detached's may come out of turn)
        if parent:
            try:
                replies.write(json.dumps(reply) + "\n")
                replies.flush()
            except OSError:  # the parent is gone: compile the rest into the cache anyway
                parent = False
    return 0
