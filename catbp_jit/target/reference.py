"""The reference target, the front end's only (compile_model(..., target="reference")): the
programs run in the reference VM (catbp_jit/reference/), interpreted, nothing compiled,
the oracle the compiled targets are checked against. compile() has no such target: it
builds no kernels and binds no session (base.py's methods say so)."""

from __future__ import annotations

from .base import Target

REFERENCE = Target("reference", compiled=False)
