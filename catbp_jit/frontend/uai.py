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
import math
import os
import re
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

import numpy as np

from .graph import FactorGraph, FactorGraphError, factor_graph

Source = Union[str, bytes, os.PathLike]

# Suffixes that make a whitespace-free string a file name even when the file is missing.
_FILE_SUFFIXES = (".uai", ".evid", ".bif", ".gz", ".txt")


def read_source(source: Source, default_label: str) -> Tuple[str, str, Optional[str]]:
    """The text of `source` and how to name it in messages: (text, label, stem).

    A Path is always a file. bytes are the file's content. A str names a file when such a
    file exists, or when it looks like a file name (no whitespace, a known suffix: then a
    missing file is FileNotFoundError); any other str is the text itself. Gzip content is
    recognised by its magic bytes, so `.gz` needs no special spelling. stem is the file
    name without `.gz` and its format suffix (None for text).
    """
    path: Optional[Path] = None
    if isinstance(source, os.PathLike):
        path = Path(source)
    elif isinstance(source, str):
        if os.path.isfile(source) or (source and not any(c.isspace() for c in source)
                                      and source.lower().endswith(_FILE_SUFFIXES)):
            path = Path(source)
    if path is not None:
        data = path.read_bytes()  # FileNotFoundError names the path
        label, stem = str(path), path.name
    elif isinstance(source, (bytes, bytearray)):
        data, label, stem = bytes(source), default_label, None
    else:
        return str(source), default_label, None
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")  # old model files are often Latin-1
    if stem is not None:
        if stem.lower().endswith(".gz"):
            stem = stem[:-3]
        stem = os.path.splitext(stem)[0] or stem
    return text, label, stem


class _Tokens:
    """Whitespace-separated tokens of a file, with line numbers for messages."""

    def __init__(self, text: str, label: str):
        self.text = text
        self.label = label
        self.items = text.split()
        self.pos = 0

    def line_of(self, i: int) -> int:
        # Only on the error path: re-scan to find where token i starts.
        for k, m in enumerate(re.finditer(r"\S+", self.text)):
            if k == i:
                return self.text.count("\n", 0, m.start()) + 1
        return self.text.count("\n") + 1

    def error(self, reason: str, i: Optional[int] = None) -> FactorGraphError:
        i = self.pos if i is None else i
        if i >= len(self.items):
            return FactorGraphError(f"{self.label}: at the end of the file: {reason}")
        return FactorGraphError(f"{self.label}:{self.line_of(i)}: at token {self.items[i]!r}: "
                                f"{reason}")

    def take(self, what: str) -> str:
        if self.pos >= len(self.items):
            raise self.error(f"the file ends early, expected {what}")
        tok = self.items[self.pos]
        self.pos += 1
        return tok

    def int(self, what: str, low: int = 0, high: Optional[int] = None) -> int:
        tok = self.take(what)
        try:
            value = int(tok)
        except ValueError:
            raise self.error(f"expected {what} (an integer)", self.pos - 1) from None
        if value < low or (high is not None and value >= high):
            bound = f"in [{low}, {high})" if high is not None else f">= {low}"
            raise self.error(f"{what} must be {bound}", self.pos - 1)
        return value

    def floats(self, n: int, what: str) -> np.ndarray:
        if self.pos + n > len(self.items):
            self.pos = len(self.items)
            raise self.error(f"the file ends early, {what} needs {n} entries")
        chunk = self.items[self.pos:self.pos + n]
        try:
            values = np.array(chunk, dtype=np.float64)
        except ValueError:
            bad = next(k for k, tok in enumerate(chunk) if not is_number(tok))
            raise self.error(f"{what}: entry {bad} is not a number", self.pos + bad) from None
        bad_entries = np.flatnonzero(~np.isfinite(values) | (values < 0))
        if bad_entries.size:
            bad = int(bad_entries[0])
            raise self.error(f"{what}: entry {bad} must be a finite non-negative number",
                             self.pos + bad)
        self.pos += n
        return values


def is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def read_uai(source: Source, *, name: Optional[str] = None) -> FactorGraph:
    """A FactorGraph from a .uai model (MARKOV or BAYES; a path, `.gz` path, or the text).

    Variables are named "0", "1", ... in file order; factors keep the file's order.
    """
    text, label, stem = read_source(source, "<uai text>")
    tokens = _Tokens(text, label)
    kind = tokens.take("the preamble MARKOV or BAYES")
    if kind.upper() not in ("MARKOV", "BAYES"):
        raise tokens.error("the file must start with MARKOV or BAYES", 0)
    n_vars = tokens.int("the number of variables")
    domains = [tokens.int(f"the domain size of variable {v}", low=1) for v in range(n_vars)]
    n_factors = tokens.int("the number of factors")
    scopes: List[Tuple[int, ...]] = []
    for f in range(n_factors):
        size = tokens.int(f"the scope size of factor {f}")
        start = tokens.pos
        scope = tuple(tokens.int(f"a variable index in the scope of factor {f}", high=n_vars)
                      for _ in range(size))
        if len(set(scope)) != len(scope):
            raise tokens.error(f"factor {f} has a variable twice in its scope", start)
        scopes.append(scope)

    factors = []
    for f, scope in enumerate(scopes):
        shape = tuple(domains[v] for v in scope)
        expected = math.prod(shape)
        count = tokens.int(f"the entry count of factor {f}'s table")
        if count != expected:
            raise tokens.error(f"factor {f}'s table has {count} entries, its scope's domains "
                               f"{shape} give {expected}", tokens.pos - 1)
        values = tokens.floats(count, f"factor {f}'s table")
        factors.append((tuple(str(v) for v in scope), values.reshape(shape)))
    if tokens.pos != len(tokens.items):
        raise tokens.error(f"unexpected text after the last of the {n_factors} tables")
    graph_name = name or stem or "uai"
    return factor_graph({str(v): d for v, d in enumerate(domains)}, factors, name=graph_name)


def read_evidence(source: Source, graph: FactorGraph) -> Dict[str, int]:
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
    text, label, _ = read_source(source, "<evid text>")
    tokens = _Tokens(text, label)
    names = graph.names
    total = len(tokens.items)
    if total == 0:
        return {}
    first = tokens.int("the number of observed variables")
    if total != 1 + 2 * first:
        samples = _older_layout_samples(tokens.items)
        if samples is None:
            raise tokens.error(f"the file has {total} numbers, which fits neither the modern "
                               f"layout `N v1 x1 ... vN xN` (1 + 2N numbers; here N = {first}) "
                               "nor the older `1 N v1 x1 ... vN xN`", 0)
        if samples > 1:
            raise tokens.error(f"{samples} evidence samples (older layout); only one set of "
                               "evidence can be read", 0)
        if samples == 0:
            return {}
        first = tokens.int("the number of observed variables")
    evidence: Dict[str, int] = {}
    for _ in range(first):
        index = tokens.int("a variable index", high=len(names))
        var = names[index]
        size = graph.variables[var]
        state = tokens.int(f"the state of variable {index} ({var!r}, domain size {size})",
                           high=size)
        if evidence.get(var, state) != state:
            raise tokens.error(f"variable {index} ({var!r}) is observed twice with different "
                               "states", tokens.pos - 2)
        evidence[var] = state
    return evidence


def _older_layout_samples(items: List[str]) -> Optional[int]:
    """The sample count if `items` add up as the older .evid layout, else None."""
    try:
        samples, pos = int(items[0]), 1
        for _ in range(samples):
            pos += 1 + 2 * int(items[pos])
    except (ValueError, IndexError):
        return None
    return samples if pos == len(items) and samples >= 0 else None


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
            raise FactorGraphError(f"{graph.name}: the marginal of {var!r} has {values.size} "
                                   f"values, its domain size is {size}")
        parts.append(str(size))
        parts.extend(repr(float(x)) for x in values)
    return "MAR\n" + " ".join(parts) + "\n"


def write_uai(graph: FactorGraph) -> str:
    """`graph` as a MARKOV .uai file; variables are numbered in graph order."""
    index = graph.index()
    lines = ["MARKOV", str(len(graph.variables)),
             " ".join(str(d) for d in graph.variables.values()), str(len(graph.factors))]
    for f in graph.factors:
        lines.append(" ".join([str(len(f.scope))] + [str(index[v]) for v in f.scope]))
    for f in graph.factors:
        lines.append("")
        lines.append(str(f.values.size))
        # One line per run of the fastest axis keeps tables readable.
        rows = f.values.reshape(-1, f.values.shape[-1]) if f.values.ndim else f.values.reshape(1, 1)
        lines.extend(" " + " ".join(repr(float(x)) for x in row) for row in rows)
    return "\n".join(lines) + "\n"
