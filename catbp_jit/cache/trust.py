"""Whom the cache trusts, and how this process may use a cache directory.

Numba's cache files are pickles: whoever can write them can run code in every process
that loads them. So a directory or file must be this user's and writable by nobody else
(``_ownership_problem``), and manifests are signed with a per-user key kept outside the
cache (``load_secret_key``). ``settle_access`` checks a directory once and returns its
``_Access``: the key, whether others' files are accepted, whether it is read-only.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from .. import environment
from .errors import CacheDirError, CacheTrustError


def key_file_path() -> str:
    """$CATBP_JIT_KEY_FILE, else the user's config directory: outside the cache, so that
    whoever can write the cache cannot also sign its manifests."""
    env = environment.key_file()
    if env:
        return env
    xdg = os.environ.get("XDG_CONFIG_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "catbp_jit", "cache.key")


def _euid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None  # None: no POSIX owners


def _ownership_problem(path: str, st: os.stat_result, check_owner: bool) -> str | None:
    """Why someone other than this user could have written `path`, or None."""
    euid = _euid()
    if euid is None:  # pragma: no cover - Windows: ACLs, not mode bits
        return None
    if check_owner and st.st_uid != euid:
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {euid})"
    if st.st_mode & 0o022:
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _file_problem(path: str, check_owner: bool) -> str | None:
    """Why an entry file must not be read, or None (also None when it does not exist)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    return _ownership_problem(path, st, check_owner)


def _write_error(directory: str) -> OSError | None:
    """Why no file can be created in `directory` (tried, not guessed from mode bits:
    ACLs, read-only mounts), or None."""
    try:
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as e:
        return e
    return None


def _not_a_directory(path: str) -> str | None:
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
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def load_secret_key(path: str, cache_dir: str) -> bytes:
    """The per-user key that signs manifests, created (32 random bytes, mode 0600) on
    first use. Raises CacheTrustError for a key others could read or write."""
    real, root = os.path.realpath(path), os.path.realpath(cache_dir)
    if os.path.commonpath([real, root]) == root:
        raise CacheTrustError(
            f"cache key file {path} lies inside the cache directory "
            f"{cache_dir}; set CATBP_JIT_KEY_FILE to a path outside it"
        )
    try:
        if not os.path.exists(path):
            _create_key_file(path)
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            key = f.read()
    except OSError as e:
        raise CacheTrustError(
            f"cache key file {path} cannot be created or read ({e}); set "
            f"CATBP_JIT_KEY_FILE to a file of your own"
        ) from e
    problem = _ownership_problem(path, st, check_owner=True)
    if problem is None and _euid() is not None and st.st_mode & 0o077:
        problem = f"{path} is readable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    if problem is None and len(key) < 32:
        problem = f"{path} holds {len(key)} bytes, fewer than 32"
    if problem:
        raise CacheTrustError(
            f"cache key file refused: {problem}; anyone who can read it "
            f"can forge cache entries (chmod 600 it, or delete it to make "
            f"a new one)"
        )
    return key


@dataclass(frozen=True)
class _Access:
    """How this process may use one cache directory, settled once by KernelCache."""

    secret: bytes  # signs manifests
    check_owner: bool  # False: CATBP_JIT_TRUSTED_CACHE=1, another user's files accepted
    read_only: bool  # strict on a read-only warm cache: no locks, nothing written
    lock_timeout: float


def settle_access(
    directory: str,
    policy: str,
    trust_owner: bool,
    lock_timeout: float,
    write_check: Callable[[str], OSError | None],
) -> _Access:
    """How `directory` may be used: its directories made (0700) and checked, the key
    loaded. Raises CacheTrustError for a directory others could write, CacheDirError
    for one that cannot be written (unless strict finds it warm: then read-only)."""
    kernels = os.path.join(directory, "kernels")
    locks = os.path.join(directory, "locks")
    dirs = (directory, kernels, os.path.join(kernels, "__pycache__"), locks)
    error: str | None = None  # why nothing can be written there
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
        problem = _ownership_problem(d, st, not trust_owner)
        if problem:
            raise CacheTrustError(
                f"kernel cache directory refused: {problem}; its files are pickles, "
                f"which run code when loaded (chmod go-w it, or set "
                f"CATBP_JIT_CACHE_DIR to a directory of your own)"
            )
    for d in dirs[1:]:
        if error is None:
            failed = write_check(d)
            error = None if failed is None else str(failed)
    warm = all(os.path.isdir(d) for d in dirs[1:3])
    if error is not None and not (policy == "strict" and warm):
        raise unwritable(directory, error)
    if error is None and stat.S_IMODE(os.stat(locks).st_mode) & 0o077:
        with contextlib.suppress(OSError):  # only we may open (and so hold) a lock
            os.chmod(locks, 0o700)
    secret = load_secret_key(key_file_path(), directory)
    return _Access(
        secret, check_owner=not trust_owner, read_only=error is not None, lock_timeout=lock_timeout
    )


def unwritable(directory: str, why: str) -> CacheDirError:
    """The error for a cache directory nothing can be written to, saying why."""
    return CacheDirError(
        f"kernel cache directory {directory!r} is not writable "
        f"({why}); set CATBP_JIT_CACHE_DIR to a writable directory"
    )
