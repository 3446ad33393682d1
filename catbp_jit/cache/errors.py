"""The kernel cache's exceptions."""

from __future__ import annotations

from ..errors import CatbpError


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
