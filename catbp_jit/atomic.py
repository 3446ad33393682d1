"""Files written whole or not at all: a failed write never costs the user the old file.

    with replacing(path) as tmp:   # a new, empty file beside `path`
        write_everything_to(tmp)   # any writer that takes a path (csv, pyarrow, json...)
    # here `path` is the new file; had the block raised, `path` would be untouched and
    # `tmp` gone

`replacing_dir` does the same for an output directory (Dask's Parquet parts).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from pathlib import Path
from typing import Iterator, Union

PathLike = Union[str, os.PathLike]


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
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
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
