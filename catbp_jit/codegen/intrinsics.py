"""Addresses as arrays inside Numba, so loop mode can call kernels with plain integers.

Handing a numpy array to a compiled function costs Numba one MemInfo allocation per call;
handing it an address and a length costs nothing. `as_array_<dtype>(address, length)`
views that memory as a 1-d array (no MemInfo, no copy); the caller keeps it alive.

The other LLVM-level pieces kernels use live here too: buffers on the kernel's stack
(no allocation per run) and the streaming stores of a STREAMED output (store_line,
store_part, fence_stores, below).
"""

from __future__ import annotations

import platform
from functools import cache

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import config as numba_config
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
def call_kernel(typingctx, address, mem_address, mem_length, P_address, P_length, p, chunk, chunks):
    """Call the compiled kernel entry whose C entry point is at `address` (its args are seven
    int64, abi.py). The dispatcher calls kernels through addresses rather than by name, so it
    is not linked against them: it compiles once, whatever kernels a schedule uses."""
    sig = types.void(*[types.int64] * 8)

    def codegen(context, builder, signature, args):
        # Numba's C wrapper of a function returning None returns its dummy value type.
        fnty = ir.FunctionType(context.get_value_type(types.none), [ir.IntType(64)] * 7)
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), args[1:])
        return context.get_dummy_value()

    return sig, codegen


def _stack_buffer_intrinsic(nbtype, size=BUFFER):
    @intrinsic
    def stack_buffer(typingctx):
        """A pointer to BUFFER elements on the calling function's stack: a buffer that costs
        no allocation, and that LLVM knows no other pointer reaches, so the loops that
        write it can be vectorized without runtime overlap checks. Not cleared: the
        kernels write what they read (Numba's cgutils.alloca_once zeroes its space where
        the function starts, a memset of 4 KB per float64 buffer on every call)."""
        sig = types.CPointer(nbtype)()

        def codegen(context, builder, signature, args):
            elem = context.get_data_type(nbtype)
            with builder.goto_entry_block():  # (allocated once, wherever it is used)
                space = builder.alloca(ir.ArrayType(elem, size))
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


# -- streaming stores (an output access abi.STREAMED, codegen/cpu.py: store) -------------
#
# A product's output larger than the last-level cache is written and not read again
# before it leaves the cache: a plain store first reads each line from memory (to own
# it), then writes it back, twice the traffic. A non-temporal store writes whole lines
# without reading them (measured on one x86-64 core: 115 MB of products 13 ms with plain
# stores, 5 ms streamed). Such stores are weakly ordered: the writer fences them before
# other threads read (fence_stores).

LINE_BYTES = 64
IS_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


@cache  # (a host query costs a few ms; Numba reads its settings once, at import)
def target_features() -> str:
    """The CPU features kernels are compiled for, as Numba chooses them: its setting
    NUMBA_CPU_FEATURES, else the host's ('' where the host cannot report them)."""
    if numba_config.CPU_FEATURES is not None:  # type: ignore[attr-defined]
        return numba_config.CPU_FEATURES  # type: ignore[attr-defined]
    try:
        return llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # some hosts cannot report features
        return ""


# Whether a line's GATHERED and STRIDED loads are one gather instruction (LLVM's
# llvm.masked.gather) or a scalar load a lane (codegen/lines.py). LLVM emits gather
# instructions for AVX-512, and for AVX2 only on Intel cores it knows to gather fast;
# elsewhere it loads lane by lane with each address computed in vector registers and moved
# out, which is slower than computing them in scalar ones: grid4x8_d2 exact on one AMD Zen 3
# thread 546-574 -> 500-510 us.
HARDWARE_GATHERS = IS_X86 and "+avx512f" in target_features().split(",")


@intrinsic
def line_rest(typingctx, arr, i):
    """Elements from arr[i] to the next LINE_BYTES boundary of the address space (0 if
    arr[i] starts a line)."""
    sig = types.int64(arr, types.int64)

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        at = builder.ptrtoint(builder.gep(data, [args[1]]), ir.IntType(64))
        rest = builder.and_(builder.neg(at), ir.Constant(ir.IntType(64), LINE_BYTES - 1))
        size = context.get_abi_sizeof(context.get_data_type(signature.args[0].dtype))
        return builder.udiv(rest, ir.Constant(ir.IntType(64), size))

    return sig, codegen


def _storable(dst, src) -> bool:
    """Whether src's elements can be stored in dst's by store_line and store_part: the same
    dtype, or float64 sums into a float32 output (rounded as a scalar store would)."""
    return dst.dtype == src.dtype or (dst.dtype == types.float32 and src.dtype == types.float64)


def _lines(context, signature) -> tuple[ir.VectorType, ir.VectorType]:
    """(a line of dst's elements, as many of src's) for store_line and store_part."""
    elem = context.get_data_type(signature.args[0].dtype)
    width = LINE_BYTES // context.get_abi_sizeof(elem)
    return ir.VectorType(elem, width), ir.VectorType(context.get_data_type(signature.args[2].dtype), width)


def _converted(builder, value, line: ir.VectorType):
    return value if value.type == line else builder.fptrunc(value, line)  # (_storable)


@intrinsic
def store_line(typingctx, dst, i, src, j):
    """dst[i : i + W] = src[j : j + W], W elements to a LINE_BYTES line, with one
    non-temporal store (on x86-64; a plain one elsewhere). dst[i] must start a line."""
    if not _storable(dst, src):
        return None
    sig = types.void(dst, types.int64, src, types.int64)

    def codegen(context, builder, signature, args):
        line, source = _lines(context, signature)
        to = context.make_array(signature.args[0])(context, builder, args[0]).data
        of = context.make_array(signature.args[2])(context, builder, args[2]).data
        value = builder.load(builder.bitcast(builder.gep(of, [args[3]]), source.as_pointer()), align=1)
        at = builder.bitcast(builder.gep(to, [args[1]]), line.as_pointer())
        store = builder.store(_converted(builder, value, line), at, align=LINE_BYTES)
        if IS_X86:
            store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
        return context.get_dummy_value()

    return sig, codegen


def _name(vector: ir.VectorType) -> str:
    """A masked load's or store's name suffix for this vector type and a pointer to it."""
    kind = f"v{vector.count}{vector.element.intrinsic_name}"
    return f"{kind}.p0{kind}"


def _declared(module, name, ret, args):
    """The function `name` of the module, declared if it is not yet."""
    fn = module.globals.get(name)
    return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name)


@intrinsic
def store_part(typingctx, dst, i, src, j, count):
    """dst[i : i + count] = src[j : j + count] for count < W (a part of a line), as one
    masked load and store (plain, not non-temporal): no loop for LLVM to vectorize, and
    no element outside those count read or written."""
    if not _storable(dst, src):
        return None
    sig = types.void(dst, types.int64, src, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        line, source = _lines(context, signature)
        width, i32, i64 = line.count, ir.IntType(32), ir.IntType(64)
        # mask: lane k < count
        count = builder.insert_element(ir.VectorType(i64, width)(ir.Undefined), args[4], i64(0))
        count = builder.shuffle_vector(count, count, ir.VectorType(i32, width)([0] * width))
        mask = builder.icmp_signed("<", ir.VectorType(i64, width)(list(range(width))), count)
        to = context.make_array(signature.args[0])(context, builder, args[0]).data
        of = context.make_array(signature.args[2])(context, builder, args[2]).data
        src = builder.bitcast(builder.gep(of, [args[3]]), source.as_pointer())
        dst = builder.bitcast(builder.gep(to, [args[1]]), line.as_pointer())
        # named for typed pointers (llvmlite's IR has them); newer LLVMs rename them
        masks, mod, void = ir.VectorType(ir.IntType(1), width), builder.module, ir.VoidType()
        load = _declared(mod, f"llvm.masked.load.{_name(source)}", source, [src.type, i32, masks, source])
        store = _declared(mod, f"llvm.masked.store.{_name(line)}", void, [line, dst.type, i32, masks])
        value = _converted(builder, builder.call(load, [src, i32(1), mask, source(ir.Undefined)]), line)
        builder.call(store, [value, dst, i32(1), mask])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def fence_stores(typingctx):
    """Order this thread's non-temporal stores before everything it does after (x86-64's
    sfence; nothing elsewhere, where store_line's stores are plain)."""
    sig = types.void()

    def codegen(context, builder, signature, args):
        if IS_X86:
            fnty = ir.FunctionType(ir.VoidType(), [])
            builder.call(builder.module.declare_intrinsic("llvm.x86.sse.sfence", fnty=fnty), [])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch_for_write(typingctx, arr, i):
    """Ask for the cache line of arr[i] in a state to be written (x86-64's prefetchw): a
    hint that never faults, whatever i is, and changes no value."""
    sig = types.void(arr, types.int64)

    def codegen(context, builder, signature, args):
        from numba.core import cgutils

        ary = context.make_array(signature.args[0])(context, builder, args[0])
        at = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [at.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [at, i32(1), i32(3), i32(1)])  # write, keep in all levels, data
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def blas_dot(typingctx, mem, ao, a_t, bo, b_t, oo, M, N, K, alpha):
    """mem[oo:] = alpha · (a · b), an M x N C-order matrix, through BLAS: a at mem[ao:] is
    M x K in C order, or its transpose (K x M) stored when a_t; b at mem[bo:] is K x N, or
    N x K when b_t. (alpha = 1: np.dot's bits; a PROB GEMM step's NORMALIZE passes its
    reciprocal total, codegen/cpu_gemm.py.)

    What Numba's np.dot(a, b, out) does for those layouts, with the layouts known only when
    it runs: the same BLAS functions (Numba's numba_xxgemm, numba_xxgemv and numba_xxdot,
    SciPy's BLAS behind them) with the same arguments, so the same bits. np.dot is typed
    with its operands' layouts: a kernel needed four calls of it, one per pair of layouts,
    ~1 s of its compile (codegen/cpu_gemm.py). Empty products give zeros, a vector on either
    side is a gemv (a dot when both are), as np.dot's are."""
    if not (isinstance(mem, types.Array) and mem.ndim == 1 and mem.dtype in (types.float64, types.float32)):
        return None
    if not all(isinstance(t, types.Integer) for t in (ao, a_t, bo, b_t, oo, M, N, K)):
        return None
    if not isinstance(alpha, types.Float):
        return None
    sig = types.void(mem, ao, a_t, bo, b_t, oo, M, N, K, alpha)

    def codegen(context, builder, signature, args):
        from numba.core import cgutils
        from numba.np.linalg import check_blas_return, ensure_blas

        ensure_blas()  # SciPy's BLAS, which Numba's wrappers call (ImportError without SciPy)
        dtype = signature.args[0].dtype
        array = context.make_array(signature.args[0])(context, builder, args[0])
        ao, a_t, bo, b_t, oo, m, n, k = (
            context.cast(builder, v, t, types.int64) for v, t in zip(args[1:9], signature.args[1:9])
        )
        scale = context.cast(builder, args[9], signature.args[9], dtype)
        i64, char, void_p = ir.IntType(64), ir.IntType(8), ir.IntType(8).as_pointer()

        def at(offset):
            return builder.bitcast(builder.gep(array.data, [offset]), void_p)

        def pick(flag, if_set, otherwise):
            return builder.select(flag, if_set, otherwise)

        def const(value):
            return ir.Constant(i64, value)

        def blas(name, fnargs):
            fnty = ir.FunctionType(ir.IntType(32), [a.type for a in fnargs])
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            check_blas_return(context, builder, builder.call(fn, fnargs))

        kind = ir.Constant(char, ord("d" if dtype == types.float64 else "s"))
        trans, no_trans = ir.Constant(char, ord("t")), ir.Constant(char, ord("n"))
        alpha = builder.bitcast(cgutils.alloca_once_value(builder, scale), void_p)
        beta = builder.bitcast(cgutils.alloca_once_value(builder, context.get_constant(dtype, 0.0)), void_p)

        def gemv(matrix, c_order, rows, cols, vector):
            """out = matrix · vector, a rows x cols matrix in C order (else in F order), as
            Numba's call_xxgemv passes it: BLAS sees a C-order matrix as its transpose."""
            blas(
                "numba_xxgemv",
                [
                    kind,
                    pick(c_order, trans, no_trans),
                    pick(c_order, cols, rows),
                    pick(c_order, rows, cols),
                    alpha,
                    matrix,
                    pick(c_order, cols, rows),
                    vector,
                    beta,
                    at(oo),
                ],
            )

        a_transposed = builder.icmp_signed("!=", a_t, const(0))
        b_transposed = builder.icmp_signed("!=", b_t, const(0))
        empty = builder.or_(
            builder.icmp_signed("==", k, const(0)),
            builder.or_(builder.icmp_signed("==", m, const(0)), builder.icmp_signed("==", n, const(0))),
        )
        with builder.if_else(empty, likely=False) as (no_terms, terms):
            with no_terms:
                size = builder.mul(
                    builder.mul(m, n), const(context.get_abi_sizeof(context.get_value_type(dtype)))
                )
                cgutils.memset(builder, at(oo), size, 0)
            with terms, builder.if_else(builder.icmp_signed("==", n, const(1))) as (column, matrix):
                with column, builder.if_else(builder.icmp_signed("==", m, const(1))) as (vector, rows):
                    with vector:  # (1 x K) · (K x 1), then alpha (x 1: the same bits)
                        blas("numba_xxdot", [kind, ir.Constant(char, 0), k, at(ao), at(bo), at(oo)])
                        out = builder.gep(array.data, [oo])
                        builder.store(builder.fmul(builder.load(out), scale), out)
                    with rows:  # (M x K) · (K x 1)
                        gemv(at(ao), builder.not_(a_transposed), m, k, at(bo))
                with matrix, builder.if_else(builder.icmp_signed("==", m, const(1))) as (row, product):
                    with row:  # (1 x K) · (K x N) = b^T · a: b^T is N x K, in C order when b_t
                        gemv(at(bo), b_transposed, n, k, at(ao))
                    with product:  # out^T = b^T · a^T in BLAS's column-major terms
                        blas(
                            "numba_xxgemm",
                            [
                                kind,
                                pick(b_transposed, trans, no_trans),
                                pick(a_transposed, trans, no_trans),
                                n,
                                m,
                                k,
                                alpha,
                                at(bo),
                                pick(b_transposed, k, n),
                                at(ao),
                                pick(a_transposed, m, k),
                                beta,
                                at(oo),
                                n,
                            ],
                        )
        return context.get_dummy_value()

    return sig, codegen


# -- values LLVM cannot see through ------------------------------------------------------
#
# LLVM turns a loop that stores zeros, or copies an array, into a call of the C library's
# memset or memcpy: for the few bytes a kernel clears or copies per row (a leaf offset per
# leaf, an odometer's counters) the call, its register spills and its vzeroupper cost more
# than the stores (a grid4x8_d2 step of 8 outputs made 2-4 such calls). A value passed
# through `opaque` is not known to LLVM (an empty inline asm: no instruction), so such a
# loop stays a loop of stores. (codegen/lines.py's line_zero hides its zero so too.)


@intrinsic
def opaque(typingctx, x):
    """x (an int64), which LLVM can no longer see is a constant or a load."""
    if x != types.int64:
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        return builder.asm(ir.FunctionType(i64, [i64]), "", "=r,0", [args[0]], side_effect=False)

    return types.int64(types.int64), codegen
