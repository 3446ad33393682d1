"""Kernels by pattern: generated, compiled (or fetched from the disk cache), remembered.

Generated dispatcher modules look kernels up here by key (`loaded(key)`), so a kernel is
always loaded before any dispatcher that calls it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Dict, Sequence

from numba import types

from ..cache import KernelCache
from ..plan.schedule import KernelPattern
from . import cpu, dispatch

_loaded: Dict[str, Any] = {}


def loaded(key: str) -> Any:
    """The compiled `kernel` of an already loaded kernel module (used by dispatchers)."""
    return _loaded[key]


@dataclass
class Kernel:
    pattern: KernelPattern
    key: str
    source: str
    kernel: Any  # njit dispatcher: kernel(mem, P, p)
    kernel_at: Any  # the same kernel taking addresses: kernel_at(mem_addr, mem_len, P_addr, P_len, p)


def numba_dtype(dtype: str):
    return {"float64": types.float64, "float32": types.float32, "bool": types.boolean,
            "int64": types.int64}[dtype]


def kernel_signature(dtype: str):
    return types.void(types.Array(numba_dtype(dtype), 1, "C"),
                      types.Array(types.int64, 1, "C"), types.int64)


def load_kernel(pattern: KernelPattern, cache: KernelCache) -> Kernel:
    source = cpu.kernel_source(pattern)
    ident = dict(pattern.as_dict(), source_sha256=hashlib.sha256(source.encode()).hexdigest())
    fn = cache.get(ident, source, cpu.ENTRY, signatures=[kernel_signature(pattern.dtype)])
    key = cache.key_for(ident)
    cfn = cache.get(ident, source, "kernel_at", signatures=[(types.int64,) * 5])
    _loaded[key] = fn
    return Kernel(pattern, key, source, fn, cfn)


def load_dispatcher(kernels: Sequence[Kernel], dtype: str, cache: KernelCache):
    keys = [k.key for k in kernels]
    source = dispatch.dispatcher_source(keys, [k.pattern.name for k in kernels])
    ident = {"template": "dispatch", "dtype": dtype, "kernels": keys,
             "source_sha256": hashlib.sha256(source.encode()).hexdigest()}
    sig = types.void(types.Array(numba_dtype(dtype), 1, "C"), types.Array(types.int64, 1, "C"),
                     types.int64)
    return cache.get(ident, source, dispatch.ENTRY, signatures=[sig]), source
