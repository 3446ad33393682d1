"""On-disk kernel cache: generated Numba source in, compiled dispatcher out.

A kernel is named by its *pattern identity* (a small JSON-able dict from the code
generator) plus the target and the compile environment; ``kernel_key`` hashes them.
``KernelCache.get`` writes the kernel's source as ``<dir>/kernels/k_<key[:40]>.py``,
executes exactly the bytes it verified, and lets Numba's own ``cache=True`` machinery
store the compiled code in ``<dir>/kernels/__pycache__`` (``.nbi`` index, ``.nbc`` data).
A manifest ``k_<key[:40]>.json`` beside the module records the sha256 of the source and
of every Numba cache file, so a second process verifies and loads, compiling nothing.

Layout::

    <dir>/kernels/k_<key40>.py            "# catbp_jit kernel sha256=<body> key=<key>" + body
    <dir>/kernels/k_<key40>.json          manifest (pattern, environment, file hashes, MAC)
    <dir>/kernels/__pycache__/k_<key40>.<func>-<line>.py311.nbi / .N.nbc   (Numba's)
    <dir>/locks/k_<key40>.lock            advisory flock: one writer per kernel at a time;
                                          holds "pid <pid> on <host> since <time>"
    $CATBP_JIT_KEY_FILE (~/.config/catbp_jit/cache.key)   the key that signs manifests

Directories are 0700 and files 0600; see ``KernelCache`` for what is trusted and why.

What Numba 0.68 does and does not guarantee (numba/core/caching.py), and so what this
module adds:

* ``IndexDataCacheFile._open_for_write`` writes every ``.nbi``/``.nbc`` to
  ``<file>.tmp.<uuid>`` and ``os.replace``-s it: each file appears whole or not at all
  (no fsync, so after a power loss a file may still be empty or short).
* ``save()`` as a whole is *not* atomic: for a new signature it rewrites the index and
  then the data file. Two processes saving different signatures of one function read
  the same index, choose the same ``.1.nbc`` and the last index wins: an index entry
  can name a data file that holds another signature's code. We hold a per-kernel
  ``flock`` around every Numba save (and load), so that cannot happen here.
* ``_load_index`` only tolerates a *missing* index; a truncated or garbled ``.nbi`` or
  ``.nbc`` makes ``pickle`` raise out of ``Dispatcher.compile`` (and pickle data is
  code). Hence every Numba file is hash-checked against the manifest before import, and
  each load unpickles only the bytes it has just hash-checked against the manifest
  (``_VerifiedCacheFile``); the manifest itself is believed only if its HMAC verifies.
* The index is stamped with a sha256 of the module file's content, and keyed by the
  function's bytecode and the CPU (``codegen.magic_tuple()``), so a rewritten module
  never loads old code by accident; we delete the old files on a rebuild anyway.

Policies: ``fallback`` (compile on a miss and record it), ``strict`` (a miss raises
``CacheMissError`` before anything is compiled: CI proves ahead-of-time compilation
covered everything) and ``off`` (no disk at all; the source is executed from a string
with ``cache=True`` turned off). Every miss, rebuild and refusal logs one record on the
``catbp_jit.cache`` logger with ``extra={"catbp_jit": {...}}``.

This module must not import the planner or code generator (they import it).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import hmac
import importlib.util
import io
import json
import linecache
import logging
import os
import pickle
import platform
import re
import socket
import stat
import sys
import tempfile
import threading
import time
import types
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Dict, List, Optional, Tuple

import llvmlite
import llvmlite.binding as llvm
import numba
import numpy
from numba.core import config as numba_config
from numba.core import sigutils
from numba.core.caching import (CompileResultCacheImpl, FunctionCache, IndexDataCacheFile,
                                InTreeCacheLocator)
from numba.core.compiler_lock import global_compiler_lock
from numba.core.registry import CPUDispatcher

from .. import environment
from ..atomic import atomic_write
from ..errors import CatbpError

try:  # POSIX advisory locks; Windows falls back to msvcrt byte-range locks.
    import fcntl
except ImportError:  # pragma: no cover - not exercised on Linux CI
    fcntl = None
    import msvcrt

# Bump to invalidate every cache entry (e.g. when the generated code's conventions change).
CODEGEN_VERSION = "1"

POLICIES = environment.CACHE_POLICIES
MANIFEST_FORMAT = 1
_SHORT = 40  # key characters in file names (160 bits)
_HEADER_RE = re.compile(r"^# catbp_jit kernel sha256=([0-9a-f]{64}) key=([0-9a-f]{64})$")
_CACHE_TRUE_RE = re.compile(r"\bcache\s*=\s*True\b")
_PACKAGE = "catbp_jit_kernels"  # parent of the kernel modules in sys.modules
DEFAULT_LOCK_TIMEOUT = 120.0  # seconds; CATBP_JIT_LOCK_TIMEOUT overrides
_LOCK_REPORT_AFTER = 2.0  # seconds of waiting before saying who holds a lock

log = logging.getLogger("catbp_jit.cache")


# CatbpError: the command line reports these in one line, as it does bad input.
class CacheMissError(CatbpError, RuntimeError):
    """Policy ``strict`` and no valid cache entry (or no cached code for a signature)."""


class CacheCorruptionError(CatbpError, RuntimeError):
    """A cache entry failed verification (internal: corrupted entries are rebuilt)."""


class CacheDirError(CatbpError, RuntimeError):
    """The cache directory cannot be created or written."""


class CacheTrustError(CacheDirError):
    """The cache directory, an entry file or the key file could be written by someone
    else: loading from it could run their code (Numba's cache files are pickles)."""


class CacheLockTimeout(CacheDirError):
    """A kernel's lock stayed held by another process for longer than the lock timeout."""


# ---------------------------------------------------------------------------- identity

@lru_cache(maxsize=None)
def _static_environment() -> Tuple[Tuple[str, Any], ...]:
    # Host CPU queries cost a few ms; the answer cannot change within a process.
    cpu_name = numba_config.CPU_NAME or llvm.get_host_cpu_name()
    if numba_config.CPU_FEATURES is not None:
        features = numba_config.CPU_FEATURES
    else:
        try:
            features = llvm.get_host_cpu_features().flatten()
        except RuntimeError:  # some hosts cannot report features
            features = ""
    return (
        ("python", platform.python_implementation() + " " + platform.python_version()),
        ("platform", sys.platform + "-" + platform.machine()),
        ("numba", numba.__version__),
        ("llvmlite", llvmlite.__version__),
        ("numpy", numpy.__version__),
        ("cpu_name", cpu_name),
        ("cpu_features", features),
    )


def environment_identity(*, codegen_version: Optional[str] = None) -> dict:
    """What compiled code depends on besides its source: versions, CPU, codegen version
    (``codegen_version``, default CODEGEN_VERSION: tests name another to see a bump)."""
    env = dict(_static_environment())
    # read now, so a bump takes effect at once
    env["codegen_version"] = CODEGEN_VERSION if codegen_version is None else codegen_version
    return env


def _canonical_json(obj: Any) -> str:
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                          allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"kernel pattern must be plain JSON data: {e}") from None


def kernel_key(pattern: dict, target: str = "cpu", *,
               codegen_version: Optional[str] = None) -> str:
    """sha256 hex of (codegen version, pattern, target, environment identity); the codegen
    version is CODEGEN_VERSION unless ``codegen_version`` names another."""
    version = CODEGEN_VERSION if codegen_version is None else codegen_version
    payload = _canonical_json([version, pattern, target,
                               environment_identity(codegen_version=version)])
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def default_cache_dir() -> str:
    """$CATBP_JIT_CACHE_DIR, else the platform's user cache directory."""
    env = environment.cache_dir()
    if env:
        return env
    home = os.path.expanduser("~")
    if sys.platform == "win32":  # pragma: no cover
        base = os.environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
        return os.path.join(base, "catbp_jit", "Cache")
    if sys.platform == "darwin":  # pragma: no cover
        return os.path.join(home, "Library", "Caches", "catbp_jit")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(home, ".cache")  # XDG spec
    return os.path.join(base, "catbp_jit")


# ---------------------------------------------------------------------------- trust

def key_file_path() -> str:
    """$CATBP_JIT_KEY_FILE, else the user's config directory: outside the cache, so that
    whoever can write the cache cannot also sign its manifests."""
    env = environment.key_file()
    if env:
        return env
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "catbp_jit", "cache.key")


def _euid() -> Optional[int]:
    return os.geteuid() if hasattr(os, "geteuid") else None  # None: no POSIX owners


def _ownership_problem(path: str, st: os.stat_result, check_owner: bool) -> Optional[str]:
    """Why someone other than this user could have written `path`, or None."""
    euid = _euid()
    if euid is None:  # pragma: no cover - Windows: ACLs, not mode bits
        return None
    if check_owner and st.st_uid != euid:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {euid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _file_problem(path: str, check_owner: bool) -> Optional[str]:
    """Why an entry file must not be read, or None (also None when it does not exist)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    return _ownership_problem(path, st, check_owner)


def _write_error(directory: str) -> Optional[OSError]:
    """Why no file can be created in `directory` (tried, not guessed from mode bits:
    ACLs, read-only mounts), or None."""
    try:
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as e:
        return e
    return None


def _not_a_directory(path: str) -> Optional[str]:
    """`path`, or the nearest of its parents that exists, when that is not a directory."""
    while not os.path.lexists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent
    return None if os.path.isdir(path) else path


def _create_key_file(path: str) -> None:
    d = os.path.dirname(path)
    os.makedirs(d, 0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".cache.key.")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(32))
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(tmp, path)  # appears whole, never half-written
    finally:
        _unlink(tmp)


def load_secret_key(path: str, cache_dir: str) -> bytes:
    """The per-user key that signs manifests, created (32 random bytes, mode 0600) on
    first use. Raises CacheTrustError for a key others could read or write."""
    real, root = os.path.realpath(path), os.path.realpath(cache_dir)
    if os.path.commonpath([real, root]) == root:
        raise CacheTrustError(f"cache key file {path} lies inside the cache directory "
                              f"{cache_dir}; set CATBP_JIT_KEY_FILE to a path outside it")
    try:
        if not os.path.exists(path):
            _create_key_file(path)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = f.read()
    except OSError as e:
        raise CacheTrustError(f"cache key file {path} cannot be created or read ({e}); set "
                              f"CATBP_JIT_KEY_FILE to a file of your own") from e
    problem = _ownership_problem(path, st, check_owner=True)
    if problem is None and _euid() is not None and st.st_mode & 0o077:
        problem = f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem is None and len(key) < 32:
        problem = f"{path} holds {len(key)} bytes, fewer than 32"
    if problem:
        raise CacheTrustError(f"cache key file refused: {problem}; anyone who can read it "
                              f"can forge cache entries (chmod 600 it, or delete it to make "
                              f"a new one)")
    return key


def _manifest_mac(secret: bytes, manifest: dict) -> str:
    body = {k: v for k, v in manifest.items() if k != "mac"}
    return hmac.new(secret, _canonical_json(body).encode("ascii"), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class _Access:
    """How this process may use one cache directory, settled once by KernelCache."""
    secret: bytes  # signs manifests
    check_owner: bool  # False: CATBP_JIT_TRUSTED_CACHE=1, another user's files accepted
    read_only: bool  # strict on a read-only warm cache: no locks, nothing written
    lock_timeout: float


# ---------------------------------------------------------------------------- files

def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


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

    _registry: Dict[str, "_FileLock"] = {}
    _registry_guard = threading.Lock()

    @classmethod
    def for_path(cls, path: str) -> "_FileLock":
        with cls._registry_guard:
            lock = cls._registry.get(path)
            if lock is None:
                lock = cls._registry[path] = cls(path)
            return lock

    def __init__(self, path: str):
        self.path = path
        self._thread_lock = threading.RLock()
        self._depth = 0
        self._fd: Optional[int] = None

    def acquire(self, timeout: float) -> None:
        if not self._thread_lock.acquire(timeout=timeout):
            raise CacheLockTimeout(f"kernel cache lock {self.path} is still held by another "
                                   f"thread of this process after {timeout:g}s")
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
                os.ftruncate(fd, 0)             # must not stop the locking
                os.write(fd, (f"pid {os.getpid()} on {socket.gethostname()} since "
                              f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n").encode("utf-8",
                                                                                   "replace"))
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
                    f"is stopped or hung, end it; the entry it writes is verified before use")
            if not reported and waited >= _LOCK_REPORT_AFTER:
                reported = True
                log.warning("kernel cache: waiting for lock %s, held by %s (giving up after "
                            "%gs)", self.path, self.holder(), timeout,
                            extra={"catbp_jit_lock": {"lock": self.path, "holder": self.holder(),
                                                      "timeout": timeout}})
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

    def __init__(self, path: str, access: "_Access"):
        self.file_lock = None if access.read_only else _FileLock.for_path(path)
        self.timeout = access.lock_timeout

    def __enter__(self):
        if self.file_lock is not None:
            self.file_lock.acquire(self.timeout)
        return self

    def __exit__(self, *exc):
        if self.file_lock is not None:
            self.file_lock.release()


class _Entry:
    """The files of one kernel on disk, and how to verify, write and remove them."""

    def __init__(self, directory: str, key: str, access: _Access):
        self.key = key
        self.access = access
        self.stem = "k_" + key[:_SHORT]
        self.kernels_dir = os.path.join(directory, "kernels")
        self.pycache = os.path.join(self.kernels_dir, "__pycache__")  # Numba's InTree dir
        self.source_path = os.path.join(self.kernels_dir, self.stem + ".py")
        self.manifest_path = os.path.join(self.kernels_dir, self.stem + ".json")
        self.lock = _EntryLock(os.path.join(directory, "locks", self.stem + ".lock"), access)

    # -- Numba's files for this module: "<stem>.<qualname>-<line>.pyXY.nbi" / ".N.nbc"
    def numba_files(self) -> Dict[str, str]:
        found = {}
        for path in glob.glob(os.path.join(glob.escape(self.pycache), self.stem + ".*")):
            name = os.path.basename(path)
            if name.endswith((".nbi", ".nbc")):  # not Numba's "<file>.tmp.<uuid>" leftovers
                found[name] = path
        return found

    def hash_numba_files(self) -> Dict[str, str]:
        out = {}
        for name, path in sorted(self.numba_files().items()):
            with contextlib.suppress(FileNotFoundError):
                with open(path, "rb") as f:
                    out[name] = _sha256(f.read())
        return out

    def read_manifest(self) -> Tuple[Optional[dict], str]:
        """(manifest, "verified") if it is ours and signed with our key, else (None, why).
        The manifest's hashes are what every other file is checked against, so nothing
        it says is believed before its MAC verifies."""
        problem = _file_problem(self.manifest_path, self.access.check_owner)
        if problem:
            return None, problem
        try:
            with open(self.manifest_path, "rb") as f:
                m = json.loads(f.read().decode("utf-8"))
        except FileNotFoundError:
            return None, "manifest is missing"
        except (OSError, ValueError):
            return None, "manifest is unreadable"
        if not isinstance(m, dict):
            return None, "manifest is unreadable"
        if self.access.check_owner:
            mac = m.get("mac")
            if not isinstance(mac, str):
                return None, "manifest carries no MAC (not written by this user's catbp_jit)"
            if not hmac.compare_digest(mac, _manifest_mac(self.access.secret, m)):
                return None, ("manifest MAC does not verify (altered, forged, or signed with "
                              "another key)")
        return m, "verified"

    def write_manifest(self, manifest: dict) -> None:
        manifest = dict(manifest, mac=_manifest_mac(self.access.secret, manifest))
        data = json.dumps(manifest, sort_keys=True, indent=1).encode("utf-8")
        atomic_write(self.manifest_path, data)

    def record(self, **fields) -> dict:
        """Rewrite the manifest with the current hashes of Numba's files (lock held)."""
        m = self.read_manifest()[0] or {}  # a manifest we did not sign contributes nothing
        m.update(fields)
        m["numba_files"] = self.hash_numba_files()
        m["updated"] = time.time()
        self.write_manifest(m)
        return m

    def verify_numba_files(self, manifest: Optional[dict] = None) -> Optional[str]:
        """None if Numba's files are exactly those in the (verified) manifest, else why."""
        m, why = self.read_manifest() if manifest is None else (manifest, "")
        recorded = (m or {}).get("numba_files")
        if not isinstance(recorded, dict):
            return why or "manifest records no Numba files"
        for path in self.numba_files().values():
            problem = _file_problem(path, self.access.check_owner)
            if problem:
                return problem
        actual = self.hash_numba_files()
        for name in sorted(set(recorded) | set(actual)):
            if name not in actual:
                return f"Numba cache file {name} is missing"
            if name not in recorded:
                return f"Numba cache file {name} is not in the manifest"
            if actual[name] != recorded[name]:
                return f"Numba cache file {name} fails its sha256 (truncated or altered)"
        return None

    def check(self, source: str) -> Tuple[str, str, Optional[bytes]]:
        """("ok" | "missing" | "invalid", reason, verified file bytes to execute)."""
        problem = _file_problem(self.source_path, self.access.check_owner)
        if problem:
            return "invalid", problem, None
        try:
            with open(self.source_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            if not os.path.lexists(self.manifest_path) and not self.numba_files():
                return "missing", "no cache entry", None
            return "invalid", "module source file is missing", None
        head, nl, body = data.partition(b"\n")
        match = _HEADER_RE.match(head.decode("ascii", "replace"))
        if not nl or match is None:
            return "invalid", "module header is missing or damaged", None
        if match.group(1) != _sha256(body):
            return "invalid", "module source fails its sha256 (truncated or altered)", None
        if match.group(2) != self.key:
            return "invalid", "module belongs to another key", None
        if body != source.encode("utf-8"):
            return "invalid", "stored source differs from the generated source (stale)", None
        m, why = self.read_manifest()
        if m is None:
            return "invalid", why, None
        if m.get("key") != self.key or m.get("source_sha256") != _sha256(body):
            return "invalid", "manifest does not match the module", None
        reason = self.verify_numba_files(m)
        if reason:
            return "invalid", reason, None
        return "ok", "verified", data

    def write_source(self, source: str) -> bytes:
        body = source.encode("utf-8")
        header = f"# catbp_jit kernel sha256={_sha256(body)} key={self.key}\n".encode("ascii")
        data = header + body
        atomic_write(self.source_path, data)
        return data

    def purge(self) -> None:
        """Delete the module, manifest and Numba's files (and temp leftovers)."""
        # Manifest first: a crash part-way leaves an entry that fails verification.
        _unlink(self.manifest_path)
        _unlink(self.source_path)
        self.purge_numba_files()

    def purge_numba_files(self) -> None:
        for path in glob.glob(os.path.join(glob.escape(self.pycache), self.stem + ".*")):
            if not path.endswith(".pyc"):
                _unlink(path)


# ---------------------------------------------------------------------------- Numba hooks

class _PinnedImpl(CompileResultCacheImpl):
    """Numba's CompileResult cache, pinned to the module's own __pycache__.

    Numba would prefer $NUMBA_CACHE_DIR, and silently fall back to ~/.cache/numba when
    __pycache__ is not writable; a kernel's compiled code must live beside its verified
    source instead. (Mirrors CacheImpl.__init__ minus the locator search.)
    """

    def __init__(self, py_func):
        self._lineno = py_func.__code__.co_firstlineno
        qualname = getattr(py_func, "__qualname__", py_func.__name__)
        source_path = py_func.__code__.co_filename
        self._locator = InTreeCacheLocator(py_func, source_path)
        modname = os.path.splitext(os.path.basename(source_path))[0]
        self._filename_base = self.get_filename_base(f"{modname}.{qualname}",
                                                     getattr(sys, "abiflags", ""))


class _VerifiedCacheFile(IndexDataCacheFile):
    """Numba's index and data files, unpickled only from bytes whose sha256 the verified
    manifest records: the check and the read are one read, so a file swapped after the
    check is never unpickled. Written 0600, whatever the umask."""

    expected: Dict[str, str] = {}  # file name -> sha256, set under the kernel lock

    def _verified_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            data = f.read()
        name = os.path.basename(path)
        if self.expected.get(name) != _sha256(data):
            raise CacheCorruptionError(f"Numba cache file {name} does not match the sha256 "
                                       f"in its manifest")
        return data

    def _load_index(self):
        try:
            stream = io.BytesIO(self._verified_bytes(self._index_path))
        except FileNotFoundError:
            return {}
        if pickle.load(stream) != self._version:  # as Numba's: another version's index
            return {}
        stamp, overloads = pickle.loads(stream.read())
        return overloads if stamp == self._source_stamp else {}

    def _load_data(self, name):
        return pickle.loads(self._verified_bytes(self._data_path(name)))

    @contextlib.contextmanager
    def _open_for_write(self, filepath):
        tmp = f"{filepath}.tmp.{uuid.uuid4().hex[:16]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
            os.replace(tmp, filepath)
        except BaseException:
            _unlink(tmp)
            raise


class _PinnedCache(FunctionCache):
    """Numba's function cache with the kernel lock and hash checks around it."""

    _impl_class = _PinnedImpl
    owner: "_Loaded"

    def __init__(self, py_func):
        super().__init__(py_func)
        self._cache_file = _VerifiedCacheFile(self._cache_path, self._impl.filename_base,
                                              self._cache_file._source_stamp)

    def _expect(self) -> Optional[str]:
        """Arm the hash checks from the verified manifest (lock held); None, or why not."""
        entry = self.owner.entry
        m, why = entry.read_manifest()
        reason = why if m is None else entry.verify_numba_files(m)
        self._cache_file.expected = {} if reason else dict(m["numba_files"])
        on_verified = self.owner.cache.on_verified
        if reason is None and on_verified is not None:
            on_verified([os.path.join(entry.pycache, name) for name in sorted(m["numba_files"])])
        return reason

    def load_overload(self, sig, target_context):
        owner = self.owner
        with owner.entry.lock:
            reason = self._expect()
            data = None
            if reason is None:
                try:
                    data = super().load_overload(sig, target_context)
                except Exception as e:  # verified yet unloadable (e.g. incompatible pickle)
                    reason = f"Numba cache file failed to load: {e!r}"
            if reason is not None and owner.cache.policy != "strict":
                owner.corrupt(reason)  # strict only refuses (below); it repairs nothing
            if data is None:
                owner.load_miss(sig, reason)  # raises CacheMissError under strict
        return data

    def save_overload(self, sig, data):
        owner = self.owner
        with owner.entry.lock:
            reason = self._expect()
            if reason is not None:  # Numba reads the index to extend it: never unverified
                owner.corrupt(reason)
            super().save_overload(sig, data)
            owner.entry.record()
        owner.saved(sig)


class _Loaded:
    """A kernel module loaded from disk (or memory), with its per-process bookkeeping."""

    def __init__(self, cache: "KernelCache", key: str, pattern: dict, target: str,
                 source: str, module: types.ModuleType, entry: Optional[_Entry]):
        self.cache, self.key, self.pattern, self.target = cache, key, pattern, target
        self.source, self.module, self.entry = source, module, entry
        self.in_get = False
        self.get_misses = 0
        self._miss_started: Optional[float] = None

    def function(self, name: str) -> Callable:
        fn = getattr(self.module, name, None)
        if fn is None:
            raise AttributeError(f"kernel {self.key[:12]}: source defines no {name!r}")
        return fn

    def dispatchers(self) -> List[Any]:
        return [v for v in vars(self.module).values()
                if isinstance(v, CPUDispatcher)
                and getattr(v.py_func, "__module__", None) == self.module.__name__]

    # -- called from _PinnedCache with the kernel lock held
    def corrupt(self, reason: str) -> None:
        self.entry.purge_numba_files()
        self.entry.record()  # now records no Numba files
        self.cache._count("rebuilt")
        self.cache._emit("rebuilt", self, reason, None, level=logging.WARNING)

    def load_miss(self, sig, reason: Optional[str]) -> None:
        why = reason or f"no cached code for signature {sig}"
        if self.cache.policy == "strict":
            self.cache._emit("refused", self, why, None)  # raised: a warning says it twice
            raise CacheMissError(f"kernel {_describe(self.pattern)} (key {self.key}): "
                                 f"{why}; policy 'strict' forbids compiling")
        self.cache._count("compiled")
        self.get_misses += 1
        self._miss_started = time.perf_counter()

    def saved(self, sig) -> None:
        if not self.in_get:  # a lazy compile after get(): it is its own miss record
            seconds = None
            if self._miss_started is not None:
                seconds = time.perf_counter() - self._miss_started
            self.cache._emit("compiled", self, f"compiled on first call for {sig}", seconds)
        self._miss_started = None


def _describe(pattern: dict) -> str:
    """The kernel's readable identity: its template and the fields that specialize it."""
    if not isinstance(pattern, dict) or "template" not in pattern:
        return _canonical_json(pattern)[:80]
    fields = ", ".join(f"{k}={v}" for k, v in pattern.items()
                       if k not in ("template", "source_sha256", "kernels"))
    return f"{pattern['template']!r} ({fields})" if fields else repr(pattern["template"])


def _new_module(name: str, path: Optional[str]) -> types.ModuleType:
    """An empty module registered in sys.modules (Numba re-imports it by name when it
    unpickles cached code, see numba.core.environment._rebuild_env)."""
    if _PACKAGE not in sys.modules:
        pkg = types.ModuleType(_PACKAGE)
        pkg.__path__ = []  # a namespace-like parent so "catbp_jit_kernels.k_..." resolves
        sys.modules[_PACKAGE] = pkg
    if path is not None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
    else:
        module = types.ModuleType(name)
    sys.modules[name] = module
    setattr(sys.modules[_PACKAGE], name.rpartition(".")[2], module)
    return module


def _normalize(sig):
    """Numba's cache index is keyed by the signature object as passed: a call caches
    under a tuple of argument types, compile("int64(int64, int64)") under the string.
    Argument-only signatures are passed as tuples so eager and lazy compiles share
    entries; a signature with a return type is kept as given."""
    args, ret = sigutils.normalize_signature(sig)
    return tuple(args) if ret is None else sig


def _has_overload(fn, sig) -> bool:
    args, _ = sigutils.normalize_signature(sig)
    return tuple(args) in fn.overloads


def _eager_compile(fn, signatures) -> None:
    for sig in signatures:
        fn.compile(_normalize(sig))


# ---------------------------------------------------------------------------- the cache

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

    def __init__(self, directory: Optional[str] = None, policy: Optional[str] = None, *,
                 lock_timeout: Optional[float] = None, trust_owner: Optional[bool] = None,
                 write_check: Callable[[str], Optional[OSError]] = _write_error,
                 on_verified: Optional[Callable[[List[str]], None]] = None):
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
        self.stats: Dict[str, int] = {"hits": 0, "misses": 0, "rebuilt": 0, "compiled": 0,
                                      "memo_hits": 0}
        self._memo: Dict[str, _Loaded] = {}
        if lock_timeout is None:
            lock_timeout = environment.lock_timeout()
            lock_timeout = DEFAULT_LOCK_TIMEOUT if lock_timeout is None else lock_timeout
        elif not 0 <= lock_timeout <= threading.TIMEOUT_MAX:  # also NaN
            raise ValueError(f"lock_timeout must be a number of seconds from 0 to "
                             f"{threading.TIMEOUT_MAX:.0f}, not {lock_timeout!r}")
        self.lock_timeout = float(lock_timeout)
        if trust_owner is None:
            trust_owner = environment.trusted_cache()
        self.trust_owner = bool(trust_owner)
        self._access: Optional[_Access] = None  # settled by _prepare_dir
        # key -> why: check() found the lock held past the timeout (fallback), so get()
        # compiles that kernel in memory at once instead of waiting for it again
        self._busy: Dict[str, str] = {}
        self._bypassed: Optional[str] = None  # why the disk is not used (fallback only)

    def __repr__(self):
        return f"KernelCache({self.directory!r}, policy={self.policy!r})"

    @property
    def bypassed(self) -> Optional[str]:
        """Why the disk is not used (fallback: untrusted, unwritable, full), or None."""
        return self._bypassed

    def key_for(self, pattern: dict, target: str = "cpu") -> str:
        return kernel_key(pattern, target)

    # -- public -----------------------------------------------------------------------
    def get(self, pattern: dict, source: str, entry: str, signatures: Optional[list] = None,
            target: str = "cpu") -> Callable:
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

    def check(self, pattern: dict, source: str, target: str = "cpu") -> Tuple[str, str]:
        """("ok" | "missing" | "invalid" | "busy", reason) for the entry on disk; changes
        nothing. "busy": another process held the kernel's lock past the lock timeout;
        under fallback get() then compiles it in memory, under strict this raises
        CacheLockTimeout."""
        access = self._prepare_dir()
        if access is None:
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
            raise CacheDirError(f"kernel cache directory {self.directory!r} is read-only; "
                                f"it cannot be cleared")
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
    def _prepare_dir(self) -> Optional[_Access]:
        """Settle once how the directory may be used: its _Access, or None when the disk
        is bypassed (fallback; an untrusted or unwritable directory, or key file)."""
        if self._access is None and self._bypassed is None:
            try:
                self._access = self._settle_access()
            except CacheDirError as e:
                if self.policy == "strict":
                    log.info("%s", e, extra={"catbp_jit": {  # raised: said by the caller
                        "outcome": "refused", "reason": str(e), "directory": self.directory,
                        "policy": self.policy}})
                    raise
                self._bypass(e)
        return self._access

    def _bypass(self, e: CacheDirError) -> None:
        """Under fallback: use no disk from now on, and say so once (one warning)."""
        self._access, self._bypassed = None, str(e)
        log.warning("%s; kernel cache bypassed, kernels are compiled in memory", e,
                    extra={"catbp_jit": {"outcome": "bypassed", "reason": str(e),
                                         "directory": self.directory, "policy": self.policy}})

    def _settle_access(self) -> _Access:
        kernels = os.path.join(self.directory, "kernels")
        locks = os.path.join(self.directory, "locks")
        dirs = (self.directory, kernels, os.path.join(kernels, "__pycache__"), locks)
        error: Optional[str] = None  # why nothing can be written there
        for d in dirs:
            blocker = _not_a_directory(d)
            if blocker is not None:  # makedirs would say only "File exists"
                error = f"{blocker} is not a directory"
                break
        try:
            for d in dirs:
                os.makedirs(d, 0o700, exist_ok=True)
        except OSError as e:
            error = error or str(e)
        for d in dirs:
            try:
                st = os.stat(d)
            except OSError:
                continue  # not there (makedirs failed): nothing in it to trust
            problem = _ownership_problem(d, st, not self.trust_owner)
            if problem:
                raise CacheTrustError(
                    f"kernel cache directory refused: {problem}; its files are pickles, "
                    f"which run code when loaded (chmod go-w it, or set "
                    f"CATBP_JIT_CACHE_DIR to a directory of your own)")
        for d in dirs[1:]:
            if error is None:
                failed = self._write_check(d)
                error = None if failed is None else str(failed)
        warm = all(os.path.isdir(d) for d in dirs[1:3])
        if error is not None and not (self.policy == "strict" and warm):
            raise self._unwritable(error)
        if error is None and stat.S_IMODE(os.stat(locks).st_mode) & 0o077:
            with contextlib.suppress(OSError):  # only we may open (and so hold) a lock
                os.chmod(locks, 0o700)
        secret = load_secret_key(key_file_path(), self.directory)
        return _Access(secret, check_owner=not self.trust_owner, read_only=error is not None,
                       lock_timeout=self.lock_timeout)

    def _unwritable(self, why: str) -> CacheDirError:
        return CacheDirError(f"kernel cache directory {self.directory!r} is not writable "
                             f"({why}); set CATBP_JIT_CACHE_DIR to a writable directory")

    def _get_from_disk(self, key, pattern, source, entry_name, signatures, target):
        access = self._prepare_dir()
        if access is None:
            return self._get_in_memory(key, pattern, source, entry_name, signatures, target,
                                       "disk cache bypassed: compiled in memory")
        held = self._busy.pop(key, None)  # check() has waited for this lock already
        if held is None:
            try:
                return self._get_locked(_Entry(self.directory, key, access), key, pattern,
                                        source, entry_name, signatures, target)
            except OSError as e:  # the disk failed mid-entry: full, gone read-only...
                if self.policy == "strict":
                    raise self._unwritable(str(e)) from e
                self._bypass(self._unwritable(str(e)))  # and every later kernel too
                return self._get_in_memory(key, pattern, source, entry_name, signatures,
                                           target, "disk cache bypassed: compiled in memory")
            except CacheLockTimeout as e:
                if self.policy == "strict":
                    self._emit("refused", None, str(e), None, key=key, pattern=pattern,
                               target=target)  # raised: a warning would say it twice
                    raise
                held = str(e)
        # Never touch an entry another process may be writing: compile privately.
        self._emit("bypassed", None, f"{held}; compiled in memory instead", None,
                   logging.WARNING, key=key, pattern=pattern, target=target)
        return self._get_in_memory(key, pattern, source, entry_name, signatures, target,
                                   "kernel lock not acquired; compiled in memory")

    def _get_locked(self, entry, key, pattern, source, entry_name, signatures, target):
        started = time.perf_counter()
        # Lock order: Numba's compiler lock, then the kernel lock. The load/save hooks
        # run inside Numba's lock and take the kernel lock; the reverse order here could
        # deadlock two threads.
        with global_compiler_lock, entry.lock:
            status, reason, data = entry.check(source)
            if status != "ok":
                if self.policy == "strict":
                    self._emit("refused", None, reason, None, key=key, pattern=pattern,
                               target=target)
                    raise CacheMissError(
                        f"kernel {_describe(pattern)} (key {key}): {reason} in "
                        f"{self.directory!r}; policy 'strict' forbids compiling")
                if status == "invalid":
                    # Never executed: the damaged entry is deleted and rebuilt below.
                    entry.purge()
                    self._count("rebuilt")
            try:
                loaded = self._write_and_load(entry, status, key, pattern, target, source,
                                              data, entry_name, signatures)
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

    def _write_and_load(self, entry, status, key, pattern, target, source, data,
                        entry_name, signatures) -> _Loaded:
        """Write the entry unless it is there ("ok"), load it, compile `signatures` into it
        (kernel lock held)."""
        if status != "ok":
            entry.purge_numba_files()  # stale leftovers of a crashed writer
            data = entry.write_source(source)
            entry.record(format=MANIFEST_FORMAT, key=key, pattern=pattern,
                         target=target, environment=environment_identity(),
                         codegen_version=CODEGEN_VERSION,
                         source_sha256=_sha256(source.encode("utf-8")),
                         created=time.time(), pid=os.getpid())
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
    def _get_in_memory(self, key, pattern, source, entry_name, signatures, target,
                       why: str = "policy 'off': compiled in memory"):
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

    def _emit(self, outcome: str, loaded: Optional[_Loaded], reason: str,
              seconds: Optional[float], level: int = logging.INFO, *, key=None,
              pattern=None, target=None) -> None:
        """One telemetry record: readable message, structured fields in extra."""
        if loaded is not None:
            key, pattern, target = loaded.key, loaded.pattern, loaded.target
        record = {
            "kernel": pattern, "key": key, "target": target,
            "environment": environment_identity(), "policy": self.policy,
            "outcome": outcome, "reason": reason, "compile_seconds": seconds,
            "directory": None if self.policy == "off" else self.directory,
        }
        took = "" if seconds is None else f" in {seconds:.3f}s"
        log.log(level, "kernel cache %s: %s key %s (%s, policy %s)%s: %s", outcome,
                _describe(pattern), key[:16], target, self.policy, took, reason,
                extra={"catbp_jit": record})


_default: Optional[KernelCache] = None


def default_cache() -> KernelCache:
    """The process-wide cache configured from the environment (created on first use)."""
    global _default
    if _default is None:
        _default = KernelCache()
    return _default


@contextlib.contextmanager
def fresh_default_cache():
    """Inside the block ``default_cache()`` is built anew from the environment (as in a
    new process); the previous one is back afterwards. For tests that change the env."""
    global _default
    saved, _default = _default, None
    try:
        yield
    finally:
        _default = saved
