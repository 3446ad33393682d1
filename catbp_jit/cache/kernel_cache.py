"""KernelCache: compiled kernels by pattern identity, loaded from disk when possible.

Policies: ``fallback`` (compile on a miss and record it), ``strict`` (a miss raises
``CacheMissError`` before anything is compiled: CI proves ahead-of-time compilation
covered everything) and ``off`` (no disk at all; the source is executed from a string
with ``cache=True`` turned off). Every miss, rebuild and refusal logs one record on the
``catbp_jit.cache`` logger with ``extra={"catbp_jit": {...}}``.
"""

from __future__ import annotations

import contextlib
import glob
import linecache
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator

from numba.core.compiler_lock import global_compiler_lock

from .. import environment
from .entry import _SHORT, MANIFEST_FORMAT, _Entry, _sha256, _unlink
from .errors import CacheDirError, CacheLockTimeout, CacheMissError
from .key import CODEGEN_VERSION, default_cache_dir, environment_identity, kernel_key
from .loaded import _PACKAGE, _describe, _eager_compile, _has_overload, _Loaded, _new_module
from .locks import DEFAULT_LOCK_TIMEOUT
from .numba_cache import _PinnedCache
from .trust import _Access, _write_error, settle_access, unwritable

POLICIES = environment.CACHE_POLICIES
_CACHE_TRUE_RE = re.compile(r"\bcache\s*=\s*True\b")

log = logging.getLogger(__package__)  # "catbp_jit.cache": one logger for the package


class KernelCache:
    """Compiled kernels by pattern identity, kept on disk across processes.

    ``get`` is safe to call from several threads and processes at once: per kernel, one
    process compiles while the others wait on its lock file (at most `lock_timeout`
    seconds, then: fallback compiles in memory, strict raises ``CacheLockTimeout``) and
    then load its result. Under fallback a directory that cannot be written (lock files,
    entries, Numba's own index updates), or that fails a write later (a full disk), is
    bypassed: one warning naming it and why, then every kernel is compiled in memory.
    Under strict that is a ``CacheDirError``, except that a read-only, warm directory is
    used as it is: nothing needs writing, so nothing is locked.

    Trust: the directory, its files and the key file must be this user's and writable by
    nobody else, and every manifest must carry this user's MAC (see ``load_secret_key``),
    since loading Numba's cache files unpickles them. An untrusted directory raises
    ``CacheTrustError`` under strict and is bypassed (compiled in memory, one warning)
    under fallback. `trust_owner` (CATBP_JIT_TRUSTED_CACHE=1) accepts a directory
    populated by another user, e.g. a deployment's read-only shared cache: their files
    and their manifests' hashes are then believed without a MAC.
    """

    def __init__(
        self,
        directory: str | None = None,
        policy: str | None = None,
        *,
        lock_timeout: float | None = None,
        trust_owner: bool | None = None,
        write_check: Callable[[str], OSError | None] = _write_error,
        on_verified: Callable[[list[str]], None] | None = None,
    ) -> None:
        # write_check(dir): why no file can be created there, or None. Tests pass their
        # own to stand for a read-only mount, which mode bits cannot show to root.
        self._write_check = write_check
        # on_verified(paths): a test seam, called with the paths of a kernel's Numba files
        # after their hashes are checked against the manifest and before Numba reads them
        # (to load code, or to extend the index on a save). A test swaps a file there to
        # show that the swapped file is never unpickled.
        self.on_verified = on_verified
        self.directory = os.path.abspath(directory) if directory else default_cache_dir()
        policy = policy or environment.cache_policy() or "fallback"
        policy = policy.strip().lower()
        if policy not in POLICIES:
            raise ValueError(f"cache policy must be one of {POLICIES}, not {policy!r}")
        self.policy = policy
        self.stats: dict[str, int] = {"hits": 0, "misses": 0, "rebuilt": 0, "compiled": 0, "memo_hits": 0}
        self._memo: dict[str, _Loaded] = {}
        if lock_timeout is None:
            lock_timeout = environment.lock_timeout()
            lock_timeout = DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout
        elif not 0 <= lock_timeout <= threading.TIMEOUT_MAX:  # also NaN
            raise ValueError(
                f"lock_timeout must be a number of seconds from 0 to "
                f"{threading.TIMEOUT_MAX:.0f}, not {lock_timeout!r}"
            )
        self.lock_timeout = float(lock_timeout)
        if trust_owner is None:
            trust_owner = environment.trusted_cache()
        self.trust_owner = bool(trust_owner)
        self._access: _Access | None = None  # settled by _prepare_dir
        # key -> why: check() found the lock held past the timeout (fallback), so get()
        # compiles that kernel in memory at once instead of waiting for it again
        self._busy: dict[str, str] = {}
        self._bypassed: str | None = None  # why the disk is not used (fallback only)

    def __repr__(self) -> str:
        return f"KernelCache({self.directory!r}, policy={self.policy!r})"

    @property
    def bypassed(self) -> str | None:
        """Why the disk is not used (fallback: untrusted, unwritable, full), or None."""
        return self._bypassed

    def key_for(self, pattern: dict, target: str = "cpu") -> str:
        return kernel_key(pattern, target)

    # -- public -----------------------------------------------------------------------
    def get(
        self, pattern: dict, source: str, entry: str, signatures: list | None = None, target: str = "cpu"
    ) -> Callable:
        """The dispatcher `entry` of the kernel module `source`, cached under `pattern`.

        With `signatures` (Numba signature strings or types) they are compiled, or loaded
        from the cache, now, under the kernel's lock; without, Numba compiles (and
        caches) on the first call. Prefer argument-only signatures ("(int64, int64)"):
        they share cache entries with plain calls. Lazy compiles are safe across
        processes but not deduplicated (two processes may both compile one signature).
        """
        key = self.key_for(pattern, target)
        loaded = self._memo.get(key)
        if loaded is not None and loaded.source == source:
            self._count("memo_hits")  # same process, same kernel: no disk at all
            fn = loaded.function(entry)
            missing = [s for s in signatures or () if not _has_overload(fn, s)]
            if missing:  # only a signature not compiled yet goes near the disk
                with global_compiler_lock:
                    self._compile_in_get(loaded, fn, missing)
            return fn
        if self.policy == "off":
            return self._get_in_memory(key, pattern, source, entry, signatures, target)
        return self._get_from_disk(key, pattern, source, entry, signatures, target)

    def in_memory(self, pattern: dict, source: str, target: str = "cpu") -> bool:
        """Whether this process has loaded the kernel already: get() then reads no disk, so
        a caller deciding what to compile need not check() the entry (whose verification
        hashes Numba's files: ~1.7 ms a kernel here, on every compile of a warm process)."""
        loaded = self._memo.get(self.key_for(pattern, target))
        return loaded is not None and loaded.source == source

    def check(self, pattern: dict, source: str, target: str = "cpu") -> tuple[str, str]:
        """("ok" | "missing" | "invalid" | "busy", reason) for the entry on disk; changes
        nothing. "busy": another process held the kernel's lock past the lock timeout;
        under fallback get() then compiles it in memory, under strict this raises
        CacheLockTimeout."""
        access = self._prepare_dir()
        if access is None:
            assert self._bypassed is not None  # (no access: the disk is bypassed, and why is said)
            return "invalid", self._bypassed
        key = self.key_for(pattern, target)
        entry = _Entry(self.directory, key, access)
        try:
            with entry.lock:
                status, reason, _ = entry.check(source)
        except CacheLockTimeout as e:
            if self.policy == "strict":
                raise
            self._busy[key] = str(e)
            return "busy", str(e)
        return status, reason

    def busy(self, pattern: dict, source: str, target: str = "cpu") -> bool:
        """Whether another process holds the kernel's lock now (compiling it, most likely),
        asked without waiting: a compile worker takes up its other units first
        (codegen/workers.py) rather than wait for this one."""
        access = self._prepare_dir()
        lock = None if access is None else _Entry(self.directory, self.key_for(pattern, target), access).lock
        if lock is None or lock.file_lock is None:  # no disk, or read-only: nobody writes
            return False
        try:
            lock.file_lock.acquire(0.0)
        except CacheLockTimeout:
            return True
        lock.file_lock.release()
        return False

    def clear(self) -> None:
        """Forget every kernel in memory and delete every entry on disk (each under its
        lock; the lock files stay, removing them would break mutual exclusion)."""
        self._memo.clear()
        kernels = os.path.join(self.directory, "kernels")
        if self.policy == "off" or not os.path.isdir(kernels):
            return
        access = self._prepare_dir()
        if access is None:
            return
        if access.read_only:
            raise CacheDirError(
                f"kernel cache directory {self.directory!r} is read-only; it cannot be cleared"
            )
        stems = set()
        for path in glob.glob(os.path.join(glob.escape(kernels), "k_*")):
            stems.add(os.path.basename(path).split(".")[0])
        for path in glob.glob(os.path.join(glob.escape(kernels), "__pycache__", "k_*")):
            stems.add(os.path.basename(path).split(".")[0])
        for stem in sorted(stems):
            entry = _Entry(self.directory, stem[2:].ljust(64, "0"), access)  # stem only
            with entry.lock:
                entry.purge()
                for tmp in glob.glob(os.path.join(glob.escape(kernels), "." + stem + ".*")):
                    _unlink(tmp)

    # -- disk -------------------------------------------------------------------------
    def _prepare_dir(self) -> _Access | None:
        """Settle once how the directory may be used: its _Access, or None when the disk
        is bypassed (fallback; an untrusted or unwritable directory, or key file)."""
        if self._access is None and self._bypassed is None:
            try:
                self._access = settle_access(
                    self.directory, self.policy, self.trust_owner, self.lock_timeout, self._write_check
                )
            except CacheDirError as e:
                if self.policy == "strict":
                    log.info(
                        "%s",
                        e,
                        extra={
                            "catbp_jit": {  # raised: said by the caller
                                "outcome": "refused",
                                "reason": str(e),
                                "directory": self.directory,
                                "policy": self.policy,
                            }
                        },
                    )
                    raise
                self._bypass(e)
        return self._access

    def _bypass(self, e: CacheDirError) -> None:
        """Under fallback: use no disk from now on, and say so once (one warning)."""
        self._access, self._bypassed = None, str(e)
        log.warning(
            "%s; kernel cache bypassed, kernels are compiled in memory",
            e,
            extra={
                "catbp_jit": {
                    "outcome": "bypassed",
                    "reason": str(e),
                    "directory": self.directory,
                    "policy": self.policy,
                }
            },
        )

    def _get_from_disk(self, key, pattern, source, entry_name, signatures, target):
        access = self._prepare_dir()
        if access is None:
            return self._get_in_memory(
                key,
                pattern,
                source,
                entry_name,
                signatures,
                target,
                "disk cache bypassed: compiled in memory",
            )
        held = self._busy.pop(key, None)  # check() has waited for this lock already
        if held is None:
            try:
                return self._get_locked(
                    _Entry(self.directory, key, access), key, pattern, source, entry_name, signatures, target
                )
            except OSError as e:  # the disk failed mid-entry: full, gone read-only...
                if self.policy == "strict":
                    raise unwritable(self.directory, str(e)) from e
                self._bypass(unwritable(self.directory, str(e)))  # and every later kernel too
                return self._get_in_memory(
                    key,
                    pattern,
                    source,
                    entry_name,
                    signatures,
                    target,
                    "disk cache bypassed: compiled in memory",
                )
            except CacheLockTimeout as e:
                if self.policy == "strict":
                    self._emit(
                        "refused", None, str(e), None, key=key, pattern=pattern, target=target
                    )  # raised: a warning would say it twice
                    raise
                held = str(e)
        # Never touch an entry another process may be writing: compile privately.
        self._emit(
            "bypassed",
            None,
            f"{held}; compiled in memory instead",
            None,
            logging.WARNING,
            key=key,
            pattern=pattern,
            target=target,
        )
        return self._get_in_memory(
            key,
            pattern,
            source,
            entry_name,
            signatures,
            target,
            "kernel lock not acquired; compiled in memory",
        )

    def _get_locked(self, entry, key, pattern, source, entry_name, signatures, target):
        started = time.perf_counter()
        # Lock order: Numba's compiler lock, then the kernel lock. The load/save hooks
        # run inside Numba's lock and take the kernel lock; the reverse order here could
        # deadlock two threads.
        with global_compiler_lock, entry.lock:
            status, reason, data = entry.check(source)
            if status != "ok":
                if self.policy == "strict":
                    self._emit("refused", None, reason, None, key=key, pattern=pattern, target=target)
                    raise CacheMissError(
                        f"kernel {_describe(pattern)} (key {key}): {reason} in "
                        f"{self.directory!r}; policy 'strict' forbids compiling"
                    )
                if status == "invalid":
                    # Never executed: the damaged entry is deleted and rebuilt below.
                    entry.purge()
                    self._count("rebuilt")
            try:
                loaded = self._write_and_load(
                    entry, status, key, pattern, target, source, data, entry_name, signatures
                )
            except OSError:  # a full disk, say: leave no half-written entry of ours
                if status != "ok":
                    with contextlib.suppress(OSError):
                        entry.purge()
                raise
        seconds = time.perf_counter() - started
        self._memo[key] = loaded
        if status == "ok" and loaded.get_misses == 0:
            self._count("hits")
        else:
            self._count("misses")
            if status == "ok":
                outcome, why = "compiled", "signatures not in the cache: " + str(signatures)
            elif status == "invalid":
                outcome, why = "rebuilt", reason
            else:
                outcome, why = "compiled", reason
            if not signatures:
                why += "; compilation deferred to the first call"
            level = logging.WARNING if outcome == "rebuilt" else logging.INFO
            self._emit(outcome, loaded, why, seconds, level=level)
        return loaded.function(entry_name)

    def _write_and_load(
        self, entry, status, key, pattern, target, source, data, entry_name, signatures
    ) -> _Loaded:
        """Write the entry unless it is there ("ok"), load it, compile `signatures` into it
        (kernel lock held)."""
        if status != "ok":
            entry.purge_numba_files()  # stale leftovers of a crashed writer
            data = entry.write_source(source)
            entry.record(
                format=MANIFEST_FORMAT,
                key=key,
                pattern=pattern,
                target=target,
                environment=environment_identity(),
                codegen_version=CODEGEN_VERSION,
                source_sha256=_sha256(source.encode("utf-8")),
                created=time.time(),
                pid=os.getpid(),
            )
        loaded = self._load_module(key, pattern, target, source, entry, data)
        fn = loaded.function(entry_name)
        compiled_before = self.stats["compiled"]
        if signatures:
            self._compile_in_get(loaded, fn, signatures)
        if self.stats["compiled"] != compiled_before or (status != "ok" and signatures):
            # also catch dispatchers that are not ours to pin (CUDA kernels, whose
            # compiles the load/save hooks do not see): the manifest must record
            # every compiled file, or the next process finds the entry invalid
            entry.record()
        return loaded

    def _load_module(self, key, pattern, target, source, entry, data: bytes) -> _Loaded:
        """Execute the verified bytes (not the file again: no window for a swap, and no
        .pyc that Python would trust by mtime), then pin Numba's caches."""
        module = _new_module(f"{_PACKAGE}.k_{key}", entry.source_path)
        loaded = _Loaded(self, key, pattern, target, source, module, entry)
        code = compile(data, entry.source_path, "exec", dont_inherit=True)
        exec(code, module.__dict__)
        for disp in loaded.dispatchers():
            # Even functions written without cache=True are cached: a hit must compile
            # nothing.
            cache = _PinnedCache(disp.py_func)
            cache.owner = loaded
            disp._cache = cache
        return loaded

    def _compile_in_get(self, loaded: _Loaded, fn, signatures) -> None:
        loaded.in_get = True
        try:
            if loaded.entry is None:  # off: count what Numba compiled
                before = sum(fn.stats.cache_misses.values())
                _eager_compile(fn, signatures)
                self._count("compiled", sum(fn.stats.cache_misses.values()) - before)
            else:
                with loaded.entry.lock:
                    _eager_compile(fn, signatures)
        finally:
            loaded.in_get = False

    # -- memory (policy "off") ----------------------------------------------------------
    def _get_in_memory(
        self,
        key,
        pattern,
        source,
        entry_name,
        signatures,
        target,
        why: str = "policy 'off': compiled in memory",
    ):
        started = time.perf_counter()
        # cache=True needs a real file; with no disk, turn it off in the text we run.
        text = _CACHE_TRUE_RE.sub("cache=False", source)
        filename = f"<catbp_jit kernel {key[:_SHORT]}>"
        linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
        module = _new_module(f"{_PACKAGE}.mem_{key}", None)
        module.__file__ = filename
        exec(compile(text, filename, "exec", dont_inherit=True), module.__dict__)
        loaded = _Loaded(self, key, pattern, target, source, module, None)
        fn = loaded.function(entry_name)
        if signatures:
            with global_compiler_lock:
                self._compile_in_get(loaded, fn, signatures)
        self._memo[key] = loaded
        self._count("misses")
        self._emit("compiled", loaded, why, time.perf_counter() - started)
        return fn

    # -- bookkeeping --------------------------------------------------------------------
    def _count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    def _emit(
        self,
        outcome: str,
        loaded: _Loaded | None,
        reason: str,
        seconds: float | None,
        level: int = logging.INFO,
        *,
        key=None,
        pattern=None,
        target=None,
    ) -> None:
        """One telemetry record: readable message, structured fields in extra."""
        if loaded is not None:
            key, pattern, target = loaded.key, loaded.pattern, loaded.target
        record = {
            "kernel": pattern,
            "key": key,
            "target": target,
            "environment": environment_identity(),
            "policy": self.policy,
            "outcome": outcome,
            "reason": reason,
            "compile_seconds": seconds,
            "directory": None if self.policy == "off" else self.directory,
        }
        took = "" if seconds is None else f" in {seconds:.3f}s"
        log.log(
            level,
            "kernel cache %s: %s key %s (%s, policy %s)%s: %s",
            outcome,
            _describe(pattern),
            key[:16],
            target,
            self.policy,
            took,
            reason,
            extra={"catbp_jit": record},
        )


_default: KernelCache | None = None


def default_cache() -> KernelCache:
    """The process-wide cache configured from the environment (created on first use)."""
    global _default
    if _default is None:
        _default = KernelCache()
    return _default


@contextlib.contextmanager
def fresh_default_cache() -> Iterator[None]:
    """Inside the block ``default_cache()`` is built anew from the environment (as in a
    new process); the previous one is back afterwards. For tests that change the env."""
    global _default
    saved, _default = _default, None
    try:
        yield
    finally:
        _default = saved
