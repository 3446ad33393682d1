"""Per-kernel file locks: one writer per kernel at a time, across threads and processes,
with a bounded wait that says whom it waits for."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import stat
import threading
import time

from .errors import CacheLockTimeout
from .trust import _Access, _euid

try:  # POSIX advisory locks; Windows falls back to msvcrt byte-range locks.
    import fcntl
except ImportError:  # pragma: no cover - not exercised on Linux CI
    fcntl = None  # type: ignore[assignment]  # (no fcntl: marked by None)
    import msvcrt

DEFAULT_LOCK_TIMEOUT = 120.0  # seconds; CATBP_JIT_LOCK_TIMEOUT overrides
_LOCK_REPORT_AFTER = 2.0  # seconds of waiting before saying who holds a lock

log = logging.getLogger(__package__)  # "catbp_jit.cache": one logger for the package


class _FileLock:
    """Exclusive advisory lock on a file, re-entrant within one process.

    flock locks belong to an open file description, so a second open+flock in the same
    process would deadlock against the first; the depth counter makes nesting (get ->
    Numba load/save hooks) take the OS lock once. One instance per path per process.
    The holder writes its pid, host and start time into the file, so that a process kept
    waiting (by a writer stopped mid-compile, say) can say whom it waits for; the wait
    is bounded. Lock files are 0600 in a 0700 directory: nobody else can open one, and
    so nobody else can hold it (flock works on a read-only descriptor).
    """

    _registry: dict[str, _FileLock] = {}
    _registry_guard = threading.Lock()

    @classmethod
    def for_path(cls, path: str) -> _FileLock:
        with cls._registry_guard:
            lock = cls._registry.get(path)
            if lock is None:
                lock = cls._registry[path] = cls(path)
            return lock

    def __init__(self, path: str):
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: int | None = None

    def acquire(self, timeout: float) -> None:
        if not self._thread_lock.acquire(timeout=timeout):
            raise CacheLockTimeout(
                f"kernel cache lock {self.path} is still held by another "
                f"thread of this process after {timeout:g}s"
            )
        try:
            if self._depth == 0:
                self._fd = self._lock_file(timeout)
            self._depth += 1
        except BaseException:
            self._thread_lock.release()
            raise

    def release(self) -> None:
        try:
            self._depth -= 1
            if self._depth == 0:
                fd, self._fd = self._fd, None
                assert fd is not None  # (the first acquire opened it)
                try:
                    if fcntl is not None:
                        os.ftruncate(fd, 0)  # nobody holds it now
                        fcntl.flock(fd, fcntl.LOCK_UN)
                    else:  # pragma: no cover
                        os.lseek(fd, 0, os.SEEK_SET)
                        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
                finally:
                    os.close(fd)
        finally:
            self._thread_lock.release()

    def _lock_file(self, timeout: float) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if fcntl is None:  # pragma: no cover
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                return fd
            st = os.fstat(fd)
            if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == _euid():
                os.fchmod(fd, 0o600)  # made by an older version, 0644
            self._wait(fd, timeout)
            with contextlib.suppress(OSError):  # who holds it is a courtesy: a full disk
                os.ftruncate(fd, 0)  # must not stop the locking
                os.write(
                    fd,
                    (
                        f"pid {os.getpid()} on {socket.gethostname()} since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
                    ).encode("utf-8", "replace"),
                )
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _wait(self, fd: int, timeout: float) -> None:
        started = time.monotonic()
        reported, pause = False, 0.005
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            waited = time.monotonic() - started
            if waited >= timeout:
                raise CacheLockTimeout(
                    f"kernel cache lock {self.path} is still held by {self.holder()} after "
                    f"{waited:.0f}s (CATBP_JIT_LOCK_TIMEOUT={timeout:g}); if that process "
                    f"is stopped or hung, end it; the entry it writes is verified before use"
                )
            if not reported and waited >= _LOCK_REPORT_AFTER:
                reported = True
                log.warning(
                    "kernel cache: waiting for lock %s, held by %s (giving up after %gs)",
                    self.path,
                    self.holder(),
                    timeout,
                    extra={
                        "catbp_jit_lock": {"lock": self.path, "holder": self.holder(), "timeout": timeout}
                    },
                )
            time.sleep(pause)
            pause = min(2 * pause, 0.2)

    def holder(self) -> str:
        """Who holds the lock, as its holder wrote it."""
        try:
            with open(self.path, "rb") as f:
                text = f.read(300).decode("utf-8", "replace").strip()
        except OSError:
            text = ""
        return text or "a process that did not say who it is"


class _EntryLock:
    """A kernel's lock as used by one cache: bounded wait, none at all when read-only."""

    def __init__(self, path: str, access: _Access):
        self.file_lock = None if access.read_only else _FileLock.for_path(path)
        self.timeout = access.lock_timeout

    def __enter__(self):
        if self.file_lock is not None:
            self.file_lock.acquire(self.timeout)
        return self

    def __exit__(self, *exc):
        if self.file_lock is not None:
            self.file_lock.release()
