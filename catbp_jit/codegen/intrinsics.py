"""Addresses as arrays inside Numba, so loop mode can call kernels with plain integers.

Handing a numpy array to a compiled function costs Numba one MemInfo allocation per call;
handing it an address and a length costs nothing. `as_array_<dtype>(address, length)`
views that memory as a 1-d array (no MemInfo, no copy); the caller keeps it alive.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core.extending import intrinsic

from ..abi import BUFFER, LANES, MAX_LEAVES


def _pointer_intrinsic(nbtype):
    @intrinsic
    def as_pointer(typingctx, address):
        sig = types.CPointer(nbtype)(types.int64)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(nbtype)))

        return sig, codegen

    return as_pointer


pointer_float64 = _pointer_intrinsic(types.float64)
pointer_float32 = _pointer_intrinsic(types.float32)
pointer_int64 = _pointer_intrinsic(types.int64)
pointer_bool = _pointer_intrinsic(types.boolean)


@intrinsic
def call_kernel(typingctx, address, mem_address, mem_length, P_address, P_length, p):
    """Call the compiled kernel entry whose C entry point is at `address` (its args are five
    int64). The dispatcher calls kernels through addresses rather than by name, so it is not
    linked against them: it compiles once, whatever kernels a schedule uses."""
    sig = types.void(types.int64, types.int64, types.int64, types.int64, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        # Numba's C wrapper of a function returning None returns its dummy value type.
        fnty = ir.FunctionType(context.get_value_type(types.none), [ir.IntType(64)] * 5)
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])
        return context.get_dummy_value()

    return sig, codegen


def _stack_buffer_intrinsic(nbtype, size=BUFFER):
    @intrinsic
    def stack_buffer(typingctx):
        """A pointer to BUFFER elements on the calling function's stack: a buffer that costs
        no allocation, and that LLVM knows no other pointer reaches, so the loops that
        write it can be vectorized without runtime overlap checks."""
        sig = types.CPointer(nbtype)()

        def codegen(context, builder, signature, args):
            from numba.core import cgutils

            elem = context.get_data_type(nbtype)
            space = cgutils.alloca_once(builder, ir.ArrayType(elem, size))  # entry block
            return builder.bitcast(space, elem.as_pointer())

        return sig, codegen

    return stack_buffer


stack_buffer_float64 = _stack_buffer_intrinsic(types.float64)
stack_buffer_float32 = _stack_buffer_intrinsic(types.float32)
stack_buffer_int64 = _stack_buffer_intrinsic(types.int64)
stack_buffer_bool = _stack_buffer_intrinsic(types.boolean)

# A CPU kernel's per-leaf offsets: one int64 per leaf, abi.MAX_LEAVES at most. (Small on
# purpose: two more BUFFER-sized arrays cost a step of chain200 ~0.3 us more.)
stack_leaves_int64 = _stack_buffer_intrinsic(types.int64, MAX_LEAVES)
# A lanes kernel's (codegen/cpu.py: _lanes_reduction) leaf offsets at each lane's start.
stack_lanes_int64 = _stack_buffer_intrinsic(types.int64, LANES * MAX_LEAVES)
