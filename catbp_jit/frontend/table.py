"""Evidence tables in, posterior tables out: scoring a data set with a model.

An evidence table has one column per evidence variable (the header names them) and one
row per case: a cell is a state name or index, and an empty cell (or NA, ?, -1) leaves
the variable unobserved. CSV is read with the standard library, a chunk of rows at a
time; Parquet (`.parquet`) needs pyarrow (the `parquet` extra). The output has one row
per case: its row number, log Z, then one column per variable and state, `var=state`,
holding the posterior probability (SAT: 0/1 possible; a row whose evidence is impossible
has empty posteriors and log Z -inf). With --task MPE a row holds its row number, the log
value of its most probable assignment, then each variable's state index in it (empty
where the evidence is impossible).
"""

from __future__ import annotations

import contextlib
import csv
import math
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from .cells import cell_states
from .graph import FactorGraph, FactorGraphError

if TYPE_CHECKING:
    from .batch import BatchSolution
    from .tasks import MPEBatch

CHUNK_ROWS = 8192


def _parquet() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FactorGraphError(
            "reading or writing .parquet needs pyarrow (pip install 'catbp_jit[parquet]')"
        ) from None
    return pq


@contextlib.contextmanager
def parquet_errors(path: Any) -> Iterator[None]:
    """pyarrow's errors on a file that is no Parquet file (or a damaged one) as one line.
    (Dask wraps pyarrow's message in one of its own: the last line is pyarrow's.)"""
    import pyarrow as pa

    try:
        yield
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, OSError) and e.errno is not None:  # the OS's (no such file...)
            raise
        # pyarrow's own OSError (errno None): "Couldn't deserialize thrift: ...\n"
        lines = str(e).strip().splitlines() or [type(e).__name__]
        reason = " ".join(lines[-1].replace("Original Message: ", "").split())[:300]
        raise FactorGraphError(f"{path}: not a readable Parquet file ({reason})") from None
    except UnicodeDecodeError as e:  # a string column's bytes, met when read as Python str
        raise FactorGraphError(
            f"{path}: not a readable Parquet file (a string column holds "
            f"bytes that are not UTF-8: {e.reason})"
        ) from None


def _csv_rows(path: Path) -> Iterator[list[str]]:
    """The rows of a CSV file, header first; a table that is no UTF-8 CSV is one error
    naming its line. utf-8-sig: Excel's "CSV UTF-8" starts with a byte-order mark, which
    would otherwise stick to the first column's name; newline="": csv itself reads \r\n."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        try:
            yield from reader
        except csv.Error as e:  # e.g. a cell longer than csv.field_size_limit()
            raise FactorGraphError(
                f"{path}: line {reader.line_num}: not a readable CSV table ({e})"
            ) from None
        except UnicodeDecodeError:
            line, byte = _first_undecodable(path)
            raise FactorGraphError(
                f"{path}: line {line}: byte 0x{byte:02x} is not UTF-8 (save the table as UTF-8 CSV)"
            ) from None


def _first_undecodable(path: Path) -> tuple[int, int]:
    """(line number, byte) of the first byte that is not UTF-8 (the decoder reads blocks,
    so its error says neither)."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                return number, line[e.start]
    return 0, 0


def table_columns(path: Path) -> tuple[str, ...]:
    """The evidence variables a table names (its header)."""
    if path.suffix == ".parquet":
        pq = _parquet()
        with parquet_errors(path):
            return tuple(pq.read_schema(path).names)
    header = next(_csv_rows(path), None)
    if not header:
        raise FactorGraphError(f"{path}: an evidence table needs a header naming its variables")
    return tuple(h.strip() for h in header)


def count_rows(path: Path) -> int:
    """Rows below the header (for a progress bar's total: quoted newlines count double)."""
    if path.suffix == ".parquet":
        pq = _parquet()
        with parquet_errors(path):
            return pq.ParquetFile(path).metadata.num_rows
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return max(0, lines + (last != b"\n") - 1)


def read_chunks(
    path: Path, graph: FactorGraph, columns: Sequence[str], chunk_rows: int = CHUNK_ROWS
) -> Iterator[np.ndarray]:
    """The table as int64 state-index chunks (rows, len(columns)), -1 unobserved."""
    if path.suffix == ".parquet":
        pq = _parquet()
        with parquet_errors(path):
            for batch in pq.ParquetFile(path).iter_batches(batch_size=chunk_rows):
                cells = [np.array(col.to_pylist(), dtype=object) for col in batch.columns]
                yield _encode(path, graph, cells, columns, lambda i: f"row {i}")
        return
    reader = _csv_rows(path)
    next(reader, None)
    start = 1
    while True:
        rows = [r for _, r in zip(range(chunk_rows), reader)]
        if not rows:
            return
        for i, row in enumerate(rows):
            if len(row) != len(columns):
                raise FactorGraphError(
                    f"{path}: line {start + i + 1} has {len(row)} cells, the header names "
                    f"{len(columns)} variables"
                )
        cells = list(np.array(rows, dtype=object).reshape(len(rows), len(columns)).T)
        yield _encode(path, graph, cells, columns, lambda i, start=start: f"line {start + i + 1}")
        start += len(rows)


def _encode(
    path: Path, graph: FactorGraph, cells: list[np.ndarray], columns: Sequence[str], where: Any
) -> np.ndarray:
    """A chunk's columns of cells as states (cells.py reads them as pandas frames are
    read); the first bad cell in row order is the error."""
    n = len(cells[0]) if cells else 0
    out = np.empty((n, len(columns)), dtype=np.int64)
    bad = np.zeros((n, len(columns)), dtype=bool)
    for j, v in enumerate(columns):
        out[:, j], bad[:, j] = cell_states(graph, v, cells[j])
    if bad.any():
        i, j = (int(x[0]) for x in np.nonzero(bad))
        text = str(cells[j][i]).strip()
        raise FactorGraphError(f"{path}: {where(i)}: {text!r} is not a state of {columns[j]!r}")
    return out


def posterior_header(graph: FactorGraph) -> list[str]:
    return ["row", "log_Z"] + posterior_columns(graph, graph.variables)


def posterior_columns(graph: FactorGraph, variables: Iterable[str]) -> list[str]:
    """`var=state` for each state of each variable (states by name, else by index)."""
    cols = []
    for v in variables:
        names = graph.states.get(v) or tuple(str(i) for i in range(graph.variables[v]))
        cols += [f"{v}={s}" for s in names]
    return cols


def posterior_rows(graph: FactorGraph, res: BatchSolution, first_row: int) -> np.ndarray:
    """One chunk's answers as a float matrix in posterior_header's column order."""
    n = len(res)
    parts = [np.arange(first_row, first_row + n, dtype=np.float64)[:, None], res.log_Z[:, None]]
    parts += [np.asarray(res.marginals[v], dtype=np.float64) for v in graph.variables]
    return np.concatenate(parts, axis=1) if n else np.zeros((0, len(posterior_header(graph))))


def mpe_header(graph: FactorGraph) -> list[str]:
    return ["row", "log_value"] + list(graph.variables)


def mpe_rows(best: MPEBatch, first_row: int) -> np.ndarray:
    """One chunk's MPE rows as a float matrix in mpe_header's order; NaN (an empty cell)
    for the states of a row whose evidence is impossible."""
    n = len(best)
    states = best.assignments.astype(np.float64)
    states[best.assignments < 0] = np.nan
    rows = np.arange(first_row, first_row + n, dtype=np.float64)[:, None]
    return np.concatenate([rows, best.log_values[:, None], states], axis=1)


class PosteriorWriter:
    """Writes posterior rows to CSV (a stream or file) or Parquet, chunk by chunk. A file
    is best a temporary one (catbp_jit.atomic.replacing): a table that fails halfway must
    not leave a partial file where the user's old one was."""

    def __init__(
        self,
        graph: FactorGraph,
        out: Path | None,
        stdout: IO[str],
        parquet: bool | None = None,
        header: list[str] | None = None,
    ):
        self.header = header or posterior_header(graph)
        # an MPE table's state columns (after row and log_value) are integers
        self._integers = header is not None
        self.path = out
        self._parquet_writer: Any = None  # a pyarrow.parquet.ParquetWriter, once rows come
        self._closed = False
        self._file: IO[str] | None
        if parquet is None:
            parquet = out is not None and out.suffix == ".parquet"
        if parquet:
            self._pq = _parquet()
            self._file = None
        else:
            self._file = open(out, "w", newline="", encoding="utf-8") if out else stdout
            self._csv = csv.writer(self._file)
            self._csv.writerow(self.header)

    def write(self, matrix: np.ndarray) -> None:
        if self._file is None:
            import pyarrow as pa

            cols = {name: matrix[:, j] for j, name in enumerate(self.header)}
            cols["row"] = matrix[:, 0].astype(np.int64)
            batch = pa.table(cols)
            if self._parquet_writer is None:
                self._parquet_writer = self._pq.ParquetWriter(self.path, batch.schema)
            self._parquet_writer.write_table(batch)
            return
        for r in matrix:
            if self._integers:
                self._csv.writerow(
                    [int(r[0]), _cell(r[1])] + ["" if math.isnan(x) else int(x) for x in r[2:]]
                )
            else:
                self._csv.writerow([int(r[0])] + [_cell(x) for x in r[1:]])

    def __enter__(self) -> PosteriorWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._parquet_writer is not None:
            self._parquet_writer.close()
        elif self._file is None:  # no rows at all: an empty table with the header
            import pyarrow as pa

            self._pq.write_table(pa.table({h: [] for h in self.header}), self.path)
        elif self.path is not None:
            self._file.close()
        else:
            self._file.flush()


def _cell(x: float) -> str:
    if math.isnan(x):
        return ""
    return repr(float(x))
