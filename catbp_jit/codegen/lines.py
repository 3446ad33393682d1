"""Lines: one cache line of an array's elements as one value that lives in registers.

A product kernel (codegen/cpu_lines.py) computes each whole line of its output here, leaf
after leaf, and writes it with one store (a non-temporal one where the output is
STREAMED: abi.py, codegen/intrinsics.py), never through a buffer in memory: stores to a
buffer, even one in L1, wait behind streaming stores in the core's store queue (measured
on one x86-64 machine, two threads: 115 MB of products written from a stack buffer
7.1 ms, from registers 2.5 ms; the streaming stores alone 2.4 ms).

`Line(dtype)` is a Numba type whose value is an LLVM vector of LINE_BYTES of elements
(8 float64 or int64, 16 float32, 64 bool). Kernels make lines from memory with
line_splat, line_load, line_strided and line_gather (the four access kinds of abi.py;
the last two one gather instruction where the machine has them, intrinsics.
HARDWARE_GATHERS, else a scalar load a lane; there a GATHERED line whose elements lie
within a line's width from its first lane's is one load and a permute; a line of a table
whose step is WINDOWED, the same from the word the plan packed for it, abi.window_words),
combine them
with the operators of their semiring's ⊗ (`*`, `+` or `&`, elementwise: the same IEEE
operations, so the same bits, as the scalar code), and store them with stream_line,
put_line or (a part of a line) store_line_part.
"""

from __future__ import annotations

import operator

from llvmlite import ir
from numba import types
from numba.core.datamodel import models, register_default
from numba.core.extending import intrinsic, overload

from .. import abi
from .intrinsics import HARDWARE_GATHERS, IS_X86, LINE_BYTES


class Line(types.Type):
    """A cache line of `dtype` elements, as one vector value."""

    def __init__(self, dtype: types.Type):
        self.dtype = dtype
        super().__init__(name=f"Line({dtype})")


@register_default(Line)
class LineModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = dmm.lookup(fe_type.dtype).get_data_type()  # as stored: bool is i8
        super().__init__(dmm, fe_type, _vector(element))


def _bits(element: ir.Type) -> int:
    """An element type's bits (llvmlite's float types do not say)."""
    if isinstance(element, ir.IntType):
        return element.width
    return 64 if isinstance(element, ir.DoubleType) else 32


def _vector(element: ir.Type) -> ir.VectorType:
    return ir.VectorType(element, LINE_BYTES * 8 // _bits(element))


def _data(context, builder, arr_type, arr):
    return context.make_array(arr_type)(context, builder, arr).data


def _typed_pointer(builder, pointer, pointee: ir.Type):
    return builder.bitcast(pointer, pointee.as_pointer())


I32, I64 = ir.IntType(32), ir.IntType(64)


def _splat(builder, vector: ir.VectorType, x):
    """A vector of `vector.count` copies of x."""
    one = builder.insert_element(vector(ir.Undefined), x, I32(0))
    return builder.shuffle_vector(
        one, vector(ir.Undefined), ir.VectorType(I32, vector.count)([0] * vector.count)
    )


def _lanes(builder, count: int, lo, hi):
    """The mask of lanes lo <= w < hi of a line of `count` (lo, hi: int64 values)."""
    wide = ir.VectorType(I64, count)
    w = wide(list(range(count)))
    return builder.and_(
        builder.icmp_signed(">=", w, _splat(builder, wide, lo)),
        builder.icmp_signed("<", w, _splat(builder, wide, hi)),
    )


def _masked(builder, name: str, ret: ir.Type, args: list):
    """A call of the LLVM intrinsic `name` (llvm.masked.*), declared on first use. Named
    for typed pointers (llvmlite's IR has them); newer LLVMs rename them."""
    module = builder.module
    fn = module.globals.get(name) or ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _kind(vector: ir.VectorType) -> str:
    return f"v{vector.count}{vector.element.intrinsic_name}"


def _load(builder, at, vector: ir.VectorType, mask):
    """The line at `at` (an element pointer): one load, or a masked load whose other lanes
    are 0 (garbage in them could be a denormal, which slows every operation on it)."""
    pointer = _typed_pointer(builder, at, vector)
    if mask is None:
        return builder.load(pointer, align=1)
    kind = _kind(vector)
    return _masked(
        builder, f"llvm.masked.load.{kind}.p0{kind}", vector, [pointer, I32(1), mask, vector(None)]
    )


def _gathered(builder, data, vector: ir.VectorType, offsets, mask):
    """The vector of data[offsets[w]] (offsets: W int64) in the lanes of mask (every lane
    for None; 0 in the others): one gather instruction (HARDWARE_GATHERS machines)."""
    count, element = vector.count, vector.element
    size = _bits(element) // 8
    wide = ir.VectorType(I64, count)
    addresses = builder.add(
        _splat(builder, wide, builder.ptrtoint(data, I64)),
        builder.mul(offsets, _splat(builder, wide, I64(size))),
    )
    pointers = builder.inttoptr(addresses, ir.VectorType(element.as_pointer(), count))
    every = ir.VectorType(ir.IntType(1), count)([1] * count)
    name = f"llvm.masked.gather.{_kind(vector)}.v{count}p0{element.intrinsic_name}"
    return _masked(builder, name, vector, [pointers, I32(1), every if mask is None else mask, vector(None)])


def _codegen(make, part: bool):
    """The codegen of a line loader: `make` (below) on the whole line, or with `part` on
    lanes lo <= w < hi, its last two arguments (0 in the other lanes)."""

    def codegen(context, builder, signature, args):
        vector = context.get_value_type(signature.return_type)
        data = _data(context, builder, signature.args[0], args[0])
        mask = _lanes(builder, vector.count, args[-2], args[-1]) if part else None
        return make(context, builder, signature, args, vector, data, mask)

    return codegen


def _contiguous(context, builder, signature, args, vector, data, mask):
    return _load(builder, builder.gep(data, [args[1]]), vector, mask)


def _constant(context, builder, signature, args, vector, data, mask):
    line = _splat(builder, vector, builder.load(builder.gep(data, [args[1]])))
    return line if mask is None else builder.select(mask, line, vector(None))


def _strided(context, builder, signature, args, vector, data, mask):
    if not HARDWARE_GATHERS:
        return _one_by_one(builder, data, vector, mask, args, lambda w: builder.mul(w, args[2]))
    wide = ir.VectorType(I64, vector.count)
    steps = builder.mul(_splat(builder, wide, args[2]), wide(list(range(vector.count))))
    return _gathered(builder, data, vector, builder.add(_splat(builder, wide, args[1]), steps), mask)


def _gather(context, builder, signature, args, vector, data, mask):
    """args: the array, the leaf's offset, the table, the line's entry in it, the table's
    step (abi.py: WINDOWED, the entry is the line's window word), then a part's lanes."""
    entries = builder.gep(_data(context, builder, signature.args[2], args[2]), [args[3]])
    if vector.count != abi.W_WINDOW:  # (no window words: the plan makes none for these)
        return _by_offsets(context, builder, signature, args, vector, data, mask, entries)
    windowed = builder.icmp_signed("==", args[4], I64(abi.WINDOWED))
    with builder.if_else(windowed) as (by_word, by_offsets):
        with by_word:
            from_word = _window(builder, data, vector, args[1], builder.load(entries), mask)
            word_block = builder.block
        with by_offsets:
            from_offsets = _by_offsets(context, builder, signature, args, vector, data, mask, entries)
            offsets_block = builder.block
    line = builder.phi(vector)
    line.add_incoming(from_word, word_block)
    line.add_incoming(from_offsets, offsets_block)
    return line


def _by_offsets(context, builder, signature, args, vector, data, mask, entries):
    """The line through W offsets of the table from `entries`."""
    if not HARDWARE_GATHERS:

        def entry(w):  # the table's entry for lane w
            return builder.load(builder.gep(entries, [w]))

        return _one_by_one(builder, data, vector, mask, args, entry)
    wide = ir.VectorType(I64, vector.count)
    table = _load(builder, entries, wide, mask)
    offsets = builder.add(_splat(builder, wide, args[1]), table)
    permute = _PERMUTES.get((vector.count, str(vector.element)))
    if mask is not None or permute is None:
        return _gathered(builder, data, vector, offsets, mask)
    # a window: every lane's element within the W from lane 0's, one load and a permute
    # (a gather loads element by element: a product of several gathered leaves waited
    # on the load ports)
    first = builder.load(entries)
    within = builder.sub(table, _splat(builder, wide, first))
    inside = builder.icmp_unsigned("<", within, _splat(builder, wide, I64(vector.count)))
    bits = builder.bitcast(inside, ir.IntType(vector.count))
    start = builder.add(args[1], first)
    length = builder.extract_value(context.make_array(signature.args[0])(context, builder, args[0]).shape, 0)
    fits = builder.icmp_signed("<=", builder.add(start, I64(vector.count)), length)
    ok = builder.and_(builder.icmp_unsigned("==", bits, ir.IntType(vector.count)(-1)), fits)
    with builder.if_else(ok, likely=True) as (window, gather):
        with window:
            loaded = _load(builder, builder.gep(data, [start]), vector, None)
            name, index = permute
            index_type = ir.VectorType(index, vector.count)
            fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(vector, [vector, index_type]))
            lanes = within if index == I64 else builder.trunc(within, index_type)
            by_window = builder.call(fn, [loaded, lanes])
            window_block = builder.block
        with gather:
            by_gather = _gathered(builder, data, vector, offsets, None)
            gather_block = builder.block
    line = builder.phi(vector)
    line.add_incoming(by_window, window_block)
    line.add_incoming(by_gather, gather_block)
    return line


# (lanes, element) -> the AVX-512 permute of a line by lane indices, and the indices' type
_PERMUTES = {
    (8, "double"): ("llvm.x86.avx512.permvar.df.512", I64),
    (8, "i64"): ("llvm.x86.avx512.permvar.di.512", I64),
    (16, "float"): ("llvm.x86.avx512.permvar.sf.512", I32),
    (16, "i32"): ("llvm.x86.avx512.permvar.si.512", I32),
}


def _one_by_one(builder, data, vector: ir.VectorType, mask, args, offset):
    """The line of data[args[1] + offset(w)], a scalar load a lane (HARDWARE_GATHERS false:
    LLVM would load lane by lane too, but with each address computed in vector registers
    and moved out to a scalar one). offset: lane w's element offset from w (both LLVM
    int64 values). A part of a line (lanes lo..hi-1, args[-2] and args[-1]) loads lane
    lo's element in the lanes before it and lane hi-1's in those after it (never an
    element outside the part), then zeroes them; an empty part loads nothing."""
    if mask is None:
        return _lanes_loaded(builder, data, vector, args[1], offset, lambda w: I64(w))
    lo, hi = args[-2], args[-1]
    last = builder.sub(hi, I64(1))

    def lane(w):  # min(max(w, lo), hi - 1)
        inside = builder.select(builder.icmp_signed("<", I64(w), lo), lo, I64(w))
        return builder.select(builder.icmp_signed(">", inside, last), last, inside)

    with builder.if_else(builder.icmp_signed("<", lo, hi), likely=True) as (some, none):
        with some:
            loaded = _lanes_loaded(builder, data, vector, args[1], offset, lane)
            line = builder.select(mask, loaded, vector(None))
            some_block = builder.block
        with none:
            none_block = builder.block
    result = builder.phi(vector)
    result.add_incoming(line, some_block)
    result.add_incoming(vector(None), none_block)
    return result


def _lanes_loaded(builder, data, vector: ir.VectorType, i, offset, lane):
    """The line whose lane w is data[i + offset(lane(w))]."""
    line = vector(ir.Undefined)
    for w in range(vector.count):
        x = builder.load(builder.gep(data, [builder.add(i, offset(lane(w)))]))
        line = builder.insert_element(line, x, I32(w))
    return line


@intrinsic
def line_zero(typingctx, arr):
    """A line of zeros of arr's dtype: a sum's start (0 + x is x, as the scalar code's).
    Its zero comes through an empty inline asm (intrinsics.opaque): a loop storing a
    constant zero line would become a call of memset."""

    def codegen(context, builder, signature, args):
        vector = context.get_value_type(signature.return_type)
        element, bits = vector.element, _bits(vector.element)
        zero = builder.asm(ir.FunctionType(I64, [I64]), "", "=r,0", [I64(0)], side_effect=False)
        if bits < 64:
            zero = builder.trunc(zero, ir.IntType(bits))
        if not isinstance(element, ir.IntType):
            zero = builder.bitcast(zero, element)
        return _splat(builder, vector, zero)

    return Line(arr.dtype)(arr), codegen


# One loader per access kind of abi.py, for a whole line and for lanes lo <= w < hi of it
# (a row's ends: the other lanes are 0 and nothing outside the part is read).


@intrinsic
def line_splat(typingctx, arr, i):
    """W copies of arr[i]."""
    return Line(arr.dtype)(arr, types.int64), _codegen(_constant, False)


@intrinsic
def line_splat_part(typingctx, arr, i, lo, hi):
    return Line(arr.dtype)(arr, *[types.int64] * 3), _codegen(_constant, True)


@intrinsic
def line_load(typingctx, arr, i):
    """arr[i + w] for w < W (W elements to a line; arr[i] need not start one)."""
    return Line(arr.dtype)(arr, types.int64), _codegen(_contiguous, False)


@intrinsic
def line_load_part(typingctx, arr, i, lo, hi):
    return Line(arr.dtype)(arr, *[types.int64] * 3), _codegen(_contiguous, True)


@intrinsic
def line_strided(typingctx, arr, i, step):
    """arr[i + w * step] for w < W."""
    return Line(arr.dtype)(arr, types.int64, types.int64), _codegen(_strided, False)


@intrinsic
def line_strided_part(typingctx, arr, i, step, lo, hi):
    return Line(arr.dtype)(arr, *[types.int64] * 4), _codegen(_strided, True)


@intrinsic
def line_gather(typingctx, arr, i, table, t, step):
    """arr[i + table[t + w]] for w < W: a GATHERED access (abi.py) through W entries of
    its offset table from t, or where the table's step is WINDOWED and t a line's start,
    from the line's window word there."""
    return Line(arr.dtype)(arr, types.int64, table, types.int64, types.int64), _codegen(_gather, False)


@intrinsic
def line_gather_part(typingctx, arr, i, table, t, step, lo, hi):
    return Line(arr.dtype)(arr, types.int64, table, *[types.int64] * 4), _codegen(_gather, True)


def _window(builder, data, vector: ir.VectorType, i, word, mask):
    """The line of a window word (abi.window_words) from data[i]: one load of its window
    and a permute (a scalar load a lane where there is no permute instruction); a part's
    other lanes 0. The load reads the whole window: W elements that the plan keeps in the
    buffer (plan/schedule.py)."""
    start = builder.add(i, builder.ashr(word, I64(abi.WINDOW_SHIFT)))
    within = I64(abi.W_WINDOW - 1)
    permute = _PERMUTES.get((vector.count, str(vector.element)))
    if not HARDWARE_GATHERS or permute is None:

        def lane(w):  # lane w's place in the window
            return builder.and_(builder.lshr(word, I64(abi.WINDOW_LANE_BITS * w)), within)

        line = _lanes_loaded(builder, data, vector, start, lambda x: x, lane)
    else:
        wide = ir.VectorType(I64, vector.count)
        shifts = wide([abi.WINDOW_LANE_BITS * w for w in range(vector.count)])
        lanes = builder.and_(builder.lshr(_splat(builder, wide, word), shifts), _splat(builder, wide, within))
        loaded = _load(builder, builder.gep(data, [start]), vector, None)
        name, index = permute
        fn = builder.module.declare_intrinsic(name, fnty=ir.FunctionType(vector, [vector, wide]))
        line = builder.call(fn, [loaded, lanes])
    return line if mask is None else builder.select(mask, line, vector(None))


def _store(builder, context, signature, args, mask, streamed: bool = False):
    """Store the line args[2] at args[0][args[1]]: whole (a streaming store, or a plain one
    aligned to half a line only: LLVM merges two stores that differ in their metadata
    alone, dropping it, and a streaming store in one branch of an `if` and a plain one of
    the same line in the other became one plain store), or the lanes of mask (a masked
    store, plain: a part of a line cannot be streamed)."""
    vector = context.get_value_type(signature.args[2])
    at = _typed_pointer(
        builder, builder.gep(_data(context, builder, signature.args[0], args[0]), [args[1]]), vector
    )
    if mask is not None:
        kind = _kind(vector)
        _masked(builder, f"llvm.masked.store.{kind}.p0{kind}", ir.VoidType(), [args[2], at, I32(1), mask])
    elif streamed:
        store = builder.store(args[2], at, align=LINE_BYTES)
        if IS_X86:
            store.set_metadata("nontemporal", builder.module.add_metadata([I32(1)]))
    else:
        builder.store(args[2], at, align=LINE_BYTES // 2)
    return context.get_dummy_value()


def _line_store(streamed: bool, doc: str):
    @intrinsic
    def store(typingctx, arr, i, line):
        if not isinstance(line, Line) or line.dtype != arr.dtype:
            return None
        sig = types.void(arr, types.int64, line)

        def codegen(context, builder, signature, args):
            return _store(builder, context, signature, args, None, streamed)

        return sig, codegen

    store.__doc__ = doc
    return store


stream_line = _line_store(
    True,
    "arr[i : i + W] = line, one non-temporal store (x86-64; a plain one elsewhere); arr[i] starts a line.",
)
put_line = _line_store(
    False, "arr[i : i + W] = line, one plain store (an output the cache keeps); arr[i] starts a line."
)


@intrinsic
def store_line_part(typingctx, arr, i, line, lo, hi):
    """arr[i + w] = line[w] for lo <= w < hi, as one masked store (plain: a part of a line
    cannot be streamed); no other element is written."""
    if not isinstance(line, Line) or line.dtype != arr.dtype:
        return None
    sig = types.void(arr, types.int64, line, types.int64, types.int64)

    def codegen(context, builder, signature, args):
        return _store(
            builder,
            context,
            signature,
            args,
            _lanes(builder, context.get_value_type(line).count, args[3], args[4]),
        )

    return sig, codegen


@intrinsic
def line_lane(typingctx, line, w):
    """Element w of a line."""
    if not isinstance(line, Line):
        return None
    sig = line.dtype(line, types.int64)

    def codegen(context, builder, signature, args):
        x = builder.extract_element(args[0], args[1])  # as stored (a bool is an i8)
        return context.data_model_manager[signature.return_type].from_data(builder, x)

    return sig, codegen


def _elementwise(floats: str | None, ints: str):
    """An intrinsic applying one LLVM instruction to two lines of one type, element by
    element (`floats` None: integer and bool lines only)."""

    @intrinsic
    def apply(typingctx, a, b):
        if not (isinstance(a, Line) and a == b) or (floats is None and isinstance(a.dtype, types.Float)):
            return None
        sig = a(a, b)

        def codegen(context, builder, signature, args):
            element = context.get_value_type(signature.return_type).element
            op = ints if isinstance(element, ir.IntType) else floats
            return getattr(builder, str(op))(args[0], args[1])  # (floats is not None here)

        return sig, codegen

    return apply


line_times = _elementwise("fmul", "mul")  # int64 wraps, as numpy's
line_plus = _elementwise("fadd", "add")
line_and = _elementwise(None, "and_")  # bool: 0 or 1 in each i8


def _on_lines(op, implementation):
    @overload(op)
    def on_lines(a, b):
        if isinstance(a, Line) and a == b:
            return lambda a, b: implementation(a, b)
        return None

    return on_lines


_on_lines(operator.mul, line_times)
_on_lines(operator.add, line_plus)
_on_lines(operator.and_, line_and)
