"""Kernels by pattern: generated, compiled (or fetched from the disk cache), addressed.

Every module compiled here (a kernel, the dispatcher) is first described as a
`CompileUnit`: plain data (name, cache identity, source, entry, signature) that a worker
process can compile into the shared disk cache as well as this process can.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from numba.core import sigutils

from ..cache import KernelCache
from ..plan.steps import KernelPattern
from . import cpu, cpu_gemm, cpu_lines, cpu_repack, dispatch

# Every entry takes int64s (addresses, lengths, an offset): no array, so no MemInfo per
# call, and one C calling convention for the dispatcher to call kernels through.
KERNEL_SIGNATURE = "(int64, int64, int64, int64, int64, int64, int64)"
DISPATCHER_SIGNATURE = "(int64, int64, int64, int64, int64, int64, int64, int64, int64, int64, int64, int64)"


@dataclass(frozen=True)
class CompileUnit:
    name: str  # readable: the kernel's pattern name, or "dispatcher"
    identity: dict[str, Any]  # what the cache keys it by: the pattern plus the source's digest
    source: str
    entry: str  # the function the caller needs compiled
    signature: str


@dataclass
class Kernel:
    pattern: KernelPattern
    key: str
    source: str
    entry: Any  # njit dispatcher: entry(mem_addr, mem_len, P_addr, P_len, p, chunk, chunks)
    address: int  # C entry point of its compiled code (the compiled-mode dispatcher calls it)
    identity: dict[str, Any]  # its unit's, independent of the machine (identity_digest)


def _identity(fields: dict[str, Any], source: str) -> dict[str, Any]:
    return dict(fields, source_sha256=hashlib.sha256(source.encode()).hexdigest())


def cuda_kernel_unit(pattern: KernelPattern) -> CompileUnit:
    """The CUDA target's kernel of a pattern (the CPU's: kernel_unit)."""
    from . import cuda

    pattern = replace(pattern, parallel=False)  # a CPU notion: one GPU kernel for both
    source = cuda.kernel_source(pattern)
    return CompileUnit(
        pattern.name, _identity(dict(pattern.as_dict(), target="cuda"), source), source, cuda.ENTRY, ""
    )


def cuda_schedule_unit(
    patterns: Sequence[KernelPattern], shapes: Sequence[Sequence[tuple[int, int, int]]]
) -> CompileUnit:
    """The CUDA target's schedule kernel of a kernel set (codegen/cuda_schedule.py), its
    device functions specialized on each kernel id's step shapes (schedule_shapes); its
    identity: the patterns by kernel id, the shapes and the source's digest."""
    from . import cuda_schedule

    patterns = [replace(p, parallel=False) for p in patterns]
    source = cuda_schedule.schedule_source(patterns, shapes)
    fields: dict[str, Any] = {
        "template": "cuda_schedule",
        "target": "cuda",
        "kernels": [p.name for p in patterns],
    }
    if shapes is not None:
        fields["shapes"] = [[list(shape) for shape in per_kernel] for per_kernel in shapes]
    return CompileUnit("schedule", _identity(fields, source), source, cuda_schedule.ENTRY, "")


def cuda_gather_unit(dtype: str) -> CompileUnit:
    """The CUDA target's gather kernel for an arena of `dtype` (codegen/cuda_gather.py)."""
    from . import cuda_gather

    source = cuda_gather.gather_source(dtype)
    fields = {"template": "cuda_gather", "target": "cuda", "dtype": dtype}
    return CompileUnit("gather", _identity(fields, source), source, cuda_gather.ENTRY, "")


def kernel_unit(pattern: KernelPattern) -> CompileUnit:
    """The CPU target's kernel of a pattern (the CUDA target's: cuda_kernel_unit)."""
    source = cpu_source(pattern)
    return CompileUnit(
        pattern.name, _identity(pattern.as_dict(), source), source, cpu.ENTRY, KERNEL_SIGNATURE
    )


def cpu_source(pattern: KernelPattern) -> str:
    """The CPU module of a pattern, by its template (every template's entry is `kernel`)."""
    if pattern.template == "gemm":
        return cpu_gemm.kernel_source(pattern)
    if pattern.template == "repack":
        return cpu_repack.kernel_source(pattern)
    if pattern.template == "contract_lines":
        return cpu_lines.kernel_source(pattern)
    return cpu.kernel_source(pattern)


def identity_digest(identity: dict[str, Any]) -> str:
    """What a kernel computes and how it is written (a unit's identity: its pattern and its
    source's digest), independent of the machine: what a saved executable records to be
    checked on load."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def dispatcher_unit() -> CompileUnit:
    source = dispatch.dispatcher_source()
    return CompileUnit(
        "dispatcher",
        _identity({"template": "dispatch"}, source),
        source,
        dispatch.ENTRY,
        DISPATCHER_SIGNATURE,
    )


def load_unit(unit: CompileUnit, cache: KernelCache) -> Any:
    """The compiled entry of `unit`, from the disk cache when it is there."""
    return cache.get(unit.identity, unit.source, unit.entry, signatures=[unit.signature])


def entry_address(fn: Any, signature: str) -> int:
    """The C entry point of fn's compiled code for `signature` (Numba's cfunc wrapper)."""
    args, _ = sigutils.normalize_signature(signature)
    cres = fn.overloads[tuple(args)]
    address = cres.library.get_pointer_to_function(cres.fndesc.llvm_cfunc_wrapper_name)
    if not address:
        raise RuntimeError(f"compiled code of {fn.__name__}{signature} has no C entry point")
    return address


def load_kernel(pattern: KernelPattern, cache: KernelCache, unit: CompileUnit | None = None) -> Kernel:
    """The CPU kernel of a pattern; `unit`: its kernel_unit when the caller rendered it."""
    unit = unit or kernel_unit(pattern)
    fn = load_unit(unit, cache)
    address = entry_address(fn, unit.signature)
    return Kernel(pattern, cache.key_for(unit.identity), unit.source, fn, address, unit.identity)


def load_dispatcher(cache: KernelCache, unit: CompileUnit | None = None):
    unit = unit or dispatcher_unit()
    return load_unit(unit, cache), unit.source


def scratch_compile(source: str) -> str:
    """Compile a CPU kernel module's source uncached, in a module of its own, and return
    the assembly of its entry (with everything LLVM inlined into it)."""
    import importlib.util
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="catbp_jit_asm_") as tmp:
        name = f"catbp_jit_asm_{hashlib.sha256(source.encode()).hexdigest()[:16]}"
        path = Path(tmp) / f"{name}.py"
        path.write_text(source.replace("cache=True", "cache=False"))
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None  # (a .py path always has a loader)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
            fn = getattr(module, cpu.ENTRY)
            args, _ = sigutils.normalize_signature(KERNEL_SIGNATURE)
            fn.compile(tuple(args))
            return fn.inspect_asm(tuple(args))
        finally:
            del sys.modules[name]
