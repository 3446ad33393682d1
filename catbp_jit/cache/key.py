"""What names a kernel on disk: ``kernel_key`` hashes its pattern identity, its target and
the compile environment (``environment_identity``: versions, CPU, codegen version); and
where the cache lives by default."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from functools import cache
from pathlib import Path
from typing import Any

import llvmlite
import llvmlite.binding as llvm
import numba
import numpy
from numba.core import config as numba_config

from .. import environment
from ..codegen.intrinsics import target_features

# Bump to invalidate every cache entry (e.g. when the generated code's conventions change).
CODEGEN_VERSION = "1"

# The modules a kernel's source imports (intrinsics, lines, math, atomics) and the ABI
# constants they re-export: compiled into the kernel, yet not in its source's digest. A
# change to one of them changes every key (their digest is part of the environment), so a
# cache never serves machine code built from an older version of them.
HELPERS = ("abi.py", "codegen/intrinsics.py", "codegen/lines.py", "codegen/libm.py", "codegen/atomics.py")


@cache
def helpers_digest() -> str:
    """sha256 of the HELPERS' sources, in order (an install without them: of the
    package's version instead)."""
    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    try:
        for name in HELPERS:
            digest.update(name.encode() + b"\0" + (package / name).read_bytes() + b"\0")
    except OSError:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return "version " + version("catbp_jit")
        except PackageNotFoundError:
            return "unknown"
    return digest.hexdigest()


@cache
def _static_environment() -> tuple[tuple[str, Any], ...]:
    # Host CPU queries cost a few ms; the answer cannot change within a process.
    # (the ignores: numba.core.config makes its settings at import time, from the environment)
    cpu_name = numba_config.CPU_NAME or llvm.get_host_cpu_name()  # type: ignore[attr-defined]
    return (
        ("python", platform.python_implementation() + " " + platform.python_version()),
        ("platform", sys.platform + "-" + platform.machine()),
        ("numba", numba.__version__),
        ("llvmlite", llvmlite.__version__),
        ("numpy", numpy.__version__),
        ("cpu_name", cpu_name),
        ("cpu_features", target_features()),
        ("codegen_helpers", helpers_digest()),
    )


def environment_identity(*, codegen_version: str | None = None) -> dict:
    """What compiled code depends on besides its source: versions, CPU, codegen version
    (``codegen_version``, default CODEGEN_VERSION: tests name another to see a bump)."""
    env = dict(_static_environment())
    # read now, so a bump takes effect at once
    env["codegen_version"] = CODEGEN_VERSION if codegen_version is None else codegen_version
    return env


def _canonical_json(obj: Any) -> str:
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TypeError(f"kernel pattern must be plain JSON data: {e}") from None


def kernel_key(pattern: dict, target: str = "cpu", *, codegen_version: str | None = None) -> str:
    """sha256 hex of (codegen version, pattern, target, environment identity); the codegen
    version is CODEGEN_VERSION unless ``codegen_version`` names another."""
    version = CODEGEN_VERSION if codegen_version is None else codegen_version
    payload = _canonical_json([version, pattern, target, environment_identity(codegen_version=version)])
    return hashlib.sha256(payload.encode("ascii")).hexdigest()


def default_cache_dir() -> str:
    """$CATBP_JIT_CACHE_DIR, else the platform's user cache directory."""
    env = environment.cache_dir()
    if env:
        return env
    home = os.path.expanduser("~")
    if sys.platform == "win32":  # pragma: no cover
        base = os.environ.get("LOCALAPPDATA") or os.path.join(home, "AppData", "Local")
        return os.path.join(base, "catbp_jit", "Cache")
    if sys.platform == "darwin":  # pragma: no cover
        return os.path.join(home, "Library", "Caches", "catbp_jit")
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(home, ".cache")  # XDG spec
    return os.path.join(base, "catbp_jit")
