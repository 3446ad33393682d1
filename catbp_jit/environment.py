"""Every environment variable catbp_jit reads, read and checked here, one function each.

Each function reads its variable when called (so a change to os.environ takes effect at
the next use) and returns None when it is unset or blank, leaving the default to the
caller. A value that cannot be used raises EnvironmentSettingError naming the variable,
the value and what is accepted: never a traceback from deep inside, never a silent
default. The command line calls check_all() before any subcommand, so a bad setting is
one line and exit status 2 whatever the subcommand.

This module imports nothing heavy: the kernel cache, the readers and the command line
all read their settings through it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from decimal import Decimal, InvalidOperation

from .errors import CatbpError, clip

CACHE_POLICIES = ("fallback", "strict", "off")
_INT64_MAX = 2**63 - 1  # byte counts and sizes are int64 throughout
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_BYTES = f"a whole number of bytes from 1 to {_INT64_MAX} (such as 8000000000 or 8e9)"


class EnvironmentSettingError(CatbpError, ValueError):
    """An environment variable set to a value catbp_jit cannot use."""

    def __init__(self, name: str, value: str, accepted: str):
        self.name, self.value, self.accepted = name, value, accepted
        # a value can be a megabyte long: the message shows its start
        super().__init__(f"environment variable {name}={clip(value)!r}: expected {accepted}")


def _text(name: str) -> str | None:
    """The variable's value stripped, or None when it is unset or blank."""
    value = os.environ.get(name)
    return value.strip() if value and value.strip() else None


def _number(name: str, text: str, accepted: str) -> Decimal:
    """A finite decimal (Decimal: "1e400" is a number, not an overflow)."""
    try:
        number = Decimal(text)
    except InvalidOperation:
        raise EnvironmentSettingError(name, os.environ[name], accepted) from None
    if not number.is_finite():
        raise EnvironmentSettingError(name, os.environ[name], accepted)
    return number


def _whole(name: str, low: int, accepted: str) -> int | None:
    text = _text(name)
    if text is None:
        return None
    number = _number(name, text, accepted)
    if number != number.to_integral_value() or not low <= number <= _INT64_MAX:
        raise EnvironmentSettingError(name, os.environ[name], accepted)
    return int(number)


def _path(name: str) -> str | None:
    text = _text(name)
    return None if text is None else os.path.abspath(os.path.expanduser(text))


def cache_policy() -> str | None:
    """CATBP_JIT_CACHE: the kernel cache policy (catbp_jit/cache/kernel_cache.py)."""
    text = _text("CATBP_JIT_CACHE")
    if text is None:
        return None
    if text.lower() not in CACHE_POLICIES:
        raise EnvironmentSettingError(
            "CATBP_JIT_CACHE", os.environ["CATBP_JIT_CACHE"], "one of " + ", ".join(CACHE_POLICIES)
        )
    return text.lower()


def cache_dir() -> str | None:
    """CATBP_JIT_CACHE_DIR: the kernel cache directory, absolute."""
    return _path("CATBP_JIT_CACHE_DIR")


def key_file() -> str | None:
    """CATBP_JIT_KEY_FILE: the key that signs the cache's manifests, absolute."""
    return _path("CATBP_JIT_KEY_FILE")


def lock_timeout() -> float | None:
    """CATBP_JIT_LOCK_TIMEOUT: seconds to wait for a kernel's lock."""
    text = _text("CATBP_JIT_LOCK_TIMEOUT")
    if text is None:
        return None
    # the most a thread lock's wait takes (about 292 years); inf would overflow it
    accepted = f"a number of seconds from 0 to {threading.TIMEOUT_MAX:.0f}"
    seconds = _number("CATBP_JIT_LOCK_TIMEOUT", text, accepted)
    if not 0 <= seconds <= Decimal(threading.TIMEOUT_MAX):
        raise EnvironmentSettingError(
            "CATBP_JIT_LOCK_TIMEOUT", os.environ["CATBP_JIT_LOCK_TIMEOUT"], accepted
        )
    return float(seconds)


def trusted_cache() -> bool:
    """CATBP_JIT_TRUSTED_CACHE: whether another user's cache directory is trusted."""
    text = _text("CATBP_JIT_TRUSTED_CACHE")
    if text is None or text.lower() in _FALSE:
        return False
    if text.lower() in _TRUE:
        return True
    raise EnvironmentSettingError(
        "CATBP_JIT_TRUSTED_CACHE",
        os.environ["CATBP_JIT_TRUSTED_CACHE"],
        f"{', '.join(_TRUE)} (trusted) or {', '.join(_FALSE)}",
    )


def max_bytes() -> int | None:
    """CATBP_JIT_MAX_BYTES: the most memory one plan may take (catbp_jit/memory.py)."""
    return _whole("CATBP_JIT_MAX_BYTES", 1, _BYTES)


def max_input_bytes() -> int | None:
    """CATBP_JIT_MAX_INPUT_BYTES: the most (decompressed) bytes a model reader accepts."""
    return _whole("CATBP_JIT_MAX_INPUT_BYTES", 1, _BYTES)


def compile_workers() -> int | None:
    """CATBP_JIT_COMPILE_WORKERS: processes that compile cold kernels (0 or 1: none)."""
    return _whole(
        "CATBP_JIT_COMPILE_WORKERS",
        0,
        "a whole number of worker processes, 0 or more (0 or 1: compile in the calling process)",
    )


TIERS = ("auto", "compiled")


def tier() -> str | None:
    """CATBP_JIT_TIER: whether compile() may answer from numpy while kernels compile
    ("auto") or waits for them ("compiled"): catbp_jit/tiers.py."""
    text = _text("CATBP_JIT_TIER")
    if text is None:
        return None
    if text.lower() not in TIERS:
        raise EnvironmentSettingError(
            "CATBP_JIT_TIER", os.environ["CATBP_JIT_TIER"], "one of " + ", ".join(TIERS)
        )
    return text.lower()


def progress_after() -> float | None:
    """CATBP_JIT_PROGRESS_AFTER: seconds a command works before it shows progress lines
    (catbp_jit/progress.py; 0: from the start)."""
    text = _text("CATBP_JIT_PROGRESS_AFTER")
    if text is None:
        return None
    accepted = "a number of seconds, 0 or more"
    seconds = _number("CATBP_JIT_PROGRESS_AFTER", text, accepted)
    if seconds < 0 or seconds > Decimal(threading.TIMEOUT_MAX):  # (a timer waits this long)
        raise EnvironmentSettingError(
            "CATBP_JIT_PROGRESS_AFTER", os.environ["CATBP_JIT_PROGRESS_AFTER"], accepted
        )
    return float(seconds)


def bnlearn_dir() -> str | None:
    """CATBP_JIT_BNLEARN_DIR: where the bnlearn networks are kept."""
    return _path("CATBP_JIT_BNLEARN_DIR")


# Every variable and its reader: check_all() reads them all.
READERS: dict[str, Callable[[], object]] = {
    "CATBP_JIT_CACHE": cache_policy,
    "CATBP_JIT_CACHE_DIR": cache_dir,
    "CATBP_JIT_KEY_FILE": key_file,
    "CATBP_JIT_LOCK_TIMEOUT": lock_timeout,
    "CATBP_JIT_TRUSTED_CACHE": trusted_cache,
    "CATBP_JIT_MAX_BYTES": max_bytes,
    "CATBP_JIT_MAX_INPUT_BYTES": max_input_bytes,
    "CATBP_JIT_COMPILE_WORKERS": compile_workers,
    "CATBP_JIT_TIER": tier,
    "CATBP_JIT_PROGRESS_AFTER": progress_after,
    "CATBP_JIT_BNLEARN_DIR": bnlearn_dir,
}


def check_all() -> None:
    """Raise EnvironmentSettingError for the first variable set to a value not accepted."""
    for read in READERS.values():
        read()
