"""UAI MAR instances against the published solvers and pyAgrum: times, errors, ratios.

For every NAME.uai (with NAME.uai.evid and NAME.uai.MAR when present) under the given
directories (default: $CATBP_SHARED_DIR/uai2014, else <repo>/../shared/uai2014): plan and
compile time, the best and median time of `CompiledModel.solve(evidence)` (evidence
absorbed, PROB; LOGPROB as a check), max |marginal - MAR|, log Z and its relative
difference to LOGPROB's, the published virtual best (the fastest library of
published_times.csv beside the instances, another machine: indicative) and the ratio
virtual best / ours, and pyAgrum on the same machine in the same run. An instance without
evidence is compiled without partial evaluation: every one of its segments depends on no
evidence, so with it a repeated solve would recompute nothing; without it each solve
computes every marginal, as the published times do.

pyAgrum: its UAI reader (`loadMRF`) reads a table with the scope's first variable
changing fastest, the UAI format's last (the marginals of a 2-variable model come out
wrong), so its MarkovRandomField is built from our FactorGraph instead (not timed);
timed: `ShaferShenoyMRFInference` (LazyPropagation is for Bayesian networks only; these
are Markov networks), setEvidence, makeInference and every posterior.

Each instance runs in child processes (ours, then pyAgrum), killed after --timeout /
--pyagrum-timeout seconds: one huge instance cannot stop the run, and what a child had
measured before it was killed is kept. pyAgrum's child has an address-space limit
(--pyagrum-gib). Writes <out>/bench_uai.md and <out>/bench_uai.csv.

--task MPE times the most probable assignment instead, against the MAR solve of the same
instance in the same child and against pytoulbar2 when installed (perf/uai_mpe.py):
<out>/bench_uai_mpe.md and .csv.

    python perf/bench_uai.py [DIR ...] [--only NAME ...] [--max-gib 2] [--budget 5]
        [--timeout 600] [--quick] [--skip-pyagrum] [--task MAR|MPE] [--out perf/out]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # perf/common.py, uai2014.py
import uai_mpe  # noqa: E402
from common import HERE, default_shared_dir, installed, write_report  # noqa: E402
from uai2014 import load_instance, mar_error, virtual_best  # noqa: E402

MAR_TOL, LOG_Z_TOL = 1e-5, 1e-9  # the MAR files' 6 digits; PROB against LOGPROB


def default_root() -> Path:
    return default_shared_dir() / "uai2014"


def find_instances(dirs) -> dict:
    """name -> NAME.uai under the directories (searched recursively)."""
    found = {}
    for d in dirs:
        for path in sorted(Path(d).rglob("*.uai")):
            found.setdefault(path.stem, path)
    return found


def published(dirs) -> dict:
    """name -> (seconds, library): the fastest published time, from the
    published_times.csv of each directory."""
    best = {}
    for d in dirs:
        for name, (t, lib) in virtual_best(Path(d)).items():
            if name not in best or t < best[name][0]:
                best[name] = (t, lib)
    return best


def timed(fn, repeat: int, budget_s: float):
    """(best, median, runs, last result): one warm-up, then up to `repeat` timed runs,
    stopping once all runs took budget_s (at least one timed run)."""
    t0 = time.perf_counter()
    out = fn()
    spent, times = time.perf_counter() - t0, []
    while len(times) < repeat and (spent < budget_s or not times):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return min(times), statistics.median(times), len(times), out


# ---------------------------------------------------------------------------------------
# children: each prints JSON lines as it goes, so a killed child still reports


def _emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def child_ours(path: Path, max_bytes: int, repeat: int, budget_s: float, plan_time: float | None) -> None:
    import numpy as np

    from catbp_jit.errors import CatbpError
    from catbp_jit.frontend import compile_model
    from catbp_jit.frontend.graph import FactorGraphError

    graph, evidence, want = load_instance(path)
    _emit(vars=len(graph.variables), factors=len(graph.factors), evidence=len(evidence))
    for s in ("prob", "logprob"):
        try:
            model = compile_model(
                graph,
                s,
                evidence_vars=list(evidence),
                absorb_evidence=True,
                max_clique_bytes=max_bytes,
                max_total_bytes=max_bytes,
                plan_time=plan_time,
                # (no evidence: every segment would be static, see above)
                partial_evaluation=bool(evidence),
            )
        except (FactorGraphError, CatbpError, MemoryError) as e:
            if s == "prob":
                _emit(refused=str(e).splitlines()[0])
                return
            _emit(**{f"{s}_error": str(e).splitlines()[0]})  # PROB's answer stays in the row
            continue
        st = model.stats  # the largest space a pass loops over: a clique, or a contraction's
        _emit(
            programs=model.plan_kind,
            max_loop_states=st.get("max_loop_states", st["max_clique_states"]),
            **{f"{s}_plan_s": model.times["plan_s"], f"{s}_compile_s": model.times["compile_s"]},
        )
        try:
            # the first solve also runs the segments that depend on no evidence (partial
            # evaluation, model.py), and touches the arenas' pages for the first time
            t0 = time.perf_counter()
            model.solve(evidence)
            _emit(**{f"{s}_first_s": time.perf_counter() - t0})
            best, median, runs, sol = timed(partial(model.solve, evidence), repeat, budget_s)
        except CatbpError as e:
            _emit(**{f"{s}_error": str(e).splitlines()[0]})
            continue
        finite = math.isfinite(sol.log_Z) and all(np.isfinite(m).all() for m in sol.marginals.values())
        _emit(
            **{
                f"{s}_best_s": best,
                f"{s}_median_s": median,
                f"{s}_runs": runs,
                f"{s}_log_Z": sol.log_Z,
                f"{s}_finite": bool(finite),
                f"{s}_mar_err": mar_error(sol.marginals, want) if want else None,
            }
        )


def pyagrum_mrf(gum, graph):
    """graph as a pyAgrum MarkovRandomField. Factors over the same variables are
    multiplied first (pyAgrum keeps one factor per set of variables)."""
    import numpy as np

    merged = {}
    for f in graph.factors:
        key = frozenset(f.scope)
        if key in merged:
            scope, values = merged[key]
            axes = [f.scope.index(v) for v in scope]
            merged[key] = (scope, values * np.transpose(f.values, axes))
        else:
            merged[key] = (tuple(f.scope), np.asarray(f.values, dtype=np.float64))
    mrf = gum.MarkovRandomField()
    for v, d in graph.variables.items():
        mrf.add(gum.RangeVariable(v, v, 0, d - 1))
    for scope, values in merged.values():
        pot = mrf.addFactor(list(scope))
        # pyAgrum fills with its first variable changing fastest: numpy's C order over
        # the variables reversed
        names = list(pot.names)
        axes = [scope.index(v) for v in reversed(names)]
        pot.fillWith(np.transpose(values, axes).ravel().tolist())
    return mrf


def child_pyagrum(path: Path, repeat: int, budget_s: float) -> None:
    import numpy as np
    import pyagrum as gum

    graph, evidence, want = load_instance(path)
    t0 = time.perf_counter()
    mrf = pyagrum_mrf(gum, graph)
    _emit(pyagrum_construct_s=time.perf_counter() - t0)
    nodes = list(mrf.nodes())
    names = [mrf.variable(n).name() for n in nodes]

    def run():
        ie = gum.ShaferShenoyMRFInference(mrf)
        if evidence:
            ie.setEvidence({v: int(s) for v, s in evidence.items()})
        ie.makeInference()
        return [np.asarray(ie.posterior(n).toarray(), dtype=np.float64) for n in nodes]

    best, median, runs, post = timed(run, repeat, budget_s)
    marginals = dict(zip(names, post))
    _emit(
        pyagrum_s=best,
        pyagrum_median_s=median,
        pyagrum_runs=runs,
        pyagrum_mar_err=mar_error(marginals, want) if want else None,
    )


# ---------------------------------------------------------------------------------------
# the parent


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # gone already
        pass


def run_child(args: list, timeout_s: float, limit_bytes: int = 0) -> dict:
    """The fields a child of this script printed; status 'timeout' or 'failed: ...' when it
    did not end well."""
    return run_json_child([sys.executable, str(Path(__file__).resolve())] + args, timeout_s, limit_bytes)


def run_json_child(cmd: list, timeout_s: float, limit_bytes: int = 0) -> dict:
    """Run cmd, killed with all its descendants after timeout_s; the fields of the JSON
    lines it printed."""

    def limit():  # in the child, before exec
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    # a session (process group) of its own: on a timeout the child's own children die with
    # it (cotengra's worker processes hold the child's stdout open, and reading it to the end
    # would wait for them)
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit if limit_bytes else None,
        start_new_session=True,
    )
    status = None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # a process outside the group holds the pipes
            proc.kill()
            out, err = "", ""
        status = f"timeout ({timeout_s:g} s)"
    kill_group(proc.pid)  # whatever the child left running
    fields = {}
    for line in out.splitlines():
        if line.startswith("{"):
            fields.update(json.loads(line))
    if status is None and proc.returncode != 0:
        last = [ln for ln in err.splitlines() if ln.strip()][-1:] or [f"exit {proc.returncode}"]
        status = f"failed: {last[0][:160]}"
    if status:
        fields["status"] = status
    return fields


def measure(name: str, path: Path, pub: dict, args, with_pyagrum: bool) -> dict:
    row = {"name": name}
    common = ["--repeat", str(args.repeat), "--budget", str(args.budget)]
    plan = [] if args.plan_time is None else ["--plan-time", str(args.plan_time)]
    row.update(
        run_child(["--child-ours", str(path), "--max-gib", str(args.max_gib)] + common + plan, args.timeout)
    )
    if "refused" not in row and with_pyagrum:
        py = run_child(
            ["--child-pyagrum", str(path)] + common, args.pyagrum_timeout, int(args.pyagrum_gib * 2**30)
        )
        if "status" in py:
            py["pyagrum_status"] = py.pop("status")
        row.update(py)
    if name in pub:
        row["published_s"], row["published_library"] = pub[name]
    ours = row.get("prob_best_s")
    if ours:
        if "published_s" in row:
            row["ratio"] = row["published_s"] / ours  # above 1: we are faster
        if row.get("pyagrum_s"):
            row["pyagrum_ratio"] = row["pyagrum_s"] / ours
    if "prob_log_Z" in row and "logprob_log_Z" in row:
        lp = row["logprob_log_Z"]
        row["log_Z_rel"] = abs(row["prob_log_Z"] - lp) / max(1.0, abs(lp))
    row["wrong"] = wrong(row)
    return row


def wrong(row: dict) -> str:
    """Why an answered instance is not right ('' when it is)."""
    why = []
    for s in ("prob", "logprob"):
        if f"{s}_best_s" not in row:
            continue
        if not row.get(f"{s}_finite"):
            why.append(f"{s} not finite")
        err = row.get(f"{s}_mar_err")
        if err is not None and not err < MAR_TOL:
            why.append(f"{s} MAR error {err:.1e}")
    if row.get("log_Z_rel") is not None and not row["log_Z_rel"] < LOG_Z_TOL:
        why.append(f"log Z rel {row['log_Z_rel']:.1e}")
    return "; ".join(why)


def fmt_s(t) -> str:
    if t is None:
        return "-"
    return f"{t * 1e3:.3g} ms" if t < 1 else f"{t:.3g} s"


def fmt_x(x) -> str:
    return "-" if x is None else f"{x:.3g}x"


HEADER = (
    "| instance | vars | ev | programs, largest loop | plan | compile | first solve | solve best "
    "| median | max err | log Z | rel L | published best | best/ours | pyAgrum | pyA/ours |"
)
RULE = "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|--:|"


def table_row(r: dict) -> str:
    name = r["name"] + (" **WRONG**" if r.get("wrong") else "")
    if "prob_best_s" in r and ("status" in r or "logprob_error" in r):  # LOGPROB unanswered
        name += f" (LOGPROB: {r.get('logprob_error') or r['status']})"
    pub = f"{fmt_s(r['published_s'])} {r['published_library']}" if "published_s" in r else "-"
    if "refused" in r or "prob_best_s" not in r:
        why = (
            r.get("refused")
            and f"refused: {r['refused']}"
            or r.get("status")
            or r.get("prob_error")
            or "no answer"
        )
        return (
            f"| {name} | {r.get('vars', '-')} | {r.get('evidence', '-')} | {why[:150]} ||||||||| {pub} ||||"
        )
    err = max((r.get(f"{s}_mar_err") or 0.0) for s in ("prob", "logprob"))
    if "pyagrum_s" in r:
        pya = fmt_s(r["pyagrum_s"])
        if (r.get("pyagrum_mar_err") or 0.0) >= MAR_TOL:
            pya += f" (err {r['pyagrum_mar_err']:.0e})"
    else:
        pya = r.get("pyagrum_status", "-")
    rel = r.get("log_Z_rel")
    return (
        f"| {name} | {r['vars']} | {r['evidence']} | {r['programs']} {r['max_loop_states']:,} "
        f"| {fmt_s(r.get('prob_plan_s'))} | {fmt_s(r.get('prob_compile_s'))} "
        f"| {fmt_s(r.get('prob_first_s'))} | {fmt_s(r['prob_best_s'])} "
        f"| {fmt_s(r['prob_median_s'])} | {err:.1e} "
        f"| {r['prob_log_Z']:.6f} | {'-' if rel is None else f'{rel:.0e}'} | {pub} "
        f"| {fmt_x(r.get('ratio'))} | {pya} | {fmt_x(r.get('pyagrum_ratio'))} |"
    )


def summary(rows) -> list:
    lines = []
    ratios = [(r["ratio"], r["name"]) for r in rows if r.get("ratio")]
    if ratios:
        geo = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
        worst = min(ratios)
        lines.append(
            f"- geometric mean of virtual best / ours over {len(ratios)} instances: "
            f"{geo:.3g}x (aim: at least 1)"
        )
        lines.append(f"- worst: {worst[1]} at {worst[0]:.3g}x (aim: no instance below 0.5x)")
    p26 = next((r for r in rows if r["name"] == "Promedus_26"), None)
    if p26 and "prob_best_s" in p26:
        lines.append(
            f"- Promedus_26: {fmt_s(p26['prob_best_s'])} best, "
            f"{fmt_s(p26['prob_median_s'])} median (aim: under 0.6 ms; published "
            f"{fmt_s(p26.get('published_s'))})"
        )
    for label, pick in (
        ("refused", lambda r: "refused" in r),
        ("no answer", lambda r: "refused" not in r and "prob_best_s" not in r),
        ("WRONG", lambda r: r.get("wrong")),
    ):
        hit = [r["name"] for r in rows if pick(r)]
        if hit:
            lines.append(f"- {label}: {', '.join(hit)}")
    return lines


def header(args, dirs) -> list:
    import numba
    import numpy

    try:
        import pyagrum

        pya = pyagrum.__version__
    except ImportError:
        pya = "not installed"
    env = {
        k: os.environ[k]
        for k in ("CATBP_JIT_CACHE_DIR", "NUMBA_NUM_THREADS", "OMP_WAIT_POLICY", "OMP_NUM_THREADS")
        if k in os.environ
    }
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"# bench_uai {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        f"{platform.node()}: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {load}; python "
        f"{platform.python_version()}, numpy {numpy.__version__}, numba {numba.__version__}, "
        f"pyAgrum {pya}; {env or 'no thread or cache variables set'}",
        f"instances from {', '.join(map(str, dirs))}; --max-gib {args.max_gib}, --budget "
        f"{args.budget} s, --repeat {args.repeat}, --timeout {args.timeout} s; "
        "ours = PROB, evidence absorbed; published times from another machine (indicative)",
        "",
    ]


CSV_FIELDS = [
    "name",
    "vars",
    "factors",
    "evidence",
    "programs",
    "max_loop_states",
    "refused",
    "status",
    "prob_plan_s",
    "prob_compile_s",
    "prob_first_s",
    "prob_best_s",
    "prob_median_s",
    "prob_runs",
    "prob_log_Z",
    "prob_mar_err",
    "prob_finite",
    "prob_error",
    "logprob_plan_s",
    "logprob_compile_s",
    "logprob_first_s",
    "logprob_best_s",
    "logprob_median_s",
    "logprob_runs",
    "logprob_log_Z",
    "logprob_mar_err",
    "logprob_finite",
    "logprob_error",
    "log_Z_rel",
    "published_s",
    "published_library",
    "ratio",
    "pyagrum_construct_s",
    "pyagrum_s",
    "pyagrum_median_s",
    "pyagrum_runs",
    "pyagrum_mar_err",
    "pyagrum_status",
    "pyagrum_ratio",
    "wrong",
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path, help="directories of NAME.uai files")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these instances")
    ap.add_argument(
        "--max-gib",
        type=float,
        default=2.0,
        help="memory for the plan's cliques, GiB: larger plans are refused",
    )
    ap.add_argument("--budget", type=float, help="seconds per time measurement (5; quick 0.5)")
    ap.add_argument("--repeat", type=int, help="timed runs at most (20; quick 3)")
    ap.add_argument("--timeout", type=float, help="seconds per instance, ours (600; quick 120)")
    ap.add_argument("--pyagrum-timeout", type=float, help="seconds per instance (120; quick 30)")
    ap.add_argument("--pyagrum-gib", type=float, default=4.0, help="pyAgrum's address space")
    ap.add_argument("--skip-pyagrum", action="store_true")
    ap.add_argument(
        "--plan-time",
        type=float,
        default=None,
        help="plan search budget per model, seconds (default: compile_model's; 0: greedy only)",
    )
    ap.add_argument("--quick", action="store_true", help="short budgets: a smoke run")
    ap.add_argument(
        "--task",
        type=str.upper,
        choices=("MAR", "MPE"),
        default="MAR",
        help="MAR (default): marginals against the published times; MPE: the most probable "
        "assignment against MAR's time and pytoulbar2",
    )
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--child-ours", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-mpe", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--child-pyagrum", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for option, full, quick in (
        ("budget", 5.0, 0.5),
        ("repeat", 20, 3),
        ("timeout", 600.0, 120.0),
        ("pyagrum_timeout", 120.0, 30.0),
    ):
        if getattr(args, option) is None:
            setattr(args, option, quick if args.quick else full)
    if args.child_ours:
        child_ours(args.child_ours, int(args.max_gib * 2**30), args.repeat, args.budget, args.plan_time)
        return 0
    if args.child_mpe:
        max_bytes = int(args.max_gib * 2**30)
        uai_mpe.child_mpe(args.child_mpe, max_bytes, args.repeat, args.budget, args.plan_time, _emit, timed)
        return 0
    if args.child_pyagrum:
        child_pyagrum(args.child_pyagrum, args.repeat, args.budget)
        return 0

    dirs = args.dirs or [default_root()]
    missing = [str(d) for d in dirs if not d.is_dir()]
    if missing:
        print(f"bench_uai: no such directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    found = find_instances(dirs)
    unknown = sorted(set(args.only or ()) - set(found))
    if unknown:
        print(
            f"bench_uai: no instance {', '.join(unknown)} under {', '.join(map(str, dirs))}", file=sys.stderr
        )
        return 2
    names = [n for n in found if not args.only or n in args.only]
    if args.task == "MPE":
        return main_mpe(args, dirs, found, names)
    with_pyagrum = not args.skip_pyagrum and installed("pyagrum")
    pub = published(dirs)
    lines = header(args, dirs) + [HEADER, RULE]
    print("\n".join(lines), flush=True)
    rows = []
    for name in names:
        rows.append(measure(name, found[name], pub, args, with_pyagrum))
        lines.append(table_row(rows[-1]))
        print(lines[-1], flush=True)
        write(args.out, lines + [""] + summary(rows), rows)  # an interrupted run keeps its rows
    print("\n".join([""] + summary(rows)))
    return 1 if any(r.get("wrong") for r in rows) else 0


def main_mpe(args, dirs, found: dict, names: list) -> int:
    lines = header(args, dirs)[:-2] + [
        "--task MPE: ours = the MAXLOG upward pass, MAR = PROB with the defaults",
        "",
    ]
    lines += [uai_mpe.HEADER, uai_mpe.RULE]
    print("\n".join(lines), flush=True)
    rows = []
    plan = [] if args.plan_time is None else ["--plan-time", str(args.plan_time)]
    for name in names:
        argv = ["--child-mpe", str(found[name]), "--max-gib", str(args.max_gib)]
        argv += ["--repeat", str(args.repeat), "--budget", str(args.budget)] + plan
        rows.append(uai_mpe.finish_row({"name": name, **run_child(argv, args.timeout)}))
        lines.append(uai_mpe.table_row(rows[-1], fmt_s))
        print(lines[-1], flush=True)
        text = "\n".join(lines + [""] + uai_mpe.summary(rows)) + "\n"
        write_report(args.out, "bench_uai_mpe", text, rows, uai_mpe.CSV_FIELDS, echo=False)
    print("\n".join([""] + uai_mpe.summary(rows)))
    return 1 if any(r.get("agree") is False for r in rows) else 0


def write(out: Path, lines: list, rows: list) -> None:
    write_report(out, "bench_uai", "\n".join(lines) + "\n", rows, CSV_FIELDS, echo=False)


if __name__ == "__main__":
    sys.exit(main())
