"""What the perf/ scripts share: where things are, how a time or a ratio is written, what
the machine is, how a run is timed and how a report is written.

A script imports it as `common` (perf/ is on sys.path when a script runs from there; a
script loaded by path puts its folder there first). Importing it does not import numba:
some scripts say what the machine is before anything compiles.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run from a checkout without installing
if str(REPO / "tests") not in sys.path:
    # pyAgrum's network for a BIF text: the comparison the tests make (tests/bn_helpers.py)
    sys.path.insert(0, str(REPO / "tests"))
# The scripts time kernels: compile() waits for them instead of answering from the numpy
# tier while they compile (a cold cache would otherwise time numpy's runs; cold_start.py
# measures the tiers themselves). Child processes inherit it.
os.environ.setdefault("CATBP_JIT_TIER", "compiled")

from bn_helpers import pyagrum_network  # noqa: E402, F401 (the scripts' too)

GROUPS = ("bench", "corpus")  # the folders of shared/ that hold bundles


# ---------------------------------------------------------------------------------------
# Finding inputs


def default_shared_dir() -> Path:
    return Path(os.environ.get("CATBP_SHARED_DIR") or REPO.parent / "shared")


def find_bundles(shared: Path, only, names) -> list:
    """(group, bundle directory) for every bundle of the chosen groups, filtered by name."""
    found = []
    for group in GROUPS:
        if only and group != only:
            continue
        folder = shared / group
        if not folder.is_dir():
            continue
        for d in sorted(folder.iterdir()):
            if not (d / "bundle.json").is_file():
                continue
            if names and not any(n in d.name for n in names):
                continue
            found.append((group, d))
    return found


def bundles_in(dirs, names=None) -> list:
    """(group, bundle directory) for every bundle a user names: a bundle directory itself
    (it holds bundle.json), or a directory of them (its bundles, in name order); the
    group is the name of the directory they were found in. names: keep only bundles whose
    name contains one of these strings (as find_bundles)."""
    found = []
    for d in map(Path, dirs):
        if (d / "bundle.json").is_file():
            found.append((d.resolve().parent.name, d))
        elif d.is_dir():
            found += [(d.name, b) for b in sorted(d.iterdir()) if (b / "bundle.json").is_file()]
    return [(g, b) for g, b in found if not names or any(n in b.name for n in names)]


def installed(module: str) -> bool:
    """Whether an optional peer (pyagrum, pgmpy) can be imported; says so when not."""
    if importlib.util.find_spec(module) is not None:
        return True
    print(f"({module} not installed: ours only)", file=sys.stderr)
    return False


def network_text(name: str) -> str:
    """The BIF text of a bnlearn network (the files may be gzipped)."""
    from catbp_jit.frontend import bnlearn

    path = bnlearn.network_path(name)
    data = path.read_bytes()
    return (gzip.decompress(data) if path.name.endswith(".gz") else data).decode()


def sample_rows(graph, n: int, seed: int) -> dict:
    """n full assignments of a Bayesian network by ancestral sampling, vectorized over
    rows: {variable: (n,) states}."""
    from catbp_jit.frontend.bnlearn import parents_first

    rng = np.random.default_rng(seed)
    order, parents = parents_first(graph)
    cpt = {f.scope[0]: f.values for f in graph.factors}
    sample = {}
    for v in order:
        p = cpt[v][(slice(None),) + tuple(sample[q] for q in parents[v])]  # (k, n) or (k,)
        p = np.broadcast_to(p.reshape(p.shape[0], -1), (p.shape[0], n)).T
        cum = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
        u = rng.random((n, 1))
        sample[v] = np.minimum((u > cum).sum(axis=1), p.shape[1] - 1)
    return sample


# ---------------------------------------------------------------------------------------
# Timing


def time_runs(fn, min_runs: int, max_runs: int, budget_s: float):
    """Run fn repeatedly; return (median seconds, number of runs, last result).

    The first run is timed too; it sets the number of runs: as many as fit in budget_s,
    but at least min_runs and at most max_runs.
    """
    t0 = time.perf_counter()
    result = fn()
    times = [time.perf_counter() - t0]
    runs = int(budget_s / max(times[0], 1e-9))
    runs = max(min_runs, min(max_runs, runs))
    for _ in range(runs - 1):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times), result


# ---------------------------------------------------------------------------------------
# Formatting


def fmt_time(s) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} µs"


def fmt_bytes(n) -> str:
    if n is None:
        return "-"
    for unit, size in (("GB", 2**30), ("MB", 2**20), ("kB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def fmt_ratio(x) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}x" if x >= 10 else f"{x:.2f}x"


# ---------------------------------------------------------------------------------------
# The machine


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpus_usable():
    """The CPUs this process may run on (a container or taskset may allow fewer)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()


def threads_environment() -> str:
    """The environment variables that set how many threads run and how they wait."""
    return ", ".join(
        f"{k}={os.environ[k]}"
        for k in ("NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY")
        if k in os.environ
    )


def threading_layer() -> str:
    """Numba's threading layer, known once a parallel kernel has run."""
    import numba

    try:
        return numba.threading_layer()
    except ValueError:
        return "not started"


# ---------------------------------------------------------------------------------------
# Reports


def write_report(out: Path, stem: str, text: str, rows, columns, *, echo: bool = True) -> None:
    """<out>/<stem>.md (the text) and <out>/<stem>.csv (one line a row), each replaced
    whole (a report written as rows come in is never seen half-written); with echo, the
    text printed and where it went."""
    from catbp_jit.atomic import replacing  # here: importing catbp_jit loads numba

    out.mkdir(parents=True, exist_ok=True)
    with replacing(out / f"{stem}.md") as tmp:
        tmp.write_text(text, encoding="utf-8")
    with replacing(out / f"{stem}.csv") as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in columns})
    if echo:
        print(text, end="")
        print(f"(written to {out / (stem + '.md')} and {out / (stem + '.csv')})")
