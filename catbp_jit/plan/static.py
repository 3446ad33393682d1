"""Partial evaluation: the segments whose inputs are all static run only when those change.

Inputs declared static at compile time (`static_factors=`, `static_selectors=`) keep their
values from run to run until a run gives a new one. A segment is static when every leaf
is a static input, a constant, or the output of a static segment: its result is the same
in every run until a static input is given again, so a session runs it once, then again
only in a run that gives a static input (session.py). Every other segment is dynamic and
runs in every run.

The schedule lists the static segments first, then the dynamic ones, each in program
order: a static segment never reads a dynamic value, so running all static segments
before all dynamic ones computes exactly what the program order does, kernel by kernel
(the same segments, layouts and loops: the same bits). A run that skips the static part
reads static values that an earlier run wrote, so those a dynamic segment reads
(`persistent_values`) get a region no other value shares (the "static" arena,
plan/arena.py): liveness alone would let a dynamic value of the previous run overwrite
them.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from .fusion import Fused
from .graph import FACTOR, SELECTOR, UNIT


@dataclass(frozen=True)
class StaticInputs:
    """The inputs declared static: factor ids and selector ids."""

    factors: frozenset[int] = frozenset()
    selectors: frozenset[int] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.factors or self.selectors)

    def holds(self, kind: str, ident: object) -> bool:
        """Whether the input of binding kind ("factor", "selector", "slot") is static."""
        return ident in {"factor": self.factors, "selector": self.selectors}.get(kind, ())


def static_values(fused: Fused, static: StaticInputs) -> set[int]:
    """The values a run need not recompute: static inputs, constants and the outputs of
    static segments (segments are in program order, so a leaf's writer comes first)."""
    known = {
        v
        for v, kind in fused.kinds.items()
        if kind == UNIT
        or (kind == FACTOR and fused.attrs[v] in static.factors)
        or (kind == SELECTOR and fused.attrs[v] in static.selectors)
    }
    for seg in fused.segments:
        if all(leaf in known for leaf in seg.leaves):
            known.update(seg.writes)
    return known


def static_first(fused: Fused, static: StaticInputs) -> tuple[Fused, int]:
    """The segments reordered static first (each part in program order), and how many
    are static. Without static inputs: `fused` unchanged, 0."""
    if not static:
        return fused, 0
    known = static_values(fused, static)
    first = [seg for seg in fused.segments if seg.out in known]
    rest = [seg for seg in fused.segments if seg.out not in known]
    return replace(fused, segments=first + rest), len(first)


def persistent_values(fused: Fused, n_static: int) -> set[int]:
    """Outputs of the first n_static segments (the static ones) that a dynamic segment
    reads: they must keep their values across runs."""
    static_outs = {v for seg in fused.segments[:n_static] for v in seg.writes}
    return {leaf for seg in fused.segments[n_static:] for leaf in seg.leaves if leaf in static_outs}


def check_static_ids(
    static: StaticInputs, fspecs: AbstractSet[int], sspecs: AbstractSet[int], names: str
) -> None:
    """Static ids must name declared inputs."""
    from ..errors import UnknownInputError

    for kind, ids, known in (("factor", static.factors, fspecs), ("selector", static.selectors, sspecs)):
        unknown = sorted(set(ids) - set(known))
        if unknown:
            raise UnknownInputError(
                f"programs [{names}]: static_{kind}s names {kind} id(s) {unknown} that have no {kind} spec"
            )
