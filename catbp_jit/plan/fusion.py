"""Fusion: group the graph's computing nodes into segments, one kernel launch each.

A segment computes, for every element of its output,

    out[o] = ⊕_{r}  leaf_0[o, r] ⊗ leaf_1[o, r] ⊗ ... ⊗ leaf_k[o, r]     (then NORMALIZE)

over a loop space of output axes `o` and reduced axes `r`, each leaf aligned to that space
by axis key. One form covers a CONTRACT (no reduced axes), an ELIMINATE (one leaf), a
CONTRACT fused into the ELIMINATE that reads it (the product is never materialized), a
left-deep chain of CONTRACTs (CONTRACT(CONTRACT(a, b), c) multiplies ((a ⊗ b) ⊗ c), the
order the program wrote, so flattening it changes no rounding), a CONTRACT that is the
second input of its one reader (CONTRACT(a, CONTRACT(b, c)) multiplies a ⊗ (b ⊗ c), which
⊗'s commutativity makes ((b ⊗ c) ⊗ a), bit for bit: leaves b, c, a), a copy, and a
NORMALIZE fused into its producer. Views are not segments: a leaf that is a view is read through its
base value with the view's alignment, which is again alignment by key.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.ops import SlotKey
from ..ir.schema import Axis, TensorSpec, element_count
from .graph import CONTRACT, ELIMINATE, NORMALIZE, SLOT_IN, VIEW, Graph

MAX_READERS = 3  # a product is recomputed by at most this many readers
MAX_RECOMPUTED = 3  # ... and only if it multiplies at most this many leaves
# ... or this many, if it has at most SMALL_PRODUCT elements (2 MiB of float64, about a
# core's L2): its leaves are then read from the caches, where writing it out and reading
# it back costs more. grid6_d2 (products of up to 1 MiB): 3.11-3.16 -> 2.80-2.97 ms a run,
# the same bits (a sum's order does not depend on what is fused into it: plan/schedule.py).
# Bigger ones stay at 3: grid5_d3 recomputing its 115 MB products of 4 leaves ran 2-4%
# faster but its arena grew 523 -> 639 MB (more of them live at once)
MAX_RECOMPUTED_SMALL = 4
SMALL_PRODUCT = 1 << 18
# A larger product of at most MAX_RECOMPUTED_SMALL leaves that is mostly a broadcast of
# them (this many times their elements or more) is recomputed by all its readers: they
# multiply a few cached elements each instead of reading it from memory. grid5_d3's
# 38 MB products of four 3-9 element inputs, written (2.3 ms each) and read by two to
# four steps: exact run 189-193 -> 172 ms, reassociating 143-146 -> 130-133 ms
BROADCAST = 16
# A segment multiplies at most max_leaves leaves (PlanOptions, default 8). A wider product
# (a clique with many children) becomes a chain of partial products, materialized in turn,
# ((l0 ⊗ … ⊗ l7) ⊗ l8 ⊗ …): the same left-to-right order, so the same rounding. A kernel
# keeps its leaves' offsets in arrays of abi.MAX_LEAVES (codegen/cpu.py, cuda.py).
DEFAULT_MAX_LEAVES = 8


@dataclass(frozen=True)
class Segment:
    out: int  # the value it writes
    out_spec: TensorSpec
    red_axes: tuple[Axis, ...]  # reduced axes; the loop space is out_spec.axes + red_axes
    leaves: tuple[int, ...]  # materialized values, in ⊗ order (one may appear twice)
    reduce: bool  # an ELIMINATE is part of it (even if every reduced axis has size 1)
    normalize: bool
    nodes: tuple[int, ...]  # the graph nodes it computes, for listings
    # a normalizing segment may also write each group's total, the value its NORMALIZE
    # divides by, as this value (plan/totals.py); None: it does not
    total: int | None = None

    @property
    def writes(self) -> tuple[int, ...]:
        """The values it writes: its output, and its totals if it keeps them."""
        return (self.out,) if self.total is None else (self.out, self.total)


@dataclass
class Fused:
    """What the memory planner needs: the segments in order and every value's spec/kind."""

    segments: list[Segment]
    specs: dict[int, TensorSpec]  # every materialized value
    kinds: dict[int, str]  # value -> FACTOR | SELECTOR | SLOT_IN | UNIT | "computed"
    attrs: dict[int, object]  # input values -> factor id / selector id / slot key
    outputs: dict[SlotKey, int]
    semiring: str
    output_specs: dict[SlotKey, TensorSpec] = field(default_factory=dict)  # as the slot shows it


def base_of(g: Graph, nid: int) -> int:
    """The materialized value a view reads (views of views included)."""
    while g.nodes[nid].op == VIEW:
        nid = g.nodes[nid].inputs[0]
    return nid


def _broadcast(g: Graph, nid: int) -> bool:
    """Whether a product is a large broadcast of small inputs (BROADCAST times their
    elements or more, beyond SMALL_PRODUCT)."""
    node = g.nodes[nid]
    inputs = sum(element_count(g.nodes[base_of(g, i)].spec) for i in node.inputs)
    return element_count(node.spec) > SMALL_PRODUCT and element_count(node.spec) >= BROADCAST * inputs


def fuse(g: Graph, max_leaves: int = DEFAULT_MAX_LEAVES, second_inputs: bool = True) -> Fused:
    """second_inputs: inline a product into its one reader that takes it second (above).
    Both modes do (the reassociating mode then regroups the segments, plan/reassociate.py);
    False is for comparing plans."""
    consumers = g.consumers()
    outputs = set(g.outputs.values())
    users: dict[int, list[int]] = {nid: [] for nid in g.nodes}
    for node in g.nodes.values():
        for i in node.inputs:
            users[i].append(node.id)

    # A CONTRACT is computed inside the segments that read it when every reader takes it
    # as its first input (an ELIMINATE, or a CONTRACT that multiplies it first: flattening
    # keeps the product's left-to-right order). With one reader that is plain fusion; with
    # a few readers a small product is recomputed rather than written out and read back,
    # which is cheaper when it is large.
    inline: dict[int, bool] = {}
    n_leaves: dict[int, int] = {}
    for nid, node in g.nodes.items():
        if node.op != CONTRACT:
            continue
        first = node.inputs[0]
        n_leaves[nid] = (n_leaves[first] if inline.get(first) else 1) + len(node.inputs) - 1
        readers = [g.nodes[u] for u in users[nid]]
        first_use = all(
            u.inputs[0] == nid and nid not in u.inputs[1:] and u.op in (CONTRACT, ELIMINATE) for u in readers
        )
        most = MAX_RECOMPUTED_SMALL if element_count(node.spec) <= SMALL_PRODUCT else MAX_RECOMPUTED
        few_readers = len(readers) == 1 or (len(readers) <= MAX_READERS and n_leaves[nid] <= most)
        few_readers = few_readers or (n_leaves[nid] <= MAX_RECOMPUTED_SMALL and _broadcast(g, nid))
        inline[nid] = nid not in outputs and bool(readers) and first_use and few_readers

    # A CONTRACT that its one reader, a CONTRACT, takes second is computed inside it too,
    # first, when the reader's first input is a plain leaf: (a ⊗ (b ⊗ c)) = ((b ⊗ c) ⊗ a)
    # bit for bit (IEEE multiplication and addition commute, and so do the int and bool
    # ⊗; only which of two NaN operands' payloads survives may change). A product of big
    # cliques that one message reads is then never written out and read back (grid5_d3:
    # 115 MB each). Its reader must not be recomputed by several readers of its own: that
    # would recompute this product too.
    second: set[int] = set()
    for nid, node in g.nodes.items():
        if not second_inputs or node.op != CONTRACT or inline.get(nid) or nid in outputs:
            continue
        if len(users[nid]) != 1:
            continue
        reader = g.nodes[users[nid][0]]
        if reader.op != CONTRACT or len(reader.inputs) < 2 or reader.inputs[1] != nid:
            continue
        first = reader.inputs[0]
        if first == nid or nid in reader.inputs[2:] or inline.get(first) or first in second:
            continue
        if inline.get(reader.id) and len(users[reader.id]) > 1:
            continue
        second.add(nid)

    def inlined(nid: int) -> bool:
        return inline.get(nid, False)

    def leaves_of(nid: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(leaves, nodes) of a CONTRACT, expanding an inlined first or second input."""
        node = g.nodes[nid]
        first, rest = node.inputs[0], node.inputs[1:]
        if inlined(first):
            leaves, nodes = leaves_of(first)
        elif rest and rest[0] in second:  # ((b ⊗ c) ⊗ a) for a ⊗ (b ⊗ c)
            leaves, nodes = leaves_of(rest[0])
            leaves, rest = leaves + (base_of(g, first),), rest[1:]
        else:
            leaves, nodes = (base_of(g, first),), ()
        return leaves + tuple(base_of(g, r) for r in rest), nodes + (nid,)

    segments: list[Segment] = []
    by_out: dict[int, int] = {}  # value -> index of the segment writing it
    partial_specs: dict[int, TensorSpec] = {}
    next_id = max(g.nodes, default=-1) + 1  # values made here: partial products, copies

    def narrow(leaves: tuple[int, ...], space: tuple[Axis, ...], nodes) -> tuple[int, ...]:
        """At most max_leaves leaves: the first ones become partial-product segments."""
        nonlocal next_id
        while len(leaves) > max_leaves:
            head = leaves[:max_leaves]
            head_specs = [partial_specs[v] if v in partial_specs else g.nodes[v].spec for v in head]
            spec = TensorSpec(
                tuple(
                    ax
                    for ax in space
                    if any(s.has_key(ax.key) and s.get_axis(ax.key).size == ax.size for s in head_specs)
                )
            )
            partial_specs[next_id] = spec
            by_out[next_id] = len(segments)
            segments.append(Segment(next_id, spec, (), head, False, False, nodes))
            leaves = (next_id,) + leaves[max_leaves:]
            next_id += 1
        return leaves

    for nid, node in g.nodes.items():
        if node.op == CONTRACT and not inlined(nid) and nid not in second:
            leaves, nodes = leaves_of(nid)
            leaves = narrow(leaves, node.spec.axes, nodes)
            seg = Segment(nid, node.spec, (), leaves, False, False, nodes)
        elif node.op == ELIMINATE:
            src = node.inputs[0]
            src_spec = g.nodes[src].spec
            if inlined(src):
                leaves, nodes = leaves_of(src)
            else:
                leaves, nodes = (base_of(g, src),), ()
            kept = set(node.spec.keys)
            red = tuple(ax for ax in src_spec.axes if ax.key not in kept)
            leaves = narrow(leaves, src_spec.axes, nodes)
            seg = Segment(nid, node.spec, red, leaves, True, False, nodes + (nid,))
        elif node.op == NORMALIZE:
            src = node.inputs[0]
            if src in by_out and consumers[src] == 1 and src not in outputs:
                # the producer's segment becomes this one, in place (by index: a search
                # of the list would make fusion quadratic in the program's length)
                at = by_out.pop(src)
                old = segments[at]
                segments[at] = Segment(
                    nid, old.out_spec, old.red_axes, old.leaves, old.reduce, True, old.nodes + (nid,)
                )
                by_out[nid] = at
                continue
            seg = Segment(nid, node.spec, (), (base_of(g, src),), False, True, (nid,))
        else:
            continue  # inputs, units and views are not computed by kernels
        by_out[nid] = len(segments)
        segments.append(seg)

    specs: dict[int, TensorSpec] = {}
    kinds: dict[int, str] = {}
    attrs: dict[int, object] = {}
    for seg in segments:
        specs[seg.out], kinds[seg.out] = seg.out_spec, "computed"
    for seg in segments:
        for leaf in seg.leaves:
            if leaf not in by_out:  # an input or a constant
                node = g.nodes[leaf]
                specs[leaf], kinds[leaf], attrs[leaf] = node.spec, node.op, node.attr

    # Every slot result must be a value of its own in the slot arena. A result that is a
    # view of a computed value with the same elements in the same order is that value
    # (stored in the slot arena); other views, inputs and constants get a copy segment.
    final: dict[SlotKey, int] = {}
    out_specs: dict[SlotKey, TensorSpec] = {}
    copies: dict[int, int] = {}
    for key, nid in g.outputs.items():
        node = g.nodes[nid]
        out_specs[key] = node.spec
        base = base_of(g, nid)
        if node.op == SLOT_IN or nid in by_out:
            final[key] = nid
            if node.op == SLOT_IN:
                specs[nid], kinds[nid], attrs[nid] = node.spec, SLOT_IN, node.attr
            continue
        if base in by_out and _same_order(node.spec, g.nodes[base].spec):
            final[key] = base
            continue
        if nid not in copies:
            if base not in by_out:
                bnode = g.nodes[base]
                specs[base], kinds[base], attrs[base] = bnode.spec, bnode.op, bnode.attr
            copies[nid] = next_id
            segments.append(Segment(next_id, node.spec, (), (base,), False, False, (nid,)))
            specs[next_id], kinds[next_id] = node.spec, "computed"
            next_id += 1
        final[key] = copies[nid]
    return Fused(segments, specs, kinds, attrs, final, g.semiring, out_specs)


def _same_order(a: TensorSpec, b: TensorSpec) -> bool:
    """Same elements at the same flat positions: equal non-singleton axes, in order."""

    def big(spec):
        return [(ax.key, ax.size) for ax in spec.axes if ax.size > 1]

    return big(a) == big(b)
