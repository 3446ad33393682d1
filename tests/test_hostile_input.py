"""Hostile input: each bad model, file or option is refused with one clear error (a
FactorGraphError / catbp_jit error naming the place and the reason; on the command line
one stderr line and exit status 2), never a raw traceback, never a wrong answer."""

from __future__ import annotations

import gzip
import json
import time
import tracemalloc

import numpy as np
import pytest

from catbp_jit.cli import main
from catbp_jit.frontend import solve
from catbp_jit.frontend.bif import read_bif
from catbp_jit.frontend.graph import FactorGraphError, factor_graph
from catbp_jit.frontend.uai import read_evidence, read_uai

# ---------------------------------------------------------------------------------------
# factor_graph / solve


def test_a_transposed_table_is_refused_not_reshaped():
    # shape (3, 2) for scope (a:2, b:3) has the right size; reshaping it mixes up the axes
    with pytest.raises(
        FactorGraphError,
        match=r"factor 0 \(scope a, b\): table has shape "
        r"\(3, 2\), the scope's domains give \(2, 3\)",
    ):
        solve({"a": 2, "b": 3}, [(("a", "b"), np.array([[1, 4], [2, 5], [3, 6]]))], target="reference")


def test_a_flat_table_is_row_major_over_the_scope():
    g = factor_graph({"a": 2, "b": 3}, [(("a", "b"), np.arange(6.0))])
    np.testing.assert_array_equal(g.factors[0].values, [[0, 1, 2], [3, 4, 5]])
    with pytest.raises(FactorGraphError, match="1-D table of 6 entries"):
        factor_graph({"a": 2, "b": 3}, [(("a", "b"), np.arange(6.0).reshape(1, 6))])


def test_named_factors_as_a_mapping():
    pa, pba = np.array([0.3, 0.7]), np.array([[0.9, 0.1], [0.2, 0.8]])
    named = solve({"a": 2, "b": 2}, {"f_a": (("a",), pa), "f_ab": (("a", "b"), pba)}, target="reference")
    listed = solve({"a": 2, "b": 2}, [(("a",), pa), (("a", "b"), pba)], target="reference")
    assert named.Z == listed.Z
    np.testing.assert_array_equal(named.marginals["b"], listed.marginals["b"])
    with pytest.raises(
        FactorGraphError,
        match=r"factor 'f_ab' \(scope a, b\): values must be "
        "non-negative",
    ):
        factor_graph({"a": 2, "b": 2}, {"f_a": (("a",), pa), "f_ab": (("a", "b"), -pba)})


@pytest.mark.parametrize(
    "domains, factors, message",
    [
        ({"a": "abc"}, [], "variable 'a' has domain size 'abc'; it must be a positive integer"),
        ({"a": None}, [], "variable 'a' has domain size None"),
        ({"a": float("inf")}, [], "variable 'a' has domain size inf"),
        ({"a": float("nan")}, [], "variable 'a' has domain size nan"),
        ({"a": 2.5}, [], "domain size 2.5"),
        ({"a": True}, [], "domain size True"),
        ([("a", 2)], [], "variable domains must be a mapping"),
        ({"a": 2}, 5, "factors must be a sequence of (scope, table) pairs or a mapping"),
        ({"a": 2}, [(("a",), [[1], [1, 2]])], "factor 0 (scope a): the table is not a rectangular"),
        ({"a": 2}, [(("a",), np.array([1j, 2]))], "values must be real numbers, got complex"),
        ({"a": 2}, [(("a",), [None, 1])], "values must be real numbers"),
        ({"a": 2}, [(("a",), ["x", "y"])], "values must be real numbers"),
        ({"a": 2}, [("a", [1, 2])], "the scope must be a sequence of variable names, got 'a'"),
        ({"a": 2}, [(("a", ["b"]), [1, 2])], "unknown variable ['b']"),
        ({"a": 2}, [1], "factor 0: expected a Factor or a (scope, table) pair, got int 1"),
        ({"a": 2}, [(("a",), [1, 2], 3)], "expected a Factor or a (scope, table) pair"),
        ({"a": 10**30}, [(("a",), [1, 2])], "table has shape (2,)"),
    ],
)
def test_bad_factor_graphs_give_one_clear_error(domains, factors, message):
    with pytest.raises(FactorGraphError) as err:
        factor_graph(domains, factors)
    assert message in str(err.value)


def test_integral_floats_are_domain_sizes():
    assert factor_graph({"a": 2.0, "b": np.int64(3)}, []).variables == {"a": 2, "b": 3}


# ---------------------------------------------------------------------------------------
# UAI: bounded work


def _bomb(n_entries: int) -> bytes:
    """A gzip'd MARKOV model whose one table has n_entries zeros: ~1000x compression."""
    text = f"MARKOV\n1\n{n_entries}\n1\n1 0\n{n_entries}\n" + "0 " * n_entries
    return gzip.compress(text.encode(), compresslevel=9, mtime=0)


def test_a_gzip_bomb_is_refused_at_the_cap_with_bounded_memory(tmp_path):
    path = tmp_path / "bomb.uai.gz"
    path.write_bytes(_bomb(32 << 20))  # 64 MiB of text from ~70 KB
    assert path.stat().st_size < 1 << 20
    cap = 4 << 20
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(
            FactorGraphError,
            match=rf"^{path}: the decompressed content is "
            rf"larger than the input limit of 4,194,304 "
            "bytes .*CATBP_JIT_MAX_INPUT_BYTES",
        ):
            read_uai(path, max_input_bytes=cap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - t0 < 5  # generous: the point is it stops at the cap
    assert peak < 4 * cap


def test_the_input_cap_comes_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "small.uai"
    path.write_text("MARKOV\n1\n2\n1\n1 0\n2\n0.5 0.5\n")
    monkeypatch.setenv("CATBP_JIT_MAX_INPUT_BYTES", "10")
    with pytest.raises(FactorGraphError, match="the file is larger than the input limit of 10 "):
        read_uai(path)
    monkeypatch.setenv("CATBP_JIT_MAX_INPUT_BYTES", "1e6")
    assert read_uai(path).variables == {"0": 2}
    monkeypatch.setenv("CATBP_JIT_MAX_INPUT_BYTES", "lots")
    with pytest.raises(
        ValueError, match="CATBP_JIT_MAX_INPUT_BYTES='lots': expected a whole number of bytes"
    ):
        read_uai(path)


def test_a_huge_entry_count_is_refused_before_allocating():
    # 10**12 entries would be an 8 TB array; the file cannot hold them anyway
    text = "MARKOV\n2\n1000000 1000000\n1\n2 0 1\n1000000000000\n0.5 0.5\n"
    with pytest.raises(
        FactorGraphError, match="the file ends early, factor 0's table needs 1000000000000 entries"
    ):
        read_uai(text)


def test_tables_read_in_chunks_equal_the_whole(monkeypatch):
    from catbp_jit.frontend import uai

    rng = np.random.default_rng(3)
    tables = [rng.random(n) for n in (6, 12, 6)]
    text = "MARKOV\n3\n2 3 2\n3\n2 0 1\n3 0 1 2\n2 1 2\n" + "".join(
        f"{t.size}\n" + " ".join(map(repr, t.tolist())) + "\n" for t in tables
    )
    monkeypatch.setattr(uai, "_CHUNK_CHARS", 7)  # a few tokens per chunk, tables span chunks
    g = read_uai(text)
    for f, t in zip(g.factors, tables):
        np.testing.assert_array_equal(f.values.reshape(-1), t)
    bad = text.replace(repr(float(tables[1][9])), "x9")
    with pytest.raises(
        FactorGraphError,
        match=r"<uai text>:11: at token 'x9': factor 1's "
        "table: entry 9 is not a number",
    ):
        read_uai(bad)


@pytest.mark.parametrize(
    "data, message",
    [
        (gzip.compress(b"MARKOV\n1\n2\n1\n1 0\n2\n0.5 0.5\n", mtime=0)[:-12], "not a readable gzip file"),
        (b"\x1f\x8b" + bytes(range(256)) * 4, "not a readable gzip file"),
        (bytes(range(256)) * 4, "the file must start with MARKOV or BAYES"),
        (b"", "the file ends early, expected the preamble"),
        (b"MARKOV -1", "the number of variables must be >= 0"),
        (b"MARKOV 1 2 -3", "the number of factors must be >= 0"),
        (b"MARKOV 99999999999999999999", "the file ends early, expected the domain size of variable 0"),
        (b"MARKOV 1 2 1 1 0 2 inf 1", "entry 0 must be a finite non-negative number"),
        (b"MARKOV 1 2 1 2 0 0 4 1 1 1 1", "factor 0 has a variable twice in its scope"),
        (b"MARKOV 1 2 1 2 0 1", "a variable index in the scope of factor 0 must be in [0, 1)"),
        (b"MARKOV 1 " + b"9" * 5000, "expected the domain size of variable 0 (an integer)"),
    ],
)
def test_garbage_uai_files_give_one_clear_error(tmp_path, data, message):
    assert_one_clear_error(read_uai, tmp_path / "bad.uai", data, message)


def assert_one_clear_error(read, path, data, message):
    """Reading `data` from `path` fails with one short line that names the file."""
    path.write_bytes(data)
    with pytest.raises(FactorGraphError) as err:
        read(path)
    assert str(err.value).startswith(f"{path}") and message in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_huge_evidence_count_is_refused():
    g = read_uai("MARKOV\n1\n2\n1\n1 0\n2\n0.5 0.5\n")
    with pytest.raises(FactorGraphError, match="fits neither the modern layout"):
        read_evidence("99999999999999999 0 1", g)


# ---------------------------------------------------------------------------------------
# BIF

BIF_A = "variable a { type discrete [ 2 ] { x, y }; }\n"


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'network n { property p = "' + "word " * 40_000 + "}",
            "<bif text>:1: this string ('\"') is never closed",
        ),
        (
            BIF_A + 'probability ( a ) { table 0.5, 0.5; property q = "' + "x;" * 100_000 + "}",
            "<bif text>:2: this string",
        ),
        # a quoted string, then a statement that never ends: the old statement regex rescanned
        # the rest of the block from every position
        (
            'variable a { type discrete [2] { x, y }; property p = "q" ' + "z " * 100_000 + "}",
            "variable 'a': missing ';'",
        ),
        ("network n { } /* " + "c " * 100_000, "<bif text>:1: this comment ('/*') is never closed"),
    ],
)
def test_unclosed_bif_strings_are_refused_in_linear_time(text, message):
    assert len(text) >= 200_000
    t0 = time.perf_counter()
    with pytest.raises(FactorGraphError) as err:
        read_bif(text)
    assert time.perf_counter() - t0 < 2
    assert message in str(err.value)


def test_a_quote_inside_a_comment_is_not_a_string():
    g = read_bif('// it said "hi\n' + BIF_A + 'probability ( a ) { table 0.5, 0.5; } /* " */')
    assert g.variables == {"a": 2}


@pytest.mark.parametrize(
    "cpts, cycle",
    [
        (
            "probability (a | b) { table 1, 1, 1, 1; }\nprobability (b | a) { table 1, 1, 1, 1; }\n"
            "probability (c) { table 1, 1; }",
            "a -> b -> a",
        ),
        (
            "probability (a | c) { table 1, 1, 1, 1; }\nprobability (b | a) { table 1, 1, 1, 1; }\n"
            "probability (c | b) { table 1, 1, 1, 1; }",
            "a -> b -> c -> a",
        ),
    ],
)
def test_a_cyclic_bif_is_refused_naming_the_cycle(cpts, cycle):
    variables = "".join(f"variable {v} {{ type discrete [2] {{ x, y }}; }}\n" for v in "abc")
    with pytest.raises(
        FactorGraphError, match=f"the parents form a cycle, {cycle}: a Bayesian network must be acyclic"
    ):
        read_bif(variables + cpts)


def test_a_default_row_cannot_ask_for_a_table_larger_than_memory():
    states = ", ".join(f"s{j}" for j in range(10))
    text = "".join(
        f"variable p{i} {{ type discrete [10] {{ {states} }}; }}\n"
        f"probability (p{i}) {{ default {', '.join(['0.1'] * 10)}; }}\n"
        for i in range(30)
    )
    text += BIF_A + f"probability (a | {', '.join(f'p{i}' for i in range(30))}) {{ default 0.5, 0.5; }}"
    with pytest.raises(
        FactorGraphError,
        match=r"<bif text>:62: variable 'a': the CPT has "
        r"2,000,000,.* entries .* more than the memory "
        "limit",
    ):
        read_bif(text)


@pytest.mark.parametrize(
    "data, message",
    [
        (bytes(range(256)) * 4, "expected 'network', 'variable' or 'probability'"),
        (b"\x1f\x8b\x08\x00garbage", "not a readable gzip file"),
        (b"network x {", "this '{' is never closed"),
        (BIF_A.encode(), "variable 'a' has no probability block"),
        (b"variable a { type discrete [ 0 ] { }; }", "variable 'a': no states"),
        ((BIF_A + "probability ( a ) { table 1, nan; }").encode(), "CPT entries must be finite"),
        ((BIF_A + "probability ( a ) { table 1e400, 1; }").encode(), "P(a=x) = inf"),
        ((BIF_A + BIF_A).encode(), "variable 'a' is declared twice"),
    ],
)
def test_garbage_bif_files_give_one_clear_error(tmp_path, data, message):
    assert_one_clear_error(read_bif, tmp_path / "bad.bif", data, message)


# ---------------------------------------------------------------------------------------
# The command line

ASIA = str(__import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "asia.bif")
# P(0=1, 1=1) = 0: observing both is impossible
ZERO_UAI = "MARKOV\n2\n2 2\n1\n2 0 1\n4\n1 0 0 0\n"


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _strict_json(text):
    def refuse(token):
        raise AssertionError(f"not JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def test_impossible_evidence_exits_1_in_every_format(capsys, tmp_path):
    model = tmp_path / "zero.uai"
    model.write_text(ZERO_UAI)
    evidence = ("--observe", "0=1", "--observe", "1=1", "-q", "--target", "reference")
    code, out, err = run(capsys, "solve", str(model), *evidence)
    assert code == 1
    assert "Z:         0.0 (the evidence is impossible" in out and "marginals: undefined" in out
    code, out, err = run(capsys, "solve", str(model), *evidence, "--format", "uai")
    assert code == 1 and out == ""
    assert "zero: Z is 0: the evidence is impossible" in err and err.count("\n") == 1
    code, out, err = run(capsys, "solve", str(model), *evidence, "--format", "json")
    doc = _strict_json(out)  # no bare NaN
    assert code == 1 and doc["answered"] is False and doc["Z"] == 0.0 and doc["log_Z"] is None
    assert doc["marginals"] == {"0": None, "1": None}
    assert doc["reason"].startswith("Z is 0: the evidence is impossible")
    code, out, _ = run(
        capsys, "solve", str(model), "--observe", "0=0", "-q", "--format", "json", "--target", "reference"
    )
    doc = _strict_json(out)
    assert code == 0 and doc["answered"] is True and doc["reason"] is None
    assert doc["marginals"]["1"] == [1.0, 0.0]


def test_solve_help_documents_the_exit_statuses(capsys):
    code, out, _ = run(capsys, "solve", "--help")
    assert code == 0
    assert "0 answered; 1 no answer exists" in " ".join(out.split()) and "2 bad input" in out


@pytest.mark.parametrize("name, text", [("empty.bif", ""), ("none.uai", "MARKOV 0 0")])
def test_a_model_without_variables_is_solved(capsys, tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    code, out, _ = run(capsys, "solve", str(path), "-q", "--target", "reference")
    assert code == 0
    assert "Z:         1.0" in out and "marginals: none (the model has no variables)" in out


def test_repeated_observations_must_agree(capsys, tmp_path):
    code, out, _ = run(
        capsys, "solve", ASIA, "--observe", "dysp=yes", "--observe", "dysp=0", "-q", "--target", "reference"
    )
    assert code == 0 and "evidence:  dysp=yes\n" in out  # the same state, named twice
    code, _, err = run(capsys, "solve", ASIA, "--observe", "dysp=0", "--observe", "dysp=1", "-q")
    assert code == 2 and "--observe 'dysp=1': dysp is already observed as 0" in err
    ev = tmp_path / "ev.json"
    ev.write_text('{"dysp": "yes"}')
    code, _, err = run(capsys, "solve", ASIA, "--evidence", str(ev), "--observe", "dysp=no", "-q")
    assert code == 2 and "dysp is already observed as 'yes'" in err


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[1, 2]", "JSON evidence must be an object {variable: state}, got list [1, 2]"),
        (b'"ab"', 'JSON evidence must be an object {variable: state}, got str "ab"'),
        (b'{"dysp": "yes", "dysp": 1}', "'dysp' is observed twice, as 'yes' and 1"),
        (b"\xff\xfe{", "not a UTF-8 text file"),
        (b'{"dysp": ', "not valid JSON"),
        (b'{"dysp": [1]}', "evidence dysp=[1] is not a state of dysp"),
    ],
)
def test_bad_json_evidence_is_one_line(capsys, tmp_path, content, message):
    ev = tmp_path / "ev.json"
    ev.write_bytes(content)
    code, out, err = run(capsys, "solve", ASIA, "--evidence", str(ev), "-q")
    assert code == 2 and message in err and err.count("\n") == 1


def test_bad_models_on_the_command_line_are_one_line(capsys, tmp_path):
    cyclic = tmp_path / "cyclic.bif"
    cyclic.write_text(
        "variable a { type discrete [2] { x, y }; }\n"
        "variable b { type discrete [2] { x, y }; }\n"
        "probability (a | b) { table 1, 1, 1, 1; }\n"
        "probability (b | a) { table 1, 1, 1, 1; }\n"
    )
    bomb = tmp_path / "bomb.uai.gz"
    bomb.write_bytes(_bomb(1 << 20))
    for argv, message in [
        ([str(cyclic)], "the parents form a cycle, a -> b -> a"),
        ([str(tmp_path)], "is a directory, not a model file"),
        ([str(bomb)], "larger than the input limit of 100,000 bytes"),
    ]:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("CATBP_JIT_MAX_INPUT_BYTES", "100000")
            code, out, err = run(capsys, "solve", *argv, "-q")
        assert code == 2 and message in err and err.count("\n") == 1, err


def test_kernel_cache_settings_are_input_errors(capsys, tmp_path, monkeypatch):
    from catbp_jit import cache

    monkeypatch.setenv("CATBP_JIT_CACHE", "bogus")
    with cache.fresh_default_cache():  # the process-wide cache reads the env once
        code, _, err = run(capsys, "solve", ASIA, "-q")
    assert code == 2 and err.count("\n") == 1
    assert "CATBP_JIT_CACHE='bogus': expected one of fallback, strict, off" in err


# A two-variable model: few kernels, so a solve that compiles them all in memory is quick
SMALL_UAI = "MARKOV\n2\n2 2\n1\n2 0 1\n4\n1 2 3 4\n"

# `catbp-jit ARGV...` in a fresh interpreter whose files cannot grow past LIMIT bytes
# (RLIMIT_FSIZE; -1: no limit): a write past it fails with EFBIG, as one on a full disk
# fails with ENOSPC. (A subprocess: the logger's one line goes to its real stderr.)
CLI_LIMITED = r"""
import resource, signal, sys
limit = int(sys.argv[1])
if limit >= 0:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
from catbp_jit.cli import main
sys.exit(main(sys.argv[2:]))
"""


def run_cli(tmp_path, cache_dir, *argv, limit=-1, policy="fallback"):
    import os
    import subprocess
    import sys

    from catbp_jit.cache import KernelCache

    KernelCache(tmp_path / "warm")._prepare_dir()  # the session's key file exists
    env = dict(
        os.environ, CATBP_JIT_CACHE_DIR=str(cache_dir), CATBP_JIT_CACHE=policy, CATBP_JIT_COMPILE_WORKERS="0"
    )
    return subprocess.run(
        [sys.executable, "-c", CLI_LIMITED, str(limit), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@pytest.mark.parametrize("problem", ["a file", "a full disk"])
def test_an_unusable_cache_directory_is_one_line_and_still_answers(tmp_path, problem):
    model = tmp_path / "small.uai"
    model.write_text(SMALL_UAI)
    if problem == "a file":
        cache_dir, limit = tmp_path / "a_file", -1
        cache_dir.write_text("")
        reason = "is not a directory"
    else:
        cache_dir, limit, reason = tmp_path / "cache", 100, "File too large"
    r = run_cli(tmp_path, cache_dir, "solve", str(model), "-q", limit=limit)
    assert r.returncode == 0, r.stderr
    assert "Z:         10.0" in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"kernel cache directory {str(cache_dir)!r} is not writable (" in lines[0]
    assert reason in lines[0] and "compiled in memory" in lines[0]
    if problem == "a file":  # strict: an error naming the directory
        r = run_cli(tmp_path, cache_dir, "solve", str(model), "-q", policy="strict")
        assert r.returncode == 2 and r.stdout == "", r.stdout
        assert r.stderr.startswith(
            f"catbp-jit: error: kernel cache directory {str(cache_dir)!r} is not writable ("
        )
        assert r.stderr.count("\n") == 1, r.stderr


# ---------------------------------------------------------------------------------------
# Bundles and saved executables


@pytest.fixture
def tiny_bundle(tmp_path):
    from catbp_jit.bundle import Bundle, save_bundle
    from catbp_jit.frontend import compile_model

    g = factor_graph({"a": 2, "b": 2}, [(("a",), [0.3, 0.7]), (("a", "b"), [[0.9, 0.1], [0.2, 0.8]])])
    m = compile_model(g, target="reference")
    b = Bundle(
        "tiny",
        "tiny",
        "PROB",
        np.dtype("float64"),
        False,
        {f: (m.built.values[f], m.factor_specs[f]) for f in m.factor_specs},
        {},
        list(m.programs),
    )
    return save_bundle(b, tmp_path / "tiny")


def test_a_truncated_or_garbled_bundle_is_one_error(capsys, tiny_bundle):
    from catbp_jit.bundle import BundleError, load_bundle

    npz = tiny_bundle / "arrays.npz"
    data = npz.read_bytes()
    npz.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match=r"bundle 'tiny': arrays.npz cannot be read"):
        load_bundle(tiny_bundle)
    code, _, err = run(capsys, "list", str(tiny_bundle))
    assert code == 2 and "arrays.npz cannot be read" in err and err.count("\n") == 1
    npz.write_bytes(data)
    meta = json.loads((tiny_bundle / "bundle.json").read_text())
    meta["programs"][0]["instructions"][0]["args"] = 5
    (tiny_bundle / "bundle.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match=r"instruction \[0\]: 'args' must be an object"):
        load_bundle(tiny_bundle)
    (tiny_bundle / "bundle.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(BundleError, match="bundle.json is not valid JSON"):
        load_bundle(tiny_bundle)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not a saved catbp_jit executable (not JSON"),
        (b"\xff\xfe\x00\x01", "is not a saved catbp_jit executable (not JSON"),
        (b'{"format": "catbp-jit-executable", "version": 1, "programs": [', "(not JSON"),
        (b"[1, 2]", "is not a saved catbp_jit executable (version 1)"),
        (b'{"format": "catbp-jit-executable", "version": 1}', "no 'dtype'"),
        (
            b'{"format": "catbp-jit-executable", "version": 1, "dtype": [], "semiring": "PROB"}',
            "'dtype': expected a string, got list",
        ),
        (
            b'{"format": "catbp-jit-executable", "version": 1, "dtype": "float64", "programs": 5}',
            "'programs': expected an array, got int",
        ),
    ],
)
def test_load_refuses_what_is_not_a_saved_executable(tmp_path, content, message):
    from catbp_jit.compiler import load
    from catbp_jit.executable import SavedExecutableError

    path = tmp_path / "exe.json"
    path.write_bytes(content)
    with pytest.raises(SavedExecutableError) as err:
        load(path)
    assert isinstance(err.value, ValueError)
    assert str(err.value).startswith(repr(str(path))) and message in str(err.value)


# ---------------------------------------------------------------------------------------
# Environment variables: every one catbp_jit reads is checked by catbp_jit.environment

BUNDLE = str(
    __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "grid3_d2__prob_float64"
)

BAD_SETTINGS = [
    ("CATBP_JIT_MAX_BYTES", "inf", "a whole number of bytes"),
    ("CATBP_JIT_MAX_BYTES", "1e400", "a whole number of bytes"),
    ("CATBP_JIT_MAX_BYTES", "0", "a whole number of bytes"),
    ("CATBP_JIT_MAX_INPUT_BYTES", "lots", "a whole number of bytes"),
    ("CATBP_JIT_COMPILE_WORKERS", "abc", "a whole number of worker processes"),
    ("CATBP_JIT_COMPILE_WORKERS", "-1", "a whole number of worker processes"),
    ("CATBP_JIT_COMPILE_WORKERS", "1.5", "a whole number of worker processes"),
    ("CATBP_JIT_LOCK_TIMEOUT", "nan", "a number of seconds"),
    ("CATBP_JIT_LOCK_TIMEOUT", "inf", "a number of seconds"),
    ("CATBP_JIT_LOCK_TIMEOUT", "-1", "a number of seconds"),
    ("CATBP_JIT_CACHE", "bogus", "one of fallback, strict, off"),
    ("CATBP_JIT_TRUSTED_CACHE", "maybe", "1, true, yes, on"),
]


def _expect_setting_error(err, name, value, accepted):
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{name}={value!r}" in err and accepted in err, err


@pytest.mark.parametrize("name, value, accepted", BAD_SETTINGS)
@pytest.mark.parametrize("command", ["solve", "aot"])
def test_a_bad_environment_variable_is_one_line_on_the_command_line(
    capsys, tmp_path, monkeypatch, command, name, value, accepted
):
    from catbp_jit import cache

    monkeypatch.setenv(name, value)
    extra = ["-o", str(tmp_path / "asia.profile.json")] if command == "aot" else []
    with cache.fresh_default_cache():  # the process-wide cache reads the env once
        code, out, err = run(capsys, command, ASIA, "-q", *extra)
    assert code == 2 and out == ""
    _expect_setting_error(err, name, value, accepted)
    assert not (tmp_path / "asia.profile.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["run", BUNDLE, "--repeat", "1"],
        ["list", BUNDLE],
        ["plan", ASIA, "--no-listing"],
        ["solve", ASIA, "-q"],
    ],
)
def test_every_subcommand_checks_the_environment_first(capsys, monkeypatch, argv):
    monkeypatch.setenv("CATBP_JIT_LOCK_TIMEOUT", "nan")
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    _expect_setting_error(err, "CATBP_JIT_LOCK_TIMEOUT", "nan", "a number of seconds")


def test_python_callers_get_the_environment_error(monkeypatch, tmp_path):
    from catbp_jit.cache import KernelCache
    from catbp_jit.codegen.workers import WorkerOptions
    from catbp_jit.environment import EnvironmentSettingError
    from catbp_jit.frontend.uai import input_limit
    from catbp_jit.memory import memory_limit

    for name, value, call in [
        ("CATBP_JIT_MAX_BYTES", "1e400", memory_limit),
        ("CATBP_JIT_MAX_INPUT_BYTES", "inf", input_limit),
        ("CATBP_JIT_COMPILE_WORKERS", "1.5", WorkerOptions.resolve),
        ("CATBP_JIT_LOCK_TIMEOUT", "inf", lambda: KernelCache(tmp_path)),
        ("CATBP_JIT_CACHE", "sometimes", lambda: KernelCache(tmp_path)),
        ("CATBP_JIT_TRUSTED_CACHE", "2", lambda: KernelCache(tmp_path)),
    ]:
        with monkeypatch.context() as mp:
            mp.setenv(name, value)
            with pytest.raises(EnvironmentSettingError) as err:
                call()
        assert isinstance(err.value, ValueError)
        assert (err.value.name, err.value.value) == (name, value)
        assert str(err.value).startswith(f"environment variable {name}={value!r}: expected ")


@pytest.mark.parametrize(
    "name, value, parsed",
    [
        ("CATBP_JIT_MAX_BYTES", "8e9", 8 * 10**9),
        ("CATBP_JIT_MAX_BYTES", " 4096 ", 4096),
        ("CATBP_JIT_MAX_INPUT_BYTES", "1_000", 1000),
        ("CATBP_JIT_COMPILE_WORKERS", "0", 0),
        ("CATBP_JIT_LOCK_TIMEOUT", "0.5", 0.5),
        ("CATBP_JIT_TRUSTED_CACHE", "Yes", True),
        ("CATBP_JIT_TRUSTED_CACHE", "off", False),
        ("CATBP_JIT_CACHE", " Strict", "strict"),
        ("CATBP_JIT_CACHE", "", None),
    ],
)
def test_good_environment_values_are_read(monkeypatch, name, value, parsed):
    from catbp_jit import environment

    monkeypatch.setenv(name, value)
    assert environment.READERS[name]() == parsed
    environment.check_all()


# ---------------------------------------------------------------------------------------
# Semiring dtypes the kernels do not support


@pytest.mark.parametrize(
    "name, dtype", [("prob", "float16"), ("logprob", "int8"), ("count", "int8"), ("prob", "complex128")]
)
def test_compile_refuses_a_dtype_it_has_no_kernels_for(name, dtype):
    import catbp_jit as cj
    from catbp_jit.frontend import compile_model
    from catbp_jit.semiring import SEMIRINGS, SemiringDtypeError

    g = factor_graph({"a": 2, "b": 2}, [(("a",), [0.3, 0.7]), (("a", "b"), [[0.9, 0.1], [0.2, 0.8]])])
    m = compile_model(g, target="reference")
    sr = cj.make_semiring(name, dtype)
    supported = ", ".join(SEMIRINGS[name.upper()].dtypes)
    message = f"semiring {name.upper()} in {dtype}: compiled kernels exist for {supported} only"
    for target in ("cpu", "cuda"):
        with pytest.raises(SemiringDtypeError, match=message):
            cj.compile(m.programs, sr, factor_specs=m.factor_specs, target=target)
    with pytest.raises(SemiringDtypeError, match=message):  # before any planning
        compile_model(g, name, dtype=dtype)
    assert issubclass(SemiringDtypeError, ValueError)
    if dtype == "float16":  # the reference interpreter takes any numpy dtype, as CatBP's
        assert compile_model(g, name, dtype=dtype, target="reference").solve().Z == 1
