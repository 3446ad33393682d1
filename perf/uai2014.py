"""The UAI 2014 MAR instances in ../shared/uai2014: exact in PROB and LOGPROB, and how fast.

For each instance: plan, compile (PROB and LOGPROB), solve with the instance's evidence,
and compare every marginal with the competition's (6 significant digits: 1e-5 absolute),
and PROB's log Z with LOGPROB's. Instances whose plan does not fit in memory are
reported with the refusal. Times are set beside the fastest published solver's (the
"virtual best" of published_times.csv, measured on another machine: indicative only).

    python perf/uai2014.py [NAME ...] [--dir ../shared/uai2014] [--max-gib 8] [--plan-time S]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

# solves are timed with the kernels, never the numpy tier that stands in while they compile
os.environ.setdefault("CATBP_JIT_TIER", "compiled")

from catbp_jit.errors import CatbpError  # noqa: E402
from catbp_jit.frontend import compile_model  # noqa: E402
from catbp_jit.frontend.graph import FactorGraphError  # noqa: E402
from catbp_jit.frontend.uai import read_evidence, read_mar, read_uai  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_DIR = HERE.parent.parent / "shared" / "uai2014"


def virtual_best(root: Path) -> dict:
    best = {}
    path = root / "published_times.csv"
    if path.exists():
        with open(path) as f:
            for row in csv.DictReader(f):
                t = float(row["execution_time"])
                name = row["problem"]
                if name not in best or t < best[name][0]:
                    best[name] = (t, row["library"])
    return best


def load_instance(path: Path):
    """NAME.uai's graph, its evidence (NAME.uai.evid, else none) and the competition's
    marginals (NAME.uai.MAR, else None)."""
    graph = read_uai(path)
    evid, mar = path.with_name(path.name + ".evid"), path.with_name(path.name + ".MAR")
    evidence = read_evidence(evid, graph) if evid.exists() else {}
    return graph, evidence, (read_mar(mar, graph) if mar.exists() else None)


def mar_error(marginals, want: dict) -> float:
    """max |marginal - MAR| over every variable."""
    return max(float(np.max(np.abs(marginals[v] - m))) for v, m in want.items())


def check(name: str, root: Path, max_bytes: int, plan_time: float | None = None) -> dict:
    graph, evidence, want = load_instance(root / "problems" / name / f"{name}.uai")
    row = {
        "name": name,
        "vars": len(graph.variables),
        "factors": len(graph.factors),
        "evidence": len(evidence),
    }
    for semiring in ("prob", "logprob"):
        t0 = time.perf_counter()
        try:
            model = compile_model(
                graph,
                semiring,
                evidence_vars=list(evidence),
                absorb_evidence=True,
                max_clique_bytes=max_bytes,
                plan_time=plan_time,
            )
        except (FactorGraphError, CatbpError, MemoryError) as e:
            row["refused"] = str(e).splitlines()[0]
            return row
        row["states"] = model.stats["max_clique_states"]
        row[f"{semiring}_compile_s"] = time.perf_counter() - t0
        model.solve(evidence)  # warm-up (binds the static factors)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            sol = model.solve(evidence)
            times.append(time.perf_counter() - t0)
        row[f"{semiring}_s"] = min(times)
        row[f"{semiring}_log_Z"] = sol.log_Z
        row[f"{semiring}_mar_err"] = mar_error(sol.marginals, want)
        finite = math.isfinite(sol.log_Z) and all(np.isfinite(m).all() for m in sol.marginals.values())
        row[f"{semiring}_finite"] = finite
    row["log_Z_rel"] = abs(row["prob_log_Z"] - row["logprob_log_Z"]) / max(1.0, abs(row["logprob_log_Z"]))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*")
    ap.add_argument("--dir", type=Path, default=Path(os.environ.get("CATBP_UAI2014", DEFAULT_DIR)))
    ap.add_argument("--max-gib", type=float, default=2.0, help="largest clique allowed, GiB")
    ap.add_argument(
        "--plan-time",
        type=float,
        default=None,
        help="plan search budget, seconds (default: compile_model's; 0 = greedy)",
    )
    args = ap.parse_args(argv)
    names = args.names or sorted(p.name for p in (args.dir / "problems").iterdir())
    best = virtual_best(args.dir)
    print(
        f"{'instance':20} {'vars':>5} {'max clique':>11} {'log Z (PROB)':>16} {'rel vs LOGPROB':>14} "
        f"{'MAR err P/L':>17} {'PROB':>9} {'LOGPROB':>9} {'best published':>22}"
    )
    ok = True
    for name in names:
        row = check(name, args.dir, int(args.max_gib * 2**30), args.plan_time)
        b = best.get(name)
        pub = f"{b[0] * 1e3:9.2f} ms {b[1][:10]}" if b else "-"
        if "refused" in row:
            print(f"{name:20} {row['vars']:5} refused: {row['refused'][:110]}")
            continue
        good = (
            row["prob_finite"]
            and row["logprob_finite"]
            and row["prob_mar_err"] < 1e-5
            and row["logprob_mar_err"] < 1e-5
            and row["log_Z_rel"] < 1e-9
        )
        ok &= good
        print(
            f"{name:20} {row['vars']:5} {row['states']:11,} {row['prob_log_Z']:16.6f} "
            f"{row['log_Z_rel']:14.1e} {row['prob_mar_err']:8.1e}/{row['logprob_mar_err']:7.1e} "
            f"{row['prob_s'] * 1e3:6.1f} ms {row['logprob_s'] * 1e3:6.1f} ms {pub:>22}"
            f"{'' if good else '  << WRONG'}"
        )
        sys.stdout.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
