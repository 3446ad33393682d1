"""Hostile inputs for every reader: each case damages one input and runs what reads it.

    python perf/hostile_fuzz.py --count 10000 [--seed 0] [--workers 2] [--timeout 10]
                                [--out DIR] [--readers uai,bif,...]

Readers: UAI models, .evid and JSON evidence, BIF models, evidence tables (CSV, Parquet),
bundles (bundle.json, arrays.npz), saved executables and model profiles (made at start
with `catbp-jit aot examples/asia.bif`), and the CATBP_JIT_* environment variables. Seeds
are files shipped in the repository; a case applies one to three mutations (truncation,
byte flips, insertion, deletion, a 10^6-character field, duplicated lines, NUL bytes,
bytes that are not UTF-8, extreme numbers) and runs the command line's own entry point,
catbp_jit.cli.main(argv), in a long-lived worker process (importing Numba per case would
cost a second each). Saved executables and profiles have no command of their own: a case
calls catbp_jit.load or model_source, and their documented errors count as exit status 2.

Outcomes: ok (0), no-answer (1), refused (2, one `catbp-jit: error:` line); failures:
traceback (an exception escaped), hang (over --timeout seconds: the worker is killed and
replaced), crash (the worker died), bad-exit (another status), messy (status 2 without
exactly one short error line). The first reproducer of each failure kind and reader is
saved under --out (the input files, case.json with argv and environment, the output).
Exit status: the number of failures (at most 100).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from multiprocessing.connection import wait
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ASIA = REPO / "examples" / "asia.bif"
UAI_DIR = REPO / "tests" / "data" / "uai2014" / "problems"
BUNDLES = [
    REPO / "examples" / "grid3_d2__prob_float64",
    REPO / "tests" / "data" / "corpus" / "chain8__prob_float64",
    REPO / "tests" / "data" / "corpus" / "coloring_cycle5__sat_bool",
]
READERS = ("uai", "bif", "evid", "json", "csv", "parquet", "bundle", "executable", "profile", "environment")
FAILURES = ("traceback", "hang", "crash", "bad-exit", "messy")
MAX_ERROR_LINE = 1000  # characters: an error line longer than this is no clear line
BIG = 10**6  # characters in an oversized field
MAX_ROWS = 300  # lines of a CSV evidence table
MAX_GROWTH = 4 * BIG  # bytes duplicated lines may add: bigger only measures reading speed

# Every variable environment.py reads, with a good value to start mutating from. Paths are
# relative, so that no mutation makes the fuzzer write outside its work directory.
ENV_VALUES = {
    "CATBP_JIT_CACHE": "fallback",
    "CATBP_JIT_CACHE_DIR": "cache",
    "CATBP_JIT_KEY_FILE": "key",
    "CATBP_JIT_LOCK_TIMEOUT": "10",
    "CATBP_JIT_TRUSTED_CACHE": "yes",
    "CATBP_JIT_MAX_BYTES": "8e9",
    "CATBP_JIT_MAX_INPUT_BYTES": "1000000000",
    "CATBP_JIT_COMPILE_WORKERS": "0",
    "CATBP_JIT_TIER": "auto",
    "CATBP_JIT_BNLEARN_DIR": "bn",
}
INTERESTING = [
    b"0",
    b"-1",
    b"1e400",
    b"-1e400",
    b"nan",
    b"inf",
    b"99999999999999999999",
    b"2147483648",
    b"9223372036854775808",
    b"0.5",
    b"1e-320",
    b"",
    b"\xff",
    b'"',
    b"{",
    b"}",
    b";",
    b"(",
    b"|",
    b"x" * 100,
]


# ---------------------------------------------------------------------------------------
# Mutations: bytes -> bytes, each drawing from the case's own random generator


def truncate(rng, data):
    return data[: rng.randrange(len(data) + 1)]


def flip(rng, data):
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def insert(rng, data):
    at = rng.randrange(len(data) + 1)
    return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))) + data[at:]


def delete(rng, data):
    at = rng.randrange(len(data) + 1)
    return data[:at] + data[at + rng.randint(1, 64) :]


def oversize(rng, data):
    """A field of 10^6 characters: a token made huge, or a huge one put in."""
    tokens = data.split()
    token = rng.choice(tokens) if tokens and rng.random() < 0.7 else b"x"
    fill = rng.choice([token[:1] or b"x", b"9", b"a", b" ", b",", b"\\", b"[", b"{"])
    at = rng.randrange(len(data) + 1)
    return data[:at] + token + fill * BIG + data[at:]


def duplicate_lines(rng, data):
    lines = data.splitlines(keepends=True)
    if not lines:
        return data
    i = rng.randrange(len(lines))
    j = min(len(lines), i + rng.randint(1, 5))
    block = lines[i:j]
    times = min(rng.choice([1, 2, 10, 1000]), max(1, MAX_GROWTH // sum(map(len, block))))
    return b"".join(lines[:j] + block * times + lines[j:])


def nul(rng, data):
    at = rng.randrange(len(data) + 1)
    return data[:at] + b"\0" * rng.choice([1, 3, 100]) + data[at:]


def not_utf8(rng, data):
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice([b"\xff", b"\xc3(", b"\xed\xa0\x80", b"\xfe\xff", b"\x80" * 9]) + data[at:]


def extreme_number(rng, data):
    """A token replaced by an extreme or structural value."""
    tokens = [t for t in data.split() if t]
    if not tokens:
        return data
    token = rng.choice(tokens)
    at = data.find(token, rng.randrange(len(data)))
    at = data.find(token) if at < 0 else at
    return data[:at] + rng.choice(INTERESTING) + data[at + len(token) :]


MUTATIONS = [truncate, flip, insert, delete, oversize, duplicate_lines, nul, not_utf8, extreme_number]


def mutate(rng, data: bytes):
    names = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        m = rng.choice(MUTATIONS)
        data = m(rng, data)
        names.append(m.__name__)
    return data, names


# ---------------------------------------------------------------------------------------
# Cases: what to write, what to run (made in the parent, so a hang can still be saved)


def setup(work: Path) -> dict[str, object]:
    """The seeds: files of the repository, plus a saved profile of asia made with the
    command line and an evidence table of asia as CSV and (with pyarrow) Parquet."""
    seeds: dict[str, object] = {"bif": ASIA.read_bytes()}
    seeds["uai"] = {p.name: p.read_bytes() for p in sorted(UAI_DIR.glob("*/*.uai"))}
    seeds["evid"] = {p.name: p.read_bytes() for p in sorted(UAI_DIR.glob("*/*.uai.evid"))}
    seeds["json"] = [b'{"dysp": "yes", "xray": 0}', b'{"smoke": "no"}']
    csv = b"dysp,xray,smoke\nyes,no,\n,yes,no\n0,1,1\nno,,yes\n"
    seeds["csv"] = [csv]
    seeds["bundle"] = {b.name: {f.name: f.read_bytes() for f in b.iterdir()} for b in BUNDLES}
    profile = work / "asia.profile.json"
    env = dict(os.environ, CATBP_JIT_CACHE_DIR=str(work / "kernels"), CATBP_JIT_TIER="compiled")
    subprocess.run(
        [sys.executable, "-m", "catbp_jit", "aot", str(ASIA), "-q", "-o", str(profile)],
        env=env,
        cwd=work,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    seeds["profile"] = [profile.read_bytes()]
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(
            pacsv.read_csv(
                io.BytesIO(csv),
                convert_options=pacsv.ConvertOptions(
                    column_types={c: pa.string() for c in ("dysp", "xray", "smoke")}
                ),
            ),
            sink,
        )
        seeds["parquet"] = [sink.getvalue()]
    except ImportError:
        pass
    return seeds


def make_case(i: int, seed: int, seeds, readers) -> dict:
    rng = random.Random(seed * 1_000_003 + i)
    reader = readers[i % len(readers)]
    files: dict[str, bytes] = {}
    env: dict[str, str] = {}
    entry, mutations = "cli", []
    solve_asia = ["solve", "asia.bif", "--target", "reference", "-q", "--plan-time", "0"]
    if reader == "uai":
        name, data = rng.choice(sorted(seeds["uai"].items()))
        if rng.random() < 0.1:  # damage the compressed stream too
            name, data = name + ".gz", gzip.compress(data)
        files[name], mutations = mutate(rng, data)
        argv = ["plan", name, "-q", "--plan-time", "0", "--no-listing"]
    elif reader == "bif":
        files["m.bif"], mutations = mutate(rng, seeds["bif"])
        argv = (
            ["solve", "m.bif", "--target", "reference"]
            if rng.random() < 0.5
            else ["plan", "m.bif", "--no-listing"]
        ) + ["-q", "--plan-time", "0"]
    elif reader == "evid":
        name, data = rng.choice(sorted(seeds["evid"].items()))
        model = name[: -len(".evid")]
        files[model] = seeds["uai"][model]
        files[name], mutations = mutate(rng, data)
        argv = ["plan", model, "--evidence", name, "-q", "--plan-time", "0", "--no-listing"]
    elif reader == "json":
        files["asia.bif"] = seeds["bif"]
        files["e.json"], mutations = mutate(rng, rng.choice(seeds["json"]))
        argv = solve_asia + ["--evidence", "e.json"]
    elif reader in ("csv", "parquet"):
        files["asia.bif"] = seeds["bif"]
        name = "t." + reader
        files[name], mutations = mutate(rng, rng.choice(seeds[reader]))
        if reader == "csv":  # the reference target solves ~150 rows a second
            files[name] = b"".join(files[name].splitlines(keepends=True)[:MAX_ROWS])
        argv = solve_asia + ["--evidence-table", name, "-o", "out.csv"]
    elif reader == "bundle":
        bundle, content = rng.choice(sorted(seeds["bundle"].items()))
        target = rng.choice(sorted(content))
        for f, data in content.items():
            files[f"b/{f}"] = data
        files[f"b/{target}"], mutations = mutate(rng, content[target])
        argv = (
            ["list", "b"]
            if rng.random() < 0.3
            else ["run", "b", "--engine", "reference", "--repeat", "1", "-q"]
        )
        mutations = [f"{bundle}/{target}"] + mutations
    elif reader in ("executable", "profile"):
        files["p.json"], mutations = mutate(rng, seeds["profile"][0])
        entry, argv = reader, ["p.json"]
        env["CATBP_JIT_CACHE"] = "strict"  # loads from the cache made at setup, never compiles
    else:  # environment
        files["asia.bif"] = seeds["bif"]
        for name in rng.sample(sorted(ENV_VALUES), rng.randint(1, 3)):
            value, names = mutate(rng, ENV_VALUES[name].encode())
            text = value.replace(b"\0", b"").decode("utf-8", "surrogateescape")
            env[name] = "./" + text if text.startswith(("/", "~")) else text
            mutations.append(f"{name}: {'+'.join(names)}")
        argv = solve_asia
    return {
        "i": i,
        "reader": reader,
        "files": files,
        "env": env,
        "entry": entry,
        "argv": argv,
        "mutations": mutations,
    }


# ---------------------------------------------------------------------------------------
# The worker: runs cases in this process, one at a time


def _load_entry(argv) -> int:
    from catbp_jit.cli import _kernel_cache_refused
    from catbp_jit.compiler import load
    from catbp_jit.errors import CatbpError

    try:
        load(argv[0])
    except (CatbpError, OSError) as e:  # SavedExecutableError, or a plan too large
        print(f"catbp-jit: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        if not _kernel_cache_refused(e):
            raise
        print(f"catbp-jit: error: {e}", file=sys.stderr)
        return 2
    return 0


def _profile_entry(argv) -> int:
    from catbp_jit.frontend.graph import FactorGraphError
    from catbp_jit.frontend.model_source import model_source

    try:
        model_source(argv[0]).graph()
    except (FactorGraphError, OSError) as e:
        print(f"catbp-jit: error: {e}", file=sys.stderr)
        return 2
    return 0


def run_case(case: dict, work: Path) -> dict:
    from catbp_jit.cli import main

    entries = {"cli": main, "executable": _load_entry, "profile": _profile_entry}
    here = work / "case"
    shutil.rmtree(here, ignore_errors=True)
    for name, data in case["files"].items():
        (here / name).parent.mkdir(parents=True, exist_ok=True)
        (here / name).write_bytes(data)
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    err = io.StringIO()
    code, tb = None, None
    try:
        os.chdir(here)
        os.environ.update(case["env"])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = entries[case["entry"]](case["argv"])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: B036 -- whatever escapes is the finding
        tb = traceback.format_exc()
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
    return {"code": code, "stderr": err.getvalue(), "traceback": tb}


def worker(conn, work: str, env: dict[str, str]) -> None:
    os.environ.update(env)
    import catbp_jit.cli  # noqa: F401 -- Numba and the rest, once

    while True:
        case = conn.recv()
        if case is None:
            return
        conn.send(run_case(case, Path(work)))


# ---------------------------------------------------------------------------------------
# Outcomes


def outcome(result: dict) -> str:
    if "kind" in result:  # hang or crash, decided by the parent
        return result["kind"]
    if result["traceback"] is not None:
        return "traceback"
    code = result["code"]
    if code not in (0, 1, 2):
        return "bad-exit"
    if code == 2:
        lines = [line for line in result["stderr"].splitlines() if not line.startswith("catbp-jit: warning:")]
        if len(lines) != 1 or not lines[0].startswith("catbp-jit: error:") or len(lines[0]) > MAX_ERROR_LINE:
            return "messy"
    return {0: "ok", 1: "no-answer", 2: "refused"}[code]


def signature(result: dict) -> str:
    """What tells two failures apart: the exception's type and where it was raised, or
    what is wrong with the error message and how it starts."""
    tb = result.get("traceback")
    if tb:
        lines = tb.strip().splitlines()
        where = [line.strip() for line in lines if line.strip().startswith("File ")]
        return f"{lines[-1].split(':')[0]} at {where[-1] if where else '?'}"
    err = result.get("stderr", "")
    lines = [line for line in err.splitlines() if not line.startswith("catbp-jit: warning:")]
    why = (
        "no error line"
        if not lines
        else f"{len(lines)} lines"
        if len(lines) > 1
        else f"{len(lines[0]):,} characters"
        if len(lines[0]) > MAX_ERROR_LINE
        else ""
    )
    start = " ".join(w for w in (lines[0] if lines else err).split()[:6] if "/" not in w)
    return f"{why}: {start[:80]}" if why else start[:120]


def save_reproducer(out: Path, kind: str, case: dict, result: dict) -> Path:
    d = out / f"{kind}-{case['reader']}"
    if d.exists():
        return d
    d.mkdir(parents=True)
    for name, data in case["files"].items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(data)
    meta = {k: case[k] for k in ("i", "reader", "entry", "argv", "env", "mutations")}
    meta["env"] = {
        k: v[:200] + (f"... ({len(v)} characters)" if len(v) > 200 else "") for k, v in meta["env"].items()
    }
    (d / "case.json").write_text(json.dumps(meta, indent=1))
    (d / "output.txt").write_text((result.get("traceback") or "") + result.get("stderr", "")[:20000])
    return d


class Pool:
    """Worker processes, one case each at a time; a worker that hangs or dies is replaced."""

    def __init__(self, n: int, work: Path, env: dict[str, str]):
        self.ctx = mp.get_context("spawn")
        self.work, self.env = work, env
        self.slots = [self._start(k) for k in range(n)]

    def _start(self, k: int):
        (self.work / f"w{k}").mkdir(parents=True, exist_ok=True)
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=worker, args=(child, str(self.work / f"w{k}"), self.env), daemon=True)
        proc.start()
        child.close()
        return {"k": k, "proc": proc, "conn": parent, "case": None, "since": 0.0}

    def restart(self, slot) -> None:
        slot["case"] = None
        slot["proc"].kill()
        slot["proc"].join()
        slot["conn"].close()
        self.slots[slot["k"]] = self._start(slot["k"])

    def close(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(OSError):
                slot["conn"].send(None)
            slot["proc"].join(5)
            if slot["proc"].is_alive():
                slot["proc"].kill()


def fuzz(
    count: int,
    seed: int = 0,
    workers: int = 2,
    timeout: float = 10.0,
    out: Path | None = None,
    readers=READERS,
    work: Path | None = None,
    log=print,
) -> dict:
    """Run `count` cases; return {"counts": Counter((reader, outcome)), "failures": [...]}."""
    own_work = work is None
    work = Path(tempfile.mkdtemp(prefix="hostile-fuzz-")) if own_work else work
    out = out or Path(tempfile.mkdtemp(prefix="hostile-fuzz-reproducers-"))
    try:
        seeds = setup(work)
        readers = [r for r in readers if r in seeds or r in ("executable", "environment")]
        env = {
            "CATBP_JIT_CACHE_DIR": str(work / "kernels"),
            "CATBP_JIT_TIER": "auto",
            "CATBP_JIT_COMPILE_WORKERS": "0",
            "CATBP_JIT_MAX_BYTES": "2e9",
        }
        pool = Pool(workers, work, env)
        counts: Counter = Counter()
        failures: list[dict] = []
        first_seen: dict[str, int] = {}
        todo = iter(range(count))
        done, start = 0, time.perf_counter()

        def record(case, result):
            nonlocal done
            kind = outcome(result)
            counts[(case["reader"], kind)] += 1
            done += 1
            if kind in FAILURES:
                sig = f"{kind}: {signature(result)}"
                failures.append({"case": case["i"], "reader": case["reader"], "kind": kind, "signature": sig})
                if sig not in first_seen:
                    first_seen[sig] = case["i"]
                    d = save_reproducer(out, kind, case, result)
                    log(
                        f"case {case['i']} ({case['reader']}, {'+'.join(map(str, case['mutations']))}): "
                        f"{sig} -> {d}"
                    )
            if done % 1000 == 0:
                log(f"{done} cases, {time.perf_counter() - start:.0f} s")

        busy = True
        while busy:
            for slot in pool.slots:
                if slot["case"] is None:
                    i = next(todo, None)
                    if i is not None:
                        slot["case"] = make_case(i, seed, seeds, readers)
                        slot["since"] = time.perf_counter()
                        slot["conn"].send(slot["case"])
            busy = any(s["case"] is not None for s in pool.slots)
            if not busy:
                break
            ready = wait([s["conn"] for s in pool.slots if s["case"] is not None], timeout=0.5)
            now = time.perf_counter()
            for slot in list(pool.slots):
                case = slot["case"]
                if case is None:
                    continue
                if slot["conn"] in ready:
                    try:
                        result = slot["conn"].recv()
                        slot["case"] = None
                    except (EOFError, OSError):  # the worker died mid-case
                        code = slot["proc"].exitcode
                        result = {"kind": "crash", "stderr": f"worker exit status {code}"}
                        pool.restart(slot)
                    record(case, result)
                elif now - slot["since"] > timeout:
                    record(case, {"kind": "hang", "stderr": f"over {timeout:g} s"})
                    pool.restart(slot)
        pool.close()
        return {
            "counts": +counts,
            "failures": failures,
            "seconds": time.perf_counter() - start,
            "reproducers": out,
        }
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)


def report(result: dict, log=print) -> None:
    counts = result["counts"]
    kinds = ["ok", "no-answer", "refused", *FAILURES]
    log(f"{'reader':12s}" + "".join(f"{k:>10s}" for k in kinds))
    for reader in READERS:
        row = [counts.get((reader, k), 0) for k in kinds]
        if any(row):
            log(f"{reader:12s}" + "".join(f"{n:10d}" for n in row))
    total = [sum(counts.get((r, k), 0) for r in READERS) for k in kinds]
    log(f"{'all':12s}" + "".join(f"{n:10d}" for n in total))
    distinct = Counter(f["signature"] for f in result["failures"])
    for sig, n in distinct.most_common():
        readers = sorted({f["reader"] for f in result["failures"] if f["signature"] == sig})
        log(f"{n:6d}  [{','.join(readers)}] {sig}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds before a case is a hang")
    p.add_argument(
        "--out",
        type=Path,
        default=Path("hostile-fuzz-reproducers"),
        help="where the first reproducer of each failure goes",
    )
    p.add_argument("--readers", default=",".join(READERS))
    args = p.parse_args(argv)
    readers = [r for r in args.readers.split(",") if r]
    unknown = set(readers) - set(READERS)
    if unknown:
        p.error(f"unknown readers {sorted(unknown)} (known: {', '.join(READERS)})")
    result = fuzz(args.count, args.seed, args.workers, args.timeout, args.out, readers)
    print(f"{args.count} cases in {result['seconds']:.0f} s (seed {args.seed})")
    report(result)
    return min(len(result["failures"]), 100)


if __name__ == "__main__":
    sys.exit(main())
