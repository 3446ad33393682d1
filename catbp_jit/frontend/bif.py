"""A reader for the BIF (Bayesian Interchange Format) files of the bnlearn repository.

Our own parser, no dependency: pgmpy's reader drags in pandas/scipy/sklearn, and pyAgrum
rounds CPT entries to float32; here every entry is kept in float64 exactly as written.

What is understood:

    network NAME { property ...; }
    variable NAME { type discrete [ K ] { s1, s2, ... }; property ...; }
    probability ( CHILD | P1, P2 ) {
      (p1state, p2state) v1, ..., vK;    // one row per parent configuration
      table v1, v2, ...;                 // the whole CPT
      default v1, ..., vK;               // rows not given otherwise
      property ...;
    }

Each CPT becomes the factor with scope (CHILD, P1, P2, ...), values[c, p1, p2, ...] =
P(CHILD = c | P1 = p1, P2 = p2, ...). The `table` form lists the entries row-major in that
same order: the child varies slowest and the last parent fastest (checked against
pyAgrum's reader, which agrees with pgmpy 0.1's). Rows may come in any order; a row given
after a `table` overrides it.

Row sums: BIF files round their entries, so a row may sum to 1 +- a few 1e-7 (every
bnlearn network is within 3e-7 of 1). A row within CPT_SUM_TOLERANCE (1e-6) of 1 is
divided by its sum. A row further off (`table 0.3, 0.9;`) is a mistake we cannot correct
for the user: it is used as written, and read_bif warns once per file (CPTSumWarning)
naming its CPTs. read_bif(normalize=False) keeps every row as written, without a warning.

Comments (`//`, `/* */`) are dropped. Names and state labels are any run of characters
other than white space and `{}()[],;|"` (the real files have labels like `<5`, `5-12`,
`12+`, `>=7.5`, `Asy/Patch`, `Transp.`); a double-quoted name is also accepted.
"""

from __future__ import annotations

import math
import re
import sys
import warnings
from array import array
from collections.abc import Iterator

import numpy as np

from ..errors import clip, name_list, one_line, shown
from ..memory import format_bytes, memory_limit
from .graph import FactorGraph, FactorGraphError, factor_graph
from .uai import Source, is_number, read_source

# A possessive repeat keeps no backtracking state per character: `(?:[^"\\]|\\.)*` took
# ~120 bytes per character of a string (1.5 GB for a 10 MB unclosed one). Python 3.10 has
# no possessive repeats; its unrolled loop costs nothing per plain character, and ~30
# bytes per escape.
_STRING = r'"(?:[^"\\]|\\.)*+"' if sys.version_info >= (3, 11) else r'"[^"\\]*(?:\\.[^"\\]*)*"'
# Strings and comments in one left-to-right pass, so that a "//" inside a string survives
# and a '"' inside a comment is no string. A '"' or '/*' left over is never closed. Every
# pattern below that can span a string runs only after this pass has found them all
# closed: an unclosed one would make them rescan the rest of the file from each position.
_LEXEME = re.compile(rf'({_STRING})|(/\*.*?\*/|//[^\n]*)|(")|(/\*)', re.S)
_BRACE_OR_STRING = re.compile(rf"{_STRING}|[{{}}]")
_SPACE = re.compile(r"\s*")
_BLOCK = re.compile(r"(network|variable|probability)\b\s*")
_NAME = re.compile(rf'{_STRING}|[^\s{{}}()\[\],;|"]+')
_HEADER = re.compile(r"\(([^)]*)\)\s*\{")
_TYPE = re.compile(r"type\s+discrete\s*\[\s*(\d+)\s*\]\s*\{([^}]*)\}\s*$")
_STRING_OR_SEMICOLON = re.compile(rf"{_STRING}|;")
_SEPARATOR = re.compile(r"[\s,]")
_WORD = re.compile(r"\S+")
_NUMBER_CHUNK = 1 << 16  # characters of numbers parsed per step

# How far from 1 a CPT row may sum and still be taken for rounding (and divided by its sum).
CPT_SUM_TOLERANCE = 1e-6


class CPTSumWarning(UserWarning):
    """Some CPT rows do not sum to 1 (beyond rounding): they are used as written."""


class _Text:
    """The file text plus what error messages need: its label and line numbers."""

    def __init__(self, text: str, label: str):
        self.text = text
        self.label = label

    def error(self, pos: int, reason: str) -> FactorGraphError:
        line = self.text.count("\n", 0, pos) + 1
        return FactorGraphError(f"{self.label}:{line}: {reason}")

    def block_end(self, open_brace: int) -> int:
        """The index of the `}` closing the `{` at open_brace."""
        depth = 0
        for m in _BRACE_OR_STRING.finditer(self.text, open_brace):
            tok = m.group()
            if tok == "{":
                depth += 1
            elif tok == "}":
                depth -= 1
                if depth == 0:
                    return m.start()
        raise self.error(open_brace, "this '{' is never closed")


def _after_space(text: str, pos: int) -> int:
    """The position after the white space (if any) at `pos`."""
    m = _SPACE.match(text, pos)
    assert m is not None  # \s* matches the empty string too
    return m.end()


def _unquote(name: str) -> str:
    return name[1:-1] if len(name) >= 2 and name[0] == '"' == name[-1] else name


def _names(text: str) -> list[str]:
    """The names in a comma and/or space separated list."""
    if '"' in text:
        return [_unquote(m.group()) for m in _NAME.finditer(text)]
    return text.replace(",", " ").split()  # the common case, fast


def _statements(body: str) -> Iterator[tuple[int, str]]:
    """(offset in body, text without the ';') of each ';'-terminated statement, one at a
    time: a list of them all would cost ~100 bytes per ';' of `;;;;...`."""
    end = 0
    if '"' not in body:  # fast path: no string can hide a ';'
        while True:
            semicolon = body.find(";", end)
            if semicolon < 0:
                break
            yield end, body[end:semicolon]
            end = semicolon + 1
    else:
        for m in _STRING_OR_SEMICOLON.finditer(body):
            if m.group() == ";":
                yield end, body[end : m.start()]
                end = m.end()
    last = body[end:]  # after the final ';' (or the whole body without one)
    if last.strip():
        yield end, last + "\0"  # marks a statement missing its ';'


class _Variable:
    def __init__(self, name: str, states: list[str], pos: int):
        self.name = name
        self.states = states
        self.index = {s: i for i, s in enumerate(states)}
        self.pos = pos


def _without_comments(text: str, label: str) -> str:
    """`text` with comments blanked out (newlines kept, so line numbers stay right), after
    checking that every string and comment is closed."""
    if '"' not in text and "/*" not in text and "//" not in text:
        return text
    pieces, end = [], 0
    for m in _LEXEME.finditer(text):
        if m.group(3) or m.group(4):
            line = text.count("\n", 0, m.start()) + 1
            what = "string" if m.group(3) else "comment"
            raise FactorGraphError(f"{label}:{line}: this {what} ({m.group()!r}) is never closed")
        if m.group(2):
            pieces += [text[end : m.start()], re.sub(r"[^\n]", " ", m.group())]
            end = m.end()
    return "".join(pieces + [text[end:]]) if pieces else text


def read_bif(
    source: Source, name: str | None = None, *, normalize: bool = True, max_input_bytes: int | None = None
) -> FactorGraph:
    """A FactorGraph (one CPT factor per variable) from a .bif or .bif.gz file, or its text.

    Variables keep their declaration order and state names; factor i is the CPT of
    variable i, scope (child, parents...). Graph name: `name`, else the file name (without
    `.bif.gz`), else the `network` name.

    normalize: BIF files round CPT entries, so a row may sum to 1 +- a few 1e-7 (barley's
    Z as written is 1 - 5.8e-7). A row within CPT_SUM_TOLERANCE of 1 is divided by its
    sum; a row further off is used as written, with one CPTSumWarning naming the CPTs that
    have such rows. normalize=False keeps every value exactly as written, without a
    warning. A row summing to 0 is an error either way. A network whose parent links form
    a cycle is refused. max_input_bytes: see uai.read_source.
    """
    raw, label, stem = read_source(source, "<bif text>", max_input_bytes)
    src = _Text(_without_comments(raw, label), label)
    text = src.text

    network_name: str | None = None
    variables: dict[str, _Variable] = {}
    cpt_blocks: dict[str, tuple[int, str, list[str], int, int]] = {}
    pos = _after_space(text, 0)
    while pos < len(text):
        m = _BLOCK.match(text, pos)
        if not m:
            raise src.error(
                pos,
                f"expected 'network', 'variable' or 'probability', found {text[pos : pos + 20].split()[0]!r}",
            )
        kind, pos = m.group(1), m.end()
        if kind == "probability":
            h = _HEADER.match(text, pos)
            if not h:
                raise src.error(pos, "expected '( CHILD | PARENTS ) {' after 'probability'")
            child, parents = _cpt_header(src, h.group(1), pos)
            if child in cpt_blocks:
                raise src.error(pos, f"variable {shown(child)}: a second probability block")
            open_brace = h.end() - 1
            close = src.block_end(open_brace)
            cpt_blocks[child] = (pos, child, parents, open_brace + 1, close)
        else:
            n = _NAME.match(text, pos)
            if not n:
                raise src.error(pos, f"expected a name after {kind!r}")
            block_name = _unquote(n.group())
            open_brace = _after_space(text, n.end())
            if text[open_brace : open_brace + 1] != "{":
                raise src.error(open_brace, f"expected '{{' after {kind} {shown(block_name)}")
            close = src.block_end(open_brace)
            if kind == "network":
                network_name = block_name
            else:
                if block_name in variables:
                    raise src.error(pos, f"variable {shown(block_name)} is declared twice")
                states = _variable_states(src, block_name, open_brace + 1, close)
                variables[block_name] = _Variable(block_name, states, pos)
        pos = _after_space(text, close + 1)

    factors = []
    off = []  # (variable, the row sum furthest from 1) for CPTs with rows beyond rounding
    for var in variables.values():
        if var.name not in cpt_blocks:
            raise src.error(var.pos, f"variable {shown(var.name)} has no probability block")
        scope, table = _cpt(src, variables, *cpt_blocks[var.name])
        sums = table.sum(axis=0)
        if not np.all(sums > 0):
            raise src.error(cpt_blocks[var.name][0], f"variable {shown(var.name)}: a CPT row sums to 0")
        if normalize:
            rounded = np.abs(sums - 1) <= CPT_SUM_TOLERANCE
            if not rounded.all():
                off.append((var.name, float(sums.flat[np.argmax(np.abs(sums - 1))])))
            table = table / np.where(rounded, sums, 1.0)  # rows beyond rounding: / 1
        factors.append((scope, table))
    for child, block in cpt_blocks.items():
        if child not in variables:
            raise src.error(block[0], f"probability block for undeclared variable {shown(child)}")
    cycle = _find_cycle({child: block[2] for child, block in cpt_blocks.items()})
    if cycle:
        raise src.error(
            cpt_blocks[cycle[0]][0],
            f"the parents form a cycle, {name_list(cycle, sep=' -> ')}: a Bayesian network must be acyclic",
        )

    if off:
        worst = max(off, key=lambda o: abs(o[1] - 1))
        warnings.warn(
            f"{label}: the CPTs of {name_list(v for v, _ in off)} have rows that "
            f"do not sum to 1 (a row of {worst[0]}'s sums to {worst[1]:.6g}); they "
            "are used as written, not normalized",
            CPTSumWarning,
            stacklevel=2,
        )
    graph_name = name or stem or network_name or "bif"
    return factor_graph(
        {v.name: len(v.states) for v in variables.values()},
        factors,
        name=graph_name,
        states={v.name: v.states for v in variables.values()},
    )


def _find_cycle(parents: dict[str, list[str]]) -> list[str] | None:
    """A cycle of parent links as [v, ..., v], each a parent of the next, or None."""
    done: set = set()
    for root in parents:
        if root in done:
            continue
        path, on_path = [root], {root: 0}
        todo = [iter(parents.get(root, ()))]  # depth-first, without recursion
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                v = path.pop()
                del on_path[v]
                done.add(v)
                todo.pop()
            elif nxt in on_path:  # reversed: parent -> child, the way arrows are drawn
                return (path[on_path[nxt] :] + [nxt])[::-1]
            elif nxt not in done:
                on_path[nxt] = len(path)
                path.append(nxt)
                todo.append(iter(parents.get(nxt, ())))
    return None


def _cpt_header(src: _Text, header: str, pos: int) -> tuple[str, list[str]]:
    """(child, parents) from `CHILD | P1, P2` (or the old `CHILD P1 P2` spelling)."""
    if "|" in header:
        left, _, right = header.partition("|")
        child_names, parents = _names(left), _names(right)
    else:
        names = _names(header)
        child_names, parents = names[:1], names[1:]
    if len(child_names) != 1:
        raise src.error(pos, f"probability ({one_line(header.strip())}): expected one child variable")
    return child_names[0], parents


def _variable_states(src: _Text, var: str, start: int, end: int) -> list[str]:
    states: list[str] | None = None
    for offset, stmt in _statements(src.text[start:end]):
        where = start + offset
        stmt = stmt.strip()
        if stmt.endswith("\0"):
            raise src.error(where, f"variable {shown(var)}: missing ';' after {stmt[:-1][:40]!r}")
        if stmt.startswith("property") or not stmt:
            continue
        m = _TYPE.match(stmt)
        if not m:
            raise src.error(
                where,
                f"variable {shown(var)}: expected 'type discrete [ K ] {{ states "
                f"}};' or 'property', found {stmt[:40]!r}",
            )
        if states is not None:
            raise src.error(where, f"variable {shown(var)}: a second type declaration")
        size, states = int(m.group(1)), _names(m.group(2))
        if size != len(states):
            raise src.error(where, f"variable {shown(var)}: declares {size} states but lists {len(states)}")
        if len(set(states)) != len(states):
            raise src.error(where, f"variable {shown(var)}: a state name is listed twice")
        if size < 1:
            raise src.error(where, f"variable {shown(var)}: no states")
    if states is None:
        raise src.error(start, f"variable {shown(var)}: no 'type discrete' declaration")
    return states


def _floats(src: _Text, tokens: list[str], where: int, what: str) -> np.ndarray:
    try:
        values = np.array(tokens, dtype=np.float64)
    except ValueError:
        bad = next(t for t in tokens if not is_number(t))
        raise src.error(where, f"{what}: {clip(bad)!r} is not a number") from None
    return values


def _number_list(src: _Text, text: str, pos: int, n: int, where: int, what: str) -> tuple[np.ndarray, int]:
    """(the first n numbers, how many there are) of the comma and/or space separated
    numbers of `text` from `pos` on. Split a bounded chunk at a time (a list of every token
    costs ~60 bytes each, 30x the text `1,1,1,...`), into an array of the n expected:
    beyond n they are only counted."""
    values = np.empty(n)
    count = 0
    while pos < len(text):
        end = pos + _NUMBER_CHUNK
        if end < len(text):  # extend to a separator so that no number is cut in two
            m = _SEPARATOR.search(text, end)
            end = m.start() if m else len(text)
        tokens = text[pos:end].replace(",", " ").split()
        if count < n:
            part = _floats(src, tokens[: n - count], where, what)
            values[count : count + part.size] = part
        count += len(tokens)
        pos = end
    return values[:count], count


def _cpt(
    src: _Text,
    variables: dict[str, _Variable],
    pos: int,
    child: str,
    parents: list[str],
    start: int,
    end: int,
) -> tuple[tuple[str, ...], np.ndarray]:
    """The (scope, values) factor of one probability block."""
    where = f"variable {shown(child)}"
    for p in parents:
        if p not in variables:
            raise src.error(pos, f"{where}: unknown parent {shown(p)}")
    if child in parents or len(set(parents)) != len(parents):
        raise src.error(pos, f"{where}: a variable appears twice in the probability header")
    k = len(variables[child].states)
    parent_vars = [variables[p] for p in parents]
    parent_shape = tuple(len(v.states) for v in parent_vars)
    n_configs = math.prod(parent_shape)
    # A `default` row fills every parent configuration: a few bytes of text can ask for a
    # table larger than memory. Refuse it here rather than in numpy's allocator.
    table_bytes = 8 * k * n_configs
    if table_bytes > 1 << 24 and table_bytes > memory_limit():  # small ones skip the lookup
        raise src.error(
            pos,
            f"{where}: the CPT has {k * n_configs:,} entries "
            f"({format_bytes(table_bytes)}), more than the memory limit of "
            f"{format_bytes(memory_limit())} (CATBP_JIT_MAX_BYTES)",
        )
    strides = [math.prod(parent_shape[i + 1 :]) for i in range(len(parents))]

    table: np.ndarray | None = None  # (n_configs, k): row r = parent configuration r
    default: np.ndarray | None = None
    # Rows as int64 arrays and their values parsed every _NUMBER_CHUNK tokens: lists of
    # Python ints and strings would take ~30x the text of the rows.
    row_configs = array("q")
    row_places = array("q")  # where each row is, for messages
    row_values: list[str] = []  # not yet parsed
    row_parts: list[np.ndarray] = []  # parsed
    text = src.text
    for offset, stmt in _statements(text[start:end]):
        at = start + offset + _after_space(stmt, 0)
        stmt = stmt.strip()
        if stmt.endswith("\0"):
            raise src.error(at, f"{where}: missing ';' at the end of {stmt[: min(40, len(stmt) - 1)]!r}")
        if not stmt:
            continue
        if stmt[0] == "(":
            close = stmt.find(")")
            if close < 0:
                raise src.error(at, f"{where}: a row's parent states lack their ')'")
            labels = _names(stmt[1:close])
            if len(labels) != len(parents):
                raise src.error(
                    at,
                    f"{where}: row ({one_line(stmt[1:close].strip())}) "
                    f"gives {len(labels)} parent states, there are {len(parents)} "
                    f"parents ({name_list(parents)})",
                )
            config = 0
            for label, pv, stride in zip(labels, parent_vars, strides):
                state = pv.index.get(label)
                if state is None:
                    raise src.error(
                        at,
                        f"{where}: row ({one_line(stmt[1:close].strip())}): "
                        f"{shown(label)} is not a state of parent {shown(pv.name)} (states: "
                        f"{name_list(pv.states)})",
                    )
                config += state * stride
            entries = stmt[close + 1 :].replace(",", " ").split()
            if len(entries) != k:
                raise src.error(
                    at,
                    f"{where}: row ({one_line(stmt[1:close].strip())}) has "
                    f"{len(entries)} values, the child has {k} states",
                )
            row_configs.append(config)
            row_values.extend(entries)
            row_places.append(at)
            if len(row_values) >= _NUMBER_CHUNK:
                row_parts.append(_floats(src, row_values, at, f"{where}: rows"))
                row_values.clear()
            continue
        word = _WORD.match(stmt)  # not split(): that copies the statement
        assert word is not None  # stmt is stripped, not empty and not a row
        keyword = word.group()
        if keyword == "table":
            if table is not None:
                raise src.error(at, f"{where}: a second 'table'")
            values, count = _number_list(src, stmt, len(keyword), k * n_configs, at, f"{where}: table")
            if count != k * n_configs:
                raise src.error(
                    at,
                    f"{where}: table has {count} values, expected "
                    f"{k * n_configs} ({k} states x {n_configs} parent "
                    "configurations)",
                )
            # Child slowest, last parent fastest: (k, n_configs) -> rows by configuration.
            table = values.reshape(k, n_configs).T.copy()
        elif keyword == "default":
            if default is not None:
                raise src.error(at, f"{where}: a second 'default'")
            default, count = _number_list(src, stmt, len(keyword), k, at, f"{where}: default")
            if count != k:
                raise src.error(at, f"{where}: default has {count} values, the child has {k} states")
        elif keyword != "property":
            raise src.error(
                at,
                f"{where}: expected a row '( states ) values;', 'table', "
                f"'default' or 'property', found {stmt[:40]!r}",
            )

    given = np.full(n_configs, table is not None)  # which rows have values
    if table is None:
        table = np.zeros((n_configs, k))
    if row_configs:
        configs = np.frombuffer(row_configs, dtype=np.int64)
        if np.unique(configs).size != configs.size:
            seen = set()
            for config, at in zip(row_configs, row_places):
                if config in seen:
                    raise src.error(at, f"{where}: this parent configuration already has a row")
                seen.add(config)
        row_parts.append(_floats(src, row_values, row_places[-1], f"{where}: rows"))
        rows = np.concatenate(row_parts)
        table[configs] = rows.reshape(-1, k)
        given[configs] = True
    if default is not None:
        table[~given] = default
    elif not given.all():
        missing = np.unravel_index(int(np.flatnonzero(~given)[0]), parent_shape)
        described = name_list(f"{v.name}={v.states[i]}" for v, i in zip(parent_vars, missing))
        raise src.error(pos, f"{where}: no row for ({described}) and no table or default")
    bad = np.flatnonzero(~np.isfinite(table) | (table < 0))
    if bad.size:
        r, c = divmod(int(bad[0]), k)
        bad_config = np.unravel_index(r, parent_shape)
        described = name_list(f"{v.name}={v.states[i]}" for v, i in zip(parent_vars, bad_config))
        raise src.error(
            pos,
            f"{where}: P({clip(child)}={clip(variables[child].states[c])}"
            f"{' | ' + described if described else ''}) = {float(table[r, c])!r}; CPT "
            "entries must be finite and non-negative",
        )
    values = np.ascontiguousarray(np.moveaxis(table.reshape(parent_shape + (k,)), -1, 0))
    return (child, *parents), values
