"""Numba's cache classes, subclassed so that a kernel's compiled code lives beside its
verified source, is read only under the kernel's lock, and is unpickled only from bytes
whose hashes the verified manifest records.

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
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import sys
import uuid
from typing import TYPE_CHECKING

from numba.core.caching import CompileResultCacheImpl, FunctionCache, IndexDataCacheFile, InTreeCacheLocator

from .entry import _Entry, _sha256, _unlink
from .errors import CacheCorruptionError

if TYPE_CHECKING:
    from .loaded import _Loaded


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
        self._filename_base = self.get_filename_base(f"{modname}.{qualname}", getattr(sys, "abiflags", ""))


class _VerifiedCacheFile(IndexDataCacheFile):
    """Numba's index and data files, unpickled only from bytes whose sha256 the verified
    manifest records: the check and the read are one read, so a file swapped after the
    check is never unpickled. Written 0600, whatever the umask."""

    expected: dict[str, str] = {}  # file name -> sha256, set under the kernel lock

    def _verified_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            data = f.read()
        name = os.path.basename(path)
        if self.expected.get(name) != _sha256(data):
            raise CacheCorruptionError(f"Numba cache file {name} does not match the sha256 in its manifest")
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
    owner: _Loaded
    _cache_file: _VerifiedCacheFile  # (made in __init__)

    def __init__(self, py_func):
        super().__init__(py_func)
        self._cache_file = _VerifiedCacheFile(
            self._cache_path, self._impl.filename_base, self._cache_file._source_stamp
        )

    @property
    def _entry(self) -> _Entry:
        """The kernel's files (a _PinnedCache is made for kernels loaded from disk only)."""
        entry = self.owner.entry
        assert entry is not None
        return entry

    def _expect(self) -> str | None:
        """Arm the hash checks from the verified manifest (lock held); None, or why not."""
        entry = self._entry
        m, why = entry.read_manifest()
        reason = why if m is None else entry.verify_numba_files(m)
        # (m is None only with a reason: `m is not None` below narrows, and changes nothing)
        self._cache_file.expected = dict(m["numba_files"]) if m is not None and not reason else {}
        on_verified = self.owner.cache.on_verified
        if m is not None and reason is None and on_verified is not None:
            on_verified([os.path.join(entry.pycache, name) for name in sorted(m["numba_files"])])
        return reason

    def load_overload(self, sig, target_context):
        owner = self.owner
        with self._entry.lock:
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
        with self._entry.lock:
            reason = self._expect()
            if reason is not None:  # Numba reads the index to extend it: never unverified
                owner.corrupt(reason)
            super().save_overload(sig, data)
            self._entry.record()
        owner.saved(sig)
