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

The modules, each importing only those above it:

    errors.py        the exceptions
    key.py           kernel_key, environment_identity, CODEGEN_VERSION, default_cache_dir
    trust.py         ownership and mode checks, the signing key file, settle_access
    locks.py         per-kernel file locks (_FileLock, _EntryLock), DEFAULT_LOCK_TIMEOUT
    entry.py         one kernel's files: source, signed manifest, Numba's files (_Entry)
    numba_cache.py   Numba's cache classes, pinned, locked and hash-checked
    loaded.py        a kernel module loaded in this process (_Loaded)
    kernel_cache.py  KernelCache and its policies; default_cache, fresh_default_cache

This package must not import the planner or code generator (they import it).
"""

from ..atomic import atomic_write
from .entry import MANIFEST_FORMAT
from .errors import CacheCorruptionError, CacheDirError, CacheLockTimeout, CacheMissError, CacheTrustError
from .kernel_cache import POLICIES, KernelCache, default_cache, fresh_default_cache
from .key import CODEGEN_VERSION, default_cache_dir, environment_identity, kernel_key
from .locks import DEFAULT_LOCK_TIMEOUT
from .trust import key_file_path, load_secret_key

__all__ = [
    "CODEGEN_VERSION",
    "DEFAULT_LOCK_TIMEOUT",
    "MANIFEST_FORMAT",
    "POLICIES",
    "CacheCorruptionError",
    "CacheDirError",
    "CacheLockTimeout",
    "CacheMissError",
    "CacheTrustError",
    "KernelCache",
    "atomic_write",
    "default_cache",
    "default_cache_dir",
    "environment_identity",
    "fresh_default_cache",
    "kernel_key",
    "key_file_path",
    "load_secret_key",
]
