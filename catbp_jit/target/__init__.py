"""The targets an executable's kernels run on, one object each (base.py): `get(name)`
turns the name a user passes into its object; `get_for_model(name)` also knows the front
end's reference target (reference.py)."""

from __future__ import annotations

from .base import Built, Target
from .cpu import CPU
from .cuda import CUDA
from .reference import REFERENCE

__all__ = ["CPU", "CUDA", "MODEL_NAMES", "NAMES", "REFERENCE", "Built", "Target", "get", "get_for_model"]

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


_MODEL_TARGETS = dict(_TARGETS, reference=REFERENCE)
# ("cpu", "cuda", "reference"): what compile_model() accepts, the JIT on the CPU or a GPU;
# the reference VM
MODEL_NAMES = tuple(_MODEL_TARGETS)


def get_for_model(name: str | Target) -> Target:
    """The target named `name` among the front end's (the reference VM's too)."""
    if isinstance(name, Target):
        return name
    try:
        return _MODEL_TARGETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"target must be one of {', '.join(MODEL_NAMES)}, got {name!r}") from None
