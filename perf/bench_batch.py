"""Batched throughput: all posteriors and log Z for many evidence rows per run.

Part 1, networks: for each bnlearn network, rows of 3 and of 10 observed variables drawn
by ancestral sampling (so every row is possible), solved by `compile_model(...,
buckets=...).solve_batch` in batches of 1, 64, 1024 and 16384 rows, against pyAgrum's
LazyPropagation looping over the same rows (setEvidence / makeInference / every
posterior), in the same run. Queries per second = rows / time; pyAgrum's rate comes from
as many rows as fit its time budget. A few rows are compared (max |difference|).
Part 2, the executor alone: each ../shared/bench bundle with every factor batched, rows of
perturbed factors, batched runs against one-row-at-a-time runs of a plain session.

Prints Markdown tables, and saves a plot of throughput against batch size per network
(matplotlib) as perf/out/bench_batch.png.

    python perf/bench_batch.py [--networks alarm,hailfinder,...] [--budget 1.0] [--no-pyagrum]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # perf/common.py

from common import installed, network_text, pyagrum_network, sample_rows  # noqa: E402

NETWORKS = ["alarm", "hailfinder", "win95pts", "pathfinder", "water", "munin"]
BATCHES = (1, 64, 1024, 16384)
OBSERVED = (3, 10)


def rate(fn, rows: int, budget: float) -> float:
    """Rows per second of fn() (which answers `rows` rows), best of repeats within budget."""
    fn()
    best, spent = math.inf, 0.0
    while spent < budget or best == math.inf:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return rows / best


def ours(graph, ev, table, budget, batches):
    from catbp_jit.errors import CatbpError
    from catbp_jit.frontend import compile_model

    buckets = list(batches)
    while True:  # the largest buckets of a big network may not fit in memory
        try:
            t0 = time.perf_counter()
            model = compile_model(
                graph, "prob", evidence_vars=ev, absorb_evidence=True, buckets=tuple(buckets)
            )
            compile_s = time.perf_counter() - t0
            break
        except (CatbpError, MemoryError) as e:
            if len(buckets) == 1:
                raise
            print(
                f"  {graph.name}: bucket {buckets[-1]} refused ({str(e).splitlines()[0][:90]}...)",
                file=sys.stderr,
            )
            buckets.pop()
    rates = {}
    for n in batches:
        rows = table[:n]
        rates[n] = rate(partial(model.solve_batch, rows), n, budget)
    return model, rates, compile_s, tuple(buckets)


def pyagrum_rate(name, ev, table, budget, model):
    import pyagrum as gum

    with tempfile.TemporaryDirectory(prefix="bench_batch_") as tmp:
        bn, renamed = pyagrum_network(gum, network_text(name), Path(tmp))
    to_gum = {ours_name: g for g, ours_name in renamed.items()}
    nodes = list(bn.nodes())
    ie = gum.LazyPropagation(bn)
    gev = [to_gum.get(v, v) for v in ev]
    done, t0 = 0, time.perf_counter()
    last = None
    while done < len(table) and (time.perf_counter() - t0 < budget or done < 3):
        ie.setEvidence({g: int(s) for g, s in zip(gev, table[done])})
        ie.makeInference()
        last = [ie.posterior(n) for n in nodes]
        done += 1
    q = done / (time.perf_counter() - t0)
    # the last row, compared with ours
    mine = model.solve_batch(table[done - 1 : done])
    diff = 0.0
    for n, post in zip(nodes, last):
        v = bn.variable(n).name()
        v = renamed.get(v, v)
        diff = max(diff, float(np.max(np.abs(np.asarray(post.toarray()) - mine.marginals[v][0]))))
    return q, diff


def bench_networks(names, budget, with_pyagrum, batches):
    from catbp_jit.frontend.bnlearn import load_network

    results = []
    print(
        "| network | observed | buckets | compile | "
        + " | ".join(f"ours n={n}" for n in batches)
        + f" | pyAgrum loop | x (n={1024 if 1024 in batches else max(batches)}) | max diff |"
    )
    print("|---|--:|---|--:|" + "--:|" * len(batches) + "--:|--:|--:|")
    for name in names:
        graph = load_network(name)
        sample = sample_rows(graph, max(batches), seed=1)
        rng = np.random.default_rng(2)
        for k in sorted({min(k, len(graph.names) - 1) for k in OBSERVED}):  # asia has 8
            ev = [graph.names[i] for i in sorted(rng.choice(len(graph.names), size=k, replace=False))]
            table = np.stack([sample[v] for v in ev], axis=1)
            try:
                model, rates, compile_s, buckets = ours(graph, ev, table, budget, batches)
            except Exception as e:
                print(f"| {name} | {k} | refused: {str(e).splitlines()[0][:100]} |")
                continue
            q, diff = (
                pyagrum_rate(name, ev, table, budget, model) if with_pyagrum else (float("nan"), float("nan"))
            )
            top = 1024 if 1024 in rates else max(rates)
            ratio = rates[top] / q if q == q else float("nan")
            results.append((name, k, rates, q))
            print(
                f"| {name} | {k} | {','.join(map(str, buckets))} | {compile_s:.1f} s | "
                + " | ".join(f"{rates[n]:,.0f}/s" for n in batches)
                + f" | {q:,.0f}/s | {ratio:,.0f}x | {diff:.1e} |",
                flush=True,
            )
    return results


BUNDLE_BATCHES = (4, 16, 64)


def bench_bundles(budget):
    """The executor alone: the unary factors (local evidence) of a bench bundle batched."""
    import catbp_jit as cj
    from catbp_jit.bundle import load_bundle

    root = HERE.parent.parent / "shared" / "bench"
    if not root.is_dir():
        root = HERE.parent / "tests" / "data" / "bench"
    print(
        "\n| bundle | batched factors | one at a time | "
        + " | ".join(f"batched n={n}" for n in BUNDLE_BATCHES)
        + f" | x (n={BUNDLE_BATCHES[-1]}) |"
    )
    print("|---|--:|--:|--:|--:|--:|")
    for d in sorted(p for p in root.iterdir() if (p / "bundle.json").exists()):
        b = load_bundle(d)
        if b.semiring != "PROB":
            continue
        sr = b.semiring_runtime()
        fids = sorted(f for f, (a, _) in b.factors.items() if a.ndim <= 1) or sorted(b.factors)
        base = {f: np.ascontiguousarray(a, dtype=b.dtype) for f, (a, _) in b.factors.items()}
        sels = {s: np.ascontiguousarray(a, dtype=b.dtype) for s, (a, _) in b.selectors.items()}
        plain = cj.compile(
            b.programs, sr, factor_specs=b.factor_specs(), selector_specs=b.selector_specs()
        ).bind()
        plain.run(factors=base, selectors=sels)
        one = rate(partial(plain.run, factors=base), 1, budget)
        try:
            batched = cj.compile(
                b.programs,
                sr,
                factor_specs=b.factor_specs(),
                selector_specs=b.selector_specs(),
                batched_factors=set(fids),
                buckets=BUNDLE_BATCHES,
            ).bind()
        except (cj.CatbpError, MemoryError) as e:  # batched intermediates too large
            print(
                f"| {d.name} | {len(fids)} of {len(base)} | {one:,.0f}/s | refused: "
                f"{str(e).splitlines()[0][-90:]} |"
            )
            continue
        rng = np.random.default_rng(0)
        top = BUNDLE_BATCHES[-1]
        rows = {f: base[f][None] * rng.uniform(0.5, 1.5, size=(top,) + base[f].shape) for f in fids}
        static = {f: a for f, a in base.items() if f not in rows}
        rates = {}
        for n in BUNDLE_BATCHES:
            given = {f: np.ascontiguousarray(a[:n]) for f, a in rows.items()}
            batched.run(factors={**static, **given}, selectors=sels)
            rates[n] = rate(partial(batched.run, factors=given), n, budget)
        print(
            f"| {d.name} | {len(fids)} of {len(base)} | {one:,.0f}/s | "
            + " | ".join(f"{rates[n]:,.0f}/s" for n in BUNDLE_BATCHES)
            + f" | {rates[top] / one:,.1f}x |",
            flush=True,
        )


def plot(results, path: Path, batches):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib not installed: no plot)", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, k, rates, q in results:
        (line,) = ax.plot(batches, [rates[n] for n in batches], marker="o", label=f"{name}, {k} obs")
        if q == q:
            ax.axhline(q, color=line.get_color(), linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("rows per batch")
    ax.set_ylabel("queries per second (all posteriors + log Z)")
    ax.set_title("catbp_jit solve_batch (lines) vs pyAgrum per-row loop (dotted)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"\nplot: {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--networks", default=",".join(NETWORKS))
    ap.add_argument("--budget", type=float, default=1.0, help="seconds per measurement")
    ap.add_argument("--no-pyagrum", action="store_true")
    ap.add_argument("--no-bundles", action="store_true")
    ap.add_argument(
        "--batches",
        default=",".join(map(str, BATCHES)),
        help="rows per batch to measure (default 1,64,1024,16384)",
    )
    args = ap.parse_args(argv)
    batches = tuple(int(x) for x in args.batches.split(","))
    with_pyagrum = not args.no_pyagrum and installed("pyagrum")
    results = bench_networks([n for n in args.networks.split(",") if n], args.budget, with_pyagrum, batches)
    if not args.no_bundles:
        bench_bundles(args.budget)
    if results:
        plot(results, HERE / "out" / "bench_batch.png", batches)
    return 0


if __name__ == "__main__":
    sys.exit(main())
