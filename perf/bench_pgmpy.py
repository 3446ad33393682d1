"""A batched `predict` against pgmpy's own and against pyAgrum looping over rows.

The task (pgmpy's `DiscreteBayesianNetwork.predict`): a DataFrame of cases that lacks some
of the network's variables; for each row, the most probable joint state of the missing
ones given the row (MPE of the rest). Rows are drawn from the network by ancestral
sampling, named states, `--missing` columns dropped (chosen at random, printed).

- ours: the pgmpy model converted (`catbp_jit.interop.from_pgmpy`), compiled for evidence
  on the frame's columns, `model.predict(frame)`: MAXLOG batches, repeated rows solved
  once. Timed cold (first call, kernels from the disk cache or compiled) and warm.
- pgmpy: `model.predict(frame)` (variable elimination per distinct row, its default
  n_jobs=-1) on the first k rows, k doubled until a run takes `--budget` seconds;
  its time for all rows is scaled from that run (time x rows / k).
- pyAgrum: LazyPropagation looping over rows (setEvidence, makeInference, mpe), as many
  rows as fit the budget, scaled likewise.

Every row either library answered is compared with ours: the same states, or (a tie) the
same probability. Also `predict_proba` against pgmpy's `predict_probability` (max
|difference|). Aims (the issue's): >= 1000x pgmpy and >= 100x pyAgrum on alarm, 10^4 rows,
3 missing.

    python perf/bench_pgmpy.py [--network alarm] [--rows 10000] [--missing 3] [--budget 5]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # perf/common.py

from common import (  # noqa: E402
    cpu_model,
    fmt_ratio,
    fmt_time,
    installed,
    network_text,
    sample_rows,
    time_runs,
    write_report,
)


def cases(graph, rows: int, missing: int, seed: int):
    """(the frame of named states without the missing columns, the missing variables)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    dropped = sorted(rng.choice(len(graph.variables), size=missing, replace=False))
    gone = [graph.names[i] for i in dropped]
    sample = sample_rows(graph, rows, seed)
    frame = pd.DataFrame(
        {v: np.array(graph.states[v], dtype=object)[sample[v]] for v in graph.variables if v not in gone}
    )
    return frame, gone


def scaled(fn, frame, budget: float):
    """fn's time for all of frame's rows, scaled from the first k rows, k doubled until one
    run takes `budget` seconds: (seconds for all rows, k, fn's answer on the k rows)."""
    k = 8
    while True:
        k = min(k, len(frame))
        t0 = time.perf_counter()
        answer = fn(frame.iloc[:k])
        spent = time.perf_counter() - t0
        if spent >= budget or k == len(frame):
            return spent * len(frame) / k, k, answer
        k *= 2


def pyagrum_engine(text: str):
    """(the network, a LazyPropagation on it), read from the BIF text once."""
    import tempfile

    import pyagrum as gum

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "net.bif"
        path.write_text(text)
        bn = gum.loadBN(str(path))
    return bn, gum.LazyPropagation(bn)


def pyagrum_mpe(bn, engine, frame, missing):
    """pyAgrum's MPE per row, as a user would loop: {variable: state names} over the rows."""
    out: dict[str, list] = {v: [] for v in missing}
    for row in frame.itertuples(index=False):
        engine.setEvidence(dict(zip(frame.columns, row)))
        engine.makeInference()
        best = engine.mpe()
        for v in missing:
            out[v].append(bn.variable(v).label(best[v]))
    return out


def compare(ours, graph, theirs: dict, missing) -> tuple[int, int]:
    """(rows with other states, of which ties: the same probability) over theirs' rows."""
    from catbp_jit.frontend.tasks import log_values

    k = len(next(iter(theirs.values())))
    mine = ours.iloc[:k]
    differs = np.zeros(k, dtype=bool)
    for v in missing:
        differs |= np.array(mine[v].tolist(), dtype=object) != np.array(list(theirs[v]), dtype=object)
    if not differs.any():
        return 0, 0
    index = {v: {s: i for i, s in enumerate(graph.states[v])} for v in graph.variables}

    def states(source) -> np.ndarray:
        rows = np.flatnonzero(differs)
        return np.array([[index[v][source[v][i]] for v in graph.variables] for i in rows])

    full_mine = {v: mine[v].tolist() for v in graph.variables}
    full_theirs = {v: (list(theirs[v]) if v in missing else full_mine[v]) for v in graph.variables}
    a, b = log_values(graph, states(full_mine)), log_values(graph, states(full_theirs))
    return int(differs.sum()), int(np.isclose(a, b, rtol=1e-12, atol=0).sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--network", default="alarm", help="a bnlearn network (alarm)")
    ap.add_argument("--rows", type=int, default=10_000)
    ap.add_argument("--missing", type=int, default=3, help="variables the frame lacks (3)")
    ap.add_argument("--budget", type=float, default=5.0, help="seconds for each peer's scaled run (5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(HERE / "out"))
    args = ap.parse_args(argv)
    if not installed("pgmpy"):
        return 2
    import pandas as pd
    from pgmpy.readwrite import BIFReader

    from catbp_jit.frontend import compile_model
    from catbp_jit.interop import from_pgmpy

    text = network_text(args.network)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pgmpy's deprecation notes
        theirs = BIFReader(string=text).get_model()
    graph = from_pgmpy(theirs, name=args.network)
    frame, missing = cases(graph, args.rows, args.missing, args.seed)
    distinct = len(frame.drop_duplicates())
    print(f"{args.network}: {len(frame)} rows ({distinct} distinct), missing {', '.join(missing)}")

    t0 = time.perf_counter()
    model = compile_model(graph, "prob", evidence_vars=list(frame.columns))
    compile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = model.predict(frame)
    first_s = time.perf_counter() - t0
    warm_s, runs, _ = time_runs(lambda: model.predict(frame), 3, 20, 3.0)
    proba_s, _, proba = time_runs(lambda: model.predict_proba(frame), 3, 20, 3.0)
    rows = [
        {"who": "ours predict", "seconds": warm_s, "rows timed": len(frame), "note": f"median of {runs}"},
        {"who": "ours predict, first call", "seconds": first_s, "rows timed": len(frame), "note": ""},
        {"who": "ours compile_model", "seconds": compile_s, "rows timed": 0, "note": ""},
        {"who": "ours predict_proba", "seconds": proba_s, "rows timed": len(frame), "note": ""},
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pg_s, pg_k, pg = scaled(lambda f: theirs.predict(f), frame, args.budget)
        pg_proba_s, pgp_k, pg_proba = scaled(lambda f: theirs.predict_probability(f), frame, args.budget)
    worst = max(
        float(np.max(np.abs(proba[f"{v}={s}"].to_numpy()[:pgp_k] - pg_proba[c].to_numpy())))
        for c in pg_proba.columns
        for v, s in [c.rsplit("_", 1)]
    )
    other, ties = compare(ours, graph, {v: pg[v].tolist() for v in missing}, missing)
    rows.append(
        {
            "who": "pgmpy predict",
            "seconds": pg_s,
            "rows timed": pg_k,
            "note": f"scaled; {other} rows differ, {ties} of them ties",
            "ratio": pg_s / warm_s,
        }
    )
    rows.append(
        {
            "who": "pgmpy predict_probability",
            "seconds": pg_proba_s,
            "rows timed": pgp_k,
            "note": f"scaled; max |difference| {worst:.1e}",
            "ratio": pg_proba_s / proba_s,
        }
    )
    if installed("pyagrum"):
        bn, engine = pyagrum_engine(text)
        ga_s, ga_k, ga = scaled(lambda f: pyagrum_mpe(bn, engine, f, missing), frame, args.budget)
        other, ties = compare(ours, graph, ga, missing)
        rows.append(
            {
                "who": "pyAgrum LazyPropagation loop (mpe)",
                "seconds": ga_s,
                "rows timed": ga_k,
                "note": f"scaled; {other} rows differ, {ties} of them ties",
                "ratio": ga_s / warm_s,
            }
        )
    lines = [
        f"# predict: {args.network}, {len(frame)} rows ({distinct} distinct), "
        f"{len(missing)} missing ({', '.join(missing)})",
        "",
        f"CPU: {cpu_model()}. Times for all {len(frame)} rows; a peer's scaled from the rows it ran "
        f"in about {args.budget:g} s. ratio: the peer's time over ours (warm).",
        "",
        "| who | time (all rows) | rows timed | ratio | note |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = fmt_ratio(r["ratio"]) if "ratio" in r and math.isfinite(r["ratio"]) else ""
        lines.append(f"| {r['who']} | {fmt_time(r['seconds'])} | {r['rows timed']} | {ratio} | {r['note']} |")
    write_report(
        Path(args.out),
        f"bench_pgmpy_{args.network}",
        "\n".join(lines) + "\n",
        rows,
        ["who", "seconds", "rows timed", "ratio", "note"],
    )
    return 0 if pd is not None else 1


if __name__ == "__main__":
    sys.exit(main())
