"""The C library's exp and log for the CPU kernels, called by their default symbols.

Numba binds `math.exp` and `math.log` to the addresses its helper library was linked
against. A manylinux wheel is linked against an old glibc's symbols, so on a newer glibc
those are the compatibility versions (`exp@GLIBC_2.2.5`: a wrapper that checks the result
for range errors to set errno, then the same implementation as the default `exp`). The
kernels never read errno: by the default symbols a call costs less (measured on x86-64,
glibc 2.36: 3.1 against 4.3 ns an exp; perf put the wrapper at 15% of a LOGPROB grid's
run) and gives the same bits (tests/test_libm.py). On a C library with one version of
each, the default symbol is that one. Where the library cannot be found by name, Numba's
own addresses stand in, so the kernels then call what `math.exp` would.

`exp(x)` and `log(x)` take a float64 (the C library's exp, log) or a float32 (expf,
logf), as Numba's math functions do. The kernels import this module: it registers the
symbols with LLVM before a kernel is compiled or loaded from a cache.

What these call changes compiled kernels without changing their source: bump
cache.key.CODEGEN_VERSION with any change here.
"""

from __future__ import annotations

import ctypes
import ctypes.util

import llvmlite.binding as ll
from llvmlite import ir
from numba import _helperlib, types
from numba.core import cgutils
from numba.extending import intrinsic

# the kernels' names for them, and the C functions they are by dtype
FUNCTIONS = {
    "catbp_jit_exp": "exp",
    "catbp_jit_expf": "expf",
    "catbp_jit_log": "log",
    "catbp_jit_logf": "logf",
}


def c_library() -> ctypes.CDLL | None:
    """The C math library, by name (None where it has none of its own, or is not found)."""
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def addresses(lib: ctypes.CDLL | None) -> dict[str, int]:
    """Each kernel-side name's address: lib's default symbol, else Numba's."""
    found = {}
    for name, c_name in FUNCTIONS.items():
        function = getattr(lib, c_name, None) if lib is not None else None
        address = ctypes.cast(function, ctypes.c_void_p).value if function is not None else None
        found[name] = address or _helperlib.c_helpers[c_name]  # type: ignore[attr-defined]
    return found


for _name, _address in addresses(c_library()).items():
    ll.add_symbol(_name, _address)


def _unary(name64: str, name32: str):
    @intrinsic
    def call(typingctx, x):
        if x not in (types.float64, types.float32):
            return None
        name = name64 if x == types.float64 else name32

        def codegen(context, builder, signature, args):
            value = context.get_value_type(x)
            function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(value, [value]), name)
            # (a pure function of its argument, as Numba's own math calls are declared:
            # LLVM may then keep values in registers across the call)
            function.attributes.add("nounwind")
            function.attributes.add("readnone")
            return builder.call(function, args)

        return x(x), codegen

    return call


exp = _unary("catbp_jit_exp", "catbp_jit_expf")
log = _unary("catbp_jit_log", "catbp_jit_logf")
