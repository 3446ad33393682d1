"""Atomic int64 operations on an array's elements, for the dispatcher and its pool threads.

The pool (catbp_jit/pool.py) and the compiled dispatcher (codegen/dispatch.py) share one
int64 array, the pool's control block, from several threads at once. Numba has no atomics
for CPU arrays, so these are LLVM's, one instruction each: loads that acquire and stores
that release (a thread that sees a job's number also sees the job's fields written before
it), and a fetch-add and a compare-exchange that are sequentially consistent (no load or
store moves across them, in the compiler or the processor).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from .intrinsics import IS_X86

_ALIGN = 8


def _element(context, builder, signature, args):
    """A pointer to arr[i] (args 0 and 1)."""
    data = context.make_array(signature.args[0])(context, builder, args[0]).data
    return builder.gep(data, [args[1]])


def _int64_array(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.int64


@intrinsic
def atomic_load(typingctx, arr, i):
    """arr[i], read with acquire ordering."""
    if not _int64_array(arr):
        return None
    sig = types.int64(arr, types.int64)

    def codegen(context, builder, signature, args):
        return builder.load_atomic(_element(context, builder, signature, args), "acquire", _ALIGN)

    return sig, codegen


@intrinsic
def atomic_store(typingctx, arr, i, value):
    """arr[i] = value, written with release ordering."""
    if not _int64_array(arr):
        return None
    sig = types.void(arr, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _element(context, builder, signature, args), "release", _ALIGN)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def atomic_add(typingctx, arr, i, value):
    """arr[i] += value at once; returns arr[i] as it was before."""
    if not _int64_array(arr):
        return None
    sig = types.int64(arr, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        return builder.atomic_rmw("add", _element(context, builder, signature, args), args[2], "seq_cst")

    return sig, codegen


@intrinsic
def atomic_cas(typingctx, arr, i, expected, value):
    """If arr[i] == expected, arr[i] = value, at once; returns whether it did."""
    if not _int64_array(arr):
        return None
    sig = types.boolean(arr, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        at = _element(context, builder, signature, args)
        pair = builder.cmpxchg(at, args[2], args[3], "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)

    return sig, codegen


@intrinsic
def spin_pause(typingctx):
    """A hint that this thread is spinning on a value another thread will change (x86's
    pause: the core lets its sibling run, and leaves the loop without a memory-order
    flush; nothing elsewhere)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if IS_X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(builder.module.declare_intrinsic("llvm.x86.sse2.pause", fnty=fnty), [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def call_sleep(typingctx, address, microseconds):
    """Call the C function `int f(unsigned int)` at `address` (libc's usleep, pool.py) with
    `microseconds`: a pool thread's nap between looks at the control block."""
    sig = types.void(types.int64, types.int64)

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i32])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [builder.trunc(args[1], i32)])
        return context.get_dummy_value()

    return sig, codegen
