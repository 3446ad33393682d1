"""How much memory a plan may take: one limit, used by the front end and by compile().

A plan whose tensors cannot all be allocated is refused before anything is compiled,
naming the bytes it needs and the limit, instead of dying later in numpy's allocator.
The default limit is the memory the system says is available now (MemAvailable on Linux,
physical pages elsewhere); `CATBP_JIT_MAX_BYTES` overrides it.
"""

from __future__ import annotations

import os
from decimal import Decimal

from . import environment
from .errors import CatbpError


class PlanTooLargeError(CatbpError, MemoryError):
    """A plan that needs more memory than the limit allows; nothing was allocated."""


def available_memory_bytes() -> int:
    """The memory available to this process now, in bytes (best effort, never 0)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 34  # unknown platform: 16 GiB


def memory_limit(limit: int | None = None) -> int:
    """The byte limit for one plan: `limit` if given, else CATBP_JIT_MAX_BYTES, else the
    available memory."""
    if limit is not None:
        return int(limit)
    env = environment.max_bytes()
    return env if env is not None else available_memory_bytes()


def format_bytes(n: int) -> str:
    """2.00 GiB; a count of bytes past float64's range as 2.70e+67 GiB (exact ints of a
    refused plan can have hundreds of digits, so no float division)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = Decimal(int(n)) / size
            return f"{value:.2f} {unit}" if value < 10**15 else f"{value:.2e} {unit}"
    return f"{n} B"
