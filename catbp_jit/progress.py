"""Progress lines for long compiles: a `progress` callable takes one line of text.

compile(), plan() and the front end call `progress(line)` at each stage and `tick(i)` of
a `ticker` inside long loops (planning a 10^5-variable chain lowers 10^5 segments). A
command hands down a `DelayedLines`, which writes nothing while the work is quick: a
line only once `after` seconds have passed (and then, once, the line of the stage still
running), so a fast compile stays silent.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from . import environment

Progress = Callable[[str], None]
DEFAULT_AFTER = 2.0  # seconds before a command shows any line
TICK_EVERY = 1.0  # seconds between two lines of one counting loop


def silent(line: str) -> None:
    """A progress callable that shows nothing."""


def ticker(
    progress: Progress | None, what: str, total: int, every: float = TICK_EVERY
) -> Callable[[int], None]:
    """tick(i) for a loop over `total` items: says "{what} i/total" at most once every
    `every` seconds (a plain list.append as `progress` is not flooded)."""
    if progress is None or progress is silent:
        return lambda i: None
    last = [time.monotonic()]

    def tick(i: int) -> None:
        now = time.monotonic()
        if now - last[0] >= every:
            last[0] = now
            progress(f"{what} {i:,}/{total:,}")

    return tick


def command_lines(quiet: bool, stream: TextIO | None = None) -> Progress:
    """The progress callable of a command: DelayedLines on stderr, after
    $CATBP_JIT_PROGRESS_AFTER seconds (default DEFAULT_AFTER); with --quiet, none."""
    if quiet:
        return silent
    after = environment.progress_after()

    def write(line: str) -> None:
        print(line, file=stream or sys.stderr, flush=True)

    return DelayedLines(write, DEFAULT_AFTER if after is None else after)


def close(progress: Progress) -> None:
    """Stop a command's progress lines (a DelayedLines; anything else needs nothing)."""
    if isinstance(progress, DelayedLines):
        progress.close()


class DelayedLines:
    """A progress callable for a command: lines go to `write` with the seconds since
    this was made, but only after `after` seconds. When that time comes while a stage is
    running, a timer shows that stage's line then (a kernel may compile for seconds
    without another line). close() stops it: nothing is written afterwards."""

    def __init__(self, write: Callable[[str], None], after: float = DEFAULT_AFTER):
        self._write, self.after = write, after
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._pending: str | None = None  # the latest line held back
        self._closed = False
        self._timer = threading.Timer(after, self._on_time)
        self._timer.daemon = True
        if after > 0:
            self._timer.start()

    def _show(self, line: str) -> None:
        self._write(f"[{time.monotonic() - self._start:7.2f}s] {line}")

    def __call__(self, line: str) -> None:
        with self._lock:
            if self._closed:
                return
            if time.monotonic() - self._start < self.after:
                self._pending = line
                return
            self._pending = None
            self._show(line)

    def _on_time(self) -> None:
        with self._lock:
            if not self._closed and self._pending is not None:
                self._show(self._pending)
                self._pending = None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._timer.cancel()
