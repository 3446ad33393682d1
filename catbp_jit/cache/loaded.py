"""A kernel module once loaded (from disk or memory) in this process: its functions, the
bookkeeping the Numba hooks report to, and compiling signatures into it."""

from __future__ import annotations

import importlib.util
import logging
import sys
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from numba.core import sigutils
from numba.core.registry import CPUDispatcher

from .entry import _Entry
from .errors import CacheMissError
from .key import _canonical_json

if TYPE_CHECKING:
    from .kernel_cache import KernelCache

_PACKAGE = "catbp_jit_kernels"  # parent of the kernel modules in sys.modules


class _Loaded:
    """A kernel module loaded from disk (or memory), with its per-process bookkeeping."""

    def __init__(
        self,
        cache: KernelCache,
        key: str,
        pattern: dict,
        target: str,
        source: str,
        module: types.ModuleType,
        entry: _Entry | None,
    ):
        self.cache, self.key, self.pattern, self.target = cache, key, pattern, target
        self.source, self.module, self.entry = source, module, entry
        self.in_get = False
        self.get_misses = 0
        self._miss_started: float | None = None

    def function(self, name: str) -> Callable:
        fn = getattr(self.module, name, None)
        if fn is None:
            raise AttributeError(f"kernel {self.key[:12]}: source defines no {name!r}")
        return fn

    def dispatchers(self) -> list[Any]:
        return [
            v
            for v in vars(self.module).values()
            if isinstance(v, CPUDispatcher) and getattr(v.py_func, "__module__", None) == self.module.__name__
        ]

    # -- called from _PinnedCache with the kernel lock held
    def corrupt(self, reason: str) -> None:
        assert self.entry is not None  # (Numba's hooks are pinned to kernels on disk only)
        self.entry.purge_numba_files()
        self.entry.record()  # now records no Numba files
        self.cache._count("rebuilt")
        self.cache._emit("rebuilt", self, reason, None, level=logging.WARNING)

    def load_miss(self, sig, reason: str | None) -> None:
        why = reason or f"no cached code for signature {sig}"
        if self.cache.policy == "strict":
            self.cache._emit("refused", self, why, None)  # raised: a warning says it twice
            raise CacheMissError(
                f"kernel {_describe(self.pattern)} (key {self.key}): {why}; policy 'strict' forbids compiling"
            )
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
    fields = ", ".join(
        f"{k}={v}" for k, v in pattern.items() if k not in ("template", "source_sha256", "kernels")
    )
    return f"{pattern['template']!r} ({fields})" if fields else repr(pattern["template"])


def _new_module(name: str, path: str | None) -> types.ModuleType:
    """An empty module registered in sys.modules (Numba re-imports it by name when it
    unpickles cached code, see numba.core.environment._rebuild_env)."""
    if _PACKAGE not in sys.modules:
        pkg = types.ModuleType(_PACKAGE)
        pkg.__path__ = []  # a namespace-like parent so "catbp_jit_kernels.k_..." resolves
        sys.modules[_PACKAGE] = pkg
    if path is not None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None  # (a .py path always has a loader)
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
