"""Split reductions (PlanOptions.split_reductions, reassociating mode only; on by default
there on the CPU and CUDA targets, but not for the front end's models on the CPU:
executable.model_options): a segment that sums many terms into few outputs becomes two.

A segment computes out[o] = ⊕_r term(o, r). When it has few outputs and many terms per
output, a GPU gives it one thread per output and most of the device idles, and a CPU
core adds each output's terms one after another: a float sum in order is one chain of
dependent additions (~4 cycles each), which the CPU kernels overlap 8 outputs at a time
(abi.LANES) but not within one output. A sum to one output (a tensor's total, log Z) of
129 M terms took 227 ms on one x86-64 core, against 35 ms for its bytes. This pass keeps
some reduced axes k as outputs of a first segment, partial[o, k] = ⊕_{r'} term(o, k, r'),
and a second segment sums them, out[o] = ⊕_k partial[o, k]: G times as many outputs in the
heavy step (G the kept axes' product), each summing T / G terms, side by side and shared
among the threads. The targets set when it pays (PlanOptions.split_outputs_below and
split_min_terms): on the CPU, sums into fewer than 8 outputs of 2^20 terms or more each.

A segment that writes its NORMALIZE's total (plan/totals.py, which runs first) stays
whole: a tensor's scale, summed inside the pass that normalizes it, costs no pass of its
own, which a split would bring back (Grids_11: its 2^20-element scale split took the
normalization out of a GEMM step, +2 ms a solve).

The bit contract: both segments are ordinary segments of the plan, so every target runs
them with its ordinary kernels, in their ordinary order: the CPU and the CUDA target give
the same bits for a split plan (PROB, SAT and COUNT; LOGPROB within the tolerance of exp
and log), as they do for any plan. A split sum adds in another order than the fused one,
so PROB and LOGPROB differ from exact mode by rounding (SAT and COUNT do not: ⊕ is
associative there); that is why it needs exact=False. The decision depends on the plan
alone (sizes, never a launch shape or thread count), a batch axis counted as size 1, so
every bucket of a batched executable splits alike.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ..ir.schema import Axis, TensorSpec
from .fusion import Fused, Segment

# Split a segment whose outputs are fewer than this (work items in the heavy step: enough
# to fill a GPU's threads), when each sums at least `min_terms` terms
# (PlanOptions.split_min_terms); every partial then sums at least 1/PARTIAL_SHARE of them
# (fewer, and the second step costs about as much as it saves)
TARGET_ITEMS = 1 << 14
PARTIAL_SHARE = 64


def split_reductions(
    fused: Fused, batch_key: tuple | None = None, min_terms: int = 1 << 12, outputs_below: int = TARGET_ITEMS
) -> Fused:
    """`fused` with every segment that pays split in two (pure: the argument is not
    modified). Its partials are new "computed" values, workspace the memory planner frees
    after the second segment reads them."""
    next_id = max(list(fused.specs) + [s.out for s in fused.segments], default=-1) + 1
    segments: list[Segment] = []
    specs, kinds = dict(fused.specs), dict(fused.kinds)
    for seg in fused.segments:
        kept = kept_axes(seg, fused.specs, batch_key, min_terms, outputs_below)
        if not kept:
            segments.append(seg)
            continue
        partial, total = split(seg, kept, next_id, batch_key)
        specs[partial.out], kinds[partial.out] = partial.out_spec, "computed"
        segments += [partial, total]
        next_id += 1
    return replace(fused, segments=segments, specs=specs, kinds=kinds)


def kept_axes(
    seg: Segment,
    specs: dict[int, TensorSpec],
    batch_key: tuple | None,
    min_terms: int,
    outputs_below: int = TARGET_ITEMS,
) -> tuple[Axis, ...]:
    """The reduced axes a split keeps as the partials' outputs (none: not split, as a
    segment of outputs_below outputs or more, or of fewer than min_terms terms an output):
    the outermost ones of the segment's largest leaf first (a partial then reads a run of
    it), until there are TARGET_ITEMS partials or a partial would sum too few terms."""
    if not seg.reduce or not seg.leaves or seg.total is not None:
        return ()  # (a segment that writes its NORMALIZE's total, plan/totals.py, stays whole)
    outputs = math.prod(ax.size for ax in seg.out_spec.axes if ax.key != batch_key)
    terms = math.prod(ax.size for ax in seg.red_axes)
    if outputs >= min(outputs_below, TARGET_ITEMS) or terms < min_terms:
        return ()
    fewest = max(2, min_terms // PARTIAL_SHARE)  # terms a partial sums at least
    reduced = {ax.key: ax for ax in seg.red_axes if ax.size > 1}
    largest = max(seg.leaves, key=lambda v: math.prod(specs[v].shape))
    in_leaf = [reduced[ax.key] for ax in specs[largest].axes if ax.key in reduced]
    rest = [ax for ax in reduced.values() if ax not in in_leaf]
    kept: list[Axis] = []
    groups = 1
    for ax in in_leaf + rest:
        if terms // (groups * ax.size) < fewest:
            break
        kept.append(ax)
        groups *= ax.size
        if outputs * groups >= TARGET_ITEMS:
            break
    return tuple(kept)


def split(
    seg: Segment, kept: tuple[Axis, ...], value: int, batch_key: tuple | None
) -> tuple[Segment, Segment]:
    """(partial, total): the partials over the kept axes as value `value`, then the sum of
    them into the segment's own output (with its NORMALIZE)."""
    keys = {ax.key for ax in kept}
    out_axes = [ax for ax in seg.out_spec.axes if ax.key != batch_key]
    batch = [ax for ax in seg.out_spec.axes if ax.key == batch_key]
    spec = TensorSpec(tuple(out_axes + list(kept) + batch))  # a batch axis stays innermost
    partial = Segment(
        value,
        spec,
        tuple(ax for ax in seg.red_axes if ax.key not in keys),
        seg.leaves,
        True,
        False,
        seg.nodes,
    )
    total = Segment(seg.out, seg.out_spec, kept, (value,), True, seg.normalize, seg.nodes)
    return partial, total
