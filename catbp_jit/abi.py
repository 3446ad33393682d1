"""The kernel ABI: where everything a kernel reads sits in the int64 table P.

Defined once, here: plan/schedule.py packs the table with these offsets and every code
generator (codegen/cpu.py, codegen/cuda.py) emits kernels that read it with them.

The table holds one step row per step, then each step's parameters, then the offset
tables of the vectors' GATHERED accesses, then scratch space for loop counters:

    [kernel_0, params_0, chunks_0, finish_0, kernel_1, params_1, chunks_1, finish_1, ...,
     params..., tables..., scratch...]

A step row: its kernel id, the offset p of its parameters, its chunks: the fixed
pieces its work is cut into, which the CPU dispatcher's threads take one at a time
(codegen/dispatch.py; 1: the step runs on one thread), and its finish: ONE_FINISH, or
SPLIT_FINISH for a NORMALIZE cut in chunks too (below). A CPU kernel is called as
kernel(mem_address, mem_length, P_address, P_length, p, chunk, chunks) and does chunk
`chunk` of `chunks` (a kernel whose steps are never cut ignores the two); then, for a
step of several chunks, what follows them all: chunk == chunks (ONE_FINISH: a NORMALIZE
on one thread, or nothing), or (SPLIT_FINISH) the NORMALIZE in two passes of `chunks`
parts each, every part of the first done before any of the second: chunks + 1 + c, part
c of its total (into the float64 slots after the step's loop counters, SPLIT_TOTALS of
them), then 2 * chunks + 1 + c, part c of its division.

A step's parameters, from its offset p (R output axes, Q reduced axes, D = R + Q; output
axes first; the vector, plan/loops.py, is the last nb axes of the hot group):

    p + OUT          offset of the output in the arena (elements)
    p + OUT_RANK     R
    p + RED_RANK     Q
    p + SCRATCH      offset of the step's loop counters (D per chunk) in P
    p + CHUNKS       fixed chunks of work (the step row's chunks, kept with the
                     parameters so that abi.unpack gives a step back whole; scratch holds
                     D loop counters per chunk)
    p + BLOCK_AXES   nb: the innermost axes, walked as one flat vector of V elements
                     (the hot axes: the reduced ones if the step reduces across reduced
                     axes, else the output's)
    p + BLOCK_SIZE   V: elements of the vector. A reduction across both (plan/loops.py)
                     has its nb output axes (S elements) after the innermost reduced axes
                     whose sizes multiply to J = V / S, element v = j * S + s
    p + LEAVES       k: the number of leaves (a CPU kernel serves any k)
    p + SIZES + d    size of axis d, d < D
    out_strides(D) + d     output stride of axis d, d < R
    leaf(D, l)             leaf l's arena offset; its stride on axis d at leaf(D, l) + 1 + d
    groups(D, R, k) + 0/1/2/3  NORMALIZE groups: [groups, group stride, element stride,
                     totals: where group g's total goes (at totals + g), or -1]
    access(D, R, k, i) + 0/1/2  how operand i (leaves 0..k-1, then the output) moves along
                     the vector: [kind, step, table] (below)

An operand's access along the vector (element v of the nb block axes, C order), from the
offset its odometer axes give it:
    CONSTANT     the same element for every v (step 0: all its block strides are 0)
    CONTIGUOUS   + v (step 1)
    STRIDED      + v * step
    GATHERED     + P[table + v]: an offset table of V entries, made at plan time. Its step
                 is WINDOWED where the entry of each multiple v of W_WINDOW is instead
                 the window word of the line from v (window_words, below): a line
                 kernel's leaf (codegen/cpu_lines.py) whose lines each lie in a window, in
                 a step whose every row starts on a cache line; else its step is 0
    STREAMED     an output's CONTIGUOUS access whose whole cache lines are written with
                 non-temporal stores (codegen/intrinsics.py): outputs larger than the
                 last-level cache (PlanOptions.streaming_store_bytes), on the CPU only
Kernels branch on the kind once per vector, never per element, so each case is a plain
loop a compiler can vectorize.

All of it is runtime data: kernels are specialized on their pattern, never on sizes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

    Table = Sequence[int] | np.ndarray  # a schedule's table: a session's copy is an array

# a step row: (kernel id, parameter offset, chunks, finish)
STEP_ROW = 4
STEP_KERNEL = 0
STEP_PARAMS = 1
STEP_CHUNKS = 2
STEP_FINISH = 3
ONE_FINISH, SPLIT_FINISH = 0, 1  # a step's finish (above)
SPLIT_TOTALS = 16  # float64 slots of a split NORMALIZE's partial totals (codegen/totals.py)

# a step's header, offsets from p
OUT = 0
OUT_RANK = 1
RED_RANK = 2
SCRATCH = 3
CHUNKS = 4
BLOCK_AXES = 5
BLOCK_SIZE = 6
LEAVES = 7
SIZES = 8  # the sizes of the D axes start here; everything after depends on D, R, k
HEADER = SIZES

GROUP_FIELDS = 4  # groups, group stride, element stride, totals offset (or -1)

# the most leaves a step may have: a CPU kernel keeps each leaf's offsets in arrays of this
# many on its stack (codegen/intrinsics.py), and PlanOptions.max_leaves is checked against it
MAX_LEAVES = 64

# elements of a CPU kernel's vector buffer (codegen/intrinsics.py): the vector a step walks
# is cut in pieces of this many; an ACROSS_BOTH vector fits in one. 4 KiB of float64, well
# inside L1.
BUFFER = 512

# most elements of the vector of a reduction that a contract_lines kernel computes
# (codegen/cpu_lines.py): it keeps a row's sums in its BUFFER, a line for every 64-byte
# line of the output the row touches (of 8-byte elements: KernelPattern.sums_in_lines),
# the first and last maybe parts of lines
LINE_SUMS_MAX = BUFFER - 2 * 8

# output elements an exact PROB sum across reduced axes computes side by side (codegen/
# cpu.py: _lanes_reduction), each its own chain of additions in its own order, a
# BUFFER // LANES piece of the buffer each
LANES = 4
# ... and the lanes of one float64 output's sum in the reassociating mode (and of a
# NORMALIZE's total: codegen/totals.py), a line's elements
SUM_LANES = 8

# an operand's access along the vector: [kind, step, table]
ACCESS_FIELDS = 3
CONSTANT, CONTIGUOUS, STRIDED, GATHERED, STREAMED = 0, 1, 2, 3, 4
ACCESS_KINDS = ("constant", "contiguous", "strided", "gathered", "streamed")


# A GATHERED table's lines in windows (its step WINDOWED): W_WINDOW elements from a
# multiple of W_WINDOW along the vector that lie within W_WINDOW consecutive elements of
# the leaf (most of a grid's gathered leaves: a leaf that lacks an axis of the vector
# repeats its elements). Such a line is the load of those W_WINDOW elements and a permute
# of them, whose lane indices a word packs: (the line's lowest offset << WINDOW_SHIFT) |
# lane w's offset from it at bits WINDOW_LANE_BITS * w (a last line that is a part: its
# other lanes 0). For lines of 8 elements (8-byte ones) only: their 8 indices of 3 bits
# leave the rest of the word to the offset. Without its word, a line is a load of its 8
# offsets, a check that they lie in a window, then the same load and permute
WINDOWED = 1
W_WINDOW = 8
WINDOW_ITEMSIZE = 8  # (bytes: W_WINDOW of them to a 64-byte cache line)
WINDOW_LANE_BITS = 3
WINDOW_SHIFT = W_WINDOW * WINDOW_LANE_BITS


def window_words(offsets: Sequence[int]) -> tuple[int, ...] | None:
    """The window words of the lines of a GATHERED access's offsets (W_WINDOW of them from
    each multiple of W_WINDOW), or None if a line lies in no window."""
    words = []
    for j in range(0, len(offsets), W_WINDOW):
        line = offsets[j : j + W_WINDOW]
        start = min(line)
        if start < 0 or max(line) - start >= W_WINDOW or start >= 1 << (63 - WINDOW_SHIFT):
            return None
        lanes = sum((o - start) << (WINDOW_LANE_BITS * w) for w, o in enumerate(line))
        words.append((start << WINDOW_SHIFT) | lanes)
    return tuple(words) or None


def windowed_table(offsets: Sequence[int], words: Sequence[int]) -> tuple[int, ...]:
    """A WINDOWED table: the offsets, the entry of each multiple of W_WINDOW its word."""
    table = list(offsets)
    table[::W_WINDOW] = words
    return tuple(table)


def table_offsets(table: Sequence[int], step: int) -> tuple[int, ...]:
    """The offsets of a GATHERED table of this step (windowed_table's inverse)."""
    offsets = list(table)
    if step == WINDOWED:
        mask = (1 << WINDOW_LANE_BITS) - 1
        offsets[::W_WINDOW] = [(word >> WINDOW_SHIFT) + (word & mask) for word in table[::W_WINDOW]]
    return tuple(offsets)


def out_strides(D: int) -> int:
    """Offset (from p) of the output strides."""
    return SIZES + D


def leaf(D: int, R: int, j: int) -> int:
    """Offset (from p) of leaf j's arena offset; its D strides follow it."""
    return SIZES + D + R + j * (1 + D)


def groups(D: int, R: int, k: int) -> int:
    """Offset (from p) of the NORMALIZE groups of a step with k leaves."""
    return leaf(D, R, k)


def access(D: int, R: int, k: int, i: int) -> int:
    """Offset (from p) of operand i's access [kind, step, table]: leaves 0..k-1, the
    output is operand k."""
    return groups(D, R, k) + GROUP_FIELDS + i * ACCESS_FIELDS


def param_count(D: int, R: int, k: int) -> int:
    return access(D, R, k, k + 1)


@dataclass(frozen=True)
class Access:
    """How an operand moves along a step's vector (see the module docstring). table: the
    offsets of a GATHERED access (V of them), placed in P once every step is laid out (in
    a windowed_table where its step is WINDOWED)."""

    kind: int
    step: int = 0
    offsets: tuple[int, ...] = ()
    table: int = -1

    def pack(self) -> list[int]:
        return [self.kind, self.step, self.table]


@dataclass(frozen=True)
class StepParams:
    """A step's parameters by name; `pack` gives the row the table holds, in this order.
    scratch and the accesses' tables are offsets into the table, known only once every step
    is laid out (plan/schedule.build_schedule fills them in)."""

    out: int
    out_rank: int
    red_rank: int
    chunks: int
    block_axes: int
    block_size: int
    sizes: tuple[int, ...]
    out_strides: tuple[int, ...]
    leaves: tuple[tuple[int, tuple[int, ...]], ...]  # (arena offset, strides) per leaf
    groups: tuple[int, int, int, int]
    accesses: tuple[Access, ...] = ()  # leaves, then the output
    scratch: int = -1
    # its NORMALIZE cut in chunks (SPLIT_FINISH): kept in the step row, not with these
    split_finish: bool = False

    def pack(self) -> list[int]:
        row = [0] * HEADER
        row[OUT], row[OUT_RANK], row[RED_RANK] = self.out, self.out_rank, self.red_rank
        row[SCRATCH], row[CHUNKS], row[BLOCK_AXES] = self.scratch, self.chunks, self.block_axes
        row[BLOCK_SIZE], row[LEAVES] = self.block_size, len(self.leaves)
        row += list(self.sizes) + list(self.out_strides)
        for offset, strides in self.leaves:
            row += [offset] + list(strides)
        row += list(self.groups)
        for acc in self.accesses:
            row += acc.pack()
        D, R, k = len(self.sizes), self.out_rank, len(self.leaves)
        assert len(self.accesses) == k + 1, "an access per leaf and one for the output"
        assert len(row) == param_count(D, R, k) and R + self.red_rank == D
        return [int(x) for x in row]

    def size(self) -> int:
        """len(self.pack()), without packing."""
        return param_count(len(self.sizes), self.out_rank, len(self.leaves))

    @property
    def rank(self) -> int:
        return len(self.sizes)

    def scratch_size(self) -> int:
        """Loop counters: one per axis, per chunk; then a split NORMALIZE's partial totals."""
        return max(1, self.rank) * self.chunks + (SPLIT_TOTALS if self.split_finish else 0)


def unpack(P: Table, p: int) -> StepParams:
    """The parameters of the step at offset p of table P (numpy_steps.py, tests)."""
    R, Q, k = int(P[p + OUT_RANK]), int(P[p + RED_RANK]), int(P[p + LEAVES])
    D = R + Q

    def at(i, n):
        return tuple(int(x) for x in P[p + i : p + i + n])

    return StepParams(
        out=int(P[p + OUT]),
        out_rank=R,
        red_rank=Q,
        chunks=int(P[p + CHUNKS]),
        block_axes=int(P[p + BLOCK_AXES]),
        block_size=int(P[p + BLOCK_SIZE]),
        sizes=at(SIZES, D),
        out_strides=at(out_strides(D), R),
        leaves=tuple((int(P[p + leaf(D, R, j)]), at(leaf(D, R, j) + 1, D)) for j in range(k)),
        groups=at(groups(D, R, k), GROUP_FIELDS),
        accesses=tuple(_access(P, p + access(D, R, k, i), int(P[p + BLOCK_SIZE])) for i in range(k + 1)),
        scratch=int(P[p + SCRATCH]),
    )


def _access(P: Table, at: int, V: int) -> Access:
    kind, step, table = (int(x) for x in P[at : at + ACCESS_FIELDS])
    offsets = table_offsets([int(x) for x in P[table : table + V]], step) if kind == GATHERED else ()
    return Access(kind, step, offsets, table)


# -- the same offsets in kernel source ---------------------------------------------------


def source_constants() -> str:
    """Module-level constants a generated kernel reads the table with (Numba folds them)."""
    return (
        "# the kernel ABI (catbp_jit/abi.py): offsets of a step's parameters from p\n"
        f"OUT, OUT_RANK, RED_RANK, SCRATCH = {OUT}, {OUT_RANK}, {RED_RANK}, {SCRATCH}\n"
        f"CHUNKS, BLOCK_AXES, BLOCK_SIZE, LEAVES, SIZES = {CHUNKS}, {BLOCK_AXES}, "
        f"{BLOCK_SIZE}, {LEAVES}, {SIZES}\n"
        f"GROUP_FIELDS, ACCESS_FIELDS = {GROUP_FIELDS}, {ACCESS_FIELDS}\n"
        f"CONSTANT, CONTIGUOUS, STRIDED, GATHERED, STREAMED = {CONSTANT}, {CONTIGUOUS}, "
        f"{STRIDED}, {GATHERED}, {STREAMED}  # access kinds\n"
        f"WINDOWED = {WINDOWED}  # a GATHERED table's step: window words at its lines' starts\n"
        f"STEP_ROW, STEP_KERNEL, STEP_PARAMS, STEP_CHUNKS, STEP_FINISH = {STEP_ROW}, {STEP_KERNEL}, "
        f"{STEP_PARAMS}, {STEP_CHUNKS}, {STEP_FINISH}\n"
        f"ONE_FINISH, SPLIT_FINISH = {ONE_FINISH}, {SPLIT_FINISH}  # a step's finish\n"
    )


# offsets from p as source over the names above and D, R (mirrors out_strides/leaf/groups)
OUT_STRIDES_SOURCE = "SIZES + D"


def leaf_source(j: int) -> str:
    return f"SIZES + D + R + {j} * (1 + D)" if j else "SIZES + D + R"


def groups_source(k: int) -> str:
    return leaf_source(k)


def access_source(k: int, i: int) -> str:
    """Offset (from p) of operand i's access, as source: mirrors access()."""
    return f"{groups_source(k)} + {GROUP_FIELDS + i * ACCESS_FIELDS}"


# -- the GEMM template (codegen/cpu_gemm.py, plan/gemm.py) -------------------------------
#
# A 2-leaf reducing segment out[b][i][j] = ⊕_k a[b][i][k] ⊗ b[b][k][j] run as one matrix
# product per position of the batch axes. Its parameters, from p (OUT as above; nb batch
# axes):
#
#     p + OUT          offset of the output: an M x N C-order matrix per batch position
#     p + GEMM_A       offset of leaf a; p + GEMM_A_T: 0 if stored [M][K], 1 if [K][M]
#     p + GEMM_B       offset of leaf b; p + GEMM_B_T: 0 if stored [K][N], 1 if [N][K]
#     p + GEMM_M, GEMM_N, GEMM_K
#     p + GEMM_WORK    LOGPROB: offset of M*K + K*N + M + N elements of workspace (the
#                      shifted exponentials of a and b, then their row and column maxima)
#     p + GEMM_BATCH_RANK   nb
#     p + GEMM_C       where the products go: OUT, or the workspace when the output is
#                      copied out after them (the copies below)
#     p + GEMM_PARALLEL_BATCH   1: the threads share the batch positions (products small
#                      enough for one thread each); 0: one at a time, each product on
#                      BLAS's own threads. (A kernel whose pattern is parallel shares its
#                      copies and NORMALIZE passes among the threads either way.)
#     gemm_batch(d) + 0/1/2/3   batch axis d: size, then its stride in c, a and b
#     gemm_groups(nb) + 0/1/2/3 NORMALIZE groups, as for contract_reduce (over OUT)
#     gemm_copies(nb) + 0/1     how many copies run before the products, how many after;
#                      then each copy: COPY_SRC, COPY_DST, COPY_RANK, and per axis d at
#                      copy_axis(d): size, source stride, destination stride (plan/gemm.py:
#                      a leaf copied into the workspace as the matrix a or b, the products
#                      copied out into the output region); or, where COPY_RANK holds
#                      COPY_GROUPED, a GroupedCopy: GROUPED_RANK outer axes, GROUPED_ROWS
#                      and GROUPED_COLS (a block's shape), GROUPED_DENSE (1: the columns
#                      are written one after another), the outer axes' fields from
#                      GROUPED_HEADER as above, then four tables: the rows' source and
#                      destination offsets, the columns' source and destination offsets

GEMM_A = 1
GEMM_A_T = 2
GEMM_B = 3
GEMM_B_T = 4
GEMM_M = 5
GEMM_N = 6
GEMM_K = 7
GEMM_WORK = 8
GEMM_BATCH_RANK = 9
GEMM_C = 10
GEMM_PARALLEL_BATCH = 11
GEMM_HEADER = 12
GEMM_BATCH_FIELDS = 4  # size, c stride, a stride, b stride
COPY_SRC, COPY_DST, COPY_RANK = 0, 1, 2
COPY_HEADER = 3
COPY_AXIS_FIELDS = 3  # size, source stride, destination stride
COPY_GROUPED = -1  # in COPY_RANK: the copy is a GroupedCopy (no rank is negative)
GROUPED_RANK, GROUPED_ROWS, GROUPED_COLS, GROUPED_DENSE = 3, 4, 5, 6
GROUPED_HEADER = 7


def gemm_batch(d: int) -> int:
    """Offset (from p) of batch axis d's fields."""
    return GEMM_HEADER + GEMM_BATCH_FIELDS * d


def gemm_groups(nb: int) -> int:
    return gemm_batch(nb)


def gemm_copies(nb: int) -> int:
    """Offset (from p) of the copy counts; the copies follow them."""
    return gemm_groups(nb) + GROUP_FIELDS


def copy_axis(d: int) -> int:
    """Offset (from a copy's start) of its axis d's fields."""
    return COPY_HEADER + COPY_AXIS_FIELDS * d


@dataclass(frozen=True)
class StridedCopy:
    """mem[dst + Σ i_d dst_d] = mem[src + Σ i_d src_d] over every index (C order)."""

    src: int
    dst: int
    sizes: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]

    def pack(self) -> list[int]:
        row = [self.src, self.dst, len(self.sizes)]
        for fields in zip(self.sizes, self.src_strides, self.dst_strides):
            row += list(fields)
        return row

    def size(self) -> int:
        return copy_axis(len(self.sizes))


@dataclass(frozen=True)
class GroupedCopy:
    """A copy moved a block at a time: at each position of the outer axes (walked as
    StridedCopy's, the last fastest), element (r, c) of a rows x cols block goes from
    src + Σ i_d src_d + row_src[r] + col_src[c] to dst + Σ i_d dst_d + row_dst[r] +
    col_dst[c]. A block's rows and columns each stand for several short axes (a grid's
    binary ones), which a StridedCopy can only tile two at a time (plan/copies.py)."""

    src: int
    dst: int
    sizes: tuple[int, ...]  # the outer axes
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]
    row_src: tuple[int, ...]
    row_dst: tuple[int, ...]
    col_src: tuple[int, ...]
    col_dst: tuple[int, ...]

    @property
    def dense(self) -> bool:
        """Whether a row's columns are written one after another."""
        return self.col_dst == tuple(range(len(self.col_dst)))

    def pack(self) -> list[int]:
        rows, cols = len(self.row_src), len(self.col_src)
        row = [self.src, self.dst, COPY_GROUPED, len(self.sizes), rows, cols, int(self.dense)]
        for fields in zip(self.sizes, self.src_strides, self.dst_strides):
            row += list(fields)
        return row + list(self.row_src + self.row_dst + self.col_src + self.col_dst)

    def size(self) -> int:
        tables = 2 * (len(self.row_src) + len(self.col_src))
        return GROUPED_HEADER + COPY_AXIS_FIELDS * len(self.sizes) + tables


GemmCopy = StridedCopy | GroupedCopy  # (a GEMM step copies either way)


@dataclass(frozen=True)
class GemmParams:
    """A GEMM step's parameters by name (see above); `pack` gives the table's row."""

    out: int
    a: int
    a_t: bool
    b: int
    b_t: bool
    m: int
    n: int
    k: int
    batch: tuple[tuple[int, int, int, int], ...]  # (size, out, a, b strides) per batch axis
    groups: tuple[int, int, int, int]
    work: int = -1  # LOGPROB workspace offset (plan/gemm.py: gemm_workspace), else -1
    c: int = -1  # where the products go (-1: out)
    before: tuple[GemmCopy, ...] = ()  # leaves copied into the workspace
    after: tuple[GemmCopy, ...] = ()  # the products copied into the output
    accesses: tuple[Access, ...] = ()  # (no vector, no offset tables)
    parallel_batch: bool = False  # the threads share the batch positions

    def pack(self) -> list[int]:
        row = [0] * GEMM_HEADER
        row[GEMM_PARALLEL_BATCH] = self.parallel_batch
        row[OUT], row[GEMM_A], row[GEMM_A_T], row[GEMM_B] = self.out, self.a, self.a_t, self.b
        row[GEMM_B_T], row[GEMM_M], row[GEMM_N], row[GEMM_K] = self.b_t, self.m, self.n, self.k
        row[GEMM_WORK], row[GEMM_BATCH_RANK] = self.work, len(self.batch)
        row[GEMM_C] = self.out if self.c < 0 else self.c
        for fields in self.batch:
            row += list(fields)
        row += list(self.groups)
        row += [len(self.before), len(self.after)]
        for copy in self.before + self.after:
            row += copy.pack()
        assert len(row) == self.size()
        return [int(x) for x in row]

    def size(self) -> int:
        """len(self.pack()), without packing."""
        copies = sum(c.size() for c in self.before + self.after)
        return gemm_copies(len(self.batch)) + 2 + copies


def gemm_source_constants() -> str:
    """The GEMM offsets as module-level constants of a generated kernel."""
    return (
        "# the GEMM kernel ABI (catbp_jit/abi.py)\n"
        f"OUT, GEMM_A, GEMM_A_T, GEMM_B, GEMM_B_T = {OUT}, {GEMM_A}, {GEMM_A_T}, {GEMM_B}, "
        f"{GEMM_B_T}\n"
        f"GEMM_M, GEMM_N, GEMM_K, GEMM_WORK = {GEMM_M}, {GEMM_N}, {GEMM_K}, {GEMM_WORK}\n"
        f"GEMM_BATCH_RANK, GEMM_C, GEMM_PARALLEL_BATCH = {GEMM_BATCH_RANK}, {GEMM_C}, "
        f"{GEMM_PARALLEL_BATCH}\n"
        f"GEMM_HEADER, GEMM_BATCH_FIELDS, GROUP_FIELDS = {GEMM_HEADER}, {GEMM_BATCH_FIELDS}, "
        f"{GROUP_FIELDS}\n"
        f"COPY_SRC, COPY_DST, COPY_RANK, COPY_HEADER, COPY_AXIS_FIELDS = {COPY_SRC}, "
        f"{COPY_DST}, {COPY_RANK}, {COPY_HEADER}, {COPY_AXIS_FIELDS}\n"
        f"COPY_GROUPED, GROUPED_RANK, GROUPED_ROWS, GROUPED_COLS, GROUPED_DENSE = {COPY_GROUPED}, "
        f"{GROUPED_RANK}, {GROUPED_ROWS}, {GROUPED_COLS}, {GROUPED_DENSE}\n"
        f"GROUPED_HEADER = {GROUPED_HEADER}\n"
    )


# -- a repack step (template "repack", plan/repack.py) ------------------------------------
#
# Copies of a loop step's small GATHERED leaves into its workspace in its vector's order,
# run just before that step, which then reads them CONTIGUOUS. Its parameters, from p:
#
#     p + REPACK_V         V: elements of the vector
#     p + REPACK_SCRATCH   offset of its loop counters in P (per chunk, one per axis of
#                          its longest copy)
#     p + REPACK_CHUNKS    fixed chunks (the step row's chunks): a chunk is a range of the
#                          copies' positions taken in order, with its own loop counters
#     p + REPACK_COUNT     how many copies; then each: COPY_SRC, COPY_DST, COPY_RANK (m),
#                          COPY_TABLE (the leaf's offsets along the vector, V of them),
#                          COPY_LEAF (which leaf of the next step reads it), COPY_STEP (the
#                          table's: WINDOWED or 0, as a GATHERED access's), and per axis d
#                          at repack_axis(d): size, source stride, destination stride
#                          (StridedCopy's fields)
#
# For every index i over a copy's m axes (C order, the last fastest) and v < V:
#     mem[dst + Σ i_d dst_d + v] = mem[src + Σ i_d src_d + P[table + v]]

REPACK_V, REPACK_SCRATCH, REPACK_COUNT, REPACK_CHUNKS = 0, 1, 2, 3
REPACK_HEADER = 4
# (after COPY_SRC, COPY_DST, COPY_RANK)
COPY_TABLE, COPY_LEAF, COPY_STEP = COPY_HEADER, COPY_HEADER + 1, COPY_HEADER + 2
GATHERED_COPY_HEADER = COPY_HEADER + 3


def repack_axis(d: int) -> int:
    """Offset (from a gathered copy's start) of its axis d's fields."""
    return GATHERED_COPY_HEADER + COPY_AXIS_FIELDS * d


@dataclass(frozen=True)
class GatheredCopy:
    """A StridedCopy of vectors: at each of its positions, V elements gathered from the
    source through `offsets` (placed in P at `table`), written contiguous. leaf: which
    leaf of the step after it reads the copy. step: the table's, WINDOWED where it is a
    windowed_table, else 0."""

    positions: StridedCopy
    offsets: tuple[int, ...]
    leaf: int
    table: int = -1
    step: int = 0

    def pack(self) -> list[int]:
        row = self.positions.pack()
        return row[:COPY_HEADER] + [self.table, self.leaf, self.step] + row[COPY_HEADER:]

    def size(self) -> int:
        return repack_axis(len(self.positions.sizes))


@dataclass(frozen=True)
class RepackParams:
    """A repack step's parameters by name (see above); `pack` gives the table's row."""

    block_size: int
    copies: tuple[GatheredCopy, ...]
    scratch: int = -1
    accesses: tuple[Access, ...] = ()  # (no vector of its own, no access tables)
    chunks: int = 1

    def pack(self) -> list[int]:
        row = [self.block_size, self.scratch, len(self.copies), self.chunks]
        for copy in self.copies:
            row += copy.pack()
        assert len(row) == self.size()
        return [int(x) for x in row]

    def size(self) -> int:
        """len(self.pack()), without packing."""
        return REPACK_HEADER + sum(copy.size() for copy in self.copies)

    def rows(self) -> int:
        """Positions over all its copies (V elements copied at each)."""
        return sum(prod(copy.positions.sizes) for copy in self.copies)

    def scratch_size(self) -> int:
        """Loop counters: one per axis of its longest copy, per chunk."""
        return max([1] + [len(copy.positions.sizes) for copy in self.copies]) * self.chunks


def unpack_repack(P: Table, p: int) -> RepackParams:
    """The parameters of the repack step at offset p of table P (numpy_steps.py, tests)."""
    V, copies, r = int(P[p + REPACK_V]), [], p + REPACK_HEADER
    for _ in range(int(P[p + REPACK_COUNT])):
        src, dst, m, table, leaf, step = (int(x) for x in P[r : r + GATHERED_COPY_HEADER])
        fields = [int(x) for x in P[r + GATHERED_COPY_HEADER : r + repack_axis(m)]]
        positions = StridedCopy(src, dst, tuple(fields[0::3]), tuple(fields[1::3]), tuple(fields[2::3]))
        offsets = table_offsets([int(x) for x in P[table : table + V]], step)
        copies.append(GatheredCopy(positions, offsets, leaf, table, step))
        r += repack_axis(m)
    return RepackParams(V, tuple(copies), int(P[p + REPACK_SCRATCH]), chunks=int(P[p + REPACK_CHUNKS]))


def repack_source_constants() -> str:
    """The repack offsets as module-level constants of a generated kernel."""
    return (
        "# the repack kernel ABI (catbp_jit/abi.py)\n"
        f"REPACK_V, REPACK_SCRATCH, REPACK_COUNT, REPACK_HEADER = {REPACK_V}, {REPACK_SCRATCH}, "
        f"{REPACK_COUNT}, {REPACK_HEADER}\n"
        f"COPY_SRC, COPY_DST, COPY_RANK, COPY_TABLE = {COPY_SRC}, {COPY_DST}, {COPY_RANK}, {COPY_TABLE}\n"
        f"COPY_STEP, WINDOWED = {COPY_STEP}, {WINDOWED}  # its table's step: window words\n"
        f"GATHERED_COPY_HEADER, COPY_AXIS_FIELDS = {GATHERED_COPY_HEADER}, {COPY_AXIS_FIELDS}\n"
    )


# -- the thread pool's control block (catbp_jit/pool.py, codegen/dispatch.py) -----------
#
# One int64 array per process that the dispatcher and the pool's threads share. The
# fields that threads write while others spin on them sit on lines of their own (eight
# int64 to a 64-byte line), so a write to one does not slow the reads of another.
#
#   POOL_SEQ      number of the job posted last (the dispatcher writes it last, releasing)
#   POOL_CLAIM    that job's number << 32 | the next chunk of it to take
#   POOL_DONE     chunks of the job done
#   POOL_OWNER    1 while a run uses the pool (runs in other threads then take no help)
#   JOB_*         the job: a step's kernel address, arena, table, params offset, chunks,
#                 JOB_FIRST (its chunk c is the kernel's chunk JOB_FIRST + c);
#                 JOB_TRACKS: -1, or for a run's tracks (chunk k: track k is the taker's own)
#                 the offset of its tracks section, JOB_KERNELS and JOB_N_KERNELS then the
#                 kernels' address array
#   POOL_HELPERS  pool threads that may take chunks in this run (0..HELPERS-1)
#   POOL_STOP     1: pool threads return at once
#   POOL_SLEEP    address of libc's usleep, for naps (0: none; threads then return)
#   POOL_SPIN     pauses a pool thread spins for the next job before it naps
#   POOL_NAP      microseconds of a nap, while a run holds the pool
POOL_SEQ, POOL_CLAIM, POOL_DONE, POOL_OWNER = 0, 8, 16, 24
JOB_KERNEL, JOB_MEM, JOB_MEM_LENGTH, JOB_P, JOB_P_LENGTH, JOB_PARAMS, JOB_CHUNKS, JOB_TRACKS = range(32, 40)
POOL_HELPERS, POOL_STOP, POOL_SLEEP, POOL_SPIN, POOL_NAP, JOB_KERNELS, JOB_N_KERNELS = range(40, 47)
JOB_FIRST = 47
POOL_SIZE = 48
JOB_SHIFT = 32  # POOL_CLAIM: the job number above these bits, the chunk below


def pool_constants() -> str:
    """The control block's offsets, as source for the dispatcher."""
    return (
        "# the pool's control block (catbp_jit/abi.py)\n"
        f"POOL_SEQ, POOL_CLAIM, POOL_DONE, POOL_OWNER = {POOL_SEQ}, {POOL_CLAIM}, {POOL_DONE}, "
        f"{POOL_OWNER}\n"
        f"JOB_KERNEL, JOB_MEM, JOB_MEM_LENGTH, JOB_P, JOB_P_LENGTH, JOB_PARAMS, JOB_CHUNKS, "
        f"JOB_TRACKS = {JOB_KERNEL}, {JOB_MEM}, {JOB_MEM_LENGTH}, {JOB_P}, {JOB_P_LENGTH}, "
        f"{JOB_PARAMS}, {JOB_CHUNKS}, {JOB_TRACKS}\n"
        f"POOL_HELPERS, POOL_STOP, POOL_SLEEP, POOL_SPIN, POOL_NAP, JOB_KERNELS, JOB_N_KERNELS, "
        f"JOB_FIRST = {POOL_HELPERS}, {POOL_STOP}, {POOL_SLEEP}, {POOL_SPIN}, {POOL_NAP}, "
        f"{JOB_KERNELS}, {JOB_N_KERNELS}, {JOB_FIRST}\n"
        f"POOL_SIZE, JOB_SHIFT = {POOL_SIZE}, {JOB_SHIFT}\n"
    )


# -- tracks (plan/tracks.py, codegen/dispatch.py) -----------------------------------------
#
# A schedule whose dynamic segments run in tracks has a tracks section in its table, at
# Schedule.tracks:
#   TRACKS_COUNT  tracks
#   TRACKS_STATE  where the tracks' state lines start, TRACK_STRIDE apart (a line each):
#                 track k's TRACK_WORD is 2 x (its tasks done), + 1 while a thread holds
#                 it (runs its next tasks); its TRACK_OWNED is 1 once a thread made it its own in
#                 this run. Then per track JOINT_LINES lines for its joint step, a step
#                 cut in chunks that idle threads share: JOINT_SEQ (its number, written
#                 last), JOINT_STEP (its index) and JOINT_FIRST (its chunk c is the
#                 kernel's JOINT_FIRST + c, as JOB_FIRST) on the first; JOINT_CLAIM (its number
#                 << JOB_SHIFT | the next chunk to take) and JOINT_DONE (its chunks done)
#                 on lines of their own
#   then per track (TRACK_FIELDS): TRACK_TASKS, where its tasks start, and TRACK_COUNT
# A task: TASK_FIRST..TASK_LAST-1, its steps (a segment's), then a wait per track
# (TASK_WAITS + k: how many of track k's tasks must be done before it starts).
TRACKS_COUNT, TRACKS_STATE, TRACKS_HEADER = 0, 1, 2
TRACK_TASKS, TRACK_COUNT, TRACK_FIELDS = 0, 1, 2
TASK_FIRST, TASK_LAST, TASK_WAITS = 0, 1, 2
# int64s to a 64-byte cache line: the table is 64-byte aligned in a session, so fields that
# threads write apart are LINE_INT64S apart (the tracks' words, each step's scratch)
LINE_INT64S = 8
TRACK_WORD, TRACK_OWNED, TRACK_STRIDE = 0, 1, LINE_INT64S
JOINT_SEQ, JOINT_STEP, JOINT_CLAIM, JOINT_DONE, JOINT_LINES = 0, 1, 8, 16, 3
JOINT_FIRST = 2


def task_row(tracks: int) -> int:
    """Fields of a task in a schedule of `tracks` tracks."""
    return TASK_WAITS + tracks


def tracks_constants() -> str:
    """The tracks section's offsets, as source for the dispatcher."""
    return (
        "# a schedule's tracks section (catbp_jit/abi.py)\n"
        f"TRACKS_COUNT, TRACKS_STATE, TRACKS_HEADER = {TRACKS_COUNT}, {TRACKS_STATE}, {TRACKS_HEADER}\n"
        f"TRACK_TASKS, TRACK_COUNT, TRACK_FIELDS = {TRACK_TASKS}, {TRACK_COUNT}, {TRACK_FIELDS}\n"
        f"TASK_FIRST, TASK_LAST, TASK_WAITS = {TASK_FIRST}, {TASK_LAST}, {TASK_WAITS}\n"
        f"TRACK_WORD, TRACK_OWNED, TRACK_STRIDE = {TRACK_WORD}, {TRACK_OWNED}, {TRACK_STRIDE}\n"
        f"JOINT_SEQ, JOINT_STEP, JOINT_CLAIM, JOINT_DONE, JOINT_LINES = {JOINT_SEQ}, {JOINT_STEP}, "
        f"{JOINT_CLAIM}, {JOINT_DONE}, {JOINT_LINES}\n"
        f"JOINT_FIRST = {JOINT_FIRST}\n"
    )
