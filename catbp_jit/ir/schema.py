"""Axes and tensor specs: the shapes of CatBP values, with semantic axis labels.

Names and enum values follow the CatBP IR specification (docs/ir.md), so that a
program written against CatBP reads the same here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class AxisType(Enum):
    GEOMETRIC = 1  # a variable axis (VarID)
    TOPOLOGICAL = 2  # a mode axis (ModeID): a separate id namespace from variables

    # Axis keys are dict keys everywhere in planning: Enum's own __hash__ is Python code
    # (hash of the name), called millions of times for a long program. Members are
    # singletons, so the identity hash is as good, and runs in C.
    __hash__ = object.__hash__


AxisKey = tuple[AxisType, int]


@dataclass(frozen=True)
class Axis:
    id: int
    kind: AxisType
    size: int
    # (kind, id), made once: planning reads it millions of times. Not compared or shown.
    key: AxisKey = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "key", (self.kind, self.id))


@dataclass(frozen=True)
class TensorSpec:
    axes: tuple[Axis, ...]
    # axis key -> position, made once (see axis_pos). Not compared or shown.
    _pos: dict[AxisKey, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        # Accept any sequence of axes; store a tuple so specs hash and compare by value.
        if not isinstance(self.axes, tuple):
            object.__setattr__(self, "axes", tuple(self.axes))
        object.__setattr__(self, "_pos", {ax.key: i for i, ax in enumerate(self.axes)})

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(ax.size for ax in self.axes)

    @property
    def keys(self) -> tuple[AxisKey, ...]:
        return tuple(ax.key for ax in self.axes)

    @property
    def ndim(self) -> int:
        return len(self.axes)

    def axis_pos(self) -> dict[AxisKey, int]:
        """{axis key: position}; shared by every call (planning asks millions of times):
        read it, do not change it."""
        return self._pos

    def subset(self, keep_keys) -> TensorSpec:
        """The axes named in keep_keys, in keep_keys order; absent keys are skipped."""
        pos = self.axis_pos()
        return TensorSpec(tuple(self.axes[pos[k]] for k in keep_keys if k in pos))

    def has_key(self, key: AxisKey) -> bool:
        return key in self.axis_pos()

    def get_axis(self, key: AxisKey) -> Axis:
        pos = self.axis_pos()
        if key not in pos:
            raise KeyError(f"axis key {format_key(key)} not found in spec {self}")
        return self.axes[pos[key]]

    def __str__(self) -> str:
        return format_spec(self)


def element_count(spec: TensorSpec) -> int:
    """How many elements a tensor of this spec holds (1 for a 0-d spec)."""
    n = 1
    for ax in spec.axes:
        n *= ax.size
    return n


def format_key(key: AxisKey) -> str:
    """`G3` for (GEOMETRIC, 3), `T3` for (TOPOLOGICAL, 3): the listing's spelling."""
    kind, aid = key
    return f"{kind.name[0]}{aid}"


def format_spec(spec: TensorSpec) -> str:
    """`{G0: 2, T9: 3}`: axis key and size, in axis order."""
    return "{" + ", ".join(f"{format_key(ax.key)}: {ax.size}" for ax in spec.axes) + "}"
