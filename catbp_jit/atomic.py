"""Files written whole or not at all: a failed write never costs the user the old file.

    with replacing(path) as tmp:   # a new, empty file beside `path`
        write_everything_to(tmp)   # any writer that takes a path (csv, pyarrow, json...)
    # here `path` is the new file; had the block raised, `path` would be untouched and
    # `tmp` gone

`replacing_dir` does the same for an output directory (Dask's Parquet parts), and
`atomic_write(path, data)` for bytes in hand that must also be private and durable (the
kernel and plan caches' files: 0600, fsync-ed before the rename).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PathLike = str | os.PathLike


def _sibling(path: Path, kind: str) -> Path:
    """A fresh hidden name beside `path`, in the same directory (so os.replace is a rename
    on one file system, never a copy) and with the same suffix (writers such as numpy's
    and pyarrow's look at it)."""
    return path.with_name(f".{path.stem}.{kind}-{secrets.token_hex(4)}{path.suffix}")


@contextlib.contextmanager
def replacing(path: PathLike) -> Iterator[Path]:
    """A temporary file beside `path`, renamed over it when the block ends normally and
    removed when it raises."""
    path = Path(path)
    if path.is_dir():  # found now, not after the work of filling the temporary file
        raise IsADirectoryError(errno.EISDIR, "Is a directory, not a file", str(path))
    while True:
        tmp = _sibling(path, "tmp")
        try:
            # 0o666 less the umask: the file gets the mode a plain open(path, "w") gives
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
        except OSError as e:  # name the file asked for, not the temporary one
            raise type(e)(e.errno, e.strerror, str(path)) from None
    with _renamed_over(tmp, path):
        yield tmp


def atomic_write(path: PathLike, data: bytes) -> None:
    """Write a 0600 temp file in the same directory, fsync, then rename over `path`.
    Written through its descriptor, never reopened by name: the mode is private from the
    start, whatever the umask."""
    d, name = os.path.split(path)
    fd, tmp = tempfile.mkstemp(dir=d, prefix="." + name + ".", suffix=".tmp")
    with _renamed_over(tmp, path), os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def _renamed_over(tmp: PathLike, path: PathLike) -> Iterator[None]:
    """Rename the file `tmp` over `path` when the block ends normally; remove it when the
    block raises (and raise that error, not one from the removal)."""
    try:
        yield
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def replacing_dir(path: PathLike) -> Iterator[Path]:
    """A temporary directory beside `path`, put in its place when the block ends normally
    (the old directory, if any, is removed only then) and removed when it raises."""
    path = Path(path)
    tmp = _sibling(path, "tmp")
    try:
        tmp.mkdir()
    except OSError as e:  # name the directory asked for, not the temporary one
        raise type(e)(e.errno, e.strerror, str(path)) from None
    try:
        yield tmp
        if path.exists():  # a directory cannot be renamed over a full one: move it aside
            old = _sibling(path, "old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
