"""Shared by the JIT tests: executables compiled once per process, and a bundle's inputs."""

import numpy as np

import catbp_jit

_EXECUTABLES = {}


def executable(bundle, mode):
    """Compiled once per process (kernels come from the memo or the session's disk cache)."""
    key = (bundle.name, mode)
    if key not in _EXECUTABLES:
        _EXECUTABLES[key] = catbp_jit.compile(
            bundle.programs, bundle.semiring_runtime(), factor_specs=bundle.factor_specs(),
            selector_specs=bundle.selector_specs(), mode=mode)
    return _EXECUTABLES[key]


def inputs(bundle):
    """The bundle's factors and selectors in the semiring dtype, as Session.run wants them."""
    dt = bundle.dtype
    return ({f: np.ascontiguousarray(a, dtype=dt) for f, (a, _) in bundle.factors.items()},
            {s: np.ascontiguousarray(a, dtype=dt) for s, (a, _) in bundle.selectors.items()})
