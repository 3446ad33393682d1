"""The UAI competition formats: models (.uai), evidence (.evid) and marginals (MAR).

A .uai file is a MARKOV or BAYES preamble (number of variables, their domain sizes, the
number of factors and each factor's scope as variable indices) followed by one table per
factor: its entry count, then the entries with the LAST scope variable varying fastest,
which is our Factor layout (row-major in scope order). For BAYES the child is the last
scope variable; its CPT is read like any other factor. Variables are named by their index
as a string ("0", "1", ...) so .evid indices map to them directly.

No third-party dependency; gzip-compressed files are read transparently.
"""

from __future__ import annotations

import gzip
import io
import math
import os
import re
import zlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from .. import environment
from ..errors import clip
from .graph import FactorGraph, FactorGraphError, factor_graph

Source = str | bytes | os.PathLike

# Suffixes that make a whitespace-free string a file name even when the file is missing.
_FILE_SUFFIXES = (".uai", ".evid", ".bif", ".gz", ".txt")

# A model file's text is held in memory whole, so it is capped: a 2 MB .gz can expand to
# gigabytes. The default fits every model we know of many times over.
DEFAULT_MAX_INPUT_BYTES = 1 << 30
_GUNZIP_CHUNK = 1 << 20


def input_limit(limit: int | None = None) -> int:
    """The most bytes of (decompressed) text a reader accepts: `limit` if given, else
    CATBP_JIT_MAX_INPUT_BYTES, else DEFAULT_MAX_INPUT_BYTES."""
    if limit is not None:
        return int(limit)
    env = environment.max_input_bytes()
    return env if env is not None else DEFAULT_MAX_INPUT_BYTES


def _too_large(label: str, limit: int, what: str) -> FactorGraphError:
    return FactorGraphError(
        f"{label}: {what} is larger than the input limit of {limit:,} bytes "
        "(raise it with CATBP_JIT_MAX_INPUT_BYTES or max_input_bytes=)"
    )


def read_source(
    source: Source, default_label: str, max_input_bytes: int | None = None
) -> tuple[str, str, str | None]:
    """The text of `source` and how to name it in messages: (text, label, stem).

    A Path is always a file. bytes are the file's content. A str names a file when such a
    file exists, or when it looks like a file name (no whitespace, a known suffix: then a
    missing file is FileNotFoundError); any other str is the text itself. Gzip content is
    recognised by its magic bytes, so `.gz` needs no special spelling. stem is the file
    name without `.gz` and its format suffix (None for text). Content over
    input_limit(max_input_bytes) bytes, before or after decompression, is refused
    without reading the rest.
    """
    limit = input_limit(max_input_bytes)
    path: Path | None = None
    data: bytes | bytearray  # bytearray: decompressed
    if isinstance(source, os.PathLike):
        path = Path(source)
    elif isinstance(source, str):
        if os.path.isfile(source) or (
            source and not any(c.isspace() for c in source) and source.lower().endswith(_FILE_SUFFIXES)
        ):
            path = Path(source)
    if path is not None:
        label, stem = str(path), path.name
        with open(path, "rb") as f:  # FileNotFoundError names the path
            data = f.read(limit + 1)
    elif isinstance(source, (bytes, bytearray)):
        data, label, stem = bytes(source), default_label, None
    else:
        text = str(source)
        if len(text) > limit:
            raise _too_large(default_label, limit, "the text")
        return text, default_label, None
    if len(data) > limit:
        raise _too_large(label, limit, "the file")
    if data[:2] == b"\x1f\x8b":
        data = _gunzip(data, label, limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # old model files are often Latin-1
    if stem is not None:
        if stem.lower().endswith(".gz"):
            stem = stem[:-3]
        stem = os.path.splitext(stem)[0] or stem
    return text, label, stem


def _gunzip(data: bytes, label: str, limit: int) -> bytearray:
    """The decompressed content, read in chunks so a bomb stops at the limit."""
    out = bytearray()
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
            while True:
                chunk = f.read(_GUNZIP_CHUNK)
                if not chunk:
                    return out
                out += chunk
                if len(out) > limit:
                    raise _too_large(label, limit, "the decompressed content")
    except (EOFError, OSError, zlib.error) as e:  # truncated or corrupt (BadGzipFile is OSError)
        raise FactorGraphError(f"{label}: not a readable gzip file ({e})") from None


_TOKEN = re.compile(r"\S+")
_SPACE = re.compile(r"\s")
_CHUNK_CHARS = 1 << 20  # table text split per step: bounded memory, str.split speed


def _short(token: str) -> str:
    return token if len(token) <= 40 else token[:37] + "..."


class _Tokens:
    """The whitespace-separated tokens of a file, taken in order, with line numbers for
    messages. Never a list of every token: that costs ~60 bytes per token, 7x the file;
    tables are split a bounded chunk of text at a time."""

    def __init__(self, text: str, label: str):
        self.text = text
        self.label = label
        self.pos = 0  # just after the token taken last
        self.last: re.Match | None = None  # the token taken last (None: none yet)

    def error_at(self, token: re.Match | None, reason: str) -> FactorGraphError:
        """An error at `token` (a match), or at the end of the file when None."""
        if token is None:
            return FactorGraphError(f"{self.label}: at the end of the file: {reason}")
        line = self.text.count("\n", 0, token.start()) + 1
        return FactorGraphError(f"{self.label}:{line}: at token {_short(token.group())!r}: {reason}")

    def next_match(self) -> re.Match | None:
        m = _TOKEN.search(self.text, self.pos)
        if m is not None:
            self.last, self.pos = m, m.end()
        return m

    def take(self, what: str) -> str:
        m = self.next_match()
        if m is None:
            raise self.error_at(None, f"the file ends early, expected {what}")
        return m.group()

    def integer(self, what: str, low: int = 0, high: int | None = None) -> int:
        tok = self.take(what)
        try:
            value = int(tok)
        except ValueError:
            raise self.error_at(self.last, f"expected {what} (an integer)") from None
        if value < low or (high is not None and value >= high):
            bound = f"in [{low}, {high})" if high is not None else f">= {low}"
            raise self.error_at(self.last, f"{what} must be {bound}")
        return value

    def floats(self, n: int, what: str) -> np.ndarray:
        # Each entry takes at least two characters (a digit and a separator): a count the
        # rest of the file cannot hold is refused before anything is allocated for it.
        if n > (len(self.text) - self.pos + 1) // 2:
            self.pos = len(self.text)
            raise self.error_at(None, f"the file ends early, {what} needs {n} entries")
        values = np.empty(n, dtype=np.float64)
        done = 0
        while done < n:
            start = self.pos
            chunk = self._split_chunk(n - done)
            if not chunk:
                raise self.error_at(None, f"the file ends early, {what} needs {n} entries")
            try:
                part = np.array(chunk, dtype=np.float64)
            except ValueError:
                bad = next(k for k, tok in enumerate(chunk) if not is_number(tok))
                raise self.error_at(
                    self._nth_token(start, bad), f"{what}: entry {done + bad} is not a number"
                ) from None
            bad_entries = np.flatnonzero(~np.isfinite(part) | (part < 0))
            if bad_entries.size:
                bad = int(bad_entries[0])
                raise self.error_at(
                    self._nth_token(start, bad),
                    f"{what}: entry {done + bad} must be a finite non-negative number",
                )
            values[done : done + len(chunk)] = part
            done += len(chunk)
        return values

    def _split_chunk(self, most: int) -> list[str]:
        """Up to `most` tokens from about a chunk of text (whole tokens only); moves past them."""
        text, pos = self.text, self.pos
        # Enough text for `most` ordinary numbers, so a small table splits a small chunk.
        end = min(len(text), pos + min(_CHUNK_CHARS, 32 * most + 64))
        if end < len(text):  # extend to a separator so that no token is cut in two
            m = _SPACE.search(text, end)
            end = m.start() if m else len(text)
        tokens = text[pos:end].split()
        if len(tokens) <= most:
            self.pos = end
            return tokens
        self.last = self._nth_token(pos, most - 1)  # the table ends inside this chunk
        self.pos = self.last.end()
        return tokens[:most]

    def _nth_token(self, start: int, k: int) -> re.Match:
        """The match of the k-th token (from 0) at or after text position `start`."""
        for i, m in enumerate(_TOKEN.finditer(self.text, start)):
            if i == k:
                return m
        raise AssertionError("fewer tokens than counted")


def is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def read_uai(source: Source, *, name: str | None = None, max_input_bytes: int | None = None) -> FactorGraph:
    """A FactorGraph from a .uai model (MARKOV or BAYES; a path, `.gz` path, or the text).

    Variables are named "0", "1", ... in file order; factors keep the file's order.
    max_input_bytes: see read_source (default CATBP_JIT_MAX_INPUT_BYTES, else 1 GiB).
    """
    text, label, stem = read_source(source, "<uai text>", max_input_bytes)
    tokens = _Tokens(text, label)
    kind = tokens.take("the preamble MARKOV or BAYES")
    if kind.upper() not in ("MARKOV", "BAYES"):
        raise tokens.error_at(tokens.last, "the file must start with MARKOV or BAYES")
    n_vars = tokens.integer("the number of variables")
    domains = [tokens.integer(f"the domain size of variable {v}", low=1) for v in range(n_vars)]
    n_factors = tokens.integer("the number of factors")
    scopes: list[tuple[int, ...]] = []
    for f in range(n_factors):
        size = tokens.integer(f"the scope size of factor {f}")
        size_token = tokens.last
        scope = tuple(
            tokens.integer(f"a variable index in the scope of factor {f}", high=n_vars) for _ in range(size)
        )
        if len(set(scope)) != len(scope):
            raise tokens.error_at(size_token, f"factor {f} has a variable twice in its scope")
        scopes.append(scope)

    factors = []
    for f, scope in enumerate(scopes):
        shape = tuple(domains[v] for v in scope)
        expected = math.prod(shape)
        count = tokens.integer(f"the entry count of factor {f}'s table")
        if count != expected:
            raise tokens.error_at(
                tokens.last,
                f"factor {f}'s table has {count} entries, its scope's domains {shape} give {expected}",
            )
        values = tokens.floats(count, f"factor {f}'s table")
        factors.append((tuple(str(v) for v in scope), values.reshape(shape)))
    extra = tokens.next_match()
    if extra is not None:
        raise tokens.error_at(extra, f"unexpected text after the last of the {n_factors} tables")
    graph_name = name or stem or "uai"
    return factor_graph({str(v): d for v, d in enumerate(domains)}, factors, name=graph_name)


def read_evidence(
    source: Source, graph: FactorGraph, *, max_input_bytes: int | None = None
) -> dict[str, int]:
    """Evidence from a UAI .evid file (a path or the text): {variable name: state index}.

    Variable index i is the i-th variable of `graph` (its name is str(i) for a graph
    from read_uai). Two layouts exist:
      modern (UAI 2014 on): `N v1 x1 ... vN xN`;
      older (UAI 2008/2010): a sample count, then `N v1 x1 ... vN xN` per sample.
    The rule: the modern layout when the token count is 1 + 2N for the first number N,
    else the older one when its counts add up. A file with one sample never fits both (its
    token count is even, the modern one's odd). An empty file, `0` or `1 0` is no evidence.
    Several samples are refused: they are several queries, not one.
    """
    text, label, _ = read_source(source, "<evid text>", max_input_bytes)
    tokens = _Tokens(text, label)
    names = graph.names
    total = sum(1 for _ in _TOKEN.finditer(text))
    if total == 0:
        return {}
    first = tokens.integer("the number of observed variables")
    if total != 1 + 2 * first:
        samples = _older_layout_samples(text, total)
        if samples is None:
            raise tokens.error_at(
                tokens.last,
                f"the file has {total} numbers, which fits "
                "neither the modern layout `N v1 x1 ... vN xN` (1 + 2N "
                f"numbers; here N = {clip(str(first))}) nor the older "
                "`1 N v1 x1 ... vN xN`",
            )
        if samples > 1:
            raise tokens.error_at(
                tokens.last,
                f"{samples} evidence samples (older layout); only one set of evidence can be read",
            )
        if samples == 0:
            return {}
        first = tokens.integer("the number of observed variables")
    evidence: dict[str, int] = {}
    for _ in range(first):
        index = tokens.integer("a variable index", high=len(names))
        index_token = tokens.last
        var = names[index]
        size = graph.variables[var]
        state = tokens.integer(f"the state of variable {index} ({var!r}, domain size {size})", high=size)
        if evidence.get(var, state) != state:
            raise tokens.error_at(
                index_token, f"variable {index} ({var!r}) is observed twice with different states"
            )
        evidence[var] = state
    return evidence


def _older_layout_samples(text: str, total: int) -> int | None:
    """The sample count if the `total` tokens of `text` add up as the older .evid layout,
    else None."""
    tokens = _TOKEN.finditer(text)
    try:
        samples, pos = int(next(tokens).group()), 1
        for _ in range(samples):
            n = int(next(tokens).group())
            if n < 0 or pos + 1 + 2 * n > total:
                return None
            for _ in range(2 * n):
                next(tokens)
            pos += 1 + 2 * n
    except (ValueError, StopIteration):
        return None
    return samples if pos == total and samples >= 0 else None


def format_mar(graph: FactorGraph, marginals: Mapping[str, np.ndarray]) -> str:
    """Marginals in the UAI MAR output format.

    `MAR`, then one line: the number of variables and, for each variable in graph order,
    its domain size followed by its probabilities. Values are written with repr, the
    shortest text that reads back as the same float64.
    """
    parts = [str(len(graph.variables))]
    for var, size in graph.variables.items():
        if var not in marginals:
            raise FactorGraphError(f"{graph.name}: no marginal for variable {var!r}")
        values = np.asarray(marginals[var], dtype=np.float64).reshape(-1)
        if values.size != size:
            raise FactorGraphError(
                f"{graph.name}: the marginal of {var!r} has {values.size} values, its domain size is {size}"
            )
        parts.append(str(size))
        parts.extend(repr(float(x)) for x in values)
    return "MAR\n" + " ".join(parts) + "\n"


def read_mar(source: Source, graph: FactorGraph) -> dict[str, np.ndarray]:
    """Marginals in the MAR format (`format_mar`'s, or a competition's answer file), by
    variable of `graph`: each variable's domain size must match."""
    text, label, _ = read_source(source, "MAR")
    toks = text.split()
    if toks and toks[0] == "MAR":
        toks = toks[1:]
    try:
        n, i, out = int(toks[0]), 1, {}
        if n != len(graph.variables):
            raise FactorGraphError(
                f"{label}: marginals of {n} variables, the model has {len(graph.variables)}"
            )
        for var, size in graph.variables.items():
            k = int(toks[i])
            if k != size:
                raise FactorGraphError(f"{label}: {var!r} has {k} values, its domain size is {size}")
            out[var] = np.array([float(t) for t in toks[i + 1 : i + 1 + k]], dtype=np.float64)
            if out[var].size != k:
                raise IndexError
            i += 1 + k
    except FactorGraphError:
        raise
    except (IndexError, ValueError):
        raise FactorGraphError(f"{label}: not a MAR file (truncated or not numbers)") from None
    return out


def write_uai(graph: FactorGraph) -> str:
    """`graph` as a MARKOV .uai file; variables are numbered in graph order."""
    index = graph.index()
    lines = [
        "MARKOV",
        str(len(graph.variables)),
        " ".join(str(d) for d in graph.variables.values()),
        str(len(graph.factors)),
    ]
    for f in graph.factors:
        lines.append(" ".join([str(len(f.scope))] + [str(index[v]) for v in f.scope]))
    for f in graph.factors:
        lines.append("")
        lines.append(str(f.values.size))
        # One line per run of the fastest axis keeps tables readable.
        rows = f.values.reshape(-1, f.values.shape[-1]) if f.values.ndim else f.values.reshape(1, 1)
        lines.extend(" " + " ".join(repr(float(x)) for x in row) for row in rows)
    return "\n".join(lines) + "\n"


def format_mpe(graph: FactorGraph, assignment: Mapping[str, int]) -> str:
    """An assignment of every variable in the UAI MPE format: `MPE`, then the number of
    variables and each one's state index, in graph order."""
    return (
        "MPE\n" + " ".join([str(len(graph.variables))] + [str(assignment[v]) for v in graph.variables]) + "\n"
    )


def format_mmap(graph: FactorGraph, assignment: Mapping[str, int], query: tuple[str, ...]) -> str:
    """A marginal MAP answer in the UAI MMAP format: `MMAP`, then the number of query
    variables and, for each, its index in the model and its state index."""
    index = graph.index()
    pairs = [f"{index[v]} {assignment[v]}" for v in query]
    return "MMAP\n" + " ".join([str(len(query))] + pairs) + "\n"


def format_pr(log_z: float) -> str:
    """log Z in the UAI PR format: `PR`, then log10 Z."""
    return f"PR\n{log_z / math.log(10.0)!r}\n"


def read_query(source: Source, graph: FactorGraph) -> tuple[str, ...]:
    """A UAI `.query` file (marginal MAP's query variables): their number, then their
    indices in the model; returned as names."""
    text, label, _ = read_source(source, "query")
    toks = text.split()
    names = list(graph.variables)
    try:
        n = int(toks[0])
        idx = [int(t) for t in toks[1 : 1 + n]]
        if len(idx) != n or len(toks) != 1 + n:
            raise IndexError
    except (IndexError, ValueError):
        raise FactorGraphError(
            f"{label}: not a query file (a count, then that many variable indices)"
        ) from None
    bad = [i for i in idx if not 0 <= i < len(names)]
    if bad:
        raise FactorGraphError(f"{label}: variable index {bad[0]} is not in the model (0..{len(names) - 1})")
    return tuple(names[i] for i in idx)
