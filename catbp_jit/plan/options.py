"""The planner's knobs, as one frozen object handed down the pipeline (no module globals).

The defaults are what the CPU target was tuned with; a target may ask for others (CUDA
wants 256-byte-aligned regions, the transaction size of its memory).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..abi import MAX_LEAVES
from ..ir.validate import DEFAULT_MAX_BYTES

# a vector's offset tables are walked in pieces of the kernels' stack buffer; keep them
# within a few pieces
BUFFER_LIMIT = 4096

# byte alignment of every arena and region: a cache line and the CPU's widest vector
# (AVX-512); CUDA's allocator hands out 256-byte aligned blocks
ALIGN_BYTES = 64


@dataclass(frozen=True)
class PlanOptions:
    # a product of more leaves is split into a chain of partial products (a kernel keeps
    # per-leaf offsets in arrays of abi.MAX_LEAVES; fewer leaves, shorter per-step loops)
    max_leaves: int = 8
    # a loop step is cut into chunks that the CPU threads share (codegen/dispatch.py) when
    # it has this much work (elements x reduced elements x leaves: ~50 us on one core),
    # each chunk half of it at least, `chunks` at most. A chunk is taken by whichever
    # thread comes first and the dispatcher never waits for a thread that took none, so
    # a busy machine costs such a step little (pool.py)
    parallel_min_work: int = 1 << 16
    chunks: int = 64
    # a GEMM step shares its batch among the threads (OpenMP, through Numba's prange) at
    # this much work: each of its parallel regions costs ~44 us to wake the threads (they
    # wait passively: a spinning thread on a busy machine cost 10-40x), and far more when
    # the machine is busy, as a region waits for every thread's time slice
    gemm_parallel_min_work: int = 1 << 22
    # a GEMM step of large products (each on BLAS's threads) shares its copies and NORMALIZE
    # passes among the threads where it moves this many elements (copied and written):
    # Grids_16's 12 such steps took 192-217 ms with those on one thread, 181-195 ms
    # shared (one plan, two processes each), while ObjectDetection_11's 78 small ones
    # (copies of 0.16 M elements) went from 19 to 22-32 ms when every step shared them
    # (plan/gemm.py)
    gemm_threads_min_elements: int = 1 << 20
    # most elements of a kernel's vector when an operand is gathered along it (its offset
    # table has one entry per element), plan/loops.py
    block: int = 256
    # the vector of reducing segments: "reduced", "outputs", "both" (plan/loops.py; "both"
    # where a segment's inner axes allow it, else "outputs"), or None for the cheapest by
    # the cost model. Results are bit-identical whichever it is.
    across: str | None = None
    # a step copies its small gathered leaves into its workspace in its vector's order
    # first, and reads the copies contiguous (plan/repack.py): a CPU kernel's prologue, so
    # the CUDA target turns it off; bit-identical either way
    repack: bool = True
    # ... a leaf whose copy has at most this many elements (2 MiB of float64, a core's L2
    # here: the step reads it contiguous, which the hardware prefetches) and whose copied
    # elements the step reads at least repack_min_reuse times each (so the copy costs
    # little next to what it saves). Measured, same process: (2^16, 2) against (2^15, 4)
    # ran grid6_d2 6.08 against 6.32 ms, grid4x8 0.69 against 0.71, grid5_d3 322 against
    # 329; a reuse of 8 was slower. 2^18 against 2^16 (alternating processes): grid5_d3
    # 183-186 against 187-188 ms (exact), 227 against 235 (reassociating), LOGPROB 338
    # against 343-346; grid6_d2 and grid4x8 the same; 2^19 and 2^20 no better
    repack_max_elements: int = 1 << 18
    repack_min_reuse: int = 2
    # ... in a step of this many terms at least (output elements x reduced elements): below
    # that the repack step's own call costs about what its copies save. chain200's 394
    # repack steps (steps under 256 terms) gained nothing compiled and cost its loop mode
    # ~100 us a run; grid4x8 ran 4% slower with this bar at 4096 than at 256
    repack_min_terms: int = 1 << 8
    # a line kernel's GATHERED leaf (and a repack step's copy) whose whole lines each lie
    # in a window of 8 elements reads each line with one load and a permute, from a word
    # the plan packs per line (abi.window_words), instead of its V offsets; bit-identical
    # either way. Lines of 8-byte elements only
    window_words: bool = True
    # multiply a product's first leaves apart when they hold few of its axes
    # (plan/hoist.py); bit-identical either way
    hoist: bool = True
    # a segment that computes what an earlier one did, in another axis order, is not
    # computed again (plan/permuted.py); bit-identical either way
    twins: bool = True
    # a computed value is stored without the axes none of its leaves has, read with a
    # stride of 0 there (plan/narrowed.py); bit-identical either way
    narrow: bool = True
    # a step whose output has at least this many bytes and is written contiguous along its
    # vector writes it with non-temporal stores (abi.STREAMED): whole lines, not read from
    # memory first. About the last-level cache of a server (32 MiB here): a smaller output
    # may still be in the cache when the next step reads it. None: never (the CUDA target)
    streaming_store_bytes: int | None = 32 << 20
    # products are computed a cache line at a time in registers (codegen/cpu_lines.py,
    # schedule.in_lines), every one, with its NORMALIZE if it has one; so are the sums
    # across outputs where all of a schedule's can be (KernelPattern.sums_in_lines).
    # False: through a buffer, as contract_reduce's (the CUDA target; tests compare the two)
    line_products: bool = True
    # the dynamic segments of a CPU schedule are split into this many tracks that threads
    # walk side by side, where the estimate says it gains (plan/tracks.py); 1: never ...
    tracks: int = 2
    # ... or wherever the schedule allows it, whatever the estimate (for tests)
    tracks_always: bool = False
    # tracks' values in a pool of memory per track, where that plan is affordable
    # (plan/arena.track_fit): a workspace line is then written by one core only
    track_pools: bool = True
    # a sum into fewer outputs than abi.LANES of at least this many terms, one thread's
    # chain of additions, is moved to right after its inputs and priced as that chain, so
    # that the tracks run it beside the rest of the schedule (plan/early.py): the 12 x 12
    # 3-state grid's exact run, whose last marginal sums 129 M terms (230 ms), 508-552 ->
    # 395-418 ms. None: left in program order (and the tracks' estimate as before)
    chain_min_terms: int | None = 1 << 22
    align_bytes: int = ALIGN_BYTES
    max_bytes: int = DEFAULT_MAX_BYTES  # one tensor
    max_total_bytes: int | None = None  # all arenas (None: catbp_jit.memory.memory_limit())
    # exact: every segment multiplies and sums in the order the program wrote, so results
    # are the same bits in every mode and thread count. False (reassociating, opt-in):
    # products and sums may be regrouped as the semiring laws allow (plan/reassociate.py,
    # plan/gemm.py), so float results differ from exact mode by rounding only
    exact: bool = True
    # reassociating mode may run pairwise contractions as BLAS GEMM (plan/gemm.py): a
    # CPU kernel, so the CUDA target turns it off
    gemm: bool = True
    # ... copying an operand that is not a matrix in memory into the step's workspace (or
    # the products out of it) first: transpose, GEMM, transpose. Off: only products whose
    # operands are matrices already (the planner turns it off when the copies' workspace
    # would not fit the memory limit)
    gemm_copies: bool = True
    # ... in a program one of whose GEMM candidates has this many terms at least: the GEMM
    # kernel costs about a second to compile (once per cache directory), and contractions
    # smaller than this run about as fast in the loop kernels (grid5_d3's of 6,561 and
    # 19,683 terms: 43.4-45.3 ms a run as GEMM steps, 42.5-43.5 without; kernels ready
    # from fresh caches in 7.6-7.9 s with them, 6.1-6.3 s without). 1: any contraction
    # of gemm.MIN_WORK terms may be a GEMM step
    gemm_program_min_terms: int = 1 << 15
    # ... a result that a GEMM step writes or reads lies in memory as that step takes it
    # (plan/layout.py), and its slot is a view in its spec's order that is not C-contiguous
    # (Binding.view): a belief propagation's messages are results, and a copy of each of
    # ObjectDetection_11's largest (1.77 M elements) out of and into GEMM form took a
    # quarter of its solve. Off: every result lies in its spec's C order
    gemm_result_layouts: bool = True
    # reassociating mode: a loop step's PROB NORMALIZE sums its total in lanes and ranges
    # (codegen/totals.py: parts_total, as the GEMM steps' do), not in the elements' order:
    # a sum in order is one chain of dependent additions (4.2 M elements out of the caches:
    # 4.4 ms, 2.9 ms in lanes; Grids_16 normalizes 41 M elements a solve). Off: in order,
    # as exact mode (the CUDA target)
    lane_totals: bool = True
    # reassociating mode: a float64 PROB sum across reduced axes adds each output's terms
    # in the lanes of a line (KernelPattern.terms_in_lanes), not one after another: the 12
    # x 12 3-state grid's sums of 19,683 terms into 81 outputs 0.99-1.06 -> 0.75-0.76 ms.
    # Off: in order, as exact mode (the CUDA target)
    lane_sums: bool = True
    # a step cut in chunks whose PROB NORMALIZE divides at least this many elements (one
    # group: not a batch's rows) does it in chunks too (abi.SPLIT_FINISH): its total's
    # ranges (in lanes) and its division shared by the threads, where one thread did
    # both after every chunk. A sum of 4 terms to n outputs, normalized, two threads:
    # n = 8192 34 -> 27 us reassociating (35 -> 33 exact, whose total stays in order on
    # one thread), 16384 59 -> 38 us, 524288 1.36 -> 1.15 ms (1.48 -> 1.36 exact); the 12
    # x 12 3-state grid's reassociating sums of 531441 outputs 0.96-1.24 -> 0.78-1.05 ms.
    # None: on one thread always
    split_finish_min_elements: int | None = 1 << 13
    # reassociating mode: a reduction with few outputs and many terms each is split into
    # partial sums and their sum (plan/split.py), so a GPU has threads for it and a CPU
    # core more than one chain of additions; the CPU and CUDA targets give the same bits
    # for the split plan. Needs exact=False. On by default in that mode on both targets
    # (their reassociating_defaults), with the CPU's bars below
    split_reductions: bool = False
    # ... when an output sums at least this many terms (each partial then at least
    # 1/64 of them, and 2)
    split_min_terms: int = 1 << 12
    # ... in a segment of fewer outputs than this (at most 2^14: the partials a split aims
    # at). The CPU's kernels sum 8 outputs side by side (abi.LANES), so there only a sum
    # into fewer is one chain; its default is 8 with split_min_terms 2^20 (target/cpu.py)
    split_outputs_below: int = 1 << 14

    def __post_init__(self):
        if self.split_reductions and self.exact:
            raise ValueError(
                "PlanOptions: split_reductions sums in another order than the program "
                "wrote: it needs exact=False (the reassociating mode)"
            )
        if self.across not in (None, "reduced", "outputs", "both"):
            raise ValueError(
                f"PlanOptions: across must be None, 'reduced', 'outputs' or 'both', not {self.across!r}"
            )
        if not (isinstance(self.max_leaves, int) and 2 <= self.max_leaves <= MAX_LEAVES):
            raise ValueError(
                f"PlanOptions: max_leaves must be an int in 2..{MAX_LEAVES}, not {self.max_leaves!r}"
            )
        if isinstance(self.split_outputs_below, bool) or not (
            isinstance(self.split_outputs_below, int) and self.split_outputs_below >= 1
        ):
            raise ValueError(
                f"PlanOptions: split_outputs_below must be an int >= 1, not {self.split_outputs_below!r}"
            )
        if isinstance(self.split_min_terms, bool) or not (
            isinstance(self.split_min_terms, int) and self.split_min_terms >= 2
        ):
            raise ValueError(
                f"PlanOptions: split_min_terms must be an int >= 2, not {self.split_min_terms!r}"
            )
        for name in (
            "parallel_min_work",
            "chunks",
            "gemm_parallel_min_work",
            "gemm_threads_min_elements",
            "gemm_program_min_terms",
            "repack_max_elements",
            "repack_min_reuse",
            "repack_min_terms",
            "tracks",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, int) and value >= 1):
                raise ValueError(f"PlanOptions: {name} must be an int >= 1, not {value!r}")
        if self.streaming_store_bytes is not None and (
            isinstance(self.streaming_store_bytes, bool)
            or not isinstance(self.streaming_store_bytes, int)
            or self.streaming_store_bytes < 0
        ):
            raise ValueError(
                "PlanOptions: streaming_store_bytes must be None or an int >= 0, not "
                f"{self.streaming_store_bytes!r}"
            )
        if not (isinstance(self.block, int) and 1 <= self.block <= BUFFER_LIMIT):
            raise ValueError(f"PlanOptions: block must be an int in 1..{BUFFER_LIMIT}, not {self.block!r}")

    def with_(self, **fields) -> PlanOptions:
        return replace(self, **fields)
