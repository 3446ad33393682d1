"""The targets an executable's kernels run on, one object each (base.py): `get(name)`
turns the name a user passes into its object."""

from __future__ import annotations

from .base import Built, Target
from .cpu import CPU
from .cuda import CUDA

__all__ = ["CPU", "CUDA", "NAMES", "Built", "Target", "get"]

_TARGETS = {t.name: t for t in (CPU, CUDA)}
NAMES = tuple(_TARGETS)  # ("cpu", "cuda"): what compile() and saved files accept


def get(name: str | Target) -> Target:
    """The target named `name` (a Target is returned as is)."""
    if isinstance(name, Target):
        return name
    try:
        return _TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"target {name!r} is not available (available: {', '.join(NAMES)})") from None
