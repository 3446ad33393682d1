"""The CPU kernels' machine code: the few bytes a kernel clears or copies per call or row
(its leaves' offsets, an odometer's counters, a row's lines of sums, its stack buffers)
are stores, not calls of the C library's memset or memcpy. LLVM turns a loop storing
zeros, or copying an array, into such a call, and Numba clears every stack buffer when a
function starts (4 KB for a BUFFER of float64): on a step of a few elements the calls
cost more than the work (codegen/intrinsics.py: opaque, stack buffers)."""

from __future__ import annotations

import re
import types as pytypes
from pathlib import Path

import pytest
from numba import types

import catbp_jit
from catbp_jit.bundle import load_bundle
from catbp_jit.codegen.loader import kernel_unit

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "grid3_d2__prob_float64"


def machine_code(pattern) -> str:
    """The kernel's assembly, compiled here from its source without the disk cache (Numba
    shows no assembly of cached code)."""
    source = kernel_unit(pattern).source.replace("cache=True", "cache=False")
    module = pytypes.ModuleType(f"kernel_{pattern.name}")
    exec(compile(source, f"<{pattern.name}>", "exec"), module.__dict__)
    module.kernel.compile((types.int64,) * 7)
    return module.kernel.inspect_asm(module.kernel.signatures[0])


def patterns() -> dict:
    """The example's kernels in the reassociating mode (products and sums in lines, a sum
    across reduced axes, in lanes, a repack). The two sums are checked (each compile costs ~5 s):
    they made the calls."""
    b = load_bundle(EXAMPLE)
    specs = {"factor_specs": b.factor_specs(), "selector_specs": b.selector_specs()}
    plan = catbp_jit.executable.plan(b.programs, b.semiring_runtime(), **specs, exact=False)
    return {p.name: p for p in plan.schedule.patterns}


@pytest.mark.slow  # (~5 s each, compiling a kernel without the cache: the default suite's budget)
@pytest.mark.parametrize(
    "name, calls",
    [
        ("contract_lines_prob_float64_reduce", ("memset", "memcpy", "memmove")),
        # (its first leaf's piece copied into the buffer, up to BUFFER elements, is a memcpy
        # where that leaf is contiguous: a real copy, left to the C library)
        ("contract_reduce_prob_float64_reduce_laneterms", ("memset",)),
    ],
)
def test_kernels_clear_and_copy_their_few_bytes_without_calls(name, calls):
    asm = machine_code(patterns()[name])
    called = set(re.findall(r"\b(memset|memcpy|memmove)\b", asm))
    assert not called & set(calls), f"{name} calls {sorted(called)}"
