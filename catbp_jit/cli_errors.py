"""What the command line reports on stderr as one line with exit status 2, no traceback:
CliError, raised by cli.py and by the front end's commands (frontend/commands.py)."""

from __future__ import annotations


class CliError(Exception):
    """An input problem to report on stderr with exit status 2 (no traceback)."""


def check_kernel_cache() -> None:
    """Before compiling: settings the kernel cache refuses are an input error, not a
    traceback."""
    from .cache import default_cache  # lazily: it loads numba

    try:
        default_cache()
    except ValueError as e:  # EnvironmentSettingError: the policy, the lock timeout...
        raise CliError(str(e)) from None
