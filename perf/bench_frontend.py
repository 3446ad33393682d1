"""Benchmark the frontend on the bnlearn networks against pyAgrum and pgmpy.

For every network: the junction tree's size, our plan and compile times (cold and warm
kernel cache), and the time to compute every posterior P(X | e) of the network, by us
(`CompiledModel.solve`), by pyAgrum (LazyPropagation) and by pgmpy (VariableElimination),
once without evidence and once with K observed variables. Prints a Markdown table as the
rows complete and writes <out>/bench_frontend.md and <out>/bench_frontend.csv.

How to run (from the repository root; the network files must be there, see
`python -m catbp_jit.frontend.bnlearn`; all networks but link and munin1 take about
15 minutes on 2 cores, most of it cold compiles):

    .venv/bin/python perf/bench_frontend.py [NAMES ...] [--repeat 5] [--evidence 3]
        [--budget 20] [--pgmpy-timeout 60] [--pgmpy-method ve|bp]
        [--skip-pgmpy] [--skip-pyagrum] [--skip-cold] [--out perf/out]

NAMES default to every network of bnlearn.NETWORKS present in bnlearn.data_dir() (fetched
first when none is). pyAgrum and pgmpy are used when the running interpreter can import
them (`pyagrum`, `pgmpy`); otherwise their columns say "n/a". pgmpy is not a dependency
of the project: run the script with an interpreter that has it, e.g. a separate venv:

    python3 -m venv /tmp/pgvenv && /tmp/pgvenv/bin/pip install pgmpy pyagrum -e .
    /tmp/pgvenv/bin/python perf/bench_frontend.py asia alarm water

How things are measured (every network in fresh subprocesses, so one network's memory
and compiled kernels do not affect the next):

* compile cold: a subprocess compiles the two models the run needs,
  `compile_model(graph, "prob")` and `compile_model(graph, "prob", evidence_vars=E,
  absorb_evidence=True)` (the times are their sums), with CATBP_JIT_CACHE_DIR set to a
  new empty directory (Numba compiles every kernel).
  compile warm: a second subprocess does the same on that directory, now filled (planning,
  lowering, and loading the kernels from disk). Each network gets its own empty directory,
  so its cold time does not depend on the networks before it. "plan" is the planning part
  (elimination order, junction tree, programs), from the warm run. With --skip-cold there
  is no cold run and the "warm" subprocess uses the kernel cache of the environment
  ($CATBP_JIT_CACHE_DIR or the default), the cell then showing its cache misses if any.
* ours: in the warm subprocess, `plain.solve()` and `observed.solve(evidence)`, which
  compute Z and every normalized posterior in one run. `observed` absorbs the evidence
  (the factors cut at the observed states, the plan without those variables), as
  `catbp_jit.solve` does; binding other states of the same variables reuses it.
* pyAgrum: in the same subprocess, timed region = `ie = gum.LazyPropagation(bn);
  ie.setEvidence(e); ie.makeInference(); [ie.posterior(n) for n in bn.nodes()]`. The
  LazyPropagation object (pyAgrum's junction tree for this network) is built inside the
  timed region: it is the analog of one `solve`, whereas our compile is reported in its
  own columns. Reading the BIF file is not timed. The CSV also has the construction time
  alone (pyagrum_construct_s). The posteriors are checked against ours (max abs diff in
  the CSV; a "!" in the table when above 1e-6: pyAgrum rounds CPTs to float32).
* pgmpy: in a subprocess per network and evidence setting: read the BIF text
  (`BIFReader(string=...)`, not timed), then timed: `ve = VariableElimination(model)`
  and `ve.query([v], evidence=e, show_progress=False)` for every unobserved variable v
  (pgmpy refuses to query an observed one). VariableElimination is the default because
  pgmpy's BeliefPropagation is far slower here (alarm: 60 s to calibrate, then seconds
  per query, against 20 ms for all of VE's queries); `--pgmpy-method bp` times
  `BeliefPropagation(model).calibrate()` then a query per variable instead. The
  subprocess is killed --pgmpy-timeout seconds after it has read the network ("> 60 s").
* each time is the best of up to --repeat runs after one warm-up run; repeats stop once
  a measurement's runs (warm-up included) have taken --budget seconds. When the warm-up
  alone exceeds the budget it is the only run, and the cell is marked "*".
* evidence: K variables (--evidence, default 3) and their values, drawn by ancestral
  sampling from the network itself (seeded by the network's name, so deterministic and
  P(e) > 0), the same for all three libraries.

Columns: vars (variables), cliques, max clique (states of the largest clique), plan,
compile cold, compile warm, then without evidence: ours, pyAgrum, x pyA (= pyAgrum time /
our time: above 1 we are faster), pgmpy, x pgmpy; then the same with evidence ("| e").

Timings are only comparable within one run of the script; the header records the load
average, and other processes on a small machine move the figures a lot.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # perf/common.py
import numpy as np  # noqa: E402

from common import (  # noqa: E402
    REPO,
    cpu_model,
    cpus_usable,
    fmt_ratio,
    fmt_time,
    load_average,
    network_text,
    pyagrum_network,
    threads_environment,
    write_report,
)

DEFAULT_REPEAT = 5
DEFAULT_EVIDENCE = 3
DEFAULT_BUDGET_S = 20.0
DEFAULT_PGMPY_TIMEOUT_S = 60.0
DIFF_WARN = 1e-6


# ---------------------------------------------------------------------------------------
# Shared helpers (parent and children)


def best_of(fn, repeat: int, budget_s: float):
    """(best time, timed runs, last result): a warm-up, then up to `repeat` timed runs.

    Repeats stop once all runs so far (warm-up included) took `budget_s`; when the
    warm-up alone took that long it is the measurement and the run count is 0.
    """
    t0 = time.perf_counter()
    out = fn()
    warm = time.perf_counter() - t0
    spent, times = warm, []
    while len(times) < repeat and spent < budget_s:
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return (min(times) if times else warm), len(times), out


def _emit(**record) -> None:
    """A JSON line to the parent."""
    print(json.dumps(record), flush=True)


def observation(graph, k: int, seed: int) -> dict:
    """k observed variables and states, by ancestral sampling (so P(e) > 0); seeded."""
    if k <= 0:
        return {}
    from catbp_jit.frontend.bnlearn import parents_first

    rng = np.random.default_rng(seed)
    order, parents = parents_first(graph)
    cpt = {f.scope[0]: f.values for f in graph.factors}
    sample = {}
    for v in order:
        p = cpt[v][(slice(None),) + tuple(sample[q] for q in parents[v])]
        sample[v] = int(rng.choice(len(p), p=p / p.sum()))
    names = list(graph.variables)
    picked = rng.choice(len(names), size=min(k, len(names)), replace=False)
    return {names[i]: sample[names[i]] for i in sorted(picked)}


# ---------------------------------------------------------------------------------------
# Children (run as `bench_frontend.py --child KIND ...`)


def compile_both(name: str, evidence: dict):
    """The model without evidence and the one absorbing `evidence`; reports their times."""
    from catbp_jit.frontend import bnlearn, compile_model

    graph = bnlearn.load_network(name)
    plain = compile_model(graph, "prob", progress=None)
    observed = (
        compile_model(graph, "prob", evidence_vars=tuple(evidence), absorb_evidence=True, progress=None)
        if evidence
        else None
    )
    models = [m for m in (plain, observed) if m is not None]
    _emit(
        kind="compile",
        plan_s=sum(m.times["plan_s"] for m in models),
        compile_s=sum(m.times["compile_s"] for m in models),
        misses=sum(m.executable.cache_stats.get("misses", 0) for m in models),
        stats=plain.stats,
        stats_ev=observed.stats if observed else None,
    )
    return plain, observed


def child_solve(name: str, evidence: dict, repeat: int, budget: float, pyagrum: bool) -> None:
    """Compile (warm), then time our solves and pyAgrum's, without and with evidence."""
    plain, observed = compile_both(name, evidence)
    settings = [("", {})] + ([("_ev", evidence)] if evidence else [])
    ours = {}
    for suffix, ev in settings:
        model = observed if ev else plain
        s, runs, sol = best_of(partial(model.solve, ev), repeat, budget)
        ours[suffix] = sol.marginals
        _emit(kind="ours", suffix=suffix, s=s, runs=runs)
    if not pyagrum:
        return
    import pyagrum as gum

    with tempfile.TemporaryDirectory(prefix="bench_frontend_") as tmp:
        t0 = time.perf_counter()
        bn, renamed = pyagrum_network(gum, network_text(name), Path(tmp))
        load_s = time.perf_counter() - t0
    to_gum = {ours_name: g for g, ours_name in renamed.items()}
    nodes = list(bn.nodes())
    for suffix, ev in settings:
        gev = {to_gum.get(v, v): int(x) for v, x in ev.items()}
        construct = []

        def run(gev=gev, construct=construct):  # called in this iteration only
            t0 = time.perf_counter()
            ie = gum.LazyPropagation(bn)
            construct.append(time.perf_counter() - t0)
            if gev:
                ie.setEvidence(gev)
            ie.makeInference()
            return ie, [ie.posterior(n) for n in nodes]

        s, runs, (ie, _) = best_of(run, repeat, budget)
        diff = 0.0
        for v, m in ours[suffix].items():
            p = np.asarray(ie.posterior(to_gum.get(v, v)).toarray(), dtype=np.float64)
            diff = max(diff, float(np.max(np.abs(p - m))))
        _emit(
            kind="pyagrum",
            suffix=suffix,
            s=s,
            runs=runs,
            load_s=load_s,
            construct_s=min(construct),
            maxdiff=diff,
        )


def child_pgmpy(name: str, evidence: dict, repeat: int, budget: float, method: str) -> None:
    """Read the network with pgmpy, then time every posterior; a line per run."""
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    from pgmpy.inference import BeliefPropagation, VariableElimination
    from pgmpy.readwrite import BIFReader

    text = network_text(name)
    t0 = time.perf_counter()
    model = BIFReader(string=text).get_model()
    load_s = time.perf_counter() - t0
    # our state indices are positions in the BIF's list of values, as are pgmpy's
    ev = {v: model.get_cpds(v).state_names[v][x] for v, x in evidence.items()}
    # pgmpy refuses to query an observed variable (its posterior is a point mass anyway)
    nodes = [v for v in model.nodes() if v not in ev]
    _emit(kind="ready", load_s=load_s)

    def run():
        t0 = time.perf_counter()
        if method == "bp":
            inf = BeliefPropagation(model)
            inf.calibrate()
        else:
            inf = VariableElimination(model)
        out = [inf.query([v], evidence=ev or None, show_progress=False) for v in nodes]
        _emit(kind="run", s=time.perf_counter() - t0)
        return out

    s, runs, _ = best_of(run, repeat, budget)
    _emit(kind="done", s=s, runs=runs)


def child_main(argv) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=("compile", "solve", "pgmpy"))
    p.add_argument("name")
    p.add_argument("--evidence-json", default="{}")
    p.add_argument("--repeat", type=int, default=DEFAULT_REPEAT)
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S)
    p.add_argument("--pyagrum", action="store_true")
    p.add_argument("--method", default="ve")
    a = p.parse_args(argv)
    evidence = json.loads(a.evidence_json)
    if a.kind == "compile":
        compile_both(a.name, evidence)
    elif a.kind == "solve":
        child_solve(a.name, evidence, a.repeat, a.budget, a.pyagrum)
    else:
        child_pgmpy(a.name, evidence, a.repeat, a.budget, a.method)
    return 0


# ---------------------------------------------------------------------------------------
# Parent


def _child_cmd(*args) -> list:
    return [sys.executable, str(Path(__file__).resolve()), "--child", *map(str, args)]


def run_child(cmd, env=None) -> tuple:
    """(records, error or None) of a child run to its end."""
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    records = _parse_lines(proc.stdout)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["?"]
        return records, f"exit {proc.returncode}: {tail[0][:200]}"
    return records, None


def _parse_lines(text: str) -> list:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if isinstance(rec, dict) and "kind" in rec:
                out.append(rec)
    return out


def run_pgmpy(name: str, evidence: dict, args) -> dict:
    """pgmpy's time in a subprocess: killed `timeout` s after it has read the network."""
    cmd = _child_cmd(
        "pgmpy",
        name,
        "--evidence-json",
        json.dumps(evidence),
        "--repeat",
        args.repeat,
        "--budget",
        min(args.budget, args.pgmpy_timeout),
        "--method",
        args.pgmpy_method,
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    err_tail = []

    def pump_stdout():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def pump_stderr():
        for line in proc.stderr:
            err_tail[:] = (err_tail + [line])[-20:]

    threading.Thread(target=pump_stdout, daemon=True).start()
    threading.Thread(target=pump_stderr, daemon=True).start()
    load_limit = max(120.0, 2 * args.pgmpy_timeout)
    deadline = time.monotonic() + load_limit
    result = {"status": "error", "runs_s": []}
    ready = False
    try:
        while True:
            left = deadline - time.monotonic()
            try:
                line = lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                result["status"] = "timeout" if ready else "load timeout"
                result["limit_s"] = args.pgmpy_timeout if ready else load_limit
                break
            if line is None:  # the child closed stdout: finished or died
                break
            recs = _parse_lines(line)
            if not recs:
                continue
            rec = recs[0]
            if rec["kind"] == "ready":
                ready = True
                result["load_s"] = rec["load_s"]
                deadline = time.monotonic() + args.pgmpy_timeout
            elif rec["kind"] == "run":
                result["runs_s"].append(rec["s"])
            elif rec["kind"] == "done":
                result.update(status="ok", s=rec["s"], runs=rec["runs"])
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    if result["status"] == "timeout" and result["runs_s"]:
        # killed while repeating: the runs that finished still count
        runs = result["runs_s"]
        result.update(status="ok", s=min(runs[1:] or runs), runs=len(runs) - 1)
    if result["status"] == "error":
        tail = "".join(err_tail).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        result["error"] = tail[0][:200]
    return result


def bench_network(name: str, args, have_pyagrum: bool, have_pgmpy: bool) -> dict:
    from catbp_jit.frontend import bnlearn

    graph = bnlearn.load_network(name)
    evidence = observation(graph, args.evidence, zlib.crc32(name.encode()))
    row = {
        "network": name,
        "variables": len(graph.variables),
        "factors": len(graph.factors),
        "evidence": ";".join(
            f"{v}={graph.states[v][x] if graph.states.get(v) else x}" for v, x in evidence.items()
        ),
    }
    errors = []
    ev_json = json.dumps(evidence)

    def say(what):
        print(f"... {name}: {what}", file=sys.stderr, flush=True)

    cache_dir = None if args.skip_cold else tempfile.mkdtemp(prefix="bench_frontend_cache_")
    env = dict(os.environ)
    if cache_dir:
        env["CATBP_JIT_CACHE_DIR"] = cache_dir
    try:
        if cache_dir:
            say("compile cold")
            recs, err = run_child(_child_cmd("compile", name, "--evidence-json", ev_json), env)
            for rec in recs:
                row.update(compile_cold_s=rec["compile_s"], cold_misses=rec["misses"])
            if err:
                errors.append(f"cold compile: {err}")
        say("compile warm, ours" + (", pyAgrum" if have_pyagrum and not args.skip_pyagrum else ""))
        cmd = _child_cmd(
            "solve", name, "--evidence-json", ev_json, "--repeat", args.repeat, "--budget", args.budget
        )
        if have_pyagrum and not args.skip_pyagrum:
            cmd.append("--pyagrum")
        recs, err = run_child(cmd, env)
    finally:
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    if err:
        errors.append(f"solve: {err}")
    for rec in recs:
        if rec["kind"] == "compile":
            st = rec["stats"]
            row.update(
                cliques=st["cliques"],
                max_clique_states=st["max_clique_states"],
                total_states=st["total_states"],
                plan_s=rec["plan_s"],
                compile_warm_s=rec["compile_s"],
                warm_misses=rec["misses"],
            )
            if rec.get("stats_ev"):  # the model absorbing the evidence: a smaller tree
                row.update(max_clique_states_ev=rec["stats_ev"]["max_clique_states"])
        elif rec["kind"] == "ours":
            sfx = rec["suffix"]
            row.update({f"ours{sfx}_s": rec["s"], f"ours{sfx}_runs": rec["runs"]})
        elif rec["kind"] == "pyagrum":
            sfx = rec["suffix"]
            row.update(
                {
                    f"pyagrum{sfx}_s": rec["s"],
                    f"pyagrum{sfx}_runs": rec["runs"],
                    f"pyagrum{sfx}_construct_s": rec["construct_s"],
                    f"pyagrum{sfx}_maxdiff": rec["maxdiff"],
                    "pyagrum_load_s": rec["load_s"],
                }
            )
    if have_pgmpy and not args.skip_pgmpy:
        for sfx, ev in [("", {})] + ([("_ev", evidence)] if evidence else []):
            say(f"pgmpy{' with evidence' if ev else ''}")
            res = run_pgmpy(name, ev, args)
            row[f"pgmpy{sfx}_status"] = res["status"]
            if "load_s" in res:
                row["pgmpy_load_s"] = res["load_s"]
            if res["status"] == "ok":
                row.update({f"pgmpy{sfx}_s": res["s"], f"pgmpy{sfx}_runs": res["runs"]})
            elif res["status"].endswith("timeout"):
                row[f"pgmpy{sfx}_limit_s"] = res["limit_s"]
            else:
                errors.append(f"pgmpy: {res.get('error')}")
    for sfx in ("", "_ev"):
        ours = row.get(f"ours{sfx}_s")
        for lib in ("pyagrum", "pgmpy"):
            theirs = row.get(f"{lib}{sfx}_s")
            if ours and theirs:
                row[f"ratio_{lib}{sfx}"] = theirs / ours
    if errors:
        row["error"] = " | ".join(errors)
    return row


# ---------------------------------------------------------------------------------------
# Formatting (and common.py's)


def fmt_states(n) -> str:
    if n is None:
        return "-"
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= 10 * size:
            return f"{n / size:.0f}{unit}"
    return f"{n:,}"


COLUMNS = [
    "network",
    "vars",
    "cliques",
    "max clique",
    "plan",
    "compile cold",
    "compile warm",
    "ours",
    "pyAgrum",
    "x pyA",
    "pgmpy",
    "x pgmpy",
    "ours \\| e",
    "pyAgrum \\| e",
    "x pyA \\| e",
    "pgmpy \\| e",
    "x pgmpy \\| e",
]


def _timed(row, key) -> str:
    s = row.get(f"{key}_s")
    if s is None:
        return "-"
    return fmt_time(s) + ("*" if row.get(f"{key}_runs") == 0 else "")


def markdown_row(row: dict, args, have_pyagrum: bool, have_pgmpy: bool) -> list:
    def compile_cell(key, misses_key, show_misses):
        s = row.get(key)
        if s is None:
            return "-"
        misses = row.get(misses_key)
        return f"{s:.2f} s" + (f" ({misses} miss)" if show_misses and misses else "")

    def pyagrum(sfx):
        if not have_pyagrum:
            return "n/a"
        if args.skip_pyagrum:
            return "skipped"
        cell = _timed(row, f"pyagrum{sfx}")
        if (row.get(f"pyagrum{sfx}_maxdiff") or 0) > DIFF_WARN:
            cell += " !"
        return cell

    def pgmpy(sfx):
        if not have_pgmpy:
            return "n/a"
        if args.skip_pgmpy:
            return "skipped"
        status = row.get(f"pgmpy{sfx}_status")
        if status == "ok":
            return _timed(row, f"pgmpy{sfx}")
        if status == "timeout":
            return f"> {row[f'pgmpy{sfx}_limit_s']:.0f} s"
        if status == "load timeout":
            return f"read > {row[f'pgmpy{sfx}_limit_s']:.0f} s"
        return "error" if status else "-"

    cells = [
        row["network"],
        str(row["variables"]),
        str(row.get("cliques", "-")),
        fmt_states(row.get("max_clique_states")),
        fmt_time(row.get("plan_s")),
        ("skipped" if args.skip_cold else compile_cell("compile_cold_s", "cold_misses", False)),
        compile_cell("compile_warm_s", "warm_misses", True),
    ]
    for sfx in ("", "_ev"):
        if sfx and not args.evidence:
            cells += ["-"] * 5
            continue
        cells += [
            _timed(row, f"ours{sfx}"),
            pyagrum(sfx),
            fmt_ratio(row.get(f"ratio_pyagrum{sfx}")),
            pgmpy(sfx),
            fmt_ratio(row.get(f"ratio_pgmpy{sfx}")),
        ]
    return cells


def table_header() -> list:
    return ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---"] + ["--:"] * (len(COLUMNS) - 1)) + "|"]


CSV_FIELDS = [
    "network",
    "variables",
    "factors",
    "cliques",
    "max_clique_states",
    "max_clique_states_ev",
    "total_states",
    "plan_s",
    "compile_cold_s",
    "cold_misses",
    "compile_warm_s",
    "warm_misses",
    "evidence",
]
for _sfx in ("", "_ev"):
    CSV_FIELDS += [
        f"ours{_sfx}_s",
        f"ours{_sfx}_runs",
        f"pyagrum{_sfx}_s",
        f"pyagrum{_sfx}_runs",
        f"pyagrum{_sfx}_construct_s",
        f"pyagrum{_sfx}_maxdiff",
        f"ratio_pyagrum{_sfx}",
        f"pgmpy{_sfx}_status",
        f"pgmpy{_sfx}_s",
        f"pgmpy{_sfx}_runs",
        f"pgmpy{_sfx}_limit_s",
        f"ratio_pgmpy{_sfx}",
    ]
CSV_FIELDS += ["pyagrum_load_s", "pgmpy_load_s", "wall_s", "error"]


def version(dist: str):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def header_lines(args, have_pyagrum, have_pgmpy, load_at_start, evidence_note) -> list:
    import numba

    usable, threads_env = cpus_usable(), threads_environment()
    pyagrum_v = version("pyagrum") or version("pyAgrum")
    if have_pyagrum:
        import pyagrum as gum

        pyagrum_v = f"{gum.__version__} ({gum.getMaxNumberOfThreads()} threads)"
    pgmpy_v = version("pgmpy") if have_pgmpy else None
    return [
        "# catbp_jit frontend benchmark: bnlearn networks, all posteriors",
        "",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {cpu_model()}, {os.cpu_count()} CPUs "
        f"({usable} usable); load average {load_at_start} at start, {load_average()} at "
        "end (other processes skew the timings)",
        f"- python {platform.python_version()} ({sys.executable}), numpy {np.__version__}, "
        f"numba {numba.__version__}, numba threads {numba.config.NUMBA_NUM_THREADS}"
        + (f" ({threads_env})" if threads_env else ""),
        f"- pyAgrum {pyagrum_v if have_pyagrum else 'n/a (not installed)'}; "
        f"pgmpy {pgmpy_v if have_pgmpy else 'n/a (not installed)'}"
        + (
            f" ({'VariableElimination' if args.pgmpy_method == 've' else 'BeliefPropagation'},"
            f" killed after {args.pgmpy_timeout:.0f} s)"
            if have_pgmpy
            else ""
        ),
        f"- best of up to {args.repeat} runs after a warm-up, within {args.budget:.0f} s per "
        "measurement (* = one run only, no warm-up); compile cold: empty kernel cache, warm: "
        "filled" + ("" if not args.skip_cold else " (--skip-cold: the environment's cache)"),
        f"- ours = CompiledModel.solve (Z and every posterior); pyAgrum = LazyPropagation "
        "built, inference, every posterior; pgmpy = a query per variable; "
        "x = their time / ours (above 1: ours is faster); ! = posteriors differ from "
        f"pyAgrum's by more than {DIFF_WARN:g}",
        f"- | e: {evidence_note}",
    ]


def write_outputs(out: Path, header, table, footer, rows) -> None:
    text = "\n".join(header + [""] + table + footer) + "\n"
    write_report(out, "bench_frontend", text, rows, CSV_FIELDS, echo=False)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child_main(argv[1:])
    from catbp_jit.frontend import bnlearn

    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="bnlearn networks (default: every one available)"
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=DEFAULT_REPEAT,
        help="timed runs after the warm-up, at most (default: %(default)s)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help="stop repeating a measurement after this many seconds (default: %(default)s)",
    )
    parser.add_argument(
        "--evidence",
        type=int,
        default=DEFAULT_EVIDENCE,
        metavar="K",
        help="observed variables in the '| e' columns; 0: none (default: %(default)s)",
    )
    parser.add_argument(
        "--pgmpy-timeout",
        type=float,
        default=DEFAULT_PGMPY_TIMEOUT_S,
        metavar="S",
        help="kill pgmpy after S seconds of inference (default: %(default)s)",
    )
    parser.add_argument(
        "--pgmpy-method",
        choices=("ve", "bp"),
        default="ve",
        help="VariableElimination or BeliefPropagation (default: %(default)s)",
    )
    parser.add_argument("--skip-pgmpy", action="store_true")
    parser.add_argument("--skip-pyagrum", action="store_true")
    parser.add_argument(
        "--skip-cold",
        action="store_true",
        help="no cold compile; the warm compile uses the environment's cache",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO / "perf" / "out",
        help="where bench_frontend.md and .csv go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.evidence < 0:
        parser.error("--evidence must be at least 0")

    if args.names:
        unknown = [n for n in args.names if n not in bnlearn.NETWORKS]
        if unknown:
            parser.error(
                f"unknown network(s) {', '.join(unknown)}; the bnlearn networks are "
                f"{', '.join(bnlearn.NETWORKS)}"
            )
        names = args.names
        missing = [n for n in names if n not in bnlearn.available()]
    else:
        names = [n for n in bnlearn.NETWORKS if n in bnlearn.available()]
        missing = [] if names else list(bnlearn.NETWORKS)
    if missing:
        print(f"fetching the bnlearn networks into {bnlearn.data_dir()} ...", file=sys.stderr, flush=True)
        bnlearn.fetch()
        if not names:
            names = [n for n in bnlearn.NETWORKS if n in bnlearn.available()]

    have_pyagrum = importlib.util.find_spec("pyagrum") is not None
    have_pgmpy = importlib.util.find_spec("pgmpy") is not None
    evidence_note = (
        f"with {args.evidence} observed variables (ancestral sample seeded by "
        "crc32 of the network's name; in the CSV)"
        if args.evidence
        else "no evidence columns (--evidence 0)"
    )
    load_at_start = load_average()
    started = time.perf_counter()
    rows, table = [], table_header()
    print("\n".join(table), flush=True)
    header = header_lines(args, have_pyagrum, have_pgmpy, load_at_start, evidence_note)
    for name in names:
        t0 = time.perf_counter()
        row = bench_network(name, args, have_pyagrum, have_pgmpy)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        line = "| " + " | ".join(markdown_row(row, args, have_pyagrum, have_pgmpy)) + " |"
        table.append(line)
        print(line, flush=True)
        if row.get("error"):
            print(f"... {name}: ERROR {row['error']}", file=sys.stderr, flush=True)
        write_outputs(args.out, header, table, [], rows)
    total = time.perf_counter() - started
    header = header_lines(args, have_pyagrum, have_pgmpy, load_at_start, evidence_note)
    footer = [""] + [f"- {r['network']}: ERROR {r['error']}" for r in rows if r.get("error")]
    footer += [f"- total time: {total:.0f} s"]
    write_outputs(args.out, header, table, footer, rows)
    print("\n".join([""] + header + footer), flush=True)
    print(f"wrote {args.out / 'bench_frontend.md'} and {args.out / 'bench_frontend.csv'}", file=sys.stderr)
    return 1 if any(r.get("error") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
