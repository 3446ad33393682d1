"""The house rules a test can hold: no file cites a document that lives outside the
repository; no new import circle inside the package; no test file imports from another
(what tests share lives in helper modules: tests/jit_helpers.py, random_programs.py, ...)."""

import ast
import re
import subprocess

from conftest import REPO

# documents that exist only beside a development checkout, never in a user's clone
OUTSIDE = re.compile(r"DESIGN\.md|shared/docs|\bseeds?[/ ]0\d\d")


def test_no_file_cites_a_document_outside_the_repository():
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    cited = []
    for name in files:
        if name.endswith((".py", ".md", ".toml", ".cfg", ".ini", ".txt")) and name != "tests/test_house.py":
            text = (REPO / name).read_text(encoding="utf-8", errors="replace")
            cited += [
                f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in OUTSIDE.finditer(text)
            ]
    assert not cited, "\n".join(cited)


def _imports(path, module: str, is_package: bool):
    """The catbp_jit modules `module` imports, at run time (not under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = module.split(".")
            if node.level:
                parts = parts[: len(parts) - node.level + is_package]
            base = ".".join(parts + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def import_graph():
    modules = {}
    for path in (REPO / "catbp_jit").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return {
        m: {
            t
            for t in _imports(p, m, p.name == "__init__.py")
            if t in modules and t != m and not m.startswith(t + ".")
        }
        for m, p in modules.items()
    }


def circles(graph):
    """The import circles: strongly connected sets of two or more modules (Tarjan)."""
    index, low, stack, found = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(part) > 1:
                found.append(frozenset(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return set(found)


# Circles still to be taken apart, each by its own change: the list only shrinks.
KNOWN_CIRCLES: set[frozenset[str]] = set()


def test_the_circle_finder_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == {frozenset("abc")}


def test_no_new_import_circle():
    found = circles(import_graph())
    assert found <= KNOWN_CIRCLES, f"new import circles: {found - KNOWN_CIRCLES}"
    assert found == KNOWN_CIRCLES, f"circles gone, strike them from KNOWN_CIRCLES: {KNOWN_CIRCLES - found}"


def test_no_test_file_imports_from_another():
    """A test file is run alone, moved or deleted without breaking another: what two test
    files share lives in a helper module of tests/ that is not a test_*.py file."""
    tests = REPO / "tests"
    names = {p.stem for p in tests.glob("test_*.py")}
    found = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                modules = [node.module]
            else:
                continue
            found += [
                f"tests/{path.name}:{node.lineno}: imports {m}" for m in modules if m.split(".")[0] in names
            ]
    assert not found, "\n".join(found)
