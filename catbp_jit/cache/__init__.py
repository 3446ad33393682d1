"""On-disk kernel cache: generated Numba source in, compiled dispatcher out (see
kernel_cache.py). This package's public surface, for ``from catbp_jit.cache import ...``."""

from .kernel_cache import (CODEGEN_VERSION, DEFAULT_LOCK_TIMEOUT, MANIFEST_FORMAT, POLICIES,
                           CacheCorruptionError, CacheDirError, CacheLockTimeout,
                           CacheMissError, CacheTrustError, KernelCache, atomic_write,
                           default_cache, default_cache_dir, environment_identity,
                           fresh_default_cache, kernel_key, key_file_path, load_secret_key)

__all__ = ["CODEGEN_VERSION", "DEFAULT_LOCK_TIMEOUT", "MANIFEST_FORMAT", "POLICIES",
           "CacheCorruptionError", "CacheDirError", "CacheLockTimeout", "CacheMissError",
           "CacheTrustError", "KernelCache", "atomic_write", "default_cache",
           "default_cache_dir", "environment_identity", "fresh_default_cache", "kernel_key",
           "key_file_path", "load_secret_key"]
